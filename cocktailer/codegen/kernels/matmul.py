"""MATMUL with torch.matmul's semantics: 1-d operands (a vector is a 1 x K row or K x 1
column, removed from the result), batch dims broadcast, a batched A against a 2-d B folded
into one tall GEMM.

float32 takes one of three paths, chosen from the static shapes:
- N < 16 (matrix-vector, narrow outputs): dot products, one output row per task;
- M < 8 (GEMV-like: batch-1 linear layers, decode-step attention): `ck_sgemv<M>` streams B
  once, workers split the columns in 16-wide panels;
- otherwise the packed GEMM `ck_sgemm_<MR>x<NR>` (gemm.py), workers split (batch, rows,
  column panels) so each gets whole NR-wide panels: column panels when there are enough,
  row blocks too when not.
Other dtypes (float64, int64, int32) run a plain vectorized loop nest, and so does float32 where
the GEMM engine is not in the prelude (`KernelContext.engine`: the CUDA dialect's kernels).

An operand may be read as a view of another value's buffer (attrs["views"], set by
`passes.views` on native programs): that buffer reshaped, then permuted. The packed GEMM reads
it in place through strides (a batch of matrices at any strides; rows at a stride, columns
contiguous; B also transposed), instead of a copy made by the PERMUTE and RESHAPE kernels: the
heads of attention (`q @ k.transpose(-2, -1)` of `x.view(n, h, d).transpose(0, 1)`).
"""
from __future__ import annotations

import torch

from cocktailer.codegen.kernels.common import (block, broadcast_strides, ceil_div, hint, numel, offset_expr, product,
                                               split, strides_of)
from cocktailer.codegen.kernels.context import KernelContext, ctype
from cocktailer.codegen.kernels.gemm import GEMV_ROWS, blas_tile, blas_tiles, choose_variant
from cocktailer.ir import Operation, Sym, SymbolicSizeError

DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32)


def supported(op: Operation) -> bool:
    return all(v.type.dtype == op.results[0].type.dtype for v in op.operands) and op.results[0].type.dtype in DTYPES


def views(op: Operation) -> dict[int, tuple[tuple, tuple]]:
    """Operand index -> (shape the operand's buffer is viewed at, permutation of that view) of
    each operand read as a view."""
    return {k: (shape, dims) for k, shape, dims in op.attrs.get("views", ())}


def logical_shape(op: Operation, k: int) -> tuple:
    """Operand k's shape as the product reads it (its view's, where it is read as one)."""
    view = views(op).get(k)
    return tuple(op.operands[k].type.shape) if view is None else tuple(view[0][d] for d in view[1])


def _view_strides(view: tuple, size) -> list:
    """Element strides of each dim of a view (shape, dims) of a contiguous buffer."""
    shape, dims = view
    st = strides_of([size(d) if isinstance(d, Sym) else d for d in shape])
    return [st[d] for d in dims]


def reads_in_place(op: Operation, k: int, shape: tuple, dims: tuple) -> bool:
    """Whether the packed GEMM can read operand k as the view (shape, dims) of its buffer: the
    product takes that path, A's columns and B's columns or rows are contiguous, and a viewed A
    keeps its batch apart from its rows (B batched too, at the same batch shape), or is only
    reshaped and times one matrix (its rows, folded, lie as a contiguous A's would: the heads
    of attention's output joined again before the output projection)."""
    last = len(shape) - 1
    logical = tuple(shape[d] for d in dims)
    other = logical_shape(op, 1 - k)
    if len(logical) < 2 or len(other) < 2 or op.results[0].type.dtype is not torch.float32:
        return False
    reshaped = dims == tuple(range(len(shape)))   # a reshape alone: the buffer as it lies, rows K apart
    if k == 0 and not (reshaped and len(other) == 2) and \
            (dims[-1] != last or other[:-2] != logical[:-2] or len(other) < 3):
        return False
    if k == 1 and (last not in (dims[-1], dims[-2]) or other[:-2] not in ((), logical[:-2])):
        return False
    M, N = (logical if k == 0 else other)[-2], (logical if k == 1 else other)[-1]
    return not (isinstance(N, int) and N < 16) and not (isinstance(M, int) and M <= GEMV_ROWS)


def _geometry(op: Operation, ctx: KernelContext | None = None):
    """(batch shape, A's and B's element strides per batch dim, M, K, N, hints of M and N).
    M, K and N may be run-time sizes (C expressions: `ctx.size` of the symbolic dims), and so
    may the strides; where B is one matrix, A's batch is folded into its rows (one tall GEMM),
    so its batch dims may be too. A batched B's batch dims may be run-time sizes where A has the
    same batch dims or none (one A for every matrix of B); else they must be numbers (the batch is
    broadcast at compile time)."""
    sa, sb = logical_shape(op, 0), logical_shape(op, 1)
    a_vec, b_vec = len(sa) == 1, len(sb) == 1
    M = 1 if a_vec else sa[-2]
    K = sa[-1]
    N = 1 if b_vec else sb[-1]
    a_batch = () if a_vec else sa[:-2]
    b_batch = () if b_vec else sb[:-2]
    size = ctx.size if ctx is not None else str
    c = lambda *dims: product(*(size(d) if isinstance(d, Sym) else d for d in dims))   # noqa: E731
    if not b_batch:   # fold A's batch into its rows: one tall GEMM
        rows = (*a_batch, M)
        return (), [], [], c(*rows), c(K), c(N), hint(rows), hint((N,))
    batch_syms = tuple(d for d in a_batch + b_batch if isinstance(d, Sym))
    if batch_syms and a_batch and a_batch != b_batch:
        raise SymbolicSizeError(batch_syms, "a batched matmul's batch dims, where A's and B's differ")
    if batch_syms:   # one batch for both (every lane's matrix times its own), or B's with one A: no broadcasting
        batch = tuple(size(d) if isinstance(d, Sym) else d for d in b_batch)
        own = [c(*b_batch[i + 1:]) for i in range(len(b_batch))]
        sta = [product(o, c(M, K)) for o in own] if a_batch else [0] * len(batch)
        return batch, sta, [product(o, c(K, N)) for o in own], c(M), c(K), c(N), hint((M,)), hint((N,))
    batch = tuple(torch.broadcast_shapes(a_batch, b_batch))
    sta = [c(s, M, K) for s in broadcast_strides(a_batch, batch)]
    stb = [c(s, K, N) for s in broadcast_strides(b_batch, batch)]
    return batch, sta, stb, c(M), c(K), c(N), hint((M,)), hint((N,))


def _in_place(op: Operation, batch, sta, stb, K, N, ctx: KernelContext):
    """(batch strides of A and B, A's row stride, B's row stride, whether B is read transposed):
    where an operand is a view (`views`), its own strides."""
    lda, ldb, transposed = K, N, False
    for k, view in views(op).items():
        st = _view_strides(view, ctx.size)
        own = [0] * (len(batch) - (len(st) - 2)) + st[:-2]
        if k == 0:
            sta, lda = own, st[-2]
        else:
            transposed = view[1][-1] != len(view[0]) - 1
            stb, ldb = own, st[-1] if transposed else st[-2]
    return sta, stb, lda, ldb, transposed


def path(op: Operation) -> str:
    """Which code a MATMUL takes (for benchmarks and debugging)."""
    batch, _, _, M, K, N, m, n = _geometry(op)
    if op.results[0].type.dtype is not torch.float32:
        return "loops"
    if isinstance(N, int) and N < 16:
        return "dot"
    if isinstance(M, int) and M <= GEMV_ROWS:
        return "gemv"
    return "gemm mkl" if blas_tiles() else "gemm %dx%d" % choose_variant(m, n)


def render_matmul(op: Operation, ctx: KernelContext) -> str:
    a, b = op.operands
    out = op.results[0]
    dt = out.type.dtype
    batch, sta, stb, M, K, N, m, n = _geometry(op, ctx)
    nb = numel(batch)
    if product(nb, M, N) == 0:   # a run-time M is at least 2 (sizes 0 and 1 are compiled apart)
        return ""
    T = ctype(dt)
    head = [f"const {T}* k_a = {ctx.ptr(a)};", f"const {T}* k_b = {ctx.ptr(b)};", f"{T}* k_c = {ctx.ptr(out)};"]
    sta, stb, lda, ldb, transposed = _in_place(op, batch, sta, stb, K, N, ctx)
    if views(op) and (path(op).split()[0] != "gemm" or not ctx.engine):
        raise AssertionError(f"a MATMUL reads a view on the {path(op) if ctx.engine else 'loops'} path, "
                             "which reads only contiguous operands")
    a_off = offset_expr("k_bi", batch, sta) if batch else "0"
    b_off = offset_expr("k_bi", batch, stb) if batch else "0"
    if K == 0:
        return block(*head, split(ctx, product(nb, M, N), 16),
                     "for (int64_t k_i = k_lo; k_i < k_hi; ++k_i) k_c[k_i] = 0;")
    if not ctx.engine:   # a GPU's threads: tiles in the block's shared memory, or one dot product each
        tiled = ctx.cooperative and fills_tiles(M, K, N, m, n)
        return block(*head, *(_tiled if tiled else _per_output)(dt, nb, M, K, N, a_off, b_off, ctx))
    if dt is not torch.float32:   # the GEMM engine's dot products are float32
        return block(*head, *_generic(dt, nb, M, K, N, a_off, b_off, ctx))
    if isinstance(N, int) and N < 16:
        return block(*head, *narrow(nb, M, K, N, a_off, b_off, ctx))
    if isinstance(M, int) and M <= GEMV_ROWS:
        return block(*head, *_gemv(nb, M, K, N, a_off, b_off, ctx))
    return block(*head, *_gemm(nb, M, K, N, a_off, b_off, ctx, None if batch or views(op) else b, m, n,
                               lda, ldb, transposed))


def _rows(nb: int, M: int, ctx: KernelContext) -> list[str]:
    """Loop header over this worker's output rows (k_bi: batch item, k_m: row)."""
    return [split(ctx, product(nb, M), 1),
            "for (int64_t k_row = k_lo; k_row < k_hi; ++k_row) {",
            f"const int64_t k_bi = k_row / {M}, k_m = k_row - k_bi * {M};"]


def narrow(nb, M, K, N, a_off, b_off, ctx, bias: str | None = None) -> list[str]:
    """C[bi][m, :N] (+ bias[m]) for N < 16: one output row per task, dot products over K."""
    init = "k_bias[k_m]" if bias else "0"
    lines = _rows(nb, M, ctx) + [
        f"const float* k_pa = k_a + {a_off} + k_m * {K}; const float* k_pb = k_b + {b_off};",
        f"float* k_pc = k_c + k_row * {N};"]
    if N == 1:
        lines += ["float k_s = 0;", ctx.simd("+:k_s"),
                  f"for (int64_t k_k = 0; k_k < {K}; ++k_k) k_s += k_pa[k_k] * k_pb[k_k];", f"k_pc[0] = k_s + {init};"]
    else:
        lines += [f"float k_s[{N}] = {{0}};",
                  f"for (int64_t k_k = 0; k_k < {K}; ++k_k) {{ const float k_v = k_pa[k_k];",
                  f"for (int k_n = 0; k_n < {N}; ++k_n) k_s[k_n] += k_v * k_pb[k_k * {N} + k_n]; }}",
                  f"for (int k_n = 0; k_n < {N}; ++k_n) k_pc[k_n] = k_s[k_n] + {init};"]
    return lines + ["}"]


def _gemv(nb, M, K, N, a_off, b_off, ctx) -> list[str]:
    np_ = ceil_div(N, 16)
    return [split(ctx, product(nb, np_), 1),
            "for (int64_t k_u = k_lo; k_u < k_hi; ) {",
            f"const int64_t k_bi = k_u / {np_}, k_p0 = k_u - k_bi * {np_}, k_p1 = CK_MIN({np_}, k_p0 + (k_hi - k_u));",
            f"const int64_t k_n0 = k_p0 * 16, k_n1 = CK_MIN({N}, k_p1 * 16);",
            f"ck_sgemv{M}({K}, k_a + {a_off}, {K}, k_b + {b_off} + k_n0, {N}, k_c + k_bi * {product(M, N)} + k_n0, {N}, "
            "k_n1 - k_n0);",
            "k_u += k_p1 - k_p0;",
            "}"]


def gemm_tiles(nb: int, M: int, N: int, mr: int, nr: int, ctx: KernelContext, call: str,
               fixed: bool = False) -> list[str]:
    """Split the GEMMs of nb batch items over the workers and run `call` once per contiguous
    piece, which sees k_bi (batch item), rows [k_m0, k_m1) and columns [k_n0, k_n1).

    Units are (batch item, row chunk, column unit); a worker takes a contiguous range. Many
    items: whole items (nothing packed twice). Else, A taller than B is wide: row chunks of MR
    rows (each worker reads only its rows of A, which dominate the traffic). Else NR-wide
    column panels (each worker packs only its part of B), and row chunks too if that is not
    enough to go round.

    `fixed`: `call`'s result depends on the piece's size (MKL's sgemm_), so the pieces are cut
    for ctx.pieces workers whatever W is, and a worker runs each piece of its share of them:
    the same calls, and bits, on fewer workers."""
    np_, mb = ceil_div(N, nr), ceil_div(M, mr)
    units = product(nb, np_)
    below = units - 1 if isinstance(units, int) else f"{units} - 1"
    W = ctx.pieces if fixed else ctx.workers
    pieces = ([f"for (int64_t k_v = {ctx.worker}; k_v < {W}; k_v += {ctx.workers}) {{",
               f"const int64_t k_lo = k_units * k_v / {W}, k_hi = k_units * (k_v + 1) / {W};"] if W != ctx.workers else
              ["{", f"const int64_t k_lo = k_units * {ctx.worker} / {W}, k_hi = k_units * ({ctx.worker} + 1) / {W};"])
    return [f"int64_t k_rc = 1, k_pu = {np_};",
            f"if ({nb} >= 4 * {W}) k_pu = 1;",
            f"else if ({M} >= 2 * {N} && {product(nb, mb)} >= {W}) {{ k_rc = {mb}; k_pu = 1; }}",
            f"else if ({units} < {W}) k_rc = CK_MIN({mb}, ({W} + {below}) / {units});",
            f"const int64_t k_units = {nb} * k_rc * k_pu;",
            *pieces,
            "for (int64_t k_u = k_lo; k_u < k_hi; ) {",
            "const int64_t k_bi = k_u / (k_rc * k_pu), k_rem = k_u - k_bi * k_rc * k_pu;",
            "const int64_t k_ri = k_rem / k_pu, k_p0 = k_rem - k_ri * k_pu;",
            "int64_t k_r1 = k_ri + 1, k_p1 = k_p0 + 1;   /* extend over the following units of this item */",
            "if (k_pu > 1) k_p1 = CK_MIN(k_pu, k_p0 + (k_hi - k_u)); else k_r1 = CK_MIN(k_rc, k_ri + (k_hi - k_u));",
            f"const int64_t k_m0 = {mb} * k_ri / k_rc * {mr}, k_m1 = CK_MIN({M}, {mb} * k_r1 / k_rc * {mr});",
            f"const int64_t k_n0 = k_pu > 1 ? k_p0 * {nr} : 0, k_n1 = k_pu > 1 ? CK_MIN({N}, k_p1 * {nr}) : {N};",
            "if (k_m0 < k_m1) {", call, "}",
            "k_u += (k_r1 - k_ri) * (k_p1 - k_p0);",
            "}", "}"]


def _gemm(nb, M, K, N, a_off, b_off, ctx, b=None, m=None, n=None, lda=None, ldb=None, transposed=False) -> list[str]:
    """`b`: B's value when it is one matrix for every row: a constant one comes prepacked.
    `m`, `n`: M's and N's hints where they are run-time sizes (the micro-kernel is chosen for them).
    `lda`, `ldb`: the operands' row strides (default: contiguous); `transposed`: B's element
    (k, j) is at j * ldb + k."""
    lda, ldb = K if lda is None else lda, N if ldb is None else ldb
    mr, nr = choose_variant(M if isinstance(M, int) else m, N if isinstance(N, int) else n)
    if blas_tiles():
        return gemm_tiles(nb, M, N, mr, nr, ctx, blas_tile(transposed, K, f"k_a + {a_off}", lda, f"k_b + {b_off}", ldb,
                                                           f"k_c + k_bi * {product(M, N)}", N), fixed=True)
    packed = ctx.prepacked(b, nr) if b is not None else None
    if packed is not None:   # weights packed once, ahead of time: the driver reads the panels in place
        source, packer = f"const ck_prepacked k_bm = {{ {packed}, {-(-N // nr) * nr} }};\n", "0"
    else:
        packer = f"ck_packb_{'tr' if transposed else 'mat'}_{nr}"
        source = f"const ck_mat k_bm = {{ k_b + {b_off}, {ldb}, {N}, 0 }};\n"
    call = (source + f"ck_sgemm_{mr}x{nr}(k_m1 - k_m0, k_n1 - k_n0, {K}, k_a + {a_off} + k_m0 * {lda}, {lda}, {packer}, "
            f"&k_bm, k_n0, k_c + k_bi * {product(M, N)} + k_m0 * {N}, {N}, {N}, 0, 0);")
    return gemm_tiles(nb, M, N, mr, nr, ctx, call)


def _accumulate(dt, acc: str, a: str, b: str) -> str:
    """acc += a * b, in dt: integers wrap on overflow like torch, not undefined behaviour."""
    if dt in (torch.int64, torch.int32):
        u = "uint64_t" if dt is torch.int64 else "uint32_t"
        return f"{acc} = ({ctype(dt)})(({u}){acc} + ({u}){a} * ({u}){b});"
    return f"{acc} += {a} * {b};"


def _per_output(dt, nb, M, K, N, a_off, b_off, ctx) -> list[str]:
    """Without the GEMM engine (a GPU): every output element a unit of its own, a dot product
    over K in order (as the row loop of `_generic` sums: the same result). A block's threads
    take neighbouring columns, so a GEMV's batch-1 row spreads over every thread of the grid
    (the row loop gave it to one) and the threads' reads of a row of B are adjacent."""
    T = ctype(dt)
    return [split(ctx, product(nb, M, N), 1),
            "for (int64_t k_e = k_lo; k_e < k_hi; ++k_e) {",
            f"const int64_t k_row = k_e / {N}, k_n = k_e - k_row * {N}, k_bi = k_row / {M}, k_m = k_row - k_bi * {M};",
            f"const {T}* k_pa = k_a + {a_off} + k_m * {K}; const {T}* k_pb = k_b + {b_off} + k_n;",
            f"{T} k_s = 0;",
            f"for (int64_t k_k = 0; k_k < {K}; ++k_k) {_accumulate(dt, 'k_s', 'k_pa[k_k]', f'k_pb[k_k * {N}]')}",
            "k_c[k_e] = k_s;",
            "}"]


TILE_K = 32           # columns of A (rows of B) a block's tiles hold at a time
TILE_ROWS_PER_LANE = 4   # outputs each lane of a block adds up, in a column of its tile of C


def fills_tiles(M, K, N, m: int, n: int) -> bool:
    """Whether a product is large enough for `_tiled`: M, N and K at least TILE_K each (run-time
    M and N by their hints, a run-time K taken as large). Below, most of a tile's rows or columns
    would be empty, operands that small sit in the GPU's caches anyway, and the tiled kernel
    costs registers: the persistent kernel's count is about its largest operator's, and tiled
    products took the tests' sample programs from 32-60 registers a thread to 64-80 (sm_80 and
    sm_90; more than 64 are noted by tests/nvcc_all.py: a block of 32 to 128 threads, one an
    SM, still fits many times over)."""
    return all((d if isinstance(d, int) else h) >= TILE_K for d, h in ((M, m), (N, n))) and \
        (not isinstance(K, int) or K >= TILE_K)


def tiled(op: Operation) -> bool:
    """Whether a MATMUL takes `_tiled` on a GPU (where its shared memory must hold the tiles)."""
    _, _, _, M, K, N, m, n = _geometry(op)
    return fills_tiles(M, K, N, m, n)


def tile_columns(threads: int) -> int:
    """Columns of a tile of C for a block of `threads` lanes (a warp's 32: its loads of B's row
    are adjacent, and all read one element of A's, a broadcast)."""
    return 32 if threads % 32 == 0 else threads


def tile_bytes(threads: int) -> int:
    """The shared memory a block of `threads` lanes needs for `_tiled`'s tiles of 8-byte
    elements (the largest): A's rows by TILE_K, TILE_K by B's columns."""
    columns = tile_columns(threads)
    rows = threads // columns * TILE_ROWS_PER_LANE
    return (rows * TILE_K + TILE_K * columns) * 8


def _tiled(dt, nb, M, K, N, a_off, b_off, ctx) -> list[str]:
    """A block's lanes share tiles of C, TILE_ROWS_PER_LANE rows a lane by `tile_columns`: lane
    (r0, c0) holds rows r0, r0 + rs, ... of column c0. For each TILE_K-wide slice of A's rows
    and B's columns, the lanes load both tiles into the block's shared memory together (each
    the same rows and columns it adds up; a warp's loads of a row adjacent), meet, and each adds
    its outputs' products from there; they meet again before the next slice overwrites the
    tiles. Each output is the sum over K in order, as `_per_output`'s dot product (the same
    result); A and B are read from global memory once a tile instead of once an output.
    Its loads are not unrolled and its products unrolled twice (CT_UNROLL): fully unrolled, the
    tests' sample programs took 78-102 registers a thread; so, a program of one 64 x 256 @
    256 x 256 product takes 70 (sm_80) and 61 (sm_90), against 32 with one dot product each."""
    T, R, TK = ctype(dt), TILE_ROWS_PER_LANE, TILE_K
    acc = " ".join(_accumulate(dt, f"k_s[{q}]", f"k_ar[{q} * k_rs * {TK} + k_k]", "k_v") for q in range(R))
    return ["const int k_tn = CT_LANES % 32 == 0 ? 32 : CT_LANES, k_rs = CT_LANES / k_tn, k_tm = k_rs * "
            f"{R}, k_c0 = CT_LANE % k_tn, k_r0 = CT_LANE / k_tn;",
            f"{T}* k_ta = ({T}*)CT_BLOCK_SCRATCH;   /* A's tile: k_tm rows by {TK} */",
            f"{T}* k_tb = k_ta + k_tm * {TK};   /* B's tile: {TK} rows by k_tn */",
            f"const {T}* k_ar = k_ta + k_r0 * {TK};   /* this lane's first row of A's tile */",
            f"const int64_t k_mt = ({M} + k_tm - 1) / k_tm, k_nt = ({N} + k_tn - 1) / k_tn;",
            f"for (int64_t k_t = {ctx.worker} / CT_LANES; k_t < {nb} * k_mt * k_nt; "
            f"k_t += {ctx.workers} / CT_LANES) {{   /* this block's tiles */",
            "const int64_t k_bi = k_t / (k_mt * k_nt), k_m = (k_t / k_nt) % k_mt * k_tm + k_r0, "
            "k_n = k_t % k_nt * k_tn + k_c0;",
            f"const {T}* k_pa = k_a + {a_off} + k_m * {K};   /* this lane's first row of A */",
            f"const {T}* k_pb = k_b + {b_off} + k_n;   /* its column of B */",
            f"const int k_rows = (int)CK_MIN({R}, ({M} - k_m + k_rs - 1) / k_rs), k_in = k_n < {N};   /* its outputs in C */",
            f"{T} k_s[{R}] = {{0}};",
            f"for (int64_t k_k0 = 0; k_k0 < {K}; k_k0 += {TK}) {{",
            f"const int k_kn = (int)CK_MIN({TK}, {K} - k_k0);",
            f"CT_UNROLL(1) for (int k_i = 0; k_i < {R}; ++k_i)   /* A: its rows, columns c0, c0 + tn, ... */",
            f"CT_UNROLL(1) for (int k_k = k_c0; k_k < {TK}; k_k += k_tn)",
            f"k_ta[(k_r0 + k_i * k_rs) * {TK} + k_k] = k_i < k_rows && k_k < k_kn ? k_pa[k_i * k_rs * {K} + k_k0 + k_k] : 0;",
            f"CT_UNROLL(1) for (int k_k = k_r0; k_k < {TK}; k_k += k_rs)   /* B: its column, rows r0, r0 + rs, ... */",
            f"k_tb[k_k * k_tn + k_c0] = k_in && k_k < k_kn ? k_pb[(k_k0 + k_k) * {N}] : 0;",
            "CT_BLOCK_BARRIER();",
            "CT_UNROLL(2) for (int k_k = 0; k_k < k_kn; ++k_k) {",
            f"const {T} k_v = k_tb[k_k * k_tn + k_c0];",
            acc,
            "}",
            "CT_BLOCK_BARRIER();   /* the tiles are the next slice's */",
            "}",
            f"{T}* k_pc = k_c + k_bi * {product(M, N)} + k_m * {N} + k_n;",
            f"for (int k_i = 0; k_i < {R}; ++k_i) if (k_i < k_rows && k_in) k_pc[k_i * k_rs * {N}] = k_s[k_i];",
            "}"]


def _generic(dt, nb, M, K, N, a_off, b_off, ctx) -> list[str]:
    T = ctype(dt)
    upd = _accumulate(dt, "k_pc[k_n]", "k_v", f"k_pb[k_k * {N} + k_n]")
    return _rows(nb, M, ctx) + [
        f"const {T}* k_pa = k_a + {a_off} + k_m * {K}; const {T}* k_pb = k_b + {b_off};",
        f"{T}* k_pc = k_c + k_row * {N};",
        f"for (int64_t k_n = 0; k_n < {N}; ++k_n) k_pc[k_n] = 0;",
        f"for (int64_t k_k = 0; k_k < {K}; ++k_k) {{ const {T} k_v = k_pa[k_k];",
        ctx.simd(),
        f"for (int64_t k_n = 0; k_n < {N}; ++k_n) {upd} }}",
        "}"]
