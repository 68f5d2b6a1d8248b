"""The "cpu" backend: IR Program -> uProgram -> C/OpenMP -> shared library -> callable."""
from __future__ import annotations

import functools

from cocktailer.codegen import kernels
from cocktailer.codegen.renderer import CPU, assemble, render
from cocktailer.errors import CocktailerError
from cocktailer.ir import Op, Program
from cocktailer.passes import run_pipeline
from cocktailer.passes.calls import gather_independent_calls
from cocktailer.passes.dce import dce
from cocktailer.passes.fission import distribute_loops
from cocktailer.passes.hoist import hoist_invariant_matmuls
from cocktailer.passes.unroll import unroll_loops
from cocktailer.passes.wavefront import wavefront_order
from cocktailer.runtime.compiler import load_library
from cocktailer.runtime.native import CompiledProgram
from cocktailer.runtime.waves import slower_side_by_side
from cocktailer.schedule import Device, SimplePolicy
from cocktailer.schedule.policy import useful_workers
from cocktailer.schedule.memory import plan_memory

DEFAULT_MAX_DEPTH = 256

# The cpu backend's own rewrites, on its copy of the program (the other backends, and the
# benchmark's JAX ports of the captured program, do not see them).
CPU_PIPELINE = [("distribute_loops", distribute_loops), ("hoist_invariant_matmuls", hoist_invariant_matmuls),
                ("dce_after_hoisting", dce)]


class BackendUnavailable(CocktailerError):
    """This backend cannot run this program (the reason says why); another backend can."""


def unsupported_ops(program: Program) -> list[str]:
    return sorted({f"{op.op.name.lower()} ({', '.join(str(v.type) for v in op.operands + op.results)})"
                   for op in program.walk() if op.op not in (Op.IF, Op.LOOP, Op.CALL, Op.CONST)
                   and not kernels.supported(op)})


def check_native(program: Program, backend: str):
    """Raise BackendUnavailable unless a native CPU backend can run every op of `program`."""
    if program.device.type != "cpu":
        raise BackendUnavailable(f"the {backend} backend runs CPU tensors; these are on {program.device}")
    missing = unsupported_ops(program)
    if missing:
        raise BackendUnavailable(f"no native kernel for: {'; '.join(missing)}")


def cpu_backend(program: Program, workers: int | None = None, max_depth: int = DEFAULT_MAX_DEPTH,
                fan_out: bool = False, unroll: int = 1, rewrite: bool = True, wavefront: bool = False,
                fine_barriers: bool = True, measure_waves: bool = True) -> CompiledProgram:
    """`fan_out`: independent calls (a recursion's subtrees) run at once on groups of workers.
    `unroll`: innermost loops with a trip count run this many steps per iteration.
    `wavefront`: Rammer's co-scheduling: independent ops side by side on groups of workers
    where each wave measured faster so (runtime.waves; `measure_waves=False`: where the
    work-balance rule alone says so),
    `fine_barriers` (with wavefront): where not every worker must wait for every other, a
    fine-grained barrier (step array) instead of a global one.
    `rewrite`: run CPU_PIPELINE (off only to measure what it buys)."""
    check_native(program, "cpu")
    device = Device.cpu(workers or useful_workers(program, Device.cpu().workers))
    passes = (CPU_PIPELINE if rewrite else []) + \
        ([("unroll_loops", functools.partial(unroll_loops, factor=unroll))] if unroll > 1 else []) + \
        ([("gather_independent_calls", gather_independent_calls)] if fan_out else []) + \
        ([("wavefront_order", wavefront_order)] if wavefront else [])
    if fan_out or wavefront or any(op.op is Op.LOOP for op in program.walk()):   # what the passes rewrite:
        program = run_pipeline(program.clone(), passes)          # a traced graph has no loop (and 50,000 ops)
    slower = frozenset(slower_side_by_side(program, device)) if wavefront and measure_waves else frozenset()
    plan = plan_memory(program, fan_out, device.workers if wavefront else 0, slower)
    policy = SimplePolicy(device, can_run_natively=kernels.supported, fan_out=fan_out, wavefront=wavefront,
                          fine_barriers=fine_barriers, excluded_waves=slower)
    uprogram = policy.schedule(program, plan, "L1")
    rendered = render(uprogram, plan, CPU)
    handle, path = load_library(assemble([rendered]))
    return CompiledProgram(program, rendered, (handle, str(path)), device.workers, max_depth, uprogram)
