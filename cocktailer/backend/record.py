"""What a build ran: its stages in order, with what each did and took, and what they produced
that a reader wants to see (`cocktailer.explain` prints it)."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from cocktailer.backend.config import Config
from cocktailer.ir import Program
from cocktailer.schedule.search import Trial


@dataclass
class Stage:
    name: str
    detail: str = ""
    seconds: float = 0.0


@dataclass
class Record:
    config: Config
    stages: list[Stage] = field(default_factory=list)
    passes: list[str] = field(default_factory=list)   # the IR passes applied, in order
    program: Program | None = None                      # the IR the native code was generated from
    parts: list = field(default_factory=list)           # backend.native.Part: one per native entry point
    native_constructs: set[int] | None = None   # host backend: id(construct) of those run in native blocks
    trials: list[Trial] = field(default_factory=list)   # measured policy: every candidate timed
    chosen: "Record | None" = None                      # measured policy: the record of the one kept
    sizes: list = field(default_factory=list)   # measured policy: backend.measured.SizeTrial per sample size
    notices: list[str] = field(default_factory=list)    # what the user should hear (the api warns once)
    source: str = ""                                    # the generated source the native stages compiled

    @contextmanager
    def stage(self, name: str) -> Iterator[Stage]:
        """Time a stage and append it; the stage may fill in its `detail`."""
        entry = Stage(name)
        start = time.perf_counter()
        try:
            yield entry
        finally:
            entry.seconds = time.perf_counter() - start
            self.stages.append(entry)

    @property
    def built(self) -> "Record":
        """The record of what runs: the kept candidate's under the measured policy."""
        return self.chosen.built if self.chosen is not None else self

    @property
    def uprogram(self):
        (part,) = self.built.parts
        return part.uprogram

    @property
    def rendered(self):
        (part,) = self.built.parts
        return part.rendered

    def summary(self) -> str:
        """One line per stage."""
        return "\n".join(f"{s.name}: {s.detail}{'; ' if s.detail else ''}{s.seconds * 1e3:.3g} ms" for s in self.stages)
