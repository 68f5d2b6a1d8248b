"""Wall-clock timing of one system: warm-up, then runs until both a minimum count and a
minimum time are reached (so fast systems get many samples and slow ones still finish),
and robust statistics of the samples. Never used by the tests."""
from __future__ import annotations

import argparse
import gc
import pathlib
import random
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Budget:
    warmup: int = 3           # runs discarded: caches, allocator, lazy JIT paths
    min_runs: int = 10
    min_seconds: float = 2.0
    max_runs: int = 10_000
    max_seconds: float = 30.0  # a very slow system stops after this (with at least 3 runs)


QUICK = Budget(warmup=1, min_runs=3, min_seconds=0.25, max_runs=200, max_seconds=2.0)
FULL = Budget()


def measure(fn: Callable[[], object], budget: Budget) -> list[float]:
    """Seconds of each timed call of `fn` (which must block until its result is ready)."""
    for _ in range(budget.warmup):
        fn()
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()   # a collection inside one sample would make it an outlier
    try:
        return _sample(fn, budget)
    finally:
        if was_enabled:
            gc.enable()


def measure_interleaved(fns: list[Callable[[], object]], budget: Budget) -> list[list[float]]:
    """Seconds of each timed call of each of `fns`, timed in rounds (one call of each per
    round) until every one has the budget's minimum runs and time, or the round limits. Each
    round calls them in another order (shuffled, seeded): a call can slow the call after it
    (another thread pool still spinning, caches filled with its data), and no function should
    always come after the same one. A function marked `reports_seconds` returns its own time
    (measured in another process)."""
    for _ in range(budget.warmup):
        for fn in fns:
            fn()
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    times: list[list[float]] = [[] for _ in fns]
    shuffle = random.Random(0)
    start = time.perf_counter()
    try:
        while fns and len(times[0]) < budget.max_runs:
            order = list(zip(fns, times))
            shuffle.shuffle(order)
            for fn, samples in order:
                t0 = time.perf_counter_ns()
                reported = fn()
                elapsed = (time.perf_counter_ns() - t0) * 1e-9
                samples.append(reported if getattr(fn, "reports_seconds", False) else elapsed)
            if all(len(s) >= budget.min_runs and sum(s) >= budget.min_seconds for s in times):
                break
            if len(times[0]) >= 3 and time.perf_counter() - start >= budget.max_seconds * len(fns):
                break
    finally:
        if was_enabled:
            gc.enable()
    return times


def _sample(fn, budget: Budget) -> list[float]:
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < budget.max_runs:
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) * 1e-9)
        elapsed = time.perf_counter() - start
        if len(times) >= budget.min_runs and elapsed >= budget.min_seconds:
            break
        if len(times) >= 3 and elapsed >= budget.max_seconds:
            break
    return times


def summarize(times: list[float]) -> dict:
    t = np.asarray(times)
    q = np.percentile(t, [10, 25, 50, 75, 90])
    return {"runs": len(times), "median_s": float(q[2]), "p10_s": float(q[0]), "p90_s": float(q[4]),
            "q1_s": float(q[1]), "q3_s": float(q[3]), "min_s": float(t.min()), "mean_s": float(t.mean())}


# -- the one-shot benchmarks (bench.back_edges, bench.corpus, bench.module_forms) ------------

def one_shot_parser(doc: str, seconds: float, out: str) -> argparse.ArgumentParser:
    """Their command line: --seconds (timed seconds per system, at least) and --out."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=seconds, help="timed seconds per system, at least")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path(out))
    return p


def one_shot_budget(seconds: float, min_runs: int = 40) -> Budget:
    return Budget(warmup=5, min_runs=min_runs, min_seconds=seconds, max_seconds=4 * seconds)


def on_all_workers(compiled):
    """A compiled function's (one) executable, set to run on all its workers in every call:
    the contention fallback (runtime.native.Workers) could otherwise give two builds timed
    side by side different worker counts on a shared machine."""
    executable = next(iter(compiled.cache.values()))[1]
    executable.active_workers.adaptive = False
    return executable
