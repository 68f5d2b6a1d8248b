"""Value types of the IR: a static shape and a dtype."""
from __future__ import annotations

from dataclasses import dataclass

import torch

_SHORT_NAMES = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "bool", torch.complex64: "c64",
}
DTYPE_BY_NAME = {name: dtype for dtype, name in _SHORT_NAMES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    return _SHORT_NAMES.get(dtype, str(dtype).removeprefix("torch."))


@dataclass(frozen=True)
class TensorType:
    """Every IR value is a tensor of a static shape and dtype (a 0-d tensor stands for a scalar)."""
    shape: tuple[int, ...]
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
            n *= d
        return n

    def meta(self) -> torch.Tensor:
        """A storage-less tensor of this type, for shape inference."""
        return torch.empty(self.shape, dtype=self.dtype, device="meta")

    def __str__(self) -> str:
        return f"{dtype_name(self.dtype)}[{','.join(map(str, self.shape))}]"


INDEX = TensorType((), torch.int64)   # loop counters and trip counts
BOOL = TensorType((), torch.bool)     # branch and loop conditions
