"""The "cuda" backend: the cpu backend's uProgram rendered in the CUDA dialect, one persistent
kernel with a block per worker (vEU) and the control flow inside (codegen/dialect.py `cuda`,
codegen/ct_cuda.h).

    CUDA_STAGES: blocks -> IR passes -> fuse -> memory plan -> placement -> render -> compile -> load

Control flow that cannot sit at L1 (it controls an op no kernel runs) runs at L2: the host
backend's executor keeps it in Python and launches one kernel per basic block, each rendered
in the CUDA dialect; constructs whose ops all have kernels still run inside the kernel around
them (Algorithm 1's Constraint 1, as on the cpu backend).

Two targets of the same source:
- CUDA tensors: nvcc compiles it for their GPU (`runtime.compiler.gpu_arch`), a block per SM
  unless `workers` says otherwise, and the runtime binds device memory (the tensors, the
  arena, the stack and the control state live on the GPU; ct_cuda.h's launch copies the
  pointer tables and err[] over). No GPU has run this path yet: CI has none; without one it is
  compiled and loaded, and its launch fails with the CUDA runtime's reason (tests/test_cuda.py).
- CPU tensors with `virtual_gpu=True`: the CPU execution mode, a virtual GPU of `workers`
  blocks of `threads` threads, each an OS thread, compiled by the host's C++ compiler; that is
  how every CUDA program is checked on machines without a GPU. Without `virtual_gpu`, the
  driver builds CPU tensors' program as the cpu backend would (host fallback and measured
  policy included), with one warning."""
from __future__ import annotations

from dataclasses import replace

import torch

from cocktailer.backend.config import Config
from cocktailer.backend.cpu import ir_passes
from cocktailer.backend.host import build_host
from cocktailer.backend.native import NATIVE_STAGES, Build, run_stages, unsupported_ops
from cocktailer.backend.record import Record
from cocktailer.ir import Program
from cocktailer.runtime.compiler import find_nvcc
from cocktailer.runtime.native import CompiledProgram

# Blocks of a virtual GPU when `workers` is not given: enough to exercise the grid barriers and
# the splitting of work between blocks; its threads are OS threads, so more would only be slower.
VIRTUAL_BLOCKS = 2


def choose_blocks(b: Build) -> str:
    """SetResource: a block per worker."""
    if b.config.workers:
        return f"{b.config.workers} (asked for)"
    b.config = b.record.config = replace(b.config, workers=default_blocks(b.program))
    where = "a block per SM" if b.program.device.type == "cuda" else "blocks of the virtual GPU"
    return f"{b.config.workers} ({where})"


def default_blocks(program: Program) -> int:
    """The persistent grid when `workers` is not given: on a GPU a block per SM, as Rammer's vEU
    per SM (the cooperative launch refuses a grid that cannot be resident at once)."""
    if program.device.type == "cuda":
        return torch.cuda.get_device_properties(program.device).multi_processor_count
    return VIRTUAL_BLOCKS


CUDA_STAGES = [("blocks", choose_blocks), ("IR passes", ir_passes), *NATIVE_STAGES]


def gpu_unavailable(device: torch.device, config: Config) -> str:
    """Why the cuda backend cannot run a program whose tensors are on `device` (empty: it can)."""
    if device.type != "cuda":
        return f"the cuda backend runs CUDA tensors (or CPU ones on a virtual GPU); these are on {device}"
    if config.virtual_gpu:
        return "a virtual GPU runs CPU tensors (its memory is the host's); these are on " + str(device)
    if find_nvcc() is None:
        return "nvcc was not found (set NVCC, or install the CUDA toolkit): the cuda backend cannot compile for " \
               + str(device)
    return ""


# Without virtual_gpu, backend.driver builds the program as the cpu backend does, with this notice
NO_GPU = ("the cuda backend runs CUDA tensors on their GPU; these are CPU tensors, so the cpu backend runs them "
          "(options virtual_gpu=True runs the generated CUDA on a virtual GPU instead)")


def build_cuda(program: Program, config: Config, record: Record):
    """The program on its GPU, or on a virtual GPU (config.virtual_gpu, CPU tensors): one
    persistent kernel, or, where an op has no kernel, kernels launched per basic block by the
    host (L2)."""
    if config.policy != "simple":
        record.notices.append("the cuda backend places by the simple policy only; the measured one was not run")
    config = replace(config, policy="simple")
    missing = unsupported_ops(program)
    if missing:
        record.notices.append(f"no CUDA kernel for {'; '.join(missing)}: these ops run on the host, and so does "
                              "the control flow around them (L2: a kernel launch per basic block)")
        record.config = replace(config, workers=config.workers or default_blocks(program), native_from=0)
        return build_host(program, record.config, record)
    build = Build(program, config, record)
    run_stages(CUDA_STAGES, build)
    return build.parts[0].compiled
