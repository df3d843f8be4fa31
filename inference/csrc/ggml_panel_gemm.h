// The panel products' driver, for both instruction sets: ggml_panels.h's (AVX-512 VNNI) and
// ggml_panels_avx2.h's panels and tiles, included after either inside its namespace (Q4KPanel,
// Q6KPanel, q4_k_panel_tile, q6_k_panel_tile, PANEL_COLUMNS, PANEL_ROWS, panel_min_rows); no include
// guard, on purpose.

template <int ROWS, typename Panel>
inline void panel_tile(const Panel& panel, const RoundedX8& x, int64_t r0, int64_t K, float* y, int64_t N, int64_t n0,
                       bool add) {
  if constexpr (std::is_same_v<Panel, Q4KPanel>)
    q4_k_panel_tile<ROWS>(panel, x, r0, K, y, N, n0, add);
  else
    q6_k_panel_tile<ROWS>(panel, x, r0, K, y, N, n0, add);
}

inline bool has_panel_form(int type, int64_t M) { return (type == TYPE_Q4_K || type == TYPE_Q6_K) && M >= panel_min_rows(type); }

// The panels of a type's weight (Panel: Q4KPanel or Q6KPanel), then its last N % PANEL_COLUMNS rows
// as ggml_int8.h's tiles, x already rounded.
template <typename Panel>
inline void panels(int type, const RoundedX8& rounded, int64_t M, int64_t K, const uint8_t* w, int64_t N, float* y,
                   bool add, int threads) {
  const int64_t row_bytes = K / SUPER * int8_block_bytes(type), full = N / PANEL_COLUMNS;
  kernels::parallel_for(full + N % PANEL_COLUMNS, threads, [&](int64_t first, int64_t last) {
    thread_local Panel panel;
    for (int64_t item = first; item < last; ++item) {
      if (item >= full) {  // one weight row past the panels
        const int64_t n = full * PANEL_COLUMNS + (item - full);
        for (int64_t r0 = 0; r0 < M; r0 += INT8_ROWS)
          int8_cols<1>(type, w, row_bytes, rounded, r0, std::min<int64_t>(M - r0, INT8_ROWS), n, K, N, y, add);
        continue;
      }
      const int64_t n0 = item * PANEL_COLUMNS;
      panel.decode(w, row_bytes, n0, K);
      static_assert(PANEL_ROWS == 4, "the rest of x's rows below is 1 to 3");
      int64_t r0 = 0;
      for (; r0 + PANEL_ROWS <= M; r0 += PANEL_ROWS) panel_tile<PANEL_ROWS>(panel, rounded, r0, K, y, N, n0, add);
      switch (M - r0) {
        case 1: panel_tile<1>(panel, rounded, r0, K, y, N, n0, add); break;
        case 2: panel_tile<2>(panel, rounded, r0, K, y, N, n0, add); break;
        case 3: panel_tile<3>(panel, rounded, r0, K, y, N, n0, add); break;
        default: break;
      }
    }
  });
}

// y[M, N] (+)= x[M, K] @ W^T for a W of has_panel_form's types; false, nothing computed, where x
// cannot be rounded (RoundedX8).
inline bool panel_gemm(int type, const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, float* y, bool add,
                       int threads) {
  RoundedX8& rounded = callers_x();
  if (!rounded.round(x, M, K)) return false;
  if (type == TYPE_Q4_K)
    panels<Q4KPanel>(type, rounded, M, K, w, N, y, add, threads);
  else
    panels<Q6KPanel>(type, rounded, M, K, w, N, y, add, threads);
  return true;
}
