// Matrix products of float32 activations with GGUF-style block-quantized weights, for AVX2 + FMA and AVX-512.
//
// y[M, N] = x[M, K] @ W[N, K]^T, where W is stored per output row in groups of 32 along K:
//   Q4_1 (ggml's block_q4_1): 16 bytes whose low nibbles are weights 0..15 of the group and high
//        nibbles 16..31, a scale d and a minimum m: w = d * q + m.
//   Q8_0 (ggml's block_q8_0): 32 signed bytes and a scale d: w = d * q.
// The scales are float32 here (the GGUF's float16 values converted exactly), so a group's weights
// are dequantized exactly as gguf-py does, and the products accumulate in float32: the result equals
// x @ dequantized(W)^T up to float32 summation order (but for the AVX2 one-row products and the
// products of ROUNDED_ROWS rows and more (on the AVX-512 code NARROW_ROUNDED_ROWS), which round x to
// 16 bits per group of 32 unless set_activation_bits says otherwise: see the 16-bit q4_1_one_row,
// q8_0_one_row and rounded_gemm).  Weights
// are read from memory once per product, as 4-bit or 8-bit values (a batch-1 decode step reads 1/6
// or 1/3.5 of a float32 weight's bytes), and dequantized once per 8 rows of x.
//
// Threads: pool.h's workers over blocks of output rows; the caller passes the count (torch's).
// Built by inference/cpu_kernels.py with -O3 -mavx2 -mfma (the AVX-512 versions below with their own
// target pragma, chosen at run time); called through ctypes.

#include <float.h>
#include <immintrin.h>
#include <stdint.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "pool.h"
#include "simd.h"

namespace {

constexpr int GROUP = 32;
constexpr int ROW_BLOCK = 8;  // rows of x sharing one dequantized group (8 accumulators in registers)
// Products smaller than this (multiply-adds) run on the calling thread alone: handing a slice to a
// worker (pool.h) costs more than it saves on them.
constexpr int64_t SMALL_WORK = int64_t(1) << 16;

using kernels::horizontal_sum;

// Output rows a product's loop asks the memory for ahead of the one it computes (prefetch_row).
// At one to a few rows of x a product reads each weight once, straight from memory, and the
// hardware prefetcher alone left the loops waiting on it, the AVX2 ones most, whose more instructions
// per group leave it less room (docs/performance.md#the-block-products).
constexpr int64_t PREFETCH_ROWS = 2;

// Asks for the cache lines holding `bytes` bytes from `offset` bytes after `base`.  The address is integer arithmetic and a
// prefetch never faults, so a row past the weight's last one is harmless.
inline void prefetch_bytes(const void* base, int64_t offset, int64_t bytes) {
  const uintptr_t start = reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(offset);
  const uintptr_t end = start + static_cast<uintptr_t>(bytes);
  for (uintptr_t line = start & ~uintptr_t(63); line < end; line += 64) _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
}

// The 32 weights of one group as four vectors of 8 floats, in order.
struct Q4_1 {
  const uint8_t* qs;  // [N, K / 32, 16]
  const float* d;     // [N, K / 32]
  const float* m;     // [N, K / 32]
  static inline void prefetch_row(const Q4_1& w, int64_t n, int64_t groups) {
    prefetch_bytes(w.qs, n * groups * 16, groups * 16);
    prefetch_bytes(w.d, n * groups * 4, groups * 4);
    prefetch_bytes(w.m, n * groups * 4, groups * 4);
  }
  static inline void group(const Q4_1& w, int64_t block, __m256 out[4]) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.qs + block * 16));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i low = _mm_and_si128(bytes, mask);
    const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
    const __m256 d = _mm256_set1_ps(w.d[block]);
    const __m256 m = _mm256_set1_ps(w.m[block]);
    out[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(low)), d, m);
    out[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(low, 8))), d, m);
    out[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(high)), d, m);
    out[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(high, 8))), d, m);
  }
};

struct Q8_0 {
  const int8_t* qs;  // [N, K]
  const float* d;    // [N, K / 32]
  static inline void prefetch_row(const Q8_0& w, int64_t n, int64_t groups) {
    prefetch_bytes(w.qs, n * groups * GROUP, groups * GROUP);
    prefetch_bytes(w.d, n * groups * 4, groups * 4);
  }
  static inline void group(const Q8_0& w, int64_t block, __m256 out[4]) {
    const int8_t* q = w.qs + block * GROUP;
    const __m256 d = _mm256_set1_ps(w.d[block]);
    #pragma GCC unroll 16
    for (int i = 0; i < 4; ++i) {
      const __m128i eight = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * i));
      out[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight)), d);
    }
  }
};

// One output row n against rows [r0, r0 + ROWS) of x.  With few rows each row keeps several
// accumulators, so that the FMAs of a group do not wait on one another.
template <typename W, int ROWS>
inline void dot_rows(const W& w, const float* x, int64_t K, int64_t N, int64_t n, int64_t r0, float* y, bool add) {
  constexpr int CHAINS = ROWS >= 4 ? 1 : 4 / ROWS;
  __m256 acc[ROWS][CHAINS];
  #pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r)
    #pragma GCC unroll 16
    for (int c = 0; c < CHAINS; ++c) acc[r][c] = _mm256_setzero_ps();
  const int64_t groups = K / GROUP;
  W::prefetch_row(w, n + PREFETCH_ROWS, groups);
  __m256 weights[4];
  for (int64_t g = 0; g < groups; ++g) {
    W::group(w, n * groups + g, weights);
    #pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r) {
      const float* xr = x + (r0 + r) * K + g * GROUP;
      #pragma GCC unroll 16
      for (int i = 0; i < 4; ++i) acc[r][i % CHAINS] = _mm256_fmadd_ps(weights[i], _mm256_loadu_ps(xr + 8 * i), acc[r][i % CHAINS]);
    }
  }
  #pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) {
    __m256 total = acc[r][0];
    #pragma GCC unroll 16
    for (int c = 1; c < CHAINS; ++c) total = _mm256_add_ps(total, acc[r][c]);
    float& target = y[(r0 + r) * N + n];
    target = add ? target + horizontal_sum(total) : horizontal_sum(total);
  }
}

// Rows of x in blocks of ROW_BLOCK (then the rest), each block against every output row of
// [first, last) before the next block: a block of x (8 rows, 18-49 KB for the embedded model's
// widths) stays in L1 while the chunk's weights come from L2, where taking every block for one output
// row before the next read all of x for each row and spilled L1 from 16 rows on
// (docs/performance.md#the-block-products).  dot(n, r0, rows) computes output row n against rows
// [r0, r0 + rows) of x (rows a std::integral_constant).
template <typename Dot>
inline void row_blocks(int64_t M, int64_t first, int64_t last, const Dot& dot) {
  int64_t r0 = 0;
  for (; r0 + ROW_BLOCK <= M; r0 += ROW_BLOCK)
    for (int64_t n = first; n < last; ++n) dot(n, r0, std::integral_constant<int, ROW_BLOCK>{});
  for (int64_t n = first; n < last; ++n) {
    switch (M - r0) {
      case 7: dot(n, r0, std::integral_constant<int, 7>{}); break;
      case 6: dot(n, r0, std::integral_constant<int, 6>{}); break;
      case 5: dot(n, r0, std::integral_constant<int, 5>{}); break;
      case 4: dot(n, r0, std::integral_constant<int, 4>{}); break;
      case 3: dot(n, r0, std::integral_constant<int, 3>{}); break;
      case 2: dot(n, r0, std::integral_constant<int, 2>{}); break;
      case 1: dot(n, r0, std::integral_constant<int, 1>{}); break;
      default: return;  // no rest
    }
  }
}

// Output row n of a one-row Q4_1 product: group(qs, g, d, acc) adds group g's centred-nibble product
// with x (qs its 16 bytes) times its scale d to acc; two accumulators, then the minimums' term
// (m + 8 d) times the groups' sums of x (sx); into y[n], or added to it.
template <typename Group>
inline void q4_1_row(const Q4_1& w, const float* sx, int64_t groups, int64_t n, float* y, bool add, const Group& group) {
  const uint8_t* qs = w.qs + n * groups * 16;
  const float* d = w.d + n * groups;
  const float* m = w.m + n * groups;
  Q4_1::prefetch_row(w, n + PREFETCH_ROWS, groups);
  __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 2 <= groups; g += 2) {
    even = group(qs + g * 16, g, d[g], even);
    odd = group(qs + (g + 1) * 16, g + 1, d[g + 1], odd);
  }
  if (g < groups) even = group(qs + g * 16, g, d[g], even);
  // The minimums' term, 8 groups at a time: summed one group after another it was a chain of
  // dependent multiply-adds as long as the row, as slow as the nibbles' products
  // (docs/performance.md#the-block-products).
  __m256 terms = _mm256_setzero_ps();
  for (g = 0; g + 8 <= groups; g += 8) {
    const __m256 factor = _mm256_fmadd_ps(_mm256_loadu_ps(d + g), _mm256_set1_ps(8.0f), _mm256_loadu_ps(m + g));
    terms = _mm256_fmadd_ps(factor, _mm256_loadu_ps(sx + g), terms);
  }
  float minimums = horizontal_sum(terms);
  for (; g < groups; ++g) minimums += (m[g] + 8.0f * d[g]) * sx[g];
  const float total = horizontal_sum(_mm256_add_ps(even, odd)) + minimums;
  y[n] = add ? y[n] + total : total;
}

// Q4_1 against one row of x (a decode step of one stream), without dequantizing first:
// sum_k (d q_k + m) x_k = d sum_k (q_k - 8) x_k + (m + 8 d) sum_k x_k per group, the groups' sums of
// x (sx) computed once for every output row, as ggml's q4_1 dot product uses its activations' block
// sums.  The nibbles are centred (q - 8) so that the two terms do not cancel: m + 8 d is about the
// group's mean weight, small where the weights are centred on zero, where m alone is about -7.5 d
// (uncentred, a row of x with a mean of 10 lost two digits to the cancellation).  A group's 16
// bytes are zero-extended 8 at a time (two shuffles, not six), their low nibbles being weights 0-7
// and 8-15 and their high nibbles 16-23 and 24-31; five multiply-adds, not eight.  Faster than
// dequantizing first on the AVX2 code; an AVX-512 version gained nothing and is not kept
// (docs/performance.md#the-block-products).
inline void q4_1_one_row(const Q4_1& w, const float* x, const float* sx, int64_t K, int64_t n, float* y, bool add) {
  const __m256i mask = _mm256_set1_epi32(0x0F);
  const __m256i eight = _mm256_set1_epi32(8);
  q4_1_row(w, sx, K / GROUP, n, y, add, [&](const uint8_t* qs, int64_t g, float d, __m256 acc) {
    const __m256i first = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
    const __m256i second = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)));
    const float* xg = x + g * GROUP;
    const auto centred = [&](__m256i nibbles) { return _mm256_cvtepi32_ps(_mm256_sub_epi32(nibbles, eight)); };
    __m256 sum = _mm256_mul_ps(centred(_mm256_and_si256(first, mask)), _mm256_loadu_ps(xg));
    sum = _mm256_fmadd_ps(centred(_mm256_and_si256(second, mask)), _mm256_loadu_ps(xg + 8), sum);
    sum = _mm256_fmadd_ps(centred(_mm256_srli_epi32(first, 4)), _mm256_loadu_ps(xg + 16), sum);
    sum = _mm256_fmadd_ps(centred(_mm256_srli_epi32(second, 4)), _mm256_loadu_ps(xg + 24), sum);
    return _mm256_fmadd_ps(sum, _mm256_set1_ps(d), acc);
  });
}

// One group of x (xg, 32 floats) loaded into v, its float sum into sx and its scale max |x| / largest
// into dx (largest: the rounded values' bound, 127 or 32767); returns the scale's inverse, by which
// x is then rounded.  A group whose scale would be subnormal (0 < max |x| < largest * FLT_MIN)
// clears representable (its inverse would overflow, and rounding it to zero would drop its term), as
// does one holding an infinity or a NaN (whose sum is not finite; rounding would make it 0): the
// caller then multiplies in float32, where they propagate.  An all-zero group has scale and inverse 0.
// The integer sums are multiplied by dx first and by the weight's d after, never by d * dx, which
// could underflow where each is normal (a group of x near 1e-33 against float16's smallest scales).
inline float group_scale(const float* xg, float largest, __m256 v[4], float* dx, float* sx, bool& representable) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(xg + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
    sum = _mm256_add_ps(sum, v[i]);
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float biggest = _mm_cvtss_f32(m4), d = biggest / largest;
  representable &= d >= FLT_MIN || biggest == 0.0f;
  const float inverse = d >= FLT_MIN ? 1.0f / d : 0.0f;
  *dx = inverse > 0.0f ? d : 0.0f;
  *sx = horizontal_sum(sum);
  representable &= std::isfinite(*sx);
  return inverse;
}

// Q4_1 against one row of x quantized to 8 bits per group of 32 (scale dx = max |x| / 127, rounded to
// nearest), multiplied with integer instructions as llama.cpp's AVX2 q4_1 x q8_1 dot product does
// (which also rounds dx and the group sums to float16, where these stay float32): per
// group one maddubs and one madd on the centred nibbles (q - 8, made unsigned by moving their sign
// onto x), then d * dx times that integer sum, plus (m + 8 d) times the group's float sum of x.  A
// third of the float loop's instructions per group (docs/performance.md#the-block-products).  The
// price is x's rounding to 8 bits: a product's relative error is about 1e-2 where the float loop's is
// 1e-7 (see the README for what it does to greedy text).  Only where set_activation_bits asks for 8
// (ENGINE_Q8_ACTIVATIONS=on), and only in the AVX2 products: the AVX-512 float loop is about as fast.
//
// x [K] into xq [K] (round(x / dx), |xq| <= 127), its groups' scales dx and float sums sx [K / 32];
// false where a group cannot be rounded (group_scale).
inline bool quantize_row(const float* x, int64_t K, int8_t* xq, float* dx, float* sx) {
  bool representable = true;
  for (int64_t g = 0; g < K / GROUP; ++g) {
    __m256 v[4];
    const __m256 id = _mm256_set1_ps(group_scale(x + g * GROUP, 127.0f, v, dx + g, sx + g, representable));
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));  // round to nearest
    // int32 -> int16 -> int8 packs work within 128-bit lanes: put the bytes back in order after.
    const __m256i w01 = _mm256_packs_epi32(q[0], q[1]);
    const __m256i w23 = _mm256_packs_epi32(q[2], q[3]);
    const __m256i b = _mm256_packs_epi16(w01, w23);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + g * GROUP), _mm256_permutevar8x32_epi32(b, order));
  }
  return representable;
}

inline void q4_1_one_row(const Q4_1& w, const int8_t* xq, const float* dx, const float* sx, int64_t K, int64_t n, float* y,
                         bool add) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i eight = _mm256_set1_epi8(8);
  const __m256i ones = _mm256_set1_epi16(1);
  q4_1_row(w, sx, K / GROUP, n, y, add, [&](const uint8_t* qs, int64_t g, float d, __m256 acc) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    // Bytes 0-15: the low nibbles (weights 0-15); 16-31: the high ones (weights 16-31).
    const __m256i q = _mm256_sub_epi8(_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes), low), eight);
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + g * GROUP));
    // maddubs multiplies unsigned by signed bytes: |q - 8| by x with q - 8's sign.
    const __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(xv, q)), ones);
    return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(dx[g])), _mm256_set1_ps(d), acc);
  });
}

// Q4_1 against one row of x rounded to 16 bits per group of 32 (scale dx = max |x| / 32767): per group
// the 16 bytes zero-extended to 16-bit lanes once (lane i: weight i in its low nibble, 16 + i in its
// high one), centred, and two madd with x: a group's products are summed exactly in integers, 8 lanes
// of 4, which one multiply-add by d * dx takes into the float accumulators.  A product's relative
// error is about 1e-5 (x's rounding), where the float loop's is 1e-7 and 8-bit activations' 1e-2; in
// likelihood it is as close to the float loop as the AVX-512 float loop is
// (bench/activation_bits_quality.py), and it is faster than the float loop and about as fast as 8-bit
// activations (docs/performance.md#why-our-own-kernels).  The AVX2 default (set_activation_bits); the
// AVX-512 float loop is as fast.
//
// As the 8-bit quantize_row, rounded to |xq| <= 32767.
inline bool quantize_row(const float* x, int64_t K, int16_t* xq, float* dx, float* sx) {
  bool representable = true;
  for (int64_t g = 0; g < K / GROUP; ++g) {
    __m256 v[4];
    const __m256 id = _mm256_set1_ps(group_scale(x + g * GROUP, 32767.0f, v, dx + g, sx + g, representable));
    for (int half = 0; half < 2; ++half) {
      // packs works within 128-bit lanes: 0-3 8-11 4-7 12-15, put back in order by the permute.
      const __m256i packed = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[2 * half], id)),
                                                _mm256_cvtps_epi32(_mm256_mul_ps(v[2 * half + 1], id)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + g * GROUP + 16 * half), _mm256_permute4x64_epi64(packed, 0xD8));
    }
  }
  return representable;
}

inline void q4_1_one_row(const Q4_1& w, const int16_t* xq, const float* dx, const float* sx, int64_t K, int64_t n, float* y,
                         bool add) {
  const __m256i low = _mm256_set1_epi16(0x0F);
  const __m256i eight = _mm256_set1_epi16(8);
  q4_1_row(w, sx, K / GROUP, n, y, add, [&](const uint8_t* qs, int64_t g, float d, __m256 acc) {
    // 16-bit lane i holds byte i: its low nibble is weight i, its high nibble weight 16 + i.
    const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
    const __m256i first = _mm256_sub_epi16(_mm256_and_si256(bytes, low), eight);
    const __m256i second = _mm256_sub_epi16(_mm256_srli_epi16(bytes, 4), eight);
    const __m256i* xv = reinterpret_cast<const __m256i*>(xq + g * GROUP);
    const __m256i sums = _mm256_add_epi32(_mm256_madd_epi16(first, _mm256_loadu_si256(xv)),
                                          _mm256_madd_epi16(second, _mm256_loadu_si256(xv + 1)));
    return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(dx[g])), _mm256_set1_ps(d), acc);
  });
}

// Q8_0 against one row of x rounded to 16 bits per group of 32 (quantize_row): per group the 32
// bytes sign-extended to 16-bit lanes, two madd with x, then one multiply-add by d * dx, as the
// one-row Q4_1 product: for the output layer of a one-stream decode step, where the float32 loop,
// converting and multiplying every weight as a float, took a large part of the step
// (docs/performance.md#the-block-products).
inline void q8_0_one_row(const Q8_0& w, const int16_t* xq, const float* dx, int64_t K, int64_t n, float* y, bool add) {
  const int64_t groups = K / GROUP;
  const int8_t* qs = w.qs + n * K;
  const float* d = w.d + n * groups;
  Q8_0::prefetch_row(w, n + PREFETCH_ROWS, groups);
  const auto group = [&](int64_t g, __m256 acc) {
    const __m256i first = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + g * GROUP)));
    const __m256i second = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + g * GROUP + 16)));
    const __m256i* xv = reinterpret_cast<const __m256i*>(xq + g * GROUP);
    const __m256i sums = _mm256_add_epi32(_mm256_madd_epi16(first, _mm256_loadu_si256(xv)),
                                          _mm256_madd_epi16(second, _mm256_loadu_si256(xv + 1)));
    return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(dx[g])), _mm256_set1_ps(d[g]), acc);
  };
  __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 2 <= groups; g += 2) {
    even = group(g, even);
    odd = group(g + 1, odd);
  }
  if (g < groups) even = group(g, even);
  const float total = horizontal_sum(_mm256_add_ps(even, odd));
  y[n] = add ? y[n] + total : total;
}

// The AVX2 products' activations (set_activation_bits): 32 (float32 everywhere), 16 (the default: the
// one-row products and those of ROUNDED_ROWS rows and more round x to 16 bits) or 8 (the one-row Q4_1
// product to 8 bits, the one-row Q8_0 product and those of ROUNDED_ROWS rows and more to 16).
int activation_bits = 16;

// The one-row product (Q4_1, or Q8_0 with T int16_t) with x rounded to T (int8_t or int16_t) per
// group, its groups' float sums into sx; false, nothing computed, where x cannot be rounded
// (group_scale): float32 then.
template <typename T, typename W>
bool one_row_rounded(const W& w, const float* x, int64_t K, int64_t N, float* y, bool add, int threads, float* sx) {
  std::vector<T> xq(static_cast<size_t>(K));
  std::vector<float> dx(static_cast<size_t>(K / GROUP));
  if (!quantize_row(x, K, xq.data(), dx.data(), sx)) return false;
  kernels::parallel_for(N, threads, [&](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      if constexpr (std::is_same_v<W, Q8_0>)
        q8_0_one_row(w, xq.data(), dx.data(), K, n, y, add);
      else
        q4_1_one_row(w, xq.data(), dx.data(), sx, K, n, y, add);
    }
  });
  return true;
}

// --- Many rows of x rounded to 16 bits: integer multiply-adds ------------------------------------------
// From ROUNDED_ROWS rows on (WIDE_ROUNDED_ROWS on the AVX-512 code), the products of both formats
// round x to 16 bits per group of 32, as the one-row product does (the same scale, rounding and
// sums), and multiply with integer instructions: a madd takes 16 pairs of 16-bit values into 8 sums
// of two, twice the multiply-adds of one float32 FMA (AVX-512 VNNI's dpwssd also adds them into the
// sums, one instruction for what takes two), exact in integers until one float multiply-add per group
// by d * dx (and, for Q4_1, the minimums' term as in the one-row product).
// A tile is Tile::ROWS rows of x (one vector of int32 lanes: the rows' pair of x values at columns 2p
// and 2p + 1) against Tile::OUTPUTS output rows, each output row's pair broadcast, so that every madd
// yields a vector of rows' sums for one output row, and the integer and float accumulators stay in
// registers.  Rows of x are rounded and laid out in tiles once per product (RoundedRows); each thread
// unpacks its output rows' weights, Tile::OUTPUTS at a time, to 16-bit pairs (a few KB, in L1), which
// then meet every tile of x.  Below ROUNDED_ROWS rows reading the weights bounds either, and the
// float32 loop is as fast (docs/performance.md#the-block-products).
constexpr int64_t ROUNDED_ROWS = 5;
constexpr int PAIRS = GROUP / 2;  // pairs of columns per group

// x [M, K] rounded per group of 32, in tiles of `rows` rows (the last padded with zeros): pairs
// [tiles, K / 32, PAIRS, rows] (a pair of 16-bit values as one int32), the groups' scales dx and
// float sums sx [tiles, K / 32, rows].
struct RoundedRows {
  std::vector<int32_t> pairs;
  std::vector<float> dx, sx;
  // Rounds x; false (then nothing is to be used) where a group cannot be rounded (group_scale).
  bool round(const float* x, int64_t M, int64_t K, int64_t rows, int threads) {
    const int64_t groups = K / GROUP, tiles = (M + rows - 1) / rows;
    pairs.assign(static_cast<size_t>(tiles * groups * PAIRS * rows), 0);
    dx.assign(static_cast<size_t>(tiles * groups * rows), 0.0f);
    sx.assign(static_cast<size_t>(tiles * groups * rows), 0.0f);
    std::atomic<bool> representable{true};
    kernels::parallel_for(M, M * K < SMALL_WORK ? 1 : threads, [&](int64_t first, int64_t last) {
      std::vector<int16_t> row(static_cast<size_t>(K));
      std::vector<float> row_dx(static_cast<size_t>(groups)), row_sx(static_cast<size_t>(groups));
      for (int64_t r = first; r < last; ++r) {
        if (!quantize_row(x + r * K, K, row.data(), row_dx.data(), row_sx.data())) representable = false;
        const int64_t tile = r / rows, lane = r % rows;
        int32_t row_pairs[PAIRS];
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t at = (tile * groups + g) * rows + lane;
          dx[at] = row_dx[g];
          sx[at] = row_sx[g];
          std::memcpy(row_pairs, row.data() + g * GROUP, sizeof row_pairs);
          for (int p = 0; p < PAIRS; ++p) pairs[((tile * groups + g) * PAIRS + p) * rows + lane] = row_pairs[p];
        }
      }
    });
    return representable;
  }
};

// Output rows [n0, n0 + count) of w as 16-bit pairs [count, K / 2] (pair p of a group: its weights 2p
// and 2p + 1, Q4_1's nibbles centred, q - 8), with their scales d and the minimums' factors m + 8 d
// (Q8_0: none), [K / 32, outputs] (outputs: the tile's output rows, the stride).
inline void unpack_outputs(const Q4_1& w, int64_t K, int64_t n0, int count, int outputs, int32_t* pairs, float* d, float* m) {
  const int64_t groups = K / GROUP;
  const __m256i low = _mm256_set1_epi16(0x0F), eight = _mm256_set1_epi16(8);
  for (int i = 0; i < count; ++i)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t block = (n0 + i) * groups + g;
      // 16-bit lane j: byte j, whose low nibble is weight j and whose high nibble is weight 16 + j.
      const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.qs + block * 16)));
      __m256i* out = reinterpret_cast<__m256i*>(pairs + i * (K / 2) + g * PAIRS);
      _mm256_storeu_si256(out, _mm256_sub_epi16(_mm256_and_si256(bytes, low), eight));
      _mm256_storeu_si256(out + 1, _mm256_sub_epi16(_mm256_srli_epi16(bytes, 4), eight));
      d[g * outputs + i] = w.d[block];
      m[g * outputs + i] = w.m[block] + 8.0f * w.d[block];
    }
}

inline void unpack_outputs(const Q8_0& w, int64_t K, int64_t n0, int count, int outputs, int32_t* pairs, float* d, float*) {
  const int64_t groups = K / GROUP;
  for (int i = 0; i < count; ++i)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t block = (n0 + i) * groups + g;
      const int8_t* q = w.qs + block * GROUP;
      __m256i* out = reinterpret_cast<__m256i*>(pairs + i * (K / 2) + g * PAIRS);
      _mm256_storeu_si256(out, _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
      _mm256_storeu_si256(out + 1, _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16))));
      d[g * outputs + i] = w.d[block];
    }
}

// The AVX2 tile: 8 rows (one vector) against 6 output rows, 6 integer and 6 float accumulators (12 of
// the 16 registers; 8 outputs spilled them).  run: the tile's pairs, dx and sx (RoundedRows), the
// unpacked outputs' pairs, d and m; out [OUTPUTS, ROWS].  Per group, each output row's integer sums
// of 8 rows, then into the float accumulators times d * dx, plus (Q4_1, MINIMUMS) the minimums'
// factor times the group's sums of x.
struct Avx2Tile {
  static constexpr int ROWS = 8, OUTPUTS = 6;
  template <bool MINIMUMS>
  static void run(const int32_t* x, const float* dx, const float* sx, const int32_t* w, const float* d, const float* m,
                  int64_t K, float* out) {
    const int64_t groups = K / GROUP, stride = K / 2;
    __m256 total[OUTPUTS];
    #pragma GCC unroll 16
    for (int i = 0; i < OUTPUTS; ++i) total[i] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      __m256i sums[OUTPUTS];
      #pragma GCC unroll 16
      for (int i = 0; i < OUTPUTS; ++i) sums[i] = _mm256_setzero_si256();
      const int32_t* xg = x + g * PAIRS * ROWS;
      const int32_t* wg = w + g * PAIRS;
      #pragma GCC unroll 2
      for (int p = 0; p < PAIRS; ++p) {
        const __m256i rows = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg + p * ROWS));
        #pragma GCC unroll 16
        for (int i = 0; i < OUTPUTS; ++i)
          sums[i] = _mm256_add_epi32(sums[i], _mm256_madd_epi16(rows, _mm256_set1_epi32(wg[i * stride + p])));
      }
      const __m256 scale = _mm256_loadu_ps(dx + g * ROWS);
      #pragma GCC unroll 16
      for (int i = 0; i < OUTPUTS; ++i) {
        total[i] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sums[i]), scale), _mm256_set1_ps(d[g * OUTPUTS + i]), total[i]);
        if constexpr (MINIMUMS)
          total[i] = _mm256_fmadd_ps(_mm256_loadu_ps(sx + g * ROWS), _mm256_set1_ps(m[g * OUTPUTS + i]), total[i]);
      }
    }
    #pragma GCC unroll 16
    for (int i = 0; i < OUTPUTS; ++i) _mm256_storeu_ps(out + i * ROWS, total[i]);
  }
};

// Output rows [n0, n0 + Tile::OUTPUTS) (fewer at N's end) against every tile of x, into y (or added to it).
template <typename Tile, typename W>
void rounded_outputs(const W& w, const RoundedRows& x, int64_t M, int64_t K, int64_t N, int64_t n0, float* y, bool add) {
  constexpr int ROWS = Tile::ROWS, OUTPUTS = Tile::OUTPUTS;
  const int64_t groups = K / GROUP, tiles = (M + ROWS - 1) / ROWS;
  const int count = static_cast<int>(std::min<int64_t>(OUTPUTS, N - n0));
  thread_local std::vector<int32_t> pairs;
  thread_local std::vector<float> d, m;
  pairs.resize(static_cast<size_t>(OUTPUTS * K / 2));
  d.resize(static_cast<size_t>(OUTPUTS * groups));
  m.resize(static_cast<size_t>(OUTPUTS * groups));
  if (count < OUTPUTS) {  // a tile past N's end: its missing output rows all zero
    std::fill(pairs.begin(), pairs.end(), 0);
    std::fill(d.begin(), d.end(), 0.0f);
    std::fill(m.begin(), m.end(), 0.0f);
  }
  unpack_outputs(w, K, n0, count, OUTPUTS, pairs.data(), d.data(), m.data());
  float out[OUTPUTS * ROWS];
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int64_t at = tile * groups * ROWS;
    Tile::template run<std::is_same_v<W, Q4_1>>(x.pairs.data() + at * PAIRS, x.dx.data() + at, x.sx.data() + at, pairs.data(),
                                                d.data(), m.data(), K, out);
    const int64_t rows = std::min<int64_t>(ROWS, M - tile * ROWS);
    for (int i = 0; i < count; ++i)
      for (int64_t r = 0; r < rows; ++r) {
        float& target = y[(tile * ROWS + r) * N + n0 + i];
        target = add ? target + out[i * ROWS + r] : out[i * ROWS + r];
      }
  }
}

// The product with x rounded to 16 bits (see above) in Tile's tiles; false, nothing computed, where x
// cannot be rounded: float32 then.
template <typename Tile, typename W>
bool rounded_gemm(const W& w, const float* x, int64_t M, int64_t K, int64_t N, float* y, bool add, int threads) {
  // The caller's, reused (a prefill's products would each map and fault fresh pages); the workers
  // take it by reference (a thread_local named in the lambda would be each worker's own).
  thread_local RoundedRows callers;
  RoundedRows& rounded = callers;
  if (!rounded.round(x, M, K, Tile::ROWS, threads)) return false;
  kernels::parallel_for((N + Tile::OUTPUTS - 1) / Tile::OUTPUTS, threads, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) rounded_outputs<Tile>(w, rounded, M, K, N, t * Tile::OUTPUTS, y, add);
  });
  return true;
}

template <typename W>
void gemm(const W& w, const float* x, int64_t M, int64_t K, int64_t N, float* y, bool add, int threads) {
  if (M * N * K < SMALL_WORK) threads = 1;
  if constexpr (std::is_same_v<W, Q4_1>) {
    if (M == 1) {  // the groups' sums of x (sx) once for every output row
      std::vector<float> sx(static_cast<size_t>(K / GROUP));
      if (activation_bits == 8 && one_row_rounded<int8_t>(w, x, K, N, y, add, threads, sx.data())) return;
      if (activation_bits == 16 && one_row_rounded<int16_t>(w, x, K, N, y, add, threads, sx.data())) return;
      for (int64_t g = 0; g < K / GROUP; ++g) {
        float total = 0.0f;
        for (int i = 0; i < GROUP; ++i) total += x[g * GROUP + i];
        sx[g] = total;
      }
      kernels::parallel_for(N, threads, [&](int64_t first, int64_t last) {
        for (int64_t n = first; n < last; ++n) q4_1_one_row(w, x, sx.data(), K, n, y, add);
      });
      return;
    }
  }
  if constexpr (std::is_same_v<W, Q8_0>) {
    if (M == 1 && activation_bits <= 16) {  // 16 bits under 8 too: ENGINE_Q8_ACTIVATIONS names the Q4_1 product
      std::vector<float> sx(static_cast<size_t>(K / GROUP));
      if (one_row_rounded<int16_t>(w, x, K, N, y, add, threads, sx.data())) return;
    }
  }
  if (M >= ROUNDED_ROWS && activation_bits <= 16 && rounded_gemm<Avx2Tile>(w, x, M, K, N, y, add, threads)) return;
  kernels::parallel_for(N, threads, [&](int64_t first, int64_t last) {
    row_blocks(M, first, last, [&](int64_t n, int64_t r0, auto rows) { dot_rows<W, decltype(rows)::value>(w, x, K, N, n, r0, y, add); });
  });
}

// Whether the AVX-512 rounded products use VNNI's dpwssd (set_vnni; on where the CPU has it).
bool vnni_available() {
  __builtin_cpu_init();  // the CPU's features, read before any constructor that asks for them
  return __builtin_cpu_supports("avx512vnni");
}
bool use_vnni = vnni_available();

// --- AVX-512 (F, BW, DQ): the same products with 16-float vectors, for CPUs that have them ---------------
// A group's 32 weights are two vectors here (a zero-extension of its 16 bytes, then the low nibbles
// and the bytes shifted right by 4): a third of the AVX2 version's shuffles, half its conversions
// and multiply-adds.  Chosen at run time (set_avx512, from torch's own CPU capability, so that
// ATEN_CPU_CAPABILITY=avx2 makes these kernels act as on an AVX2 CPU too).
// GCC takes the target from its pragma; clang, which ignores that pragma, from its attribute pragma.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl")
#endif
namespace wide {

// From this many rows on the AVX-512 products round x to 16 bits too (see rounded_gemm), in tiles of
// 16 rows against 12 output rows (24 of the 32 registers); at 8 rows, half a tile, the rounding and
// unpacking cost more than they saved (docs/performance.md#the-block-products).
constexpr int64_t WIDE_ROUNDED_ROWS = 9;
constexpr int TILE_OUTPUTS = 12;
// Products of 7 and 8 rows round x too, in NarrowTile's tiles of 8 rows, faster than the float32
// loop there; at 6 rows the two tie, and below a tile is too empty
// (docs/performance.md#the-block-products).
constexpr int64_t NARROW_ROUNDED_ROWS = 7;

struct Q4_1 {
  static inline void group(const ::Q4_1& w, int64_t block, __m512 out[2]) {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.qs + block * 16)));
    const __m512 d = _mm512_set1_ps(w.d[block]);
    const __m512 m = _mm512_set1_ps(w.m[block]);
    out[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(0x0F))), d, m);
    out[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4)), d, m);
  }
};

struct Q8_0 {
  static inline void group(const ::Q8_0& w, int64_t block, __m512 out[2]) {
    const int8_t* q = w.qs + block * GROUP;
    const __m512 d = _mm512_set1_ps(w.d[block]);
    out[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)))), d);
    out[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)))), d);
  }
};

// As dot_rows above: one output row n against rows [r0, r0 + ROWS) of x.
template <typename W, typename Blocks, int ROWS>
inline void dot_rows(const Blocks& w, const float* x, int64_t K, int64_t N, int64_t n, int64_t r0, float* y, bool add) {
  constexpr int CHAINS = ROWS >= 2 ? 2 : 4;
  __m512 acc[ROWS][CHAINS];
  #pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r)
    #pragma GCC unroll 16
    for (int c = 0; c < CHAINS; ++c) acc[r][c] = _mm512_setzero_ps();
  const int64_t groups = K / GROUP;
  Blocks::prefetch_row(w, n + PREFETCH_ROWS, groups);
  // STEP groups per iteration, each into its own pair of accumulators (fixed indices: registers).
  constexpr int STEP = CHAINS / 2;
  int64_t g = 0;
  for (; g + STEP <= groups; g += STEP) {
    #pragma GCC unroll 4
    for (int s = 0; s < STEP; ++s) {
      __m512 weights[2];
      W::group(w, n * groups + g + s, weights);
      #pragma GCC unroll 16
      for (int r = 0; r < ROWS; ++r) {
        const float* xr = x + (r0 + r) * K + (g + s) * GROUP;
        acc[r][2 * s] = _mm512_fmadd_ps(weights[0], _mm512_loadu_ps(xr), acc[r][2 * s]);
        acc[r][2 * s + 1] = _mm512_fmadd_ps(weights[1], _mm512_loadu_ps(xr + 16), acc[r][2 * s + 1]);
      }
    }
  }
  for (; g < groups; ++g) {
    __m512 weights[2];
    W::group(w, n * groups + g, weights);
    #pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r) {
      const float* xr = x + (r0 + r) * K + g * GROUP;
      acc[r][0] = _mm512_fmadd_ps(weights[0], _mm512_loadu_ps(xr), acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(weights[1], _mm512_loadu_ps(xr + 16), acc[r][1]);
    }
  }
  #pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) {
    __m512 total = acc[r][0];
    #pragma GCC unroll 16
    for (int c = 1; c < CHAINS; ++c) total = _mm512_add_ps(total, acc[r][c]);
    float& target = y[(r0 + r) * N + n];
    target = add ? target + _mm512_reduce_add_ps(total) : _mm512_reduce_add_ps(total);
  }
}

// This region's vectors for the rounded tiles: 512-bit ones (16 rows of x), and 256-bit ones
// EVEX-encoded with the region's 32 registers (8 rows).  VNNI's dpwssd (multiply, sum pairs and add,
// one instruction) is written as assembly: this code's target leaves VNNI out, so that the compiler
// cannot emit it for CPUs without it.
struct Lanes16 {
  using I = __m512i;
  using F = __m512;
  static constexpr int LANES = 16;
  static I load(const int32_t* p) { return _mm512_loadu_si512(p); }
  static I broadcast(int32_t v) { return _mm512_set1_epi32(v); }
  static I zero() { return _mm512_setzero_si512(); }
  static I madd_add(I sums, I a, I b) { return _mm512_add_epi32(sums, _mm512_madd_epi16(a, b)); }
  static F loadf(const float* p) { return _mm512_loadu_ps(p); }
  static F broadcastf(float v) { return _mm512_set1_ps(v); }
  static F zerof() { return _mm512_setzero_ps(); }
  static F scaled(I sums, F scale) { return _mm512_mul_ps(_mm512_cvtepi32_ps(sums), scale); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static void storef(float* p, F v) { _mm512_storeu_ps(p, v); }
};

struct Lanes8 {
  using I = __m256i;
  using F = __m256;
  static constexpr int LANES = 8;
  static I load(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static I broadcast(int32_t v) { return _mm256_set1_epi32(v); }
  static I zero() { return _mm256_setzero_si256(); }
  static I madd_add(I sums, I a, I b) { return _mm256_add_epi32(sums, _mm256_madd_epi16(a, b)); }
  static F loadf(const float* p) { return _mm256_loadu_ps(p); }
  static F broadcastf(float v) { return _mm256_set1_ps(v); }
  static F zerof() { return _mm256_setzero_ps(); }
  static F scaled(I sums, F scale) { return _mm256_mul_ps(_mm256_cvtepi32_ps(sums), scale); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static void storef(float* p, F v) { _mm256_storeu_ps(p, v); }
};

// The AVX-512 tiles (see Avx2Tile): V::LANES rows (one vector) against OUTPUTS output rows, with
// dpwssd where the CPU has it (VNNI), else madd and add.  Avx2Tile's loop with this region's vectors:
// one template cannot serve that one too, since a template is compiled under the target of the place
// it is defined (this region's AVX-512 would put EVEX encodings into the AVX2 tile; the file's AVX2
// cannot compile these intrinsics).
template <typename V, int OUTPUTS_, bool VNNI>
struct LaneTile {
  static constexpr int ROWS = V::LANES, OUTPUTS = OUTPUTS_;
  template <bool MINIMUMS>
  static void run(const int32_t* x, const float* dx, const float* sx, const int32_t* w, const float* d, const float* m,
                  int64_t K, float* out) {
    const int64_t groups = K / GROUP, stride = K / 2;
    typename V::F total[OUTPUTS];
    #pragma GCC unroll 16
    for (int i = 0; i < OUTPUTS; ++i) total[i] = V::zerof();
    for (int64_t g = 0; g < groups; ++g) {
      typename V::I sums[OUTPUTS];
      #pragma GCC unroll 16
      for (int i = 0; i < OUTPUTS; ++i) sums[i] = V::zero();
      const int32_t* xg = x + g * PAIRS * ROWS;
      const int32_t* wg = w + g * PAIRS;
      #pragma GCC unroll 2
      for (int p = 0; p < PAIRS; ++p) {
        const typename V::I rows = V::load(xg + p * ROWS);
        #pragma GCC unroll 16
        for (int i = 0; i < OUTPUTS; ++i) {
          const typename V::I pair = V::broadcast(wg[i * stride + p]);
          if constexpr (VNNI)
            asm("vpdpwssd %2, %1, %0" : "+v"(sums[i]) : "v"(rows), "v"(pair));
          else
            sums[i] = V::madd_add(sums[i], rows, pair);
        }
      }
      const typename V::F scale = V::loadf(dx + g * ROWS);
      #pragma GCC unroll 16
      for (int i = 0; i < OUTPUTS; ++i) {
        total[i] = V::fmadd(V::scaled(sums[i], scale), V::broadcastf(d[g * OUTPUTS + i]), total[i]);
        if constexpr (MINIMUMS) total[i] = V::fmadd(V::loadf(sx + g * ROWS), V::broadcastf(m[g * OUTPUTS + i]), total[i]);
      }
    }
    #pragma GCC unroll 16
    for (int i = 0; i < OUTPUTS; ++i) V::storef(out + i * ROWS, total[i]);
  }
};

// Products of WIDE_ROUNDED_ROWS rows and more: 16-row tiles.
template <int OUTPUTS, bool VNNI>
using Tile = LaneTile<Lanes16, OUTPUTS, VNNI>;
// Products of NARROW_ROUNDED_ROWS to WIDE_ROUNDED_ROWS - 1 rows, for which a 16-row tile would be half
// empty: 8-row tiles.
template <int OUTPUTS, bool VNNI>
using NarrowTile = LaneTile<Lanes8, OUTPUTS, VNNI>;

template <typename W, typename Blocks>
void gemm(const Blocks& w, const float* x, int64_t M, int64_t K, int64_t N, float* y, bool add, int threads) {
  if (M * N * K < SMALL_WORK) threads = 1;
  if (M >= WIDE_ROUNDED_ROWS && activation_bits <= 16 &&
      (use_vnni ? rounded_gemm<Tile<TILE_OUTPUTS, true>>(w, x, M, K, N, y, add, threads)
                : rounded_gemm<Tile<TILE_OUTPUTS, false>>(w, x, M, K, N, y, add, threads)))
    return;
  if (M >= NARROW_ROUNDED_ROWS && M < WIDE_ROUNDED_ROWS && activation_bits <= 16 &&
      (use_vnni ? rounded_gemm<NarrowTile<TILE_OUTPUTS, true>>(w, x, M, K, N, y, add, threads)
                : rounded_gemm<NarrowTile<TILE_OUTPUTS, false>>(w, x, M, K, N, y, add, threads)))
    return;
  kernels::parallel_for(N, threads, [&](int64_t first, int64_t last) {
    row_blocks(M, first, last, [&](int64_t n, int64_t r0, auto rows) {
      dot_rows<W, Blocks, decltype(rows)::value>(w, x, K, N, n, r0, y, add);
    });
  });
}

// Q4_1 blocks [N, K] as a bfloat16 weight [N, K] (each d * q + m rounded to nearest even, as torch
// casts float32), into out: a long prefill's product then runs in oneDNN's bfloat16 code without a
// stored bfloat16 copy of the weights (LlamaModelRunner's q4_1 layers, weights.Q4_1Linear).
void q4_1_to_bfloat16(const ::Q4_1& w, int64_t N, int64_t K, uint16_t* out, int threads) {
  const int64_t groups = K / GROUP;
  kernels::parallel_for(N, threads, [&](int64_t first, int64_t last) {
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7FFF), nan = _mm512_set1_epi32(0x7FC0);
    for (int64_t n = first; n < last; ++n)
      for (int64_t g = 0; g < groups; ++g) {
        __m512 values[2];
        Q4_1::group(w, n * groups + g, values);
        for (int i = 0; i < 2; ++i) {
          const __m512i bits = _mm512_castps_si512(values[i]);
          const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
          __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(half, odd)), 16);
          // A NaN stays a NaN (the rounding could carry it into the sign bit): torch's 0x7FC0.
          rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(values[i], values[i], _CMP_UNORD_Q), nan);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + n * K + g * GROUP + 16 * i), _mm512_cvtepi32_epi16(rounded));
        }
      }
  });
}

}  // namespace wide
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

bool use_avx512 = false;

}  // namespace

namespace kernels {

// For ggml_blocks.cpp's integer products: x rounded to 16 bits per group of 32 exactly as the Q4_1
// and Q8_0 products round it (quantize_row), and the process-wide activation_bits.
bool round_row(const float* x, int64_t K, int16_t* xq, float* dx, float* sx) { return quantize_row(x, K, xq, dx, sx); }
bool round_row(const float* x, int64_t K, int8_t* xq, float* dx, float* sx) { return quantize_row(x, K, xq, dx, sx); }
int activation_bits_setting() { return activation_bits; }

}  // namespace kernels

extern "C" {

// x: [M, K] float32 contiguous; K a multiple of 32; y: [M, N] float32 contiguous, overwritten
// (add == 0) or added to (add != 0: a residual stream).
KERNEL_EXPORT void q4_1_gemm(const float* x, int64_t M, int64_t K, const uint8_t* qs, const float* d, const float* m, int64_t N,
               float* y, int add, int threads) {
  if (use_avx512)
    wide::gemm<wide::Q4_1>(Q4_1{qs, d, m}, x, M, K, N, y, add != 0, threads);
  else
    gemm(Q4_1{qs, d, m}, x, M, K, N, y, add != 0, threads);
}

// Only on a CPU with AVX-512 F and BW (cpu_kernels.avx512_products).
KERNEL_EXPORT void q4_1_to_bfloat16(const uint8_t* qs, const float* d, const float* m, int64_t N, int64_t K, uint16_t* out,
                                    int threads) {
  wide::q4_1_to_bfloat16(Q4_1{qs, d, m}, N, K, out, threads);
}

KERNEL_EXPORT void q8_0_gemm(const float* x, int64_t M, int64_t K, const int8_t* qs, const float* d, int64_t N, float* y, int add,
               int threads) {
  if (use_avx512)
    wide::gemm<wide::Q8_0>(Q8_0{qs, d}, x, M, K, N, y, add != 0, threads);
  else
    gemm(Q8_0{qs, d}, x, M, K, N, y, add != 0, threads);
}


// Whether the products use the AVX-512 versions (on != 0) or the AVX2 ones; off at load.
KERNEL_EXPORT void set_avx512(int on) { use_avx512 = on != 0; }
// Whether the AVX-512 rounded products use VNNI (on != 0: only where the CPU has it); returns the choice.
KERNEL_EXPORT int set_vnni(int on) {
  use_vnni = on != 0 && vnni_available();
  return use_vnni;
}
// What the AVX2 products round x to: 16 (the value at load) or 8 bits per group of 32, or nothing (32:
// float32); see activation_bits.
KERNEL_EXPORT void set_activation_bits(int bits) { activation_bits = bits; }

}
