"""C helpers every kernel may use, included once in each generated file, after the dialect's
preamble (its headers: stdint, string, math).

Everything here is `CT_FN` (the dialect's: `static inline`, on CUDA a device function too;
each generated file has its own copy) and prefixed `ck_`.
The math functions are written without branches so GCC vectorizes the loops that call
them (the dialect's vector loops); glibc's scalar expf/tanhf would keep those loops scalar. Their
error is within ~2 ulp of the correctly rounded value (torch's own vectorized versions, Sleef,
are within 1 ulp), and inf/nan/overflow/underflow come out as torch's do. Compile with
-fno-math-errno (the CPU backend does) so that loops calling sqrtf/floorf vectorize too.
"""
from __future__ import annotations

from cocktailer.codegen.kernels.convgemm import CONV_C
from cocktailer.codegen.kernels.gemm import GEMM_C

_BASE = r"""
#define CK_MIN(a, b) ((a) < (b) ? (a) : (b))
#define CK_MAX(a, b) ((a) > (b) ? (a) : (b))

/* this worker's share [lo, hi) of n items, cut at multiples of grain (a cache line) */
CT_FN void ck_range(int64_t n, int64_t grain, int64_t w, int64_t W, int64_t* lo, int64_t* hi) {
  int64_t units = (n + grain - 1) / grain;
  int64_t a = units * w / W, b = units * (w + 1) / W;
  *lo = a * grain;
  *hi = b * grain < n ? b * grain : n;
}

/* Python-style index into a dim of `size`: negative counts from the end; -1 when out of range */
CT_FN int64_t ck_wrap(int64_t i, int64_t size) {
  if (i < 0) i += size;
  return (i < 0 || i >= size) ? -1 : i;
}

CT_FN float ck_bits2f(int32_t i) { float f; memcpy(&f, &i, 4); return f; }

/* exp(x): x = n ln2 + r, |r| <= ln2/2, Cephes' polynomial for e^r, 2^n in two steps so
   results down to the subnormals are right */
CT_FN float ck_expf(float x) {
  float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  float n = __builtin_rintf(xc * 1.44269504088896341f);
  float r = __builtin_fmaf(n, -0.693145751953125f, xc);
  r = __builtin_fmaf(n, -1.428606765330187045e-06f, r);
  float p = 1.9875691500E-4f;
  p = __builtin_fmaf(p, r, 1.3981999507E-3f);
  p = __builtin_fmaf(p, r, 8.3334519073E-3f);
  p = __builtin_fmaf(p, r, 4.1665795894E-2f);
  p = __builtin_fmaf(p, r, 1.6666665459E-1f);
  p = __builtin_fmaf(p, r, 5.0000001201E-1f);
  p = __builtin_fmaf(p, r * r, r) + 1.0f;
  int32_t ni = (int32_t)n, n1 = ni >> 1, n2 = ni - n1;
  float y = p * ck_bits2f((n1 + 127) << 23) * ck_bits2f((n2 + 127) << 23);
  y = x > 88.72283935546875f ? INFINITY : y;
  return x != x ? x : y;
}

/* tanh: Cephes' odd polynomial below 0.625 (no cancellation), 1 - 2/(e^2|x| + 1) above */
CT_FN float ck_tanhf(float x) {
  float ax = fabsf(x);
  float big = 1.0f - 2.0f / (ck_expf(2.0f * ax) + 1.0f);
  big = x < 0 ? -big : big;
  float z = x * x;
  float p = -5.70498872745E-3f;
  p = __builtin_fmaf(p, z, 2.06390887954E-2f);
  p = __builtin_fmaf(p, z, -5.37397155531E-2f);
  p = __builtin_fmaf(p, z, 1.33314422036E-1f);
  p = __builtin_fmaf(p, z, -3.33332819422E-1f);
  float small = __builtin_fmaf(p * z, x, x);
  return ax >= 0.625f ? big : small;
}

/* erfc(a) for a >= 0: t e^(-a^2 + P(t)), t = 1 / (1 + a/2), with the Chebyshev fit of
   Numerical Recipes (relative error below 1.2e-7 in exact arithmetic, a few float ulp here);
   glibc's erff is scalar and kept GELU loops 16x slower than torch's */
CT_FN float ck_erfc_nonneg(float a) {
  float t = 1.0f / __builtin_fmaf(0.5f, a, 1.0f);
  float p = 0.17087277f;
  p = __builtin_fmaf(p, t, -0.82215223f);
  p = __builtin_fmaf(p, t, 1.48851587f);
  p = __builtin_fmaf(p, t, -1.13520398f);
  p = __builtin_fmaf(p, t, 0.27886807f);
  p = __builtin_fmaf(p, t, -0.18628806f);
  p = __builtin_fmaf(p, t, 0.09678418f);
  p = __builtin_fmaf(p, t, 0.37409196f);
  p = __builtin_fmaf(p, t, 1.00002368f);
  p = __builtin_fmaf(p, t, -1.26551223f);
  return t * ck_expf(__builtin_fmaf(-a, a, p));
}

/* erf: its Maclaurin series (odd, to x^13) below 0.5, where 1 - erfc would lose the small
   values' digits; 1 - erfc(|x|), signed, above */
CT_FN float ck_erff(float x) {
  float ax = fabsf(x);
  float big = 1.0f - ck_erfc_nonneg(ax);
  big = x < 0 ? -big : big;
  float z = x * x;
  float p = 1.0f / 9360.0f;
  p = __builtin_fmaf(p, z, -1.0f / 1320.0f);
  p = __builtin_fmaf(p, z, 1.0f / 216.0f);
  p = __builtin_fmaf(p, z, -1.0f / 42.0f);
  p = __builtin_fmaf(p, z, 1.0f / 10.0f);
  p = __builtin_fmaf(p, z, -1.0f / 3.0f);
  p = __builtin_fmaf(p, z, 1.0f);
  float small = 1.1283791670955126f * x * p;
  return ax < 0.5f ? small : big;
}

/* GELU, x Phi(x) = x erfc(-x / sqrt 2) / 2: erfc itself where x < 0, so the tail keeps its
   digits (1 + erf would cancel them) */
CT_FN float ck_geluf(float x) {
  float u = x * 0.70710678118654752440f;
  float c = ck_erfc_nonneg(fabsf(u));
  return 0.5f * x * (u < 0 ? c : 2.0f - c);
}

CT_FN float ck_sigmoidf(float x) { return 1.0f / (1.0f + ck_expf(-x)); }
CT_FN double ck_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* torch.floor_divide / torch.remainder on floats (ATen's div_floor_floating, remainder) */
#define CK_FLOORDIV_FLOAT(T, FMOD, FLOOR, COPYSIGN)                      \
  CT_FN T ck_floordiv_##T(T a, T b) {                            \
    if (b == 0) return a / b;                                            \
    T mod = FMOD(a, b), div = (a - mod) / b;                             \
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;                    \
    if (div != 0) { T fl = FLOOR(div); if (div - fl > (T)0.5) fl += 1; return fl; } \
    return COPYSIGN((T)0, a / b);                                        \
  }                                                                      \
  CT_FN T ck_mod_##T(T a, T b) {                                 \
    T mod = FMOD(a, b);                                                  \
    if (mod != 0 && ((b < 0) != (mod < 0))) mod += b;                    \
    return mod;                                                          \
  }
CK_FLOORDIV_FLOAT(float, fmodf, floorf, copysignf)
CK_FLOORDIV_FLOAT(double, fmod, floor, copysign)

/* integer floor division and modulo; a zero divisor gives 0 (kernels check for it where they can) */
CT_FN int64_t ck_floordiv_i64(int64_t a, int64_t b) {
  if (b == 0) return 0;
  if (b == -1) return (int64_t)(0 - (uint64_t)a);
  int64_t q = a / b, r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? q - 1 : q;
}
CT_FN int64_t ck_mod_i64(int64_t a, int64_t b) {
  if (b == 0 || b == -1) return 0;
  int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

/* integer power, wrapping like torch; negative exponents give 0 unless |a| == 1 */
CT_FN int64_t ck_powi(int64_t a, int64_t b) {
  if (b < 0) return a == 1 ? 1 : (a == -1 ? ((-b) % 2 ? -1 : 1) : 0);
  uint64_t r = 1, x = (uint64_t)a;
  while (b) { if (b & 1) r *= x; x *= x; b >>= 1; }
  return (int64_t)r;
}
"""

PRELUDE = _BASE + GEMM_C + CONV_C
# Without the GEMM engine (GCC's vector extensions and x86 intrinsics): what a dialect whose
# kernels run on a GPU gets (KernelContext.engine False): math helpers and work splitting.
PORTABLE_PRELUDE = _BASE
