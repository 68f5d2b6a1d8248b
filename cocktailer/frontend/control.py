"""What converted user code calls instead of Python's `if`, `while`, `for`, `and`, calls.

On Python values these behave exactly like Python. On proxy tensors they trace each
branch / the loop body into a region and emit IF / LOOP ops. Converted code reaches this
module as the global `__ct__` (see convert.py).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from cocktailer import pytree
from cocktailer.errors import UnsupportedError
from cocktailer.frontend import context
from cocktailer.frontend.merge import Plan, ShapeMergeError, Side, build, make_plan, on_side, resolve, side_values
from cocktailer.frontend.tracer import (Proxy, Region, RegionInfo, Restart, SizeProxy, Tracer, Undefined, is_proxy,
                                       type_of)
from cocktailer.ir import INDEX, Op, SymbolicSizeError, TensorType, Value

INTERNAL_PREFIX = "__ct_"
RETURN_VALUE = "__ct_retval"
MAX_PYTHON_WHILE_ITERATIONS = 100_000


def undefined(name: str) -> Undefined:
    return Undefined(name)


def final_return(value, returned=True):
    """The function's result. `returned` is whether a return statement ran (True where the
    function cannot fall off its end): where it did not, Python returns None."""
    if isinstance(value, Undefined) or returned is False:
        return None
    if is_proxy(returned) and value is not None:
        raise UnsupportedError("the function returns a value on some paths and falls off its end (returning None) "
                               "on others, depending on a tensor", hint="end the function with a return statement")
    return value


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
    return t.fresh(condition_value(t, x))


def test_of(x):
    """What `if x:` tests: an object may answer with a tensor (a linearized tree's node: whether
    it is there; a node list: whether it is empty; see frontend.nodes)."""
    truth = getattr(type(x), "__ct_truth__", None)
    return truth(x) if truth is not None else x


def is_none(x):
    """`x is None`, where an object may answer with a tensor (a linearized tree's missing child)."""
    answer = getattr(type(x), "__ct_is_none__", None)
    return answer(x) if answer is not None else x is None


def and_(a, b_thunk: Callable):
    a = test_of(a)
    if not is_proxy(a):
        return b_thunk() if a else a
    t = context.tracer()
    b = test_of(b_thunk())
    if not is_proxy(b):
        return _truth(t, a) if b else False
    return t.fresh(t.emit1(Op.AND, [condition_value(t, a), condition_value(t, b)]))


def or_(a, b_thunk: Callable):
    test = test_of(a)
    if not is_proxy(test):
        return a if test else b_thunk()   # Python's `or` gives back the object itself
    a = test
    t = context.tracer()
    b = test_of(b_thunk())
    if not is_proxy(b):
        return True if b else _truth(t, a)
    return t.fresh(t.emit1(Op.OR, [condition_value(t, a), condition_value(t, b)]))


def not_(a):
    a = test_of(a)
    if not is_proxy(a):
        return not a
    t = context.tracer()
    return t.fresh(t.emit1(Op.NOT, [condition_value(t, a)]))


def ifexp(test, then_thunk: Callable, else_thunk: Callable):
    test = test_of(test)
    if not is_proxy(test):
        return then_thunk() if test else else_thunk()
    (out,) = if_stmt(test, lambda _: (then_thunk(),), lambda _: (else_thunk(),), (None,), ("<x if c else y>",), None)
    return out


def raise_(exc):
    if not getattr(context.current(), "eager", False) and len(context.tracer().chain) > 1:
        raise UnsupportedError("`raise` inside tensor-dependent control flow (both sides of a tensor `if` are "
                               "traced, so the raise would always happen)",
                               hint="check the condition on Python values, or remove the raise")
    if isinstance(exc, BaseException):
        exc.cocktailer_user_raise = True   # the user's own `raise`, though this frame is cocktailer's
    raise exc


def assert_(test, msg=None):
    if is_proxy(test):
        raise UnsupportedError("`assert` on a tensor value", hint="assert on Python values (shapes) only")
    assert test, msg


# -- merging the variables of several paths ------------------------------------------------------

def _same_python(x, y) -> bool:
    if x is y:
        return True
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return False
    try:
        return type(x) is type(y) and bool(x == y)
    except Exception:
        return False


def _update_originals(before: tuple, after: tuple, names: Sequence[str], in_place: Sequence[str]) -> tuple:
    """Python lists and dicts the construct only wrote through (`lst[i] = v`) stay the same
    objects, now holding the new contents, so that every alias of them sees the writes as
    in Python. (Tensors need nothing: a write goes to their storage, which every alias shares.)"""
    if not in_place:
        return after
    out = list(after)
    for k, name in enumerate(names):
        old, new = before[k], after[k]
        if name not in in_place or old is new:
            continue
        if isinstance(old, list) and isinstance(new, list):
            old[:] = new
        elif isinstance(old, dict) and isinstance(new, dict):
            old.clear()
            old.update(new)
        else:
            continue
        out[k] = old
    return tuple(out)


@dataclass
class _Aligned:
    """The variables of several paths, flattened side by side: the leaves that differ
    between paths (`leaves[side]`, named by `names`) and how to rebuild each variable."""
    parts: list = field(default_factory=list)     # per variable: (spec, [(kind, fixed value | leaf | name)])
    names: list = field(default_factory=list)
    leaves: list = field(default_factory=list)

    def rebuild(self, merged: dict) -> tuple:
        def leaf(kind, v):
            return v if kind == "fixed" else merged[v] if kind == "merged" else Undefined(v)
        return tuple(pytree.unflatten(spec, [leaf(kind, v) for kind, v in entries]) for spec, entries in self.parts)


def _align_branches(names: Sequence[str], outs: list[tuple], dead: int | None = None) -> _Aligned:
    """`dead`: the branch on which variables are dead (the function returned there): where it
    differs from the other, a variable takes the other's value, with filler there."""
    aligned = _Aligned(leaves=[[] for _ in outs])
    for k, name in enumerate(names):
        values = [out[k] for out in outs]
        fill = name.startswith(RETURN_VALUE)   # where unassigned: filler of the assigned structure
        if dead is not None and not name.startswith(INTERNAL_PREFIX) and not _same_python(*values):
            values[dead], fill = Undefined(name), True
        undefined = [isinstance(v, Undefined) for v in values]
        if any(undefined) and not all(undefined):
            if not fill:
                aligned.parts.append((pytree.LEAF, [("undefined", name)]))
                continue
            if all(v is None for v in values if not isinstance(v, Undefined)):   # a bare `return`: None
                aligned.parts.append((pytree.LEAF, [("fixed", None)]))
                continue
            shape = next(v for v in values if not isinstance(v, Undefined))
            values = [pytree.tree_map(lambda _, u=v: u, shape) if isinstance(v, Undefined) else v for v in values]
        flat = [pytree.flatten(v) for v in values]
        if any(spec != flat[0][1] for _, spec in flat):
            raise UnsupportedError(f"variable `{name}` has a different structure in the two branches of a tensor `if`")
        entries = []
        for xs in zip(*(leaves for leaves, _ in flat)):
            if all(_same_python(xs[0], x) for x in xs[1:]):
                entries.append(("fixed", xs[0]))
            elif any(isinstance(x, Undefined) for x in xs) and (not fill or all(isinstance(x, Undefined) for x in xs)):
                entries.append(("undefined", name))
            else:
                entries.append(("merged", len(aligned.names)))
                aligned.names.append(name)
                for side, x in zip(aligned.leaves, xs):
                    side.append(x)
        aligned.parts.append((flat[0][1], entries))
    return aligned


def _side(t: Tracer, region: Region | None, leaves: list, state: dict | None = None) -> Side:
    """A path's end for the merge planner: a parameter or global tensor a variable holds is
    the storage of that constant (it may be written through the variable)."""
    return Side(region, [t.as_proxy(x) if isinstance(x, torch.Tensor) else x for x in leaves], state)


def _outside(t: Tracer, *regions: Region):
    """Whether a storage existed before these regions (what their paths merge against)."""
    inside = {id(r) for region in regions for r in t.regions_within(region)}
    return lambda s: s.region is None or id(s.region) not in inside


# -- if ------------------------------------------------------------------------------------

def if_stmt(test, then_fn: Callable, else_fn: Callable, state: tuple, names: Sequence[str], loc, in_place=(),
            returned=False):
    """`returned`: the else path is where the function has already returned (the guard of
    what follows a `return`): variables are dead there, and may take another shape here."""
    test = test_of(test)
    if not is_proxy(test):
        return then_fn(*state) if test else else_fn(*state)
    return _update_originals(state, _trace_if(test, then_fn, else_fn, state, names, loc, returned), names,
                             in_place)


def _trace_if(test, then_fn: Callable, else_fn: Callable, state: tuple, names: Sequence[str], loc, returned=False):
    t = context.tracer()
    cond = condition_value(t, test)
    regions, outs, ends, written = [], [], [], {}
    for fn, kind in ((then_fn, "then"), (else_fn, "else")):
        region = Region()
        with t.in_region(region, RegionInfo(kind, context.loc(loc))) as log:
            outs.append(fn(*_fresh_containers(state)))   # a branch that does `lst[i] = v` must not change the other's list
        writes = t.outer_writes(log, region)
        regions.append(region)
        ends.append(t.state_of(writes))
        t.set_state(writes)      # the other branch starts from the same state
        written.update(dict.fromkeys(writes))
    aligned = _align_branches(names, outs, dead=1 if returned else None)
    sides = [_side(t, region, leaves, end) for region, leaves, end in zip(regions, aligned.leaves, ends)]
    merged = list(range(len(aligned.names)))
    plan, resolved = make_plan(sides, merged, aligned.names, _outside(t, *regions))
    for side, r in zip(sides, resolved):
        values = side_values(t, plan, side, r)
        with on_side(t, side):
            values += [t.storage_value(s) for s in written]
        side.region.yields = values
    results = t.emit(Op.IF, [cond], result_types=[v.type for v in regions[0].yields], regions=regions,
                     loc=context.loc(loc))
    n = len(results) - len(written)
    for s, value in zip(written, results[n:]):
        t.assign(s, value, propagate=False)   # each branch wrote the memory it shares already
    return aligned.rebuild(build(t, plan, results[:n]))


def _fresh_containers(state: tuple) -> tuple:
    leaves, spec = pytree.flatten(state)
    return pytree.unflatten(spec, leaves)


# -- loops ---------------------------------------------------------------------------------

class SymRange:
    """range() with tensor bounds: a loop whose trip count is read from a tensor."""

    def __init__(self, *args):
        self.start, self.stop, self.step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
        if not isinstance(self.step, int) or self.step == 0:
            raise UnsupportedError("range() with a tensor or zero step", hint="use a Python int step")


def len_(x):
    """`len(x)` in a `range()` bound, or of a captured tensor anywhere: a tensor's leading size
    as `x.shape` gives it (a SizeProxy where that size is symbolic: a loop runs for the call's
    length, a view keeps it; where Python needs the number, it is specialized); else len()."""
    if isinstance(x, torch.Tensor) and x.dim() > 0:
        return x.shape[0]
    if isinstance(x, StackedList):
        return x.rows.shape[0]
    return len(x)


def range_(*args):
    if any(is_proxy(a) for a in args):
        return SymRange(*args)
    return range(*args)


def while_stmt(cond_fn: Callable, body_fn: Callable, state: tuple, names: Sequence[str], key, in_place=(),
               rebound=()):
    for _ in range(MAX_PYTHON_WHILE_ITERATIONS):
        test = test_of(cond_fn(*state))
        if is_proxy(test):
            out = _trace_loop(lambda i, *s: body_fn(*s), cond_fn, state, names, key, None, rebound=rebound)
            return _update_originals(state, out, names, in_place)
        if not test:
            return state
        state = body_fn(*state)
    raise UnsupportedError(f"a `while` loop on Python values ran {MAX_PYTHON_WHILE_ITERATIONS} iterations at capture",
                           context.loc(key))


def for_stmt(iterable, body_fn: Callable, cond_fn: Callable | None, state: tuple, names: Sequence[str], key,
             in_place=(), rebound=(), returned=False):
    eager = getattr(context.current(), "eager", False)   # running the program as plain Python
    t = None if eager else context.tracer()
    if hasattr(type(iterable), "__ct_loop__"):   # a linearized tree's list of nodes: a loop over its rows
        trip, element = iterable.__ct_loop__()
        iterable, inner = range_(trip), body_fn
        body_fn = lambda i, *s: inner(element(i), *s)
    if not eager and isinstance(iterable, (range, SymRange)) and key not in t.hints["unroll"]:
        trip, to_var = _range_trip(t, iterable)
        rows = iterable.stop.sym if isinstance(iterable, SymRange) and isinstance(iterable.stop, SizeProxy) and \
            iterable.start == 0 and iterable.step == 1 and cond_fn is None else None
        out = _trace_loop(lambda i, *s: body_fn(to_var(i), *s), cond_fn, state, names, key, trip,
                          static_trip=isinstance(iterable, range), rebound=rebound, rows=rows)
        return _update_originals(state, out, names, in_place)
    if isinstance(iterable, SymRange):
        raise UnsupportedError("a loop over range(<tensor>) whose body needs Python values (it indexes a list "
                               "or ModuleList with the loop variable)", context.loc(key),
                               hint="use a Python int trip count for such loops")
    for item in iterable:
        if cond_fn is None:
            state = body_fn(item, *state)
            continue
        test = test_of(cond_fn(*state))
        if not is_proxy(test):
            if not test:
                break
            state = body_fn(item, *state)
        else:
            state = if_stmt(test, lambda *s, item=item: body_fn(item, *s), lambda *s: s, state, names, key, in_place,
                            returned)
    return state


def _range_trip(t: Tracer, r) -> tuple[Value, Callable]:
    """The trip count of a range as an i64[] value, and index -> loop variable."""
    if isinstance(r, range):
        trip = t.scalar(len(r), torch.int64)
        start, step = r.start, r.step
    elif isinstance(r.stop, SizeProxy) and r.start == 0 and r.step == 1:   # range(n), n a size: never negative
        trip = t.value_of(r.stop)
        start, step = 0, 1
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
        return t.fresh(value)
    return trip, to_var


def _index_value(t: Tracer, v) -> Value:
    if isinstance(v, int):
        return t.scalar(v, torch.int64)
    if v.numel() != 1 or v.dtype.is_floating_point or v.dtype == torch.bool:
        raise UnsupportedError(f"range() bound must be an integer tensor with one element, got {type_of(v)}")
    value = t.value_of(v)
    if value.type.shape != ():
        value = t.emit1(Op.RESHAPE, [value], shape=())
    return value if value.type.dtype == torch.int64 else t.emit1(Op.CAST, [value], dtype=torch.int64)


@dataclass
class _LoopState:
    """What a loop carries: the variables' layout at the head of the body (a merge plan
    over what enters the loop and what an iteration leaves), and the storages from before
    the loop that the body writes."""
    leaves: list
    spec: Any
    names: list              # per leaf: the variable it belongs to
    variables: list          # the state variables' names
    head: Plan
    written: list = field(default_factory=list)
    rows: Any = None         # the Sym of a symbolic trip count: lists the body appends to are stacked
    stacked: list = field(default_factory=list)   # indices of those variables (empty lists before the loop)


def _trace_loop(body_fn, cond_fn, state: tuple, names: Sequence[str], key, trip: Value | None,
                static_trip: bool = False, rebound=(), rows=None):
    t = context.tracer()
    info = lambda kind: RegionInfo(kind, context.loc(key), key, static_trip)
    loop = _loop_state(t, state, names, rebound)
    loop.rows = rows
    try:
        for _ in range(len(loop.leaves) + 64):
            body = _trace_body(t, body_fn, loop, info("body"))
            if body is not None:
                break
        else:
            raise UnsupportedError("the loop's carried values did not settle", context.loc(key))
    except ShapeMergeError:
        if static_trip:   # a value grows each iteration (`idx = torch.cat([idx, nxt])`): with a Python
            raise Restart("unroll", key) from None   # trip count, unrolled it is what eager runs
        raise
    regions = [body] + ([_trace_cond(t, cond_fn, loop, info("cond"))] if cond_fn is not None else [])
    init = _side(t, t.region, loop.leaves)
    inits = side_values(t, loop.head, init, resolve(init, list(loop.head.leaves), 0, lambda s: True))
    inits += [t.storage_value(s) for s in loop.written]
    stacked = [TensorType((loop.rows, *y.type.shape), y.type.dtype) for y in body.yields[len(inits):]]
    results = t.emit(Op.LOOP, ([trip] if trip is not None else []) + inits,
                     {"has_trip": trip is not None, "has_cond": cond_fn is not None, "stacked": len(stacked)},
                     result_types=[v.type for v in inits] + stacked, regions=regions, loc=context.loc(key))
    results, stacks = results[:len(inits)], results[len(inits):]
    n = len(results) - len(loop.written)
    for s, value in zip(loop.written, results[n:]):
        t.assign(s, value, propagate=False)   # the body wrote the memory it shares already
    out = list(loop.leaves)
    for i, proxy in build(t, loop.head, results[:n]).items():
        out[i] = proxy
    variables = list(pytree.unflatten(loop.spec, out))
    for k, value in zip(loop.stacked, stacks):
        variables[k] = StackedList(t.fresh(value), loop.rows)
    return tuple(variables)


def _loop_state(t: Tracer, state: tuple, names: Sequence[str], rebound) -> _LoopState:
    leaves, spec = pytree.flatten(tuple(state))
    leaf_names = [n for n, s in zip(names, state) for _ in range(pytree.flatten(s)[1].num_leaves)]
    # A guess of what the loop carries, so that most loops are traced once: tensors and
    # numbers the body assigns to, and numbers it updates (`+=` on a tensor writes it in place).
    guess = [i for i, (x, n) in enumerate(zip(leaves, leaf_names))
             if (n in rebound and isinstance(x, (torch.Tensor, numbers.Number)))
             or (n not in rebound and isinstance(x, numbers.Number) and not isinstance(x, bool))]
    head, _ = make_plan([_side(t, None, leaves)], guess, leaf_names, lambda s: True, force_slots=guess)
    return _LoopState(leaves, spec, leaf_names, list(names), head)


def _bind(t: Tracer, region: Region, loop: _LoopState) -> tuple[Proxy, list]:
    """The region's parameters (index, what the head plan carries, the written storages)
    and the variables as the region sees them."""
    index = Value(INDEX)
    params = [Value(ty) for ty in loop.head.value_types()]
    written = [Value(s.type) for s in loop.written]
    t.set_params(region, [index] + params + written)
    t.set_state({s: (p, t.stamp()) for s, p in zip(loop.written, written)})
    inner = list(loop.leaves)
    for i, proxy in build(t, loop.head, params, region=region, origin="param").items():
        inner[i] = proxy
    return t.fresh(index, origin="param"), inner


def _trace_body(t: Tracer, body_fn, loop: _LoopState, info: RegionInfo) -> Region | None:
    """The body traced with the loop's current layout, or None (and a wider layout in
    `loop`) if an iteration leaves its variables in a layout the head does not have."""
    region = Region()
    saved = t.state_of(loop.written)
    with t.in_region(region, info) as log:
        try:
            index, inner = _bind(t, region, loop)
            variables = list(pytree.unflatten(loop.spec, inner))
            for k in loop.stacked:
                variables[k] = _Rows(loop.variables[k], info, region)
            outs, rows = _take_rows(loop, tuple(body_fn(index, *variables)), info)
            out_leaves, out_spec = pytree.flatten(outs)
            if out_spec != loop.spec:
                _restructure(loop, out_leaves, out_spec, info)
                return None
            end = _side(t, region, out_leaves)
            is_outer = _outside(t, region)
            changed = [i for i in range(len(out_leaves)) if i in loop.head.leaves or
                       (not isinstance(out_leaves[i], Undefined) and not _same_python(loop.leaves[i], out_leaves[i]))]
            _check_carried(loop, out_leaves, changed, info)
            plan, _ = make_plan([_side(t, None, loop.leaves), end], changed, loop.names, is_outer)
            new_written = [s for s in t.outer_writes(log, region) if s not in loop.written]
            # a tensor the body only updates in place is the same tensor after the loop: not carried
            unchanged = loop.head.droppable(i for i in loop.head.leaves if out_leaves[i] is inner[i] and
                                            isinstance(loop.leaves[i], torch.Tensor))
            if not new_written and not unchanged and loop.head.covers(plan):
                region.yields = side_values(t, loop.head, end, resolve(end, list(loop.head.leaves), 1, is_outer))
                region.yields += [t.storage_value(s) for s in loop.written]
                region.yields += [t.value_of(row) for row in rows]
                return region
        finally:   # what the body wrote is undone: the loop's results stand for it afterwards
            t.set_state(t.outer_writes(log, region))
            t.set_state(saved)
    loop.head = loop.head.union(plan).without(unchanged)
    loop.written += new_written
    _check_view_depth(loop, info)
    return None


# Views of views that are the same view are made one (merge.canonical); a chain of a loop
# variable's views longer than this one grows with every iteration, and each retrace of the
# body would be longer than the last.
_MAX_VIEW_STEPS = 16


def _check_view_depth(loop: _LoopState, info: RegionInfo):
    deep = [link.slot for link in loop.head.links.values() if len(link.structure) > _MAX_VIEW_STEPS]
    deep += [("leaf", i) for i, leaf in loop.head.leaves.items() if len(leaf.structure) > _MAX_VIEW_STEPS]
    if deep:
        name = loop.names[deep[0][-1]]
        _cannot_carry(info, f"variable `{name}` is a view of a view of ... of memory from before the loop, "
                            f"one view deeper in every iteration",
                      hint=f"make `{name}` a new tensor in the body (`.clone()`), or view the memory from before "
                           "the loop afresh in each iteration")


def _restructure(loop: _LoopState, out_leaves: list, out_spec, info: RegionInfo):
    """A variable unassigned before the loop takes a structure in the body (a tuple
    `return` inside a loop): it enters the loop as that structure of unassigned leaves."""
    before = pytree.unflatten(loop.spec, loop.leaves)
    after = pytree.unflatten(out_spec, out_leaves)
    for k, (name, b, a) in enumerate(zip(loop.variables, before, after)):
        if loop.rows is not None and _appends_one_row(b, a):   # `outs.append(h)`: the loop's stacked output
            loop.stacked.append(k)
        elif not isinstance(b, Undefined) and pytree.flatten(b)[1] != pytree.flatten(a)[1]:
            _cannot_carry(info, f"variable `{name}` changes its Python structure (list length, tuple size) in the body")
    if loop.stacked:
        after = tuple([] if k in loop.stacked else a for k, a in enumerate(after))
    state = tuple(pytree.tree_map(lambda _, u=b: Undefined(u.name), a) if isinstance(b, Undefined) else b
                  for b, a in zip(before, after))
    names = [n for n, s in zip(loop.variables, state) for _ in range(pytree.flatten(s)[1].num_leaves)]
    loop.leaves, loop.spec = pytree.flatten(state)
    loop.names = names
    loop.head = Plan()


def _appends_one_row(before, after) -> bool:
    return type(before) is list and not before and type(after) is list and len(after) == 1 and \
        isinstance(after[0], torch.Tensor)


def _take_rows(loop: _LoopState, outs: tuple, info: RegionInfo) -> tuple[tuple, list]:
    """The variables a body left, with the lists it appended a row to emptied again, and the rows."""
    if not loop.stacked:
        return outs, []
    rows = []
    for k in loop.stacked:
        if not isinstance(outs[k], _Rows) or outs[k].row is None:
            _cannot_carry(info, f"variable `{loop.variables[k]}` is appended one tensor in some iterations only")
        rows.append(outs[k].row)
    return tuple([] if k in loop.stacked else v for k, v in enumerate(outs)), rows


class _Rows:
    """What the body of a loop over a symbolic size sees of a list it appends one tensor to:
    it may append that tensor, once, in the body itself (not under a branch on a tensor, which
    may not append in every iteration), and nothing else (a read would see the rows of
    earlier iterations, which are not Python values here)."""

    def __init__(self, name: str, info: RegionInfo, body: Region):
        self._name, self._info, self._body, self.row = name, info, body, None

    def append(self, row):
        if self.row is not None or not isinstance(row, torch.Tensor) or context.tracer().region is not self._body:
            self._refuse()
        self.row = row

    def _refuse(self, *_, **__):
        _cannot_carry(self._info, f"the body does more with list `{self._name}` than append one tensor to it")

    __len__ = __bool__ = __iter__ = __getitem__ = __setitem__ = __contains__ = __add__ = __iadd__ = _refuse

    def __getattr__(self, name):   # a list's other methods (dunder lookups are Python's and others' probes)
        if name.startswith("__"):
            raise AttributeError(name)
        self._refuse()


class StackedList:
    """A list a loop over a symbolic size appended one tensor to per iteration: its rows, one
    tensor of that many rows (the loop's stacked output). `torch.stack(lst)`, `torch.cat(lst)`
    of rows of one leading row, `lst[i]` and `len(lst)` in a range() bound read it; anything
    else needs its length as a number (capture specializes that size and unrolls the loop)."""

    def __init__(self, rows: Proxy, size):
        self.rows, self.size = rows, size

    def __getitem__(self, index):
        if isinstance(index, slice):
            raise SymbolicSizeError(self.size, "a slice of a list grown in a loop")
        return self.rows[index]

    def __len__(self):
        raise SymbolicSizeError(self.size, "len() of a list grown in a loop")

    def __iter__(self):
        raise SymbolicSizeError(self.size, "iterating over a list grown in a loop")

    def __getattr__(self, name):   # append, extend, ...: a Python list's methods
        if name.startswith("__"):
            raise AttributeError(name)
        raise SymbolicSizeError(self.size, f"`.{name}` of a list grown in a loop")


def _stacked_call(f, args, kwargs):
    """torch.stack / torch.cat of a StackedList (along dim 0), else None."""
    if f not in (torch.stack, torch.cat) or not args or not isinstance(args[0], StackedList):
        return None
    rows, dim = args[0].rows, kwargs.get("dim", args[1] if len(args) > 1 else 0)
    if set(kwargs) - {"dim"} or len(args) > 2 or dim != 0:
        raise SymbolicSizeError(args[0].size, f"torch.{f.__name__} of a list grown in a loop, other than along dim 0")
    if f is torch.cat:   # rows of one leading row each: the stack of those rows
        if rows.dim() < 2 or rows.shape[1] != 1:
            raise SymbolicSizeError(args[0].size, "torch.cat of a list grown in a loop by rows of several rows")
        rows = rows[:, 0]
    t = context.tracer()
    return t.fresh(t.value_of(rows))   # new memory, as torch.stack gives


def _check_carried(loop: _LoopState, out_leaves: list, changed: list[int], info: RegionInfo):
    for i in changed:
        x, y = loop.leaves[i], out_leaves[i]
        if not isinstance(y, (torch.Tensor, numbers.Number, Undefined)) or \
                not isinstance(x, (torch.Tensor, numbers.Number, Undefined)):
            _cannot_carry(info, f"variable `{loop.names[i]}` holds a Python {type(y).__name__} that changes in the body")


def _cannot_carry(info: RegionInfo, why: str, hint: str = "carry only tensors and numbers across iterations"):
    if info.static_trip:
        raise Restart("unroll", info.loop_key)
    raise UnsupportedError(f"this loop cannot become a compiled loop: {why}", info.loc, hint=hint)


def _trace_cond(t: Tracer, cond_fn, loop: _LoopState, info: RegionInfo) -> Region:
    region = Region()
    saved = t.state_of(loop.written)
    with t.in_region(region, info) as log:
        try:
            _, inner = _bind(t, region, loop)
            test = test_of(cond_fn(*pytree.unflatten(loop.spec, inner)))
            region.yields = [condition_value(t, test) if is_proxy(test) else t.scalar(bool(test), torch.bool)]
            if any(s.origin == "param" for s in log) or t.outer_writes(log, region):
                raise UnsupportedError("a loop condition that writes tensors in place", info.loc,
                                       hint="do the write in the loop body")
        finally:
            t.set_state(t.outer_writes(log, region))
            t.set_state(saved)
    return region


# -- calls -----------------------------------------------------------------------------------

def call(f, *args, **kwargs):
    """A call in converted code: user functions and modules are converted (and recursion
    detected); builtins that would need a tensor's value get tensor versions."""
    if f in _BUILTIN_CASTS and len(args) == 1 and is_proxy(args[0]):
        return _cast_builtin(f, args[0])
    if f in (max, min) and len(args) == 2 and not kwargs and any(is_proxy(a) for a in args):
        return torch.maximum(*_as_tensors(args)) if f is max else torch.minimum(*_as_tensors(args))
    if f is len and len(args) == 1 and not kwargs and is_proxy(args[0]):   # a symbolic length stays one
        return len_(args[0])
    if f is torch.autograd.Variable and args and is_proxy(args[0]):   # legacy: the same memory, detached
        return context.tracer().alias(args[0])
    stacked = _stacked_call(f, args, kwargs)
    if stacked is not None:
        return stacked
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
    if f is float and value.type.dtype.is_floating_point:
        dtype = value.type.dtype   # a Python float keeps a double's precision; beside tensors it counts as
                                   # a number, not a tensor, as a 0-d tensor does
    return t.fresh(value if value.type.dtype == dtype else t.emit1(Op.CAST, [value], dtype=dtype))


def _as_tensors(args):
    like = next(a for a in args if is_proxy(a))
    return [a if isinstance(a, torch.Tensor) else torch.full((), a, dtype=like.dtype) for a in args]
