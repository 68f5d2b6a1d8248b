"""The cuda backend where there is no GPU: per zoo model (small size, batch 1), what nvcc says
of its kernel and what one inference does, against eager PyTorch. No time is measured.

- nvcc, for sm_80 and sm_90: registers per thread, shared memory (static, plus what the launch
  gives each block: the kernels' scratch and the control state where it fits), stack, spills, warnings;
  how many blocks of THREADS threads an H100 SM holds, and so whether a persistent grid of one
  block per SM (132) fits (the cooperative launch refuses a grid that does not).
- one inference, counted on the virtual GPU (the same source in its CPU execution mode): kernel
  launches (one: the whole program), operators executed, grid barriers, fine-grained steps,
  bytes the operators and copies read and write, host round trips (none: control flow stays on
  the device); and for eager PyTorch, from its dispatched ATen ops: kernels (ops that are not
  views; on a GPU each is at least one launch, and each launch boundary is a grid-wide
  barrier), the bytes they read and write, and host round trips (a value read by Python to
  decide control flow: `.item()`, `if tensor`).

Results agree with eager before anything is counted. Writes results.json (machine, versions,
commit, raw counts) and table.md.

    python -m bench.cuda_report --out bench/results/cuda-<commit>
"""
from __future__ import annotations

import argparse
import ctypes
import pathlib
import subprocess
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import cocktailer
from bench import machine
from bench.results import write_small_run
from cocktailer import models
from cocktailer.runtime.compiler import compile_cuda
from cocktailer.schedule.device import H100, resident_blocks_per_sm

THREADS = 32          # threads per block of the generated kernels
BLOCKS = 2            # blocks of the virtual GPU the counts are taken on (the counts do not depend on it)
ARCHS = ("sm_80", "sm_90")
TALLIES = ("operators", "bytes", "grid_barriers", "steps", "shared_bytes")   # ct_cuda.h's CT_T_* order


class EagerCounts(TorchDispatchMode):
    """ATen ops as eager PyTorch dispatches them: kernels, their bytes, host round trips."""

    def __init__(self):
        super().__init__()
        self.kernels = self.bytes = self.host_round_trips = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        schema = func._schema
        if func is torch.ops.aten._local_scalar_dense.default:
            self.host_round_trips += 1
        elif not (any(r.alias_info is not None for r in schema.returns) and not schema.is_mutable):   # not a view
            self.kernels += 1
            tensors = [x for x in (*_leaves(args), *_leaves(kwargs or {}), *_leaves(out)) if isinstance(x, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
        return out


def _leaves(x):
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        return [y for item in x for y in _leaves(item)]
    return [x]


def _flat(x):
    return [x] if isinstance(x, torch.Tensor) else [y for item in x for y in _flat(item)]


def report(name: str) -> dict:
    w = models.make(name, batch=1, size="small", seed=0)
    fast = cocktailer.compile(w.model, w.inputs, backend="cuda",
                              options={"virtual_gpu": True, "workers": BLOCKS, "threads": THREADS})
    (_, executable), = fast.cache.values()
    tallies = ctypes.CDLL(executable.library).ct_tallies
    tallies.argtypes = [ctypes.POINTER(ctypes.c_int64)]
    counts = (ctypes.c_int64 * len(TALLIES))()
    fast(*w.inputs)                       # arms the program (first call)
    tallies(counts)                       # read and reset
    out = fast(*w.inputs)
    tallies(counts)
    expected = w.model(*w.inputs)
    error = max((a - b).abs().max().item() for a, b in zip(_flat(out), _flat(expected)))
    assert error < 1e-3, f"{name}: the virtual GPU's result is off by {error}"
    eager = EagerCounts()
    with eager:
        w.model(*w.inputs)
    kernels = {}
    dynamic_shared = counts[TALLIES.index("shared_bytes")]   # what the launch gives each block (H100's limit)
    for arch in ARCHS:
        (k,) = compile_cuda(executable.record.source, arch)
        per_sm = resident_blocks_per_sm(H100, THREADS, k.registers, k.shared_bytes + dynamic_shared)
        kernels[arch] = {"registers": k.registers, "shared_bytes": k.shared_bytes + dynamic_shared,
                         "static_shared_bytes": k.shared_bytes, "stack_bytes": k.stack_bytes,
                         "spill_bytes": k.spill_bytes, "warnings": list(k.warnings), "h100_blocks_per_sm": per_sm,
                         "h100_fits_one_block_per_sm": per_sm >= 1}
    return {"cocktailer": {"launches": 1, "host_round_trips": 0, **dict(zip(TALLIES, counts))},
            "eager": {"kernels": eager.kernels, "bytes": eager.bytes, "host_round_trips": eager.host_round_trips},
            "nvcc": kernels, "max_abs_error": error}


def table(data: dict) -> str:
    lines = ["# The cuda backend without a GPU: nvcc's resources and one inference's counts (small, batch 1)", "",
             machine.summary(data["machine"]) + f"; nvcc {data['nvcc_version']}",
             f"- kernels of {THREADS} threads a block; H100: {H100.sms} SMs; counts on a virtual GPU of {BLOCKS} blocks",
             "", "| model | regs sm_80/90 | spills | shared B/block | blocks/SM | kernels eager / operators ours | launches eager / ours "
             "| grid barriers | steps | host round trips eager / ours | MB moved eager / ours |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in data["models"].items():
        n, c, e = r["nvcc"], r["cocktailer"], r["eager"]
        lines.append(f"| {name} | {n['sm_80']['registers']}/{n['sm_90']['registers']} | "
                     f"{n['sm_80']['spill_bytes']}/{n['sm_90']['spill_bytes']} B | {n['sm_90']['shared_bytes']} | "
                     f"{n['sm_90']['h100_blocks_per_sm']} | "
                     f"{e['kernels']} / {c['operators']} | {e['kernels']} / {c['launches']} | {c['grid_barriers']} | "
                     f"{c['steps']} | {e['host_round_trips']} / {c['host_round_trips']} | "
                     f"{e['bytes'] / 1e6:.3f} / {c['bytes'] / 1e6:.3f} |")
    lines += ["", "Eager's kernels are its ATen ops that are not views, each at least one launch on a GPU; ours "
              "are the IR's operators after the passes (scalar index and size ops included), all inside the one "
              "persistent kernel, between which the grid barriers and steps synchronize blocks. Bytes: what each "
              "operator (and copy) reads and writes, counted the same way for both. Not measured: time (no GPU "
              "was lent)."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(models.names()))
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/cuda-report"))
    args = p.parse_args(argv)
    torch.set_grad_enabled(False)
    rows = {}
    for name in args.models.split(","):
        rows[name] = report(name)
        print(f"{name}: {rows[name]['cocktailer']}", file=sys.stderr, flush=True)
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    data = {"machine": machine.describe(), "nvcc_version": nvcc, "threads": THREADS, "virtual_blocks": BLOCKS,
            "models": rows}
    write_small_run(args.out, data, table(data))


if __name__ == "__main__":
    main()
