"""Roofline: what one inference must compute and move, against what this machine can do.

Counted from the traced graph (the straight-line program one inference executes, with
its loops unrolled, its taken branches only and its recursion flattened):
  flops  matmul 2*numel(out)*K (= 2*M*N*K, batched too); conv2d 2*numel(out)*Cin/groups*kh*kw;
         pooling numel(out)*kh*kw; elementwise numel(out); reductions and softmax numel(in)
  bytes  constants read (each once: a weight reused across unrolled steps stays in cache)
         + program inputs read + every op output written
Views (reshape, permute, expand, basic-index select) and sources (constants, scalars)
cost nothing: a compiler never has to materialize them. `bytes_min` (constants + inputs +
outputs, i.e. everything fused) is recorded too, but the bound uses `bytes`.
The machine's side is measured in the same run: bandwidth by a large tensor copy, peak by
a large float32 matmul on all cores.
"""
from __future__ import annotations

import math
import time

import torch

from cocktailer.ir import CONTROL, ELEMENTWISE, Op, Program

FREE = frozenset({Op.CONST, Op.SCALAR, Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SELECT})
REDUCTION = frozenset({Op.SUM, Op.MEAN, Op.PROD, Op.AMAX, Op.AMIN, Op.ANY, Op.ALL, Op.ARGMAX, Op.ARGMIN,
                       Op.SOFTMAX, Op.LOG_SOFTMAX})


def _nbytes(value) -> int:
    t = value.type
    return t.numel * torch.empty((), dtype=t.dtype).element_size()


def op_flops(op) -> int:
    out = op.results[0].type.numel if op.results else 0
    kind = op.op
    if kind is Op.MATMUL:
        return 2 * out * op.operands[0].type.shape[-1]
    if kind is Op.CONV2D:
        return 2 * out * math.prod(op.operands[1].type.shape[1:])
    if kind in (Op.MAX_POOL2D, Op.AVG_POOL2D):
        return out * math.prod(op.attrs["kernel"])
    if kind in ELEMENTWISE:
        return out
    if kind in REDUCTION:
        return op.operands[0].type.numel
    return 0   # sources, views and data movement (cat, update, gather) only move bytes


def count(program: Program) -> dict:
    """flops, bytes and bytes_min of one run of a straight-line (traced) program."""
    if any(op.op in CONTROL for op in program.walk()):
        raise ValueError("count the traced graph: this program still has control flow")
    flops = written = 0
    constants: set[str] = set()
    for op in program.walk():
        flops += op_flops(op)
        if op.op is Op.CONST:
            constants.add(op.attrs["name"])
        elif op.op not in FREE:
            written += sum(_nbytes(r) for r in op.results)
    main = program.main
    weights = sum(program.constants[name].numel() * program.constants[name].element_size() for name in constants)
    inputs = sum(_nbytes(p) for p in main.params)
    outputs = sum(_nbytes(v) for v in main.body.yields)
    return {"flops": flops, "bytes": weights + inputs + written, "bytes_min": weights + inputs + outputs,
            "weight_bytes": weights, "ops": sum(1 for _ in program.walk())}


def bound_seconds(counts: dict, machine: dict) -> float:
    """max(flops/peak, bytes/bandwidth): no implementation can beat it on this machine."""
    return max(counts["flops"] / machine["peak_flops"], counts["bytes"] / machine["bandwidth_bytes_s"])


def measure_machine(quick: bool = False) -> dict:
    """This machine's memory bandwidth (bytes/s) and float32 matmul peak (flops/s)."""
    return {"bandwidth_bytes_s": _bandwidth(128 if quick else 256), "peak_flops": _peak(1024 if quick else 2048),
            "torch_threads": torch.get_num_threads()}


def _best_seconds(fn, repeats: int) -> float:
    fn()   # first touch: page faults and thread start-up are not bandwidth
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _bandwidth(megabytes: int) -> float:
    # Far larger than the last-level cache, so the copy streams from and to DRAM.
    src = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), repeats=5)
    return 2 * src.numel() * 4 / seconds   # read the source + write the destination


def _peak(n: int) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    seconds = _best_seconds(lambda: torch.matmul(a, b, out=out), repeats=3)
    return 2 * n**3 / seconds
