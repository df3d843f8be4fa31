// Products of many rows of x rounded to 8 bits (RoundedX8, as ggml_int8.h rounds them) with Q4_K
// weights on AVX-512 VNNI's dpbusd, for prefill chunks and wide decode batches.  Included by
// ggml_blocks.cpp after ggml_int8.h inside its VNNI namespace (RoundedX8, SUPER, k_scale_words and
// friends); no include guard, on purpose.
//
// ggml_int8.h multiplies the blocks as stored: each int8 multiply-add of a weight row takes a
// maddubs and a dpwssd (the sub-block scale), two instructions per 32 weights and row of x.  Here a
// panel of PANEL_COLUMNS weight rows is first decoded, by the thread that multiplies it, into the
// order of a GEMM's packed B (as oneDNN and llama.cpp's repacked tiles do): 4 consecutive weights of
// 16 weight rows a 512-bit vector, so that one dpbusd multiplies them by 4 bytes of x broadcast, 64
// multiply-adds, each of the 16 lanes its own weight row.  A sub-block's 8 such sums then leave the
// integers: times d * sc in float (a lane a weight row), and the minimums' dmin * m times x's float
// sum, per 32 weights; the super-block's sum times x's scale dx.  The decoding is paid once a panel
// and row of the weight, so it pays where x has many rows (PANEL_MIN_ROWS).  The result is x rounded
// per 256 times the dequantized weight, as ggml_int8.h's, up to the order of float sums.

constexpr int PANEL_LANES = 16;    // weight rows a vector (int32 lanes)
constexpr int PANEL_VECTORS = 2;   // vectors a panel
constexpr int PANEL_COLUMNS = PANEL_LANES * PANEL_VECTORS;
constexpr int PANEL_ROWS = 4;      // rows of x a tile: 4 x 2 x 3 accumulators fit 32 registers
constexpr int64_t PANEL_MIN_ROWS = 32;  // rows of x from which the panels beat the stored blocks

// PANEL_COLUMNS weight rows of a Q4_K weight, decoded: q [K / 4][PANEL_VECTORS][16 lanes][4 bytes]
// (the unsigned 4-bit values), scale and minimum [K / 32][PANEL_VECTORS][16] (d sc and dmin m).
struct Q4KPanel {
  std::vector<uint8_t> q;
  std::vector<float> scale, minimum;

  void decode(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t K) {
    const int64_t blocks = K / SUPER;
    q.resize(static_cast<size_t>(K * PANEL_COLUMNS));
    scale.resize(static_cast<size_t>(K / GROUP * PANEL_COLUMNS));
    minimum.resize(scale.size());
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    for (int column = 0; column < PANEL_COLUMNS; ++column) {
      const int64_t lane = column;  // [PANEL_VECTORS][16] flattened: vector column / 16, lane column % 16
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const uint8_t* b = w + (n0 + column) * row_bytes + blk * 144;
        const float d = half_to_float(b), dmin = half_to_float(b + 2);
        uint64_t scales, minimums;
        k_scale_words(b, scales, minimums);
        for (int g = 0; g < 8; ++g) {
          const int64_t at = (blk * 8 + g) * PANEL_COLUMNS + lane;
          scale[at] = d * static_cast<float>((scales >> (8 * g)) & 0xFF);
          minimum[at] = dmin * static_cast<float>((minimums >> (8 * g)) & 0xFF);
        }
        for (int pair = 0; pair < 4; ++pair) {
          const __m256i bytes = load32(b + 16 + 32 * pair);
          alignas(32) uint32_t quads[2][8];
          _mm256_store_si256(reinterpret_cast<__m256i*>(quads[0]), _mm256_and_si256(bytes, nibble));
          _mm256_store_si256(reinterpret_cast<__m256i*>(quads[1]), _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble));
          for (int half = 0; half < 2; ++half) {
            const int64_t group = blk * 8 + 2 * pair + half;
            auto* out = reinterpret_cast<uint32_t*>(q.data()) + group * 8 * PANEL_COLUMNS + lane;
            for (int j = 0; j < 8; ++j) out[j * PANEL_COLUMNS] = quads[half][j];
          }
        }
      }
    }
  }
};

// Rows r0 .. r0 + ROWS of x against a decoded panel: y[r, n0 .. n0 + PANEL_COLUMNS) (+)=.
template <int ROWS>
inline void q4_k_panel_tile(const Q4KPanel& panel, const RoundedX8& x, int64_t r0, int64_t K, float* y, int64_t N,
                            int64_t n0, bool add) {
  const int64_t blocks = K / SUPER, groups = K / GROUP;
  __m512 total[ROWS][PANEL_VECTORS], partial[ROWS][PANEL_VECTORS];
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < PANEL_VECTORS; ++v) total[r][v] = partial[r][v] = _mm512_setzero_ps();
  const int8_t* xq[ROWS];
  for (int r = 0; r < ROWS; ++r) xq[r] = x.q.data() + (r0 + r) * K;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    for (int g = 0; g < 8; ++g) {
      const int64_t group = blk * 8 + g;
      __m512i sums[ROWS][PANEL_VECTORS];
      for (int r = 0; r < ROWS; ++r)
        for (int v = 0; v < PANEL_VECTORS; ++v) sums[r][v] = _mm512_setzero_si512();
      const uint8_t* wq = panel.q.data() + group * GROUP * PANEL_COLUMNS;
      #pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        __m512i weights[PANEL_VECTORS];
        for (int v = 0; v < PANEL_VECTORS; ++v) weights[v] = _mm512_loadu_si512(wq + (j * PANEL_VECTORS + v) * 64);
        for (int r = 0; r < ROWS; ++r) {
          int32_t four;
          std::memcpy(&four, xq[r] + group * GROUP + 4 * j, 4);
          const __m512i xb = _mm512_set1_epi32(four);
          for (int v = 0; v < PANEL_VECTORS; ++v) sums[r][v] = _mm512_dpbusd_epi32(sums[r][v], weights[v], xb);
        }
      }
      for (int v = 0; v < PANEL_VECTORS; ++v) {
        const __m512 sc = _mm512_loadu_ps(&panel.scale[group * PANEL_COLUMNS + v * PANEL_LANES]);
        const __m512 mn = _mm512_loadu_ps(&panel.minimum[group * PANEL_COLUMNS + v * PANEL_LANES]);
        for (int r = 0; r < ROWS; ++r) {
          partial[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r][v]), sc, partial[r][v]);
          total[r][v] = _mm512_fnmadd_ps(mn, _mm512_set1_ps(x.sx[(r0 + r) * groups + group]), total[r][v]);
        }
      }
    }
    for (int r = 0; r < ROWS; ++r) {
      const __m512 dx = _mm512_set1_ps(x.dx[(r0 + r) * blocks + blk]);
      for (int v = 0; v < PANEL_VECTORS; ++v) {
        total[r][v] = _mm512_fmadd_ps(partial[r][v], dx, total[r][v]);
        partial[r][v] = _mm512_setzero_ps();
      }
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < PANEL_VECTORS; ++v) {
      float* target = y + (r0 + r) * N + n0 + v * PANEL_LANES;
      _mm512_storeu_ps(target, add ? _mm512_add_ps(_mm512_loadu_ps(target), total[r][v]) : total[r][v]);
    }
}

inline bool has_panel_form(int type, int64_t M) { return type == TYPE_Q4_K && M >= PANEL_MIN_ROWS; }

// y[M, N] (+)= x[M, K] @ W^T for a Q4_K W: the panels of PANEL_COLUMNS weight rows, then the last
// N % PANEL_COLUMNS rows as ggml_int8.h's tiles; false, nothing computed, where x cannot be rounded
// (RoundedX8).
inline bool panel_gemm(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, float* y, bool add,
                       int threads) {
  thread_local RoundedX8 callers;  // the caller's, reused; the workers take it by reference
  RoundedX8& rounded = callers;
  if (!rounded.round(x, M, K)) return false;
  const int64_t row_bytes = K / SUPER * 144, panels = N / PANEL_COLUMNS, rest = N - panels * PANEL_COLUMNS;
  kernels::parallel_for(panels + rest, threads, [&](int64_t first, int64_t last) {
    thread_local Q4KPanel panel;
    for (int64_t item = first; item < last; ++item) {
      if (item >= panels) {  // one weight row past the panels
        const int64_t n = panels * PANEL_COLUMNS + (item - panels);
        for (int64_t r0 = 0; r0 < M; r0 += INT8_ROWS)
          int8_cols<1>(TYPE_Q4_K, w, row_bytes, rounded, r0, std::min<int64_t>(M - r0, INT8_ROWS), n, K, N, y, add);
        continue;
      }
      const int64_t n0 = item * PANEL_COLUMNS;
      panel.decode(w, row_bytes, n0, K);
      int64_t r0 = 0;
      for (; r0 + PANEL_ROWS <= M; r0 += PANEL_ROWS) q4_k_panel_tile<PANEL_ROWS>(panel, rounded, r0, K, y, N, n0, add);
      switch (M - r0) {
        case 1: q4_k_panel_tile<1>(panel, rounded, r0, K, y, N, n0, add); break;
        case 2: q4_k_panel_tile<2>(panel, rounded, r0, K, y, N, n0, add); break;
        case 3: q4_k_panel_tile<3>(panel, rounded, r0, K, y, N, n0, add); break;
        default: break;
      }
    }
  });
  return true;
}
