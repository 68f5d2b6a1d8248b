"""Merging the tensors that several paths leave in the same variables.

The two branches of a tensor-dependent `if`, what enters a loop and what one iteration
leaves for the next, the body of a recursive function and the end of the program each leave
variables whose tensors may differ between paths. In eager PyTorch such a variable is one
of those tensors, memory and all: new, a view of a tensor from before, or a view of another
variable's tensor. `make_plan` works out one layout for every path:

- a *slot* is a merged storage, with a value per path: the storage variable i is the base of
  on that path (slot `("leaf", i)`), memory that variables only view (`("hidden", ...)`), or
  memory beyond the variables' own that two of them view in overlapping parts (`("shared",
  how they view it, type)`; on one path several storages may stand for it, and the slot is
  the one its views lead to there);
- each variable is the base of its slot, or the same view of one target (an outer storage,
  or a slot) on every path;
- a *link* says that a slot is a view of a target on some paths; its flag, a merged bool,
  says on which (see `frontend.alias.Link`).

`side_values(plan, side)` gives a side's values in the plan's order: every slot's value,
every link's flag, the indices of every link's and view's chain (filler where the side has
none). `build(plan, values)` turns merged values back into tensors.
"""
from __future__ import annotations

import math
import numbers
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from cocktailer.errors import UnsupportedError
from cocktailer.frontend.alias import Chain, Storage, ViewStep, chain_dynamic, chain_structure
from cocktailer.frontend.tracer import Proxy, Tracer, Undefined, contiguous_meta, type_of
from cocktailer.ir import BOOL, INDEX, Op, Region, Sym, SymbolicSizeError, TensorType, Value
from cocktailer.ir.ops import SEMANTICS
from cocktailer.ir.infer import attrs_at, hinted_attrs, probe_values, syms_in

Target = tuple   # ("outer", Storage) or ("slot", slot key)


@dataclass
class Side:
    """One path's end: where its values can be computed, and what its variables hold."""
    region: Region
    leaves: list
    state: dict | None = None     # storage contents at the path's end (None: as they are now)


@dataclass
class Slot:
    type: TensorType
    meta: torch.Tensor
    layout_varies: bool = False


@dataclass(frozen=True)
class LinkPlan:
    slot: tuple
    target: Target
    structure: tuple

    @property
    def key(self) -> tuple:
        return (self.slot, target_key(self.target), self.structure)


@dataclass
class LeafPlan:
    kind: str                       # "slot": the base of slot ("leaf", i); "view": of `target`
    type: TensorType
    target: Target | None = None
    structure: tuple = ()

    @property
    def key(self) -> tuple:
        return (self.kind, self.type, None if self.target is None else target_key(self.target), self.structure)


@dataclass
class Plan:
    slots: dict[tuple, Slot] = field(default_factory=dict)
    links: dict[tuple, LinkPlan] = field(default_factory=dict)
    leaves: dict[int, LeafPlan] = field(default_factory=dict)

    def covers(self, other: "Plan") -> bool:
        """Every slot, link and variable layout of `other` is one of this plan's."""
        return (other.slots.keys() <= self.slots.keys() and other.links.keys() <= self.links.keys()
                and all(i in self.leaves and self._holds(i, p) for i, p in other.leaves.items()))

    def _holds(self, i: int, leaf: LeafPlan) -> bool:
        mine = self.leaves[i]
        if mine.key == leaf.key:
            return True
        # a slot linked to the view's target can be that view
        return mine.kind == "slot" and leaf.kind == "view" and \
            LinkPlan(("leaf", i), leaf.target, leaf.structure).key in self.links

    def union(self, other: "Plan") -> "Plan":
        out = Plan(dict(self.slots), dict(self.links), dict(self.leaves))
        for key, slot in other.slots.items():
            if key not in out.slots or out.slots[key].type != slot.type:
                out.slots[key] = slot
        for key, link in other.links.items():
            out.links.setdefault(key, link)
        for i, leaf in other.leaves.items():
            mine = out.leaves.setdefault(i, leaf)
            if mine.key != leaf.key:   # a view on one path, something else on another: a slot of its own
                out.leaves[i] = LeafPlan("slot", leaf.type)
                out.slots.setdefault(("leaf", i), Slot(leaf.type, contiguous_meta(leaf.type), True))
                for p in (mine, leaf):
                    if p.kind == "view":
                        link = LinkPlan(("leaf", i), p.target, p.structure)
                        out.links.setdefault(link.key, link)
        return out

    def droppable(self, leaves) -> set[int]:
        """Which of the variables `leaves` could be left out (nothing links to their slots)."""
        targeted = {link.target[1] for link in self.links.values() if link.target[0] == "slot"}
        return {i for i in leaves if ("leaf", i) not in targeted}

    def without(self, leaves) -> "Plan":
        """This plan with the variables `leaves` not merged (where nothing links to them)."""
        drop = self.droppable(leaves)
        own = lambda key: key[0] == "leaf" and key[1] in drop
        return Plan({k: s for k, s in self.slots.items() if not own(k)},
                    {k: link for k, link in self.links.items() if not own(link.slot)},
                    {i: p for i, p in self.leaves.items() if i not in drop})

    def relabel(self, outer: Callable[[Any], Any]) -> "Plan":
        """The same plan with its outer targets renamed by `outer`."""
        move = lambda target: ("outer", outer(target[1])) if target[0] == "outer" else target
        links = [LinkPlan(link.slot, move(link.target), link.structure) for link in self.links.values()]
        leaves = {i: LeafPlan(p.kind, p.type, None if p.target is None else move(p.target), p.structure)
                  for i, p in self.leaves.items()}
        return Plan(dict(self.slots), {link.key: link for link in links}, leaves)

    def value_types(self) -> list[TensorType]:
        types = [s.type for s in self.slots.values()] + [BOOL] * len(self.links)
        types += [ty for link in self.links.values() for ty in _index_types(link.structure)]
        types += [ty for leaf in self.leaves.values() if leaf.kind == "view" for ty in _index_types(leaf.structure)]
        return types


def target_key(target: Target) -> tuple:
    """Storages compare by identity; other outer labels (a function's parameters) by value."""
    if target[0] == "outer" and isinstance(target[1], Storage):
        return ("outer", id(target[1]))
    return target


def _index_types(structure: tuple) -> list[TensorType]:
    return [INDEX for (_, _, n) in structure for _ in range(n)]


# -- what one side holds ----------------------------------------------------------------------

@dataclass
class Resolved:
    """One side seen through the plan: the slot standing for each local storage it has,
    where each variable points, and the links of its slots."""
    slot_of: dict[Storage, tuple]                          # local storage -> slot key
    leaves: dict[int, tuple[Target, Chain] | None]         # variable -> (target, chain); None: no tensor
    # link key -> (target, [(chain, flags to AND)]): one entry per way the side reaches it
    links: dict[tuple, tuple[Target, list]] = field(default_factory=dict)
    # a slot several storages stand for -> [(storage, flags of the ways to it)], in order
    choices: dict[tuple, list] = field(default_factory=dict)


@dataclass(frozen=True)
class Holds:
    """A flag computed where the side's values are: slot `key` holds its `n`th storage."""
    key: tuple
    n: int


def resolve(side: Side, merged: list[int], side_index: int, is_outer: Callable[[Storage], bool]) -> Resolved:
    slot_of: dict[Storage, tuple] = {}
    proxies = [(i, side.leaves[i]) for i in merged if isinstance(side.leaves[i], Proxy)]
    for i, x in proxies:
        if not x.chain and not is_outer(x.storage):
            slot_of.setdefault(x.storage, ("leaf", i))
    for i, x in proxies:   # memory that variables only view gets a slot of its own
        if not is_outer(x.storage):
            slot_of.setdefault(x.storage, ("hidden", side_index, i))
    shared = _shared_within(slot_of, is_outer)
    slot_of.update(shared)
    point = lambda s: ("outer", s) if is_outer(s) else ("slot", slot_of[s])
    r = Resolved(slot_of, {i: None for i in merged})
    choices = _choices(shared)
    holds = {storage: (Holds(key, n),) for key, storages in choices.items() for n, storage in enumerate(storages)}
    for i, x in proxies:
        r.leaves[i] = (point(x.storage), canonical(x.storage, x.chain))
    ways = [(storage, target, chain, flags) for storage in slot_of
            for target, chain, flags in _link_targets(storage, is_outer, slot_of, (), frozenset({storage}))]
    ways += list(_views_between_slots(slot_of, is_outer))
    ways += list(_through_other_choices(ways, choices, slot_of, is_outer))
    for alias, target, chain, flags in ways:
        if point(target) != ("slot", slot_of[alias]):   # two storages of one slot: nothing to link
            link = LinkPlan(slot_of[alias], point(target), chain_structure(chain))
            _add_way(r, link, chain, flags + holds.get(alias, ()) + holds.get(target, ()))
    r.choices = {key: [(storage, [flags for _, target, _, flags in ways if target is storage]) for storage in storages]
                 for key, storages in choices.items()}   # which storage such a slot holds: one its ways lead to
    return r


def _through_other_choices(ways: list, choices: dict, slot_of: dict, is_outer) -> Iterator:
    """(alias, storage, chain, flags): a way that ends at one storage of a slot several stand
    for, continued through the others that storage may itself be (a loop variable that still
    is the memory the slot held after the last iteration). The slot holds one of them, and a
    way counts under the flag that it holds the one the way ends at: without the continuation
    a variable that is the memory the slot still holds lost its link to it, and where the slot
    holds one storage that is another, the slot lost the other's links (a write through `x`
    no longer reached the argument `x` was: fuzz seed 7273816). From a variable, the way goes
    on to the slot's other storages; from one of the slot's storages, also to what they may be."""
    group = {storage: key for key, storages in choices.items() for storage in storages}
    for alias, target, chain, flags in ways:
        key = group.get(target)
        if key is None:
            continue
        todo, seen = [(target, chain, flags)], {target, alias}
        while todo:
            at, at_chain, at_flags = todo.pop()
            for link in at.links:
                other, way = link.target, (link.chain + at_chain, at_flags + (link.flag,))
                if other in seen:
                    continue
                if group.get(other) == key:
                    seen.add(other)
                    todo.append((other, *way))
                    yield alias, other, canonical(other, way[0]), way[1]
                elif group.get(alias) == key and (is_outer(other) or other in slot_of):
                    yield alias, other, canonical(other, way[0]), way[1]


def _choices(shared: dict) -> dict[tuple, list[Storage]]:
    """The slots several storages stand for, with those storages in order (the memory two
    variables share after this iteration, and the one they shared after the last: which it
    is, a branch decided)."""
    by_key: dict[tuple, list] = {}
    for storage, key in shared.items():
        by_key.setdefault(key, []).append(storage)
    return {key: storages for key, storages in by_key.items() if len(storages) > 1}


def _add_way(r: Resolved, link: LinkPlan, chain: Chain, flags: tuple):
    r.links.setdefault(link.key, (link.target, []))[1].append((chain, flags))


def _reached_within(slot_of: dict, is_outer) -> dict[Storage, list]:
    """Local memory no slot stands for, reached through links from slots' storages:
    storage -> [(slot's storage, chain from it to the slot's, flags to AND)], every way."""
    reached: dict[Storage, list] = {}
    for storage in slot_of:
        for target, chain, flags in _ways(storage, is_outer, slot_of, (), frozenset({storage})):
            if not is_outer(target) and target not in slot_of:
                reached.setdefault(target, []).append((storage, canonical(target, chain), flags))
    return reached


def _views_between_slots(slot_of: dict, is_outer) -> Iterator:
    """(alias, target, chain, flags): two slots' storages that view one local memory no slot
    stands for, one through a chain that starts with the other's, are the one a view of the
    other where both ways hold (`v2 = z` made under a branch: one tensor under two names).
    Without this link the merge sees each only as a view of what lies beyond the memory, and
    a write through one would not reach the other (fuzz seed 7255027)."""
    order = {storage: n for n, storage in enumerate(slot_of)}
    for ways in _reached_within(slot_of, is_outer).values():
        for (x, cx, fx), (y, cy, fy) in ((a, b) for a in ways for b in ways if a[0] is not b[0]):
            if cx[:len(cy)] == cy and (len(cx) > len(cy) or order[x] > order[y]):   # equal: one link, not two
                yield x, y, canonical(y, cx[len(cy):]), fx + fy


def _shared_within(slot_of: dict, is_outer) -> dict[Storage, tuple]:
    """Local memory that two slots' storages view in overlapping ways, neither view within the
    other (`a, b = m[0:2], m[1:3]` of an `m` no variable holds): it gets a slot of its own, so
    that a write through one reaches the other. Its key is how the slots view it, not which
    memory it is: the memory two variables of a loop share after an iteration and the memory
    they shared before it (a branch in the body decides which) are one slot, and the loop's
    layout settles."""
    out = {}
    for storage, ways in _reached_within(slot_of, is_outer).items():
        if any(x is not y and not _nested(cx, cy) and _overlap(storage, cx, cy)
               for x, cx, _ in ways for y, cy, _ in ways):
            views = tuple(sorted({(slot_of[x], chain_structure(c)) for x, c, _ in ways}, key=repr))
            out[storage] = ("shared", views, storage.type)
    return out


def _nested(a: Chain, b: Chain) -> bool:
    return a[:len(b)] == b or b[:len(a)] == a


_MAX_OVERLAP_ELEMENTS = 1 << 20


def _overlap(storage: Storage, a: Chain, b: Chain) -> bool:
    """Whether views `a` and `b` of the storage may share an element (sizes at their captured
    values; a dynamic index or a large storage: they may)."""
    shape = tuple(d.hint if isinstance(d, Sym) else d for d in storage.type.shape)
    numel = math.prod(shape)
    if any(step.dynamic for step in a + b) or numel > _MAX_OVERLAP_ELEMENTS:
        return True
    with torch._C.DisableTorchFunction():
        elements = torch.arange(numel).reshape(shape)
        covered = [_apply(elements, chain) for chain in (a, b)]
        return any(c is None for c in covered) or bool(torch.isin(covered[0], covered[1]).any())


def _apply(x: torch.Tensor, chain: Chain) -> torch.Tensor | None:
    for step in chain:
        attrs = hinted_attrs(step.kwargs)
        try:
            x = SEMANTICS[step.op](x, **attrs)
        except RuntimeError:
            return None
    return x


def _ways(storage: Storage, is_outer, slot_of, flags: tuple, path: frozenset) -> Iterator:
    """(storage reached, chain, flags) for every storage `storage` may be a view of, looking
    through local storages no slot stands for, each way under its own flags (`path`, the
    storages on this way, only keeps a cycle of links from being followed round)."""
    for link in storage.links:
        target, f = link.target, flags + (link.flag,)
        yield target, link.chain, f
        if not is_outer(target) and target not in slot_of and target not in path:
            for t2, chain, f2 in _ways(target, is_outer, slot_of, f, path | {target}):
                yield t2, chain + link.chain, f2


def _link_targets(storage: Storage, is_outer, slot_of, flags: tuple, path: frozenset) -> Iterator:
    """(target, chain, flags) for what `storage` may be a view of: outer storages and slots'
    storages (local storages no slot stands for are gone after the merge: what they lead to
    counts). Every way counts, each under its own flags."""
    for target, chain, f in _ways(storage, is_outer, slot_of, flags, path):
        if is_outer(target) or target in slot_of:
            yield target, canonical(target, chain), f


class ShapeMergeError(UnsupportedError):
    """A variable takes different shapes or dtypes on two paths (or in two iterations)."""


def merged_type(name: str, xs: list) -> TensorType:
    """The tensor type a variable takes when its values differ between paths."""
    tensors = [x for x in xs if isinstance(x, torch.Tensor)]
    if tensors:
        types = {type_of(x) for x in tensors}
        if len(types) > 1 and any(t.syms for t in types):   # the same shape on every path for its captured sizes
            raise SymbolicSizeError(tuple(dict.fromkeys(s for t in types for s in t.syms)), "a merged variable")
        if len(types) > 1:
            raise ShapeMergeError(f"variable `{name}` is {' in one path and '.join(map(str, types))} in the other "
                                   "(a tensor-dependent `if` or loop must give it one shape and dtype)",
                                   hint=f"keep `{name}`'s shape and dtype the same on every path (and in every "
                                        "iteration), e.g. preallocate the largest shape")
        (ty,) = types
        if any(isinstance(x, numbers.Number) for x in xs) and ty.shape != ():
            raise UnsupportedError(f"variable `{name}` is a Python number on one path and a {ty} tensor on another",
                                   hint="make it a tensor of one shape on every path")
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


# -- the plan -----------------------------------------------------------------------------

def make_plan(sides: list[Side], merged: list[int], names: list[str], is_outer, *,
              force_slots=()) -> tuple[Plan, list[Resolved]]:
    """The layout of the variables `merged` (positions in each side's leaves) where the paths
    `sides` meet. `force_slots`: variables that get a slot even where every path holds the
    same view (what a loop carries: after an iteration it may be something else)."""
    resolved = [resolve(side, merged, k, is_outer) for k, side in enumerate(sides)]
    plan = Plan()
    for r in resolved:
        for storage, key in r.slot_of.items():
            plan.slots.setdefault(key, Slot(storage.type, storage.meta, storage.layout_varies))
        for key, members in r.choices.items():   # the storages a slot chooses from: one layout?
            if len({storage.meta.stride() for storage, _ in members}) > 1:
                plan.slots[key] = Slot(plan.slots[key].type, contiguous_meta(plan.slots[key].type), True)
        for key, (target, _) in r.links.items():
            plan.links.setdefault(key, LinkPlan(key[0], target, key[2]))
    for i in merged:
        _plan_leaf(plan, resolved, [side.leaves[i] for side in sides], i, names[i], i in force_slots)
    return plan, resolved


def _plan_leaf(plan: Plan, resolved: list[Resolved], xs: list, i: int, name: str, force_slot: bool):
    ty = merged_type(name, [x for x in xs if not isinstance(x, Undefined)] or xs)
    own = ("slot", ("leaf", i))
    points = [r.leaves[i] for r in resolved]
    if all(p is not None for p in points) and \
            len({target_key(p[0]) for p in points}) == 1 and len({chain_structure(p[1]) for p in points}) == 1:
        target, chain = points[0]
        if not force_slot and not (target == own and not chain):   # the same view on every path
            plan.leaves[i] = LeafPlan("view", ty, target, chain_structure(chain))
            return
    plan.leaves[i] = LeafPlan("slot", ty)
    plan.slots[("leaf", i)] = _merged_layout(ty, xs)
    for p in points:   # where the variable is not the slot's own memory: a link
        link = _leaf_link(i, p)
        if link is not None:
            plan.links.setdefault(link.key, link)


def _merged_layout(ty: TensorType, xs: list) -> Slot:
    """A variable's layout after paths meet: theirs where they agree; where they do not,
    torch's strides depend on the path taken (reshaping it is refused)."""
    proxies = [x for x in xs if isinstance(x, Proxy)]
    if not proxies:
        return Slot(ty, contiguous_meta(ty))
    same = all(x.meta.stride() == proxies[0].meta.stride() for x in proxies)
    varies = not same or any(x.storage.layout_varies for x in proxies)
    return Slot(ty, proxies[0].meta if same else contiguous_meta(ty), varies)


def _leaf_link(i: int, point: tuple[Target, Chain] | None) -> LinkPlan | None:
    """The link saying that variable i's slot is, on some side, what the variable points to."""
    if point is None or (point[0] == ("slot", ("leaf", i)) and not point[1]):
        return None
    return LinkPlan(("leaf", i), point[0], chain_structure(point[1]))


# -- values along a side, and tensors from merged values ------------------------------------

@contextmanager
def on_side(t: Tracer, side: Side):
    """Emit into the side's region, with storages as they were at its end."""
    with t.reopen(side.region) if side.region is not t.region else nullcontext():
        with t.storage_state(side.state) if side.state is not None else nullcontext():
            yield


def side_values(t: Tracer, plan: Plan, side: Side, r: Resolved) -> list[Value]:
    """The plan's values on this side, in the plan's order (see the module docstring)."""
    with on_side(t, side):
        by_slot = {key: storage for storage, key in r.slot_of.items()}
        conjunctions: dict = {}   # ways share their first flags (paths through the same links)
        holds, chosen = _chosen(t, r, conjunctions)
        values = [chosen[key] if key in chosen else _slot_value(t, side, by_slot.get(key), key, slot)
                  for key, slot in plan.slots.items()]
        found = [r.links.get(key) or _found_leaf_link(r, link) for key, link in plan.links.items()]
        found = [None if f is None else (f[0], [(chain, tuple(holds.get(x, x) for x in flags)) for chain, flags in f[1]])
                 for f in found]
        values += [_any(t, [_all(t, flags, conjunctions) for _, flags in f[1]]) if f is not None else t.false()
                   for f in found]
        for link, f in zip(plan.links.values(), found):
            values += _indices(t, link.structure, f[1] if f is not None else None, conjunctions)
        for i, leaf in plan.leaves.items():
            if leaf.kind == "view":
                point = r.leaves.get(i)
                values += _indices(t, leaf.structure, tuple(point[1]) if point is not None else None, conjunctions)
    return values


def _chosen(t: Tracer, r: Resolved, conjunctions: dict) -> tuple[dict, dict]:
    """For each slot several storages stand for: the flag that it holds each (the first
    whose ways hold), and its value on this side."""
    holds, chosen = {}, {}
    for key, members in r.choices.items():
        taken = None   # some earlier storage is the one
        for n, (storage, ways) in enumerate(members):
            mine = _any(t, [_all(t, flags, conjunctions) for flags in ways]) if ways else t.false()
            holds[Holds(key, n)] = mine if taken is None else t.emit1(Op.AND, [mine, t.emit1(Op.NOT, [taken])])
            taken = mine if taken is None else t.emit1(Op.OR, [taken, mine])
        value = t.storage_value(members[-1][0])
        for n in range(len(members) - 2, -1, -1):
            value = t.emit1(Op.WHERE, [holds[Holds(key, n)], t.storage_value(members[n][0]), value])
        chosen[key] = value
    return holds, chosen


def _found_leaf_link(r: Resolved, link: LinkPlan) -> tuple | None:
    """A variable's own link on this side: (target, [(chain, no flags)]) if it points there."""
    if link.slot[0] != "leaf" or link.slot[1] not in r.leaves:
        return None
    point = r.leaves[link.slot[1]]
    if point is None:
        return None
    mine = _leaf_link(link.slot[1], point)
    if mine is not None and mine.key == link.key:
        return point[0], [(point[1], ())]
    if point[0][0] == "outer" and isinstance(point[0][1], Storage):
        # the variable is memory from outside that may itself be a view of the link's target
        # (a loop variable that entered the loop as another variable): its links say when
        ways = [(canonical(target, chain + point[1]), flags) for target, chain, flags in
                _link_targets(point[0][1], lambda s: True, {}, (), frozenset({point[0][1]}))
                if target_key(("outer", target)) == target_key(link.target)]
        hits = [(chain, flags) for chain, flags in ways if chain_structure(chain) == link.structure]
        return (link.target, hits) if hits else None
    return None


def _slot_value(t: Tracer, side: Side, storage: Storage | None, key: tuple, slot: Slot) -> Value:
    if storage is not None:
        return t.storage_value(storage)
    x = side.leaves[key[1]] if key[0] == "leaf" and key[1] < len(side.leaves) else None
    if isinstance(x, torch.Tensor):
        return t.value_of(x)
    if isinstance(x, numbers.Number):
        if slot.type.shape == ():
            return t.scalar(x if slot.type.dtype != torch.bool else bool(x), slot.type.dtype)
        return t.emit1(Op.FULL, [], shape=slot.type.shape, value=x, dtype=slot.type.dtype)
    return t.zeros(slot.type)   # this path has nothing there: any value will do


def _all(t: Tracer, flags: tuple, conjunctions: dict) -> Value:
    """flags[0] AND flags[1] AND ...; `conjunctions` (the ids of a prefix of flags -> its
    value, for values emitted in the same region) reuses the ANDs of a prefix seen before."""
    if not flags:
        return t.true()
    value, key = flags[0], (id(flags[0]),)
    for f in flags[1:]:
        key += (id(f),)
        if key not in conjunctions:
            conjunctions[key] = t.emit1(Op.AND, [value, f])
        value = conjunctions[key]
    return value


def _any(t: Tracer, flags: list[Value]) -> Value:
    value = flags[0]
    for f in flags[1:]:
        value = t.emit1(Op.OR, [value, f])
    return value


def _indices(t: Tracer, structure: tuple, ways, conjunctions: dict) -> list[Value]:
    """The chain's dynamic indices on this side: those of a point's chain, or of the way the
    side reaches a target whose flags hold (one index per position, chosen at run time)."""
    if ways is None:
        return [t.zeros(ty) for ty in _index_types(structure)]
    if isinstance(ways, tuple):   # a variable's chain
        return list(chain_dynamic(ways))
    values = list(chain_dynamic(ways[-1][0]))
    for chain, flags in reversed(ways[:-1]):
        mine = chain_dynamic(chain)
        if any(a is not b for a, b in zip(mine, values)):
            holds = _all(t, flags, conjunctions)
            values = [v if a is v else t.emit1(Op.WHERE, [holds, a, v]) for a, v in zip(mine, values)]
    return values


def build(t: Tracer, plan: Plan, values: list[Value], *, region: Region | None = None,
          outer: Callable[[Storage], Any] = lambda s: (s, ()), origin: str = "local") -> dict[int, Proxy]:
    """Tensors from the plan's merged values: a storage per slot (linked as planned) and a
    proxy per variable. `outer` maps the plan's outer storages to (storage, chain) to use."""
    it = iter(values)
    storages = {}
    for key, slot in plan.slots.items():
        storage = t.new_storage(next(it), origin, slot.meta, region)
        storage.layout_varies = slot.layout_varies
        storages[key] = storage
    flags = [next(it) for _ in plan.links]

    def target(tgt: Target) -> tuple[Storage, Chain]:
        return (storages[tgt[1]], ()) if tgt[0] == "slot" else outer(tgt[1])

    for link, flag in zip(plan.links.values(), flags):
        storage, prefix = target(link.target)
        t.link(storages[link.slot], storage, prefix + _chain(link.structure, it), flag)
    out = {}
    for i, leaf in plan.leaves.items():
        if leaf.kind == "slot":
            out[i] = t.on(storages[("leaf", i)])
        else:
            storage, prefix = target(leaf.target)
            chain = prefix + _chain(leaf.structure, it)
            out[i] = t.on(storage, chain, chain_meta(storage.meta, chain))
    return out


def _chain(structure: tuple, values: Iterator[Value]) -> Chain:
    return tuple(ViewStep(op, attrs, tuple(next(values) for _ in range(n))) for (op, attrs, n) in structure)


_META_INDEX = torch.zeros((), dtype=torch.int64, device="meta")


def canonical(storage: Storage, chain: Chain) -> Chain:
    """`chain` without the stretches that come back to a layout it had before (`x.t().t()`,
    `x.unsqueeze(0).squeeze(0)`, `x[0:n]` of n rows): the same view of the same memory. A
    variable viewed again in every iteration of a loop (`x = x.t()`) so keeps a chain of
    bounded length, and the loop's layout settles. Layouts are taken over the storage's value
    as if contiguous (a chain says which of its elements a view holds, whatever its strides),
    symbolic sizes at their captured values and at probe values alike; a stretch with a
    dynamic index stays (an index moves the offset by what it is at run time)."""
    if not chain:
        return chain
    syms = storage.type.syms
    probes = probe_values(syms, [storage.type])
    with torch._C.DisableTorchFunction():
        frames = [(values, torch.empty(tuple(values.get(d, d.hint if isinstance(d, Sym) else d)
                                             for d in storage.type.shape), device="meta"))
                  for values in ([{}, probes] if syms else [{}])]
        kept, seen = [], {_layouts(m for _, m in frames): 0}   # layouts -> how many kept steps lead to them
        for step in chain:
            frames = [(values, _view_meta(step, meta, values)) for values, meta in frames]
            if any(meta is None for _, meta in frames):
                return chain
            layout = _layouts(m for _, m in frames)
            if step.dynamic:
                kept.append(step)
                seen = {layout: len(kept)}
            elif layout in seen:
                del kept[seen[layout]:]
                seen = {lay: n for lay, n in seen.items() if n <= len(kept)}
            else:
                kept.append(step)
                seen[layout] = len(kept)
    return tuple(kept)


def _view_meta(step: ViewStep, meta: torch.Tensor, values: dict) -> torch.Tensor | None:
    """The step applied to a layout, sizes at `values`; None where it is not a view there."""
    attrs = attrs_at(step.kwargs, values)
    if syms_in(tuple(attrs.values())):   # a size other than a shape's
        return None
    out = SEMANTICS[step.op](meta, *(_META_INDEX for _ in step.dynamic), **attrs)
    return out if out._is_view() else None


def _layouts(metas) -> tuple:
    return tuple((tuple(m.shape), m.stride(), m.storage_offset()) for m in metas)


def chain_meta(meta: torch.Tensor, chain: Chain) -> torch.Tensor:
    """The layout a view chain gives (dynamic indices taken as 0: they move the offset only)."""
    with torch._C.DisableTorchFunction():
        for step in chain:
            meta = SEMANTICS[step.op](meta, *(_META_INDEX for _ in step.dynamic), **hinted_attrs(step.kwargs))
    return meta
