"""The profiler the scheduling policy asks (Cocktailer §3.2): the latency of a candidate,
measured on this machine with sample inputs (several when control flow depends on the data).

A measurement is the median, over timed rounds after warm-up, of one round's time: every
sample run once. It is cached in memory and on disk (in the library cache) under the
candidate's identity (its libraries and settings) and the samples' content, so compiling the
same model again does not measure again.
"""
from __future__ import annotations

import hashlib
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from cocktailer.runtime import cache

Executable = Callable[[list[torch.Tensor]], object]


@dataclass
class Profiler:
    samples: list[list[torch.Tensor]]     # flat input tensors of one call each
    min_rounds: int = 10
    min_seconds: float = 0.2
    max_seconds: float = 2.0              # a slow candidate is measured with fewer rounds (at least 3)
    persist: bool = True                  # keep measurements in the library cache across processes
    measured: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        digest = hashlib.sha256()
        for sample in self.samples:
            for t in sample:
                digest.update(f"{t.dtype}{tuple(t.shape)}".encode())
                digest.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
        self._samples_key = digest.hexdigest()[:16]

    def latency(self, identity: str, run: Executable) -> float:
        """Seconds per round of the samples for the candidate `identity` (a string that
        changes whenever its code or settings do), measured once."""
        key = hashlib.sha256(f"{identity}\0{self._samples_key}\0{os.cpu_count()}".encode()).hexdigest()[:32]
        if key in self.measured:
            return self.measured[key]
        stored = self._load(key)
        if stored is None:
            stored = self.compare([run])[0]
            self._store(key, stored)
        self.measured[key] = stored
        return stored

    def compare(self, runs: list[Executable]) -> list[float]:
        """Seconds per round of the samples for each of `runs` (median over rounds, after one
        warm-up round: pages in the library, the weights, the scratch), timed in alternating
        rounds so that a slow spell of a shared machine hits all of them alike (not cached)."""
        with torch.no_grad():
            for run in runs:
                for sample in self.samples:
                    run(sample)
            rounds: list[list[float]] = [[] for _ in runs]
            start = time.perf_counter()
            while True:
                for k, run in enumerate(runs):
                    t0 = time.perf_counter()
                    for sample in self.samples:
                        run(sample)
                    rounds[k].append(time.perf_counter() - t0)
                spent = time.perf_counter() - start
                if (len(rounds[0]) >= self.min_rounds and spent >= self.min_seconds) or \
                        (len(rounds[0]) >= 3 and spent >= self.max_seconds):
                    return [statistics.median(r) for r in rounds]

    def _load(self, key: str) -> float | None:
        if not self.persist:
            return None
        try:
            return float(cache.read_json(f"profiles/{key}.json")["seconds"])
        except (TypeError, ValueError, KeyError):
            return None

    def _store(self, key: str, seconds: float):
        if self.persist:
            cache.write_json(f"profiles/{key}.json", {"seconds": seconds})
