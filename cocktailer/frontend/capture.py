"""capture(): run a converted model on proxy tensors and collect the Program.

Capture may restart: when a loop must be unrolled (its body needs Python values of the
loop variable), a function turns out to be recursive or the program needs a symbolic size as a
number, the capture starts over with that knowledge (the hints), until it goes through.
"""
from __future__ import annotations

import types
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from cocktailer import pytree
from cocktailer.errors import (CocktailerError, InternalError, UnsupportedError, innermost_user_frame,
                               is_user_file, raised_by_user_code)
from cocktailer.frontend import attributes, modules
from cocktailer.frontend import context
from cocktailer.frontend.control import StackedList
from cocktailer.frontend.convert import convert
from cocktailer.frontend.lowering import lower_call
from cocktailer.frontend.alias import Storage
from cocktailer.frontend.merge import Plan, Side, make_plan, side_values
from cocktailer.frontend.recursion import Summary, build_function, emit_call
from cocktailer.frontend.tracer import Proxy, Region, RegionInfo, Restart, Tracer, is_proxy, meta_like, type_of
from cocktailer.ir import Function, Op, Program, Sym, SymbolicSizeError, TensorType, Value
from cocktailer.ir.boundary import Boundary, Slot as BoundarySlot, View

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
        positions = [i for i, x in enumerate(leaves) if is_proxy(x)]
        summary = t.hints["summaries"].get(key)
        if summary is None:
            result_spec, types = self._expected_result(fn)
            summary = t.hints["summaries"][key] = Summary.from_eager(
                result_spec, types, tuple(type_of(leaves[i]) for i in positions))
        if key not in self.names:
            name = self.names[key] = _unique(fn.__name__, t.functions.values(), self.names.values())
            t.functions[name] = build_function(t, key, name, summary, converted, leaves, spec, positions,
                                               _definition_loc(fn), fn.__qualname__)
        results = emit_call(t, self.names[key], summary, [leaves[i] for i in positions], fn)
        return pytree.unflatten(summary.spec, results)

    def _expected_result(self, fn) -> tuple:
        seen = self.returns_by_code.get(fn.__code__, set())
        if len(seen) != 1:
            what = "never returned" if not seen else f"returned {len(seen)} different result types"
            raise UnsupportedError(f"recursive function `{fn.__qualname__}` {what} when run eagerly on the example "
                                   "inputs, so the type of its recursive calls is unknown", _definition_loc(fn),
                                   hint="use example inputs that reach it, and return one shape and dtype")
        return next(iter(seen))


class _Recorder:
    """Runs the program eagerly through its converted code (plain Python on real tensors)
    and notes what each user function returns: the result types of recursive functions,
    needed before capture reaches their recursive calls. (No profiler hook: profilers,
    debuggers and coverage tools keep theirs.)"""
    eager = True

    def __init__(self):
        self.seen: dict[types.CodeType, set] = {}

    def call(self, f, args: tuple, kwargs: dict):
        target = _user_callable(f)
        converted = convert(target[0]) if target is not None else None
        if converted is None:
            return f(*args, **kwargs)
        fn, self_arg = target
        result = converted(*((self_arg,) + args if self_arg is not None else args), **kwargs)
        leaves, spec = pytree.flatten(result)
        if leaves and all(isinstance(x, torch.Tensor) for x in leaves):
            self.seen.setdefault(fn.__code__, set()).add((spec, tuple(type_of(x) for x in leaves)))
        return result


def _user_callable(f) -> tuple[types.FunctionType, Any] | None:
    """(plain function, bound self) for callables whose code cocktailer should convert."""
    if isinstance(f, torch.nn.Module):
        library = modules.replacement(f)
        if library is not None:
            return library, f
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
    if f.__module__ == modules.__name__:   # our replacements of library modules: captured like the user's code
        return True
    # code typed at a prompt or exec'd ("<string>") is the user's too, though its source is unreadable
    return is_user_file(filename) or (filename.startswith("<") and not filename.startswith("<frozen"))


def _function_key(fn, args, kwargs) -> tuple:
    leaves, spec = pytree.flatten((args, kwargs))

    def sig(x):
        if isinstance(x, Proxy):   # its layout (a symbolic size at its captured value), not through torch
            return ("tensor", tuple(x.meta.shape), x.dtype)
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
    """Run eagerly and record what each user function returns (types only). It runs on copies
    of the argument tensors, and the module's own tensors are restored after it: what the
    program writes in place must not be written before the compiled call reads it."""
    recorder = _Recorder()
    args, kwargs = pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, (args, kwargs))
    with context.active(recorder), torch.no_grad():
        saved = [(x, x.clone()) for x in _module_tensors(fn)]
        try:
            recorder.call(fn, args, kwargs)
        finally:
            for x, contents in saved:
                x.copy_(contents)
    return recorder.seen


def _module_tensors(fn) -> list[torch.Tensor]:
    if not isinstance(fn, torch.nn.Module):
        return []
    return list({id(x): x for x in [*fn.parameters(), *fn.buffers()]}.values())


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


def capture(model_or_function: Callable, example_inputs: tuple = (), example_kwargs: dict | None = None,
            dynamic: frozenset = frozenset()) -> Program:
    """Capture the program `model_or_function(*example_inputs, **example_kwargs)` runs, control
    flow included. `dynamic` names dims of tensor arguments, as (leaf index, dim), whose size
    the program takes at call time (a Sym); those the program needs as a number are
    specialized, and `Program.sizes` lists the ones that stayed symbolic."""
    args, kwargs = tuple(example_inputs), dict(example_kwargs or {})
    leaves, _ = pytree.flatten((args, kwargs))
    device = _device_of(leaves)
    hints: dict[str, Any] = {"unroll": set(), "recursive": set(), "summaries": {}, "static": set(),
                             "dynamic": sorted(dynamic)}
    returns: dict = {}
    snapshot = attributes.Snapshot(model_or_function, leaves)
    try:
        return _capture_attempts(model_or_function, args, kwargs, device, hints, returns, snapshot)
    finally:
        snapshot.restore()   # what capture assigned on the user's objects (see frontend.attributes)


def _capture_attempts(model_or_function, args, kwargs, device, hints, returns, snapshot) -> Program:
    for _ in range(MAX_RESTARTS):
        snapshot.restore()
        try:
            return _capture_once(model_or_function, args, kwargs, device, hints, returns, snapshot)
        except SymbolicSizeError as e:   # the program needs these sizes as numbers: they are specialized
            hints["static"].update(e.syms)
            hints["summaries"].clear()   # what recursive functions give back was typed with them
            continue
        except CocktailerError:
            raise
        except Exception as e:
            users = getattr(e, "cocktailer_user_raise", False) or raised_by_user_code(e.__traceback__)
            if users and not getattr(e, "cocktailer_traced_path", False):
                raise   # the user's code failed where eager fails too: their own exception
            raise _capture_error(e, users) from e
        except Restart as r:
            if r.kind == "summary":    # a recursive function gives back more than assumed: its summary grew
                continue
            if r.key in hints[r.kind]:
                raise UnsupportedError(f"capture did not converge ({r.kind} {r.key})") from None
            hints[r.kind].add(r.key)
            if r.kind == "recursive" and not returns:
                returns.update(_profile_returns(model_or_function, args, kwargs))
    raise UnsupportedError(f"capture restarted more than {MAX_RESTARTS} times (too many loops to unroll)")


def _capture_error(e: Exception, users: bool) -> CocktailerError:
    """An exception during capture, as an error at the user's line: the user's own code failing
    on a path eager did not take for these inputs (capture runs both branches of a tensor
    `if`), or cocktailer's (a bug)."""
    loc = innermost_user_frame(e.__traceback__)
    if users:
        return UnsupportedError(f"while cocktailer traced it, this code raised {type(e).__name__}: {e}", loc,
                                hint="capture runs both branches of a tensor `if` and every loop body: code that "
                                     "fails on a path eager does not take for these inputs fails here; make it "
                                     "valid on every path")
    return InternalError(e, loc)


def _capture_once(fn, args, kwargs, device, hints, returns, snapshot) -> Program:
    tracer = Tracer(device, _parameter_names(fn), hints)
    forward = type(fn).forward if isinstance(fn, torch.nn.Module) else fn
    main = Function("main", Region(), _definition_loc(forward) if hasattr(forward, "__code__") else None)
    leaves, in_spec = pytree.flatten((args, kwargs))
    with context.active(Capture(tracer, returns)) as cap, \
            tracer.in_region(main.body, RegionInfo("function"), new_function=True), _CaptureMode(tracer):
        tracer.start_main(main.body)
        positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        syms = _symbolic_sizes(leaves, hints)
        tracer.symbolic = bool(syms)
        tracer.set_params(main.body, [tracer.new_param(_input_type(leaves[i], i, syms)) for i in positions])
        inner = list(leaves)
        for i, param in zip(positions, main.body.params):
            inner[i] = tracer.fresh(param, meta_like(leaves[i].shape, leaves[i].stride(), leaves[i].dtype), "input")
        a, k = pytree.unflatten(in_spec, inner)
        result = cap.call(fn, a, k)
        written = snapshot.written()
        attributes.check_written(written, main.loc)
        if written:
            result = (result, tuple(value for _, value in written))
        out, out_spec = pytree.flatten(result)
        _check_outputs(out, main.loc)
        main.body.yields, boundary = _boundary(tracer, main.body, out, [inner[i].storage for i in positions])
    tracer.check_written_constants()
    _check_constants_in_functions(tracer)
    kinds = [(True, None) if isinstance(x, torch.Tensor) else (False, x) for x in out]
    return Program({"main": main, **tracer.functions}, "main", tracer.constants, device,
                   input_spec=in_spec, output_spec=(out_spec, kinds), boundary=boundary,
                   attribute_writes=tuple(target for target, _ in written),
                   sizes=tuple((sym, positions.index(leaf), dim) for (leaf, dim), sym in syms.items()))


def _symbolic_sizes(leaves: list, hints: dict) -> dict[tuple[int, int], Sym]:
    """(leaf, dim) -> its Sym, for the dims asked to be dynamic that no attempt specialized.
    Dims of equal sizes share one Sym (as torch.compile's duck sizing: `x + y` of two sequences
    of one length needs them equal); the caller keys the program by which dims were equal
    (`api._erase_key`), so a call where they differ gets a program of its own. Names follow
    the order of all the dims asked for, so that they are the same in every attempt."""
    syms, by_size = {}, {}
    for k, (leaf, dim) in enumerate(hints["dynamic"]):
        size = int(leaves[leaf].shape[dim])
        sym = by_size.setdefault(size, Sym(f"s{k}", size))
        if sym not in hints["static"]:
            syms[(leaf, dim)] = sym
    return syms


def _input_type(x: torch.Tensor, leaf: int, syms: dict[tuple[int, int], Sym]) -> TensorType:
    return TensorType(tuple(syms.get((leaf, d), n) for d, n in enumerate(x.shape)), x.dtype)


# What a compiled function may return besides tensors: values fixed at capture, returned as they are.
_PLAIN_RESULTS = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


def _check_outputs(out: list, loc):
    """Tensors, and Python values that do not hold any (an object holding a captured tensor
    would leave the call with a capture-time stand-in in it)."""
    for x in out:
        if isinstance(x, StackedList):   # its length is the loop's symbolic trip count
            raise SymbolicSizeError(x.size, "returning a list grown in a loop")
        if not isinstance(x, (torch.Tensor, *_PLAIN_RESULTS)):
            raise UnsupportedError(f"returning a `{type(x).__name__}` object", loc,
                                   hint="return tensors and Python values in tuples, lists, dicts or named tuples")


def _boundary(t: Tracer, body: Region, out: list, inputs: list[Storage]) -> tuple[list[Value], Boundary]:
    """The entry function's yields, and how they become the call's results and in-place
    writes into the caller's tensors (see ir.boundary)."""
    tensors = [t.as_proxy(x) for x in out if isinstance(x, torch.Tensor)]
    side = Side(body, tensors)
    position = {s: n for n, s in enumerate(inputs)}
    is_outer = lambda s: s.origin == "const" or s in position
    merged = list(range(len(tensors)))
    plan, (resolved,) = make_plan([side], merged, [f"output {k}" for k in merged], is_outer)
    yields = side_values(t, plan, side, resolved)
    outer = lambda s: ("input", position[s]) if s in position else ("const", t.const_name(s))
    boundary = _recipes(plan, outer)
    for n, s in enumerate(inputs):
        if s.value is not body.params[n]:
            boundary.written.append(("input", n, len(yields)))
            yields.append(t.storage_value(s))
    for name in sorted(t.consts_written):
        boundary.written.append(("const", name, len(yields)))
        yields.append(t.storage_value(t.const_storage(t.constants[name])))
    return yields, boundary


def _recipes(plan: Plan, outer) -> Boundary:
    """The plan's layout of values (see frontend.merge.side_values) as views to rebuild."""
    slot_index = {key: k for k, key in enumerate(plan.slots)}
    position = len(plan.slots) + len(plan.links)

    def view(target, structure) -> View:
        nonlocal position
        steps = []
        for op, attrs, n in structure:
            steps.append((op.name, attrs, tuple(range(position, position + n))))
            position += n
        if target[0] == "slot":
            return View("slot", slot_index[target[1]], tuple(steps))
        return View(*outer(target[1]), tuple(steps))
    alternatives = {key: [] for key in plan.slots}
    for j, link in enumerate(plan.links.values()):
        alternatives[link.slot].append((len(plan.slots) + j, view(link.target, link.structure)))
    outputs = [View("slot", slot_index[("leaf", i)]) if leaf.kind == "slot" else view(leaf.target, leaf.structure)
               for i, leaf in plan.leaves.items()]
    slots = [BoundarySlot(k, tuple(alternatives[key])) for k, key in enumerate(plan.slots)]
    return Boundary(slots, outputs)


def _check_constants_in_functions(t: Tracer):
    """A recursive function reads constants through CONST ops: the program must not write them."""
    for fn in t.functions.values():
        for op in fn.body.walk():
            if op.op is Op.CONST and op.attrs["name"] in t.consts_written:
                raise UnsupportedError(f"recursive function `{fn.name}` reads `{op.attrs['name']}`, which the "
                                       "program writes in place", fn.loc,
                                       hint="pass the tensor to the function as an argument, or write into a clone")
