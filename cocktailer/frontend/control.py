"""What converted user code calls instead of Python's `if`, `while`, `for`, `and`, calls.

On Python values these behave exactly like Python. On proxy tensors they trace each
branch / the loop body into a region and emit IF / LOOP ops. Converted code reaches this
module as the global `__ct__` (see convert.py).
"""
from __future__ import annotations

import numbers
from typing import Callable, Sequence

import torch

from cocktailer import pytree
from cocktailer.errors import UnsupportedError
from cocktailer.frontend import context
from cocktailer.frontend.tracer import Proxy, Region, RegionInfo, Restart, Tracer, Undefined, is_proxy
from cocktailer.ir import BOOL, INDEX, Op, TensorType, Value

INTERNAL_PREFIX = "__ct_"
RETURN_VALUE = "__ct_retval"
MAX_PYTHON_WHILE_ITERATIONS = 100_000


def undefined(name: str) -> Undefined:
    return Undefined(name)


def final_return(value):
    """The function fell off its end on some path: Python returns None there."""
    return None if isinstance(value, Undefined) else value


# -- conditions and boolean operators --------------------------------------------------------

def condition_value(t: Tracer, test) -> Value:
    """A tensor used as a condition, as a bool[] value (torch's truthiness: non-zero)."""
    if test.numel() != 1:
        raise UnsupportedError(f"a tensor with {test.numel()} elements used as a condition (torch says its "
                               "truth value is ambiguous)", hint="reduce it first: `.any()`, `.all()`, `.sum() > 0`")
    value = t.value_of(test)
    if value.type.shape != ():
        value = t.emit1(Op.RESHAPE, [value], shape=())
    if value.type.dtype != torch.bool:
        value = t.emit1(Op.NE, [value, t.scalar(0, value.type.dtype)])
    return value


def _truth(t: Tracer, x) -> Proxy:
    return t.wrap(condition_value(t, x))


def and_(a, b_thunk: Callable):
    if not is_proxy(a):
        return b_thunk() if a else a
    t = context.tracer()
    b = b_thunk()
    if not is_proxy(b):
        return _truth(t, a) if b else False
    return t.wrap(t.emit1(Op.AND, [condition_value(t, a), condition_value(t, b)]))


def or_(a, b_thunk: Callable):
    if not is_proxy(a):
        return a if a else b_thunk()
    t = context.tracer()
    b = b_thunk()
    if not is_proxy(b):
        return True if b else _truth(t, a)
    return t.wrap(t.emit1(Op.OR, [condition_value(t, a), condition_value(t, b)]))


def not_(a):
    if not is_proxy(a):
        return not a
    t = context.tracer()
    return t.wrap(t.emit1(Op.NOT, [condition_value(t, a)]))


def ifexp(test, then_thunk: Callable, else_thunk: Callable):
    if not is_proxy(test):
        return then_thunk() if test else else_thunk()
    (out,) = if_stmt(test, lambda _: (then_thunk(),), lambda _: (else_thunk(),), (None,), ("<x if c else y>",), None)
    return out


def raise_(exc):
    if len(context.tracer().chain) > 1:
        raise UnsupportedError("`raise` inside tensor-dependent control flow (both sides of a tensor `if` are "
                               "traced, so the raise would always happen)",
                               hint="check the condition on Python values, or remove the raise")
    raise exc


def assert_(test, msg=None):
    if is_proxy(test):
        raise UnsupportedError("`assert` on a tensor value", hint="assert on Python values (shapes) only")
    assert test, msg


# -- if ------------------------------------------------------------------------------------

def _update_originals(before: tuple, after: tuple, names: Sequence[str], in_place: Sequence[str]) -> tuple:
    """Variables the construct only wrote through (`buf[i] = v`) stay the same objects, now
    holding the new contents, so that every alias of them (a caller's tensor, an input) sees
    the writes as it would in Python."""
    if not in_place:
        return after
    t = context.tracer()
    out = list(after)
    for k, name in enumerate(names):
        old, new = before[k], after[k]
        if name not in in_place or old is new:
            continue
        if isinstance(old, Proxy) and isinstance(new, torch.Tensor):
            t.rebind(old, t.value_of(new))
        elif isinstance(old, list) and isinstance(new, list):
            old[:] = new
        elif isinstance(old, dict) and isinstance(new, dict):
            old.clear()
            old.update(new)
        else:
            continue
        out[k] = old
    return tuple(out)


def if_stmt(test, then_fn: Callable, else_fn: Callable, state: tuple, names: Sequence[str], loc, in_place=()):
    if not is_proxy(test):
        return then_fn(*state) if test else else_fn(*state)
    return _update_originals(state, _trace_if(test, then_fn, else_fn, state, names, loc), names, in_place)


def _trace_if(test, then_fn: Callable, else_fn: Callable, state: tuple, names: Sequence[str], loc):
    t = context.tracer()
    cond = condition_value(t, test)
    branches = []
    for fn, kind in ((then_fn, "then"), (else_fn, "else")):
        region = Region()
        with t.in_region(region, RegionInfo(kind, context.loc(loc))) as log:
            out = fn(*_fresh_containers(state))   # a branch that does `h[i] = v` must not change the other's `h`
        written = t.outer_mutations(log, region)
        branches.append((region, out, {p: p.value for p in written}))
        for p, old in written.items():
            p.value = old     # the other branch starts from the same state
    (then_r, then_out, then_w), (else_r, else_out, else_w) = branches
    merged, yields = [], ([], [])
    for name, a, b in zip(names, then_out, else_out):
        merged.append(_merge_branch_values(t, name, a, b, then_r, else_r, yields))
    written = list(dict.fromkeys(list(then_w) + list(else_w)))
    for p in written:
        yields[0].append(then_w.get(p, p.value))
        yields[1].append(else_w.get(p, p.value))
    then_r.yields, else_r.yields = yields
    results = t.emit(Op.IF, [cond], result_types=[v.type for v in yields[0]], regions=[then_r, else_r],
                     loc=context.loc(loc))
    results = iter(results)
    out = tuple(pytree.unflatten(spec, [leaf if leaf is not _OUTPUT else t.wrap(next(results)) for leaf in leaves])
                for spec, leaves in merged)
    for p in written:
        t.rebind(p, next(results))
    return out


_OUTPUT = object()   # placeholder for a leaf that becomes an IF result


def _fresh_containers(state: tuple) -> tuple:
    leaves, spec = pytree.flatten(state)
    return pytree.unflatten(spec, leaves)


def _merge_branch_values(t, name, a, b, then_r, else_r, yields):
    if isinstance(a, Undefined) != isinstance(b, Undefined):
        if not name.startswith(RETURN_VALUE):
            return pytree.LEAF, [Undefined(name)]
        # the path that has not returned yet: fill with zeros of the returned structure
        a, b = (pytree.tree_map(lambda _: a, b), b) if isinstance(a, Undefined) else (a, pytree.tree_map(lambda _: b, a))
    a_leaves, a_spec = pytree.flatten(a)
    b_leaves, b_spec = pytree.flatten(b)
    if a_spec != b_spec:
        raise UnsupportedError(f"variable `{name}` has a different structure in the two branches of a tensor `if`")
    leaves = []
    for x, y in zip(a_leaves, b_leaves):
        if _same_python(x, y):
            leaves.append(x)
            continue
        if isinstance(x, Undefined) or isinstance(y, Undefined):
            if not name.startswith(RETURN_VALUE) or (isinstance(x, Undefined) and isinstance(y, Undefined)):
                leaves.append(Undefined(name))
                continue
        kind = _promoted_type(name, x, y)
        yields[0].append(_as_value(t, x, kind, then_r))
        yields[1].append(_as_value(t, y, kind, else_r))
        leaves.append(_OUTPUT)
    return a_spec, leaves


def _same_python(x, y) -> bool:
    if x is y:
        return True
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return False
    try:
        return type(x) is type(y) and bool(x == y)
    except Exception:
        return False


def _promoted_type(name, *xs) -> TensorType:
    """The tensor type a variable takes when its values differ between paths."""
    tensors = [x for x in xs if isinstance(x, torch.Tensor)]
    if tensors:
        types = {TensorType.of(x) for x in tensors}
        if len(types) > 1:
            raise UnsupportedError(f"variable `{name}` is {' in one path and '.join(map(str, types))} in the other "
                                   "(a tensor-dependent `if` or loop must give it one shape and dtype)")
        (ty,) = types
        if any(isinstance(x, numbers.Number) for x in xs) and ty.shape != ():
            raise UnsupportedError(f"variable `{name}` is a Python number on one path and a {ty} tensor on another")
        return ty
    if all(isinstance(x, (numbers.Number, Undefined)) for x in xs):
        numbers_ = [x for x in xs if isinstance(x, numbers.Number)]
        if all(isinstance(x, bool) for x in numbers_):
            return BOOL
        if all(isinstance(x, int) for x in numbers_):
            return INDEX
        return TensorType((), torch.get_default_dtype())
    kinds = " and ".join(sorted({type(x).__name__ for x in xs}))
    raise UnsupportedError(f"variable `{name}` holds different Python objects ({kinds}) depending on a tensor "
                           "condition; only tensors and numbers can differ between paths",
                           hint="decide with Python values, or make both paths assign tensors")


def _as_value(t: Tracer, x, ty: TensorType, region: Region) -> Value:
    """x as a value of type ty, materialized (if needed) at the end of `region`."""
    with t.reopen(region):
        if isinstance(x, Undefined):
            return t.emit1(Op.FULL, [], shape=ty.shape, value=0, dtype=ty.dtype)
        if isinstance(x, numbers.Number):
            return t.scalar(x, ty.dtype)
        return t.value_of(x)


# -- loops ---------------------------------------------------------------------------------

class SymRange:
    """range() with tensor bounds: a loop whose trip count is read from a tensor."""

    def __init__(self, *args):
        self.start, self.stop, self.step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
        if not isinstance(self.step, int) or self.step == 0:
            raise UnsupportedError("range() with a tensor or zero step", hint="use a Python int step")


def range_(*args):
    if any(is_proxy(a) for a in args):
        return SymRange(*args)
    return range(*args)


def while_stmt(cond_fn: Callable, body_fn: Callable, state: tuple, names: Sequence[str], key, in_place=()):
    for _ in range(MAX_PYTHON_WHILE_ITERATIONS):
        test = cond_fn(*state)
        if is_proxy(test):
            out = _trace_loop(lambda i, *s: body_fn(*s), cond_fn, state, names, key, trip=None)
            return _update_originals(state, out, names, in_place)
        if not test:
            return state
        state = body_fn(*state)
    raise UnsupportedError(f"a `while` loop on Python values ran {MAX_PYTHON_WHILE_ITERATIONS} iterations at capture",
                           context.loc(key))


def for_stmt(iterable, body_fn: Callable, cond_fn: Callable | None, state: tuple, names: Sequence[str], key,
             in_place=()):
    t = context.tracer()
    if isinstance(iterable, (range, SymRange)) and key not in t.hints["unroll"]:
        trip, to_var = _range_trip(t, iterable)
        out = _trace_loop(lambda i, *s: body_fn(to_var(i), *s), cond_fn, state, names, key, trip=trip,
                          static_trip=isinstance(iterable, range))
        return _update_originals(state, out, names, in_place)
    if isinstance(iterable, SymRange):
        raise UnsupportedError("a loop over range(<tensor>) whose body needs Python values (it indexes a list "
                               "or ModuleList with the loop variable)", context.loc(key),
                               hint="use a Python int trip count for such loops")
    for item in iterable:
        if cond_fn is None:
            state = body_fn(item, *state)
            continue
        test = cond_fn(*state)
        if not is_proxy(test):
            if not test:
                break
            state = body_fn(item, *state)
        else:
            state = if_stmt(test, lambda *s, item=item: body_fn(item, *s), lambda *s: s, state, names, key, in_place)
    return state


def _range_trip(t: Tracer, r) -> tuple[Value, Callable]:
    """The trip count of a range as an i64[] value, and index -> loop variable."""
    if isinstance(r, range):
        trip = t.scalar(len(r), torch.int64)
        start, step = r.start, r.step
    else:
        start, stop, step = (_index_value(t, v) for v in (r.start, r.stop, r.step))
        span = t.emit1(Op.SUB, [stop, start])
        if r.step != 1:
            span = t.emit1(Op.FLOORDIV, [t.emit1(Op.ADD, [span, t.scalar(r.step - (1 if r.step > 0 else -1), torch.int64)]), step])
        trip = t.emit1(Op.MAXIMUM, [span, t.scalar(0, torch.int64)])
        start, step = r.start, r.step

    def to_var(i: Proxy):
        if isinstance(start, int) and start == 0 and step == 1:
            return i
        value = t.value_of(i)
        if step != 1:
            value = t.emit1(Op.MUL, [value, t.scalar(step, torch.int64)])
        if not (isinstance(start, int) and start == 0):
            value = t.emit1(Op.ADD, [value, _index_value(t, start)])
        return t.wrap(value)
    return trip, to_var


def _index_value(t: Tracer, v) -> Value:
    if isinstance(v, int):
        return t.scalar(v, torch.int64)
    if v.numel() != 1 or v.dtype.is_floating_point or v.dtype == torch.bool:
        raise UnsupportedError(f"range() bound must be an integer tensor with one element, got {TensorType.of(v)}")
    value = t.value_of(v)
    if value.type.shape != ():
        value = t.emit1(Op.RESHAPE, [value], shape=())
    return value if value.type.dtype == torch.int64 else t.emit1(Op.CAST, [value], dtype=torch.int64)


class _CarrySpec:
    """Which leaves of a loop's state are loop-carried tensors (with their type); the rest
    stay Python values fixed for the whole loop. Grows until the body agrees with it."""

    def __init__(self, leaves: list):
        self.types: dict[int, TensorType] = {i: TensorType.of(x) for i, x in enumerate(leaves)
                                             if isinstance(x, torch.Tensor)}
        self.written: list[Proxy] = []   # tensors from outside the loop that the body writes in place


def _trace_loop(body_fn, cond_fn, state: tuple, names: Sequence[str], key, trip: Value | None,
                static_trip: bool = False):
    t = context.tracer()
    leaves, spec = pytree.flatten(tuple(state))
    leaf_names = [n for n, s in zip(names, state) for _ in range(pytree.flatten(s)[1].num_leaves)]
    carry = _CarrySpec(leaves)
    info = lambda kind: RegionInfo(kind, context.loc(key), key, static_trip)
    for _ in range(len(leaves) + 64):
        inits = [_as_value(t, leaves[i], ty, t.region) for i, ty in carry.types.items()]
        inits += [t.value_of(p) for p in carry.written]
        body, changed = _trace_body(t, body_fn, leaves, spec, leaf_names, carry, info("body"))
        if changed:
            continue
        cond = _trace_cond(t, cond_fn, leaves, spec, carry, info("cond")) if cond_fn is not None else None
        regions = [body] + ([cond] if cond is not None else [])
        results = t.emit(Op.LOOP, ([trip] if trip is not None else []) + inits, {
            "has_trip": trip is not None, "has_cond": cond is not None}, result_types=[v.type for v in inits],
            regions=regions, loc=context.loc(key))
        out = list(leaves)
        for i, r in zip(carry.types, results):
            out[i] = t.wrap(r)
        for p, r in zip(carry.written, results[len(carry.types):]):
            t.rebind(p, r)
        return pytree.unflatten(spec, out)
    raise UnsupportedError("the loop's carried values did not settle", context.loc(key))


def _bind_params(t: Tracer, region: Region, leaves, carry: _CarrySpec) -> list:
    """Fresh parameters (index, carried..., written...) bound to the state the region sees."""
    t.set_params(region, [Value(INDEX)] + [Value(ty) for ty in carry.types.values()] +
                 [Value(p.value.type) for p in carry.written])
    inner = list(leaves)
    for i, v in zip(carry.types, region.params[1:]):
        inner[i] = t.wrap(v)
    for p, v in zip(carry.written, region.params[1 + len(carry.types):]):
        p.value = v
    return inner


def _trace_body(t, body_fn, leaves, spec, leaf_names, carry, info) -> tuple[Region, bool]:
    region = Region()
    saved = [p.value for p in carry.written]
    try:
        with t.in_region(region, info) as log:
            inner = _bind_params(t, region, leaves, carry)
            out_leaves, out_spec = pytree.flatten(tuple(body_fn(t.wrap(region.params[0]), *pytree.unflatten(spec, inner))))
            if out_spec != spec:
                _cannot_carry(info, "a variable changes its Python structure (list length, tuple size) in the body")
            changed = _widen(carry, leaves, out_leaves, leaf_names, info)
            if not changed:
                region.yields = [_as_value(t, out_leaves[i], ty, region) for i, ty in carry.types.items()]
                region.yields += [p.value for p in carry.written]
            written = t.outer_mutations(log, region)
    finally:
        for p, v in zip(carry.written, saved):
            p.value = v
    new_written = [p for p in written if p not in carry.written]
    for p in new_written:
        p.value = written[p]
    if new_written:
        carry.written += new_written
        return region, True
    return region, changed


def _widen(carry: _CarrySpec, leaves, out_leaves, leaf_names, info) -> bool:
    """Make carried every leaf whose value the body changes; True if the spec grew."""
    changed = False
    for i, (x, y) in enumerate(zip(leaves, out_leaves)):
        if i in carry.types:
            if isinstance(y, torch.Tensor) and TensorType.of(y) != carry.types[i]:
                raise UnsupportedError(f"loop-carried variable `{leaf_names[i]}` changes from {carry.types[i]} to "
                                       f"{TensorType.of(y)} in the loop body", info.loc,
                                       hint="keep its shape and dtype the same in every iteration")
            if not isinstance(y, (torch.Tensor, numbers.Number)):
                _cannot_carry(info, f"variable `{leaf_names[i]}` becomes a {type(y).__name__} in the body")
            continue
        if _same_python(x, y) or isinstance(y, Undefined):
            continue
        if not isinstance(y, (torch.Tensor, numbers.Number)) or not isinstance(x, (torch.Tensor, numbers.Number, Undefined)):
            _cannot_carry(info, f"variable `{leaf_names[i]}` holds a Python {type(y).__name__} that changes in the body")
        carry.types[i] = _promoted_type(leaf_names[i], y) if isinstance(y, torch.Tensor) else _promoted_type(leaf_names[i], x, y)
        changed = True
    if changed:   # keep carried leaves in state order
        carry.types = dict(sorted(carry.types.items()))
    return changed


def _cannot_carry(info: RegionInfo, why: str):
    if info.static_trip:
        raise Restart("unroll", info.loop_key)
    raise UnsupportedError(f"this loop cannot become a compiled loop: {why}", info.loc,
                           hint="carry only tensors and numbers across iterations")


def _trace_cond(t, cond_fn, leaves, spec, carry, info) -> Region:
    region = Region()
    saved = [p.value for p in carry.written]
    try:
        with t.in_region(region, info) as log:
            inner = _bind_params(t, region, leaves, carry)
            test = cond_fn(*pytree.unflatten(spec, inner))
            region.yields = [condition_value(t, test) if is_proxy(test) else t.scalar(bool(test), torch.bool)]
            if t.outer_mutations(log, region):
                raise UnsupportedError("a loop condition that writes tensors in place", info.loc)
    finally:
        for p, v in zip(carry.written, saved):
            p.value = v
    return region


# -- calls -----------------------------------------------------------------------------------

def call(f, *args, **kwargs):
    """A call in converted code: user functions and modules are converted (and recursion
    detected); builtins that would need a tensor's value get tensor versions."""
    if f in _BUILTIN_CASTS and len(args) == 1 and is_proxy(args[0]):
        return _cast_builtin(f, args[0])
    if f in (max, min) and len(args) == 2 and not kwargs and any(is_proxy(a) for a in args):
        return torch.maximum(*_as_tensors(args)) if f is max else torch.minimum(*_as_tensors(args))
    return context.current().call(f, args, kwargs)


_BUILTIN_CASTS = {int: torch.int64, float: torch.get_default_dtype(), bool: torch.bool}


def _cast_builtin(f, x: Proxy):
    t = context.tracer()
    if x.numel() != 1:
        raise UnsupportedError(f"{f.__name__}() of a tensor with {x.numel()} elements")
    if f is bool:
        return _truth(t, x)
    value = t.value_of(x)
    if value.type.shape != ():
        value = t.emit1(Op.RESHAPE, [value], shape=())
    if f is int and value.type.dtype.is_floating_point:   # int() truncates toward zero
        value = t.emit1(Op.WHERE, [t.emit1(Op.LT, [value, t.scalar(0, value.type.dtype)]),
                                   t.emit1(Op.CEIL, [value]), t.emit1(Op.FLOOR, [value])])
    dtype = _BUILTIN_CASTS[f]
    return t.wrap(value if value.type.dtype == dtype else t.emit1(Op.CAST, [value], dtype=dtype))


def _as_tensors(args):
    like = next(a for a in args if is_proxy(a))
    return [a if isinstance(a, torch.Tensor) else torch.full((), a, dtype=like.dtype) for a in args]
