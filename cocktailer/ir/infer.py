"""Shape and dtype inference: run an op's reference semantics on meta tensors."""
from __future__ import annotations

from typing import Any, Sequence

from cocktailer.ir.ops import CREATION, SEMANTICS, Op
from cocktailer.ir.types import TensorType


def infer_type(op: Op, operand_types: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    """The result type of a data op (not CONST or control flow). Raises whatever torch
    raises for invalid operands (mismatched shapes, bad dims, ...)."""
    impl = SEMANTICS[op]
    extra = {"device": "meta"} if op in CREATION else {}
    out = impl(*(t.meta() for t in operand_types), **attrs, **extra)
    return TensorType.of(out)
