"""Gather independent calls, the first step of recursion unroll (Cocktailer §3.3, Figure 8).

A recursive model calls itself on each child (`l = f(left[n]); r = f(right[n])`); the calls do
not depend on each other, so the top levels of the recursion can run on different groups of
workers at once. This pass moves independent calls of one region next to each other (with
the ops the later call needs moved before the earlier one: `ir.analysis.gathered`); the
placement turns each run of them (`ir.analysis.independent_call_runs`) into a fan-out."""
from __future__ import annotations

from cocktailer.ir import Program
from cocktailer.ir.analysis import gathered


def gather_independent_calls(program: Program) -> Program:
    for fn in program.functions.values():
        for region in fn.body.regions():
            region.ops = gathered(region.ops)
    return program
