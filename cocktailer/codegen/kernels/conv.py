"""CONV2D as an implicit GEMM, MAX_POOL2D and AVG_POOL2D.

Per image and group, conv2d is out[Cout_g x OH*OW] = W[Cout_g x Cin_g*KH*KW] @ im2col(x): the
packed GEMM of gemm.py with a B packer that builds the im2col panel on the fly from the image
(padding as zeros), so no im2col buffer exists. A 1x1, stride-1, unpadded conv packs the image
itself. With AVX-512, stride-1 convs whose output rows are as wide as the input's (3x3 pad 1
and the like) skip B packing altogether: `ck_sconv` reads each tap's pixels in place with
masked loads (gemm.py). Bias is added by the micro-kernel. float64 runs a direct loop nest,
and so does float32 without the GEMM engine (`KernelContext.engine`: the CUDA dialect's).
Convs on 1x1 images (pointwise, fewer than 16 pixels) are dot products.

Pools follow ATen's CPU kernels: max propagates NaN; avg divides by the window clipped to the
padded input (count_include_pad) or to the input, and ceil_mode comes in through the result's
static shape.
"""
from __future__ import annotations

import torch

from cocktailer.codegen.kernels.common import block, split
from cocktailer.codegen.kernels.context import KernelContext, ctype
from cocktailer.codegen.kernels.gemm import choose_variant
from cocktailer.codegen.kernels.matmul import gemm_tiles, narrow
from cocktailer.ir import Operation

FLOATS = (torch.float32, torch.float64)


def supported(op: Operation) -> bool:
    dt = op.results[0].type.dtype
    return dt in FLOATS and all(v.type.dtype == dt for v in op.operands)


def _dims4(shape) -> tuple[int, int, int, int]:
    return (1, *shape) if len(shape) == 3 else tuple(shape)


def render_conv2d(op: Operation, ctx: KernelContext) -> str:
    x, w = op.operands[:2]
    bias = op.operands[2] if len(op.operands) > 2 else None
    out = op.results[0]
    nb, cin, h, wd = _dims4(x.type.shape)
    _, cout, oh, ow = _dims4(out.type.shape)
    _, cin_g, kh, kw = w.type.shape
    g = op.attrs["groups"]
    (sh, sw), (ph, pw), (dh, dw) = op.attrs["stride"], op.attrs["padding"], op.attrs["dilation"]
    cout_g = cout // g
    P, Kg = oh * ow, cin_g * kh * kw
    if nb * cout * P == 0:
        return ""
    T = ctype(out.type.dtype)
    head = [f"const {T}* k_x = {ctx.ptr(x)};", f"const {T}* k_w = {ctx.ptr(w)};", f"{T}* k_y = {ctx.ptr(out)};",
            f"const {T}* k_bias = {ctx.ptr(bias) if bias is not None else '0'};"]
    if out.type.dtype is not torch.float32 or Kg == 0 or not ctx.engine:
        return block(*head, *_direct(T, nb, cin, h, wd, cout, oh, ow, cin_g, kh, kw, g, sh, sw, ph, pw, dh, dw, ctx))
    pointwise = (kh, kw, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0)
    if pointwise and g == 1 and P < 16:   # e.g. 1x1 convs on pooled features: dot products
        return block(*head, "const float* k_a = k_w; const float* k_b = k_x; float* k_c = k_y;",
                     *narrow(nb, cout, Kg, P, "0", f"k_bi * {cin * P}", ctx, bias="k_bias" if bias is not None else None))
    grp = f"k_bi * {cout_g}"   # k_bi: the group
    # im2col GEMM: the images side by side as columns (panels may run from one image into the next)
    mr, nr = choose_variant(cout_g, nb * P)
    xg = f"k_x + k_bi * {cin_g * h * wd}"
    if pointwise:
        pack = f"const ck_mat k_g = {{ {xg}, {P}, {P}, {cin * P} }};"
        packer = f"ck_packb_mat_{nr}"
    else:
        pack = f"const ck_conv k_g = {{ {xg}, {h}, {wd}, {kh}, {kw}, {sh}, {sw}, {ph}, {pw}, {dh}, {dw}, {ow}, {oh}, {cin * h * wd} }};"
        packer = f"ck_packb_conv_{nr}"
    call = (f"{pack}\n"
            f"ck_sgemm_{mr}x{nr}(k_m1 - k_m0, k_n1 - k_n0, {Kg}, k_w + ({grp} + k_m0) * {Kg}, {Kg}, {packer}, &k_g, k_n0, "
            f"k_y + ({grp} + k_m0) * {P}, {P}, {P}, {cout * P}, k_bias ? k_bias + {grp} + k_m0 : 0);")
    gemm = gemm_tiles(g, cout_g, nb * P, mr, nr, ctx, call)
    if not direct_ok(op):
        return block(*head, *gemm)
    # AVX-512: read the image in place, no im2col; one image (and group) per item
    dmr, dnr = choose_variant(cout_g, P)
    grp = f"(k_bi % {g}) * {cout_g}"
    img = f"k_x + (k_bi / {g}) * {cin * h * wd} + (k_bi % {g}) * {cin_g * h * wd}"
    direct = (f"const ck_conv k_g = {{ {img}, {h}, {wd}, {kh}, {kw}, {sh}, {sw}, {ph}, {pw}, {dh}, {dw}, {ow}, {oh}, 0 }};\n"
              f"ck_sconv_{dmr}x{dnr}(k_m1 - k_m0, k_n0, k_n1, {cin_g}, k_w + ({grp} + k_m0) * {Kg}, {Kg}, &k_g, "
              f"k_y + (k_bi / {g}) * {cout * P} + ({grp} + k_m0) * {P}, {P}, k_bias ? k_bias + {grp} + k_m0 : 0);")
    return block(*head, "#ifdef __AVX512F__", *gemm_tiles(nb * g, cout_g, P, dmr, dnr, ctx, direct),
                 "#else", *gemm, "#endif")


def path(op: Operation) -> str:
    """Which code a CONV2D takes with AVX-512 (for benchmarks and debugging)."""
    x, w = op.operands[:2]
    nb, _, _, _ = _dims4(x.type.shape)
    _, cout, oh, ow = _dims4(op.results[0].type.shape)
    kh, kw = w.type.shape[2:]
    g = op.attrs["groups"]
    pointwise = (kh, kw) == (1, 1) and tuple(op.attrs["stride"]) == (1, 1) and tuple(op.attrs["padding"]) == (0, 0)
    if op.results[0].type.dtype is not torch.float32:
        return "loops"
    if pointwise and g == 1 and oh * ow < 16:
        return "dot"
    if direct_ok(op):
        return "direct %dx%d" % choose_variant(cout // g, oh * ow)
    return "im2col %dx%d" % choose_variant(cout // g, nb * oh * ow)


def direct_ok(op: Operation) -> bool:
    """Whether the direct (in-place B) convolution applies: stride 1 and output rows as wide
    as the input's, so that every output pixel reads its taps at the same offsets."""
    x, w = op.operands[:2]
    _, _, _, wd = _dims4(x.type.shape)
    _, _, _, ow = _dims4(op.results[0].type.shape)
    kh, kw = w.type.shape[2:]
    _, _, oh, _ = _dims4(op.results[0].type.shape)
    # 1x1 convs pack B by plain copies anyway; on tiny images (SkipNet's 7x7) the padded panel
    # costs the same either way and the packed one reads faster (measured)
    return (tuple(op.attrs["stride"]) == (1, 1) and ow == wd and kh * kw <= 64 and (kh, kw) != (1, 1)
            and oh * ow >= 64)


def _direct(T, nb, cin, h, wd, cout, oh, ow, cin_g, kh, kw, g, sh, sw, ph, pw, dh, dw, ctx) -> list[str]:
    """One output plane (image, channel) per task; without the GEMM engine (a GPU's threads),
    one output pixel per task, summed in the same order."""
    cout_g = cout // g
    if ctx.engine:
        tasks = [split(ctx, nb * cout, 1),
                 "for (int64_t k_t = k_lo; k_t < k_hi; ++k_t) {",
                 f"const int64_t k_n = k_t / {cout}, k_co = k_t - k_n * {cout}, k_g0 = k_co / {cout_g} * {cin_g};",
                 f"{T}* k_q = k_y + k_t * {oh * ow};",
                 f"for (int64_t k_i = 0; k_i < {oh}; ++k_i) for (int64_t k_j = 0; k_j < {ow}; ++k_j) {{"]
    else:
        tasks = [split(ctx, nb * cout * oh * ow, 1),
                 "for (int64_t k_e = k_lo; k_e < k_hi; ++k_e) {",
                 f"const int64_t k_t = k_e / {oh * ow}, k_p = k_e - k_t * {oh * ow}, k_i = k_p / {ow}, "
                 f"k_j = k_p - k_i * {ow};",
                 f"const int64_t k_n = k_t / {cout}, k_co = k_t - k_n * {cout}, k_g0 = k_co / {cout_g} * {cin_g};",
                 f"{T}* k_q = k_y + k_t * {oh * ow};",
                 "{"]
    return tasks + [
            f"{T} k_s = k_bias ? k_bias[k_co] : 0;",
            f"for (int64_t k_c = 0; k_c < {cin_g}; ++k_c) for (int64_t k_a = 0; k_a < {kh}; ++k_a) {{",
            f"const int64_t k_ih = k_i * {sh} - {ph} + k_a * {dh};",
            f"if (k_ih < 0 || k_ih >= {h}) continue;",
            f"const {T}* k_row = k_x + ((k_n * {cin} + k_g0 + k_c) * {h} + k_ih) * {wd};",
            f"const {T}* k_wr = k_w + ((k_co * {cin_g} + k_c) * {kh} + k_a) * {kw};",
            f"for (int64_t k_b = 0; k_b < {kw}; ++k_b) {{",
            f"const int64_t k_iw = k_j * {sw} - {pw} + k_b * {dw};",
            f"if (k_iw >= 0 && k_iw < {wd}) k_s += k_wr[k_b] * k_row[k_iw];",
            "}}",
            f"k_q[k_i * {ow} + k_j] = k_s;",
            "}}"]


def render_pool(op: Operation, ctx: KernelContext) -> str:
    """One output row per task."""
    x, out = op.operands[0], op.results[0]
    is_max = op.op.name == "MAX_POOL2D"
    nb, c, h, wd = _dims4(x.type.shape)
    _, _, oh, ow = _dims4(out.type.shape)
    if nb * c * oh * ow == 0:
        return ""
    (kh, kw), (sh, sw), (ph, pw) = op.attrs["kernel"], op.attrs["stride"], op.attrs["padding"]
    T = ctype(out.type.dtype)
    f32 = out.type.dtype is torch.float32
    head = [f"const {T}* k_x = {ctx.ptr(x)};", f"{T}* k_y = {ctx.ptr(out)};", split(ctx, nb * c * oh, 1),
            "for (int64_t k_t = k_lo; k_t < k_hi; ++k_t) {",
            f"const int64_t k_pl = k_t / {oh}, k_i = k_t - k_pl * {oh};",
            f"const {T}* k_p = k_x + k_pl * {h * wd}; {T}* k_q = k_y + k_t * {ow};",
            f"for (int64_t k_j = 0; k_j < {ow}; ++k_j) {{"]
    if is_max:
        dh, dw = op.attrs["dilation"]
        ninf = "-INFINITY" if f32 else "-(double)INFINITY"
        body = [f"{T} k_m = {ninf};",
                f"for (int64_t k_a = 0; k_a < {kh}; ++k_a) {{",
                f"const int64_t k_ih = k_i * {sh} - {ph} + k_a * {dh};",
                f"if (k_ih < 0 || k_ih >= {h}) continue;",
                f"for (int64_t k_b = 0; k_b < {kw}; ++k_b) {{",
                f"const int64_t k_iw = k_j * {sw} - {pw} + k_b * {dw};",
                f"if (k_iw < 0 || k_iw >= {wd}) continue;",
                f"const {T} k_v = k_p[k_ih * {wd} + k_iw];",
                "if (k_v > k_m || k_v != k_v) k_m = k_v;",
                "}}",
                "k_q[k_j] = k_m;"]
    else:
        include_pad = op.attrs["count_include_pad"]
        body = [f"int64_t k_h0 = k_i * {sh} - {ph}, k_w0 = k_j * {sw} - {pw};",
                f"int64_t k_h1 = CK_MIN(k_h0 + {kh}, {h + ph}), k_w1 = CK_MIN(k_w0 + {kw}, {wd + pw});",
                "const int64_t k_size = (k_h1 - k_h0) * (k_w1 - k_w0);",
                f"k_h0 = CK_MAX(k_h0, 0); k_w0 = CK_MAX(k_w0, 0); k_h1 = CK_MIN(k_h1, {h}); k_w1 = CK_MIN(k_w1, {wd});",
                "if (k_h0 >= k_h1 || k_w0 >= k_w1) { k_q[k_j] = 0; continue; }",
                f"{T} k_s = 0;",
                f"for (int64_t k_a = k_h0; k_a < k_h1; ++k_a) for (int64_t k_b = k_w0; k_b < k_w1; ++k_b) k_s += k_p[k_a * {wd} + k_b];",
                f"k_q[k_j] = k_s / ({T})({'k_size' if include_pad else '(k_h1 - k_h0) * (k_w1 - k_w0)'});"]
    return block(*head, *body, "}", "}")
