"""The typed, data-only IR: values with static types, data ops, structured control flow."""
from cocktailer.ir.infer import infer_type
from cocktailer.ir.ops import CONTROL, CREATION, ELEMENTWISE, SEMANTICS, VIEWS, Op
from cocktailer.ir.printer import format_program, format_region
from cocktailer.ir.program import Function, Operation, Program, Region, SourceLoc, Value, clone_ops
from cocktailer.ir.types import BOOL, INDEX, Sym, SymbolicSizeError, TensorType
from cocktailer.ir.verifier import VerifyError, verify

__all__ = ["BOOL", "CONTROL", "CREATION", "ELEMENTWISE", "INDEX", "SEMANTICS", "Function", "Op",
           "Operation", "Program", "Region", "SourceLoc", "Sym", "SymbolicSizeError", "TensorType", "VIEWS", "Value",
           "VerifyError", "clone_ops",
           "format_program", "format_region", "infer_type", "verify"]
