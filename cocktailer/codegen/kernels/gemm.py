"""The float32 GEMM engine in C: register-blocked micro-kernels, packing, blocked drivers.

C[M x N] = A[M x K] @ B[K x N] (+ bias per row), row-major, one worker's tile per call:

- `ck_sgemm_<MR>x<NR>`: Goto-style. A is packed in MC x KC blocks (MR-row panels, k-major),
  B in KC x NR panels by a packer callback (a plain matrix, or the im2col of a convolution,
  packed on the fly), and the micro-kernel keeps an MR x NR tile of C in 24 (or 16) vector
  registers for the whole KC loop. The packed panels live on the worker's stack (<= 160 KiB).
- `ck_sgemv<m>`: for m < 8 rows, where B is read once anyway: no packing, B streamed row by
  row, m x (8 x 16) accumulators.

Vectors are GCC vector extensions of 16 floats: one zmm register with AVX-512, two ymm (or
four xmm) elsewhere, so the same source is the portable fallback. Micro-kernels are generated
here (fully unrolled, named accumulators) rather than left to the auto-vectorizer.

Measured (bench/kernels.py) on a 2-core Zen 4, these reach ~85-95 % of the FMA peak at the
models' GEMM shapes; see the report in bench/kernels.py's docstring.
"""
from __future__ import annotations

VW = 16                       # floats per vector
KC = 256                      # max depth of one packed block
MC_BUDGET = 64                # rows of A packed at once (rounded down to a multiple of MR): 64 KiB
NC_BUDGET = 128               # columns of B packed at once (rounded down to a multiple of NR): 128 KiB
VARIANTS = ((8, 48), (6, 64), (8, 32), (12, 32), (24, 16))   # (MR, NR) micro-kernels on offer
GEMV_ROWS = 7                 # ck_sgemv1 .. ck_sgemv7
GEMV_VECS = {1: 8, 2: 8, 3: 8, 4: 6, 5: 4, 6: 4, 7: 3}


def mc_of(mr: int) -> int:
    return MC_BUDGET // mr * mr


def nc_of(nr: int) -> int:
    return NC_BUDGET // nr * nr


def _ukr(mr: int, nr: int) -> str:
    nv = nr // VW
    acc = [[f"c{r}_{v}" for v in range(nv)] for r in range(mr)]
    L = [f"static void ck_ukr_{mr}x{nr}(int64_t kc, const float* restrict Ap, const float* restrict Bp, "
         f"float* restrict C, int64_t ldc, int mr, int nr, int acc, const float* restrict bias) {{"]
    for r in range(mr):
        L.append("  ck_vf " + ", ".join(f"{a} = {{0}}" for a in acc[r]) + ";")
    L.append("  for (int64_t k = 0; k < kc; ++k) {")
    for v in range(nv):
        L.append(f"    const ck_vf b{v} = *(const ck_vf*)(Bp + k * {nr} + {v * VW});")
    for r in range(mr):
        L.append(f"    {{ const float a = Ap[k * {mr} + {r}]; " + " ".join(f"{acc[r][v]} += a * b{v};" for v in range(nv)) + " }")
    L.append("  }")
    L.append("  if (!acc && bias) {")
    for r in range(mr):
        L.append(f"    {{ const float t = {r} < mr ? bias[{r}] : 0.0f; " + " ".join(f"{acc[r][v]} += t;" for v in range(nv)) + " }")
    L.append("  }")
    L.append(f"  if (mr == {mr} && nr == {nr}) {{")
    L.append("    if (acc) {")
    for r in range(mr):
        L.append("      " + " ".join(f"*(ck_vfu*)(C + {r} * ldc + {v * VW}) += {acc[r][v]};" for v in range(nv)))
    L.append("    } else {")
    for r in range(mr):
        L.append("      " + " ".join(f"*(ck_vfu*)(C + {r} * ldc + {v * VW}) = {acc[r][v]};" for v in range(nv)))
    L.append("    }")
    L.append("  } else {")
    L.append(f"    float t[{mr * nr}] __attribute__((aligned(64)));")
    for r in range(mr):
        L.append("    " + " ".join(f"*(ck_vf*)(t + {r * nr + v * VW}) = {acc[r][v]};" for v in range(nv)))
    L.append("    for (int r = 0; r < mr; ++r) {")
    L.append("      float* c = C + r * ldc; const float* s = t + r * " + str(nr) + ";")
    L.append("      if (acc) { for (int j = 0; j < nr; ++j) c[j] += s[j]; } else { for (int j = 0; j < nr; ++j) c[j] = s[j]; }")
    L.append("    }")
    L.append("  }")
    L.append("}")
    return "\n".join(L)


def _packa(mr: int) -> str:
    return f"""
static void ck_packa_{mr}(const float* restrict A, int64_t lda, int64_t mc, int64_t kc, float* restrict Ap) {{
  for (int64_t i = 0; i < mc; i += {mr}) {{
    const int64_t m = CK_MIN({mr}, mc - i);
    float* ap = Ap + i * kc;
    const float* a = A + i * lda;
    if (m == {mr}) {{
      for (int64_t k = 0; k < kc; ++k)
        for (int r = 0; r < {mr}; ++r) ap[k * {mr} + r] = a[r * lda + k];
    }} else {{
      for (int64_t k = 0; k < kc; ++k)
        for (int r = 0; r < {mr}; ++r) ap[k * {mr} + r] = r < m ? a[r * lda + k] : 0.0f;
    }}
  }}
}}"""


def _packb_mat(nr: int) -> str:
    nv = nr // VW
    full = " ".join(f"*(ck_vf*)(d + {v * VW}) = *(const ck_vfu*)(s + {v * VW});" for v in range(nv))
    return f"""
static void ck_packb_mat_{nr}(const void* ctx, int64_t k0, int64_t kc, int64_t j0, int64_t nr, float* restrict Bp) {{
  const ck_mat* m = (const ck_mat*)ctx;
  const float* b = m->p + k0 * m->ld + j0;
  if (nr == {nr}) {{
    for (int64_t k = 0; k < kc; ++k) {{ const float* s = b + k * m->ld; float* d = Bp + k * {nr}; {full} }}
  }} else {{
    for (int64_t k = 0; k < kc; ++k) {{
      const float* s = b + k * m->ld; float* d = Bp + k * {nr};
      for (int64_t j = 0; j < {nr}; ++j) d[j] = j < nr ? s[j] : 0.0f;
    }}
  }}
}}"""


def _packb_conv(nr: int) -> str:
    """im2col of one panel: rows k = (c, kh, kw) of the weight, columns = output pixels."""
    return f"""
static void ck_packb_conv_{nr}(const void* ctx, int64_t k0, int64_t kc, int64_t j0, int64_t nr, float* restrict Bp) {{
  const ck_conv* g = (const ck_conv*)ctx;
  const int64_t khw = g->kh * g->kw;
  /* the panel's pixels as runs along one output row */
  int64_t run_oh[{nr} + 2], run_ow[{nr} + 2], run_len[{nr} + 2], run_at[{nr} + 2], runs = 0;
  for (int64_t j = 0; j < nr; ) {{
    const int64_t p = j0 + j, oh = p / g->ow, ow = p - oh * g->ow, len = CK_MIN(nr - j, g->ow - ow);
    run_oh[runs] = oh; run_ow[runs] = ow; run_len[runs] = len; run_at[runs] = j; ++runs; j += len;
  }}
  for (int64_t k = 0; k < kc; ++k) {{
    const int64_t kk = k0 + k, c = kk / khw, r = kk - c * khw, ki = r / g->kw, kj = r - ki * g->kw;
    float* d = Bp + k * {nr};
    for (int64_t j = nr; j < {nr}; ++j) d[j] = 0.0f;
    for (int64_t q = 0; q < runs; ++q) {{
      float* dq = d + run_at[q];
      const int64_t len = run_len[q], ih = run_oh[q] * g->sh - g->ph + ki * g->dh;
      if (ih < 0 || ih >= g->h) {{ for (int64_t t = 0; t < len; ++t) dq[t] = 0.0f; continue; }}
      const float* row = g->x + (c * g->h + ih) * g->w;
      /* iw = (ow0 + t) * sw + off is inside [0, w) for t in [lo, hi) */
      const int64_t off = kj * g->dw - g->pw, ow0 = run_ow[q];
      int64_t lo = 0, hi = len;
      while (lo < len && (ow0 + lo) * g->sw + off < 0) ++lo;
      while (hi > lo && (ow0 + hi - 1) * g->sw + off >= g->w) --hi;
      for (int64_t t = 0; t < lo; ++t) dq[t] = 0.0f;
      if (g->sw == 1) {{ const float* s = row + ow0 + off; for (int64_t t = lo; t < hi; ++t) dq[t] = s[t]; }}
      else {{ const float* s = row + ow0 * g->sw + off; for (int64_t t = lo; t < hi; ++t) dq[t] = s[t * g->sw]; }}
      for (int64_t t = hi; t < len; ++t) dq[t] = 0.0f;
    }}
  }}
}}"""


def _driver(mr: int, nr: int) -> str:
    """Both operands packed exactly once when A's rows fit one MC block (kb, jc order);
    otherwise B once and A once per NC columns (jc, kb, mb order)."""
    mc, nc = mc_of(mr), nc_of(nr)
    return f"""
static void ck_sgemm_{mr}x{nr}(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                              ck_packb_fn packb, const void* bctx, int64_t j0,
                              float* C, int64_t ldc, const float* bias) {{
  float Ap[{mc} * {KC}] __attribute__((aligned(64)));
  float Bb[{KC} * {nc}] __attribute__((aligned(64)));
  const int64_t nkb = (K + {KC} - 1) / {KC}, kcb = nkb ? (K + nkb - 1) / nkb : 0;
#define CK_PACK_B(jc, nc)                                                                     \
  for (int64_t p = 0; p * {nr} < (nc); ++p)                                                    \
    packb(bctx, kb, kc, j0 + (jc) + p * {nr}, CK_MIN({nr}, (nc) - p * {nr}), Bb + p * kc * {nr});
#define CK_BLOCK(mb, mc, jc, nc)                                                              \
  for (int64_t p = 0; p * {nr} < (nc); ++p)                                                    \
    for (int64_t i = 0; i < (mc); i += {mr})                                                   \
      ck_ukr_{mr}x{nr}(kc, Ap + i * kc, Bb + p * kc * {nr}, C + ((mb) + i) * ldc + (jc) + p * {nr}, ldc, \
                      (int)CK_MIN({mr}, (mc) - i), (int)CK_MIN({nr}, (nc) - p * {nr}), kb > 0,   \
                      bias ? bias + (mb) + i : 0);
  if (M <= {mc}) {{
    for (int64_t kb = 0; kb < K; kb += kcb) {{
      const int64_t kc = CK_MIN(kcb, K - kb);
      ck_packa_{mr}(A + kb, lda, M, kc, Ap);
      for (int64_t jc = 0; jc < N; jc += {nc}) {{
        const int64_t nc = CK_MIN({nc}, N - jc);
        CK_PACK_B(jc, nc)
        CK_BLOCK(0, M, jc, nc)
      }}
    }}
  }} else {{
    for (int64_t jc = 0; jc < N; jc += {nc}) {{
      const int64_t nc = CK_MIN({nc}, N - jc);
      for (int64_t kb = 0; kb < K; kb += kcb) {{
        const int64_t kc = CK_MIN(kcb, K - kb);
        CK_PACK_B(jc, nc)
        for (int64_t mb = 0; mb < M; mb += {mc}) {{
          const int64_t mc = CK_MIN({mc}, M - mb);
          ck_packa_{mr}(A + mb * lda + kb, lda, mc, kc, Ap);
          CK_BLOCK(mb, mc, jc, nc)
        }}
      }}
    }}
  }}
#undef CK_PACK_B
#undef CK_BLOCK
}}"""


def _gemv(m: int) -> str:
    nv = GEMV_VECS[m]

    def block(nvec: int) -> list[str]:
        acc = [[f"c{r}_{v}" for v in range(nvec)] for r in range(m)]
        L = ["    " + " ".join(f"ck_vf {a} = {{0}};" for row in acc for a in row),
             "    const float* b = B + j;",
             "    for (int64_t k = 0; k < K; ++k, b += ldb) {"]
        for v in range(nvec):
            L.append(f"      const ck_vf b{v} = *(const ck_vfu*)(b + {v * VW});")
        for r in range(m):
            L.append(f"      {{ const float a = A[{r} * lda + k]; " + " ".join(f"{acc[r][v]} += a * b{v};" for v in range(nvec)) + " }")
        L.append("    }")
        for r in range(m):
            L.append("    " + " ".join(f"*(ck_vfu*)(C + {r} * ldc + j + {v * VW}) = {acc[r][v]};" for v in range(nvec)))
        return L

    L = [f"static void ck_sgemv{m}(int64_t K, const float* restrict A, int64_t lda, const float* restrict B, int64_t ldb,",
         "                       float* restrict C, int64_t ldc, int64_t n) {",
         "  int64_t j = 0;",
         f"  for (; j + {nv * VW} <= n; j += {nv * VW}) {{"]
    L += block(nv)
    L.append("  }")
    L.append(f"  for (; j + {VW} <= n; j += {VW}) {{")
    L += block(1)
    L.append("  }")
    L.append("  if (j < n) {")
    L.append(f"    float t[{m}][{VW}] = {{{{0}}}};")
    L.append("    const int64_t nt = n - j;")
    L.append("    for (int64_t k = 0; k < K; ++k) {")
    L.append("      const float* b = B + k * ldb + j;")
    L.append(f"      for (int r = 0; r < {m}; ++r) {{ const float a = A[r * lda + k]; for (int64_t q = 0; q < nt; ++q) t[r][q] += a * b[q]; }}")
    L.append("    }")
    L.append(f"    for (int r = 0; r < {m}; ++r) for (int64_t q = 0; q < nt; ++q) C[r * ldc + j + q] = t[r][q];")
    L.append("  }")
    L.append("}")
    return "\n".join(L)


_HEADER = r"""
typedef float ck_vf __attribute__((vector_size(64), aligned(64), may_alias));
typedef float ck_vfu __attribute__((vector_size(64), aligned(4), may_alias));
/* fills Bp[kc][NR] with rows k0.. and columns j0..j0+nr of B (zeros beyond nr) */
typedef void (*ck_packb_fn)(const void* ctx, int64_t k0, int64_t kc, int64_t j0, int64_t nr, float* restrict Bp);
typedef struct { const float* p; int64_t ld; } ck_mat;
/* one image of a convolution's input, seen as the K x (oh*ow) im2col matrix */
typedef struct { const float* x; int64_t h, w, kh, kw, sh, sw, ph, pw, dh, dw, ow; } ck_conv;
"""


def _build() -> str:
    parts = [_HEADER]
    for mr in sorted({mr for mr, _ in VARIANTS}):
        parts.append(_packa(mr))
    for nr in sorted({nr for _, nr in VARIANTS}):
        parts.append(_packb_mat(nr))
        parts.append(_packb_conv(nr))
    for mr, nr in VARIANTS:
        parts.append(_ukr(mr, nr))
        parts.append(_driver(mr, nr))
    for m in range(1, GEMV_ROWS + 1):
        parts.append(_gemv(m))
    return "\n".join(parts) + "\n"


GEMM_C = _build()


def choose_variant(m: int, n: int) -> tuple[int, int]:
    """The micro-kernel that wastes the least on padding an m x n product (ties: the order of VARIANTS)."""
    def padded(v):
        mr, nr = v
        return (-(-m // mr) * mr) * (-(-n // nr) * nr)
    return min(VARIANTS, key=padded)
