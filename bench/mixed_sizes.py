"""Mixed sizes: the RAE (paper size, hidden 512) over SST trees in their natural node counts,
the total time of a stream of trees including every compile it causes.

    python -m bench.mixed_sizes [--trees 1000] [--rounds 3] [--torch-compile] [--out bench/results/mixed-sizes]

The bundled SST sample has 110 trees (7-95 nodes, 38 different counts); the stream draws
`--trees` of them at random (seeded). Systems: eager; cocktailer with default options
(automatic dynamic sizes: the first size compiles a static program, the second a program with
the node count symbolic); cocktailer with dynamic=True (symbolic from the first call);
cocktailer with dynamic=False (a program per node count, as before symbolic sizes); with
--torch-compile, torch.compile(dynamic=True). Each run is a fresh Python process with an
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
from cocktailer.data import load_sst
from cocktailer.models.tree import RAE, tree_inputs


def drawn(count: int, seed: int = 0) -> tuple[list, list]:
    """(the SST sample's trees, the `count` drawn from them)."""
    trees, rng = load_sst(), random.Random(seed)
    return trees, [rng.choice(trees) for _ in range(count)]


def stream(count: int, hidden: int, seed: int = 0) -> list[tuple]:
    trees, chosen = drawn(count, seed)
    vocab = {tok: k for k, tok in enumerate(sorted({tok for t in trees for tok in t.tokens}))}
    table = torch.randn(len(vocab), hidden, generator=torch.Generator().manual_seed(seed))
    return [tree_inputs(t, [vocab[tok] for tok in t.tokens], table, t.num_nodes) for t in chosen]


SYSTEMS = ["eager", "cocktailer (automatic)", "cocktailer dynamic=True", "cocktailer dynamic=False",
           "torch.compile dynamic=True"]


def make(name: str, model):
    return {"eager": lambda: model,
            "cocktailer (automatic)": lambda: cocktailer.compile(model, backend="cpu"),
            "cocktailer dynamic=True": lambda: cocktailer.compile(model, backend="cpu", dynamic=True),
            "cocktailer dynamic=False": lambda: cocktailer.compile(model, backend="cpu", dynamic=False),
            "torch.compile dynamic=True": lambda: torch.compile(model, dynamic=True)}[name]()


def run_once(name: str, trees: int) -> dict:
    """One system's run, in this process (a fresh one: see _run_in_process)."""
    torch.set_grad_enabled(False)
    torch.manual_seed(0)
    model = RAE(512).eval()
    inputs = stream(trees, 512)
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


def _run_in_process(name: str, trees: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="cocktailer-mixed-sizes-") as cache:
        env = {**os.environ, "COCKTAILER_CACHE_DIR": cache}
        done = subprocess.run([sys.executable, "-m", "bench.mixed_sizes", "--one", name, "--trees", str(trees)],
                              env=env, capture_output=True, text=True, cwd=machine.REPO, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--torch-compile", action="store_true")
    parser.add_argument("--out", default="bench/results/mixed-sizes")
    parser.add_argument("--one", help=argparse.SUPPRESS)   # a run of one system (the child process)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_once(args.one, args.trees)))
        return
    names = SYSTEMS if args.torch_compile else SYSTEMS[:-1]
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:   # a rotating order: interleaved
            runs[name].append(_run_in_process(name, args.trees))
            print(f"round {r}: {name}: {runs[name][-1]}", file=sys.stderr, flush=True)
    nodes = [t.num_nodes for t in drawn(args.trees)[1]]
    data = {"machine": machine.describe(), "run": {"trees": args.trees, "rounds": args.rounds, "hidden": 512,
                                                  "node_counts": sorted(set(nodes))},
            "systems": {name: {"first_pass_s": [x["first_pass_s"] for x in rs],
                               "second_pass_s": [x["second_pass_s"] for x in rs], "programs": rs[-1]["programs"]}
                        for name, rs in runs.items()}}
    write_small_run(pathlib.Path(args.out), data, table(data))


def table(data: dict) -> str:
    run, systems = data["run"], data["systems"]
    median = lambda name, k: statistics.median(systems[name][k])   # noqa: E731
    lines = ["# Mixed sizes: RAE (hidden 512) over SST trees in their natural sizes", "",
             machine.summary(data["machine"]),
             f"- {run['trees']} trees drawn from the bundled SST sample ({len(run['node_counts'])} different node "
             f"counts, {min(run['node_counts'])}-{max(run['node_counts'])}); each run a fresh process with an "
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
