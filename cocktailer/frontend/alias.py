"""PyTorch's aliasing model, as capture tracks it (functionalization).

- A `Storage` is memory that several tensors may share. Its contents are one IR value (of
  the base tensor's type); an in-place write through any tensor of it makes a new value, so
  the IR stays functional.
- A tensor during capture (`tracer.Proxy`) is a storage and a `Chain` of view steps (select,
  reshape, permute, expand) from the storage's value to the tensor's.
- A `Link` says that a storage *may* be the same memory as another one viewed through a
  chain, when a runtime flag (a bool[] value) holds: what a tensor-dependent `if`, a loop or
  a recursive call gives back can be one of several tensors. A write into either side is
  applied to the other under the flag, so every alias sees it, as in eager PyTorch.

A storage keeps its links strongly and is known to the storages it links to weakly: a
storage no tensor can reach any more is not updated (nothing could observe it).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from cocktailer.ir import Op, Region, TensorType, Value


@dataclass(frozen=True)
class ViewStep:
    """One view op from a tensor to a view of it: `op(x, *dynamic, **attrs)`."""
    op: Op
    attrs: tuple            # sorted (name, value) pairs
    dynamic: tuple = ()     # SELECT's 0-d index values

    @staticmethod
    def make(op: Op, dynamic=(), **attrs) -> "ViewStep":
        return ViewStep(op, tuple(sorted(attrs.items())), tuple(dynamic))

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.attrs)

    @property
    def structure(self) -> tuple:
        """What the step is, its dynamic indices left out (they may differ between paths)."""
        return (self.op, self.attrs, len(self.dynamic))

    def with_dynamic(self, dynamic) -> "ViewStep":
        return ViewStep(self.op, self.attrs, tuple(dynamic))


Chain = tuple   # tuple[ViewStep, ...]: from a storage's value to a tensor's


def chain_structure(chain: Chain) -> tuple:
    return tuple(step.structure for step in chain)


def chain_dynamic(chain: Chain) -> list[Value]:
    return [v for step in chain for v in step.dynamic]


def with_chain_dynamic(chain: Chain, values) -> Chain:
    """`chain` with its dynamic indices replaced, in order, by `values`."""
    it = iter(values)
    return tuple(step.with_dynamic([next(it) for _ in step.dynamic]) for step in chain)


class Storage:
    """Memory shared by aliasing tensors; `value` is its contents now."""
    __slots__ = ("value", "stamp", "born", "region", "origin", "meta", "layout_varies", "links", "dependents",
                 "__weakref__")

    def __init__(self, value: Value, stamp: int, region: Region | None, origin: str, meta: torch.Tensor):
        self.value = value
        self.stamp = stamp              # changes at every write: a view's cached value is stale when it differs
        self.born = stamp               # when it was made (what an op made is newer than the op's start)
        self.region = region            # where it was created (None: a constant, visible everywhere)
        self.origin = origin            # "input", "param", "const" or "local"
        self.meta = meta                # a meta tensor with the base's layout; views are views of it
        self.layout_varies = False      # its strides depend on the path taken (see merge)
        self.links: list[Link] = []     # this storage may be (a view of) another one
        self.dependents: weakref.WeakSet[Link] = weakref.WeakSet()   # links to this storage

    @property
    def type(self) -> TensorType:
        return self.value.type

    def __repr__(self) -> str:
        return f"Storage({self.origin}, %{self.value.id}: {self.value.type})"


class Link:
    """`alias` is `target`'s value viewed through `chain` when `flag` holds at run time."""
    __slots__ = ("_alias", "target", "chain", "flag", "__weakref__")

    def __init__(self, alias: Storage, target: Storage, chain: Chain, flag: Value):
        self._alias = weakref.ref(alias)
        self.target, self.chain, self.flag = target, chain, flag
        alias.links.append(self)
        target.dependents.add(self)

    @property
    def alias(self) -> Storage | None:
        return self._alias()


def inverse_permutation(dims: tuple[int, ...]) -> tuple[int, ...]:
    out = [0] * len(dims)
    for i, d in enumerate(dims):
        out[d] = i
    return tuple(out)
