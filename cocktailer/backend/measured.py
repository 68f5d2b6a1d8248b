"""The measured policy (Algorithm 1): the search (`schedule.search`) proposes configurations,
each is built like any other and timed by the profiler on the sample inputs; the fastest is
kept and the others are dropped. For a program of symbolic sizes it also asks, at each size
it was given as a sample, whether the kept candidate specialized at those sizes runs faster
(`specialize`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from cocktailer.backend.config import Config
from cocktailer.backend.profiler import Profiler
from cocktailer.backend.record import Record
from cocktailer.codegen import kernels
from cocktailer.ir import Program
from cocktailer.runtime.native import default_workers
from cocktailer.schedule.search import KEEP_MARGIN, search

Build = Callable[[Program, Config, Record], Callable]


class TunedProgram:
    """The candidate the policy kept, callable like any backend's program; its record holds
    every candidate measured and the kept one's build (for explain)."""

    def __init__(self, chosen: Callable, candidate: Config, record: Record):
        self.chosen, self.candidate, self.record = chosen, candidate, record

    @property
    def trials(self):
        return self.record.trials

    @property
    def fresh_outputs(self) -> bool:
        return getattr(self.chosen, "fresh_outputs", False)

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return self.chosen(inputs)


class NothingToSchedule(RuntimeError):
    """The candidate's step does not apply to this program (it would only repeat another)."""


def check_applies(candidate: Config, built) -> None:
    """A co-scheduling candidate that co-schedules nothing would only repeat another."""
    if not candidate.wavefront:
        return
    uprogram = built.record.uprogram
    if not uprogram.co_scheduled:
        raise NothingToSchedule("no wave of independent operators balanced enough to run side by side")
    if candidate.fine_barriers and not uprogram.fine_barriers:
        raise NothingToSchedule("every synchronization needs all workers: no fine-grained barrier to place")


def tune(program: Program, config: Config, samples: list[list[torch.Tensor]], build: Build,
         record: Record) -> TunedProgram:
    """`build(program, candidate, record)` builds one candidate (the backend's pipelines)."""
    profiler = Profiler(samples)
    built: dict[Config, Callable] = {}
    records: dict[Config, Record] = {}

    def measure(candidate: Config) -> float:
        records[candidate] = Record(candidate)
        executable = build(program, candidate, records[candidate])
        check_applies(candidate, executable)
        built[candidate] = executable
        return profiler.latency(f"{executable.identity}\0{candidate}", executable)

    def confirm(a: Config, b: Config) -> tuple[float, float]:
        return tuple(profiler.compare([built[a], built[b]]))

    start = Config(workers=config.workers or default_workers(), max_depth=config.max_depth,
                   max_iterations=config.max_iterations, steps=config.steps)
    with record.stage("search") as stage:
        best, record.trials = search(program, start, measure, kernels.supported, confirm)
        stage.detail = f"{len(record.trials)} candidates timed; kept: {best}"
    record.chosen = records[best]
    return TunedProgram(built[best], best, record)


@dataclass
class SizeTrial:
    """One sample's sizes: the symbolic program and the kept candidate specialized at them,
    timed against each other on that sample (seconds per run)."""
    sizes: str
    symbolic: float
    specialized: float

    @property
    def kept(self) -> bool:
        """The specialized program serves these sizes: faster by more than the noise."""
        return self.specialized < KEEP_MARGIN * self.symbolic


def specialize(program: Program, symbolic: TunedProgram, sample: list[torch.Tensor], sizes: str,
               build: Build) -> tuple[TunedProgram, SizeTrial]:
    """`program` (captured at `sample`'s sizes, all of them numbers) built as the candidate
    kept for `symbolic`, and the two timed in alternating rounds on `sample`. Static kernels
    can unroll and vectorize by known bounds and pick a fixed partition; whether that pays at
    these sizes is measured, not assumed. The caller keeps the specialized program where the
    trial's `kept` says so."""
    candidate = symbolic.candidate
    record = Record(symbolic.record.config)
    record.trials = symbolic.record.trials   # the candidate comes from the symbolic program's search
    record.chosen = Record(candidate)
    specialized = TunedProgram(build(program, candidate, record.chosen), candidate, record)
    symbolic_s, specialized_s = Profiler([sample], persist=False).compare([symbolic, specialized])
    trial = SizeTrial(sizes, symbolic_s, specialized_s)
    symbolic.record.sizes.append(trial)
    record.sizes.append(trial)
    return specialized, trial
