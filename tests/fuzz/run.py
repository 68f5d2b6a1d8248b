"""Differential fuzzing of cocktailer against eager PyTorch, for as long as asked.

    python tests/fuzz/run.py --minutes 10                 # seeds from a random start, 2 workers
    python tests/fuzz/run.py --programs 5000 --jobs 2 --start 100000 --out fuzz-results
    python tests/fuzz/run.py --minutes 10 --also cuda-virtual   # and each on the cuda backend's virtual GPU
    python tests/fuzz/run.py --minutes 10 --also cuda-nvcc      # on blocks of 32 threads, and nvcc's verdict

Each program (see gen.py) runs on the reference backend and on `--native` sampled native
configurations (see harness.CONFIGS), on several input sets, compared with eager on results
and on the arguments after the call; and through `cocktailer.batch`, its input sets as the
instances of one batched call. Programs run in worker processes with a deadline, so a
hang is caught (and a crash of the process too). Every mismatch, crash and hang is
minimized and written to OUT as a stand-alone reproducer (`repro_<seed>_<config>.py`);
OUT/summary.json has the counts, the refusals by reason and each failure.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))   # tests/: `import fuzz`


def main(argv=None):
    args = _parse(argv)
    if args.worker:
        return _worker()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = args.start if args.start is not None else random.randrange(10**6, 10**9)
    report = Report(start)
    env = {**os.environ, "COCKTAILER_CACHE_DIR": tempfile.mkdtemp(prefix="cocktailer-fuzz-cache-"),
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    # workers have sessions of their own (Worker.start): a SIGTERM (timeout's) must still stop them
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    workers = [Worker(env) for _ in range(args.jobs)]
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
    seeds = iter(range(start, start + (args.programs or 10**9)))
    try:
        _drive(workers, seeds, deadline, args, report)
    finally:
        for w in workers:
            w.stop()
    _reproduce(report, out, env, args)
    report.write(out / "summary.json")
    print(report.table())
    return 1 if report.failures else 0


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=None, help="run for this long")
    p.add_argument("--programs", type=int, default=None, help="or this many programs")
    p.add_argument("--start", type=int, default=None, help="first seed (default: random)")
    p.add_argument("--jobs", type=int, default=2, help="worker processes")
    p.add_argument("--native", type=int, default=1, help="native configurations per program")
    p.add_argument("--also", action="append", default=[], metavar="CONFIG",
                   help="a configuration every program also runs (harness.CONFIGS: cuda-virtual, cuda-nvcc)")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds one program may take (then: a hang)")
    p.add_argument("--out", default="fuzz-results", help="where reproducers and summary.json go")
    p.add_argument("--no-minimize", action="store_true", help="write failing programs as they are")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.worker and args.minutes is None and args.programs is None:
        p.error("give --minutes or --programs")
    return args


class Worker:
    """A process that runs programs it is sent (one JSON request per line, one reply per line)."""

    def __init__(self, env: dict):
        self.env = env
        self.start()

    def start(self):
        # a session of its own: stopping a hung worker stops the compiler it may be waiting for
        # (an nvcc left behind kept a core busy for the rest of a run)
        self.proc = subprocess.Popen([sys.executable, str(HERE / "run.py"), "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=self.env, text=True,
                                     bufsize=1, start_new_session=True)
        self.job, self.since = None, None

    def send(self, job: dict):
        self.job, self.since = job, time.monotonic()
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()

    def restart(self):
        self.stop()
        self.start()

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except Exception:
            pass


def _jobs(seeds, native: int, also: list[str]):
    """(seed, configuration) pairs, a program's configurations one after the other."""
    from fuzz.harness import configs_for
    for seed in seeds:
        # its input sets as instances of a batch; and a program over sentences of different lengths
        configs = configs_for(seed, native) + ["batch", "batch-torch", "batch-ragged", "batch-ragged-torch"] + also
        for config in configs:
            yield {"check": seed, "config": config, "of": len(configs)}


def _drive(workers, seeds, deadline, args, report):
    selector = selectors.DefaultSelector()
    for w in workers:
        selector.register(w.proc.stdout, selectors.EVENT_READ, w)
    jobs, finished = _jobs(seeds, args.native, args.also), False
    pending: dict[int, list] = {}   # seed -> outcomes so far

    def done(job, outcome):
        got = pending.setdefault(job["check"], [])
        got.append(outcome)
        if len(got) == job["of"]:
            report.add({"seed": job["check"], "outcomes": pending.pop(job["check"])})

    def replace(w):
        selector.unregister(w.proc.stdout)
        w.restart()
        selector.register(w.proc.stdout, selectors.EVENT_READ, w)

    while True:
        for w in workers:
            if w.job is None and not finished:
                job = next(jobs, None)
                if job is None or (deadline is not None and time.monotonic() > deadline and job["check"] not in pending):
                    finished = True
                    continue
                w.send(job)
        if finished and all(w.job is None for w in workers):
            return
        for key, _ in selector.select(timeout=1.0):
            w = key.data
            line = w.proc.stdout.readline()
            if not line:   # the worker died: a crash of the process
                done(w.job, _dead(w.job, "crash", "the worker process died"))
                replace(w)
                continue
            done(w.job, json.loads(line))
            w.job = None
        for w in workers:
            limit = args.timeout * (5 if w.job and w.job["config"] == "cpu-measured" else 1)   # it times candidates
            if w.job is not None and time.monotonic() - w.since > limit:
                done(w.job, _dead(w.job, "hang", f"no answer in {limit:.0f} s (a hang)"))
                replace(w)


def _dead(job: dict, status: str, why: str) -> dict:
    return {"seed": job["check"], "config": job["config"], "status": status, "detail": why, "reason": "", "sets": 0}


def _worker():
    """Reads requests, runs them, writes results: {"check": seed} or {"minimize": ...}."""
    import warnings
    warnings.simplefilter("ignore")
    from fuzz.harness import check, program_for
    from fuzz.minimize import minimize, write_reproducer
    for line in sys.stdin:
        job = json.loads(line)
        if "check" in job:
            reply = check(program_for(job["check"], job["config"]), job["config"]).to_json()
        else:
            from fuzz.harness import Outcome
            program = program_for(job["minimize"], job["config"])
            failure = Outcome(**job["outcome"])
            small = program if job.get("as_is") else minimize(program, job["config"], failure)
            path = write_reproducer(small, job["config"], failure.detail, Path(job["out"]))
            reply = {"reproducer": str(path)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def _reproduce(report, out, env, args):
    """A minimized reproducer per mismatch and crash (a hang is written as it is)."""
    for failure in report.failures:
        worker = Worker(env)
        job = {"minimize": failure["seed"], "config": failure["config"], "outcome": failure, "out": str(out),
               "as_is": args.no_minimize or failure["status"] == "hang"}
        worker.send(job)
        reply = _read_with_timeout(worker, 900)
        failure["reproducer"] = json.loads(reply)["reproducer"] if reply else None
        worker.stop()


def _read_with_timeout(worker: Worker, seconds: float) -> str | None:
    selector = selectors.DefaultSelector()
    selector.register(worker.proc.stdout, selectors.EVENT_READ)
    return worker.proc.stdout.readline() if selector.select(timeout=seconds) else None


class Report:
    def __init__(self, start: int):
        self.start = start
        self.programs = 0
        self.by_program = collections.Counter()    # each program's verdict over its configurations
        self.by_config = collections.defaultdict(collections.Counter)
        self.refusals = collections.Counter()
        self.failures: list[dict] = []
        self.began = time.monotonic()

    def add(self, reply: dict):
        self.programs += 1
        statuses = [o["status"] for o in reply["outcomes"]]
        for o in reply["outcomes"]:
            self.by_config[o["config"]][o["status"]] += 1
            if o["status"] in ("mismatch", "crash", "hang"):
                self.failures.append(o)
        reference = next(o for o in reply["outcomes"] if o["config"] == "reference")
        if reference["status"] == "refused":
            self.refusals[reference["reason"]] += 1
        verdict = reference["status"] if reference["status"] in ("invalid", "refused") else "accepted"
        self.by_program[verdict] += 1
        for s in ("mismatch", "crash", "hang"):
            if s in statuses:
                self.by_program[s] += 1

    def write(self, path: Path):
        path.write_text(json.dumps({
            "start_seed": self.start, "programs": self.programs, "seconds": round(time.monotonic() - self.began),
            "programs_by_verdict": dict(self.by_program), "by_config": {k: dict(v) for k, v in self.by_config.items()},
            "refusals_by_reason": dict(self.refusals.most_common()), "failures": self.failures}, indent=1))

    def table(self) -> str:
        valid = self.programs - self.by_program["invalid"]
        lines = [f"seeds {self.start}..{self.start + self.programs - 1}: {self.programs} programs in "
                 f"{time.monotonic() - self.began:.0f} s",
                 f"  valid (eager runs them): {valid}; accepted: {self.by_program['accepted']}; "
                 f"refused: {self.by_program['refused']}; invalid: {self.by_program['invalid']}",
                 f"  mismatches: {self.by_program['mismatch']}; crashes: {self.by_program['crash']}; "
                 f"hangs: {self.by_program['hang']}", "  per configuration:"]
        for config, counts in sorted(self.by_config.items()):
            lines.append(f"    {config:14s} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        if self.refusals:
            lines.append("  refusals by reason:")
            lines += [f"    {n:5d}  {reason}" for reason, n in self.refusals.most_common()]
        for f in self.failures:
            lines.append(f"  FAILED seed {f['seed']} {f['config']} {f['status']}: {f['detail'].splitlines()[0][:150]}"
                         + (f" -> {f['reproducer']}" if f.get("reproducer") else ""))
        return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
