// Small AVX2 helpers shared by the kernels.
#pragma once

#include <immintrin.h>
#include <stdint.h>

namespace kernels {

// The sum of a vector's 8 floats.
inline float horizontal_sum(__m256 v) {
  __m128 low = _mm256_castps256_ps128(v);
  __m128 high = _mm256_extractf128_ps(v, 1);
  low = _mm_add_ps(low, high);
  low = _mm_add_ps(low, _mm_movehl_ps(low, low));
  low = _mm_add_ss(low, _mm_movehdup_ps(low));
  return _mm_cvtss_f32(low);
}

// Defined in block_gemm.cpp: x [K] (K a multiple of 32) rounded to 16 bits per group of 32 (scale
// dx = max |x| / 32767, round to nearest even; sx the groups' float sums); false where a group cannot
// be rounded (a subnormal scale, an infinity or a NaN).  And what set_activation_bits last set.
bool round_row(const float* x, int64_t K, int16_t* xq, float* dx, float* sx);
// The same to 8 bits (dx = max |x| / 127).
bool round_row(const float* x, int64_t K, int8_t* xq, float* dx, float* sx);
int activation_bits_setting();

}  // namespace kernels
