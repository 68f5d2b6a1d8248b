"""Trees of Python node objects as index tables: Cortex's data-structure linearizer (§4.2).

A model that recurses over its own node objects (`node.left`, `node.children`, `node.x`,
`node.state = h`) would otherwise be compiled once per tree: capture reads the objects as
Python values. Instead, at call time, `linearize` walks the tree from the argument and puts
it in tables, one row per node:

- a field holding a node or None (`left`): the node's row, -1 for None (i64[N]);
- a list of nodes (`children`): their rows, padded with -1 to N-1 (i64[N, N-1]), and their count;
- tensors of one shape and dtype on every node (`x`): stacked (T[N, ...]);
- Python numbers (`word`, `is_leaf`): a tensor of them;
- fields the program assigns (`state`): a table of the value's shape (the field's own table
  where the nodes already hold tensors of that type) and a bool[N] saying which rows were
  assigned. Reading the field is a view of its row, so an in-place write through what was
  read (`a = child.state; a += 1`) reaches the node, as in eager.

The program sees a `NodeRef` (the tables and a row index, a 0-d tensor) in place of each
node, so capture turns `node.left` into a select from a table and the recursion into
calls on tensor indices: one compiled program serves every tree with the same node count
and fields. After the call, assigned fields are set on the real nodes (`node.state` holds a
real tensor, as in eager) and in-place writes into node tensors are copied back.

What the tables cannot hold (a string field, fields of mixed kinds) raises `NotLinearizable`
when the program reads it; the caller then compiles for the objects as they are.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field as dataclass_field
from typing import Any

import torch

from cocktailer.errors import UnsupportedError
from cocktailer.frontend.tracer import type_of
from cocktailer.ir import SymbolicSizeError, TensorType

ASSIGNED, ASSIGNED_MASK, COUNT = "{}=", "{}=set", "{}#count"


class NotLinearizable(UnsupportedError):
    """The program reads a field of a node object that index tables cannot hold."""


class NeedsAssignedTable(BaseException):
    """The program assigns a field the tables do not have yet: link again with one for it.
    (A BaseException, like capture's restarts: user code's `except Exception` must not eat it.)"""

    def __init__(self, cls: type, name: str, type_: TensorType):
        super().__init__(f"node field `{name}` assigned a {type_}")
        self.cls, self.name, self.type = cls, name, type_


@dataclass(frozen=True)
class Field:
    name: str
    kind: str                          # "link", "links", "tensor", "number", "none", "opaque"
    type: TensorType | None = None     # a table row's type (tensor and number fields)


@dataclass(frozen=True, eq=False)
class Schema:
    """What the tables of one tree hold: the node class, the node count and the fields.
    Made by `schema_of()` only, one object per content, so that it compares (as part of every
    call's cache key) by identity."""
    cls: type
    nodes: int
    fields: tuple[Field, ...]
    assigned: tuple[tuple[str, TensorType], ...] = ()
    _names: list = dataclass_field(default=None, repr=False)   # table_names(), computed once

    def table_names(self) -> list[str]:
        return self._names

    def field(self, name: str) -> Field | None:
        return next((f for f in self.fields if f.name == name), None)

    def assigned_type(self, name: str) -> TensorType | None:
        return dict(self.assigned).get(name)

    def _table_names(self) -> list[str]:
        names = []
        for f in self.fields:
            if f.kind in ("link", "tensor", "number"):
                names.append(f.name)
            elif f.kind == "links":
                names += [f.name, COUNT.format(f.name)]
        for name, _ in self.assigned:
            names += [ASSIGNED_MASK.format(name)] if self.values_table(name) == name else \
                [ASSIGNED.format(name), ASSIGNED_MASK.format(name)]
        return names

    def values_table(self, name: str) -> str:
        """The table an assigned field's values are in: its own where the nodes hold tensors
        of the assigned type already (their rows are the starting values), else a new one."""
        f = self.field(name)
        return name if f is not None and f.kind == "tensor" and f.type == self.assigned_type(name) \
            else ASSIGNED.format(name)


_SCHEMAS: dict[tuple, Schema] = {}


def schema_of(cls: type, nodes: int, fields: tuple, assigned: tuple) -> Schema:
    key = (cls, nodes, fields, assigned)
    found = _SCHEMAS.get(key)
    if found is None:
        found = _SCHEMAS[key] = Schema(cls, nodes, fields, assigned)
        object.__setattr__(found, "_names", found._table_names())
    return found


class NodeRef:
    """One node of a linearized tree, as the program sees it (eagerly and during capture)."""
    __slots__ = ("_schema", "_tables", "_index")

    def __init__(self, schema: Schema, tables: dict[str, torch.Tensor], index):
        object.__setattr__(self, "_schema", schema)
        object.__setattr__(self, "_tables", tables)
        object.__setattr__(self, "_index", index)

    # -- a pytree node: the row index and the tables are the leaves ------------------------------
    def _pytree_flatten(self) -> tuple[list, Schema]:
        return [self._index] + [self._tables[n] for n in self._schema.table_names()], self._schema

    @staticmethod
    def _pytree_unflatten(schema: Schema, leaves: list) -> "NodeRef":
        return NodeRef(schema, dict(zip(schema.table_names(), leaves[1:])), leaves[0])

    # -- fields -------------------------------------------------------------------------------
    def __getattr__(self, name: str):
        schema, tables, index = self._schema, self._tables, self._index
        assigned = schema.assigned_type(name)
        f = schema.field(name)
        if assigned is not None:
            if f is not None and schema.values_table(name) != name:
                raise NotLinearizable(f"the program assigns `{name}` of a `{schema.cls.__name__}` node a {assigned}, "
                                      "where the nodes hold something else there")
            return tables[schema.values_table(name)][index]
        if f is None:
            member = getattr(schema.cls, name, _MISSING)   # a method, a property, a class attribute
            if member is _MISSING:
                raise AttributeError(f"'{schema.cls.__name__}' object has no attribute '{name}'")
            return member.__get__(self, schema.cls) if hasattr(member, "__get__") else member
        if f.kind == "none":
            return None
        if f.kind == "link":
            return NodeRef(schema, tables, tables[name][index])
        if f.kind == "links":
            return NodeList(self, name)
        if f.kind in ("tensor", "number"):
            return tables[name][index]
        raise NotLinearizable(f"the program reads `{name}` of a `{schema.cls.__name__}` node, which differs in kind "
                              "between nodes or is not a tensor, number or node, so the tree cannot be passed "
                              "as index tables", hint="keep per-node data in tensors and numbers")

    def __setattr__(self, name: str, value):
        schema = self._schema
        if not isinstance(value, torch.Tensor):
            raise NotLinearizable(f"the program assigns a {type(value).__name__} to `{name}` of a "
                                  f"`{schema.cls.__name__}` node", hint="assign tensors to node fields")
        type_ = type_of(value)
        if type_.syms:   # its table is made before the call, of one shape for every node
            raise SymbolicSizeError(type_.syms, "a tensor assigned to a node's field")
        if schema.assigned_type(name) != type_:
            raise NeedsAssignedTable(schema.cls, name, type_)
        self._tables[schema.values_table(name)][self._index] = value
        self._tables[ASSIGNED_MASK.format(name)][self._index] = True

    # -- `node is None`, `if node.left:` ----------------------------------------------------------
    def __ct_is_none__(self):
        return self._index < 0

    def __ct_truth__(self):
        return self._index >= 0

    def __bool__(self) -> bool:
        return bool(self.__ct_truth__())

    def __repr__(self) -> str:
        return f"<{self._schema.cls.__name__} node {self._index} of a linearized tree>"


class NodeList:
    """A node's list of nodes (`node.children`): rows of the table, and their count."""

    def __init__(self, owner: NodeRef, name: str):
        self.owner, self.name = owner, name

    def count(self):
        return self.owner._tables[COUNT.format(self.name)][self.owner._index]

    def __getitem__(self, k):
        if isinstance(k, slice):
            raise NotLinearizable(f"a slice of `{self.name}` of a node", hint=f"iterate `for c in node.{self.name}`")
        row = self.owner._tables[self.name][self.owner._index]
        if isinstance(k, numbers.Integral) and k < 0:
            k = self.count() + k
        return NodeRef(self.owner._schema, self.owner._tables, row[k])

    def __len__(self) -> int:
        return int(self.count())

    def __iter__(self):
        return (self[k] for k in range(len(self)))

    def __ct_loop__(self):
        """(trip count, loop index -> item): how converted code loops over the list."""
        return self.count(), self.__getitem__

    def __ct_truth__(self):
        return self.count() > 0

    def __bool__(self) -> bool:
        return bool(self.__ct_truth__())


# -- at call time ------------------------------------------------------------------------------------

@dataclass
class Linked:
    """One argument linearized: the NodeRef the program gets, and the nodes behind its rows."""
    ref: NodeRef
    nodes: list
    originals: dict[str, list[torch.Tensor]]   # tensor fields: each node's own tensor

    def write_back(self, written: set[int]):
        """What the call did to the tables (`written`: the ids of those it wrote), done to the
        nodes, as eager would have."""
        schema, tables = self.ref._schema, self.ref._tables
        assigned = {name: tables[ASSIGNED_MASK.format(name)] for name, _ in schema.assigned}
        for name, tensors in self.originals.items():   # in-place writes into `node.x`, where not reassigned
            if id(tables[name]) in written:
                mask = assigned.get(name)
                for i, (original, row) in enumerate(zip(tensors, tables[name])):
                    if (mask is None or not mask[i]) and not torch.equal(original, row):
                        original.copy_(row)
        for name, mask in assigned.items():   # `node.state = h`: the node holds its row now
            if id(mask) in written:
                rows = tables[schema.values_table(name)]
                for i in mask.nonzero().flatten().tolist():
                    setattr(self.nodes[i], name, rows[i])


def is_node_object(x) -> bool:
    """An object of a user class with a field that holds another object of its class (or a list
    of them): a node of a linked structure."""
    if isinstance(x, (torch.Tensor, torch.nn.Module, type)) or not hasattr(x, "__dict__"):
        return False
    cls = type(x)
    if cls.__module__ in ("builtins", "torch") or cls.__module__.startswith("torch."):
        return False
    return any(_nodes_in(v, cls) for v in vars(x).values())


def _nodes_in(value, cls: type) -> list | None:
    """The nodes a field holds (a node, or a list or tuple of nodes), or None if it holds none."""
    if type(value) is cls:
        return [value]
    if isinstance(value, (list, tuple)) and value and all(type(v) is cls for v in value):
        return list(value)
    return None


def linearize(root, assigned: dict[str, TensorType]) -> Linked:
    """The tables of the tree under `root` (breadth first from it: row 0 is the root)."""
    cls = type(root)
    nodes, row = [root], {id(root): 0}
    for node in nodes:
        for value in vars(node).values():
            for child in _nodes_in(value, cls) or ():
                if id(child) not in row:
                    row[id(child)] = len(nodes)
                    nodes.append(child)
    names = sorted({name for node in nodes for name in vars(node)})
    fields, tables, originals = [], {}, {}
    for name in names:
        values = [getattr(node, name, _MISSING) for node in nodes]
        f, table = _field(name, values, cls, row)
        fields.append(f)
        if table is not None:
            tables.update(table)
            if f.kind == "tensor":
                originals[name] = values
    found = schema_of(cls, len(nodes), tuple(fields), tuple(sorted(assigned.items(), key=lambda kv: kv[0])))
    for name, type_ in found.assigned:
        if found.values_table(name) != name:
            tables[ASSIGNED.format(name)] = torch.zeros((len(nodes), *type_.shape), dtype=type_.dtype)
        tables[ASSIGNED_MASK.format(name)] = torch.zeros(len(nodes), dtype=torch.bool)
    index = torch.zeros((), dtype=torch.int64)
    return Linked(NodeRef(found, tables, index), nodes, originals)


_MISSING = object()


def _field(name: str, values: list, cls: type, row: dict) -> tuple[Field, dict | None]:
    """A field's kind, and its table(s)."""
    if all(v is None for v in values):
        return Field(name, "none"), None
    if all(v is None or type(v) is cls for v in values):
        return Field(name, "link"), {name: torch.tensor([-1 if v is None else row[id(v)] for v in values])}
    if all(isinstance(v, (list, tuple)) and all(type(c) is cls for c in v) for v in values):
        # the most a node can have (each other node once): one table shape for every tree of this size
        width = max(len(values) - 1, 1, *(len(v) for v in values))
        links = torch.tensor([[row[id(c)] for c in v] + [-1] * (width - len(v)) for v in values], dtype=torch.int64)
        counts = torch.tensor([len(v) for v in values], dtype=torch.int64)
        return Field(name, "links"), {name: links, COUNT.format(name): counts}
    if all(isinstance(v, torch.Tensor) for v in values):
        types = {type_of(v) for v in values}
        if len(types) == 1 and not any(v.requires_grad for v in values):
            (type_,) = types
            return Field(name, "tensor", type_), {name: torch.stack(values)}
    if all(isinstance(v, bool) for v in values):
        return _number_field(name, values, torch.bool)
    if all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in values):
        return _number_field(name, values, torch.int64)
    if all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
        return _number_field(name, values, torch.float64)
    return Field(name, "opaque"), None


def _number_field(name: str, values: list, dtype: torch.dtype) -> tuple[Field, dict]:
    return Field(name, "number", TensorType((), dtype)), {name: torch.tensor(values, dtype=dtype)}
