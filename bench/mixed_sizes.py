"""Mixed sizes: a stream of SST inputs in their natural sizes, the total time including every
compile it causes.

    python -m bench.mixed_sizes [--workload trees|sentences] [--count 1000] [--rounds 3] [--torch-compile] [--out DIR]

- trees: the RAE (paper size, hidden 512) over SST trees in their natural node counts;
- sentences: the zoo's stacked LSTM (paper size) over the same trees' sentences, one word
  vector per token, in their natural lengths (the time loop runs once per word).

The bundled SST sample has 110 trees (7-95 nodes, 38 different counts; sentences of 4-48
words); the stream draws `--count` of them at random (seeded). Systems: eager; cocktailer with
default options (automatic dynamic sizes: the first size compiles a static program, the
second a program with the size symbolic); cocktailer with dynamic=True (symbolic from the
first call); cocktailer with dynamic=False (a program per size, as before symbolic sizes);
with --torch-compile, torch.compile(dynamic=True). Each run is a fresh Python process with an
empty library cache (the C compiler's time, and torch.compile's, count; no system reuses
what an earlier run compiled), and the runs of a round go in a rotating order. A run times
the stream twice: the first pass includes every compile, the second is the steady state.
Every result is checked against eager. Writes results.json (machine, versions, commit, raw
timings) and table.md."""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import cocktailer
from bench import machine
from bench.results import write_small_run
from cocktailer import models
from cocktailer.data import load_sst
from cocktailer.models.tree import RAE, tree_inputs


def drawn(count: int, seed: int = 0) -> tuple[list, list]:
    """(the SST sample's trees, the `count` drawn from them)."""
    trees, rng = load_sst(), random.Random(seed)
    return trees, [rng.choice(trees) for _ in range(count)]


def _embedding(trees: list, width: int, seed: int) -> tuple[dict, torch.Tensor]:
    vocab = {tok: k for k, tok in enumerate(sorted({tok for t in trees for tok in t.tokens}))}
    return vocab, torch.randn(len(vocab), width, generator=torch.Generator().manual_seed(seed))


def stream(count: int, hidden: int, seed: int = 0) -> list[tuple]:
    trees, chosen = drawn(count, seed)
    vocab, table = _embedding(trees, hidden, seed)
    return [tree_inputs(t, [vocab[tok] for tok in t.tokens], table, t.num_nodes) for t in chosen]


def sentences(count: int, features: int, seed: int = 0) -> list[tuple]:
    """(x,) per drawn tree: its words' vectors, time-major (words, batch 1, features)."""
    trees, chosen = drawn(count, seed)
    vocab, table = _embedding(trees, features, seed)
    return [(table[[vocab[tok] for tok in t.tokens]].unsqueeze(1),) for t in chosen]


def workload(name: str, count: int) -> tuple[torch.nn.Module, list[tuple]]:
    """(model, inputs) of a workload: see the module's docstring."""
    torch.manual_seed(0)
    if name == "trees":
        return RAE(512).eval(), stream(count, 512)
    lstm = models.make("lstm", 1, size="paper")
    return lstm.model.eval(), sentences(count, lstm.inputs[0].shape[-1])


def sizes(name: str, count: int) -> list[int]:
    """Each drawn input's size: node counts, or sentence lengths."""
    chosen = drawn(count)[1]
    return [t.num_nodes if name == "trees" else len(t.tokens) for t in chosen]


SYSTEMS = ["eager", "cocktailer (automatic)", "cocktailer dynamic=True", "cocktailer dynamic=False",
           "torch.compile dynamic=True"]


def make(name: str, model):
    return {"eager": lambda: model,
            "cocktailer (automatic)": lambda: cocktailer.compile(model, backend="cpu"),
            "cocktailer dynamic=True": lambda: cocktailer.compile(model, backend="cpu", dynamic=True),
            "cocktailer dynamic=False": lambda: cocktailer.compile(model, backend="cpu", dynamic=False),
            "torch.compile dynamic=True": lambda: torch.compile(model, dynamic=True)}[name]()


def run_once(name: str, trees: int, kind: str = "trees") -> dict:
    """One system's run, in this process (a fresh one: see _run_in_process)."""
    torch.set_grad_enabled(False)
    model, inputs = workload(kind, trees)
    expected = [model(*a) for a in inputs]
    start = time.perf_counter()
    fn = make(name, model)
    results = [fn(*args) for args in inputs]
    first = time.perf_counter() - start
    start = time.perf_counter()
    for args in inputs:
        fn(*args)
    second = time.perf_counter() - start
    for got, want in zip(results, expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    programs = len(fn.cache) if isinstance(fn, cocktailer.CompiledFunction) else None
    return {"first_pass_s": first, "second_pass_s": second, "programs": programs}


def _run_in_process(name: str, trees: int, kind: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="cocktailer-mixed-sizes-") as cache:
        env = {**os.environ, "COCKTAILER_CACHE_DIR": cache}
        done = subprocess.run([sys.executable, "-m", "bench.mixed_sizes", "--one", name, "--trees", str(trees),
                               "--workload", kind],
                              env=env, capture_output=True, text=True, cwd=machine.REPO, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", "--trees", dest="trees", type=int, default=1000, help="inputs in the stream")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--torch-compile", action="store_true")
    parser.add_argument("--workload", choices=["trees", "sentences"], default="trees")
    parser.add_argument("--out", help="default: bench/results/mixed-sizes (trees), mixed-sizes-sentences")
    parser.add_argument("--one", help=argparse.SUPPRESS)   # a run of one system (the child process)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_once(args.one, args.trees, args.workload)))
        return
    out = args.out or "bench/results/mixed-sizes" + ("" if args.workload == "trees" else "-sentences")
    names = SYSTEMS if args.torch_compile else SYSTEMS[:-1]
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:   # a rotating order: interleaved
            runs[name].append(_run_in_process(name, args.trees, args.workload))
            print(f"round {r}: {name}: {runs[name][-1]}", file=sys.stderr, flush=True)
    data = {"machine": machine.describe(),
            "run": {"workload": args.workload, "trees": args.trees, "rounds": args.rounds,
                    "model": "RAE(512)" if args.workload == "trees" else "the zoo's lstm, paper size",
                    "sizes": sorted(set(sizes(args.workload, args.trees)))},
            "systems": {name: {"first_pass_s": [x["first_pass_s"] for x in rs],
                               "second_pass_s": [x["second_pass_s"] for x in rs], "programs": rs[-1]["programs"]}
                        for name, rs in runs.items()}}
    write_small_run(pathlib.Path(out), data, table(data))


def table(data: dict) -> str:
    run, systems = data["run"], data["systems"]
    median = lambda name, k: statistics.median(systems[name][k])   # noqa: E731
    trees = run.get("workload", "trees") == "trees"
    what = "RAE (hidden 512) over SST trees" if trees else "the zoo's LSTM (paper size) over SST sentences"
    counted = "node counts" if trees else "lengths"
    found = run.get("sizes", run.get("node_counts"))
    lines = [f"# Mixed sizes: {what} in their natural sizes", "",
             machine.summary(data["machine"]),
             f"- {run['trees']} {'trees' if trees else 'sentences'} drawn from the bundled SST sample ({len(found)} "
             f"different {counted}, {min(found)}-{max(found)}); each run a fresh process with an "
             f"empty library cache; medians of {run['rounds']} interleaved rounds",
             "- first pass: the whole stream, every compile included; second pass: the same stream again "
             "(the steady state)", "",
             "| system | first pass s | × eager | second pass s | × eager | programs compiled |",
             "|---|---|---|---|---|---|"]
    for name, s in systems.items():
        first, second = median(name, "first_pass_s"), median(name, "second_pass_s")
        lines.append(f"| {name} | {first:.3g} | {median('eager', 'first_pass_s') / first:.2f}× | {second:.3g} | "
                     f"{median('eager', 'second_pass_s') / second:.2f}× | "
                     f"{s['programs'] if s['programs'] is not None else ''} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
