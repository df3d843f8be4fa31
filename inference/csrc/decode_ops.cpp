// The small operations of a Llama decode step, one call each instead of several torch operations,
// whose per-operation cost was half of a batch-1 step once the matrix products were fast
// (docs/performance.md#why-our-own-kernels).  Float32 throughout; AVX2 + FMA; pool.h's threads, as
// many as the caller says.
//
//   rms_norm:         Zhang & Sennrich 2019, as transformers' LlamaRMSNorm computes it in float32.
//   glu_mul:          SwiGLU's silu(gate) * up (Shazeer 2020), or GeGLU's, from the fused gate/up product.
//   decode_attention: rotary embeddings (Su et al. 2021) of each row's new query and key, the new
//                     key and value written into the row's cache at its position, then grouped-query
//                     attention (Ainslie et al. 2023) of the queries over positions 0..position,
//                     with an exact softmax: no mask, each row attends over its own length.
//   prefill_attention: a prefill pass's rotary embeddings, cache writes and causal attention per
//                     layer in one call, flash attention's online softmax (below); where torch's
//                     operations took rotary embeddings, copies into the cache, casts of the float16
//                     cache, a mask per block of queries and SDPA, each a call of its own
//                     (docs/performance.md#the-decode-steps-operations).
//   prompt_logprobs:  a prompt's log-probabilities (echo) of each position's next token and its most
//                     likely one, log_softmax's and topk(1)'s values without their copies.

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "pool.h"
#include "simd.h"

namespace {

using kernels::horizontal_sum;

// exp(x) for x in [-87, 88]: x = n ln2 + r, |r| <= ln2 / 2, exp(r) by its Taylor polynomial of
// degree 6 (relative error below 2e-7), times 2^n built in the exponent bits.
inline __m256 exp256(__m256 x) {
  // Operands in this order keep a NaN (min/max return their second operand when one is NaN): a NaN
  // score must not become a finite weight and hide the model's divergence.
  x = _mm256_max_ps(_mm256_set1_ps(-87.0f), _mm256_min_ps(_mm256_set1_ps(88.0f), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// tanh(x) = sign(x) (1 - e) / (1 + e), e = exp(-2 |x|): exp256's relative error, a NaN kept.
inline __m256 tanh256(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 e = exp256(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign, x)));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
  return _mm256_or_ps(t, _mm256_and_ps(sign, x));
}

// Gemma 2's soft-capped scores in place: s = cap tanh(s / cap).
inline void soft_cap(float* scores, int64_t n, float cap) {
  const __m256 c = _mm256_set1_ps(cap), inverse = _mm256_set1_ps(1.0f / cap);
  int64_t t = 0;
  for (; t + 8 <= n; t += 8)
    _mm256_storeu_ps(scores + t, _mm256_mul_ps(c, tanh256(_mm256_mul_ps(_mm256_loadu_ps(scores + t), inverse))));
  for (; t < n; ++t) scores[t] = cap * tanhf(scores[t] / cap);
}

// A KV cache holds float32 or IEEE float16 (uint16_t bits, converted by F16C's instructions with
// round-to-nearest-even, as torch's casts round).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline float load1(const float* p) { return *p; }
inline float load1(const uint16_t* p) { return _cvtsh_ss(*p); }

inline void store_row(const float* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i];
}

inline void store_row(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) out[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

template <typename T>
inline float dot(const float* a, const T* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load8(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b + i), acc0);
  float total = horizontal_sum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) total += a[i] * load1(b + i);
  return total;
}

// out[i] = x[i] * cos[i] + swap_halves(x)[i] * sin[i]; sin's first half is negated in the table,
// which makes this transformers' x * cos + rotate_half(x) * sin.
inline void rotate(const float* x, const float* cos, const float* sin, int64_t dim, float* out) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) out[i] = x[i] * cos[i] + x[i + half] * sin[i];
  for (int64_t i = half; i < dim; ++i) out[i] = x[i] * cos[i] + x[i - half] * sin[i];
}

// out[0:DIM] = norm * sum_u weights[u] * values[u, 0:DIM] (values' rows `stride` elements apart), the
// accumulators in registers.
template <int DIM, typename T>
inline void weighted_sum(const float* weights, float norm, const T* values, int64_t length, int64_t stride, float* out) {
  constexpr int VECTORS = DIM / 8;
  __m256 acc[VECTORS];
#pragma GCC unroll 16
  for (int i = 0; i < VECTORS; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t u = 0; u < length; ++u) {
    const __m256 w = _mm256_set1_ps(weights[u]);
    const T* v = values + u * stride;
#pragma GCC unroll 16
    for (int i = 0; i < VECTORS; ++i) acc[i] = _mm256_fmadd_ps(w, load8(v + 8 * i), acc[i]);
  }
  const __m256 scale = _mm256_set1_ps(norm);
#pragma GCC unroll 16
  for (int i = 0; i < VECTORS; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(acc[i], scale));
}

// weighted_sum of any head width: in register-sized parts where it is a multiple of 32 (Phi-3's 96,
// Gemma's 256), else one element at a time.
template <typename T>
inline void weighted_sum_any(const float* weights, float norm, const T* values, int64_t length, int64_t dim,
                             float* out) {
  if (dim == 64) return weighted_sum<64>(weights, norm, values, length, dim, out);
  if (dim == 96) return weighted_sum<96>(weights, norm, values, length, dim, out);
  if (dim % 128 == 0) {
    for (int64_t part = 0; part < dim; part += 128) weighted_sum<128>(weights, norm, values + part, length, dim, out + part);
    return;
  }
  if (dim % 32 == 0) {
    for (int64_t part = 0; part < dim; part += 32) weighted_sum<32>(weights, norm, values + part, length, dim, out + part);
    return;
  }
  for (int64_t i = 0; i < dim; ++i) out[i] = 0.0f;
  for (int64_t u = 0; u < length; ++u) {
    const T* v = values + u * dim;
    for (int64_t i = 0; i < dim; ++i) out[i] += weights[u] * load1(v + i);
  }
  for (int64_t i = 0; i < dim; ++i) out[i] *= norm;
}

// decode_attention (below) over a cache of T (float or float16 bits).
template <typename T>
void attend(const float* qkv, int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim, const float* cos,
            const float* sin, const int64_t* positions, T* keys, T* values, int64_t row_stride, int64_t head_stride,
            float scale, float* out, int threads, int64_t window = 0, float softcap = 0.0f) {
  const int64_t group = heads / kv_heads;
  const int64_t width = (heads + 2 * kv_heads) * dim;
  // Small steps on the calling thread alone (see block_gemm.cpp's SMALL_WORK): multiply-adds of the
  // scores and the weighted sum, rows * heads * positions * dim * 2.
  int64_t work = 0;
  for (int64_t r = 0; r < rows; ++r) work += 2 * heads * (positions[r] + 1) * dim;
  if (work < (int64_t(1) << 16)) threads = 1;
  kernels::parallel_for(rows * kv_heads, threads, [&](int64_t first, int64_t last) {
    std::vector<float> scores;
    float query[256];
    float key[256];
    for (int64_t item = first; item < last; ++item) {
      const int64_t r = item / kv_heads, h = item % kv_heads, position = positions[r];
      const float* c = cos + position * dim;
      const float* s = sin + position * dim;
      const float* row = qkv + r * width;
      T* key_cache = keys + r * row_stride + h * head_stride;
      T* value_cache = values + r * row_stride + h * head_stride;
      rotate(row + (heads + h) * dim, c, s, dim, key);
      store_row(key, dim, key_cache + position * dim);
      store_row(row + (heads + kv_heads + h) * dim, dim, value_cache + position * dim);
      // A sliding window (window > 0): the query attends to its last `window` positions, itself included.
      const int64_t first_key = window > 0 && position + 1 > window ? position + 1 - window : 0;
      const int64_t length = position + 1 - first_key;
      const T* window_keys = key_cache + first_key * dim;
      const T* window_values = value_cache + first_key * dim;
      scores.resize(static_cast<size_t>(length));
      for (int64_t g = 0; g < group; ++g) {
        const int64_t head = h * group + g;
        rotate(row + head * dim, c, s, dim, query);
        for (int64_t t = 0; t < length; ++t) scores[t] = dot(query, window_keys + t * dim, dim) * scale;
        if (softcap > 0.0f) soft_cap(scores.data(), length, softcap);
        float largest = -INFINITY;
        for (int64_t t = 0; t < length; ++t) largest = scores[t] > largest ? scores[t] : largest;
        const __m256 top = _mm256_set1_ps(largest);
        __m256 sums = _mm256_setzero_ps();
        int64_t t = 0;
        for (; t + 8 <= length; t += 8) {
          const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(&scores[t]), top));
          _mm256_storeu_ps(&scores[t], e);
          sums = _mm256_add_ps(sums, e);
        }
        float total = horizontal_sum(sums);
        for (; t < length; ++t) {
          scores[t] = expf(scores[t] - largest);
          total += scores[t];
        }
        float* o = out + r * heads * dim + head * dim;
        weighted_sum_any(scores.data(), 1.0f / total, window_values, length, dim, o);
      }
    }
  });
}

// --- A prefill pass's attention ------------------------------------------------------------------
// Each sequence of the pass: rows [row0, row0 + rows) of qkv, at positions start .. start + rows - 1
// (start positions are in its cache already), its layer's key and value caches [kv_heads, capacity,
// dim] with head_stride elements between heads.  First every row's keys (rotated) and values are
// written into the caches and its queries rotated and scaled in place; then each query attends
// causally over its sequence's positions 0..its own, in blocks of query positions x the kv head's
// group of query heads (at least BLOCK_QUERIES queries) against KEY_BLOCK keys at a time converted
// to float32 once for them all,
// with the online softmax of flash attention (Milakov & Gimelshein 2018; Dao et al. 2022): a running
// maximum, sum and weighted sum of values per query, rescaled when the maximum grows.  Its products:
// per query and key, dim multiply-adds for the score (four keys' partial vectors summed at once) and
// dim for the values.
constexpr int64_t QUERY_BLOCK = 8, BLOCK_QUERIES = 32, KEY_BLOCK = 32;

enum SequenceField : int64_t { ROW0, ROWS, START, HEAD_STRIDE, KEY_CACHE, VALUE_CACHE, SEQUENCE_FIELDS };

inline float horizontal_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// r[0..7], the rows of an 8 x 8 block, into its columns.
inline void transpose8(__m256* r) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)), u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)), u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0)), u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0)), u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20), r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20), r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31), r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31), r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// Keys or values [count, DIM] of a cache into out [KEY_BLOCK, DIM] float32, the rows past count zero.
template <int DIM, typename T>
inline void load_block(const T* cache, int64_t count, float* out) {
  for (int64_t t = 0; t < count; ++t)
    for (int64_t i = 0; i < DIM; i += 8) _mm256_storeu_ps(out + t * DIM + i, load8(cache + t * DIM + i));
  std::fill(out + count * DIM, out + KEY_BLOCK * DIM, 0.0f);
}

// keys [KEY_BLOCK, DIM] into their transpose kt [DIM, KEY_BLOCK].
template <int DIM>
inline void transpose_block(const float* keys, float* kt) {
  for (int t = 0; t < KEY_BLOCK; t += 8)
    for (int d = 0; d < DIM; d += 8) {
      __m256 r[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(keys + (t + i) * DIM + d);
      transpose8(r);
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(kt + (d + i) * KEY_BLOCK + t, r[i]);
    }
}

// Scores [TILE, KEY_BLOCK] of TILE queries (q: [TILE, DIM]) against a block's transposed keys (kt
// [DIM, KEY_BLOCK]): outer products, TILE queries x 16 keys in 8 accumulators, no horizontal sums.
constexpr int TILE = 4;
template <int DIM>
inline void tile_scores(const float* q, const float* kt, float* scores) {
  for (int half = 0; half < KEY_BLOCK; half += 16) {
    __m256 a[TILE][2];
#pragma GCC unroll 4
    for (int j = 0; j < TILE; ++j) a[j][0] = a[j][1] = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int d = 0; d < DIM; ++d) {
      const __m256 k0 = _mm256_loadu_ps(kt + d * KEY_BLOCK + half), k1 = _mm256_loadu_ps(kt + d * KEY_BLOCK + half + 8);
#pragma GCC unroll 4
      for (int j = 0; j < TILE; ++j) {
        const __m256 qd = _mm256_broadcast_ss(q + j * DIM + d);
        a[j][0] = _mm256_fmadd_ps(qd, k0, a[j][0]);
        a[j][1] = _mm256_fmadd_ps(qd, k1, a[j][1]);
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < TILE; ++j) {
      _mm256_storeu_ps(scores + j * KEY_BLOCK + half, a[j][0]);
      _mm256_storeu_ps(scores + j * KEY_BLOCK + half + 8, a[j][1]);
    }
  }
}

// One query's scores of a block (row, KEY_BLOCK floats; keys from `visible` on masked) into its
// softmax weights in place (zero for the masked keys), the online softmax's running maximum and sum
// updated; returns the factor that rescales its earlier weighted sum.
inline float softmax_update(float* row, int64_t visible, float& largest, float& total) {
  constexpr int VECTORS = KEY_BLOCK / 8;
  __m256 scores[VECTORS], valid[VECTORS];
  __m256 top = _mm256_set1_ps(largest);
  const __m256 lanes = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), bound = _mm256_set1_ps(static_cast<float>(visible));
#pragma GCC unroll 8
  for (int b = 0; b < VECTORS; ++b) {
    valid[b] = _mm256_cmp_ps(_mm256_add_ps(lanes, _mm256_set1_ps(static_cast<float>(b * 8))), bound, _CMP_LT_OQ);
    scores[b] = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_loadu_ps(row + b * 8), valid[b]);
    top = _mm256_max_ps(scores[b], top);  // a NaN score leaves top as it was; exp256 keeps the NaN
  }
  const float newest = horizontal_max(top);
  const float factor = largest == -INFINITY ? 0.0f : expf(largest - newest);
  largest = newest;
  const __m256 shift = _mm256_set1_ps(newest);
  __m256 sums = _mm256_setzero_ps();
#pragma GCC unroll 8
  for (int b = 0; b < VECTORS; ++b) {
    // exp256 clamps below at -87: the masked keys' weights are set to zero, not e^-87.
    const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(scores[b], shift)), valid[b]);
    _mm256_storeu_ps(row + b * 8, e);
    sums = _mm256_add_ps(sums, e);
  }
  total = total * factor + horizontal_sum(sums);
  return factor;
}

// acc[j] = acc[j] * factor[j] + weights[j] @ values for two queries (acc: [2, DIM], weights: [2,
// KEY_BLOCK]) over keys [0, keys): 32 dimensions of both at a time, 8 accumulators.
template <int DIM>
inline void pair_values(const float* weights, const float* factor, const float* values, int64_t keys, float* acc) {
  for (int part = 0; part < DIM; part += 32) {
    __m256 a0[4], a1[4];
    const __m256 f0 = _mm256_set1_ps(factor[0]), f1 = _mm256_set1_ps(factor[1]);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      a0[i] = _mm256_mul_ps(_mm256_loadu_ps(acc + part + 8 * i), f0);
      a1[i] = _mm256_mul_ps(_mm256_loadu_ps(acc + DIM + part + 8 * i), f1);
    }
    for (int64_t t = 0; t < keys; ++t) {
      const __m256 w0 = _mm256_broadcast_ss(weights + t), w1 = _mm256_broadcast_ss(weights + KEY_BLOCK + t);
      const float* v = values + t * DIM + part;
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m256 vv = _mm256_loadu_ps(v + 8 * i);
        a0[i] = _mm256_fmadd_ps(w0, vv, a0[i]);
        a1[i] = _mm256_fmadd_ps(w1, vv, a1[i]);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      _mm256_storeu_ps(acc + part + 8 * i, a0[i]);
      _mm256_storeu_ps(acc + DIM + part + 8 * i, a1[i]);
    }
  }
}

template <int DIM, typename T>
void prefill_attend(float* qkv, int64_t count, const int64_t* sequences, int64_t heads, int64_t kv_heads,
                    const float* cos, const float* sin, float scale, float* out, int threads) {
  const int64_t group = heads / kv_heads, width = (heads + 2 * kv_heads) * DIM;
  // Positions a block: enough that a key block's conversion serves BLOCK_QUERIES queries or more
  // (a model without grouped queries has one a position), but QUERY_BLOCK at least.
  const int64_t query_block = std::max(QUERY_BLOCK, (BLOCK_QUERIES + group - 1) / group);
  auto field = [&](int64_t s, SequenceField f) { return sequences[s * SEQUENCE_FIELDS + f]; };
  auto cache = [&](int64_t s, SequenceField f, int64_t h) {
    return reinterpret_cast<T*>(field(s, f)) + h * field(s, HEAD_STRIDE);
  };
  // Rows of the pass, in order; work items: (sequence, kv head, query block), the costliest (the
  // latest positions) first, as the pool hands chunks out in turn.
  std::vector<int64_t> row_sequence, items;
  int64_t largest_rows = 0, multiply_adds = 0;
  for (int64_t s = 0; s < count; ++s) {
    row_sequence.insert(row_sequence.end(), static_cast<size_t>(field(s, ROWS)), s);
    largest_rows = std::max(largest_rows, field(s, ROWS));
    multiply_adds += field(s, ROWS) * (field(s, START) + field(s, ROWS)) * heads * DIM * 2;
  }
  const int64_t blocks = (largest_rows + query_block - 1) / query_block;
  for (int64_t b = blocks - 1; b >= 0; --b)
    for (int64_t s = 0; s < count; ++s)
      if (b * query_block < field(s, ROWS))
        for (int64_t h = 0; h < kv_heads; ++h) items.push_back((b * count + s) * kv_heads + h);
  if (multiply_adds < (int64_t(1) << 17)) threads = 1;
  const int64_t tokens = static_cast<int64_t>(row_sequence.size());
  kernels::parallel_for(tokens, threads, [&](int64_t first, int64_t last) {
    float rotated[256];
    for (int64_t r = first; r < last; ++r) {
      const int64_t s = row_sequence[r], position = field(s, START) + r - field(s, ROW0);
      const float* c = cos + position * DIM;
      const float* n = sin + position * DIM;
      float* row = qkv + r * width;
      for (int64_t h = 0; h < kv_heads; ++h) {
        rotate(row + (heads + h) * DIM, c, n, DIM, rotated);
        store_row(rotated, DIM, cache(s, KEY_CACHE, h) + position * DIM);
        store_row(row + (heads + kv_heads + h) * DIM, DIM, cache(s, VALUE_CACHE, h) + position * DIM);
      }
      for (int64_t h = 0; h < heads; ++h) {
        rotate(row + h * DIM, c, n, DIM, rotated);
        for (int64_t i = 0; i < DIM; ++i) row[h * DIM + i] = rotated[i] * scale;
      }
    }
  });
  kernels::parallel_for(static_cast<int64_t>(items.size()), threads, [&](int64_t first, int64_t last) {
    // Per thread: a block's keys, their transpose and its values; the item's queries [padded, DIM],
    // their positions, weights [padded, KEY_BLOCK], weighted sums [padded, DIM], running maxima and sums.
    thread_local std::vector<float> keys, kt, values, q, weights, acc, largest, total;
    thread_local std::vector<int64_t> position;
    const int64_t padded = (query_block * group + TILE - 1) / TILE * TILE;
    for (auto* buffer : {&keys, &kt, &values}) buffer->resize(static_cast<size_t>(KEY_BLOCK * DIM));
    for (auto* buffer : {&q, &acc}) buffer->resize(static_cast<size_t>(padded * DIM));
    weights.resize(static_cast<size_t>(padded * KEY_BLOCK));
    largest.resize(static_cast<size_t>(padded));
    total.resize(static_cast<size_t>(padded));
    position.resize(static_cast<size_t>(padded));
    for (int64_t it = first; it < last; ++it) {
      const int64_t item = items[it], h = item % kv_heads, s = (item / kv_heads) % count;
      const int64_t b = item / kv_heads / count, start = field(s, START), row0 = field(s, ROW0);
      const int64_t q0 = b * query_block, q1 = std::min(field(s, ROWS), q0 + query_block);
      const int64_t queries = (q1 - q0) * group, tiles = (queries + TILE - 1) / TILE;
      const int64_t end = start + q1;  // keys [0, end) serve the block
      for (int64_t j = 0; j < tiles * TILE; ++j) {
        const int64_t i = q0 + j / group, g = j % group;
        position[j] = j < queries ? start + i : -1;  // a padding query sees no key
        if (j < queries)
          std::copy_n(qkv + (row0 + i) * width + (h * group + g) * DIM, DIM, q.data() + j * DIM);
        else
          std::fill_n(q.data() + j * DIM, DIM, 0.0f);
      }
      std::fill_n(acc.data(), tiles * TILE * DIM, 0.0f);
      std::fill_n(largest.data(), tiles * TILE, -INFINITY);
      std::fill_n(total.data(), tiles * TILE, 0.0f);
      const T* key_cache = cache(s, KEY_CACHE, h);
      const T* value_cache = cache(s, VALUE_CACHE, h);
      for (int64_t t0 = 0; t0 < end; t0 += KEY_BLOCK) {
        const int64_t block = std::min(KEY_BLOCK, end - t0);
        load_block<DIM>(key_cache + t0 * DIM, block, keys.data());
        transpose_block<DIM>(keys.data(), kt.data());
        load_block<DIM>(value_cache + t0 * DIM, block, values.data());
        for (int64_t tile = 0; tile < tiles; ++tile) {
          const int64_t j0 = tile * TILE;
          // Positions grow along the tile: its last real query (not padding) sees the most.
          if (position[std::min(j0 + TILE, queries) - 1] < t0) continue;  // the tile sees none of it
          float* w = weights.data() + j0 * KEY_BLOCK;
          tile_scores<DIM>(q.data() + j0 * DIM, kt.data(), w);
          float factor[TILE];
          int64_t seen[TILE];
          for (int j = 0; j < TILE; ++j) {
            seen[j] = std::max<int64_t>(0, std::min(block, position[j0 + j] + 1 - t0));  // causal
            if (seen[j] > 0) {
              factor[j] = softmax_update(w + j * KEY_BLOCK, seen[j], largest[j0 + j], total[j0 + j]);
            } else {
              factor[j] = 1.0f;
              std::fill_n(w + j * KEY_BLOCK, KEY_BLOCK, 0.0f);
            }
          }
          for (int j = 0; j < TILE; j += 2)
            pair_values<DIM>(w + j * KEY_BLOCK, factor + j, values.data(), std::max(seen[j], seen[j + 1]),
                             acc.data() + (j0 + j) * DIM);
        }
      }
      for (int64_t j = 0; j < queries; ++j) {
        const int64_t i = q0 + j / group, g = j % group;
        const float norm = 1.0f / total[j];
        float* o = out + (row0 + i) * heads * DIM + (h * group + g) * DIM;
        for (int64_t k = 0; k < DIM; ++k) o[k] = acc[j * DIM + k] * norm;
      }
    }
  });
}

template <typename T>
bool prefill_attention_any(float* qkv, int64_t count, const int64_t* sequences, int64_t heads, int64_t kv_heads,
                           int64_t dim, const float* cos, const float* sin, float scale, float* out, int threads) {
  if (kv_heads <= 0 || heads % kv_heads) return false;
  if (dim == 64)
    prefill_attend<64, T>(qkv, count, sequences, heads, kv_heads, cos, sin, scale, out, threads);
  else if (dim == 96)
    prefill_attend<96, T>(qkv, count, sequences, heads, kv_heads, cos, sin, scale, out, threads);
  else if (dim == 128)
    prefill_attend<128, T>(qkv, count, sequences, heads, kv_heads, cos, sin, scale, out, threads);
  else if (dim == 256)
    prefill_attend<256, T>(qkv, count, sequences, heads, kv_heads, cos, sin, scale, out, threads);
  else
    return false;
  return true;
}

// Below this many elements a GLU runs on the calling thread alone (a decode step's few rows).
constexpr int64_t PARALLEL_ELEMENTS = 1 << 16;

inline __m256 glu_load(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 glu_load(const uint16_t* p) { return kernels::load8_bfloat16(p); }
inline void glu_store(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void glu_store(uint16_t* p, __m256 v) {
  const __m256i bits = kernels::bfloat16_bits(v);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1)));
}
inline float glu_load1(const float* p) { return *p; }
inline float glu_load1(const uint16_t* p) { return kernels::bfloat16_to_float(*p); }
inline void glu_store1(float* p, float v) { *p = v; }
inline void glu_store1(uint16_t* p, float v) { *p = kernels::bfloat16_bits(v); }

// Rows [first, last) of act(gate) * up, gate_up [rows, 2 * width] (gate then up), out [rows, width]:
// SwiGLU's silu (Shazeer 2020) or, GELU, GeGLU's tanh form (Hendrycks & Gimpel 2016; torch's
// approximate="tanh"), computed in float32 whatever T holds (float32, or bfloat16 bits).
template <bool GELU, typename T = float>
void glu_rows(const T* gate_up, int64_t first, int64_t last, int64_t width, T* out) {
  constexpr float ROOT_2_OVER_PI = 0.7978845608028654f, CUBIC = 0.044715f;
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  for (int64_t r = first; r < last; ++r) {
    const T* gate = gate_up + r * 2 * width;
    const T* up = gate + width;
    T* o = out + r * width;
    int64_t i = 0;
    for (; i + 8 <= width; i += 8) {
      const __m256 g = glu_load(gate + i);
      __m256 act;
      if constexpr (GELU) {
        const __m256 inner = _mm256_mul_ps(_mm256_set1_ps(ROOT_2_OVER_PI),
                                           _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(CUBIC), g), _mm256_mul_ps(g, g), g));
        act = _mm256_mul_ps(_mm256_mul_ps(half, g), _mm256_add_ps(one, tanh256(inner)));
      } else {
        act = _mm256_div_ps(g, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), g))));
      }
      glu_store(o + i, _mm256_mul_ps(act, glu_load(up + i)));
    }
    for (; i < width; ++i) {
      const float g = glu_load1(gate + i);
      const float act = GELU ? 0.5f * g * (1.0f + tanhf(ROOT_2_OVER_PI * (g + CUBIC * g * g * g))) : g / (1.0f + expf(-g));
      glu_store1(o + i, act * glu_load1(up + i));
    }
  }
}

// Row r of logits [rows, vocab]: the log-probabilities of targets[r] and of the row's most likely
// token (its first index), each (x - max) - log(sum(exp(x - max))) as torch's log_softmax takes
// them. A row holding a NaN gives NaN log-probabilities and that NaN's index (every value of torch's
// log_softmax row is then NaN, and which one its topk names is arbitrary).
void prompt_logprob_rows(const float* logits, int64_t first, int64_t last, int64_t vocab, const int64_t* targets,
                         float* target_logprobs, int64_t* top_ids, float* top_logprobs) {
  for (int64_t r = first; r < last; ++r) {
    const float* x = logits + r * vocab;
    __m256 top = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= vocab; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      top = _mm256_max_ps(v, top);  // a NaN in v leaves top as it was: counted apart
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float largest = horizontal_max(top);
    bool has_nan = _mm256_movemask_ps(nan) != 0;
    for (int64_t j = i; j < vocab; ++j) {
      has_nan |= x[j] != x[j];
      largest = std::max(largest, x[j]);
    }
    if (has_nan) {
      top_ids[r] = std::find_if(x, x + vocab, [](float v) { return v != v; }) - x;
      target_logprobs[r] = top_logprobs[r] = NAN;
      continue;
    }
    const __m256 shift = _mm256_set1_ps(largest);
    __m256 sum = _mm256_setzero_ps();
    int64_t argmax = -1;
    for (i = 0; i + 8 <= vocab; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      sum = _mm256_add_ps(sum, exp256(_mm256_sub_ps(v, shift)));
      if (argmax < 0) {
        const int equal = _mm256_movemask_ps(_mm256_cmp_ps(v, shift, _CMP_EQ_OQ));
        if (equal) argmax = i + __builtin_ctz(static_cast<unsigned>(equal));
      }
    }
    float total = horizontal_sum(sum);
    for (; i < vocab; ++i) {
      total += expf(x[i] - largest);
      if (argmax < 0 && x[i] == largest) argmax = i;
    }
    const float log_sum = logf(total);
    const int64_t target = targets[r];
    target_logprobs[r] = target >= 0 && target < vocab ? (x[target] - largest) - log_sum : NAN;
    top_ids[r] = argmax < 0 ? 0 : argmax;
    top_logprobs[r] = 0.0f - log_sum;  // (largest - largest) - log_sum: +0 for a certain token, as torch's
  }
}

}  // namespace

extern "C" {

// x, out: [rows, width] float32 (out may be x); weight: [width].
KERNEL_EXPORT void rms_norm(const float* x, int64_t rows, int64_t width, const float* weight, float eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * width;
    float* o = out + r * width;
    const float scale = 1.0f / sqrtf(dot(xr, xr, width) / static_cast<float>(width) + eps);
    int64_t i = 0;
    const __m256 s = _mm256_set1_ps(scale);
    for (; i + 8 <= width; i += 8)
      _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_loadu_ps(weight + i), _mm256_mul_ps(_mm256_loadu_ps(xr + i), s)));
    for (; i < width; ++i) o[i] = weight[i] * (xr[i] * scale);
  }
}

// A prefilled cache into rows [row0, row0 + copies) of the running batch's caches: targets holds the
// addresses of every layer's key buffer, then every layer's value buffer, each [row capacity,
// kv_heads, capacity, dim]; keys/values are [layers, kv_heads, positions, dim] with strides (in
// elements) strides[0..2] and dim contiguous; positions [0, length) are copied.  element_size: bytes
// per value (2 for float16, 4 for float32).  One call where torch's copy takes two views per layer.
KERNEL_EXPORT void copy_cache_rows(const int64_t* targets, int64_t layers, int64_t row0, int64_t copies, int64_t kv_heads,
                                   int64_t capacity, int64_t dim, const char* keys, const char* values,
                                   const int64_t* strides, int64_t length, int64_t element_size) {
  const int64_t run = dim * element_size;  // bytes of one position
  for (int half = 0; half < 2; ++half) {
    const char* source = half ? values : keys;
    for (int64_t layer = 0; layer < layers; ++layer) {
      char* target = reinterpret_cast<char*>(targets[half * layers + layer]);
      for (int64_t copy = 0; copy < copies; ++copy)
        for (int64_t head = 0; head < kv_heads; ++head) {
          char* to = target + ((row0 + copy) * kv_heads + head) * capacity * run;
          const char* from = source + (layer * strides[0] + head * strides[1]) * element_size;
          if (strides[2] == dim) {
            memcpy(to, from, static_cast<size_t>(length * run));
          } else {
            for (int64_t position = 0; position < length; ++position)
              memcpy(to + position * run, from + position * strides[2] * element_size, static_cast<size_t>(run));
          }
        }
    }
  }
}

// gate_up: [rows, 2 * width] (gate then up); out: [rows, width] = act(gate) * up, act SiLU (gelu ==
// 0) or GELU's tanh form (Gemma's GeGLU), over pool.h's threads, in float32 (bfloat16 == 0) or on
// bfloat16 bits in and out (bfloat16 != 0: a long prefill chunk's bfloat16 product, and the next one's input).
KERNEL_EXPORT void glu_mul(const void* gate_up, int64_t rows, int64_t width, void* out, int gelu, int bfloat16,
                           int threads) {
  if (rows * width < PARALLEL_ELEMENTS) threads = 1;
  kernels::parallel_for(rows, threads, [&](int64_t first, int64_t last) {
    if (bfloat16) {
      const auto* in = static_cast<const uint16_t*>(gate_up);
      auto* o = static_cast<uint16_t*>(out);
      (gelu ? glu_rows<true, uint16_t> : glu_rows<false, uint16_t>)(in, first, last, width, o);
    } else {
      const auto* in = static_cast<const float*>(gate_up);
      auto* o = static_cast<float*>(out);
      (gelu ? glu_rows<true, float> : glu_rows<false, float>)(in, first, last, width, o);
    }
  });
}

// logits: [rows, vocab] float32; targets: [rows]; out: [rows] each (prompt_logprob_rows), over
// pool.h's threads: a prompt's log-probabilities (echo) without torch's log_softmax, topk and their
// [rows, vocab] temporaries, which took most of a scoring request's time outside the model.
KERNEL_EXPORT void prompt_logprobs(const float* logits, int64_t rows, int64_t vocab, const int64_t* targets,
                                   float* target_logprobs, int64_t* top_ids, float* top_logprobs, int threads) {
  kernels::parallel_for(rows, threads, [&](int64_t first, int64_t last) {
    prompt_logprob_rows(logits, first, last, vocab, targets, target_logprobs, top_ids, top_logprobs);
  });
}

// qkv: [rows, (heads + 2 kv_heads) * dim], queries then keys then values.
// cos, sin: [positions, dim] tables; positions: [rows], the position of each row's new token.
// keys, values: caches, row r's kv head h at keys + r * row_stride + h * head_stride, [capacity, dim].
// out: [rows, heads * dim].  dim even and at most 256.  window: a query attends to its last `window`
// positions (a sliding window), or 0 to all.  softcap: scores become softcap tanh(score / softcap)
// before the softmax (Gemma 2's attn_logit_softcapping), or 0 for none.
KERNEL_EXPORT void decode_attention(const float* qkv, int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim,
                                   const float* cos, const float* sin, const int64_t* positions, float* keys,
                                   float* values, int64_t row_stride, int64_t head_stride, float scale, float* out,
                                   int threads, int64_t window, float softcap) {
  attend(qkv, rows, heads, kv_heads, dim, cos, sin, positions, keys, values, row_stride, head_stride, scale, out,
         threads, window, softcap);
}

// decode_attention with float16 caches (IEEE half bits).
KERNEL_EXPORT void decode_attention_f16(const float* qkv, int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim,
                                       const float* cos, const float* sin, const int64_t* positions, uint16_t* keys,
                                       uint16_t* values, int64_t row_stride, int64_t head_stride, float scale,
                                       float* out, int threads, int64_t window, float softcap) {
  attend(qkv, rows, heads, kv_heads, dim, cos, sin, positions, keys, values, row_stride, head_stride, scale, out,
         threads, window, softcap);
}

// A prefill pass's attention (prefill_attend above).  qkv: [tokens, (heads + 2 kv_heads) * dim], the
// pass's rows (its queries are rotated and scaled in place); sequences: [count, 6] int64 per sequence:
// its first row in qkv, its rows, the positions cached before them, the caches' head stride
// (elements), and the addresses of its layer's key and value caches ([kv_heads, capacity, dim]
// float32, or float16 bits in prefill_attention_f16), into which its rows' keys and values are
// written; cos, sin: the rotary tables as decode_attention's.  out: [tokens, heads * dim].
// The sequences' rows follow one another in qkv (each ROW0 the sum of the rows before it).
// Returns 0, nothing done, unless dim is 64, 96, 128 or 256 and heads a multiple of kv_heads.
KERNEL_EXPORT int prefill_attention(float* qkv, int64_t count, const int64_t* sequences, int64_t heads,
                                    int64_t kv_heads, int64_t dim, const float* cos, const float* sin, float scale,
                                    float* out, int threads) {
  return prefill_attention_any<float>(qkv, count, sequences, heads, kv_heads, dim, cos, sin, scale, out, threads);
}

KERNEL_EXPORT int prefill_attention_f16(float* qkv, int64_t count, const int64_t* sequences, int64_t heads,
                                        int64_t kv_heads, int64_t dim, const float* cos, const float* sin,
                                        float scale, float* out, int threads) {
  return prefill_attention_any<uint16_t>(qkv, count, sequences, heads, kv_heads, dim, cos, sin, scale, out,
                                         threads);
}

}

// --- A whole decode step's decoder layers in one call ----------------------------------------------
//
// What LlamaModelRunner._decode_layers_fused does per layer (RMSNorm, q/k/v product, its bias and
// per-head q/k RMSNorms where the layer has them, attention, o product into the residual, RMSNorm,
// gate/up product, SiLU times up, down product into the residual), for layers whose products all run
// on our block kernels: one call per step instead of eight or more per layer from Python, whose
// overhead was a fifth of a batch-1 step of the embedded model.

extern "C" void q4_1_gemm(const float* x, int64_t M, int64_t K, const uint8_t* qs, const float* d, const float* m,
                          int64_t N, float* y, int add, int threads);
extern "C" void q8_0_gemm(const float* x, int64_t M, int64_t K, const int8_t* qs, const float* d, int64_t N, float* y,
                          int add, int threads);
extern "C" void ggml_gemm(int type, const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, float* y, int add,
                          int threads);
extern "C" int ggml_gemm_parts(int parts, const int* types, const uint8_t* const* ws, const int64_t* Ns, const float* x,
                               int64_t M, int64_t K, float* y, int64_t width, int add, int threads);

namespace {

// One layer's row of the table: pointers as int64, then its products' parts.
enum LayerField : int64_t {
  INPUT_NORM, POST_NORM, Q_NORM, K_NORM, QKV_BIAS, KEYS, VALUES, WINDOW, ATTENTION_OUTPUT_NORM, MLP_OUTPUT_NORM, PRODUCTS
};
// A product (q/k/v, o, gate/up, down) is up to PARTS weights over the same input, their outputs side by
// side, each PART_FIELDS int64: its kind (0 after the last), three operands, its output columns.
enum PartKind : int64_t { PART_END, PART_Q4_1, PART_Q8_0, PART_GGML };
constexpr int64_t PARTS = 3, PART_FIELDS = 5, PRODUCT_FIELDS = PARTS * PART_FIELDS;
constexpr int64_t LAYER_FIELDS = PRODUCTS + 4 * PRODUCT_FIELDS;
enum Product : int64_t { QKV, O, GATE_UP, DOWN };

void* pointer(int64_t value) { return reinterpret_cast<void*>(value); }

void part_gemm(const int64_t* part, const float* in, int64_t rows, int64_t K, float* out, int add, int threads) {
  const int64_t N = part[4];
  switch (part[0]) {
    case PART_Q4_1:
      q4_1_gemm(in, rows, K, static_cast<const uint8_t*>(pointer(part[1])), static_cast<const float*>(pointer(part[2])),
                static_cast<const float*>(pointer(part[3])), N, out, add, threads);
      return;
    case PART_Q8_0:
      q8_0_gemm(in, rows, K, static_cast<const int8_t*>(pointer(part[1])), static_cast<const float*>(pointer(part[2])), N,
                out, add, threads);
      return;
    default:
      ggml_gemm(static_cast<int>(part[2]), in, rows, K, static_cast<const uint8_t*>(pointer(part[1])), N, out, add, threads);
  }
}

// out [rows, width] (+)= in [rows, K] times a product's parts: ggml blocks in one call where
// ggml_gemm_parts takes them, else part by part through scratch.
void product(const int64_t* parts, const float* in, int64_t rows, int64_t K, float* out, int64_t width, int add,
             std::vector<float>& scratch, int threads) {
  if (parts[PART_FIELDS] == PART_END) {
    part_gemm(parts, in, rows, K, out, add, threads);
    return;
  }
  int count = 0, types[PARTS];
  const uint8_t* weights[PARTS];
  int64_t columns[PARTS];
  bool blocks = true;
  for (const int64_t* part = parts; count < PARTS && part[0] != PART_END; part += PART_FIELDS, ++count) {
    blocks &= part[0] == PART_GGML;
    types[count] = static_cast<int>(part[2]);
    weights[count] = static_cast<const uint8_t*>(pointer(part[1]));
    columns[count] = part[4];
  }
  if (blocks && ggml_gemm_parts(count, types, weights, columns, in, rows, K, out, width, add, threads)) return;
  int64_t column = 0;
  for (const int64_t* part = parts; part < parts + PRODUCT_FIELDS && part[0] != PART_END; part += PART_FIELDS) {
    const int64_t n = part[4];
    scratch.resize(static_cast<size_t>(rows * n));
    part_gemm(part, in, rows, K, scratch.data(), 0, threads);
    for (int64_t r = 0; r < rows; ++r) {
      float* target = out + r * width + column;
      const float* source = scratch.data() + r * n;
      if (add)
        for (int64_t i = 0; i < n; ++i) target[i] += source[i];
      else
        memcpy(target, source, static_cast<size_t>(n) * sizeof(float));
    }
    column += n;
  }
}

template <typename T>
void decode_layers(float* x, int64_t rows, int64_t layers, const int64_t* table, int64_t hidden, int64_t heads,
                   int64_t kv_heads, int64_t dim, int64_t inter, float eps, const float* cos, const float* sin,
                   const int64_t* positions, int64_t row_stride, int64_t head_stride, float scale, float softcap,
                   int gelu, int threads) {
  const int64_t qkv_width = (heads + 2 * kv_heads) * dim;
  std::vector<float> normed(static_cast<size_t>(rows * (hidden > inter ? hidden : inter))), output;
  std::vector<float> qkv(static_cast<size_t>(rows * qkv_width)), attended(static_cast<size_t>(rows * heads * dim));
  std::vector<float> gate_up(static_cast<size_t>(rows * 2 * inter)), scratch;
  for (int64_t layer = 0; layer < layers; ++layer) {
    const int64_t* f = table + layer * LAYER_FIELDS;
    const int64_t* products = f + PRODUCTS;
    auto gemm = [&](Product which, const float* in, int64_t K, float* out, int64_t width, int add) {
      product(products + which * PRODUCT_FIELDS, in, rows, K, out, width, add, scratch, threads);
    };
    rms_norm(x, rows, hidden, static_cast<const float*>(pointer(f[INPUT_NORM])), eps, normed.data());
    gemm(QKV, normed.data(), hidden, qkv.data(), qkv_width, 0);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = qkv.data() + r * qkv_width;
      if (f[QKV_BIAS] != 0) {
        const float* bias = static_cast<const float*>(pointer(f[QKV_BIAS]));
        for (int64_t i = 0; i < qkv_width; ++i) row[i] += bias[i];
      }
      if (f[Q_NORM] != 0) {  // each query and key head's RMSNorm, before rotary embeddings
        rms_norm(row, heads, dim, static_cast<const float*>(pointer(f[Q_NORM])), eps, row);
        rms_norm(row + heads * dim, kv_heads, dim, static_cast<const float*>(pointer(f[K_NORM])), eps, row + heads * dim);
      }
    }
    attend(qkv.data(), rows, heads, kv_heads, dim, cos, sin, positions, static_cast<T*>(pointer(f[KEYS])),
           static_cast<T*>(pointer(f[VALUES])), row_stride, head_stride, scale, attended.data(), threads, f[WINDOW],
           softcap);
    // x += the product, through its output norm (Gemma's sandwich norms) where the layer has one.
    auto add_normed = [&](Product which, const float* in, int64_t K, LayerField norm) {
      if (f[norm] == 0) {
        gemm(which, in, K, x, hidden, 1);
        return;
      }
      output.resize(static_cast<size_t>(rows * hidden));
      gemm(which, in, K, output.data(), hidden, 0);
      rms_norm(output.data(), rows, hidden, static_cast<const float*>(pointer(f[norm])), eps, output.data());
      for (int64_t i = 0; i < rows * hidden; ++i) x[i] += output[i];
    };
    add_normed(O, attended.data(), heads * dim, ATTENTION_OUTPUT_NORM);
    rms_norm(x, rows, hidden, static_cast<const float*>(pointer(f[POST_NORM])), eps, normed.data());
    gemm(GATE_UP, normed.data(), hidden, gate_up.data(), 2 * inter, 0);
    (gelu ? glu_rows<true> : glu_rows<false>)(gate_up.data(), 0, rows, inter, normed.data());
    add_normed(DOWN, normed.data(), inter, MLP_OUTPUT_NORM);
  }
}

}  // namespace

extern "C" {

// x: [rows, hidden] float32, the residual stream (the embeddings in, the last layer's output out).
// table: [layers, 70] int64, per layer: the addresses of its RMSNorm scales (input, post-attention),
// of its per-head query and key RMSNorm scales [dim] and q/k/v bias [(heads + 2 kv_heads) dim] (0
// where the layer has none), of its key and value caches (float32 here, float16 bits in
// decode_layers_f16), its sliding window (0: none), its attention and MLP output RMSNorm scales
// (Gemma's; 0: none); then its q/k/v, o, gate/up and down products,
// 3 parts of 5 each: kind (1 Q4_1: qs, d, m as q4_1_gemm takes them; 2 Q8_0: qs, d; 3 ggml blocks:
// the weight, its ggml type; 0 after the last part), the three operands, the part's output columns.
// The rest as rms_norm, glu_mul and decode_attention take them; inter: the MLP's width; softcap:
// decode_attention's, every layer's; gelu: GeGLU where nonzero, else SwiGLU (as glu_mul's).
KERNEL_EXPORT void decode_layers_f32(float* x, int64_t rows, int64_t layers, const int64_t* table, int64_t hidden,
                                     int64_t heads, int64_t kv_heads, int64_t dim, int64_t inter, float eps,
                                     const float* cos, const float* sin, const int64_t* positions, int64_t row_stride,
                                     int64_t head_stride, float scale, float softcap, int gelu, int threads) {
  decode_layers<float>(x, rows, layers, table, hidden, heads, kv_heads, dim, inter, eps, cos, sin, positions,
                       row_stride, head_stride, scale, softcap, gelu, threads);
}

KERNEL_EXPORT void decode_layers_f16(float* x, int64_t rows, int64_t layers, const int64_t* table, int64_t hidden,
                                     int64_t heads, int64_t kv_heads, int64_t dim, int64_t inter, float eps,
                                     const float* cos, const float* sin, const int64_t* positions, int64_t row_stride,
                                     int64_t head_stride, float scale, float softcap, int gelu, int threads) {
  decode_layers<uint16_t>(x, rows, layers, table, hidden, heads, kv_heads, dim, inter, eps, cos, sin, positions,
                          row_stride, head_stride, scale, softcap, gelu, threads);
}

// The table's width (LAYER_FIELDS), for the caller to check against its own.
KERNEL_EXPORT int64_t decode_layers_fields() { return LAYER_FIELDS; }

}
