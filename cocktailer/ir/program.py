"""The IR's containers: values, operations, regions, functions and the program.

Structured control flow: an IF or LOOP operation owns regions; a region is a list of
operations with parameters (block arguments) and the values it yields. A region may
read any value of an enclosing region of the same function (no explicit capture lists).
A function's body does not see its caller's values: it receives them as parameters.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from cocktailer.ir.ops import Op
from cocktailer.ir.types import TensorType

_ids = itertools.count()


@dataclass(frozen=True)
class SourceLoc:
    """Where in the user's program an operation came from."""
    filename: str
    lineno: int
    function: str = ""

    def __str__(self) -> str:
        return f"{self.filename.rsplit('/', 1)[-1]}:{self.lineno}"


class Value:
    """An SSA value: defined once, by an operation result or as a region parameter."""
    __slots__ = ("type", "id", "hint")

    def __init__(self, type: TensorType, hint: str = ""):
        self.type = type
        self.id = next(_ids)
        self.hint = hint

    def __repr__(self) -> str:
        return f"Value(%{self.id}: {self.type})"


@dataclass(eq=False)
class Region:
    params: list[Value] = field(default_factory=list)
    ops: list["Operation"] = field(default_factory=list)
    yields: list[Value] = field(default_factory=list)

    def walk(self) -> Iterator["Operation"]:
        """All operations of this region and of the regions nested in it, in order."""
        for op in self.ops:
            yield op
            for r in op.regions:
                yield from r.walk()

    def regions(self) -> Iterator["Region"]:
        """This region and every region nested in it."""
        yield self
        for op in self.ops:
            for r in op.regions:
                yield from r.regions()

    def replace_uses(self, rename: dict[int, "Value"]):
        """Reads of the values `rename` names (by id) read their replacements instead, here and
        in every nested region."""
        replace_uses(self.ops, rename)
        self.yields = [rename.get(v.id, v) for v in self.yields]

    def outside_reads(self) -> list[Value]:
        """Values this region (at any depth: operands and yields) reads but does not define."""
        defined, reads = set(), []
        for region in self.regions():
            defined.update(p.id for p in region.params)
            for op in region.ops:
                defined.update(r.id for r in op.results)
        for region in self.regions():
            reads += [v for op in region.ops for v in op.operands if v.id not in defined]
            reads += [v for v in region.yields if v.id not in defined]
        return list({v.id: v for v in reads}.values())


@dataclass(eq=False)
class Operation:
    op: Op
    operands: list[Value]
    results: list[Value]
    attrs: dict[str, Any] = field(default_factory=dict)
    regions: list[Region] = field(default_factory=list)
    loc: SourceLoc | None = None

    def reads(self) -> list[Value]:
        """The values this operation reads: its operands and what its regions read from outside."""
        return list(self.operands) + [v for region in self.regions for v in region.outside_reads()]

    # LOOP layout: attrs["has_trip"] says whether operands[0] is the trip count;
    # regions[0] is the body, regions[1] (optional, attrs["has_cond"]) the condition.
    @property
    def loop_trip(self) -> Value | None:
        return self.operands[0] if self.attrs.get("has_trip") else None

    @property
    def loop_inits(self) -> list[Value]:
        return self.operands[1:] if self.attrs.get("has_trip") else self.operands

    @property
    def loop_body(self) -> Region:
        return self.regions[0]

    @property
    def loop_cond(self) -> Region | None:
        return self.regions[1] if self.attrs.get("has_cond") else None

    @property
    def loop_stacked(self) -> int:
        """How many of the body's yields (the last ones) are stacked over the iterations
        into results of their own, rather than carried to the next iteration."""
        return self.attrs.get("stacked", 0)

    @property
    def loop_carried_yields(self) -> list[Value]:
        yields = self.loop_body.yields
        return yields[:len(yields) - self.loop_stacked]


def replace_uses(ops: list[Operation], rename: dict[int, Value]):
    """Reads of renamed values in these ops, and in the regions nested in them, read their
    replacements instead."""
    for op in ops:
        op.operands = [rename.get(v.id, v) for v in op.operands]
        for region in op.regions:
            region.replace_uses(rename)


def clone_ops(ops: list[Operation], rename: dict[int, Value]) -> list[Operation]:
    """Copies of `ops` with fresh values for everything they define (results, and parameters
    of their regions, at any depth); reads go through `rename` (value id -> value), which
    gains the new values, so a caller can find the copies of values it knows."""
    out = []
    for op in ops:
        regions = [_clone_region(r, rename) for r in op.regions]
        results = [Value(r.type, r.hint) for r in op.results]
        rename.update({r.id: n for r, n in zip(op.results, results)})
        out.append(Operation(op.op, [rename.get(v.id, v) for v in op.operands], results, dict(op.attrs), regions,
                             op.loc))
    return out


def _clone_region(region: Region, rename: dict[int, Value]) -> Region:
    params = [Value(p.type, p.hint) for p in region.params]
    rename.update({p.id: n for p, n in zip(region.params, params)})
    ops = clone_ops(region.ops, rename)
    return Region(params, ops, [rename.get(v.id, v) for v in region.yields])


@dataclass(eq=False)
class Function:
    name: str
    body: Region
    loc: SourceLoc | None = None

    @property
    def params(self) -> list[Value]:
        return self.body.params

    @property
    def result_types(self) -> list[TensorType]:
        return [v.type for v in self.body.yields]


@dataclass(eq=False)
class Program:
    """A captured program: functions (the entry is `entry`), the constant tensors they
    read, the device the tensors live on, and how to map Python arguments and results
    to and from the entry function's flat tensor parameters and results."""
    functions: dict[str, Function]
    entry: str
    constants: dict[str, torch.Tensor]
    device: torch.device
    input_spec: Any = None    # pytree spec of the arguments (their tensors are the entry's parameters)
    output_spec: Any = None   # (pytree spec, [(is_tensor, python value)]) of the result; tensors are the yields
    derived: dict[str, tuple] = field(default_factory=dict)   # folded constant -> (op, attrs, source names)
    derived_versions: dict[str, tuple] = field(default_factory=dict)   # sources' versions when computed
    boundary: Any = None      # ir.boundary.Boundary: the yields -> results, and writes into inputs and constants
    # attributes the program assigns on objects that outlive the call (frontend.attributes.Target):
    # the result is then (the function's result, their values), and the caller assigns them
    attribute_writes: tuple = ()
    # the symbolic sizes of the entry's parameters: (Sym, parameter index, dim) where a call reads each
    sizes: tuple = ()

    @property
    def main(self) -> Function:
        return self.functions[self.entry]

    def clone(self) -> "Program":
        """A copy whose functions, regions and operations a backend's passes may rewrite
        (values keep their ids); the constants, their recipes and the boundary are shared
        (refreshing folded weights reaches both). Built field by field: a deepcopy of a
        traced graph's tens of thousands of ops took a tenth of a repeat compile."""
        values: dict[int, Value] = {}

        def value(v: Value) -> Value:
            c = values.get(id(v))
            if c is None:
                c = values[id(v)] = object.__new__(Value)
                c.type, c.id, c.hint = v.type, v.id, v.hint
            return c

        def region(r: Region) -> Region:
            return Region([value(p) for p in r.params], [operation(o) for o in r.ops], [value(y) for y in r.yields])

        def operation(o: Operation) -> Operation:
            return Operation(o.op, [value(v) for v in o.operands], [value(v) for v in o.results], copy.deepcopy(o.attrs),
                             [region(r) for r in o.regions], o.loc)

        functions = {name: Function(f.name, region(f.body), f.loc) for name, f in self.functions.items()}
        return dataclasses.replace(self, functions=functions)

    def walk(self) -> Iterator[Operation]:
        for fn in self.functions.values():
            yield from fn.body.walk()

    def __str__(self) -> str:
        from cocktailer.ir.printer import format_program
        return format_program(self)
