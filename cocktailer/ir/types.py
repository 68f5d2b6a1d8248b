"""Value types of the IR: a shape and a dtype. A dim of a shape is a number, or a Sym: a size
known only when the program is called (a tree's node count, read off an input)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

_SHORT_NAMES = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "bool", torch.complex64: "c64",
}
DTYPE_BY_NAME = {name: dtype for dtype, name in _SHORT_NAMES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    return _SHORT_NAMES.get(dtype, str(dtype).removeprefix("torch."))


class SymbolicSizeError(BaseException):
    """Code that needs a size as a number met a Sym. Capture then specializes those sizes
    (compiles for the values they had), and a backend that meets one compiles the program for
    the sizes of the call. A BaseException, as capture's restarts are: the user's `except
    Exception` around a tensor op must not swallow it, nor our own handlers of bugs."""

    def __init__(self, syms: "tuple[Sym, ...] | Sym", need: str):
        self.syms = syms if isinstance(syms, tuple) else (syms,)
        names = ", ".join(s.name for s in self.syms)
        super().__init__(f"size {names} is known only at call time, and {need} needs it as a number")


@dataclass(frozen=True)
class Sym:
    """A symbolic size. `hint` is its value in the call that was captured (shape inference
    runs on it); equality is by name. It is no number: arithmetic, comparisons with numbers
    and formatting into generated code raise SymbolicSizeError, so no stage can bake the
    captured value in by accident; `str` gives its name (the printer's)."""
    name: str
    hint: int = field(compare=False)

    def __str__(self) -> str:
        return self.name

    def _number(self, *_):
        raise SymbolicSizeError(self, "an arithmetic or comparison")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __floordiv__ = __rfloordiv__ = _number
    __mod__ = __rmod__ = __lt__ = __le__ = __gt__ = __ge__ = __index__ = __int__ = __bool__ = _number

    def __format__(self, spec: str) -> str:
        raise SymbolicSizeError(self, "code generation")


@dataclass(frozen=True)
class TensorType:
    """Every IR value is a tensor of a shape and dtype (a 0-d tensor stands for a scalar).
    A dim is an int, or a Sym where the size varies between calls."""
    shape: tuple  # of int | Sym
    dtype: torch.dtype

    @staticmethod
    def of(t: torch.Tensor) -> "TensorType":
        return TensorType(tuple(t.shape), t.dtype)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n = d * n   # a Sym raises
        return n

    @property
    def syms(self) -> tuple["Sym", ...]:
        return tuple(d for d in self.shape if isinstance(d, Sym))

    @property
    def hinted(self) -> "TensorType":
        """This type with every Sym at its captured value."""
        return TensorType(tuple(d.hint if isinstance(d, Sym) else d for d in self.shape), self.dtype) \
            if self.syms else self

    def meta(self) -> torch.Tensor:
        """A storage-less tensor of this type, for shape inference (symbolic sizes at their
        captured values: for what does not depend on them, as dtype promotion does not)."""
        return torch.empty(self.hinted.shape, dtype=self.dtype, device="meta")

    def __str__(self) -> str:
        return f"{dtype_name(self.dtype)}[{','.join(map(str, self.shape))}]"


INDEX = TensorType((), torch.int64)   # loop counters and trip counts
BOOL = TensorType((), torch.bool)     # branch and loop conditions
