"""C kernels for the IR's data ops: one renderer per op, each returning the C statements that
every worker runs inside the program's parallel region, computing its own share of the result.

    KERNELS[op.op](op, ctx) -> str     # C statements (one block), no barriers, no allocation
    PRELUDE                            # C helpers they call, included once per generated file
    supported(op) -> bool              # False where the C kernels do not handle a case

Each renderer agrees with `cocktailer.ir.ops.SEMANTICS` (tests/test_kernels.py checks them one
by one against it). Shapes are static, so they are emitted as literals.

What the backend core may rely on:
- Map ops (unary incl. CAST and NOT, binary, WHERE, FULL) give worker w the output elements
  `ck_range(numel, 64 / itemsize(result), w, W)` (contiguous blocks cut at cache lines; at
  single elements where the dialect says so, `KernelContext.line_shares`) and
  read each operand of the result's shape only at the elements they write; so two such ops
  with the same (numel, itemsize) need no barrier between them. Operands of other shapes
  (broadcast) are read anywhere.
- A result must not overlap its operands, with these exceptions: a map op may write over an
  operand of the result's shape and itemsize (same buffer); RESHAPE, UPDATE and SCATTER may
  write over their first operand (same buffer), and then skip the copy.
- `fail` is only called before a kernel writes anything, on data every worker reads whole
  (dynamic indices, GATHER's and SCATTER's index tensors, a broadcast integer divisor), so all workers take
  it together.
- Kernels never allocate; the GEMM keeps its packed blocks on the worker's stack (up to
  ~600 KiB for convolutions/GEMMs with more than 64 output rows, 200 KiB otherwise), which the
  default 8 MiB thread stacks hold (keep OMP_STACKSIZE, if set, above 1 MiB).

| file           | ops                                                                       |
|----------------|---------------------------------------------------------------------------|
| elementwise.py | SCALAR FULL ARANGE, unary incl. CAST NOT, binary (broadcast, promotion), WHERE |
| reduce.py      | SUM MEAN PROD AMAX AMIN ANY ALL ARGMAX ARGMIN SOFTMAX LOG_SOFTMAX          |
| matmul.py      | MATMUL (GEMV/GEMM paths over gemm.py's micro-kernels)                      |
| conv.py        | CONV2D (implicit GEMM) MAX_POOL2D AVG_POOL2D                               |
| movement.py    | RESHAPE PERMUTE EXPAND CAT SELECT UPDATE GATHER SCATTER                    |
| gemm.py        | the float32 GEMM engine in C (part of PRELUDE)                             |
| convgemm.py    | its convolution side: im2col packer, direct (no im2col) convolution        |
| prelude.py     | PRELUDE: math helpers, work splitting                                      |
| common.py      | literals, strides, broadcasting, the loop nest of every map-like op        |
| context.py     | KernelContext, ctype                                                       |
| standalone.py  | single ops as a shared library of their own, for tests and benchmarks      |
"""
from __future__ import annotations

from typing import Callable

import torch

from cocktailer.codegen.dialect import SCRATCH_PER_LANE
from cocktailer.codegen.kernels import conv, elementwise, matmul, movement, reduce
from cocktailer.codegen.kernels.common import SUPPORTED_DTYPES, is_float
from cocktailer.codegen.kernels.context import KernelContext, ctype
from cocktailer.codegen.kernels.prelude import PORTABLE_PRELUDE, PRELUDE
from cocktailer.ir import Op, Operation
from cocktailer.ir.ops import BINARY, UNARY

Renderer = Callable[[Operation, KernelContext], str]

KERNELS: dict[Op, Renderer] = {
    Op.SCALAR: elementwise.render_scalar, Op.FULL: elementwise.render_full, Op.ARANGE: elementwise.render_arange,
    **{op: elementwise.render_unary for op in UNARY},
    **{op: elementwise.render_binary for op in BINARY},
    Op.WHERE: elementwise.render_where,
    **{op: reduce.render_reduce for op in (Op.SUM, Op.MEAN, Op.PROD, Op.AMAX, Op.AMIN, Op.ANY, Op.ALL)},
    Op.ARGMAX: reduce.render_argreduce, Op.ARGMIN: reduce.render_argreduce,
    Op.SOFTMAX: reduce.render_softmax, Op.LOG_SOFTMAX: reduce.render_softmax,
    Op.MATMUL: matmul.render_matmul,
    Op.CONV2D: conv.render_conv2d, Op.MAX_POOL2D: conv.render_pool, Op.AVG_POOL2D: conv.render_pool,
    Op.RESHAPE: movement.render_reshape, Op.PERMUTE: movement.render_permute, Op.EXPAND: movement.render_expand,
    Op.CAT: movement.render_cat, Op.SELECT: movement.render_select, Op.UPDATE: movement.render_update,
    Op.GATHER: movement.render_gather, Op.SCATTER: movement.render_scatter, Op.DIM: elementwise.render_dim,
    Op.FUSED: elementwise.render_fused,
}

_INTEGER_INDEX = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def supported(op: Operation) -> bool:
    """Whether KERNELS renders `op` correctly; the backend refuses the program at compile time if not."""
    kind = op.op
    if kind not in KERNELS:
        return False
    dtypes = [v.type.dtype for v in (*op.operands, *op.results)]
    if any(dt not in SUPPORTED_DTYPES for dt in dtypes):
        return False
    out = op.results[0].type.dtype
    if kind in UNARY:
        return elementwise.unary_supported(op)
    if kind in BINARY:
        return elementwise.binary_supported(op)
    if kind in (Op.MEAN, Op.SOFTMAX, Op.LOG_SOFTMAX):
        return is_float(out)
    if kind is Op.MATMUL:
        return matmul.supported(op)
    if kind is Op.CONV2D:
        return conv.supported(op)
    if kind in (Op.MAX_POOL2D, Op.AVG_POOL2D):
        return is_float(out) and op.operands[0].type.dtype == out
    if kind in (Op.SELECT, Op.UPDATE):   # a ("dyn",) index is 0-d, a ("lane",) one has one entry per lane
        first_dyn = 1 if kind is Op.SELECT else 2
        items = [item[0] for item in op.attrs["key"] if item[0] in ("dyn", "lane")]
        return all(v.type.dtype in _INTEGER_INDEX and v.type.rank == (item == "lane")
                   for v, item in zip(op.operands[first_dyn:], items))
    if kind is Op.GATHER:
        return op.operands[1].type.dtype in _INTEGER_INDEX
    if kind is Op.SCATTER:
        return op.operands[1].type.dtype in _INTEGER_INDEX and op.operands[1].type.rank == 1
    return True


def kernel_scratch_bytes(threads: int, products: bool = True) -> int:
    """The shared memory a block of `threads` lanes gives its kernels (CT_BLOCK_SCRATCH): each
    lane's part of a reduction the block shares, and with `products` (a program with a tiled
    MATMUL, `matmul.tiled`; assumed where not known) the tiles where those need more."""
    return max(SCRATCH_PER_LANE * threads, matmul.tile_bytes(threads) if products else 0)


__all__ = ["KERNELS", "PORTABLE_PRELUDE", "PRELUDE", "KernelContext", "ctype", "kernel_scratch_bytes", "supported"]
