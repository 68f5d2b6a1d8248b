"""Helpers for the construct tests: compile once, compare with eager PyTorch, count IR ops.

Only the public API is used here: `cocktailer.compile`, `cocktailer.capture`.
"""
from __future__ import annotations

import hashlib
import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

import cocktailer


# --------------------------------------------------------------------------- inputs


def gen(seed: int) -> torch.Generator:
    """A CPU generator with a fixed seed, so every test input is reproducible."""
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen(seed)) * scale


def _clone(value: Any) -> Any:
    """Deep-copy the tensors in an input structure so eager and compiled calls cannot see
    each other's in-place writes."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple):
        return tuple(_clone(v) for v in value)
    if isinstance(value, list):
        return [_clone(v) for v in value]
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


# --------------------------------------------------------------------------- comparison


def assert_same(actual: Any, expected: Any, rtol: float = 1e-5, atol: float = 1e-6, path: str = "out") -> None:
    """Recursively compare a compiled result with the eager one: same structure (tuple/list
    lengths, dict keys), and for every tensor the same dtype, the same shape and close
    values (exactly equal for integer and bool tensors)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: expected a tensor, got {type(actual).__name__}"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != eager {expected.dtype}"
        assert tuple(actual.shape) == tuple(expected.shape), (
            f"{path}: shape {tuple(actual.shape)} != eager {tuple(expected.shape)}")
        assert actual.device == expected.device, f"{path}: device {actual.device} != eager {expected.device}"
        a, e = actual.detach(), expected.detach()
        if e.dtype.is_floating_point or e.dtype.is_complex:
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{path}: {m}")
        else:
            assert torch.equal(a, e), f"{path}: values differ\ncompiled: {a}\neager:    {e}"
        return
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)), f"{path}: expected a {type(expected).__name__}, got {type(actual).__name__}"
        assert len(actual) == len(expected), f"{path}: {len(actual)} outputs != eager {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, rtol, atol, f"{path}[{i}]")
        return
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: expected a dict, got {type(actual).__name__}"
        assert set(actual) == set(expected), f"{path}: keys {sorted(actual)} != eager {sorted(expected)}"
        for k in expected:
            assert_same(actual[k], expected[k], rtol, atol, f"{path}[{k!r}]")
        return
    if expected is None:
        assert actual is None, f"{path}: expected None, got {actual!r}"
        return
    if isinstance(expected, float):
        assert isinstance(actual, (int, float)) and not isinstance(actual, bool), f"{path}: expected a float, got {actual!r}"
        assert math.isclose(actual, expected, rel_tol=rtol, abs_tol=atol) or (
            math.isnan(actual) and math.isnan(expected)), f"{path}: {actual!r} != eager {expected!r}"
        return
    assert type(actual) is type(expected), f"{path}: type {type(actual).__name__} != eager {type(expected).__name__}"
    assert actual == expected, f"{path}: {actual!r} != eager {expected!r}"


def backends_under_test() -> list[str]:
    """The reference backend, and the native CPU backend where a C compiler exists."""
    from cocktailer.runtime import find_compiler
    return ["reference"] + (["cpu"] if find_compiler() else [])


# Native kernels compute in float32 with their own exp/tanh: the tolerance for them.
NATIVE_RTOL, NATIVE_ATOL = 1e-4, 1e-5
# Native programs are called this many times per input: a race between workers shows up as
# results that differ from call to call (or as a hang). On the virtual GPU a block's lanes
# interleave only at barriers, in the same order every call, so only its blocks' timing differs
# between calls: fewer repeats there (COCKTAILER_SHAKE=1 and ThreadSanitizer look for races
# among lanes: tests/test_cuda.py).
NATIVE_REPEATS = 8
VIRTUAL_GPU_REPEATS = 2


# The cuda backend's virtual GPU (its CPU execution mode), 2 blocks of a warp's 32 threads,
# runs every program of assert_matches_eager's as users compile by default;
# COCKTAILER_TEST_CUDA=1 also with every size dynamic (a minute more, so not in CI's run)
VIRTUAL_GPU = {"virtual_gpu": True, "workers": 2, "threads": 32}


def _configs(backend: str | None) -> list[tuple[str, bool | None]]:
    """Each backend twice: as users compile by default, and with every size dynamic (symbolic
    from the first call, or specialized where the program needs it as a number)."""
    if backend:
        return [(backend, None), (backend, True)]
    from cocktailer.runtime.compiler import find_cxx_compiler
    configs = [(name, dynamic) for name in backends_under_test() for dynamic in (None, True)]
    if find_cxx_compiler() is None:   # the virtual GPU is the CUDA source compiled as C++
        return configs
    return configs + [("cuda", None)] + ([("cuda", True)] if os.environ.get("COCKTAILER_TEST_CUDA") == "1" else [])


# tests/nvcc_all.py: where every CUDA program the tests compile is written, for nvcc
CUDA_SOURCES = "COCKTAILER_CUDA_SOURCES"


def keep_cuda_source(compiled):
    """Write each CUDA program of `compiled` (for the virtual GPU: the same source nvcc gets) into
    the directory $COCKTAILER_CUDA_SOURCES names, if it names one."""
    where = os.environ.get(CUDA_SOURCES)
    if not where:
        return
    from cocktailer.runtime.cache import write_atomic
    for _, executable in compiled.cache.values():
        source = executable.record.source
        if source:
            write_atomic(Path(where, hashlib.sha256(source.encode()).hexdigest()[:20] + ".cu"), source.encode())


def _repeats(backend: str) -> int:
    return 0 if backend == "reference" else VIRTUAL_GPU_REPEATS if backend == "cuda" else NATIVE_REPEATS


def assert_matches_eager(
    model_or_fn: Callable,
    input_sets: Sequence[Sequence[Any]],
    backend: str | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-6,
):
    """Compile `model_or_fn` ONCE per backend (all backends under test unless one is named),
    and once more with dynamic=True, with the first input set as example inputs, then call
    the compiled object on every input set (same or different shapes: different values
    exercise other branches and trip counts, different shapes exercise re-specialization and
    symbolic sizes) and compare with the eager call under torch.no_grad(): the results, and
    the arguments after the call (what the program wrote into them). Returns the first
    backend's compiled object."""
    input_sets = [tuple(s) if isinstance(s, (tuple, list)) else (s,) for s in input_sets]
    assert input_sets, "need at least one input set"
    if isinstance(model_or_fn, torch.nn.Module):
        model_or_fn.eval()
    compiled = []
    for name, dynamic in _configs(backend):
        fast = cocktailer.compile(model_or_fn, example_inputs=_clone(input_sets[0]), backend=name, dynamic=dynamic,
                                  options=VIRTUAL_GPU if name == "cuda" else None)
        native, repeats_per_input = name != "reference", _repeats(name)
        name += " dynamic" if dynamic else ""
        tol = (max(rtol, NATIVE_RTOL), max(atol, NATIVE_ATOL)) if native else (rtol, atol)
        for k, inputs in enumerate(input_sets):
            eager_inputs, compiled_inputs = _clone(inputs), _clone(inputs)
            with torch.no_grad():
                expected = model_or_fn(*eager_inputs)
                actual = fast(*compiled_inputs)
                repeats = [fast(*_clone(inputs)) for _ in range(repeats_per_input)]
            assert_same(actual, expected, *tol, path=f"[{name}] input set {k}: out")
            # in-place writes into the arguments are part of the answer
            assert_same(compiled_inputs, eager_inputs, *tol, path=f"[{name}] input set {k}: inputs after the call")
            for r in repeats:
                assert_same(r, actual, 0, 0, path=f"[{name}] input set {k}, repeated call: out")
        if name.startswith("cuda"):
            keep_cuda_source(fast)   # every build: other input sets' sizes may have made more
        compiled.append(fast)
    return compiled[0]


# --------------------------------------------------------------------------- IR text

_COMMENT = re.compile(r"(^|\s)#.*$", re.MULTILINE)
_STRING = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'")


def count_ops(program_text: Any, name: str) -> int:
    """How many times the op `name` (e.g. 'loop', 'if', 'call') occurs in a program's text.

    Accepts a Program or its text. Source-location comments (`# file.py:12`) and quoted
    strings (constant names such as "cell.weight") are ignored, and `name` must stand as a
    whole word, so 'if' does not count 'elif', 'continue_if' or a '%if_1' value."""
    text = program_text if isinstance(program_text, str) else str(program_text)
    text = _STRING.sub('""', _COMMENT.sub(r"\1", text))
    return len(re.findall(r"(?<![\w@%$.])" + re.escape(name) + r"(?![\w])", text))


def capture_text(model_or_fn: Callable, inputs: Iterable[Any]) -> str:
    if isinstance(model_or_fn, torch.nn.Module):
        model_or_fn.eval()
    return str(cocktailer.capture(model_or_fn, tuple(_clone(tuple(inputs)))))
