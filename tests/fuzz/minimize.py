"""Shrinking a failing program, and writing it out as a stand-alone reproducer.

`minimize(program, config, status)` removes statements, unwraps `if`/`for`/`while` into their
bodies and drops `else` blocks, one at a time, greedily, for as long as the program still
fails the same way ("mismatch" or "crash") on the same configuration (a change that makes
eager PyTorch reject the program does not count). `write_reproducer` turns the result into
a Python file that runs the program eagerly and compiled and asserts they agree: a test.
"""
from __future__ import annotations

import copy
import pprint
import re
import signal
import time
from pathlib import Path

import torch

from fuzz.gen import FuzzNode, Program, Stmt
from fuzz.harness import BATCH_SETS, CONFIGS, INPUT_SETS, Outcome, check


CANDIDATE_ITERATIONS = 100_000   # generated loops run a few iterations: more is a candidate looping for ever


def minimize(program: Program, config: str, failure: Outcome, seconds: float = 300.0) -> Program:
    deadline = time.monotonic() + seconds
    still_fails = lambda p: signature(_check_within(p, config, 20.0)) == signature(failure)
    best = program
    progress = True
    while progress and time.monotonic() < deadline:
        progress = False
        for candidate in _smaller(best):
            if time.monotonic() > deadline:
                break
            if still_fails(candidate):
                best, progress = candidate, True
                break
    return best


def _check_within(program: Program, config: str, seconds: float):
    """check(), given up after `seconds` (a smaller program may loop for ever: a `while` whose
    counter the minimizer removed). The alarm stops eager PyTorch; compiled loops stop at
    `CANDIDATE_ITERATIONS` (native code does not see the alarm)."""
    def give_up(*_):
        raise TimeoutError
    old = signal.signal(signal.SIGALRM, give_up)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return check(program, config, max_iterations=CANDIDATE_ITERATIONS)
    except TimeoutError:
        return Outcome(program.seed, config, "timeout")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def signature(outcome) -> tuple:
    """What makes two failures the same: the status and where (which output, which error)."""
    detail = re.sub(r"^input set \d+: |^calling \(input set \d+\): ", "", outcome.detail)
    where = detail.split(":")[0] if outcome.status == "mismatch" else detail.split("\n")[0]
    return (outcome.status, re.sub(r"\d+", "#", where)[:80])


def _smaller(program: Program):
    """Programs one step smaller than `program`: bigger steps first."""
    for where in ("helper", "body"):
        blocks = list(_blocks(getattr(program, where)))
        for block in blocks:   # halves and quarters of a block, then single statements
            for size in (len(block) // 2, len(block) // 4):
                for k in range(0, len(block) - size + 1, max(size, 1)) if size > 1 else ():
                    yield _edit(program, where, block, slice(k, k + size), "drop")
        for block in blocks:
            for k in range(len(block)):
                yield _edit(program, where, block, k, "drop")
        for block in blocks:
            for k, stmt in enumerate(block):
                if stmt.header is not None and not stmt.header.startswith("def "):
                    yield _edit(program, where, block, k, "unwrap")
                    if stmt.orelse:
                        yield _edit(program, where, block, k, "no-else")
                        yield _edit(program, where, block, k, "else-only")


def _blocks(stmts: list[Stmt]):
    yield stmts
    for s in stmts:
        if s.header is not None:
            yield from _blocks(s.body)
            if s.orelse:
                yield from _blocks(s.orelse)


def _edit(program: Program, where: str, block: list[Stmt], k: int, how: str) -> Program:
    """A copy of `program` with statement k of `block` dropped or unwrapped."""
    path = _path_to(getattr(program, where), block)
    clone = copy.deepcopy(program)
    target = _follow(getattr(clone, where), path)
    if how == "drop":
        del target[k]
        return clone
    stmt = target[k]
    if how == "drop":
        del target[k]
    elif how == "unwrap":
        target[k:k + 1] = stmt.body
    elif how == "no-else":
        stmt.orelse = []
    else:
        target[k:k + 1] = stmt.orelse
    return clone


def _path_to(stmts: list[Stmt], block: list[Stmt], path=()) -> tuple | None:
    if stmts is block:
        return path
    for i, s in enumerate(stmts):
        if s.header is None:
            continue
        for part in ("body", "orelse"):
            found = _path_to(getattr(s, part), block, path + ((i, part),))
            if found is not None:
                return found
    return None


def _follow(stmts: list[Stmt], path: tuple) -> list[Stmt]:
    for i, part in path:
        stmts = getattr(stmts[i], part)
    return stmts


def write_reproducer(program: Program, config: str, detail: str, directory: Path) -> Path:
    """A stand-alone file: the program, its input sets, the configuration, and the check."""
    backend, options = CONFIGS[config]
    sets = [[_literal(x) for x in program.inputs(k)] for k in range(BATCH_SETS if backend == "batch" else INPUT_SETS)]
    path = Path(directory) / f"repro_{program.seed}_{config}.py"
    header = "\n".join(f"# {line}" for line in detail.splitlines()[:12])
    path.write_text(f'''"""cocktailer differential-fuzzing reproducer: seed {program.seed}, {config}.
Run it (python {path.name}) or collect it with pytest; it passes once the bug is fixed."""
# What the fuzzer saw:
{header}
import copy

import torch

import cocktailer

{program.source}

DTYPE = {program.dtype}
INPUT_SETS = {pprint.pformat(sets, width=110)}
BACKEND, OPTIONS = {backend!r}, {options!r}


def _model():
{_model_source(program)}


class FuzzNode:
    def __init__(self, x, left=None, right=None):
        self.x, self.left, self.right = x, left, right


def _tree(literal):
    x, left, right = literal[:3]
    return FuzzNode(torch.tensor(x, dtype=DTYPE), *(None if c is None else _tree(c) for c in (left, right)))


def _inputs(k):
    return tuple(_tree(v) if t == "tree" else torch.tensor(v, dtype=getattr(torch, t)) for v, t in INPUT_SETS[k])


def _comparable(args):
    """Trees as nested tuples of their tensors (and what the program assigned on them)."""
    if isinstance(args, FuzzNode):
        return tuple(_comparable(v) for _, v in sorted(vars(args).items()))
    return tuple(_comparable(a) for a in args) if isinstance(args, tuple) else args


def _eager_or_none(k):
    try:
        args = _inputs(k)
        with torch.no_grad():
            return _model()(*args), args
    except Exception:   # eager rejects this input set: it is not an instance
        return None


def test_reproducer():
    if BACKEND == "batch":   # the input sets eager accepts, as the instances of one batched call
        from cocktailer.batching import Techniques
        kept = [k for k in range(len(INPUT_SETS)) if _eager_or_none(k) is not None]
        batched = cocktailer.batch(_model(), _inputs(kept[0]), techniques=Techniques(**OPTIONS))
        mine = [_inputs(k) for k in kept]
        with torch.no_grad():
            actuals = batched(mine)
        tol = 1e-9 if DTYPE == torch.float64 else 1e-4
        for k, actual, args in zip(kept, actuals, mine):
            expected, eager_args = _eager_or_none(k)
            torch.testing.assert_close(actual, expected, rtol=tol, atol=tol, equal_nan=True)
            torch.testing.assert_close(_comparable(args), _comparable(eager_args), rtol=tol, atol=tol, equal_nan=True)
        return
    eager, compiled = _model(), _model()
    fast = cocktailer.compile(compiled, _inputs(0), backend=BACKEND, options=OPTIONS)
    for k in range(len(INPUT_SETS)):
        eager_args, compiled_args = _inputs(k), _inputs(k)
        with torch.no_grad():
            expected, actual = eager(*eager_args), fast(*compiled_args)
        tol = 1e-9 if DTYPE == torch.float64 else 1e-4
        torch.testing.assert_close(actual, expected, rtol=tol, atol=tol, equal_nan=True)
        torch.testing.assert_close(_comparable(compiled_args), _comparable(eager_args), rtol=tol, atol=tol,
                                   equal_nan=True)


if __name__ == "__main__":
    test_reproducer()
    print("passes")
''')
    return path


def _literal(x) -> tuple:
    if isinstance(x, FuzzNode):
        return (x.literal(), "tree")
    return (x.tolist(), str(x.dtype).removeprefix("torch."))


def _model_source(program: Program) -> str:
    if not program.module:
        return "    return f"
    buffer = (f"    with torch.no_grad():\n        model.buf.copy_(torch.randn(4, 3, dtype={program.dtype}))\n"
              if program.seeded_buffer else "")
    return f"    torch.manual_seed({program.seed})\n    model = M().to({program.dtype}).eval()\n" + buffer + "    return model"
