"""Tensors computed from other tensors (a folded transpose of a weight, a GEMM's weights in
panels), kept while their sources live and are not written: compiling the same model again
in this process finds them instead of computing them again.

An entry holds its sources weakly, with their version counters and memory: a source that was
freed (and whose id a new tensor took), written in place, or given new memory (`w.data = ...`)
since does not match."""
from __future__ import annotations

import weakref
from typing import Callable, Hashable

import torch

_PRUNE_EVERY = 256


class DerivedTensors:
    def __init__(self):
        self._entries: dict[tuple, tuple[list, tuple, torch.Tensor]] = {}
        self._added = 0

    def get(self, kind: Hashable, sources: list[torch.Tensor], compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        """`compute()` (a tensor that is a function of `kind` and `sources`), or the tensor it
        gave for these same sources, unchanged since."""
        key = (kind, tuple(id(s) for s in sources))
        versions = tuple((s._version, s.data_ptr(), s.shape, s.stride(), s.dtype) for s in sources)
        entry = self._entries.get(key)
        if entry is not None and entry[1] == versions and all(r() is s for r, s in zip(entry[0], sources)):
            return entry[2]
        value = compute()
        self._entries[key] = ([weakref.ref(s) for s in sources], versions, value)
        self._added += 1
        if self._added % _PRUNE_EVERY == 0:
            self._entries = {k: e for k, e in self._entries.items() if all(r() is not None for r in e[0])}
        return value


DERIVED = DerivedTensors()
