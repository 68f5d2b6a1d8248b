"""Which recursive functions run level by level, and what their inspector must run.

Cortex and ACROBAT batch a recursion over trees by its *depth*: every call whose subtree has
height h runs at step h, all instances' calls of that height as one batch, the children's
results read from a table. That needs the whole call tree before the first step: ACROBAT's
ahead-of-time inspector. The inspector runs only the *control slice* of the function's body:
the ops that decide which self-calls happen (the conditions of the branches around them) and
compute their arguments. When that slice reads a self-call's result (the next node depends on
the previous one's output: DRNN, a parser whose action comes from an argmax), the call tree is
known only while running; such functions run depth-first instead, each call batched over the
lanes that make it.
"""
from __future__ import annotations

from dataclasses import dataclass

from cocktailer.ir import Function, Op, Operation, Program, Region, Value


@dataclass(frozen=True)
class LevelPlan:
    """How one recursive function runs level by level."""
    function: Function
    sites: tuple[Operation, ...]     # its self-calls, in program order
    passthrough: tuple[bool, ...]    # per parameter: every self-call hands it on unchanged (the tree's tables)
    control: frozenset[int]          # id() of the ops the inspector runs (the sites, where it notes the calls)
    if_results: dict                 # id() of each branch of `control` -> the indices of the results it needs


def plan_levels(program: Program, name: str) -> LevelPlan | str:
    """The level plan of function `name`, or why it runs depth-first."""
    fn = program.functions[name]
    calls = [op for op in fn.body.walk() if op.op is Op.CALL]
    sites = tuple(op for op in calls if op.attrs["callee"] == name)
    if not sites:
        return "it does not call itself"
    if any(name in _reachable(program, op.attrs["callee"]) for op in calls if op.attrs["callee"] != name):
        return "it is mutually recursive with another function"
    slicer = _ControlSlice(fn, sites)
    reason = slicer.run()
    if reason:
        return reason
    passthrough = tuple(all(site.operands[j] is p for site in sites) for j, p in enumerate(fn.params))
    return LevelPlan(fn, sites, passthrough, frozenset(slicer.ops | {id(s) for s in sites}),
                     {k: frozenset(v) for k, v in slicer.results.items()})


def recursive(program: Program, name: str) -> bool:
    return name in _reachable(program, name)


def _reachable(program: Program, name: str) -> set[str]:
    """The functions a call of `name` may call, at any depth."""
    seen, work = set(), [name]
    while work:
        for op in program.functions[work.pop()].body.walk():
            callee = op.attrs.get("callee") if op.op is Op.CALL else None
            if callee is not None and callee not in seen:
                seen.add(callee)
                work.append(callee)
    return seen


class _ControlSlice:
    """The ops of a function body that decide its self-calls and their arguments."""

    def __init__(self, fn: Function, sites: tuple[Operation, ...]):
        self.fn, self.sites = fn, sites
        self.defs: dict[int, Operation] = {}        # value id -> the op defining it (a loop for its region params)
        self.parent: dict[int, Operation | None] = {}   # id(op) -> the IF or LOOP whose region holds it
        self._index(fn.body, None)
        self.ops: set[int] = set()
        self.results: dict[int, set[int]] = {}   # id(IF op) -> the result indices the slice needs
        self.work: list[Value] = []

    def _index(self, region: Region, enclosing: Operation | None):
        for op in region.ops:
            self.parent[id(op)] = enclosing
            for r in op.results:
                self.defs[r.id] = op
            for inner in op.regions:
                for p in inner.params:
                    self.defs[p.id] = op
                self._index(inner, op)

    def run(self) -> str | None:
        site_ids = {id(s) for s in self.sites}
        for site in self.sites:
            if self._inside_loop(site):
                return "it calls itself inside a loop"
            self.work += [v for v, p in zip(site.operands, self.fn.params) if v is not p]
            self._enclosing(site)
        while self.work:
            v = self.work.pop()
            op = self.defs.get(v.id)
            if op is None:   # a parameter of the function
                continue
            if id(op) in site_ids:
                return "which calls it makes depends on the result of a call it made (found while it runs)"
            if op.op is Op.IF and v in op.results:
                self._need_if_result(op, op.results.index(v))
            else:
                self._need(op)
        return None

    def _inside_loop(self, op: Operation) -> bool:
        enclosing = self.parent[id(op)]
        while enclosing is not None:
            if enclosing.op is Op.LOOP:
                return True
            enclosing = self.parent[id(enclosing)]
        return False

    def _enclosing(self, op: Operation):
        """The branches (and loops) around `op` run too, so that the inspector reaches it."""
        enclosing = self.parent[id(op)]
        while enclosing is not None:
            if enclosing.op is Op.LOOP:
                self._need(enclosing)
            elif id(enclosing) not in self.ops:
                self.ops.add(id(enclosing))
                self.results.setdefault(id(enclosing), set())
                self.work.append(enclosing.operands[0])
            enclosing = self.parent[id(enclosing)]

    def _need_if_result(self, op: Operation, k: int):
        needed = self.results.setdefault(id(op), set())
        if k in needed:
            return
        needed.add(k)
        self.ops.add(id(op))
        self.work += [op.operands[0]] + [arm.yields[k] for arm in op.regions]
        self._enclosing(op)

    def _need(self, op: Operation):
        """A data op, a call of another function or a loop: it runs whole."""
        if id(op) in self.ops:
            return
        self.ops.add(id(op))   # (the inspector runs a loop's regions whole)
        self.work += op.reads()
        self._enclosing(op)
