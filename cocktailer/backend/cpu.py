"""The "cpu" backend: the whole program, control flow included, as one native call.

    CPU_STAGES: workers -> IR passes -> measure waves -> memory plan -> placement -> render
                -> compile -> load

The IR passes are the ones the configuration selects, on the backend's own copy of the
program (the other backends, and the benchmark's JAX ports of the captured program, do not
see them)."""
from __future__ import annotations

import functools
from dataclasses import replace

from cocktailer.backend.config import Config
from cocktailer.backend.native import NATIVE_STAGES, Build, Part, run_stages
from cocktailer.backend.record import Record
from cocktailer.backend.waves import slower_side_by_side
from cocktailer.ir import Op, Program
from cocktailer.passes import run_pipeline
from cocktailer.passes.calls import gather_independent_calls
from cocktailer.passes.dce import dce
from cocktailer.passes.fission import distribute_loops
from cocktailer.passes.hoist import hoist_invariant_matmuls
from cocktailer.passes.unroll import unroll_loops
from cocktailer.passes.wavefront import wavefront_order
from cocktailer.runtime.native import CompiledProgram, default_workers
from cocktailer.schedule.policy import useful_workers

# The backend's rewrites for every program (`rewrite=False` turns them off, to measure them).
CPU_PIPELINE = [("distribute_loops", distribute_loops), ("hoist_invariant_matmuls", hoist_invariant_matmuls),
                ("dce_after_hoisting", dce)]


def cpu_passes(config: Config) -> list:
    """The IR passes `config` selects, in the order they run."""
    return (CPU_PIPELINE if config.rewrite else []) + \
        ([("unroll_loops", functools.partial(unroll_loops, factor=config.unroll))] if config.unroll > 1 else []) + \
        ([("gather_independent_calls", gather_independent_calls)] if config.fan_out else []) + \
        ([("wavefront_order", wavefront_order)] if config.wavefront else [])


def choose_workers(b: Build) -> str:
    """SetResource of the simple policy: the workers asked for, else all CPUs this process may
    use unless every op is too small to split."""
    if b.config.workers:
        return f"{b.config.workers} (asked for)"
    available = default_workers()
    b.config = b.record.config = replace(b.config, workers=useful_workers(b.program, available))
    return f"{b.config.workers} of {available} CPUs" + (" (every op is small)" if b.config.workers < available else "")


def ir_passes(b: Build) -> str:
    passes = cpu_passes(b.config)
    b.record.passes = [name for name, _ in passes]
    # Only loops are rewritten, unless calls or waves are to be reordered: a program without
    # them is left as it is (a traced graph can have 50,000 ops to copy)
    rewrites = b.config.fan_out or b.config.wavefront or any(op.op is Op.LOOP for op in b.program.walk())
    if passes and rewrites:
        b.program = run_pipeline(b.program.clone(), passes)
    b.record.program = b.program
    b.parts = [Part(b.program, b.config)]
    return ", ".join(b.record.passes) + ("" if rewrites else " (skipped: nothing they rewrite)") if passes else "none"


def measure_waves(b: Build) -> str:
    if not (b.config.wavefront and b.config.measure_waves):
        return "not asked for"
    excluded = frozenset(slower_side_by_side(b.program, b.config))
    b.parts[0].excluded_waves = excluded
    return f"{len(excluded)} wave(s) measured slower side by side"


CPU_STAGES = [("workers", choose_workers), ("IR passes", ir_passes), ("measure waves", measure_waves),
              *NATIVE_STAGES]


def build_cpu(program: Program, config: Config, record: Record) -> CompiledProgram:
    build = Build(program, config, record)
    run_stages(CPU_STAGES, build)
    return build.parts[0].compiled
