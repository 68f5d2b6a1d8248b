"""Which dims of a call's tensor arguments a compiled program takes as symbolic sizes.

A dim is dynamic (one program serves every size of it) when the user says so
(`compile(..., dynamic=True)` for all dims, `mark_dynamic(tensor, dim)` for one), or, by
default, once a second call shows it varying (as torch.compile does: the first size compiles
a static program, the second a dynamic one). Sizes 0 and 1 are always specialized: a dim of
size 1 broadcasts, so a program for "any size" would be wrong there; such calls compile (and
cache) a program of their own. A dim the program needs as a number (capture or a backend
raised SymbolicSizeError) is specialized from then on: it is part of the cache key again.

Dims are named (leaf index, dim) over the flattened arguments, after trees of node objects
were linearized into tables (their node count is then a dim like any other)."""
from __future__ import annotations

from typing import Any

import torch

_MARK = "_cocktailer_dynamic"


def mark_dynamic(tensor: torch.Tensor, dims) -> torch.Tensor:
    """Ask compiled functions to take these dims of `tensor` (an int or several) as symbolic
    sizes from the first call on. Returns the tensor."""
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if not all(isinstance(d, int) and -tensor.dim() <= d < tensor.dim() for d in dims):
        raise ValueError(f"dims {dims} out of range for a tensor of {tensor.dim()} dims")
    setattr(tensor, _MARK, frozenset(getattr(tensor, _MARK, ())) | {d % tensor.dim() for d in dims})
    return tensor


Dims = frozenset   # of (leaf index, dim)


class DynamicDims:
    """The dims chosen for each signature (the arguments' structure, dtypes and ranks)."""

    def __init__(self, mode: bool | None):
        if mode not in (None, True, False):
            raise ValueError(f"dynamic must be None (automatic), True or False, not {mode!r}")
        self.mode = mode
        self._first: dict[Any, tuple] = {}        # signature -> the shapes of its first call
        self._varying: dict[Any, set] = {}        # signature -> dims seen with two sizes
        self._specialized: dict[Any, set] = {}    # signature -> dims a program needed as numbers

    def choose(self, leaves: list, signature: Any) -> Dims:
        """The dims of this call to take as symbolic sizes."""
        if self.mode is False:
            return frozenset()
        shapes = tuple(tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in leaves)
        first = self._first.setdefault(signature, shapes)
        varying = self._varying.setdefault(signature, set())
        if shapes != first:
            varying.update((k, d) for k, (a, b) in enumerate(zip(shapes, first)) if a is not None
                           for d, (m, n) in enumerate(zip(a, b)) if m != n)
        marked = set(varying)
        for k, x in enumerate(leaves):
            if isinstance(x, torch.Tensor):
                marked.update((k, d) for d in (range(x.dim()) if self.mode else getattr(x, _MARK, ())))
        marked -= self._specialized.get(signature, set())
        return frozenset((k, d) for k, d in marked if leaves[k].shape[d] >= 2)

    def specialize(self, signature: Any, dims):
        """These dims were asked for, and the program needed them as numbers."""
        self._specialized.setdefault(signature, set()).update(dims)


def erase(shape: tuple, leaf: int, dims: Dims) -> tuple:
    """A tensor's shape in a cache key: its dynamic dims as None."""
    return tuple(None if (leaf, d) in dims else n for d, n in enumerate(shape))
