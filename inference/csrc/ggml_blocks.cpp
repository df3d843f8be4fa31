// Products of float32 activations with ggml's block-quantized weights exactly as a GGUF file stores
// them (ggml-common.h's block_q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K, and F32/F16/BF16
// rows), for AVX2 + FMA and AVX-512: y[M, N] = x[M, K] @ W[N, K]^T, W's N rows each K / BLOCK
// consecutive blocks, rows contiguous (a view of the memory-mapped file), or TYPE_Q4_K_X8 (not ggml's:
// Q4_K interleaved by 8 rows at load, ggml_interleave_q4_k; ggml_interleaved.h has its products).
//
// Lossless: each block is decoded to float32 as gguf-py dequantizes it (same operations, same order)
// and multiplied in float32 (no rounding of x), so the result is x @ dequantize(W)^T up to the order
// of float32 sums.  A weight row's group of 32 is decoded once to registers and multiplied into up to
// ROW_BLOCK rows of x; a one-row product reads each weight byte once from memory, prefetched ahead.
//
// The kernels' body is ggml_blocks.h, written once over a vector type V and included here twice:
// with AVX2's 8-float vectors under the file's flags, and with AVX-512's 16-float ones under a target
// pragma, chosen at run time (ggml_set_avx512, set with block_gemm.cpp's set_avx512 by
// cpu_kernels.CPUKernels.set_avx512).  Threads: pool.h's workers over output rows.

#include <immintrin.h>
#include <stdint.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "pool.h"
#include "simd.h"

namespace {

// ggml's type ids (ggml.h's enum ggml_type, gguf-py's GGMLQuantizationType).
constexpr int TYPE_F32 = 0, TYPE_F16 = 1, TYPE_Q4_0 = 2, TYPE_Q4_1 = 3, TYPE_Q5_0 = 6, TYPE_Q5_1 = 7, TYPE_Q8_0 = 8,
              TYPE_Q4_K = 12, TYPE_Q5_K = 13, TYPE_Q6_K = 14, TYPE_BF16 = 30;
// Not ggml's: Q4_K interleaved by 8 rows (ggml_interleaved.h), made by ggml_interleave_q4_k.
constexpr int TYPE_Q4_K_X8 = 112;

constexpr int GROUP = 32;      // weights decoded at a time (a block, or a K-quant's sub-block)
constexpr int ROW_BLOCK = 8;   // rows of x sharing one decoded group
constexpr int64_t PREFETCH_BYTES = 1024;      // how far ahead of the block it decodes a loop asks for the weight
constexpr int64_t TILE_BYTES = 128 * 1024;    // weight rows multiplied by every row block of x before the next ones
constexpr int64_t SMALL_WORK = int64_t(1) << 16;  // multiply-adds under which the caller works alone

inline float half_to_float(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
}

// --- AVX2 + FMA: 8 floats a vector, 16 registers ------------------------------------------------
namespace avx2 {

struct V {
  using F = __m256;
  using I = __m256i;
  static constexpr int LANES = 8, REGISTERS = 16;
  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static float sum(F v) { return kernels::horizontal_sum(v); }
  static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  // LANES bytes (unsigned, signed) or 16-bit values at p, one per 32-bit lane.
  static I u8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
  static I i8(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
  static I u16(const uint8_t* p) { return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static F f16(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static F bf16(const uint8_t* p) { return _mm256_castsi256_ps(_mm256_slli_epi32(u16(p), 16)); }
  static I and_(I v, int mask) { return _mm256_and_si256(v, _mm256_set1_epi32(mask)); }
  static I or_(I a, I b) { return _mm256_or_si256(a, b); }
  static I srl(I v, int bits) { return _mm256_srli_epi32(v, bits); }
  static I sll(I v, int bits) { return _mm256_slli_epi32(v, bits); }
  static I subi(I v, int value) { return _mm256_sub_epi32(v, _mm256_set1_epi32(value)); }
  // Lane i: bit first + i of word.
  static I bits(uint32_t word, int first) {
    const I shifts = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(first));
    return and_(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)), shifts), 1);
  }
  // 16-bit lanes (LANES16 a vector), for the integer products: LANES16 bytes at p widened, and ops.
  static constexpr int LANES16 = 16;
  static I u8w(const uint8_t* p) { return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static I i8w(const uint8_t* p) { return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static I loadw(const int16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static I andw(I v, int mask) { return _mm256_and_si256(v, _mm256_set1_epi16(static_cast<int16_t>(mask))); }
  static I srlw(I v, int bits) { return _mm256_srli_epi16(v, bits); }
  static I sllw(I v, int bits) { return _mm256_slli_epi16(v, bits); }
  static I subw(I v, int value) { return _mm256_sub_epi16(v, _mm256_set1_epi16(static_cast<int16_t>(value))); }
  // Lane i: `value` where bit first + i of word is set, else 0.
  static I bitsw(uint32_t word, int first, int value) {
    const I select = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, -32768);
    const I spread = _mm256_set1_epi16(static_cast<int16_t>(word >> first));
    return andw(_mm256_cmpeq_epi16(_mm256_and_si256(spread, select), select), value);
  }
  // Pairs of 16-bit lanes multiplied and summed into 32-bit lanes; 32-bit sums.
  static I madd(I a, I b) { return _mm256_madd_epi16(a, b); }
  static I addi(I a, I b) { return _mm256_add_epi32(a, b); }
  // The 16 bytes at p as 32 16-bit values: their low nibbles, then their high ones (out[2]).
  static void nibbles(const uint8_t* p, I* out) {
    const I bytes = u8w(p);
    out[0] = andw(bytes, 0x0F);
    out[1] = srlw(bytes, 4);
  }
  // The first LANES / 2 lanes a, the rest b (AVX-512 only: here each half of 16 weights is a vector).
  static F halves(float a, float) { return set1(a); }
};

#include "ggml_blocks.h"

// acc + the sums of a * b's pairs of 16-bit lanes, in 8 int32 lanes.
struct Dot16 {
  static constexpr int ACCUMULATORS = 1;  // the multiply is off the chain: an add a step
  static __m256i add(__m256i acc, __m256i a, __m256i b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
};
// x's 4 int8 values times 4 small unsigned weights, summed in 16 bits (a pair's 8 chunks: at most
// 8 x 2 x 15 x 127 < 2^15), widened to 32 by the scale's multiply-add.
struct Dot8 {
  using Acc = __m256i;
  static Acc zero() { return _mm256_setzero_si256(); }
  static Acc add(Acc acc, __m256i weights, __m256i x) { return _mm256_add_epi16(acc, _mm256_maddubs_epi16(weights, x)); }
  static __m256i scaled(Acc acc, __m256i scales) {
    return _mm256_madd_epi16(acc, _mm256_or_si256(scales, _mm256_slli_epi32(scales, 16)));
  }
};
constexpr int X8_ROWS = 2;  // rows of x a tile of interleaved weights: 16 registers
constexpr int INT8_COLS = 1;  // weight rows a tile: 16 registers hold 4 rows' accumulators for one
constexpr int INT8_ROWS = 4;  // rows of x a tile

#include "ggml_int8.h"
#include "ggml_panels_avx2.h"
#include "ggml_panel_gemm.h"

}  // namespace avx2

// --- AVX-512 (F, BW, DQ, VL): 16 floats a vector, 32 registers -------------------------------------
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl")
#endif
namespace avx512 {

struct V {
  using F = __m512;
  using I = __m512i;
  static constexpr int LANES = 16, REGISTERS = 32;
  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static float sum(F v) { return _mm512_reduce_add_ps(v); }
  static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static I u8(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static I i8(const uint8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static I u16(const uint8_t* p) { return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static F f16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static F bf16(const uint8_t* p) { return _mm512_castsi512_ps(_mm512_slli_epi32(u16(p), 16)); }
  static I and_(I v, int mask) { return _mm512_and_si512(v, _mm512_set1_epi32(mask)); }
  static I or_(I a, I b) { return _mm512_or_si512(a, b); }
  static I srl(I v, int bits) { return _mm512_srli_epi32(v, bits); }
  static I sll(I v, int bits) { return _mm512_slli_epi32(v, bits); }
  static I subi(I v, int value) { return _mm512_sub_epi32(v, _mm512_set1_epi32(value)); }
  static I bits(uint32_t word, int first) {
    const I shifts = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                      _mm512_set1_epi32(first));
    return and_(_mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(word)), shifts), 1);
  }
  static constexpr int LANES16 = 32;
  static I u8w(const uint8_t* p) { return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static I i8w(const uint8_t* p) { return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static I loadw(const int16_t* p) { return _mm512_loadu_si512(p); }
  static I andw(I v, int mask) { return _mm512_and_si512(v, _mm512_set1_epi16(static_cast<int16_t>(mask))); }
  static I srlw(I v, int bits) { return _mm512_srli_epi16(v, bits); }
  static I sllw(I v, int bits) { return _mm512_slli_epi16(v, bits); }
  static I subw(I v, int value) { return _mm512_sub_epi16(v, _mm512_set1_epi16(static_cast<int16_t>(value))); }
  static I bitsw(uint32_t word, int first, int value) {
    return _mm512_maskz_set1_epi16(static_cast<__mmask32>(word >> first), static_cast<int16_t>(value));
  }
  static I madd(I a, I b) { return _mm512_madd_epi16(a, b); }
  static I addi(I a, I b) { return _mm512_add_epi32(a, b); }
  static void nibbles(const uint8_t* p, I* out) {
    const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i low = _mm256_and_si256(bytes, _mm256_set1_epi16(0x0F)), high = _mm256_srli_epi16(bytes, 4);
    out[0] = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
  }
  static F halves(float a, float b) { return _mm512_mask_blend_ps(0xFF00, set1(a), set1(b)); }
};

#include "ggml_blocks.h"

}  // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

// The 8-bit products with AVX-512 VNNI's dpwssd (one instruction for AVX2's madd and add), on 256-bit
// vectors and 32 registers; only where the CPU has VNNI (int8_vnni).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")
#endif
namespace avx512 {

struct Dot16 {
  static constexpr int ACCUMULATORS = 8;  // dpwssd's latency on the chain: 8 chains keep it busy
  static __m256i add(__m256i acc, __m256i a, __m256i b) { return _mm256_dpwssd_epi32(acc, a, b); }
};
struct Dot8 {
  using Acc = __m256i;
  static Acc zero() { return _mm256_setzero_si256(); }
  static Acc add(Acc acc, __m256i weights, __m256i x) { return _mm256_dpbusd_epi32(acc, weights, x); }
  static __m256i scaled(Acc acc, __m256i scales) { return _mm256_mullo_epi32(acc, scales); }
};
constexpr int X8_ROWS = 4;  // 32 registers
constexpr int INT8_COLS = 2;
constexpr int INT8_ROWS = 8;  // 32 registers: 8 rows' integer and float accumulators for one weight row

#include "ggml_int8.h"
#include "ggml_panels.h"
#include "ggml_panel_gemm.h"

}  // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

bool use_avx512 = false;
bool k_quant_int8 = false;  // ggml_set_k_quant_int8
const bool int8_vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");

// Whether the K-quants multiply x rounded to 8 bits: set_activation_bits(8), or 16 with
// ggml_set_k_quant_int8.
bool k_quants_in_int8() {
  const int bits = kernels::activation_bits_setting();
  return bits == 8 || (bits == 16 && k_quant_int8);
}

// The 8-bit products' code: AVX-512 VNNI's where chosen and present, else AVX2's.
bool vnni_products() { return use_avx512 && int8_vnni; }

bool takes_panels(int type, int64_t M) {
  return vnni_products() ? avx512::has_panel_form(type, M) : avx2::has_panel_form(type, M);
}

// F32, F16 and BF16 rows of any width, one value at a time (dequantize_rows' widths that are not a
// multiple of 32).
float element(int type, const uint8_t* row, int64_t k) {
  if (type == TYPE_F32) {
    float value;
    std::memcpy(&value, row + 4 * k, 4);
    return value;
  }
  if (type == TYPE_F16) return half_to_float(row + 2 * k);
  uint32_t bits = 0;
  std::memcpy(&bits, row + 2 * k, 2);
  bits <<= 16;
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

// The pieces of row r's super-block in TYPE_Q4_K_X8 (ggml_interleaved.h's layout): copy(offset in the
// interleaved block, offset in the stored one, bytes) for each; the layout's one definition, read both ways.
template <typename Copy>
void x8_pieces(int64_t r, Copy copy) {
  copy(2 * r, 0, 2);        // d
  copy(16 + 2 * r, 2, 2);   // dmin
  for (int word = 0; word < 3; ++word) copy(32 + 32 * word + 4 * r, 4 + 4 * word, 4);  // scales
  for (int chunk = 0; chunk < 32; ++chunk) copy(avx2::X8_QS + 32 * chunk + 4 * r, 16 + 4 * chunk, 4);  // qs
}

// Rows [first, first + count) of a TYPE_Q4_K_X8 weight back in the file's Q4_K layout, for the code
// that reads blocks as stored (an embedding lookup, a bfloat16 copy, the float32 product).
std::vector<uint8_t> x8_stored_rows(const uint8_t* w, int64_t K, const int64_t* rows, int64_t count) {
  const int64_t blocks = K / 256, row_bytes = blocks * 144;
  std::vector<uint8_t> stored(static_cast<size_t>(count * row_bytes));
  for (int64_t i = 0; i < count; ++i)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const uint8_t* p = w + (rows[i] / 8 * blocks + blk) * avx2::X8_BLOCK_BYTES;
      uint8_t* b = stored.data() + i * row_bytes + blk * 144;
      x8_pieces(rows[i] % 8, [&](int64_t at, int64_t from, int bytes) { std::memcpy(b + from, p + at, bytes); });
    }
  return stored;
}

std::vector<int64_t> row_numbers(int64_t count) {
  std::vector<int64_t> numbers(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) numbers[i] = i;
  return numbers;
}

}  // namespace

extern "C" {

// out = Q4_K weight w [N rows, K values] interleaved by 8 rows (TYPE_Q4_K_X8, ggml_interleaved.h's
// layout: the same bytes, rearranged).  0, nothing written, unless N is a multiple of 8 and K of 256.
KERNEL_EXPORT int ggml_interleave_q4_k(const uint8_t* w, int64_t N, int64_t K, uint8_t* out, int threads) {
  if (N % 8 != 0 || K % 256 != 0 || N <= 0) return 0;
  const int64_t blocks = K / 256, row_bytes = blocks * 144;
  kernels::parallel_for(N / 8, threads, [&](int64_t first, int64_t last) {
    for (int64_t g = first; g < last; ++g)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        uint8_t* p = out + (g * blocks + blk) * avx2::X8_BLOCK_BYTES;
        for (int r = 0; r < 8; ++r) {
          const uint8_t* b = w + (8 * g + r) * row_bytes + blk * 144;
          x8_pieces(r, [&](int64_t at, int64_t from, int bytes) { std::memcpy(p + at, b + from, bytes); });
        }
      }
  });
  return 1;
}

// y[M, N] = (add: y +) x[M, K] @ W^T, W given as ggml blocks of `type` (see the file's comment); K a
// multiple of the type's block (32 for F32/F16/BF16 too; cpu_kernels takes other widths to torch).
// An unknown type leaves y untouched.
KERNEL_EXPORT void ggml_gemm(int type, const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, float* y, int add,
                             int threads) {
  if (type == TYPE_Q4_K_X8) {  // x rounded to 8 bits whatever the switch: no other product reads this layout
    const bool done = vnni_products() ? avx512::int8_gemm(type, x, M, K, w, N, y, add != 0, threads)
                                      : avx2::int8_gemm(type, x, M, K, w, N, y, add != 0, threads);
    if (!done) {  // x cannot be rounded: the stored blocks' float32 product
      const std::vector<uint8_t> stored = x8_stored_rows(w, K, row_numbers(N).data(), N);
      use_avx512 ? avx512::gemm_type(TYPE_Q4_K, x, M, K, stored.data(), N, y, add != 0, threads)
                 : avx2::gemm_type(TYPE_Q4_K, x, M, K, stored.data(), N, y, add != 0, threads);
    }
    return;
  }
  if (k_quants_in_int8() && avx2::has_int8_form(type)) {
    const bool panels = takes_panels(type, M);
    bool done;
    if (vnni_products())
      done = panels ? avx512::panel_gemm(type, x, M, K, w, N, y, add != 0, threads)
                    : avx512::int8_gemm(type, x, M, K, w, N, y, add != 0, threads);
    else
      done = panels ? avx2::panel_gemm(type, x, M, K, w, N, y, add != 0, threads)
                    : avx2::int8_gemm(type, x, M, K, w, N, y, add != 0, threads);
    if (done) return;
  }
  if (use_avx512)
    avx512::gemm_type(type, x, M, K, w, N, y, add != 0, threads);
  else
    avx2::gemm_type(type, x, M, K, w, N, y, add != 0, threads);
}

// y[M, width] (+)= x[M, K] @ [W_0; W_1; ...]^T, the parts' outputs side by side (width: the sum of
// Ns), equal to ggml_gemm's part by part, in one parallel region (int8_gemm_parts) where every part
// takes the 8-bit tiles at M rows (a K-quant, x rounded to 8 bits, fewer rows than the panels
// take); else 0, nothing computed.
KERNEL_EXPORT int ggml_gemm_parts(int parts, const int* types, const uint8_t* const* ws, const int64_t* Ns,
                                  const float* x, int64_t M, int64_t K, float* y, int64_t width, int add, int threads) {
  if (!k_quants_in_int8()) return 0;
  for (int p = 0; p < parts; ++p)
    if (!avx2::has_int8_form(types[p]) || takes_panels(types[p], M)) return 0;
  if (vnni_products()) return avx512::int8_gemm_parts(parts, types, ws, Ns, x, M, K, y, width, add != 0, threads);
  return avx2::int8_gemm_parts(parts, types, ws, Ns, x, M, K, y, width, add != 0, threads);
}

// out[n, K] = the float32 values of weight rows rows[0 .. n) of N (an embedding lookup); one thread.
// 0, nothing written, where a row is out of range (checked here: a tensor's min and max cost a decode
// step more, the weights having just flushed the caches); else 1.
KERNEL_EXPORT int ggml_dequantize_rows(int type, const uint8_t* w, int64_t N, int64_t K, const int64_t* rows, int64_t n,
                                      float* out) {
  for (int64_t i = 0; i < n; ++i)
    if (rows[i] < 0 || rows[i] >= N) return 0;
  if (type == TYPE_Q4_K_X8) {
    const std::vector<uint8_t> stored = x8_stored_rows(w, K, rows, n);
    return ggml_dequantize_rows(TYPE_Q4_K, stored.data(), n, K, row_numbers(n).data(), n, out);
  }
  if ((type == TYPE_F32 || type == TYPE_F16 || type == TYPE_BF16) && K % GROUP != 0) {
    const int64_t row_bytes = K * (type == TYPE_F32 ? 4 : 2);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < K; ++k) out[i * K + k] = element(type, w + rows[i] * row_bytes, k);
    return 1;
  }
  if (use_avx512)
    avx512::dequantize_type(type, w, K, rows, n, out);
  else
    avx2::dequantize_type(type, w, K, rows, n, out);
  return 1;
}

// out[N, K] = the weight's values as bfloat16 bits, rounded to nearest even (a long prefill chunk's
// product in bfloat16, from a copy made for that call); K a multiple of the type's block; a float type
// or an unknown one leaves out untouched and returns 0.
KERNEL_EXPORT int ggml_to_bfloat16(int type, const uint8_t* w, int64_t N, int64_t K, uint16_t* out, int threads) {
  if (type == TYPE_Q4_K_X8) {
    const std::vector<uint8_t> stored = x8_stored_rows(w, K, row_numbers(N).data(), N);
    return ggml_to_bfloat16(TYPE_Q4_K, stored.data(), N, K, out, threads);
  }
  return (use_avx512 ? avx512::to_bfloat16_type(type, w, N, K, out, threads)
                     : avx2::to_bfloat16_type(type, w, N, K, out, threads))
             ? 1
             : 0;
}

// Whether the K-quants' products round x to 8 bits (ggml_int8.h) where the activation
// bits are 16, as they do where they are 8; off at load.
KERNEL_EXPORT void ggml_set_k_quant_int8(int on) { k_quant_int8 = on != 0; }

// Whether these products use their AVX-512 versions (on != 0) or the AVX2 ones; off at load.
KERNEL_EXPORT void ggml_set_avx512(int on) { use_avx512 = on != 0; }

}
