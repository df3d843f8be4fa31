// The small operations of a Llama decode step, one call each instead of several torch operations
// (issue 12: at batch 1 on a 2-core CPU, torch's per-operation cost was half of the step once the
// matrix products were fast).  Float32 throughout; AVX2 + FMA; pool.h's threads, as many as the caller says.
//
//   rms_norm:         Zhang & Sennrich 2019, as transformers' LlamaRMSNorm computes it in float32.
//   silu_mul:         SwiGLU's silu(gate) * up (Shazeer 2020) from the fused gate/up product.
//   decode_attention: rotary embeddings (Su et al. 2021) of each row's new query and key, the new
//                     key and value written into the row's cache at its position, then grouped-query
//                     attention (Ainslie et al. 2023) of the queries over positions 0..position,
//                     with an exact softmax: no mask, each row attends over its own length.

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

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

// out[0:DIM] = norm * sum_u weights[u] * values[u, 0:DIM], the accumulators in registers.
template <int DIM, typename T>
inline void weighted_sum(const float* weights, float norm, const T* values, int64_t length, float* out) {
  constexpr int VECTORS = DIM / 8;
  __m256 acc[VECTORS];
#pragma GCC unroll 16
  for (int i = 0; i < VECTORS; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t u = 0; u < length; ++u) {
    const __m256 w = _mm256_set1_ps(weights[u]);
    const T* v = values + u * DIM;
#pragma GCC unroll 16
    for (int i = 0; i < VECTORS; ++i) acc[i] = _mm256_fmadd_ps(w, load8(v + 8 * i), acc[i]);
  }
  const __m256 scale = _mm256_set1_ps(norm);
#pragma GCC unroll 16
  for (int i = 0; i < VECTORS; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(acc[i], scale));
}

template <typename T>
inline void weighted_sum_any(const float* weights, float norm, const T* values, int64_t length, int64_t dim,
                             float* out) {
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
            float scale, float* out, int threads) {
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
      const int64_t length = position + 1;
      scores.resize(static_cast<size_t>(length));
      for (int64_t g = 0; g < group; ++g) {
        const int64_t head = h * group + g;
        rotate(row + head * dim, c, s, dim, query);
        float largest = -INFINITY;
        for (int64_t t = 0; t < length; ++t) {
          scores[t] = dot(query, key_cache + t * dim, dim) * scale;
          largest = scores[t] > largest ? scores[t] : largest;
        }
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
        if (dim == 64)
          weighted_sum<64>(scores.data(), 1.0f / total, value_cache, length, o);
        else if (dim == 128)
          weighted_sum<128>(scores.data(), 1.0f / total, value_cache, length, o);
        else
          weighted_sum_any(scores.data(), 1.0f / total, value_cache, length, dim, o);
      }
    }
  });
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

// gate_up: [rows, 2 * width] (gate then up); out: [rows, width] = silu(gate) * up.
KERNEL_EXPORT void silu_mul(const float* gate_up, int64_t rows, int64_t width, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = gate_up + r * 2 * width;
    const float* up = gate + width;
    float* o = out + r * width;
    int64_t i = 0;
    for (; i + 8 <= width; i += 8) {
      const __m256 g = _mm256_loadu_ps(gate + i);
      const __m256 sig = _mm256_div_ps(g, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), g))));
      _mm256_storeu_ps(o + i, _mm256_mul_ps(sig, _mm256_loadu_ps(up + i)));
    }
    for (; i < width; ++i) o[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
  }
}

// qkv: [rows, (heads + 2 kv_heads) * dim], queries then keys then values.
// cos, sin: [positions, dim] tables; positions: [rows], the position of each row's new token.
// keys, values: caches, row r's kv head h at keys + r * row_stride + h * head_stride, [capacity, dim].
// out: [rows, heads * dim].  dim even and at most 256.
KERNEL_EXPORT void decode_attention(const float* qkv, int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim,
                                   const float* cos, const float* sin, const int64_t* positions, float* keys,
                                   float* values, int64_t row_stride, int64_t head_stride, float scale, float* out,
                                   int threads) {
  attend(qkv, rows, heads, kv_heads, dim, cos, sin, positions, keys, values, row_stride, head_stride, scale, out,
         threads);
}

// decode_attention with float16 caches (IEEE half bits).
KERNEL_EXPORT void decode_attention_f16(const float* qkv, int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim,
                                       const float* cos, const float* sin, const int64_t* positions, uint16_t* keys,
                                       uint16_t* values, int64_t row_stride, int64_t head_stride, float scale,
                                       float* out, int threads) {
  attend(qkv, rows, heads, kv_heads, dim, cos, sin, positions, keys, values, row_stride, head_stride, scale, out,
         threads);
}

}

// --- A whole decode step's decoder layers in one call ----------------------------------------------
//
// What LlamaModelRunner._decode_layers_fused does per layer (RMSNorm, q/k/v product, attention,
// o product into the residual, RMSNorm, gate/up product, SiLU times up, down product into the
// residual), for layers whose four products are all Q4_1 (block_gemm.cpp's q4_1_gemm): one call per
// step instead of eight per layer from Python, whose overhead was a fifth of a batch-1 step.

extern "C" void q4_1_gemm(const float* x, int64_t M, int64_t K, const uint8_t* qs, const float* d, const float* m,
                          int64_t N, float* y, int add, int threads);

namespace {

// One layer's row of the table: pointers as int64.
enum LayerField : int64_t {
  INPUT_NORM, POST_NORM,
  QKV_QS, QKV_D, QKV_M, O_QS, O_D, O_M, GATE_UP_QS, GATE_UP_D, GATE_UP_M, DOWN_QS, DOWN_D, DOWN_M,
  KEYS, VALUES, LAYER_FIELDS
};

template <typename T>
void decode_layers(float* x, int64_t rows, int64_t layers, const int64_t* table, int64_t hidden, int64_t heads,
                   int64_t kv_heads, int64_t dim, int64_t inter, float eps, const float* cos, const float* sin,
                   const int64_t* positions, int64_t row_stride, int64_t head_stride, float scale, int threads) {
  const int64_t qkv_width = (heads + 2 * kv_heads) * dim;
  std::vector<float> normed(static_cast<size_t>(rows * (hidden > inter ? hidden : inter)));
  std::vector<float> qkv(static_cast<size_t>(rows * qkv_width)), attended(static_cast<size_t>(rows * heads * dim));
  std::vector<float> gate_up(static_cast<size_t>(rows * 2 * inter));
  auto pointer = [](int64_t value) { return reinterpret_cast<void*>(value); };
  for (int64_t layer = 0; layer < layers; ++layer) {
    const int64_t* f = table + layer * LAYER_FIELDS;
    auto gemm = [&](const float* in, int64_t K, int first, int64_t N, float* out, int add) {
      q4_1_gemm(in, rows, K, static_cast<const uint8_t*>(pointer(f[first])), static_cast<const float*>(pointer(f[first + 1])),
                static_cast<const float*>(pointer(f[first + 2])), N, out, add, threads);
    };
    rms_norm(x, rows, hidden, static_cast<const float*>(pointer(f[INPUT_NORM])), eps, normed.data());
    gemm(normed.data(), hidden, QKV_QS, qkv_width, qkv.data(), 0);
    attend(qkv.data(), rows, heads, kv_heads, dim, cos, sin, positions, static_cast<T*>(pointer(f[KEYS])),
           static_cast<T*>(pointer(f[VALUES])), row_stride, head_stride, scale, attended.data(), threads);
    gemm(attended.data(), heads * dim, O_QS, hidden, x, 1);
    rms_norm(x, rows, hidden, static_cast<const float*>(pointer(f[POST_NORM])), eps, normed.data());
    gemm(normed.data(), hidden, GATE_UP_QS, 2 * inter, gate_up.data(), 0);
    silu_mul(gate_up.data(), rows, inter, normed.data());
    gemm(normed.data(), inter, DOWN_QS, hidden, x, 1);
  }
}

}  // namespace

extern "C" {

// x: [rows, hidden] float32, the residual stream (the embeddings in, the last layer's output out).
// table: [layers, 16] int64, per layer the addresses of its RMSNorm scales (input, post-attention),
// its q/k/v, o, gate/up and down Q4_1 weights (qs, d, m each, as q4_1_gemm takes them) and its key and
// value caches (float32 here, float16 in decode_layers_q4_1_f16), in LayerField's order.  The rest as
// rms_norm, silu_mul and decode_attention take them; inter: the MLP's width.
KERNEL_EXPORT void decode_layers_q4_1(float* x, int64_t rows, int64_t layers, const int64_t* table, int64_t hidden,
                                      int64_t heads, int64_t kv_heads, int64_t dim, int64_t inter, float eps,
                                      const float* cos, const float* sin, const int64_t* positions,
                                      int64_t row_stride, int64_t head_stride, float scale, int threads) {
  decode_layers<float>(x, rows, layers, table, hidden, heads, kv_heads, dim, inter, eps, cos, sin, positions,
                       row_stride, head_stride, scale, threads);
}

KERNEL_EXPORT void decode_layers_q4_1_f16(float* x, int64_t rows, int64_t layers, const int64_t* table,
                                          int64_t hidden, int64_t heads, int64_t kv_heads, int64_t dim,
                                          int64_t inter, float eps, const float* cos, const float* sin,
                                          const int64_t* positions, int64_t row_stride, int64_t head_stride,
                                          float scale, int threads) {
  decode_layers<uint16_t>(x, rows, layers, table, hidden, heads, kv_heads, dim, inter, eps, cos, sin, positions,
                          row_stride, head_stride, scale, threads);
}

}
