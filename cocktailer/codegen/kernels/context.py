"""What a kernel renderer needs from the backend core: how to address values, who the
worker is, how to report a run-time error, fresh C names, and the dialect's vector loops."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

import torch

from cocktailer.codegen.dialect import CPU
from cocktailer.ir import Value

_CTYPES = {
    torch.float32: "float", torch.float64: "double", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "uint8_t",
}


def ctype(dtype: torch.dtype) -> str:
    """The C element type of a tensor of `dtype` (bool is a 0/1 byte, as torch stores it)."""
    try:
        return _CTYPES[dtype]
    except KeyError:
        raise NotImplementedError(f"the C kernels do not support dtype {dtype}") from None


def _static_size(dim) -> str:
    return f"{dim}"   # a Sym raises SymbolicSizeError: this backend has no sizes at call time


def _default_fail(message: str) -> str:
    return "{ err[0] = 1; goto ct_fail; }"


_names = itertools.count()


def _default_fresh(prefix: str) -> str:
    return f"{prefix}_{next(_names)}"


@dataclass
class KernelContext:
    ptr: Callable[[Value], str]        # C expression: `<ctype>*` to the value's first element (contiguous, row-major)
    worker: str = "w"                  # C expression: this worker's index, 0 <= w < W
    workers: str = "W"                 # C expression: number of workers
    fail: Callable[[str], str] = field(default=_default_fail)   # C statement: record a run-time error, leave the kernel
    fresh: Callable[[str], str] = field(default=_default_fresh)  # a unique C identifier
    # C expression: `const float*` to a constant B prepacked for NR-wide panels (gemm.prepack_b),
    # or None where the backend does not prepack (the kernel then packs B as it goes)
    prepacked: Callable[[Value, int], str | None] = field(default=lambda value, nr: None)
    # the annotation of a vector loop (L0 lanes), with reductions like "+:acc" (the dialect's)
    simd: Callable[..., str] = field(default=CPU.simd)
    # C expression: a dim's size, a number or a symbolic size read at call time
    size: Callable[[object], str] = field(default=_static_size)
    # the GEMM engine (gemm.py, convgemm.py: GCC vector extensions, x86 intrinsics) is in the
    # prelude; False for a dialect whose kernels run on a GPU: products take plain loops
    engine: bool = True
    # work split at 64-byte lines (`split`'s grain): on a CPU no two workers write one line
    # (false sharing); False for a GPU, where each thread takes single elements and a warp's
    # threads take adjacent ones (its loads coalesce), and a small op still reaches every thread
    line_shares: bool = True
    # a worker is a block of lanes that call every kernel together (CUDA), each with its own
    # sub-share (worker w*CT_LANES + CT_LANE of W*CT_LANES): a kernel may instead take the block's
    # share and split each output over the lanes, which then meet at CT_BLOCK_BARRIER() and
    # combine partial results in CT_BLOCK_SCRATCH (CT_SCRATCH_PER_LANE bytes a lane)
    cooperative: bool = False
    # C expression: the workers the program is compiled for (W when every worker runs it): a
    # kernel whose result depends on how its work is cut (MKL's GEMM: its kernel and summation
    # order follow a call's tile sizes) cuts it for this count whatever W is, so that a call the
    # runtime runs on fewer workers (native.Workers, on a busy machine) gives the same bits
    pieces: str = "W"
