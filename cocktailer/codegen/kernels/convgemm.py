"""The convolution side of the GEMM engine (C, part of PRELUDE):

- `ck_packb_conv_<NR>`: a B packer for ck_sgemm that builds im2col panels on the fly, the
  images of a batch side by side as columns.
- `ck_sconv_<MR>x<NR>` with its micro-kernel (AVX-512 only): stride-1 convolutions whose output
  rows are as wide as the input's need no B packing at all; each tap's pixels are read in place
  with masked loads.

Both are driven like gemm.py's kernels (same A packing, tiles, stores) and measured with
bench/kernels.py.
"""
from __future__ import annotations

from cocktailer.codegen.kernels.gemm import KC, VARIANTS, VW, mc_of, register_epilogue

_HEADER = r"""
/* a convolution's input seen as the K x (images * oh*ow) im2col matrix (images istride apart) */
typedef struct { const float* x; int64_t h, w, kh, kw, sh, sw, ph, pw, dh, dw, ow, oh, istride; } ck_conv;
static inline int64_t ck_floordiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }   /* b > 0 */
#define CK_DCONV_TAPS 64       /* kernel taps (kh * kw) the direct convolution handles */
/* bit i of x to bit 2i */
static inline uint32_t ck_spread16(uint32_t x) {
  x = (x | x << 8) & 0x00FF00FFu; x = (x | x << 4) & 0x0F0F0F0Fu;
  x = (x | x << 2) & 0x33333333u; return (x | x << 1) & 0x55555555u;
}
#define CK_DCONV_MASKS 16384   /* lane masks worked out at once (32 KiB) */
"""


def _packb_conv(nr: int) -> str:
    """im2col of one panel: rows k = (c, kh, kw) of the weight, columns = output pixels.

    The panel's pixels are cut into runs along output rows; for every (kh, kw) and run, where
    the run reads in its channel's plane and which part of it lies inside the image does not
    depend on the channel, so it is worked out once per panel ("segments") and each row k of
    the panel is a few (strided) copies and zero fills."""
    segs = f"CK_CONV_SEGS_{nr}"
    return f"""
#define {segs} (49 * 4)
CK_NOIPA static void ck_packb_conv_{nr}(const void* ctx, int64_t k0, int64_t kc, int64_t j0, int64_t nr, float* restrict Bp) {{
  const ck_conv* g = (const ck_conv*)ctx;
  const int64_t khw = g->kh * g->kw, sw = g->sw, W = g->w, H = g->h;
  const int64_t P = g->oh * g->ow;
  int64_t run_ih0[{nr}], run_iw0[{nr}], run_len[{nr}], run_at[{nr}], run_img[{nr}], runs = 0;
  for (int64_t j = 0; j < nr; ) {{   /* runs of pixels along one output row of one image */
    const int64_t img = (j0 + j) / P, p = j0 + j - img * P, oh = p / g->ow, ow = p - oh * g->ow;
    const int64_t len = CK_MIN(nr - j, g->ow - ow);
    run_ih0[runs] = oh * g->sh - g->ph; run_iw0[runs] = ow * sw - g->pw; run_img[runs] = img * g->istride;
    run_len[runs] = len; run_at[runs] = j; ++runs; j += len;
  }}
  if (khw * runs > {segs}) {{   /* large kernels over short rows: work each row k out directly */
    for (int64_t k = 0; k < kc; ++k) {{
      const int64_t kk = k0 + k, c = kk / khw, ki = (kk - c * khw) / g->kw, kj = kk - c * khw - ki * g->kw;
      float* d = Bp + k * {nr};
      for (int64_t j = 0; j < {nr}; ++j) d[j] = 0.0f;
      for (int64_t q = 0; q < runs; ++q) {{
        const int64_t ih = run_ih0[q] + ki * g->dh;
        if (ih < 0 || ih >= H) continue;
        for (int64_t t = 0; t < run_len[q]; ++t) {{
          const int64_t iw = run_iw0[q] + kj * g->dw + t * sw;
          if (iw >= 0 && iw < W) d[run_at[q] + t] = g->x[run_img[q] + (c * H + ih) * W + iw];
        }}
      }}
    }}
    return;
  }}
  /* segments: for (kh, kw) = s / runs and run q = s % runs, copy src[t * sw] to dst[t] for t in [lo, hi) */
  int64_t seg_src[{segs}];
  int32_t seg_dst[{segs}], seg_lo[{segs}], seg_hi[{segs}], seg_len[{segs}];
  for (int64_t ki = 0, s = 0; ki < g->kh; ++ki)
    for (int64_t kj = 0; kj < g->kw; ++kj)
      for (int64_t q = 0; q < runs; ++q, ++s) {{
        const int64_t ih = run_ih0[q] + ki * g->dh, iw0 = run_iw0[q] + kj * g->dw, len = run_len[q];
        int64_t lo = 0, hi = 0;
        if (ih >= 0 && ih < H) {{   /* iw(t) = iw0 + t * sw inside [0, W) for t in [lo, hi) */
          lo = CK_MIN(len, CK_MAX(0, ck_floordiv(-iw0 + sw - 1, sw)));
          hi = CK_MAX(lo, CK_MIN(len, ck_floordiv(W - 1 - iw0, sw) + 1));
        }}
        seg_src[s] = run_img[q] + ih * W + iw0; seg_dst[s] = (int32_t)run_at[q];
        seg_lo[s] = (int32_t)lo; seg_hi[s] = (int32_t)hi; seg_len[s] = (int32_t)len;
      }}
  const int64_t per_k = runs;
  int64_t c = k0 / khw, r = k0 - c * khw;
  for (int64_t k = 0; k < kc; ++k) {{
    float* d = Bp + k * {nr};
    const float* plane = g->x + c * H * W;
    const int64_t s0 = r * per_k;
    for (int64_t q = 0; q < per_k; ++q) {{
      const int64_t s = s0 + q, lo = seg_lo[s], hi = seg_hi[s], len = seg_len[s];
      float* dq = d + seg_dst[s];
      const float* src = plane + seg_src[s];
#ifdef __AVX512F__
      if (sw == 1) {{   /* masked loads never touch the lanes outside [lo, hi): no bounds trouble at the edges */
        const uint64_t valid = (hi >= 64 ? ~0ull : (1ull << hi) - 1) & ~((1ull << lo) - 1);
        const uint64_t inside = len >= 64 ? ~0ull : (1ull << len) - 1;
        for (int64_t t = 0; t < len; t += 16)
          _mm512_mask_storeu_ps(dq + t, (__mmask16)(inside >> t), _mm512_maskz_loadu_ps((__mmask16)(valid >> t), src + t));
        continue;
      }}
      if (sw == 2) {{   /* 32 floats in, the even ones out; the source mask is the lane mask spread out */
        const uint64_t valid = (hi >= 64 ? ~0ull : (1ull << hi) - 1) & ~((1ull << lo) - 1);
        const uint64_t inside = len >= 64 ? ~0ull : (1ull << len) - 1;
        const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        for (int64_t t = 0; t < len; t += 16) {{
          const uint32_t m = ck_spread16((uint32_t)(valid >> t) & 0xffffu);
          const __m512 a = _mm512_maskz_loadu_ps((__mmask16)m, src + 2 * t);
          const __m512 b = _mm512_maskz_loadu_ps((__mmask16)(m >> 16), src + 2 * t + 16);
          _mm512_mask_storeu_ps(dq + t, (__mmask16)(inside >> t), _mm512_permutex2var_ps(a, even, b));
        }}
        continue;
      }}
#endif
      for (int64_t t = 0; t < lo; ++t) dq[t] = 0.0f;
      if (sw == 1) {{ for (int64_t t = lo; t < hi; ++t) dq[t] = src[t]; }}
      else {{ for (int64_t t = lo; t < hi; ++t) dq[t] = src[t * sw]; }}
      for (int64_t t = hi; t < len; ++t) dq[t] = 0.0f;
    }}
    for (int64_t j = nr; j < {nr}; ++j) d[j] = 0.0f;
    if (++r == khw) {{ r = 0; ++c; }}
  }}
}}"""


def _ukr_dconv(mr: int, nr: int) -> str:
    """Direct convolution micro-kernel (AVX-512): like ck_ukr, but B is read in place from the
    image: for channel c and kernel tap q, the NR output pixels read the input at
    x + c * plane + koff[q] + lane, lanes outside the image masked off (zeros, never touched)."""
    nv = nr // VW
    acc = [[f"c{r}_{v}" for v in range(nv)] for r in range(mr)]
    L = [f"CK_NOIPA static void ck_ukr_dconv_{mr}x{nr}(int64_t nch, int64_t khw, const float* restrict Ap, const float* x, "
         f"int64_t plane, const int32_t* restrict koff, const uint16_t* restrict kmask, float* restrict C, int64_t ldc, "
         f"int mr, int nr, int acc, const float* restrict bias, int64_t off, int64_t cols, int64_t cstride) {{"]
    for r in range(mr):
        L.append("  ck_vf " + ", ".join(f"{a} = {{0}}" for a in acc[r]) + ";")
    L.append("  const float* ap = Ap;")
    L.append("  for (int64_t c = 0; c < nch; ++c, x += plane) {")
    L.append(f"    for (int64_t q = 0; q < khw; ++q, ap += {mr}) {{")
    L.append("      const float* xs = x + koff[q];")
    for v in range(nv):
        L.append(f"      const ck_vf b{v} = (ck_vf)_mm512_maskz_loadu_ps(kmask[q * {nv} + {v}], xs + {v * VW});")
    for r in range(mr):
        L.append(f"      {{ const float a = ap[{r}]; " + " ".join(f"{acc[r][v]} += a * b{v};" for v in range(nv)) + " }")
    L.append("    }")
    L.append("  }")
    L.append(register_epilogue(mr, nr))
    L.append("}")
    return "\n".join(L)


def _driver_dconv(mr: int, nr: int) -> str:
    """Stride-1 convolutions whose output rows are as wide as the input's (OW == W): output
    pixel p then reads input element p + (ki*dh - ph)*W + (kj*dw - pw) of each channel, the
    same offset for every pixel, so a panel of NR pixels -- across row ends too -- is NR
    consecutive floats, with the lanes that fall outside the image masked. Nothing of B is
    packed; A is packed once per chunk of panels, in blocks of whole channels. The lane masks
    of a chunk's panels are worked out once, before its channel loop."""
    mc, nv = mc_of(mr), nr // VW
    return f"""
CK_NOIPA static void ck_sconv_{mr}x{nr}(int64_t M, int64_t n0, int64_t n1, int64_t cin, const float* A, int64_t lda,
                              const ck_conv* g, float* C, int64_t ldc, const float* bias) {{
  float Ap[{mc} * {KC}] __attribute__((aligned(64)));
  int32_t koff[CK_DCONV_TAPS];
  uint16_t kmask[CK_DCONV_MASKS];
  const int64_t khw = g->kh * g->kw, plane = g->h * g->w, cpb = CK_MAX(1, {KC} / khw);
  const int64_t per_panel = khw * {nv}, chunk = CK_MAX(1, CK_DCONV_MASKS / per_panel) * {nr};
  for (int64_t q = 0; q < khw; ++q)
    koff[q] = (int32_t)(((q / g->kw) * g->dh - g->ph) * g->w + (q % g->kw) * g->dw - g->pw);
  for (int64_t jc = n0; jc < n1; jc += chunk) {{
    const int64_t je = CK_MIN(n1, jc + chunk);
    for (int64_t j = jc, pi = 0; j < je; j += {nr}, ++pi) {{   /* lane masks of each panel: rows & columns */
      uint64_t rows[CK_DCONV_TAPS] = {{0}}, cols[CK_DCONV_TAPS] = {{0}};
      int64_t oh = j / g->ow, ow = j - oh * g->ow;
      for (int64_t t = 0; t < {nr} && j + t < je; ++t) {{
        for (int64_t ki = 0; ki < g->kh; ++ki) {{
          const int64_t ih = oh + ki * g->dh - g->ph;
          rows[ki] |= (uint64_t)(ih >= 0 && ih < g->h) << t;
        }}
        for (int64_t kj = 0; kj < g->kw; ++kj) {{
          const int64_t iw = ow + kj * g->dw - g->pw;
          cols[kj] |= (uint64_t)(iw >= 0 && iw < g->w) << t;
        }}
        if (++ow == g->ow) {{ ow = 0; ++oh; }}
      }}
      uint16_t* km = kmask + pi * per_panel;
      for (int64_t q = 0; q < khw; ++q) {{
        const uint64_t m = rows[q / g->kw] & cols[q % g->kw];
        for (int v = 0; v < {nv}; ++v) km[q * {nv} + v] = (uint16_t)(m >> (16 * v));
      }}
    }}
    for (int64_t c0 = 0; c0 < cin; c0 += cpb) {{
      const int64_t nch = CK_MIN(cpb, cin - c0), kc = nch * khw;
      for (int64_t mb = 0; mb < M; mb += {mc}) {{
        const int64_t mc = CK_MIN({mc}, M - mb);
        ck_packa_{mr}(A + mb * lda + c0 * khw, lda, mc, kc, Ap);
        for (int64_t j = jc, pi = 0; j < je; j += {nr}, ++pi)
          for (int64_t i = 0; i < mc; i += {mr})
            ck_ukr_dconv_{mr}x{nr}(nch, khw, Ap + i * kc, g->x + c0 * plane + j, plane, koff, kmask + pi * per_panel,
                                  C + (mb + i) * ldc + j, ldc, (int)CK_MIN({mr}, mc - i), (int)CK_MIN({nr}, je - j),
                                  c0 > 0, bias ? bias + mb + i : 0, 0, ldc, 0);
      }}
    }}
  }}
}}"""


def _build() -> str:
    parts = [_HEADER]
    for nr in sorted({nr for _, nr in VARIANTS}):
        parts.append(_packb_conv(nr))
    parts.append("#ifdef __AVX512F__")
    for mr, nr in VARIANTS:
        parts.append(_ukr_dconv(mr, nr))
        parts.append(_driver_dconv(mr, nr))
    parts.append("#endif")
    return "\n".join(parts) + "\n"


CONV_C = _build()
