"""cocktailer.explain: what the compiler did with a model, as text.

Sections: the captured IR and the passes applied to it (and the IR after the backend's own
passes, when they changed it); the candidates the measured policy
compared, with their measured latencies and which one it kept; where each control-flow
construct runs; the chosen uProgram(s) with their uTasks per worker and barriers.
"""
from __future__ import annotations

import sys
from typing import Callable

from cocktailer.api import compile
from cocktailer.ir import CONTROL, Program
from cocktailer.passes import CAPTURE_PIPELINE
from cocktailer.runtime.cpu import CPU_PIPELINE
from cocktailer.runtime.host import HostExecutor
from cocktailer.runtime.native import CompiledProgram
from cocktailer.runtime.tuning import TunedProgram
from cocktailer.schedule.printer import format_uprogram


def explain(model: Callable, example_inputs: tuple, *, backend: str = "cpu", options: dict | None = None,
            example_kwargs: dict | None = None, file=sys.stdout) -> str:
    """Compile `model` for these inputs (with the measured policy unless `options` name
    another) and print, then return, the report."""
    options = {"policy": "measured", **(options or {})} if backend == "cpu" else options
    compiled = compile(model, example_inputs, backend=backend, options=options, example_kwargs=example_kwargs)
    (program, executable), = compiled.cache.values()
    text = "\n\n".join([_ir(program, executable), _policy(executable), _levels(program, executable),
                        _schedules(executable)]) + "\n"
    if file is not None:
        print(text, file=file, end="")
    return text


def _chosen(executable):
    return executable.chosen if isinstance(executable, TunedProgram) else executable


def _ir(program: Program, executable) -> str:
    text = f"== captured IR (passes applied: {', '.join(name for name, _ in CAPTURE_PIPELINE)}) ==\n{program}"
    chosen = _chosen(executable)
    passes = [name for name, _ in CPU_PIPELINE]
    if getattr(executable, "candidate", None) is not None and executable.candidate.fan_out:
        passes.append("gather_independent_calls")
    header = f"\n\n== IR after the cpu backend's passes ({', '.join(passes)}) =="
    if not isinstance(chosen, CompiledProgram):
        after = "(not the cpu backend: it runs the captured IR)"
    elif chosen.program is program:
        after = "(nothing to rewrite: the captured IR)"
    else:
        after = str(chosen.program)
    return f"{text}{header}\n{after}"


def _policy(executable) -> str:
    if not isinstance(executable, TunedProgram):
        return "== policy ==\nsimple: control flow at L1, every worker on every operator (no candidates measured)"
    lines = ["== policy: candidates measured (bottom-up; a step is kept only if faster) ==",
             "| step | candidate | measured ms | kept |", "|---|---|---|---|"]
    for t in executable.trials:
        ms = f"{t.seconds * 1e3:.4g}" if t.seconds is not None else f"failed: {t.error}"
        lines.append(f"| {t.step} | {t.candidate} | {ms} | {'kept' if t.kept else ''} |")
    lines.append(f"chosen: {executable.candidate}")
    return "\n".join(lines)


def _levels(program: Program, executable) -> str:
    chosen = _chosen(executable)
    lines = ["== control flow: where each construct runs =="]
    for name, fn in program.functions.items():
        for op in fn.body.walk():
            if op.op in CONTROL:
                what = f"call @{op.attrs['callee']}" if "callee" in op.attrs else op.op.name.lower()
                level = "L1" if not isinstance(chosen, HostExecutor) else \
                    "L1 (in a native block)" if id(op) in chosen.native else "host"
                lines.append(f"{what} in @{name}{f' at {op.loc}' if op.loc else ''}: {level}")
    if len(lines) == 1:
        lines.append("(no control flow: one basic block)")
    return "\n".join(lines)


def _schedules(executable) -> str:
    chosen = _chosen(executable)
    if isinstance(chosen, CompiledProgram) and chosen.uprogram is not None:
        return "== uProgram ==\n" + format_uprogram(chosen.uprogram)
    if isinstance(chosen, HostExecutor):
        parts = [f"-- basic block {k} (one native call) --\n{format_uprogram(b.compiled.uprogram)}"
                 for k, b in enumerate(chosen.blocks) if b.compiled is not None]
        return "== uPrograms (control flow in Python; one per basic block) ==\n" + "\n".join(parts)
    return "== uProgram ==\n(this backend runs the IR directly: no uProgram)"
