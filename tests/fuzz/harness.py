"""Runs a generated program eagerly and compiled, and compares: results, the arguments after
the call (in-place writes are part of the answer) and, for modules, parameters and buffers.

`check(program, config)` gives an `Outcome`: "ok", "refused" (cocktailer said it cannot,
with a reason), "mismatch" (a different answer), "crash" (an exception that is not
cocktailer's own error), or "invalid" (eager PyTorch itself rejects the program).
Hangs are caught by the runner, which runs programs in worker processes with a deadline.
"""
from __future__ import annotations

import copy
import random
import re
import traceback
import warnings
from dataclasses import dataclass, field

import torch

import cocktailer
from cocktailer import settings
from cocktailer.batching import Techniques
from fuzz.gen import FuzzNode, Program

settings.verify = True   # an invalid IR is a failure even where a backend happens to run it

# (backend, options): what programs are compiled with. The reference backend always runs;
# the runner samples native configurations per program.
CONFIGS = {
    "reference": ("reference", {}),
    "cpu": ("cpu", {}),
    "cpu-w1": ("cpu", {"workers": 1}),
    "cpu-w2": ("cpu", {"workers": 2}),
    "cpu-unroll2": ("cpu", {"unroll": 2, "workers": 2}),
    "cpu-unroll3": ("cpu", {"unroll": 3}),
    "cpu-fanout": ("cpu", {"fan_out": True, "workers": 2}),
    "cpu-wavefront": ("cpu", {"wavefront": True, "measure_waves": False, "workers": 2}),
    "cpu-measured": ("cpu", {"policy": "measured", "workers": 2}),
    "host": ("host", {"workers": 2}),
    "host-nested": ("host", {"native_from": 1}),
    # with dynamic=True: every size symbolic where the program allows it
    "cpu-dynamic": ("cpu", {}),
    "reference-dynamic": ("reference", {}),
    # cocktailer.batch: BATCH_SETS input sets as the instances of one batched call, with native
    # code (the default) and with every op run by torch (loops stepped, levels op by op)
    "batch": ("batch", {}),
    "batch-torch": ("batch", {"native_blocks": False, "native_inspector": False, "level_programs": False,
                              "level_loop": False, "loop_programs": False}),
    # the same for the programs over sentences of different lengths (ragged.py, `program_for`)
    "batch-ragged": ("batch", {}),
    "batch-ragged-torch": ("batch", {"native_blocks": False, "native_inspector": False, "level_programs": False,
                                     "level_loop": False, "loop_programs": False}),
    # the cuda backend's program on a virtual GPU (its CPU execution mode): not sampled, asked for
    # (run.py --also cuda-virtual; tests/test_fuzz.py on a few seeds)
    "cuda-virtual": ("cuda", {"virtual_gpu": True, "workers": 2, "threads": 4}),
    # the same on blocks of a warp's 32 threads, and its source compiled by nvcc for an H100
    # (sm_90): a warning, or a grid of one block per SM that does not fit, is a failure
    # (run.py --also cuda-nvcc: seconds to tens of seconds more per program, nvcc's time)
    "cuda-nvcc": ("cuda", {"virtual_gpu": True, "workers": 2, "threads": 32}),
}
RAGGED = {"batch-ragged", "batch-ragged-torch"}
DYNAMIC = {"cpu-dynamic", "reference-dynamic"}
NATIVE = [name for name, (backend, _) in CONFIGS.items() if backend not in ("reference", "batch", "cuda")]
WEIGHTS = {"cpu-measured": 0.3, "host-nested": 0.5}   # the slow ones, less often
INPUT_SETS = 3
BATCH_SETS = 6


@dataclass
class Outcome:
    seed: int
    config: str
    status: str                  # ok, refused, mismatch, crash, invalid
    detail: str = ""
    reason: str = ""             # refusals: the kind of construct refused
    sets: int = 0                # input sets compared

    def to_json(self) -> dict:
        return self.__dict__.copy()


def program_for(seed: int, config: str):
    """The program a (seed, configuration) job checks: a sentence program for the ragged ones."""
    from fuzz.gen import generate
    from fuzz.ragged import generate_ragged
    return generate_ragged(seed) if config in RAGGED else generate(seed)


def configs_for(seed: int, count: int = 1) -> list[str]:
    """The reference backend and `count` native configurations, chosen by the seed."""
    rng = random.Random(seed ^ 0x5EED)
    names = rng.choices(NATIVE, [WEIGHTS.get(n, 1.0) for n in NATIVE], k=count)
    return ["reference"] + list(dict.fromkeys(names))


def check(program: Program, config: str, sets: int = INPUT_SETS, max_iterations: int | None = None) -> Outcome:
    """`max_iterations`: compile with that bound on every loop (a minimizer's candidate may loop
    for ever in native code, where no Python signal reaches it)."""
    backend, options = CONFIGS[config]
    if backend == "batch":
        return check_batch(program, BATCH_SETS, max_iterations, config)
    if max_iterations is not None:
        options = {**options, "max_iterations": max_iterations}
    out = Outcome(program.seed, config, "ok")
    inputs = [program.inputs(k) for k in range(sets)]
    try:
        eager_fn = program.build()
    except SyntaxError as e:   # a minimizer's step that unwrapped a loop around `break`
        return Outcome(program.seed, config, "invalid", _short(e))
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            _call(eager_fn if not isinstance(eager_fn, torch.nn.Module) else copy.deepcopy(eager_fn), _clone(inputs[0]))
    except TimeoutError:   # the minimizer's alarm: a candidate that loops for ever
        raise
    except Exception as e:
        return Outcome(program.seed, config, "invalid", _short(e))
    compiled_fn = program.build()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fast = cocktailer.compile(compiled_fn, _clone(inputs[0]), backend=backend, options=options,
                                      dynamic=True if config in DYNAMIC else None)
    except cocktailer.UnsupportedError as e:
        return Outcome(program.seed, config, "refused", str(e), refusal_kind(e))
    except Exception as e:
        return Outcome(program.seed, config, "crash", "compiling: " + _trace(e))
    for k, args in enumerate(inputs):
        result = _compare_once(program, eager_fn, fast, args, k, options)
        if result is not None:
            result.seed, result.config, result.sets = program.seed, config, k
            return result
        out.sets = k + 1
    if config == "cuda-nvcc":
        problem = nvcc_problem(fast)
        if problem:
            return Outcome(program.seed, config, "crash", problem, sets=out.sets)
    return out


def nvcc_problem(fast) -> str | None:
    """What is wrong with the CUDA source of each of `fast`'s programs as nvcc sees it for an
    H100 (sm_90): a compiler error or warning, or a block of the dialect's threads that does not
    fit on an SM with the registers and shared memory nvcc reports. None without nvcc."""
    from cocktailer.runtime.compiler import compile_cuda, find_nvcc
    if find_nvcc() is None:
        return None
    for _, executable in fast.cache.values():
        source = executable.record.source
        if not source:   # nothing native (a program the backend left to the reference executor)
            continue
        try:
            kernels = compile_cuda(source, "sm_90")
        except Exception as e:
            return "nvcc: " + _short(e)
        for kernel in kernels:   # one, or one per basic block at L2
            problem = kernel_problem(kernel)
            if problem:
                return problem
    return None


def kernel_problem(kernel) -> str | None:
    """A warning nvcc gave for `kernel` (its CudaResources), or a block of the dialect's threads
    that does not fit on an H100 SM with its registers and shared memory; None if neither."""
    from cocktailer.codegen.dialect import cuda
    from cocktailer.codegen.kernels import kernel_scratch_bytes
    from cocktailer.schedule.device import H100, resident_blocks_per_sm
    if kernel.warnings:
        return f"nvcc warns: {kernel.warnings}"
    threads = cuda().threads
    shared = kernel.shared_bytes + kernel_scratch_bytes(threads)   # the kernels' part of the dynamic
    if resident_blocks_per_sm(H100, threads, kernel.registers, shared) < 1:
        return f"a block of {threads} threads does not fit on an H100 SM: {kernel}"
    return None


def check_batch(program: Program, sets: int, max_iterations: int | None = None, config: str = "batch") -> Outcome:
    """`sets` input sets as the instances of one `cocktailer.batch` call: each instance's result
    and arguments after the call against eager on it alone (a module freshly built for each, so
    that no instance sees another's writes into its state; batching refuses modules that write
    it). Instances eager rejects are left out: a batch with one fails as a whole, naming it
    (tests/test_batch.py)."""
    techniques = Techniques(**CONFIGS[config][1])
    try:
        program.build()
    except SyntaxError as e:   # a minimizer's step that unwrapped a loop around `break`
        return Outcome(program.seed, config, "invalid", _short(e))
    instances, expected = [], []
    for k in range(sets):
        args = _clone(program.inputs(k))
        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                expected.append((_call(program.build(), args), args))
            instances.append(program.inputs(k))
        except TimeoutError:
            raise
        except Exception:
            continue
    if not instances:
        return Outcome(program.seed, config, "invalid", "eager rejects every input set")
    mine = [_clone(a) for a in instances]
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            batched = cocktailer.batch(program.build(), _clone(instances[0]), max_iterations=max_iterations,
                                       techniques=techniques)
            results = batched(mine)
    except cocktailer.UnsupportedError as e:
        return Outcome(program.seed, config, "refused", str(e), refusal_kind(e))
    except Exception as e:
        return Outcome(program.seed, config, "crash", "batched: " + _trace(e))
    tol = _tolerance(program.dtype)
    for k, (actual, args, (want, want_args)) in enumerate(zip(results, mine, expected)):
        problem = difference(actual, want, tol, "out") or difference(args, want_args, tol, "inputs")
        if problem and not ill_conditioned(program, instances[k], want, tol):
            return Outcome(program.seed, config, "mismatch", f"instance {k}: {problem}", sets=k)
    return Outcome(program.seed, config, "ok", sets=len(instances))


def _compare_once(program, eager_fn, fast, args, k, options) -> Outcome | None:
    eager_args, compiled_args = _clone(args), _clone(args)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            expected = _call(eager_fn, eager_args)
    except TimeoutError:
        raise
    except Exception:
        return None   # this input set makes eager fail (an index out of range, say): nothing to compare
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            actual = _call(fast, compiled_args)
    except cocktailer.UnsupportedError as e:   # a new specialization refused
        return Outcome(0, "", "refused", str(e), refusal_kind(e))
    except Exception as e:
        return Outcome(0, "", "crash", f"calling (input set {k}): " + _trace(e))
    tol = _tolerance(program.dtype)
    state = []
    if isinstance(eager_fn, torch.nn.Module):
        state = [(dict(eager_fn.state_dict()), dict(fast.fn.state_dict()))]
    problem = difference(actual, expected, tol, "out") or difference(compiled_args, eager_args, tol, "inputs") or \
        next((d for e, c in state for d in [difference(c, e, tol, "state")] if d), None)
    if problem is None:
        return None
    if ill_conditioned(program, args, expected, tol):
        return None   # eager's own answer moves that much under rounding-size changes of the inputs
    return Outcome(0, "", "mismatch", f"input set {k}: {problem}")


def _call(fn, args):
    return fn(*args)


def difference(actual, expected, tol, path) -> str | None:
    """Where `actual` differs from `expected` (structure, dtype, shape, values), or None."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return f"{path}: {type(actual).__name__} where eager has a tensor"
        if actual.dtype != expected.dtype or actual.shape != expected.shape:
            return f"{path}: {actual.dtype}{list(actual.shape)} where eager has {expected.dtype}{list(expected.shape)}"
        if expected.dtype.is_floating_point:
            scale = max(1.0, float(expected.abs().nan_to_num(0, 0, 0).max()) if expected.numel() else 1.0)
            if not torch.allclose(actual, expected, rtol=tol, atol=tol * scale, equal_nan=True):
                return f"{path}: values differ by {float((actual - expected).abs().nan_to_num(0).max()):.3g}"
        elif not torch.equal(actual, expected):
            return f"{path}: values differ"
        return None
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            return f"{path}: structure differs"
        return next((d for i, (a, e) in enumerate(zip(actual, expected))
                     for d in [difference(a, e, tol, f"{path}[{i}]")] if d), None)
    if isinstance(expected, dict):
        return next((d for key in expected for d in [difference(actual.get(key), expected[key], tol, f"{path}.{key}")]
                     if d), None)
    if isinstance(expected, FuzzNode):   # a tree passed as objects: its tensors and what was assigned on it
        if not isinstance(actual, FuzzNode) or vars(actual).keys() != vars(expected).keys():
            return f"{path}: fields {sorted(vars(actual))} where eager has {sorted(vars(expected))}"
        return next((d for key in sorted(vars(expected))
                     for d in [difference(getattr(actual, key), getattr(expected, key), tol, f"{path}.{key}")] if d), None)
    if isinstance(expected, float) and isinstance(actual, (int, float)):
        return None if abs(actual - expected) <= tol * max(1.0, abs(expected)) else f"{path}: {actual} != {expected}"
    return None if actual == expected else f"{path}: {actual!r} != {expected!r}"


def ill_conditioned(program: Program, args, expected, tol) -> bool:
    """Whether nudging the float inputs by a rounding-size amount changes eager's answer
    beyond the tolerance (a branch on a near-tie, say): then a compiled program that sums in
    another order may rightly take the other path."""
    eager_fn = program.build()
    for trial in range(3):
        g = torch.Generator().manual_seed(trial)
        nudged = tuple(a * (1 + tol * 0.01 * torch.randn(a.shape, generator=g, dtype=a.dtype))
                       if isinstance(a, torch.Tensor) and a.dtype.is_floating_point else _clone(a) for a in args)
        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                again = _call(eager_fn, nudged)
        except Exception:
            return True
        if difference(again, expected, tol, "out"):
            return True
    return False


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-9 if dtype == torch.float64 else 1e-4


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple):
        return tuple(_clone(v) for v in value)
    if isinstance(value, FuzzNode):
        return copy.deepcopy(value)
    return value


_LOCATION = re.compile(r"^.*?:\d+: ")


def refusal_kind(error: Exception) -> str:
    """The kind of a refusal, for the table: its first line without the place and names."""
    first = _LOCATION.sub("", str(error).splitlines()[0])
    first = re.sub(r"`[^`]*`", "`_`", first)
    first = re.sub(r"\b[fiub]\d*\[[\d,]*\]|\d+", "#", first)
    return first[:110]


def _short(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def _trace(e: Exception) -> str:
    return f"{type(e).__name__}: {e}\n" + "".join(traceback.format_tb(e.__traceback__)[-6:])
