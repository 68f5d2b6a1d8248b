"""The corpus of real-style programs (cocktailer/models/corpus.py): compiled (cpu backend,
default options) against eager PyTorch, batch 1.

    python -m bench.corpus [--seconds 3] [--out bench/results/corpus]

Each program is checked against eager on its first input set, then the two are timed in
rounds in one process (one call of each per round; the compiled call right after eager's,
so whatever eager leaves running, such as spinning OpenMP threads, counts against the
compiled one). Writes results.json (machine, versions, commit, raw timings) and table.md.
"""
from __future__ import annotations

import statistics
import sys

import torch

import cocktailer
from bench import machine
from bench.results import write_small_run
from bench.timing import measure_interleaved, one_shot_budget, one_shot_parser
from cocktailer.models import corpus


def main(argv=None):
    args = one_shot_parser(__doc__, 3.0, "bench/results/corpus").parse_args(argv)
    torch.set_grad_enabled(False)
    budget = one_shot_budget(args.seconds, min_runs=30)
    rows = {}
    for name, (_, inputs_of) in corpus.CORPUS.items():
        model, inputs = corpus.make(name), inputs_of(0)
        fast = cocktailer.compile(model, inputs, backend="cpu")
        torch.testing.assert_close(fast(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)
        eager_s, compiled_s = measure_interleaved([lambda: model(*inputs), lambda: fast(*inputs)], budget)
        rows[name] = {"eager_s": eager_s, "compiled_s": compiled_s,
                      "speedup": statistics.median(eager_s) / statistics.median(compiled_s)}
        print(f"{name}: eager {statistics.median(eager_s) * 1e3:.3g} ms, compiled "
              f"{statistics.median(compiled_s) * 1e3:.3g} ms", file=sys.stderr, flush=True)
    data = {"machine": machine.describe(), "programs": rows}
    write_small_run(args.out, data, table(data))


def table(data: dict) -> str:
    lines = ["# Corpus of real-style programs: compiled (cpu) against eager, batch 1", "",
             machine.summary(data["machine"]),
             "- medians in ms, timed in rounds in one process; speedup = eager / compiled", "",
             "| program | eager ms | compiled ms | speedup |", "|---|---|---|---|"]
    for name, r in data["programs"].items():
        eager, compiled = statistics.median(r["eager_s"]) * 1e3, statistics.median(r["compiled_s"]) * 1e3
        lines.append(f"| {name} | {eager:.3g} | {compiled:.3g} | {r['speedup']:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
