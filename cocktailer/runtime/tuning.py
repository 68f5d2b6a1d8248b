"""The "cpu" backend under the measured policy: every candidate the search proposes is built
(the host level, and constructs moved to L1 a level at a time, as a HostExecutor; control
flow at L1 as one native program) and timed by
the profiler on the sample inputs; the fastest is kept and the others are dropped."""
from __future__ import annotations

from typing import Callable

import torch

from cocktailer.codegen import kernels
from cocktailer.ir import Program
from cocktailer.runtime.cpu import DEFAULT_MAX_DEPTH, cpu_backend
from cocktailer.runtime.host import HostExecutor
from cocktailer.runtime.native import default_workers
from cocktailer.runtime.profiler import Profiler
from cocktailer.schedule.search import STEPS, Candidate, Trial, search


class TunedProgram:
    """The candidate the policy kept, callable like any backend's program; `trials` holds
    every candidate it measured (for explain)."""

    def __init__(self, chosen: Callable, candidate: Candidate, trials: list[Trial]):
        self.chosen, self.candidate, self.trials = chosen, candidate, trials

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return self.chosen(inputs)


def build(program: Program, candidate: Candidate, max_depth: int = DEFAULT_MAX_DEPTH) -> Callable:
    if candidate.control == "host":
        return HostExecutor(program, workers=candidate.workers, native_from=candidate.native_from, max_depth=max_depth)
    built = cpu_backend(program, workers=candidate.workers, max_depth=max_depth, fan_out=candidate.fan_out,
                        unroll=candidate.unroll, wavefront=candidate.wavefront, fine_barriers=candidate.fine_barriers)
    if candidate.wavefront and not built.rendered.co_scheduled:
        raise NothingToSchedule("no wave of independent operators balanced enough to run side by side")
    if candidate.fine_barriers and not built.rendered.fine_barriers:
        raise NothingToSchedule("every synchronization needs all workers: no fine-grained barrier to place")
    return built


class NothingToSchedule(RuntimeError):
    """The candidate's step does not apply to this program (it would only repeat another)."""


def measured_cpu_backend(program: Program, samples: list[list[torch.Tensor]], workers: int | None = None,
                         max_depth: int = DEFAULT_MAX_DEPTH, profiler: Profiler | None = None,
                         steps: tuple[str, ...] = STEPS) -> TunedProgram:
    profiler = profiler or Profiler(samples)
    built: dict[Candidate, Callable] = {}

    def measure(candidate: Candidate) -> float:
        executable = built[candidate] = build(program, candidate, max_depth)
        return profiler.latency(f"{executable.identity}\0{candidate}", executable)

    def confirm(a: Candidate, b: Candidate) -> tuple[float, float]:
        return tuple(profiler.compare([built[a], built[b]]))

    best, trials = search(program, workers or default_workers(), measure, tuple(steps), kernels.supported, confirm)
    return TunedProgram(built[best], best, trials)
