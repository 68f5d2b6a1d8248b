"""The measured policy: candidates compared by the profiler, bottom-up (Cocktailer §3.2).

Algorithm 1 starts with control flow on the host and moves it down to the lowest legal unit
level, keeping each move only where the profiler says it is faster; then it sets resources
and tries the control-flow optimizations, again keeping only what measures faster. The
steps, in this order:

1. the host level (control flow in Python, each basic block one native call);
2. bottom-up, a nesting level at a time: the constructs nested at least d deep (deepest d
   first) move to L1, each inside the native block of its neighbouring data ops, while the
   constructs above them stay on the host; a construct moves only if legal (Constraint 1:
   every op it controls runs natively), so with ops that have no native kernel this is where
   the policy ends up;
2'. control flow at L1 for the whole program (legal when every op has a native kernel), with
   the cpu backend's own rewrites;
3. SetResource: fewer L1 units (workers), halving down to one;
4. recursion unroll: independent calls fan out to groups of workers, at the best worker
   count so far and at all workers;
5. loop unroll: innermost loops with a trip count run UNROLL steps per iteration;
6. wavefront co-scheduling (Rammer): independent ops of a wave side by side on groups of
   workers where balanced and where the wave, timed alone in both variants (each op on all
   workers in turn, or each on its group), measured faster so; global barriers;
7. fine-grained barriers: the same, each worker waiting only for the workers it depends on.

A candidate is a configuration (backend.Config) derived from the one the search starts from,
whose `steps` limit the search to some of these (the benchmark's Figure 19 adds them one by
one). Last, `confirm` (given by the backend) times the choice against the simple policy's
candidate (control flow at L1 on all workers) in alternating rounds, and the simple one stays
unless the choice is confirmed faster.

The schedule layer only decides what to try: `measure(candidate)` (given by the backend)
builds and times a candidate, or raises if it cannot be built, and the search goes on
without it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from cocktailer.ir import CONTROL, Program, SymbolicSizeError
from cocktailer.ir.analysis import HasKernel, has_independent_calls, native_legal, nesting_depths, \
    runs_in_python, unrollable

# A step is kept only when it is at least this much faster (a smaller difference is noise).
KEEP_MARGIN = 0.97
UNROLL = 4   # the loop unroll step tries this many steps per iteration
Candidate = Any   # a backend.Config


@dataclass
class Trial:
    step: str
    candidate: Candidate
    seconds: float | None = None    # the profiler's latency; None if it could not be built
    error: str | None = None
    kept: bool = False


class NoCandidate(RuntimeError):
    """No candidate could be built; `trials` says why for each."""

    def __init__(self, trials: list[Trial]):
        self.trials = trials
        super().__init__("no candidate could be built: " + "; ".join(f"{t.candidate}: {t.error}" for t in trials))


def _levels_down(program: Program, has_kernel: HasKernel) -> list[int]:
    """The nesting depths Algorithm 1 moves to L1, deepest first. Depth 0 with every op
    native is the whole program at L1, the next step's candidate."""
    depths = nesting_depths(program)
    levels = sorted({depths[k] for k in native_legal(program, has_kernel)}, reverse=True)
    everything_native = not any(runs_in_python(op, has_kernel) for op in program.walk())
    return [d for d in levels if d > 0 or not everything_native]


def has_control_flow(program: Program) -> bool:
    return any(op.op in CONTROL for op in program.walk())


def search(program: Program, start: Candidate, measure: Callable[[Candidate], float],
           has_kernel: HasKernel = lambda op: True,
           confirm: Callable[[Candidate, Candidate], tuple[float, float]] | None = None
           ) -> tuple[Candidate, list[Trial]]:
    """The best candidate and every trial. `start`: the simple policy's configuration, control
    flow at L1 on the most workers the search may use (its `workers`), taking `start.steps`."""
    steps, workers = start.steps, start.workers
    trials: list[Trial] = []
    best: list[Trial] = []   # the kept trial (at most one)
    needs_numbers: list[SymbolicSizeError] = []   # candidates that cannot take the program's symbolic sizes

    def attempt(step: str, candidate: Candidate):
        if step not in steps:
            return
        trial = Trial(step, candidate)
        trials.append(trial)
        try:
            trial.seconds = measure(candidate)
        except SymbolicSizeError as exc:   # a candidate that needs a size as a number: left out too
            trial.error = f"needs sizes as numbers: {exc}"
            needs_numbers.append(exc)
            return
        except Exception as exc:   # a candidate that fails to build is left out, with its reason
            trial.error = f"{type(exc).__name__}: {exc}"
            return
        if not best or trial.seconds < KEEP_MARGIN * best[0].seconds:
            if best:
                best[0].kept = False
            trial.kept = True
            best[:] = [trial]

    everything_at_l1 = start

    def best_at_l1() -> Candidate:
        return best[0].candidate if best and best[0].candidate.control == "L1" else everything_at_l1

    if has_control_flow(program):
        attempt("host level", replace(start, backend="host"))
        for depth in _levels_down(program, has_kernel):
            attempt("nested constructs at L1", replace(start, backend="host", native_from=depth))
    attempt("control flow at L1", everything_at_l1)
    units = workers // 2
    while units >= 1:
        attempt("SetResource", replace(best[0].candidate if best else everything_at_l1, workers=units))
        units //= 2
    if has_independent_calls(program) and workers > 1:
        base = best_at_l1()
        for units in sorted({base.workers, workers}, reverse=True):
            if units > 1:
                attempt("recursion unroll", replace(base, workers=units, fan_out=True))
    if any(unrollable(op) for op in program.walk()):
        attempt("loop unroll", replace(best_at_l1(), unroll=UNROLL))
    base = best_at_l1()
    if base.workers > 1 and not base.fan_out:   # a fan-out's groups already split the workers
        attempt("wavefront", replace(base, wavefront=True, fine_barriers=False))
        attempt("fine-grained barriers", replace(best_at_l1(), wavefront=True, fine_barriers=True))
    if not best:
        if needs_numbers:   # the caller compiles for the sizes as numbers and searches again
            raise needs_numbers[0]
        raise NoCandidate(trials)
    if confirm is not None and best[0].candidate != everything_at_l1 and \
            any(t.candidate == everything_at_l1 and t.seconds is not None for t in trials):
        _confirm(best, everything_at_l1, trials, confirm)
    return best[0].candidate, trials


def _confirm(best: list[Trial], simple: Candidate, trials: list[Trial],
             confirm: Callable[[Candidate, Candidate], tuple[float, float]]):
    """Time the choice against the simple policy's candidate once more, in alternating
    rounds: one measurement taken while other processes held the cores can make a slower
    candidate look faster, and a choice the confirmation contradicts falls back."""
    chosen = best[0]
    chosen_s, simple_s = confirm(chosen.candidate, simple)
    again = [Trial("confirmation", chosen.candidate, chosen_s), Trial("confirmation", simple, simple_s)]
    trials += again
    winner = again[0] if chosen_s <= simple_s else again[1]
    chosen.kept, winner.kept = False, True
    best[:] = [winner]
