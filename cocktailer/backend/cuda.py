"""The "cuda" backend: the cpu backend's uProgram rendered in the CUDA dialect, one persistent
kernel with a block per worker (vEU) and the control flow inside (codegen/dialect.py `cuda`,
codegen/ct_cuda.h).

    CUDA_STAGES: blocks -> IR passes -> fuse -> memory plan -> placement -> render -> compile -> load

Control flow that cannot sit at L1 (it controls an op no kernel runs) runs at L2: the host
backend's executor keeps it in Python and launches one kernel per basic block, each rendered
in the CUDA dialect; constructs whose ops all have kernels still run inside the kernel around
them (Algorithm 1's Constraint 1, as on the cpu backend).

What runs today is the CPU execution mode of the same source (`virtual_gpu=True`): a virtual
GPU of `workers` blocks of `threads` threads, each an OS thread, compiled by the host's C++
compiler; that is how every CUDA program is checked on machines without a GPU. Without it, the
driver builds the program as the cpu backend would (host fallback and measured policy included),
with one warning: launching on a real GPU needs the runtime to
bind device memory, which is not built yet (the launch itself is in ct_cuda.h and compiles with
nvcc: `runtime.compiler.compile_cuda`)."""
from __future__ import annotations

from dataclasses import replace

from cocktailer.backend.config import Config
from cocktailer.backend.cpu import ir_passes
from cocktailer.backend.host import build_host
from cocktailer.backend.native import NATIVE_STAGES, Build, run_stages, unsupported_ops
from cocktailer.backend.record import Record
from cocktailer.ir import Program
from cocktailer.runtime.native import CompiledProgram

# Blocks of a virtual GPU when `workers` is not given: enough to exercise the grid barriers and
# the splitting of work between blocks; its threads are OS threads, so more would only be slower.
VIRTUAL_BLOCKS = 2


def choose_blocks(b: Build) -> str:
    """SetResource: a block per worker."""
    if b.config.workers:
        return f"{b.config.workers} (asked for)"
    b.config = b.record.config = replace(b.config, workers=VIRTUAL_BLOCKS)
    return f"{VIRTUAL_BLOCKS} blocks of the virtual GPU"


CUDA_STAGES = [("blocks", choose_blocks), ("IR passes", ir_passes), *NATIVE_STAGES]


# Without virtual_gpu, backend.driver builds the program as the cpu backend does, with this notice
NO_GPU = ("the cuda backend does not run on a GPU yet (its programs run on a virtual GPU: options "
          "virtual_gpu=True); running the cpu backend instead")


def build_cuda(program: Program, config: Config, record: Record):
    """The program on a virtual GPU (config.virtual_gpu): one persistent kernel, or, where an
    op has no kernel, kernels launched per basic block by the host (L2)."""
    if config.policy != "simple":
        record.notices.append("the cuda backend places by the simple policy only; the measured one was not run")
    config = replace(config, policy="simple")
    missing = unsupported_ops(program)
    if missing:
        record.notices.append(f"no CUDA kernel for {'; '.join(missing)}: these ops run on the host, and so does "
                              "the control flow around them (L2: a kernel launch per basic block)")
        record.config = replace(config, workers=config.workers or VIRTUAL_BLOCKS, native_from=0)
        return build_host(program, record.config, record)
    build = Build(program, config, record)
    run_stages(CUDA_STAGES, build)
    return build.parts[0].compiled
