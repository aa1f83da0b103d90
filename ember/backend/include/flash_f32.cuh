
/* ---- flash attention on f32 operands, on CUDA cores (backend/flash.py) ---- */
/* G neighbouring threads hold a row, V = D / G values each: G is the largest power of two up to
   D / 16 (4 below D = 64) whose V is a multiple of 4: D = 16 G and V = 16 for D = 64, 128 and
   256; D = 32, 80 and 96: G = 4, V = 8, 20 and 24 (D = 32 with G = 2 spilled a loop counter in
   dq). float4 c of thread g is columns 4 (c G + g)..+3, so the G threads of a row read 16 G
   consecutive bytes together */
template <int D> EMBER_D constexpr int ember_g32() {
  int g = 1;
  while (2 * g <= (D < 64 ? 4 : D / 16) && (D / 4) % (2 * g) == 0) g *= 2;
  return g;
}
template <int D> EMBER_D constexpr int ember_v32() { return D / ember_g32<D>(); }
template <int D> EMBER_D void ember_row32(float* r, const float* row) {
#pragma unroll
  for (int c = 0; c < ember_v32<D>() / 4; c++)
    *(float4*)(r + 4 * c) = *(const float4*)(row + 4 * (c * ember_g32<D>() + threadIdx.x % ember_g32<D>()));
}
template <int D> EMBER_D void ember_row32_store(float* row, const float* r, float scale) {
#pragma unroll
  for (int c = 0; c < ember_v32<D>() / 4; c++)
    *(float4*)(row + 4 * (c * ember_g32<D>() + threadIdx.x % ember_g32<D>())) =
        make_float4(r[4 * c] * scale, r[4 * c + 1] * scale, r[4 * c + 2] * scale, r[4 * c + 3] * scale);
}
template <int V> EMBER_D float ember_dot32(const float* a, const float* b) {   /* this thread's part of a dot product */
  float acc = 0.f;
#pragma unroll
  for (int e = 0; e < V; e++) acc = fmaf(a[e], b[e], acc);
  return acc;
}
template <int D> EMBER_D float ember_row_total(float x) {   /* summed over the G threads of the row */
#pragma unroll
  for (int o = 1; o < ember_g32<D>(); o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
/* this thread's parts of the dot products of two rows it holds with KC rows of two tiles:
   s[j] = a . ta[j], dp[j] = b . tb[j] */
template <int D, int KC> EMBER_D void ember_dots32(float* s, float* dp, const float* a, const float* ta, const float* b,
                                                   const float* tb) {
  constexpr int V = ember_v32<D>();
#pragma unroll
  for (int j = 0; j < KC; j++) {
    float x[V];
    ember_row32<D>(x, ta + j * D);
    s[j] = ember_dot32<V>(a, x);
    ember_row32<D>(x, tb + j * D);
    dp[j] = ember_dot32<V>(b, x);
  }
}
template <int V> EMBER_D void ember_axpy32(float* acc, float a, const float* x) {
#pragma unroll
  for (int e = 0; e < V; e++) acc[e] = fmaf(a, x[e], acc[e]);
}

/* The forward: 128 threads, two query rows per G threads (a key loaded once serves both), ROWS
   = 256 / G rows a block. Every thread reads the same key at once (a broadcast); keys and values
   arrive in tiles of TILE through a double buffer, and the running max and sum are updated
   every 16 keys. Writes what ember_flash_fwd writes. */
template <int D, int ROWS, int TILE, typename SM>
EMBER_D void ember_flash32_fwd(float* out, const float* q, const float* k, const float* v, int ldq, int ldk,
                               int ldv, int T, int S, const SM& sm) {
  constexpr int G = ember_g32<D>(), V = ember_v32<D>(), KC = 16;
  float *sk = (float*)ember_flash_tiles<false>(), *sv = sk + 2 * TILE * D;
  const int nb = blockIdx.y, row0 = (gridDim.x - 1 - blockIdx.x) * ROWS, last = min(row0 + ROWS, T) - 1;
  const int r0 = row0 + threadIdx.x / G * 2;   /* this thread's rows: r0 and r0 + 1 */
  const int2 span = ember_flash_span<TILE, false>(sm, nb, row0, last, S);
  const int first = span.x, tiles = span.y;
  ember_tiles_at<D, TILE>(sk, k, ldk, sv, v, ldv, first, tiles, S);
  ember_cp_async_commit();
  float qr[2][V], o[2][V], m[2], l[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    m[h] = -INFINITY;
    l[h] = 0.f;
#pragma unroll
    for (int e = 0; e < V; e++) qr[h][e] = o[h][e] = 0.f;
    if (r0 + h < T) ember_row32<D>(qr[h], q + (size_t)(r0 + h) * ldq);
  }
  for (int t = first; t < tiles; t++) {
    ember_next_tiles<D, TILE>(sk, k, ldk, sv, v, ldv, t, tiles, S);
    const float *ck = sk + (t & 1) * TILE * D, *cv = sv + (t & 1) * TILE * D;
#pragma unroll 1
    for (int j0 = 0; j0 < TILE; j0 += KC) {
      const int col0 = t * TILE + j0;
      float s[2][KC];
#pragma unroll
      for (int j = 0; j < KC; j++) {
        float x[V];
        ember_row32<D>(x, ck + (j0 + j) * D);
        s[0][j] = ember_dot32<V>(qr[0], x);
        s[1][j] = ember_dot32<V>(qr[1], x);
      }
      const bool edge = ember_flash_edge<KC, false>(sm, nb, row0, last, col0, S);   /* the same for the block */
#pragma unroll
      for (int h = 0; h < 2; h++) {
        float mx = m[h];
        const int i = min(r0 + h, T - 1);
#pragma unroll
        for (int j = 0; j < KC; j++) {
          const float x = ember_row_total<D>(s[h][j]);
          s[h][j] = !edge ? sm.template score<false>(x, nb, i, col0 + j)
                          : col0 + j < S ? sm.template score<true>(x, nb, i, col0 + j) : -INFINITY;
          mx = fmaxf(mx, s[h][j]);
        }
        const float base = mx == -INFINITY ? 0.f : mx;   /* no key seen yet: every weight is 0 */
        const float r = ember_ex2(m[h] - base);
        m[h] = mx;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < KC; j++) {
          s[h][j] = ember_ex2(s[h][j] - base);
          sum += s[h][j];
        }
        l[h] = l[h] * r + sum;
#pragma unroll
        for (int e = 0; e < V; e++) o[h][e] *= r;
      }
#pragma unroll
      for (int j = 0; j < KC; j++) {
        float x[V];
        ember_row32<D>(x, cv + (j0 + j) * D);
        ember_axpy32<V>(o[0], s[0][j], x);
        ember_axpy32<V>(o[1], s[1][j], x);
      }
    }
    __syncthreads();   /* this slot is filled again two tiles on */
  }
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int row = r0 + h;
    if (row >= T) continue;
    float* dst = out + ((size_t)nb * T + row) * (D + 1);
    const float inv = 1.f / l[h];
#pragma unroll
    for (int c4 = 0; c4 < V / 4; c4++)
#pragma unroll
      for (int e = 0; e < 4; e++) dst[4 * (c4 * G + threadIdx.x % G) + e] = o[h][4 * c4 + e] * inv;
    if (threadIdx.x % G == 0) dst[D] = m[h] + log2f(l[h]);
  }
}

/* The backward on f32 operands: a row (a query's for dq, a key's for dk|dv) per G threads, ROWS
   = 128 / G a block, the other side's rows streamed through a double buffer in tiles of TILE
   and taken 8 at a time: p = exp2(score - lse), ds = p (dp - rowsum(do o)) [times the score's
   derivative: DGRAD], the score graph with its masks on every element. */
template <bool DGRAD, typename SM>
EMBER_D float ember_flash32_ds(const SM& sm, float x, float dp, int nb, int i, int j, float lse, float di) {
  const float p = ember_ex2(sm.template score<true>(x, nb, i, j) - lse);
  return DGRAD ? p * (dp - di) * sm.template grad<true>(x, nb, i, j) : p * (dp - di);
}
template <int D, int ROWS, int TILE, bool DGRAD, typename SM>
EMBER_D void ember_flash32_dq(float* out, const float* q, const float* k, const float* v, const float* packed,
                              const float* dout, const float* di, int ldq, int ldk, int ldv, int T, int S,
                              float cs, const SM& sm) {
  constexpr int G = ember_g32<D>(), V = ember_v32<D>(), KC = 8;
  float *sk = (float*)ember_flash_tiles<false>(), *sv = sk + 2 * TILE * D;
  const int nb = blockIdx.y, row0 = (gridDim.x - 1 - blockIdx.x) * ROWS;
  const int row = row0 + threadIdx.x / G;
  const bool live = row < T;
  const int2 span = ember_flash_span<TILE, false>(sm, nb, row0, min(row0 + ROWS, T) - 1, S);
  const int first = span.x, tiles = span.y;
  ember_tiles_at<D, TILE>(sk, k, ldk, sv, v, ldv, first, tiles, S);
  ember_cp_async_commit();
  float qr[V], dor[V], acc[V];
#pragma unroll
  for (int e = 0; e < V; e++) qr[e] = dor[e] = acc[e] = 0.f;
  if (live) {
    ember_row32<D>(qr, q + (size_t)row * ldq);
    ember_row32<D>(dor, dout + (size_t)row * D);
  }
  const float lse = live ? packed[(size_t)row * (D + 1) + D] : 0.f, dd = live ? di[row] : 0.f;
  for (int t = first; t < tiles; t++) {
    ember_next_tiles<D, TILE>(sk, k, ldk, sv, v, ldv, t, tiles, S);
    const float *ck = sk + (t & 1) * TILE * D, *cv = sv + (t & 1) * TILE * D;
#pragma unroll 1
    for (int j0 = 0; j0 < TILE; j0 += KC) {
      const int col0 = t * TILE + j0;
      float s[KC], dp[KC];
      ember_dots32<D, KC>(s, dp, qr, ck + j0 * D, dor, cv + j0 * D);
#pragma unroll
      for (int j = 0; j < KC; j++) {
        const float sj = ember_row_total<D>(s[j]), dpj = ember_row_total<D>(dp[j]);   /* every lane shuffles */
        const float ds = ember_flash32_ds<DGRAD>(sm, sj, dpj, nb, min(row, T - 1), min(col0 + j, S - 1), lse, dd);
        s[j] = live && col0 + j < S ? ds : 0.f;
      }
#pragma unroll
      for (int j = 0; j < KC; j++) {
        float x[V];
        ember_row32<D>(x, ck + (j0 + j) * D);
        ember_axpy32<V>(acc, s[j], x);
      }
    }
    __syncthreads();
  }
  if (live) ember_row32_store<D>(out + ((size_t)nb * T + row) * D, acc, cs);
}

template <int D, int ROWS, int TILE, bool DGRAD, typename SM>
EMBER_D void ember_flash32_dkdv(float* out, const float* q, const float* k, const float* v, const float* packed,
                                const float* dout, const float* di, int ldq, int ldk, int ldv, int T, int S,
                                float cs, const SM& sm) {
  constexpr int G = ember_g32<D>(), V = ember_v32<D>(), KC = 8;
  float *sq = (float*)ember_flash_tiles<false>(), *sdo = sq + 2 * TILE * D;
  const int nb = blockIdx.y, key0 = blockIdx.x * ROWS, key = key0 + threadIdx.x / G;
  const bool live = key < S;
  const int2 span = ember_flash_span<TILE, true>(sm, nb, key0, min(key0 + ROWS, S) - 1, T);
  const int first = span.x, tiles = span.y;
  ember_tiles_at<D, TILE>(sq, q, ldq, sdo, dout, D, first, tiles, T);
  ember_cp_async_commit();
  float kr[V], vr[V], dk[V], dv[V];
#pragma unroll
  for (int e = 0; e < V; e++) kr[e] = vr[e] = dk[e] = dv[e] = 0.f;
  if (live) {
    ember_row32<D>(kr, k + (size_t)key * ldk);
    ember_row32<D>(vr, v + (size_t)key * ldv);
  }
  for (int t = first; t < tiles; t++) {
    ember_next_tiles<D, TILE>(sq, q, ldq, sdo, dout, D, t, tiles, T);
    const float *cq = sq + (t & 1) * TILE * D, *cdo = sdo + (t & 1) * TILE * D;
#pragma unroll 1
    for (int i0 = 0; i0 < TILE; i0 += KC) {
      const int qi0 = t * TILE + i0;
      float s[KC], dp[KC];
      ember_dots32<D, KC>(s, dp, kr, cq + i0 * D, vr, cdo + i0 * D);
#pragma unroll
      for (int i = 0; i < KC; i++) {
        const int qi = qi0 + i;
        const float si = ember_row_total<D>(s[i]), dpi = ember_row_total<D>(dp[i]);   /* every lane shuffles */
        const bool ok = live && qi < T;
        const int qc = min(qi, T - 1), kc = min(key, S - 1);   /* in bounds for the score graph's loads */
        const float p = ember_ex2(sm.template score<true>(si, nb, qc, kc) - packed[(size_t)qc * (D + 1) + D]);
        s[i] = ok ? p : 0.f;
        dp[i] = ok ? p * (dpi - di[qc]) * (DGRAD ? sm.template grad<true>(si, nb, qc, kc) : 1.f) : 0.f;
      }
#pragma unroll
      for (int i = 0; i < KC; i++) {
        float x[V];
        ember_row32<D>(x, cdo + (i0 + i) * D);
        ember_axpy32<V>(dv, s[i], x);
        ember_row32<D>(x, cq + (i0 + i) * D);
        ember_axpy32<V>(dk, dp[i], x);
      }
    }
    __syncthreads();
  }
  if (live) {
    ember_row32_store<D>(out + ((size_t)nb * S + key) * 2 * D, dk, cs);
    ember_row32_store<D>(out + ((size_t)nb * S + key) * 2 * D + D, dv, 1.f);
  }
}
