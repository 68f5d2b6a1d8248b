"""Tensors computed from other tensors (a folded transpose of a weight, a GEMM's weights in
panels), kept while their sources live and are not written: compiling the same model again
in this process finds them instead of computing them again.

An entry holds its sources weakly, with their version counters and memory: a source that was
freed (and whose id a new tensor took), written in place, or given new memory (`w.data = ...`)
since does not match.

Derived tensors are computed outside inference mode even when the compile runs inside it, so
that they have version counters and can be refreshed in place later. A source made under
`torch.inference_mode` has no version counter (torch lets it be written in place only inside
inference mode): `version` gives it a fixed one, so such a write is not seen."""
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
        versions = tuple((version(s), s.data_ptr(), s.shape, s.stride(), s.dtype) for s in sources)
        entry = self._entries.get(key)
        if entry is not None and entry[1] == versions and all(r() is s for r, s in zip(entry[0], sources)):
            return entry[2]
        with torch.inference_mode(False):
            value = compute()
        self._entries[key] = ([weakref.ref(s) for s in sources], versions, value)
        self._added += 1
        if self._added % _PRUNE_EVERY == 0:
            self._entries = {k: e for k, e in self._entries.items() if all(r() is not None for r in e[0])}
        return value


DERIVED = DerivedTensors()


def version(t: torch.Tensor) -> int:
    """The tensor's version counter (how often it was written in place); -1 for an inference
    tensor, which has none."""
    return -1 if t.is_inference() else t._version
