"""python -m bench: command line."""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

from bench import machine, peer, timing
from bench.runner import RESULTS, RunConfig, run


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__import__("bench").__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="small model sizes, batch 1, few repetitions, the traced graph only eagerly and in "
                        "JAX: a few minutes; prints the table")
    p.add_argument("--models", help="comma-separated zoo names (default: all)")
    p.add_argument("--batch", help="comma-separated batch sizes (default 1,64; --quick: 1)")
    p.add_argument("--systems", help="comma-separated: eager, torchscript, torch.compile, jax, onnxruntime, "
                                     "cocktailer[:backend], traced[:backend] (default: all of these); "
                                     "fig19 and scaling: cocktailer step by step, and from 1 to 2 workers")
    p.add_argument("--size", choices=["paper", "small"], help="model sizes (default paper; --quick: small)")
    p.add_argument("--out", type=pathlib.Path, help="results folder (default bench/results/<quick|paper>)")
    p.add_argument("--fresh", action="store_true", help="ignore results already in --out instead of resuming")
    p.add_argument("--compile-timeout", type=float, help="seconds to prepare one system for one workload "
                                                          "(default 900; --quick: 60)")
    p.add_argument("--min-runs", type=int, help="timed runs at least (default 10; --quick: 3)")
    p.add_argument("--min-seconds", type=float, help="seconds of timed runs at least (default 2; --quick: 0.25)")
    p.add_argument("--threads", type=int, help="threads for every system (default: each library's own, all "
                                                  "cores); 1 gives steadier numbers on a busy machine")
    p.add_argument("--interleave", action="store_true", help="time a workload's systems in rounds (one run of "
                   "each per round) instead of one after another: steadier comparisons on a shared machine")
    p.add_argument("--load", help="comma-separated numbers of busy-looping processes to time every system beside "
                                  "(e.g. 0,1,2: quiet, then one, then two), interleaved at each level: how each "
                                  "system degrades on a shared machine")
    p.add_argument("--baseline", help="a git commit (e.g. HEAD~1): every cocktailer system also runs as that "
                   "commit's, in a process of its own, timed interleaved with this one's (implies --interleave)")
    p.add_argument("--compile-times", action="store_true", help="only the compile-time table: each model compiled "
                   "cold, again in a new process with its library on disk, and again in the same process")
    p.add_argument("--report", action="store_true", help="only rewrite table.md and the figures from --out")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def config_from(args: argparse.Namespace, argv: list[str]) -> RunConfig:
    budget = timing.QUICK if args.quick else timing.FULL
    if args.min_runs is not None or args.min_seconds is not None:
        budget = timing.Budget(**{**budget.__dict__, **({"min_runs": args.min_runs} if args.min_runs else {}),
                                  **({"min_seconds": args.min_seconds} if args.min_seconds is not None else {})})
    size = args.size or ("small" if args.quick else "paper")
    return RunConfig(
        name=args.out.name if args.out else ("quick" if args.quick else size),
        models=_list(args.models),
        batches=tuple(int(b) for b in (_list(args.batch) or (["1"] if args.quick else ["1", "64"]))),
        systems=_list(args.systems), size=size, budget=budget,
        compile_timeout_s=args.compile_timeout or (60.0 if args.quick else 900.0),
        fresh=args.fresh, quick=args.quick, threads=args.threads, out_dir=args.out, argv=argv,
        interleave=args.interleave, loads=_loads(args.load),
        baseline=peer.resolve(args.baseline, str(machine.REPO)) if args.baseline else None)


def _loads(text: str | None) -> tuple[int, ...]:
    """--load levels, quiet (0) always among them: the others are compared with it."""
    return tuple(sorted({0, *(int(k) for k in _list(text))})) if text else ()


def _list(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    config = config_from(args, argv)
    if args.compile_times:
        from bench import compile_times
        from cocktailer.models import names
        out = args.out or RESULTS / "compile-times"
        compile_times.measure(config.models or names(), config.size, config.batches[0], out)
        print((out / "table.md").read_text())
        return 0
    if args.report:
        from bench import report
        print(report.write(json.loads((config.out / "results.json").read_text()), config.out))
        return 0
    start = time.perf_counter()
    run(config, progress=not args.no_progress)
    print((config.out / "table.md").read_text())
    print(f"results: {config.out} ({time.perf_counter() - start:.0f} s)")
    return 0
