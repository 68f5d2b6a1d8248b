"""How the entry function's yields become what the Python call returns and writes.

Eager PyTorch may return the caller's own tensors (`return x`), views of them, several
views of one new tensor, or a tensor that is one of those only on some paths; and it may
have written into the caller's tensors and into parameters or buffers. The program yields
only new contents; this map says what to do with them after a call:

- `written`: copy these yields into input tensors and constants (in place, as eager did);
- `slots`: memory the outputs are made of: a yield, unless one of its alternatives' flags
  (a bool yield) holds, then that view of an input, a constant or another slot;
- `outputs`: each tensor output is a view of an input, a constant or a slot.
A view is a chain of view ops (select, reshape, permute, expand) applied with torch, so an
output shares memory with what it views exactly as in eager.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Sequence

import torch

from cocktailer.ir.ops import SEMANTICS, Op
from cocktailer.ir.infer import attrs_at, syms_in


@dataclass(frozen=True)
class View:
    source: str                   # "input", "const" or "slot"
    index: object                 # input position, constant name, slot number
    steps: tuple = ()             # (op, attrs (sorted pairs), positions of the yields that are its indices)


@dataclass(frozen=True)
class Slot:
    value: int                    # the yield holding its contents
    alternatives: tuple = ()      # (flag yield, View): the slot is that view when the flag holds


@dataclass
class Boundary:
    slots: list[Slot] = field(default_factory=list)
    outputs: list[View] = field(default_factory=list)
    written: list[tuple[str, object, int]] = field(default_factory=list)   # (kind, input position | name, yield)

    @property
    def inputs_written(self) -> list[int]:
        return [index for kind, index, _ in self.written if kind == "input"]

    @property
    def constants_written(self) -> list[str]:
        return [index for kind, index, _ in self.written if kind == "const"]

    @functools.cached_property
    def plain(self) -> bool:
        """Every output is a yield of its own: nothing to reconstruct. (Worked out once, on the
        first call: a boundary is complete when capture returns it.)"""
        return not self.written and all(not o.steps and o.source == "slot" and not self.slots[o.index].alternatives
                                        for o in self.outputs) and \
            len({o.index for o in self.outputs}) == len(self.outputs)

    @property
    def _views(self) -> list[View]:
        """Every view a call may rebuild: the outputs and the slots' alternatives."""
        return [*self.outputs, *(view for slot in self.slots for _, view in slot.alternatives)]

    @functools.cached_property
    def sized(self) -> bool:
        """Whether rebuilding a view needs the call's symbolic sizes (a step's attributes name
        one): else `outputs_of` takes none, and a call need not read them."""
        return any(syms_in(tuple(value for _, value in attrs)) for view in self._views for _, attrs, _ in view.steps)

    @functools.cached_property
    def numbers(self) -> frozenset[int]:
        """The yields read only as numbers: flags that choose a slot's view and indices of view
        steps that select one element (`x[i]`), where no slot, write or other step reads them.
        `outputs_of` takes these as Python numbers as well as 0-d tensors (a batch reads them
        for all its instances at once, not as a tensor per instance)."""
        views = self._views
        read = {flag for slot in self.slots for flag, _ in slot.alternatives}
        read |= {k for view in views for op, _, dynamic in view.steps if op == Op.SELECT.name for k in dynamic}
        other = {slot.value for slot in self.slots} | {k for _, _, k in self.written}
        other |= {k for view in views for op, _, dynamic in view.steps if op != Op.SELECT.name for k in dynamic}
        return frozenset(read - other)

    def write_back(self, yields: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], constants: dict):
        for kind, index, k in self.written:
            (inputs[index] if kind == "input" else constants[index]).copy_(yields[k])

    def outputs_of(self, yields: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], constants: dict,
                   sizes: dict | None = None) -> list:
        """The program's outputs, views rebuilt on the call's tensors; `sizes`: the call's
        value of each symbolic size (a view step's shape may name one)."""
        memory = self._slots(yields, inputs, constants, sizes or {})
        return [self._view(o, yields, inputs, constants, memory, sizes or {}) for o in self.outputs]

    def _slots(self, yields, inputs, constants, sizes: dict) -> list[torch.Tensor | None]:
        """Each slot's memory; a slot that is a view of another slot waits for it."""
        memory: list = [None] * len(self.slots)
        pending = list(range(len(self.slots)))
        while pending:
            left = []
            for s in pending:
                view = next((v for flag, v in self.slots[s].alternatives if bool(yields[flag])), None)
                if view is None:
                    memory[s] = yields[self.slots[s].value]
                elif view.source != "slot" or memory[view.index] is not None:
                    memory[s] = self._view(view, yields, inputs, constants, memory, sizes)
                else:
                    left.append(s)
            if len(left) == len(pending):   # a cycle of flags that cannot all hold: take the values
                for s in left:
                    memory[s] = yields[self.slots[s].value]
                left = []
            pending = left
        return memory

    @staticmethod
    def _view(view: View, yields, inputs, constants, memory, sizes: dict) -> torch.Tensor:
        x = inputs[view.index] if view.source == "input" else constants[view.index] if view.source == "const" \
            else memory[view.index]
        for op, attrs, dynamic in view.steps:
            x = SEMANTICS[Op[op]](x, *(yields[k] for k in dynamic), **attrs_at(dict(attrs), sizes))
        return x
