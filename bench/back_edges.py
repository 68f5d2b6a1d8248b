"""What the checks at loop back-edges and calls cost (Ctrl-C polling, the iteration guard).

    python -m bench.back_edges [--models lstm,rae] [--seconds 6] [--out bench/results/back-edges]

Each zoo model is compiled twice in this one process with default options: as the backend
builds it, and with the checks left out of the generated source (`Renderer.back_edge_checks`
patched to emit nothing; the libraries differ only there). Both are then timed in rounds, one
call of each per round, so a noisy spell of a shared machine hits both alike; two processes
(as `python -m bench --baseline` runs them) differ by more than this from their memory layout
alone. Both run on all workers in every call (the contention fallback, which could pick
different worker counts for the two, is off). The per-call runtime side (arming the SIGINT handler) is timed apart: both variants
pay it. Writes results.json (machine, versions, commit, raw timings) and table.md.
"""
from __future__ import annotations

import statistics
import sys
import time
from unittest import mock

import torch

import cocktailer
from bench import machine
from bench.results import write_small_run
from bench.timing import measure_interleaved, on_all_workers, one_shot_budget, one_shot_parser
from cocktailer import models
from cocktailer.codegen.renderer import Renderer
from cocktailer.runtime import interrupt


def compiled_pair(name: str):
    w = models.make(name, 1)
    with_checks = cocktailer.compile(w.model, w.inputs, backend="cpu")
    with mock.patch.object(Renderer, "back_edge_checks", lambda self, iteration: None):
        without = cocktailer.compile(w.model, w.inputs, backend="cpu")
    for fast in (with_checks, without):   # both right before either is timed
        on_all_workers(fast)
        torch.testing.assert_close(fast(*w.inputs), w.model(*w.inputs), rtol=1e-3, atol=1e-4)
    return w, with_checks, without


def library(fast) -> str:
    return on_all_workers(fast).library


def arm_seconds(calls: int = 100_000) -> float:
    """Seconds per call of what the runtime does for Ctrl-C before every call."""
    start = time.perf_counter()
    for _ in range(calls):
        interrupt.arm()
    return (time.perf_counter() - start) / calls


def main(argv=None):
    p = one_shot_parser(__doc__, 6.0, "bench/results/back-edges")
    p.add_argument("--models", default=",".join(models.names()))
    args = p.parse_args(argv)
    torch.set_grad_enabled(False)
    budget = one_shot_budget(args.seconds)
    rows = {}
    for name in args.models.split(","):
        w, with_checks, without = compiled_pair(name)
        if library(with_checks) == library(without):   # no loop or call left at L1 (all unrolled)
            rows[name] = {"no_back_edges": True}
            print(f"{name}: no back-edges in the generated program", file=sys.stderr, flush=True)
            continue
        times = measure_interleaved([lambda: with_checks(*w.inputs), lambda: without(*w.inputs)], budget)
        medians = [statistics.median(t) for t in times]
        rows[name] = {"with_checks_s": times[0], "without_s": times[1], "median_with_s": medians[0],
                      "median_without_s": medians[1], "ratio": medians[0] / medians[1]}
        print(f"{name}: {medians[0] * 1e3:.3g} ms with, {medians[1] * 1e3:.3g} ms without, "
              f"ratio {medians[0] / medians[1]:.3f}", file=sys.stderr, flush=True)
    data = {"machine": machine.describe(), "arm_seconds_per_call": arm_seconds(), "models": rows}
    write_small_run(args.out, data, table(data))


def table(data: dict) -> str:
    lines = ["# Back-edge checks (Ctrl-C polling, iteration guard), batch 1", "",
             machine.summary(data["machine"]),
             "- one process, both variants timed in rounds; medians in ms; ratio = with / without",
             f"- the runtime's per-call part (arming the SIGINT handler), in both: "
             f"{data['arm_seconds_per_call'] * 1e6:.2f} µs a call", "",
             "| model | with checks ms | without ms | ratio | runs |", "|---|---|---|---|---|"]
    for name, r in data["models"].items():
        if r.get("no_back_edges"):
            lines.append(f"| {name} | no loop or call at L1: nothing to check | | | |")
            continue
        lines.append(f"| {name} | {r['median_with_s'] * 1e3:.3g} | {r['median_without_s'] * 1e3:.3g} | "
                     f"{r['ratio']:.3f} | {len(r['with_checks_s'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
