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

constexpr int LANES = V::LANES;
constexpr int VECTORS = GROUP / LANES;  // vectors a group of 32 weights
using F = V::F;
using I = V::I;

// The element index within a group of chunk c (LANES weights) of a group.
constexpr int at(int c) { return c * LANES; }

struct Q4_0 {
  static constexpr int BLOCK = 32, BYTES = 18;
  struct Scales { float d; };
  static Scales prepare(const uint8_t* b) { return {half_to_float(b)}; }
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

struct Q4_1 {
  static constexpr int BLOCK = 32, BYTES = 20;
  struct Scales { float d, m; };
  static Scales prepare(const uint8_t* b) { return {half_to_float(b), half_to_float(b + 2)}; }
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

struct Q5_0 {
  static constexpr int BLOCK = 32, BYTES = 22;
  struct Scales { float d; };
  static Scales prepare(const uint8_t* b) { return {half_to_float(b)}; }
  // d, qh (4 bytes), qs (16); w = (q - 16) d.
  template <int g>
  static void group(const uint8_t* b, const Scales& s, F out[VECTORS]) {
    const F d = V::set1(s.d);
    #pragma GCC unroll 4
    for (int c = 0; c < VECTORS; ++c) out[c] = V::mul(d, V::cvt(V::subi(five_bits(b + 2, b + 6, c), 16)));
  }
};

struct Q5_1 {
  static constexpr int BLOCK = 32, BYTES = 24;
  struct Scales { float d, m; };
  static Scales prepare(const uint8_t* b) { return {half_to_float(b), half_to_float(b + 2)}; }
  // d, m, qh (4 bytes), qs (16); w = d q + m.
  template <int g>
  static void group(const uint8_t* b, const Scales& s, F out[VECTORS]) {
    const F d = V::set1(s.d), m = V::set1(s.m);
    #pragma GCC unroll 4
    for (int c = 0; c < VECTORS; ++c) out[c] = V::add(V::mul(d, V::cvt(five_bits(b + 4, b + 8, c))), m);
  }
};

struct Q8_0 {
  static constexpr int BLOCK = 32, BYTES = 34;
  struct Scales { float d; };
  static Scales prepare(const uint8_t* b) { return {half_to_float(b)}; }
  // d, then 32 int8; w = q d.
  template <int g>
  static void group(const uint8_t* b, const Scales& s, F out[VECTORS]) {
    const F d = V::set1(s.d);
    #pragma GCC unroll 4
    for (int c = 0; c < VECTORS; ++c) out[c] = V::mul(V::cvt(V::i8(b + 2 + at(c))), d);
  }
};

// Q4_K and Q5_K's 6-bit scales and minimums of their 8 sub-blocks (ggml's get_scale_min_k4), times
// d and dmin.
struct KScales { float d[8], m[8]; };
inline KScales k_scales(const uint8_t* b) {
  const float d = half_to_float(b), dmin = half_to_float(b + 2);
  const uint8_t* s = b + 4;
  KScales out;
  for (int j = 0; j < 8; ++j) {
    const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    out.d[j] = d * static_cast<float>(sc);
    out.m[j] = dmin * static_cast<float>(m);
  }
  return out;
}

// Q4_K (FIFTH false) and Q5_K: d, dmin, 12 bytes of scales, then for Q5_K qh (32 bytes from byte
// 16), then qs (128 bytes): sub-block g's low 4 bits are the low (g even) or high (g odd) nibbles of
// qs[32 (g / 2) ..][0..31], and bit g of qh[i] is bit 4 of its weight i; w = (d sc) q - dmin m.
template <bool FIFTH>
struct KQuant {
  static constexpr int BLOCK = 256, BYTES = FIFTH ? 176 : 144, QS = FIFTH ? 48 : 16;
  using Scales = KScales;
  static Scales prepare(const uint8_t* b) { return k_scales(b); }
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

struct Q6_K {
  static constexpr int BLOCK = 256, BYTES = 210;
  struct Scales { float d[16]; };
  // ql (128 bytes), qh (64), 16 int8 scales (one per 16 weights), d (float16, at byte 208).
  static Scales prepare(const uint8_t* b) {
    const float d = half_to_float(b + 208);
    Scales s;
    for (int j = 0; j < 16; ++j) s.d[j] = d * static_cast<float>(static_cast<int8_t>(b[192 + j]));
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
};

// The unquantized types, in blocks of 32 elements (K a multiple of 32 for the products; the Python
// binding takes other widths to torch).
struct F32 {
  static constexpr int BLOCK = 32, BYTES = 128;
  struct Scales {};
  static Scales prepare(const uint8_t*) { return {}; }
  template <int g>
  static void group(const uint8_t* b, const Scales&, F out[VECTORS]) {
    #pragma GCC unroll 4
    for (int c = 0; c < VECTORS; ++c) out[c] = V::load(reinterpret_cast<const float*>(b) + at(c));
  }
};

struct F16 {
  static constexpr int BLOCK = 32, BYTES = 64;
  struct Scales {};
  static Scales prepare(const uint8_t*) { return {}; }
  template <int g>
  static void group(const uint8_t* b, const Scales&, F out[VECTORS]) {
    #pragma GCC unroll 4
    for (int c = 0; c < VECTORS; ++c) out[c] = V::f16(b + 2 * at(c));
  }
};

struct BF16 {
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

template <typename L>
void gemm(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, float* y, bool add, int threads) {
  const int64_t row_bytes = K / L::BLOCK * L::BYTES;
  if (M * N * K < SMALL_WORK) threads = 1;
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
