// Small AVX2 helpers shared by the kernels.
#pragma once

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

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

// bfloat16 bits of 8 floats, one in the low half of each 32-bit lane: rounded to nearest even as
// torch's cast rounds, a NaN torch's quiet 0x7FC0.
inline __m256i bfloat16_bits(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i bits = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd)), 16);
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  return _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(nan));
}

// One float's bfloat16 bits, as bfloat16_bits rounds them.
inline uint16_t bfloat16_bits(float f) {
  if (f != f) return 0x7FC0;
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

// 8 bfloat16 values (bits) widened to float32, exactly.
inline __m256 load8_bfloat16(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// One bfloat16 value (bits) widened to float32, exactly.
inline float bfloat16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// Defined in block_gemm.cpp: x [K] (K a multiple of 32) rounded to 16 bits per group of 32 (scale
// dx = max |x| / 32767, round to nearest even; sx the groups' float sums); false where a group cannot
// be rounded (a subnormal scale, an infinity or a NaN).  And what set_activation_bits last set.
bool round_row(const float* x, int64_t K, int16_t* xq, float* dx, float* sx);
// The same to 8 bits (dx = max |x| / 127).
bool round_row(const float* x, int64_t K, int8_t* xq, float* dx, float* sx);
int activation_bits_setting();

}  // namespace kernels
