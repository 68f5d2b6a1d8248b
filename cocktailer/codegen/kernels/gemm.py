"""The float32 GEMM engine in C: register-blocked micro-kernels, packing, blocked drivers.

C[M x N] = A[M x K] @ B[K x N] (+ bias per row), row-major, one worker's tile per call:

- `ck_sgemm_<MR>x<NR>`: Goto-style. B is packed once, in KC x NC blocks of NR-wide panels, by a
  packer callback: a plain matrix, or the im2col of a convolution built on the fly (the images
  of a batch side by side as columns, so small images waste no padding; AVX-512 masked loads
  at the image edges). A is packed in MC x KC blocks of MR-row, k-major panels (16 x MR blocks
  transposed in registers). The micro-kernel keeps an MR x NR tile of C in 24 (8x48) or 16
  (8x32, 16x16) vector registers for the whole KC loop. When A's rows fit one MC block both
  operands are packed exactly once; otherwise A is packed again for every NC (then 512)
  columns.
- the convolution pieces (im2col packer, direct convolution) are in convgemm.py.
- `ck_sgemv<m>`: for m < 8 rows, where B is read once anyway: no packing, B streamed row by
  row into m x (up to 8 x 16) accumulators.

Packed blocks live on the worker's stack: 64 KiB of A and 128 KiB of B (512 KiB when A is
taller than MC), no allocation. Vectors are GCC vector extensions of 16 floats: one zmm
register with AVX-512, two ymm (or four xmm) elsewhere, so the same source is the portable
fallback (tested with -mno-avx512f); AVX-512 intrinsics appear only under `#ifdef
__AVX512F__`, each with a plain-C alternative. Micro-kernels are generated here (unrolled,
named accumulators) rather than left to the auto-vectorizer.

Without AVX-512 (AVX2's 16 ymm registers), a micro-kernel computes its tile in sub-tiles whose
accumulators, B vectors and A broadcast fit the registers (`_subtiles`), and a GEMV sweeps B a
row at a time into L1 accumulators (`_gemv_sweep`).

Measured with bench/kernels.py (2 workers, against torch's MKL/oneDNN at 2 threads): on a
2-core Zen 4, 140-190 GFLOP/s at the models' GEMM shapes (MKL: 110-150), batch-1 GEMVs 2-4x
faster than torch's; MKL's own sgemm_ called per worker tile was measured too and was never
faster there. On a 2-core AVX2 Zen the GEMMs took 0.85-1.35x the time of torch's matmul and
the GEMVs 0.54-0.60x; MKL's sgemm_ per worker tile took less time than the micro-kernels at
every GEMM shape measured but one (lstm's 64 x 256 @ 256 x 1024, even): 7-31% less at the
models' 64-row shapes, 18-25% at 31 and 1984 rows, 12-49% at 8-24 rows. So without AVX-512
the packed GEMM's tiles call it (`blas_tiles`; matmul.py); GEMVs and convolutions keep the
code here.
"""
from __future__ import annotations

import ctypes
import functools
import os

import torch

from cocktailer.runtime.compiler import TORCH_LIB, native_has_avx512

VW = 16                       # floats per vector
KC = 256                      # max depth of one packed block
MC_BUDGET = 64                # rows of A packed at once (rounded down to a multiple of MR): 64 KiB
NC_BUDGET = 128               # columns of B packed at once (rounded down to a multiple of NR): 128 KiB
NC_BIG = 512                  # ... when A is taller than MC and packed again per block of B: 512 KiB
VARIANTS = ((8, 48), (8, 32), (16, 16))   # (MR, NR) micro-kernels on offer
GEMV_ROWS = 7                 # ck_sgemv1 .. ck_sgemv7
GEMV_VECS = {1: 8, 2: 8, 3: 8, 4: 6, 5: 4, 6: 4, 7: 3}   # accumulators per row, AVX-512 (32 zmm)
GEMV_SWEEP = 512   # columns of C a row sweep of B adds into (m x 2 KiB of L1), without AVX-512


def mc_of(mr: int) -> int:
    return MC_BUDGET // mr * mr


def nc_of(nr: int) -> int:
    return NC_BUDGET // nr * nr


def _ukr(mr: int, nr: int) -> str:
    """C's MR x NR tile += Ap panel x Bp panel over kc. With AVX-512 the tile lives in 24 (8x48)
    or 16 zmm accumulators; elsewhere (AVX2's 16 ymm registers would hold a third of it, and
    GCC spilled accumulators on every k: 9.7 ms for a 64x256x768 GEMM on one core, 1.3 ms for a
    naive loop) it is computed in sub-tiles that fit the registers (`_subtiles`)."""
    L = [f"CK_NOIPA static void ck_ukr_{mr}x{nr}(int64_t kc, const float* restrict Ap, const float* restrict Bp, "
         f"float* C, int64_t ldc, int mr, int nr, int acc, const float* restrict bias, int64_t off, int64_t cols, "
         f"int64_t cstride) {{",
         "#ifdef __AVX512F__"]
    acc = _accumulators(mr, nr)
    for r in range(mr):
        L.append("  ck_vf " + ", ".join(f"{a} = {{0}}" for a in acc[r]) + ";")
    L.append("  for (int64_t k = 0; k < kc; ++k) {")
    for v in range(nr // VW):
        L.append(f"    const ck_vf b{v} = *(const ck_vf*)(Bp + k * {nr} + {v * VW});")
    for r in range(mr):
        L.append(f"    {{ const float a = Ap[k * {mr} + {r}]; " + " ".join(f"{acc[r][v]} += a * b{v};"
                                                                           for v in range(nr // VW)) + " }")
    L.append("  }")
    L.append(register_epilogue(mr, nr))
    L.append("#else")
    L.append(f"  float t[{mr * nr}] __attribute__((aligned(64)));")
    for r0, rows, c0, vecs in _subtiles(mr, nr):
        L += _subtile(mr, nr, r0, rows, c0, vecs)
    L += _tile_epilogue(mr, nr)
    L.append("#endif")
    L.append("}")
    return "\n".join(L)


def _accumulators(mr: int, nr: int) -> list[list[str]]:
    return [[f"c{r}_{v}" for v in range(nr // VW)] for r in range(mr)]


YMM_FLOATS = 8          # floats per AVX2 vector
YMM_REGISTERS = 16      # AVX2's: a sub-tile's accumulators, B's vectors and A's broadcast


def _subtiles(mr: int, nr: int) -> list[tuple[int, int, int, int]]:
    """(first row, rows, first column, vectors) of the sub-tiles an MR x NR tile is computed in
    without AVX-512: each sub-tile's accumulators, B's vectors and A's broadcast in the
    YMM_REGISTERS, shaped for the most multiply-adds per load (rows * vectors / (rows +
    vectors): 4x24 is 1.71, BLIS's 6x16 on Haswell 1.5)."""
    vectors = nr // YMM_FLOATS
    shapes = [(rows, v) for v in range(1, vectors + 1) if vectors % v == 0
              for rows in range(1, mr + 1) if rows * v + v + 1 <= YMM_REGISTERS]
    rows, vecs = max(shapes, key=lambda s: (s[0] * s[1] / (s[0] + s[1]), s[0] * s[1]))
    return [(r0, min(rows, mr - r0), c0, vecs)
            for r0 in range(0, mr, rows) for c0 in range(0, nr, vecs * YMM_FLOATS)]


def _subtile(mr: int, nr: int, r0: int, rows: int, c0: int, vecs: int) -> list[str]:
    """C statements: rows r0.. and columns c0.. of the tile, accumulated in ymm vectors, into t."""
    acc = [[f"s{r}_{v}" for v in range(vecs)] for r in range(rows)]
    L = [f"  {{   /* rows {r0}..{r0 + rows - 1}, columns {c0}..{c0 + vecs * YMM_FLOATS - 1} */",
         "    " + " ".join(f"ck_v8 {a} = {{0}};" for row in acc for a in row),
         "    for (int64_t k = 0; k < kc; ++k) {"]
    for v in range(vecs):
        L.append(f"      ck_v8 b{v} = *(const ck_v8u*)(Bp + k * {nr} + {c0 + v * YMM_FLOATS});")
    # B's vectors in registers, each loaded once: GCC otherwise folds the load into every row's
    # multiply-add (a load per FMA: more loads than the core issues per cycle)
    L.append("      __asm__(\"\" : " + ", ".join(f'\"+x\"(b{v})' for v in range(vecs)) + ");")
    for r in range(rows):
        L.append(f"      {{ const float a = Ap[k * {mr} + {r0 + r}]; "
                 + " ".join(f"{acc[r][v]} += a * b{v};" for v in range(vecs)) + " }")
    L.append("    }")
    for r in range(rows):
        L.append("    " + " ".join(f"*(ck_v8*)(t + {(r0 + r) * nr + c0 + v * YMM_FLOATS}) = {acc[r][v]};"
                                   for v in range(vecs)))
    L.append("  }")
    return L


def register_epilogue(mr: int, nr: int) -> str:
    """C statements after the k loop of a micro-kernel whose tile is in the accumulators
    `_accumulators(mr, nr)`: the bias added (first block of K only), then the tile stored or
    added into C (through a buffer where the tile is partial or runs on into the next images)."""
    nv = nr // VW
    acc = _accumulators(mr, nr)
    L = ["  if (!acc && bias) {"]
    for r in range(mr):
        L.append(f"    {{ const float t = {r} < mr ? bias[{r}] : 0.0f; " + " ".join(f"{acc[r][v]} += t;" for v in range(nv)) + " }")
    L.append("  }")
    L.append(f"  if (mr == {mr} && nr == {nr} && off + {nr} <= cols) {{")
    L.append("    C += off;")
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
    L += _partial_store(nr)
    L.append("  }")
    return "\n".join(L)


def _tile_epilogue(mr: int, nr: int) -> list[str]:
    """`register_epilogue` for a tile computed into the buffer t."""
    return ["  if (!acc && bias)",
            f"    for (int r = 0; r < mr; ++r) for (int j = 0; j < {nr}; ++j) t[r * {nr} + j] += bias[r];",
            f"  if (mr == {mr} && nr == {nr} && off + {nr} <= cols) {{",
            "    C += off;",
            f"    for (int r = 0; r < {mr}; ++r) {{",
            f"      float* c = C + r * ldc; const float* s = t + r * {nr};",
            f"      if (acc) {{ for (int j = 0; j < {nr}; ++j) c[j] += s[j]; }} "
            f"else {{ for (int j = 0; j < {nr}; ++j) c[j] = s[j]; }}",
            "    }",
            "  } else {",
            *_partial_store(nr),
            "  }"]


def _partial_store(nr: int) -> list[str]:
    """C statements: the tile in t (mr x nr of it) stored or added into C, column by column."""
    return ["    /* column j is column off + j of the image row at C, which may run on into the next images */",
            "    for (int j0 = 0, img = 0, col = (int)off; j0 < nr; ) {",
            "      while (col >= cols) { col -= (int)cols; ++img; }",
            "      const int n = (int)CK_MIN(nr - j0, cols - col);",
            "      for (int r = 0; r < mr; ++r) {",
            f"        float* c = C + r * ldc + img * cstride + col; const float* s = t + r * {nr} + j0;",
            "        if (acc) { for (int j = 0; j < n; ++j) c[j] += s[j]; } else { for (int j = 0; j < n; ++j) c[j] = s[j]; }",
            "      }",
            "      j0 += n; col += n;",
            "    }"]


def _transpose_block(mr: int) -> list[str]:
    """C statements: rows v0..v{mr-1} (16 consecutive k each) -> the k-major panel layout
    ap[k * mr + r], as mr vectors o0..: log2(mr) rounds of zipping vector i with i + mr/2
    (GCC turns each zip into one two-source permute, vpermt2ps with AVX-512)."""
    lines, cur, n = [], [f"v{r}" for r in range(mr)], 0
    while len(cur) > 1 and 2 ** n < mr:
        h, nxt = mr // 2, []
        for i in range(h):
            lo, hi = f"z{n}_{2 * i}", f"z{n}_{2 * i + 1}"
            lines.append(f"const ck_vf {lo} = __builtin_shuffle({cur[i]}, {cur[i + h]}, ck_zip_lo), "
                         f"{hi} = __builtin_shuffle({cur[i]}, {cur[i + h]}, ck_zip_hi);")
            nxt += [lo, hi]
        cur, n = nxt, n + 1
    return lines + [f"*(ck_vfu*)(ap + k * {mr} + {16 * o}) = {v};" for o, v in enumerate(cur)]


def _packa(mr: int) -> str:
    """A's rows i..i+mr as a k-major panel: full 16 x mr blocks transposed in registers."""
    loads = " ".join(f"const ck_vf v{r} = *(const ck_vfu*)(a + {r} * lda + k);" for r in range(mr))
    body = "\n          ".join(_transpose_block(mr))
    return f"""
CK_NOIPA static void ck_packa_{mr}(const float* restrict A, int64_t lda, int64_t mc, int64_t kc, float* restrict Ap) {{
  for (int64_t i = 0; i < mc; i += {mr}) {{
    const int64_t m = CK_MIN({mr}, mc - i);
    float* ap = Ap + i * kc;
    const float* a = A + i * lda;
    int64_t k = 0;
    if (m == {mr}) {{
      for (; k + 16 <= kc; k += 16) {{
          {loads}
          {body}
      }}
    }}
    for (; k < kc; ++k)
      for (int r = 0; r < {mr}; ++r) ap[k * {mr} + r] = r < m ? a[r * lda + k] : 0.0f;
  }}
}}"""


def _packb_mat(nr: int) -> str:
    nv = nr // VW
    full = " ".join(f"*(ck_vf*)(d + {v * VW}) = *(const ck_vfu*)(s + {v * VW});" for v in range(nv))
    return f"""
CK_NOIPA static void ck_packb_mat_{nr}(const void* ctx, int64_t k0, int64_t kc, int64_t j0, int64_t nr, float* restrict Bp) {{
  const ck_mat* m = (const ck_mat*)ctx;
  const int64_t img = j0 / m->cols, col = j0 - img * m->cols;
  const float* b = m->p + k0 * m->ld + img * m->istride + col;
  if (nr == {nr} && col + nr <= m->cols) {{
    for (int64_t k = 0; k < kc; ++k) {{ const float* s = b + k * m->ld; float* d = Bp + k * {nr}; {full} }}
  }} else {{   /* a partial panel, or one that runs on into the next images */
    int64_t src[{nr}] = {{0}};
    for (int64_t j = 0, i = img, c = col; j < nr; ++j, ++c) {{
      if (c == m->cols) {{ c = 0; ++i; }}
      src[j] = i * m->istride + c;
    }}
    for (int64_t k = 0; k < kc; ++k) {{
      const float* s = m->p + (k0 + k) * m->ld; float* d = Bp + k * {nr};
      for (int64_t j = 0; j < {nr}; ++j) d[j] = j < nr ? s[src[j]] : 0.0f;
    }}
  }}
}}"""


def _packb_tr(nr: int) -> str:
    """B read transposed (a view `passes.views` folds into the product): B[k][J] = p[J * ld + k],
    each of the panel's columns one contiguous run of the buffer."""
    return f"""
CK_NOIPA static void ck_packb_tr_{nr}(const void* ctx, int64_t k0, int64_t kc, int64_t j0, int64_t nr, float* restrict Bp) {{
  const ck_mat* m = (const ck_mat*)ctx;
  for (int64_t j = 0; j < {nr}; ++j) {{
    float* d = Bp + j;
    if (j < nr) {{ const float* s = m->p + (j0 + j) * m->ld + k0; for (int64_t k = 0; k < kc; ++k) d[k * {nr}] = s[k]; }}
    else for (int64_t k = 0; k < kc; ++k) d[k * {nr}] = 0.0f;
  }}
}}"""


def _driver(mr: int, nr: int) -> str:
    """Both operands packed exactly once when A's rows fit one MC block (kb, jc order);
    otherwise B once and A once per NC columns (jc, kb, mb order)."""
    mc, nc, nc_big = mc_of(mr), nc_of(nr), NC_BIG // nr * nr
    return f"""
CK_NOIPA static void ck_sgemm_{mr}x{nr}(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                              ck_packb_fn packb, const void* bctx, int64_t j0,
                              float* C, int64_t ldc, int64_t cols, int64_t cstride, const float* bias) {{
  /* B's block: wider when A is packed again for each block (A taller than MC), so A is read fewer times */
  const int64_t NC = CK_MIN(M <= {mc} ? {nc} : {nc_big}, (N + {nr} - 1) / {nr} * {nr});
  float Ap[{mc} * {KC}] __attribute__((aligned(64)));
  float Bb[{KC} * NC] __attribute__((aligned(64)));
  const int64_t nkb = (K + {KC} - 1) / {KC}, kcb = nkb ? (K + nkb - 1) / nkb : 0;
#define CK_PACK_B(jc, nc)                                                                     \
  if (packb) for (int64_t p = 0; p * {nr} < (nc); ++p)                                         \
    packb(bctx, kb, kc, j0 + (jc) + p * {nr}, CK_MIN({nr}, (nc) - p * {nr}), Bb + p * kc * {nr});
#define CK_BPANEL(jc, panel) (packb ? Bb + (panel) * kc * {nr} :                               \
  ((const ck_prepacked*)bctx)->p + kb * ((const ck_prepacked*)bctx)->npad + ((j0 + (jc)) / {nr} + (panel)) * kc * {nr})
#define CK_BLOCK(mb, mc, jc, nc)                                                              \\
  for (int64_t p = 0; p * {nr} < (nc); ++p) {{                                                 \\
    const int64_t J = j0 + (jc) + p * {nr};   /* global column: image J / cols, column J % cols */ \\
    float* row0 = C + (J / cols) * cstride;                                                   \\
    for (int64_t i = 0; i < (mc); i += {mr})                                                   \\
      ck_ukr_{mr}x{nr}(kc, Ap + i * kc, CK_BPANEL(jc, p), row0 + ((mb) + i) * ldc, ldc,          \\
                      (int)CK_MIN({mr}, (mc) - i), (int)CK_MIN({nr}, (nc) - p * {nr}), kb > 0,   \\
                      bias ? bias + (mb) + i : 0, J % cols, cols, cstride);                     \\
  }}
  if (M <= {mc}) {{
    for (int64_t kb = 0; kb < K; kb += kcb) {{
      const int64_t kc = CK_MIN(kcb, K - kb);
      ck_packa_{mr}(A + kb, lda, M, kc, Ap);
      for (int64_t jc = 0; jc < N; jc += NC) {{
        const int64_t nc = CK_MIN(NC, N - jc);
        CK_PACK_B(jc, nc)
        CK_BLOCK(0, M, jc, nc)
      }}
    }}
  }} else {{
    for (int64_t jc = 0; jc < N; jc += NC) {{
      const int64_t nc = CK_MIN(NC, N - jc);
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
#undef CK_BPANEL
#undef CK_BLOCK
}}"""


def _gemv(m: int) -> str:
    return "\n".join(["#ifdef __AVX512F__", _gemv_blocks(m, GEMV_VECS[m]), "#else", _gemv_sweep(m), "#endif"])


def _gemv_sweep(m: int) -> str:
    """ck_sgemv<m> without AVX-512: B streamed a row at a time (contiguous: the prefetcher's
    best case), each row times A's column added into m rows of GEMV_SWEEP accumulators kept in
    L1. Reading B a column block at a time down all K rows (`_gemv_blocks`, with AVX-512) was
    4-15x slower on a Zen 3 core (1x256 @ 256x1024: 115 us against 27; m = 7: 1155 against 87)."""
    a = " ".join(f"const float a{r} = A[{r} * lda + k];" for r in range(m))
    update = " ".join(f"acc[{r}][j] += a{r} * bj;" for r in range(m))
    return f"""CK_NOIPA static void ck_sgemv{m}(int64_t K, const float* restrict A, int64_t lda, const float* restrict B, int64_t ldb,
                       float* restrict C, int64_t ldc, int64_t n) {{
  for (int64_t j0 = 0; j0 < n; j0 += {GEMV_SWEEP}) {{
    const int64_t nb = CK_MIN({GEMV_SWEEP}, n - j0);
    float acc[{m}][{GEMV_SWEEP}] __attribute__((aligned(64)));
    for (int r = 0; r < {m}; ++r) for (int64_t j = 0; j < nb; ++j) acc[r][j] = 0.0f;
    for (int64_t k = 0; k < K; ++k) {{
      const float* restrict b = B + k * ldb + j0;
      {a}
      for (int64_t j = 0; j < nb; ++j) {{ const float bj = b[j]; {update} }}
    }}
    for (int r = 0; r < {m}; ++r) for (int64_t j = 0; j < nb; ++j) C[r * ldc + j0 + j] = acc[r][j];
  }}
}}"""


def _gemv_blocks(m: int, nv: int) -> str:

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

    L = [f"CK_NOIPA static void ck_sgemv{m}(int64_t K, const float* restrict A, int64_t lda, const float* restrict B, int64_t ldb,",
         "                       float* restrict C, int64_t ldc, int64_t n) {",
         "  int64_t j = 0;",
         f"  for (; j + {nv * VW} <= n; j += {nv * VW}) {{"]
    L += block(nv)
    L.append("  }")
    if nv > 1:   # the whole vectors left, as one block: independent accumulators, not one chain each
        L.append(f"  switch ((n - j) / {VW}) {{")
        for k in range(1, nv):
            L.append(f"  case {k}: {{")
            L += block(k)
            L.append(f"    j += {k * VW}; break;")
            L.append("  }")
        L.append("  default: break;")
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
#ifdef __AVX512F__
#include <immintrin.h>
#endif
/* Not inlined nor specialized on constant arguments: with the strides of C known, GCC's
   predictive commoning sees rows of C meet at a fixed distance and keeps values of C in
   registers across iterations, storing back stale values into columns another worker owns
   (a store data race it invents). Opaque strides keep every store where the source puts it. */
#define CK_NOIPA __attribute__((noipa))
typedef float ck_vf __attribute__((vector_size(64), aligned(64), may_alias));
typedef float ck_vfu __attribute__((vector_size(64), aligned(4), may_alias));
typedef int32_t ck_vi __attribute__((vector_size(64)));
typedef float ck_v8 __attribute__((vector_size(32), aligned(32), may_alias));   /* one AVX2 register */
typedef float ck_v8u __attribute__((vector_size(32), aligned(4), may_alias));
static const ck_vi ck_zip_lo = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
static const ck_vi ck_zip_hi = {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
/* fills Bp[kc][NR] with rows k0.. and columns j0..j0+nr of B (zeros beyond nr) */
typedef void (*ck_packb_fn)(const void* ctx, int64_t k0, int64_t kc, int64_t j0, int64_t nr, float* restrict Bp);
/* B[k][J] = p[k * ld + (J / cols) * istride + J % cols]: a matrix, or the images of a batch side by side */
typedef struct { const float* p; int64_t ld, cols, istride; } ck_mat;
/* A constant B packed ahead of time (prepack_b): with packb == NULL, bctx points to one of these
   and the driver reads its panels where they are: the panel of rows kb.. and columns J..J+NR
   is at p + kb * npad + (J / NR) * kc * NR, npad = N rounded up to NR. */
typedef struct { const float* p; int64_t npad; } ck_prepacked;
"""


def _build() -> str:
    parts = [_HEADER]
    for mr in sorted({mr for mr, _ in VARIANTS}):
        parts.append(_packa(mr))
    for nr in sorted({nr for _, nr in VARIANTS}):
        parts.append(_packb_mat(nr))
        parts.append(_packb_tr(nr))
    for mr, nr in VARIANTS:
        parts.append(_ukr(mr, nr))
        parts.append(_driver(mr, nr))
    for m in range(1, GEMV_ROWS + 1):
        parts.append(_gemv(m))
    return "\n".join(parts) + "\n"


GEMM_C = _build()


def k_blocks(k: int) -> int:
    """Rows of B per packed block (the driver's kcb): K split into equal blocks of at most KC."""
    nkb = -(-k // KC)
    return -(-k // nkb) if nkb else 0


def prepack_b(b: torch.Tensor, nr: int) -> torch.Tensor:
    """B (K x N, float32) in the layout the driver reads a prepacked B in: per block of kcb
    rows, NR-wide panels of kc x NR floats, zero-padded to npad = N rounded up to NR. One copy
    of B (a program's weights are packed at every load)."""
    k, n = b.shape
    if not k:
        return torch.zeros(1)
    npad, full = -(-n // nr) * nr, n // nr
    src = b.detach().float()
    out = torch.empty(k * npad)
    kcb = k_blocks(k)
    for kb in range(0, k, kcb):
        kc = min(kcb, k - kb)
        panels = out[kb * npad:(kb + kc) * npad].view(npad // nr, kc, nr)
        rows = src[kb:kb + kc]
        if full:
            panels[:full].copy_(rows[:, :full * nr].unflatten(1, (full, nr)).permute(1, 0, 2))
        if full * nr < n:
            panels[full, :, :n - full * nr].copy_(rows[:, full * nr:])
            panels[full, :, n - full * nr:].zero_()
    return out


def choose_variant(m: int, n: int) -> tuple[int, int]:
    """The micro-kernel that wastes the least on padding an m x n product (ties: the order of
    VARIANTS). Without AVX-512 the variants' sub-tiles differ in multiply-adds per load
    (`_subtiles`): the padded work is divided by that. Measured on a 2-core Zen 3 at the models'
    shapes (bench.kernels): 8x48 is 8-16% faster than 8x32 where N is a multiple of 32, not 48."""
    def padded(v):
        mr, nr = v
        return (-(-m // mr) * mr) * (-(-n // nr) * nr)
    if native_has_avx512():
        return min(VARIANTS, key=padded)
    return min(VARIANTS, key=lambda v: padded(v) / _fmas_per_load(*v))


@functools.cache
def blas_tiles() -> bool:
    """Whether a packed GEMM's worker tiles call the BLAS torch links (MKL's `sgemm_`) instead
    of the micro-kernels here: where the CPU has no AVX-512 and torch's library exports it.
    Measured on a 2-core AVX2 Zen (bench.kernels, 2 workers): MKL's single-threaded sgemm_ per
    tile runs the models' GEMMs at 150-178 GFLOP/s where the micro-kernels here reach 105-135
    (Berxit's 1363 x 256 @ 256 x 1024: 4.2 ms against 6.3); with AVX-512 the micro-kernels
    are the faster (see the module's docstring)."""
    return not native_has_avx512() and blas_available()


@functools.cache
def blas_available() -> bool:
    """Whether torch's own library exports MKL's Fortran `sgemm_` and its per-thread thread
    count (its x86 builds do)."""
    try:
        library = ctypes.CDLL(os.path.join(TORCH_LIB, "libtorch_cpu.so"))   # (what _link_flags links)
        return hasattr(library, "sgemm_") and hasattr(library, "mkl_set_num_threads_local_")
    except OSError:
        return False


def blas_tile(transposed: bool, K, a: str, lda, b: str, ldb, c: str, ldc) -> str:
    """C for one worker tile, rows [k_m0, k_m1) and columns [k_n0, k_n1) of a row-major
    C = A @ B, through the Fortran BLAS `sgemm_` (column-major: C^T = B^T A^T). `a`, `b`, `c`:
    the operands' first elements (b: of column 0 of B; c: of C's row 0, column 0);
    `transposed`: B's element (k, j) is at j * ldb + k. MKL runs the tile on the calling
    thread (its thread count for this thread set to 1, then restored): a lone worker, outside
    an active parallel region, would otherwise have MKL start a team of its own beside the
    program's workers (Berxit's batched blocks then stalled 35-100 ms now and then)."""
    b_tile = f"{b} + k_n0 * {ldb}" if transposed else f"{b} + k_n0"
    return ("{ extern void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*,\n"
            "                     const float*, const int*, const float*, const int*, const float*, float*, const int*);\n"
            "extern int mkl_set_num_threads_local_(const int*);\n"
            f"const int k_tn = (int)(k_n1 - k_n0), k_tm = (int)(k_m1 - k_m0), k_tk = (int)({K});\n"
            f"const int k_tldb = (int)({ldb}), k_tlda = (int)({lda}), k_tldc = (int)({ldc});\n"
            "const float k_one = 1.0f, k_zero = 0.0f;\n"
            "const int k_tone = 1, k_tthreads = mkl_set_num_threads_local_(&k_tone);\n"
            f'sgemm_("{"T" if transposed else "N"}", "N", &k_tn, &k_tm, &k_tk, &k_one, {b_tile}, &k_tldb, '
            f"{a} + k_m0 * {lda}, &k_tlda, &k_zero, {c} + k_m0 * {ldc} + k_n0, &k_tldc);\n"
            "mkl_set_num_threads_local_(&k_tthreads); }")


@functools.cache
def _fmas_per_load(mr: int, nr: int) -> float:
    """Multiply-adds per load of the variant's sub-tiles (`_subtiles`), over its whole tile."""
    tiles = _subtiles(mr, nr)
    return sum(rows * vecs for _, rows, _, vecs in tiles) / sum(rows + vecs for _, rows, _, vecs in tiles)
