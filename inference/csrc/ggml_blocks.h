// The body of ggml_blocks.cpp's kernels, written once over a vector type and included by that file
// once per instruction set, inside a namespace that defines `V` (its vector helpers: AVX2's 8
// floats, AVX-512's 16) and under that set's target: a template is compiled for the target of the
// place it is defined, so one definition cannot serve both (see block_gemm.cpp's LaneTile).
// No include guard, on purpose; no #include either (the including file has them all).
//
// The layouts: ggml's ggml-common.h (block_q4_0 ... block_q6_k), every scale a float16 (d, dmin, m)
// but Q6_K's 16 int8 sub-scales; each weight is computed as gguf-py's quants.py dequantizes it, in the
// same float32 operations and order (d * sc first, then times q, then minus dmin * m), so that
// dequantize_rows gives its values bit for bit and the products compute x @ dequantize(W)^T up to the
// order of float32 sums.
//
// A layout is: BLOCK (weights a block), BYTES (its size), prepare(block) (its scales as float32, once
// a block) and group<g>(block, scales, out) (weights 32 g .. 32 g + 31 of the block as GROUP / LANES
// vectors, in order; g a constant, so each layout's branches on it fold away).
// The block types also have an integer form, for the products with x rounded to 16 bits (int_gemm):
// igroup<g>(block, out) (the group's integers q as 16-bit lanes, GROUP / LANES16 vectors) with
// w = iscale(scales, g, half) q + ioffset(scales, g) (half: the group's first or last 16 weights,
// which only Q6_K scales apart, HALF_SCALES).

constexpr int LANES = V::LANES;
constexpr int VECTORS = GROUP / LANES;  // vectors a group of 32 weights
constexpr int WVECTORS = GROUP / V::LANES16;  // 16-bit vectors a group of 32 weights
using F = V::F;
using I = V::I;

struct NoIntegerForm {
  static constexpr bool INTEGER = false;
};
struct IntegerForm {
  static constexpr bool INTEGER = true, OFFSET = false, HALF_SCALES = false;
};

// The element index within a group of chunk c (LANES weights) of a group.
constexpr int at(int c) { return c * LANES; }

struct Q4_0 : IntegerForm {
  static constexpr int BLOCK = 32, BYTES = 18;
  struct Scales { float d; };
  static Scales prepare(const uint8_t* b) { return {half_to_float(b)}; }
  template <int g>
  static void igroup(const uint8_t* b, I out[WVECTORS]) {
    V::nibbles(b + 2, out);
    for (int c = 0; c < WVECTORS; ++c) out[c] = V::subw(out[c], 8);
  }
  static float iscale(const Scales& s, int, int) { return s.d; }
  // qs (16 bytes, from byte 2): low nibbles weights 0..15, high nibbles 16..31; w = (q - 8) d.
  template <int g>
  static void group(const uint8_t* b, const Scales& s, F out[VECTORS]) {
    const F d = V::set1(s.d);
    #pragma GCC unroll 4
    for (int c = 0; c < VECTORS; ++c) {
      const I q = at(c) < 16 ? V::and_(V::u8(b + 2 + at(c)), 0x0F) : V::srl(V::u8(b + 2 + at(c) - 16), 4);
      out[c] = V::mul(d, V::cvt(V::subi(q, 8)));
    }
  }
};

struct Q4_1 : IntegerForm {
  static constexpr int BLOCK = 32, BYTES = 20;
  static constexpr bool OFFSET = true;
  struct Scales { float d, m; };
  static Scales prepare(const uint8_t* b) { return {half_to_float(b), half_to_float(b + 2)}; }
  template <int g>
  static void igroup(const uint8_t* b, I out[WVECTORS]) { V::nibbles(b + 4, out); }
  static float iscale(const Scales& s, int, int) { return s.d; }
  static float ioffset(const Scales& s, int) { return s.m; }
  // d, m, then qs as Q4_0's; w = d q + m.
  template <int g>
  static void group(const uint8_t* b, const Scales& s, F out[VECTORS]) {
    const F d = V::set1(s.d), m = V::set1(s.m);
    #pragma GCC unroll 4
    for (int c = 0; c < VECTORS; ++c) {
      const I q = at(c) < 16 ? V::and_(V::u8(b + 4 + at(c)), 0x0F) : V::srl(V::u8(b + 4 + at(c) - 16), 4);
      out[c] = V::add(V::mul(d, V::cvt(q)), m);
    }
  }
};

// Q5_0 and Q5_1's 5-bit values: qh's bit i is weight i's bit 4 (qh a little-endian uint32 at `qh`).
inline I five_bits(const uint8_t* qh, const uint8_t* qs, int c) {
  uint32_t high;
  std::memcpy(&high, qh, 4);
  const I low = at(c) < 16 ? V::and_(V::u8(qs + at(c)), 0x0F) : V::srl(V::u8(qs + at(c) - 16), 4);
  return V::or_(low, V::sll(V::bits(high, at(c)), 4));
}

// The same as 16-bit lanes: all 32 values (out[WVECTORS]).
inline void five_bits_wide(const uint8_t* qh, const uint8_t* qs, I out[WVECTORS]) {
  uint32_t high;
  std::memcpy(&high, qh, 4);
  V::nibbles(qs, out);
  for (int c = 0; c < WVECTORS; ++c) out[c] = V::or_(out[c], V::bitsw(high, c * V::LANES16, 16));
}

struct Q5_0 : IntegerForm {
  static constexpr int BLOCK = 32, BYTES = 22;
  struct Scales { float d; };
  static Scales prepare(const uint8_t* b) { return {half_to_float(b)}; }
  template <int g>
  static void igroup(const uint8_t* b, I out[WVECTORS]) {
    five_bits_wide(b + 2, b + 6, out);
    for (int c = 0; c < WVECTORS; ++c) out[c] = V::subw(out[c], 16);
  }
  static float iscale(const Scales& s, int, int) { return s.d; }
  // d, qh (4 bytes), qs (16); w = (q - 16) d.
  template <int g>
  static void group(const uint8_t* b, const Scales& s, F out[VECTORS]) {
    const F d = V::set1(s.d);
    #pragma GCC unroll 4
    for (int c = 0; c < VECTORS; ++c) out[c] = V::mul(d, V::cvt(V::subi(five_bits(b + 2, b + 6, c), 16)));
  }
};

struct Q5_1 : IntegerForm {
  static constexpr int BLOCK = 32, BYTES = 24;
  static constexpr bool OFFSET = true;
  struct Scales { float d, m; };
  static Scales prepare(const uint8_t* b) { return {half_to_float(b), half_to_float(b + 2)}; }
  template <int g>
  static void igroup(const uint8_t* b, I out[WVECTORS]) { five_bits_wide(b + 4, b + 8, out); }
  static float iscale(const Scales& s, int, int) { return s.d; }
  static float ioffset(const Scales& s, int) { return s.m; }
  // d, m, qh (4 bytes), qs (16); w = d q + m.
  template <int g>
  static void group(const uint8_t* b, const Scales& s, F out[VECTORS]) {
    const F d = V::set1(s.d), m = V::set1(s.m);
    #pragma GCC unroll 4
    for (int c = 0; c < VECTORS; ++c) out[c] = V::add(V::mul(d, V::cvt(five_bits(b + 4, b + 8, c))), m);
  }
};

struct Q8_0 : IntegerForm {
  static constexpr int BLOCK = 32, BYTES = 34;
  struct Scales { float d; };
  static Scales prepare(const uint8_t* b) { return {half_to_float(b)}; }
  template <int g>
  static void igroup(const uint8_t* b, I out[WVECTORS]) {
    for (int c = 0; c < WVECTORS; ++c) out[c] = V::i8w(b + 2 + c * V::LANES16);
  }
  static float iscale(const Scales& s, int, int) { return s.d; }
  // d, then 32 int8; w = q d.
  template <int g>
  static void group(const uint8_t* b, const Scales& s, F out[VECTORS]) {
    const F d = V::set1(s.d);
    #pragma GCC unroll 4
    for (int c = 0; c < VECTORS; ++c) out[c] = V::mul(V::cvt(V::i8(b + 2 + at(c))), d);
  }
};

// Q4_K and Q5_K's 6-bit scales and minimums of their 8 sub-blocks (ggml's get_scale_min_k4), times
// d and dmin.  The 12 bytes as three 32-bit words u0, u1, u2 (byte j of a word: sub-block j's): the
// scales of sub-blocks 0-3 are u0's low 6 bits a byte and those of 4-7 u2's low nibbles with u0's
// top 2 bits above them; the minimums likewise from u1 and u2's high nibbles, all 8 at once.
struct KScales { float d[8], m[8]; };
// The 8 scales and the 8 minimums as bytes (byte j: sub-block j's), one 64-bit word each.
inline void k_scale_words(const uint8_t* b, uint64_t& scales, uint64_t& minimums) {
  uint32_t u[3];
  std::memcpy(u, b + 4, 12);
  constexpr uint32_t SIX = 0x3F3F3F3F, NIBBLE = 0x0F0F0F0F, TOP = 0x03030303;
  scales = (u[0] & SIX) | (uint64_t((u[2] & NIBBLE) | (((u[0] >> 6) & TOP) << 4)) << 32);
  minimums = (u[1] & SIX) | (uint64_t(((u[2] >> 4) & NIBBLE) | (((u[1] >> 6) & TOP) << 4)) << 32);
}
inline __m256 k_floats(uint64_t bytes, float scale) {
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(bytes)))),
                       _mm256_set1_ps(scale));
}
inline KScales k_scales(const uint8_t* b) {
  uint64_t scales, minimums;
  k_scale_words(b, scales, minimums);
  KScales out;
  _mm256_storeu_ps(out.d, k_floats(scales, half_to_float(b)));
  _mm256_storeu_ps(out.m, k_floats(minimums, half_to_float(b + 2)));
  return out;
}

// Q4_K (FIFTH false) and Q5_K: d, dmin, 12 bytes of scales, then for Q5_K qh (32 bytes from byte
// 16), then qs (128 bytes): sub-block g's low 4 bits are the low (g even) or high (g odd) nibbles of
// qs[32 (g / 2) ..][0..31], and bit g of qh[i] is bit 4 of its weight i; w = (d sc) q - dmin m.
template <bool FIFTH>
struct KQuant : IntegerForm {
  static constexpr int BLOCK = 256, BYTES = FIFTH ? 176 : 144, QS = FIFTH ? 48 : 16;
  static constexpr bool OFFSET = true;
  using Scales = KScales;
  static Scales prepare(const uint8_t* b) { return k_scales(b); }
  template <int g>
  static void igroup(const uint8_t* b, I out[WVECTORS]) {
    const uint8_t* qs = b + QS + 32 * (g / 2);
    for (int c = 0; c < WVECTORS; ++c) {
      const I bytes = V::u8w(qs + c * V::LANES16);
      I q = g % 2 == 0 ? V::andw(bytes, 0x0F) : V::srlw(bytes, 4);
      if constexpr (FIFTH) q = V::or_(q, V::sllw(V::andw(V::srlw(V::u8w(b + 16 + c * V::LANES16), g), 1), 4));
      out[c] = q;
    }
  }
  static float iscale(const Scales& s, int g, int) { return s.d[g]; }
  static float ioffset(const Scales& s, int g) { return -s.m[g]; }
  template <int g>
  static void group(const uint8_t* b, const Scales& s, F out[VECTORS]) {
    const F d = V::set1(s.d[g]), m = V::set1(s.m[g]);
    const uint8_t* qs = b + QS + 32 * (g / 2);
    #pragma GCC unroll 4
    for (int c = 0; c < VECTORS; ++c) {
      I q = g % 2 == 0 ? V::and_(V::u8(qs + at(c)), 0x0F) : V::srl(V::u8(qs + at(c)), 4);
      if constexpr (FIFTH) q = V::or_(q, V::sll(V::and_(V::srl(V::u8(b + 16 + at(c)), g), 1), 4));
      out[c] = V::sub(V::mul(d, V::cvt(q)), m);
    }
  }
};
using Q4_K = KQuant<false>;
using Q5_K = KQuant<true>;

struct Q6_K : IntegerForm {
  static constexpr int BLOCK = 256, BYTES = 210;
  static constexpr bool HALF_SCALES = true;
  struct Scales { float d[16]; };
  // ql (128 bytes), qh (64), 16 int8 scales (one per 16 weights), d (float16, at byte 208).
  static Scales prepare(const uint8_t* b) {
    const __m256 d = _mm256_set1_ps(half_to_float(b + 208));
    Scales s;
    for (int half = 0; half < 2; ++half) {
      const __m256i scales = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 192 + 8 * half)));
      _mm256_storeu_ps(s.d + 8 * half, _mm256_mul_ps(d, _mm256_cvtepi32_ps(scales)));
    }
    return s;
  }
  // Group g = 4 h + j (h the half of 128 weights): low 4 bits from ql[64 h + 32 (j % 2) + i],
  // its low (j < 2) or high nibble; bits 4-5 from bits 2 j, 2 j + 1 of qh[32 h + i]; w = (d sc) (q - 32).
  template <int g>
  static void group(const uint8_t* b, const Scales& s, F out[VECTORS]) {
    constexpr int h = g / 4, j = g % 4;
    const uint8_t* ql = b + 64 * h + 32 * (j % 2);
    const uint8_t* qh = b + 128 + 32 * h;
    #pragma GCC unroll 4
    for (int c = 0; c < VECTORS; ++c) {
      const I low = j < 2 ? V::and_(V::u8(ql + at(c)), 0x0F) : V::srl(V::u8(ql + at(c)), 4);
      const I high = V::sll(V::and_(V::srl(V::u8(qh + at(c)), 2 * j), 3), 4);
      out[c] = V::mul(V::set1(s.d[2 * g + at(c) / 16]), V::cvt(V::subi(V::or_(low, high), 32)));
    }
  }
  template <int g>
  static void igroup(const uint8_t* b, I out[WVECTORS]) {
    constexpr int h = g / 4, j = g % 4;
    const uint8_t* ql = b + 64 * h + 32 * (j % 2);
    const uint8_t* qh = b + 128 + 32 * h;
    for (int c = 0; c < WVECTORS; ++c) {
      const I bytes = V::u8w(ql + c * V::LANES16);
      const I low = j < 2 ? V::andw(bytes, 0x0F) : V::srlw(bytes, 4);
      const I high = V::sllw(V::andw(V::srlw(V::u8w(qh + c * V::LANES16), 2 * j), 3), 4);
      out[c] = V::subw(V::or_(low, high), 32);
    }
  }
  static float iscale(const Scales& s, int g, int half) { return s.d[2 * g + half]; }
};

// The unquantized types, in blocks of 32 elements (K a multiple of 32 for the products; the Python
// binding takes other widths to torch).
struct F32 : NoIntegerForm {
  static constexpr int BLOCK = 32, BYTES = 128;
  struct Scales {};
  static Scales prepare(const uint8_t*) { return {}; }
  template <int g>
  static void group(const uint8_t* b, const Scales&, F out[VECTORS]) {
    #pragma GCC unroll 4
    for (int c = 0; c < VECTORS; ++c) out[c] = V::load(reinterpret_cast<const float*>(b) + at(c));
  }
};

struct F16 : NoIntegerForm {
  static constexpr int BLOCK = 32, BYTES = 64;
  struct Scales {};
  static Scales prepare(const uint8_t*) { return {}; }
  template <int g>
  static void group(const uint8_t* b, const Scales&, F out[VECTORS]) {
    #pragma GCC unroll 4
    for (int c = 0; c < VECTORS; ++c) out[c] = V::f16(b + 2 * at(c));
  }
};

struct BF16 : NoIntegerForm {
  static constexpr int BLOCK = 32, BYTES = 64;
  struct Scales {};
  static Scales prepare(const uint8_t*) { return {}; }
  template <int g>
  static void group(const uint8_t* b, const Scales&, F out[VECTORS]) {
    #pragma GCC unroll 4
    for (int c = 0; c < VECTORS; ++c) out[c] = V::bf16(b + 2 * at(c));
  }
};

// Calls body(std::integral_constant<int, g>) for g = 0 .. COUNT - 1, unrolled.
template <int COUNT, typename Body, int... G>
inline void for_groups(const Body& body, std::integer_sequence<int, G...>) {
  (body(std::integral_constant<int, G>{}), ...);
}
template <int COUNT, typename Body>
inline void for_groups(const Body& body) {
  for_groups<COUNT>(body, std::make_integer_sequence<int, COUNT>{});
}

// Independent accumulators per row of x: few rows keep several, so that a row's multiply-adds do not
// wait on one another (4 cycles each), within the registers (AVX2 16, AVX-512 32).
template <int ROWS>
constexpr int chains() {
  constexpr int target = V::REGISTERS / 2;
  return ROWS >= target ? 1 : target / ROWS < 8 ? target / ROWS : 8;
}

// BLOCKS consecutive blocks of a weight row (from `block`) times rows xb, xb + K, ... (ROWS of them,
// at the blocks' first element) into acc: each group decoded once to registers, then multiplied into
// every row.  The weight stream is prefetched PREFETCH_BYTES ahead (a weight's rows are contiguous,
// so the stream runs on into the next rows).
template <typename L, int ROWS, int BLOCKS, int CHAINS>
inline void dot_blocks(const uint8_t* block, const float* xb, int64_t K, F (&acc)[ROWS][CHAINS]) {
  constexpr int GROUPS = L::BLOCK / GROUP;
  #pragma GCC unroll 8
  for (int line = 0; line < BLOCKS * L::BYTES; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(block + PREFETCH_BYTES + line), _MM_HINT_T0);
  for_groups<BLOCKS>([&](auto j) {
    const uint8_t* b = block + decltype(j)::value * L::BYTES;
    const typename L::Scales scales = L::prepare(b);
    for_groups<GROUPS>([&](auto g) {
      constexpr int index = decltype(j)::value * GROUPS + decltype(g)::value;  // the group's place in the step
      F weights[VECTORS];
      L::template group<decltype(g)::value>(b, scales, weights);
      #pragma GCC unroll 16
      for (int r = 0; r < ROWS; ++r)
        #pragma GCC unroll 16
        for (int c = 0; c < VECTORS; ++c) {
          const int chain = (index * VECTORS + c) % CHAINS;
          acc[r][chain] = V::fmadd(weights[c], V::load(xb + r * K + index * GROUP + at(c)), acc[r][chain]);
        }
    });
  });
}

// Output row n against rows [r0, r0 + ROWS) of x, 256 weights a step (a K-quant's super-block, 8
// blocks of the 32-weight types).
template <typename L, int ROWS>
inline void dot_rows(const uint8_t* w, int64_t row_bytes, const float* x, int64_t K, int64_t N, int64_t n, int64_t r0,
                     float* y, bool add) {
  constexpr int CHAINS = chains<ROWS>();
  constexpr int STEP = L::BLOCK >= 256 ? 1 : 256 / L::BLOCK;
  F acc[ROWS][CHAINS];
  #pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r)
    #pragma GCC unroll 16
    for (int c = 0; c < CHAINS; ++c) acc[r][c] = V::zero();
  const uint8_t* row = w + n * row_bytes;
  const float* xs = x + r0 * K;
  const int64_t blocks = K / L::BLOCK;
  int64_t blk = 0;
  for (; blk + STEP <= blocks; blk += STEP) dot_blocks<L, ROWS, STEP>(row + blk * L::BYTES, xs + blk * L::BLOCK, K, acc);
  for (; blk < blocks; ++blk) dot_blocks<L, ROWS, 1>(row + blk * L::BYTES, xs + blk * L::BLOCK, K, acc);
  #pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) {
    F total = acc[r][0];
    #pragma GCC unroll 16
    for (int c = 1; c < CHAINS; ++c) total = V::add(total, acc[r][c]);
    float& target = y[(r0 + r) * N + n];
    target = add ? target + V::sum(total) : V::sum(total);
  }
}

// Output rows [first, last) against every row of x: in tiles of output rows whose weights stay in
// L2 (TILE_BYTES), each tile against the rows of x ROW_BLOCK at a time, then their rest.
template <typename L>
void rows(const uint8_t* w, int64_t row_bytes, const float* x, int64_t M, int64_t K, int64_t N, int64_t first, int64_t last,
          float* y, bool add) {
  const int64_t tile = std::max<int64_t>(1, TILE_BYTES / row_bytes);
  for (int64_t begin = first; begin < last; begin += tile) {
    const int64_t end = std::min(begin + tile, last);
    int64_t r0 = 0;
    for (; r0 + ROW_BLOCK <= M; r0 += ROW_BLOCK)
      for (int64_t n = begin; n < end; ++n) dot_rows<L, ROW_BLOCK>(w, row_bytes, x, K, N, n, r0, y, add);
    for (int64_t n = begin; n < end; ++n) {
      switch (M - r0) {
        case 7: dot_rows<L, 7>(w, row_bytes, x, K, N, n, r0, y, add); break;
        case 6: dot_rows<L, 6>(w, row_bytes, x, K, N, n, r0, y, add); break;
        case 5: dot_rows<L, 5>(w, row_bytes, x, K, N, n, r0, y, add); break;
        case 4: dot_rows<L, 4>(w, row_bytes, x, K, N, n, r0, y, add); break;
        case 3: dot_rows<L, 3>(w, row_bytes, x, K, N, n, r0, y, add); break;
        case 2: dot_rows<L, 2>(w, row_bytes, x, K, N, n, r0, y, add); break;
        case 1: dot_rows<L, 1>(w, row_bytes, x, K, N, n, r0, y, add); break;
        default: break;  // no rest
      }
    }
  }
}

// --- Few rows of x rounded to 16 bits: integer products ------------------------------------------------
// Up to INTEGER_ROWS rows, where decoding the weights (read once, straight from memory) bounds a
// product, the block types multiply x rounded to 16 bits per group of 32 (kernels::round_row, the
// rounding of the Q4_1 and Q8_0 products) by their integers in 16-bit lanes: per group one madd per
// vector of 16-bit lanes, exact in integers, then one float multiply-add by iscale * dx, plus the
// offset times the group's float sum of x (Q4_1, Q5_1, Q4_K, Q5_K).  Decoding to 16-bit lanes takes
// half the instructions of decoding to float32 and a madd does twice an FMA's multiply-adds.  A
// product's relative error is x's rounding, about 1e-5; the likelihood of text is unchanged
// (docs/performance-history.md, bench/activation_bits_quality.py).  set_activation_bits(32) keeps
// the float loop.
constexpr int INTEGER_ROWS = 4;

// x [M, K] rounded to T (int16_t or int8_t): values xq [M, K], per group scales dx and float sums
// sx [M, K / 32] (kernels::round_row).
template <typename T>
struct RoundedX {
  std::vector<T> q;
  std::vector<float> dx, sx;
  bool round(const float* x, int64_t M, int64_t K) {
    q.resize(static_cast<size_t>(M * K));
    dx.resize(static_cast<size_t>(M * K / GROUP));
    sx.resize(static_cast<size_t>(M * K / GROUP));
    for (int64_t r = 0; r < M; ++r)
      if (!kernels::round_row(x + r * K, K, q.data() + r * K, dx.data() + r * K / GROUP, sx.data() + r * K / GROUP))
        return false;
    return true;
  }
};

// Output row n against the ROWS rounded rows of x (see above), 256 weights a step as dot_rows.
template <typename L, int ROWS>
inline void int_dot_rows(const uint8_t* row, const RoundedX<int16_t>& x, int64_t K, int64_t N, int64_t n, float* y, bool add) {
  constexpr int GROUPS = L::BLOCK / GROUP, STEP = L::BLOCK >= 256 ? 1 : 256 / L::BLOCK;
  const int64_t groups = K / GROUP, blocks = K / L::BLOCK;
  F acc[ROWS][2];
  float offsets[ROWS];
  __m256 block_offsets[ROWS];  // the K-quants' 8 sub-blocks' offset terms, a lane each
  for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = V::zero(), offsets[r] = 0.0f, block_offsets[r] = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < blocks; blk += STEP) {
    const uint8_t* step = row + blk * L::BYTES;
    #pragma GCC unroll 8
    for (int line = 0; line < STEP * L::BYTES; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(step + PREFETCH_BYTES + line), _MM_HINT_T0);
    for_groups<STEP>([&](auto j) {
      if (blk + decltype(j)::value >= blocks) return;  // a row's last blocks short of a step
      const uint8_t* b = step + decltype(j)::value * L::BYTES;
      const typename L::Scales scales = L::prepare(b);
      // The K-quants' products of their scales with x's, 8 (16 for Q6_K's halves) a vector per row.
      float products[GROUPS == 8 ? ROWS : 1][GROUPS == 8 ? 16 : 1];
      if constexpr (GROUPS == 8)
        for (int r = 0; r < ROWS; ++r) {
          const __m256 dx = _mm256_loadu_ps(&x.dx[r * groups + (blk + decltype(j)::value) * GROUPS]);
          if constexpr (L::HALF_SCALES) {
            const __m256 low = _mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
            const __m256 high = _mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
            _mm256_storeu_ps(products[r], _mm256_mul_ps(_mm256_loadu_ps(scales.d), low));
            _mm256_storeu_ps(products[r] + 8, _mm256_mul_ps(_mm256_loadu_ps(scales.d + 8), high));
          } else {
            _mm256_storeu_ps(products[r], _mm256_mul_ps(_mm256_loadu_ps(scales.d), dx));
          }
        }
      for_groups<GROUPS>([&](auto g) {
        constexpr int index = decltype(j)::value * GROUPS + decltype(g)::value, chain = index % 2;
        const int64_t group = (blk + decltype(j)::value) * GROUPS + decltype(g)::value;
        I q[WVECTORS];
        L::template igroup<decltype(g)::value>(b, q);
        #pragma GCC unroll 4
        for (int r = 0; r < ROWS; ++r) {
          const int16_t* xg = x.q.data() + r * K + group * GROUP;
          constexpr int gi = decltype(g)::value;
          // iscale * dx: from the block's products, or (the 32-weight types) computed here
          auto scale = [&](int half) {
            if constexpr (GROUPS == 8) return products[GROUPS == 8 ? r : 0][L::HALF_SCALES ? 2 * gi + half : gi];
            else return L::iscale(scales, gi, half) * x.dx[r * groups + group];
          };
          if constexpr (L::HALF_SCALES && WVECTORS == 2) {  // a vector a half: each its own scale
            acc[r][0] = V::fmadd(V::cvt(V::madd(q[0], V::loadw(xg))), V::set1(scale(0)), acc[r][0]);
            acc[r][1] = V::fmadd(V::cvt(V::madd(q[1], V::loadw(xg + 16))), V::set1(scale(1)), acc[r][1]);
          } else if constexpr (L::HALF_SCALES) {  // one vector: its first 8 lanes hold the first half's sums
            acc[r][chain] = V::fmadd(V::cvt(V::madd(q[0], V::loadw(xg))), V::halves(scale(0), scale(1)), acc[r][chain]);
          } else {
            I sums = V::madd(q[0], V::loadw(xg));
            #pragma GCC unroll 2
            for (int c = 1; c < WVECTORS; ++c) sums = V::addi(sums, V::madd(q[c], V::loadw(xg + c * V::LANES16)));
            acc[r][chain] = V::fmadd(V::cvt(sums), V::set1(scale(0)), acc[r][chain]);
          }
          if constexpr (L::OFFSET && GROUPS == 1) offsets[r] += L::ioffset(scales, decltype(g)::value) * x.sx[r * groups + group];
        }
      });
      if constexpr (L::OFFSET && GROUPS == 8) {  // w = d q - m: minus the minimums times the sums of x
        const int64_t group = (blk + decltype(j)::value) * GROUPS;
        for (int r = 0; r < ROWS; ++r)
          block_offsets[r] = _mm256_fnmadd_ps(_mm256_loadu_ps(scales.m), _mm256_loadu_ps(&x.sx[r * groups + group]), block_offsets[r]);
      }
    });
  }
  for (int r = 0; r < ROWS; ++r) {
    float& target = y[r * N + n];
    const float total = V::sum(V::add(acc[r][0], acc[r][1])) + offsets[r] + kernels::horizontal_sum(block_offsets[r]);
    target = add ? target + total : total;
  }
}

// The product of M <= INTEGER_ROWS rows with x rounded to 16 bits; false, nothing computed, where x
// cannot be rounded (float32 then).
template <typename L>
bool int_gemm(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, float* y, bool add, int threads) {
  thread_local RoundedX<int16_t> callers;  // the caller's, reused; the workers take it by reference
  RoundedX<int16_t>& rounded = callers;
  if (!rounded.round(x, M, K)) return false;
  const int64_t row_bytes = K / L::BLOCK * L::BYTES;
  kernels::parallel_for(N, threads, [&](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      const uint8_t* row = w + n * row_bytes;
      switch (M) {
        case 1: int_dot_rows<L, 1>(row, rounded, K, N, n, y, add); break;
        case 2: int_dot_rows<L, 2>(row, rounded, K, N, n, y, add); break;
        case 3: int_dot_rows<L, 3>(row, rounded, K, N, n, y, add); break;
        default: int_dot_rows<L, 4>(row, rounded, K, N, n, y, add); break;
      }
    }
  });
  return true;
}

template <typename L>
void gemm(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, float* y, bool add, int threads) {
  const int64_t row_bytes = K / L::BLOCK * L::BYTES;
  if (M * N * K < SMALL_WORK) threads = 1;
  if constexpr (L::INTEGER) {
    if (M <= INTEGER_ROWS && kernels::activation_bits_setting() <= 16 && int_gemm<L>(x, M, K, w, N, y, add, threads)) return;
  }
  kernels::parallel_for(N, threads, [&](int64_t first, int64_t last) { rows<L>(w, row_bytes, x, M, K, N, first, last, y, add); });
}

// Rows `rows[0 .. n)` of the weight, K values each, as float32 into out [n, K].
template <typename L>
void dequantize_rows(const uint8_t* w, int64_t K, const int64_t* indices, int64_t n, float* out) {
  const int64_t blocks = K / L::BLOCK, row_bytes = blocks * L::BYTES;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const uint8_t* block = w + indices[i] * row_bytes + blk * L::BYTES;
      const typename L::Scales scales = L::prepare(block);
      float* o = out + i * K + blk * L::BLOCK;
      for_groups<L::BLOCK / GROUP>([&](auto g) {
        F values[VECTORS];
        L::template group<decltype(g)::value>(block, scales, values);
        for (int c = 0; c < VECTORS; ++c) V::store(o + decltype(g)::value * GROUP + at(c), values[c]);
      });
    }
}

// x[0 .. n) as bfloat16 bits (simd.h's bfloat16_bits: nearest even, as torch's cast rounds).
inline void round_to_bfloat16(const float* x, int64_t n, uint16_t* out) {
  using kernels::bfloat16_bits;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    // packus works within 128-bit lanes: a0-3 b0-3 a4-7 b4-7, put back in order.
    const __m256i packed =
        _mm256_packus_epi32(bfloat16_bits(_mm256_loadu_ps(x + i)), bfloat16_bits(_mm256_loadu_ps(x + i + 8)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_permute4x64_epi64(packed, 0xD8));
  }
  for (; i < n; ++i) out[i] = bfloat16_bits(x[i]);
}

// The whole weight [N, K] as bfloat16 bits into out [N, K] (dequantize_rows' values, rounded), rows
// split between threads.
template <typename L>
void to_bfloat16(const uint8_t* w, int64_t N, int64_t K, uint16_t* out, int threads) {
  kernels::parallel_for(N, threads, [&](int64_t first, int64_t last) {
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t n = first; n < last; ++n) {
      dequantize_rows<L>(w, K, &n, 1, row.data());
      round_to_bfloat16(row.data(), K, out + n * K);
    }
  });
}

inline bool to_bfloat16_type(int type, const uint8_t* w, int64_t N, int64_t K, uint16_t* out, int threads) {
  switch (type) {
    case TYPE_Q4_0: to_bfloat16<Q4_0>(w, N, K, out, threads); return true;
    case TYPE_Q4_1: to_bfloat16<Q4_1>(w, N, K, out, threads); return true;
    case TYPE_Q5_0: to_bfloat16<Q5_0>(w, N, K, out, threads); return true;
    case TYPE_Q5_1: to_bfloat16<Q5_1>(w, N, K, out, threads); return true;
    case TYPE_Q8_0: to_bfloat16<Q8_0>(w, N, K, out, threads); return true;
    case TYPE_Q4_K: to_bfloat16<Q4_K>(w, N, K, out, threads); return true;
    case TYPE_Q5_K: to_bfloat16<Q5_K>(w, N, K, out, threads); return true;
    case TYPE_Q6_K: to_bfloat16<Q6_K>(w, N, K, out, threads); return true;
    default: return false;
  }
}

// The product of a ggml type id (false: not one of ours).
inline bool gemm_type(int type, const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, float* y, bool add,
                      int threads) {
  switch (type) {
    case TYPE_F32: gemm<F32>(x, M, K, w, N, y, add, threads); return true;
    case TYPE_F16: gemm<F16>(x, M, K, w, N, y, add, threads); return true;
    case TYPE_BF16: gemm<BF16>(x, M, K, w, N, y, add, threads); return true;
    case TYPE_Q4_0: gemm<Q4_0>(x, M, K, w, N, y, add, threads); return true;
    case TYPE_Q4_1: gemm<Q4_1>(x, M, K, w, N, y, add, threads); return true;
    case TYPE_Q5_0: gemm<Q5_0>(x, M, K, w, N, y, add, threads); return true;
    case TYPE_Q5_1: gemm<Q5_1>(x, M, K, w, N, y, add, threads); return true;
    case TYPE_Q8_0: gemm<Q8_0>(x, M, K, w, N, y, add, threads); return true;
    case TYPE_Q4_K: gemm<Q4_K>(x, M, K, w, N, y, add, threads); return true;
    case TYPE_Q5_K: gemm<Q5_K>(x, M, K, w, N, y, add, threads); return true;
    case TYPE_Q6_K: gemm<Q6_K>(x, M, K, w, N, y, add, threads); return true;
    default: return false;
  }
}

inline bool dequantize_type(int type, const uint8_t* w, int64_t K, const int64_t* indices, int64_t n, float* out) {
  switch (type) {
    case TYPE_F32: dequantize_rows<F32>(w, K, indices, n, out); return true;
    case TYPE_F16: dequantize_rows<F16>(w, K, indices, n, out); return true;
    case TYPE_BF16: dequantize_rows<BF16>(w, K, indices, n, out); return true;
    case TYPE_Q4_0: dequantize_rows<Q4_0>(w, K, indices, n, out); return true;
    case TYPE_Q4_1: dequantize_rows<Q4_1>(w, K, indices, n, out); return true;
    case TYPE_Q5_0: dequantize_rows<Q5_0>(w, K, indices, n, out); return true;
    case TYPE_Q5_1: dequantize_rows<Q5_1>(w, K, indices, n, out); return true;
    case TYPE_Q8_0: dequantize_rows<Q8_0>(w, K, indices, n, out); return true;
    case TYPE_Q4_K: dequantize_rows<Q4_K>(w, K, indices, n, out); return true;
    case TYPE_Q5_K: dequantize_rows<Q5_K>(w, K, indices, n, out); return true;
    case TYPE_Q6_K: dequantize_rows<Q6_K>(w, K, indices, n, out); return true;
    default: return false;
  }
}
