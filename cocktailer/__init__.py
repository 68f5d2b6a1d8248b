"""cocktailer: compile PyTorch programs with loops, branches and recursion.

    fast = cocktailer.compile(model, example_inputs=(x, h))
    print(cocktailer.capture(model, (x, h)))
    cocktailer.explain(model, (x, h))      # what the measured policy chose, and why
"""
from cocktailer.api import (BACKENDS, AliasedInputsWarning, CompiledFunction, GradFallbackWarning, capture, compile,
                            compile_traced)
from cocktailer.batched import BatchInputError, batch
from cocktailer.dynamic import mark_dynamic
from cocktailer.errors import CocktailerError, CompiledCallError, InternalError, UnsupportedError
from cocktailer.explain import explain
from cocktailer.ir import Program, format_program, verify

__version__ = "0.1.0"
__all__ = ["BACKENDS", "AliasedInputsWarning", "BatchInputError", "CocktailerError", "CompiledCallError", "CompiledFunction",
           "GradFallbackWarning", "InternalError", "Program", "UnsupportedError", "batch", "capture", "compile", "compile_traced", "explain", "format_program",
           "mark_dynamic", "verify"]
