"""The pass pipeline: a flat list of (name, pass), read top to bottom.

Set COCKTAILER_PRINT_PASSES=1 (or settings.print_passes) to print the IR after each named
pass, and COCKTAILER_VERIFY=1 (settings.verify) to run the verifier between passes."""
from __future__ import annotations

import sys
from typing import Callable

from cocktailer import settings
from cocktailer.ir import Program, format_program, verify
from cocktailer.passes.carries import forward_invariant_results
from cocktailer.passes.cse import eliminate_common_subexpressions
from cocktailer.passes.dce import dce
from cocktailer.passes.fold_constants import fold_constants
from cocktailer.passes.licm import hoist_loop_invariants

Pass = Callable[[Program], Program]

CAPTURE_PIPELINE: list[tuple[str, Pass]] = [
    ("forward_invariant_results", forward_invariant_results),
    ("dce", dce),
    ("fold_constants", fold_constants),
    ("hoist_loop_invariants", hoist_loop_invariants),
    ("eliminate_common_subexpressions", eliminate_common_subexpressions),   # after hoisting: a hoisted op may repeat one before the loop
    ("dce_after_folding", dce),
]


def run_pipeline(program: Program, pipeline: list[tuple[str, Pass]]) -> Program:
    if settings.verify:
        verify(program)
    for name, pass_ in pipeline:
        program = pass_(program)
        if settings.print_passes:
            print(f"// ---- after {name} ----\n{format_program(program)}", file=sys.stderr)
        if settings.verify:
            verify(program)
    return program
