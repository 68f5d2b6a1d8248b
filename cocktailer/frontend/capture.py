"""capture(): run a converted model on proxy tensors and collect the Program.

Capture may restart: when a loop must be unrolled (its body needs Python values of the
loop variable) or a function turns out to be recursive, the capture starts over with that
knowledge (the hints), until it goes through.
"""
from __future__ import annotations

import sys
import types
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from cocktailer import pytree
from cocktailer.errors import UnsupportedError, is_user_file
from cocktailer.frontend import context
from cocktailer.frontend.convert import convert
from cocktailer.frontend.lowering import lower_call
from cocktailer.frontend.tracer import Proxy, Region, RegionInfo, Restart, Tracer, is_proxy
from cocktailer.ir import Function, Op, Program, TensorType

MAX_RESTARTS = 256
MAX_INLINE_DEPTH = 64


class _CaptureMode(TorchFunctionMode):
    def __init__(self, tracer: Tracer):
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return lower_call(self.tracer, func, args, kwargs or {})


class Capture:
    """One attempt at capturing a program; converted code reaches it through `context`."""

    def __init__(self, tracer: Tracer, returns_by_code: dict):
        self.tracer = tracer
        self.returns_by_code = returns_by_code     # recursive functions' result types, seen eagerly
        self.inline_stack: list[tuple] = []
        self.results: dict[tuple, tuple] = {}      # function key -> (result spec, result types)
        self.names: dict[tuple, str] = {}

    # -- calls from converted code ---------------------------------------------------------
    def call(self, f, args: tuple, kwargs: dict):
        target = _user_callable(f)
        if target is None:
            return f(*args, **kwargs)
        fn, self_arg = target
        converted = convert(fn)
        if converted is None:   # no source: run it as is (tensor control flow inside will be refused)
            self.tracer.unconverted.add(f"`{fn.__qualname__}` ({fn.__code__.co_filename})")
            return f(*args, **kwargs)
        if self_arg is not None:
            args = (self_arg,) + args
        key = _function_key(fn, args, kwargs)
        if key in self.tracer.hints["recursive"]:
            return self.call_function(key, fn, converted, args, kwargs)
        if key in self.inline_stack:
            raise Restart("recursive", key)
        if len(self.inline_stack) >= MAX_INLINE_DEPTH:
            raise UnsupportedError(
                f"calls nest deeper than {MAX_INLINE_DEPTH} levels with changing Python arguments "
                f"(recursion on a Python value in `{fn.__qualname__}`)",
                hint="pass the value that changes between recursive calls as a tensor")
        self.inline_stack.append(key)
        try:
            return converted(*args, **kwargs)
        finally:
            self.inline_stack.pop()

    def call_function(self, key, fn, converted, args, kwargs):
        """A recursive function becomes an IR function, built on first use, and a CALL."""
        t = self.tracer
        leaves, spec = pytree.flatten((args, kwargs))
        tensor_positions = [i for i, x in enumerate(leaves) if is_proxy(x)]
        if key not in self.names:
            self.names[key] = _unique(fn.__name__, t.functions.values(), self.names.values())
            self._build_function(key, fn, converted, leaves, spec, tensor_positions)
        result_spec, result_types = self.results[key]
        values = t.emit(Op.CALL, [t.value_of(leaves[i]) for i in tensor_positions], {"callee": self.names[key]},
                        result_types=list(result_types))
        return pytree.unflatten(result_spec, [t.wrap(v) for v in values])

    def _build_function(self, key, fn, converted, leaves, spec, tensor_positions):
        t = self.tracer
        self.results[key] = self._expected_result(fn)
        region = Region(params=[t.new_param(TensorType.of(leaves[i])) for i in tensor_positions])
        loc = _definition_loc(fn)
        with t.in_region(region, RegionInfo("function", loc), new_function=True) as log:
            inner = list(leaves)
            for i, p in zip(tensor_positions, region.params):
                inner[i] = t.wrap(p)
            a, k = pytree.unflatten(spec, inner)
            result = converted(*a, **k)
            out, out_spec = pytree.flatten(result)
            if not all(isinstance(x, torch.Tensor) for x in out):
                raise UnsupportedError(f"recursive function `{fn.__qualname__}` returns Python values",
                                       loc, hint="return tensors (or a tuple of tensors) only")
            region.yields = [t.value_of(x) for x in out]
            if log:
                raise UnsupportedError(f"recursive function `{fn.__qualname__}` writes into a tensor it did not create",
                                       loc, hint="return the new tensor instead of writing into an argument")
        got = (out_spec, tuple(v.type for v in region.yields))
        if got != self.results[key]:
            raise UnsupportedError(f"recursive function `{fn.__qualname__}` returns {list(map(str, got[1]))} but "
                                   f"returned {list(map(str, self.results[key][1]))} when run on the example inputs", loc)
        t.functions[self.names[key]] = Function(self.names[key], region, loc)

    def _expected_result(self, fn) -> tuple:
        seen = self.returns_by_code.get(fn.__code__, set())
        if len(seen) != 1:
            what = "never returned" if not seen else f"returned {len(seen)} different result types"
            raise UnsupportedError(f"recursive function `{fn.__qualname__}` {what} when run eagerly on the example "
                                   "inputs, so the type of its recursive calls is unknown", _definition_loc(fn),
                                   hint="use example inputs that reach it, and return one shape and dtype")
        return next(iter(seen))


def _user_callable(f) -> tuple[types.FunctionType, Any] | None:
    """(plain function, bound self) for callables whose code cocktailer should convert."""
    if isinstance(f, torch.nn.Module):
        forward = type(f).forward
        if not (isinstance(f, torch.nn.Sequential) or _is_user_function(forward)):
            return None
        if f._forward_hooks or f._forward_pre_hooks or torch.nn.modules.module._global_forward_hooks \
                or torch.nn.modules.module._global_forward_pre_hooks:
            raise UnsupportedError(f"module `{type(f).__name__}` has forward hooks, which compiled code does not run",
                                   hint="remove the hooks before compiling")
        return forward, f
    if isinstance(f, types.MethodType) and _is_user_function(f.__func__):
        return f.__func__, f.__self__
    if _is_user_function(f):
        return f, None
    return None


def _is_user_function(f) -> bool:
    if not isinstance(f, types.FunctionType) or f.__name__ == "<lambda>":
        return False
    filename = f.__code__.co_filename
    # code typed at a prompt or exec'd ("<string>") is the user's too, though its source is unreadable
    return is_user_file(filename) or (filename.startswith("<") and not filename.startswith("<frozen"))


def _function_key(fn, args, kwargs) -> tuple:
    leaves, spec = pytree.flatten((args, kwargs))

    def sig(x):
        if isinstance(x, Proxy):
            return ("tensor", tuple(x.shape), x.dtype)
        if isinstance(x, (bool, int, float, str, type(None))):
            return ("py", type(x), x)
        return ("obj", id(x))
    return (fn.__code__, spec, tuple(sig(x) for x in leaves))


def _unique(name: str, *taken) -> str:
    used = {getattr(x, "name", x) for group in taken for x in group}
    candidate, n = name, 1
    while candidate in used or candidate == "main":
        candidate, n = f"{name}_{n}", n + 1
    return candidate


def _definition_loc(fn):
    from cocktailer.ir import SourceLoc
    return SourceLoc(fn.__code__.co_filename, fn.__code__.co_firstlineno, fn.__qualname__)


def _profile_returns(fn: Callable, args, kwargs) -> dict:
    """Run eagerly and record what each user function returns (types only)."""
    seen: dict[types.CodeType, set] = {}

    def profiler(frame, event, arg):
        if event == "return" and is_user_file(frame.f_code.co_filename):
            leaves, spec = pytree.flatten(arg)
            if leaves and all(isinstance(x, torch.Tensor) for x in leaves):
                seen.setdefault(frame.f_code, set()).add((spec, tuple(TensorType.of(x) for x in leaves)))

    old = sys.getprofile()
    sys.setprofile(profiler)
    try:
        with torch.no_grad():
            fn(*args, **kwargs)
    finally:
        sys.setprofile(old)
    return seen


def _device_of(leaves) -> torch.device:
    devices = {x.device for x in leaves if isinstance(x, torch.Tensor)}
    if len(devices) > 1:
        raise UnsupportedError(f"inputs live on several devices: {sorted(map(str, devices))}",
                               hint="move all inputs to one device")
    return devices.pop() if devices else torch.device("cpu")


def _parameter_names(module) -> dict[int, str]:
    if not isinstance(module, torch.nn.Module):
        return {}
    named = list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False))
    return {id(t): name for name, t in reversed(named)}


def capture(model_or_function: Callable, example_inputs: tuple = (), example_kwargs: dict | None = None) -> Program:
    """Capture the program `model_or_function(*example_inputs, **example_kwargs)` runs, control flow included."""
    args, kwargs = tuple(example_inputs), dict(example_kwargs or {})
    leaves, _ = pytree.flatten((args, kwargs))
    device = _device_of(leaves)
    hints: dict[str, set] = {"unroll": set(), "recursive": set()}
    returns: dict = {}
    for _ in range(MAX_RESTARTS):
        try:
            return _capture_once(model_or_function, args, kwargs, device, hints, returns)
        except Restart as r:
            if r.key in hints[r.kind]:
                raise UnsupportedError(f"capture did not converge ({r.kind} {r.key})") from None
            hints[r.kind].add(r.key)
            if r.kind == "recursive" and not returns:
                returns.update(_profile_returns(model_or_function, args, kwargs))
    raise UnsupportedError(f"capture restarted more than {MAX_RESTARTS} times (too many loops to unroll)")


def _capture_once(fn, args, kwargs, device, hints, returns) -> Program:
    tracer = Tracer(device, _parameter_names(fn), hints)
    forward = type(fn).forward if isinstance(fn, torch.nn.Module) else fn
    main = Function("main", Region(), _definition_loc(forward) if hasattr(forward, "__code__") else None)
    leaves, in_spec = pytree.flatten((args, kwargs))
    with context.active(Capture(tracer, returns)) as cap, \
            tracer.in_region(main.body, RegionInfo("function"), new_function=True), _CaptureMode(tracer):
        tensor_positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        tracer.set_params(main.body, [tracer.new_param(TensorType.of(leaves[i])) for i in tensor_positions])
        inner = list(leaves)
        for i, param in zip(tensor_positions, main.body.params):
            inner[i] = tracer.wrap(param)
        a, k = pytree.unflatten(in_spec, inner)
        result = cap.call(fn, a, k)
        out, out_spec = pytree.flatten(result)
        main.body.yields = [tracer.value_of(x) for x in out if isinstance(x, torch.Tensor)]
        # Inputs written in place: their final values are extra results, copied back after the call.
        written = [n for n, i in enumerate(tensor_positions) if inner[i].value is not main.body.params[n]]
        main.body.yields += [inner[tensor_positions[n]].value for n in written]
    kinds = [(True, None) if isinstance(x, torch.Tensor) else (False, x) for x in out]
    return Program({"main": main, **tracer.functions}, "main", tracer.constants, device,
                   input_spec=in_spec, output_spec=(out_spec, kinds), inputs_written=written)
