"""Recursive functions: an IR function each, and a CALL op per call.

A call's results are described by the function's `Summary`: the result's structure, how
its tensors alias the function's parameters (a merge plan whose outer storages are
`("param", j)` and `("const", name)`), and which parameters the function writes in place
(their new values come back as extra results, written into the caller's arguments).
Recursive calls inside the body need the summary before the body is traced: it starts from
what the function returned when run eagerly, and when tracing shows more (a result that
views an argument, a written parameter), capture restarts with the wider summary.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cocktailer import pytree
from cocktailer.errors import UnsupportedError
from cocktailer.frontend.merge import LeafPlan, Plan, Side, Slot, build, make_plan, resolve, side_values
from cocktailer.frontend.tracer import Proxy, RegionInfo, Restart, Tracer, contiguous_meta, type_of
from cocktailer.ir import Function, Op, Region, SourceLoc, SymbolicSizeError, TensorType


@dataclass
class Summary:
    spec: Any
    plan: Plan
    params: tuple            # the parameters' types
    written: tuple = ()      # parameters the function writes in place

    @staticmethod
    def from_eager(spec, types: tuple, params: tuple) -> "Summary":
        plan = Plan({("leaf", i): Slot(ty, contiguous_meta(ty)) for i, ty in enumerate(types)}, {},
                    {i: LeafPlan("slot", ty) for i, ty in enumerate(types)})
        return Summary(spec, plan, params)

    def covers(self, other: "Summary") -> bool:
        return self.plan.covers(other.plan) and set(other.written) <= set(self.written)

    def union(self, other: "Summary") -> "Summary":
        return Summary(self.spec, self.plan.union(other.plan), self.params,
                       tuple(sorted(set(self.written) | set(other.written))))

    def result_types(self) -> list[TensorType]:
        return self.plan.value_types() + [self.params[j] for j in self.written]

    def leaf_types(self) -> list[TensorType]:
        return [leaf.type for leaf in self.plan.leaves.values()]


def emit_call(t: Tracer, name: str, summary: Summary, args: list[Proxy], fn) -> list[Proxy]:
    """The CALL op and the tensors it gives back, aliasing the arguments as summarized."""
    _check_arguments(summary, args, fn)
    values = t.emit(Op.CALL, [t.value_of(a) for a in args], {"callee": name}, result_types=summary.result_types())
    n = len(summary.plan.value_types())

    def outer(label):
        if label[0] == "param":
            return args[label[1]].storage, args[label[1]].chain
        return t.const_storage(t.constants[label[1]]), ()
    results = build(t, summary.plan, values[:n], outer=outer)
    for j, value in zip(summary.written, values[n:]):
        t.write(args[j], value)   # what the function wrote into its parameter, into the caller's tensor
    return [results[i] for i in range(len(results))]


def _check_arguments(summary: Summary, args: list[Proxy], fn):
    """A function that writes a parameter sees its parameters as separate memory."""
    for j in summary.written:
        others = {a.storage for k, a in enumerate(args) if k != j}
        linked = {link.target for link in args[j].storage.links} | \
            {link.alias for link in args[j].storage.dependents}
        if args[j].storage in others or linked & others:
            raise UnsupportedError(f"recursive function `{fn.__qualname__}` writes into its argument {j}, which "
                                   "shares memory with another of its arguments in this call",
                                   hint="pass a clone of one of them")


def build_function(t: Tracer, key: tuple, name: str, summary: Summary, converted, leaves: list, spec, positions: list[int],
                   loc: SourceLoc, qualname: str) -> Function:
    """Trace the function's body; restart capture if it gives back more than `summary` says."""
    params = [t.new_param(type_of(leaves[i])) for i in positions]
    region = Region(params=params)
    with t.in_region(region, RegionInfo("function", loc), new_function=True) as log:
        inner = list(leaves)
        storages = []
        for i, p in zip(positions, params):
            inner[i] = t.fresh(p, origin="param")
            storages.append(inner[i].storage)
        a, k = pytree.unflatten(spec, inner)
        out, out_spec = pytree.flatten(converted(*a, **k))
        if not all(isinstance(x, torch.Tensor) for x in out):
            raise UnsupportedError(f"recursive function `{qualname}` returns Python values",
                                   loc, hint="return tensors (or a tuple of tensors) only")
        side = Side(region, [t.as_proxy(x) for x in out])
        index = {s: j for j, s in enumerate(storages)}
        is_outer = lambda s: s.origin == "const" or s in index
        merged = list(range(len(out)))
        plan, _ = make_plan([side], merged, [f"result {i}" for i in merged], is_outer)
        label = lambda s: ("param", index[s]) if s in index else ("const", t.const_name(s))
        actual = Summary(out_spec, plan.relabel(label), summary.params,
                         tuple(j for j, s in enumerate(storages) if s in log))
        returned = tuple(dict.fromkeys(s for x in out for s in type_of(x).syms))
        if returned:   # the summary's types are the eager run's: with the sizes as numbers
            raise SymbolicSizeError(returned, "a recursive function's result")
        if out_spec != summary.spec or [type_of(x) for x in out] != summary.leaf_types():
            raise UnsupportedError(f"recursive function `{qualname}` returns {[str(type_of(x)) for x in out]} "
                                   f"but returned {list(map(str, summary.leaf_types()))} when run on the example "
                                   "inputs", loc)
        if not summary.covers(actual):
            t.hints["summaries"][key] = summary.union(actual)
            raise Restart("summary", key)
        unlabel = lambda label: storages[label[1]] if label[0] == "param" else t.const_storage(t.constants[label[1]])
        mine = summary.plan.relabel(unlabel)
        region.yields = side_values(t, mine, side, resolve(side, list(mine.leaves), 0, is_outer))
        region.yields += [t.storage_value(storages[j]) for j in summary.written]
    return Function(name, region, loc)
