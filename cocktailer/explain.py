"""cocktailer.explain: what the compiler did with a model, as text: the build's record.

Sections: the captured IR and the passes applied to it (and the IR after the backend's own
passes, when they changed it); the candidates the measured policy compared, with their
measured latencies and which one it kept (for symbolic sizes, also specialized at each sample's
sizes), and the stages the build ran; where each
control-flow construct runs; the chosen uProgram(s) with their uTasks per worker and barriers.
"""
from __future__ import annotations

import sys
from typing import Callable

from cocktailer.api import CompiledFunction, compile
from cocktailer.batched import BatchedFunction
from cocktailer.batching.blocks import Block
from cocktailer.batching.lanes import RULES
from cocktailer.batching.recursion import LevelPlan, plan_levels, recursive
from cocktailer.ir import CONTROL, CREATION, Op, Program
from cocktailer.passes import CAPTURE_PIPELINE
from cocktailer.schedule.printer import format_uprogram


def explain(model: Callable, example_inputs: tuple | None = None, *, backend: str = "cpu",
            options: dict | None = None, example_kwargs: dict | None = None, file=sys.stdout) -> str:
    """Print, then return, the report of how `model` is compiled for these inputs: a
    compiled function's own build (for `example_inputs`, or its only one), else a compile of
    `model` now, with the measured policy unless `options` name another."""
    if isinstance(model, BatchedFunction):
        text = _batched(model, example_inputs)
        if file is not None:
            print(text, file=file, end="")
        return text
    if isinstance(model, CompiledFunction):
        compiled = model
        if example_inputs is not None:
            compiled.specialize(*example_inputs, **(example_kwargs or {}))
    else:
        options = {"policy": "measured", **(options or {})} if backend == "cpu" else options
        compiled = compile(model, example_inputs, backend=backend, options=options, example_kwargs=example_kwargs)
    program, executable = _entry(compiled, example_inputs, example_kwargs)
    record = getattr(executable, "record", None)
    text = "\n\n".join([_ir(program, record), _policy(record), _levels(program, record),
                        _schedules(record)]) + "\n"
    if file is not None:
        print(text, file=file, end="")
    return text


_INSPECTORS = {   # how a recursion's call tree was found (Schedule.inspectors), in words
    "native": "compiled to C (one pass over every instance's calls)",
    "round loop": "a round of calls at a time, every round in one call of the native round loop (each round: one "
                  "program deciding every call's branches, one per set of arms computing the self-calls' arguments)",
    "rounds": "a round of calls at a time, each round as native programs called from Python (one deciding every "
              "call's branches, one per set of arms computing the self-calls' arguments)",
}


def _inspector(how: str) -> str:
    """Schedule.inspectors' `how` in words: a key of _INSPECTORS, "rounds: why not in the round
    loop", or why the slice has no native form."""
    key, _, why = how.partition(": ")
    if key in _INSPECTORS:
        return _INSPECTORS[key] + (f"; not in the round loop: {why}" if why else "")
    return f"run by the executor (native blocks of the slice, torch ops), a round of calls at a time: {how}"


def _batched(batched: BatchedFunction, example_inputs) -> str:
    """A batched function: the one-instance program, how each recursive function and each data
    op runs batched, and what the last call did."""
    args = batched.example if example_inputs is None else batched.single._bind(tuple(example_inputs), {})
    program = batched.single._prepare(*args)[2][0]
    lines = ["== batched execution (cocktailer.batch) =="]
    for name, fn in program.functions.items():
        if not recursive(program, name):
            continue
        plan = plan_levels(program, name)
        if isinstance(plan, LevelPlan):
            ops = sum(1 for _ in fn.body.walk())
            sites = ", ".join(str(s.loc) for s in plan.sites)
            lines.append(f"@{name}: level by level; the inspector runs {len(plan.control)} of its {ops} ops "
                         f"(the control slice) to find the call tree; self-calls at {sites}")
        else:
            lines.append(f"@{name}: depth-first, each call batched over the instances that make it: {plan}")
    executor = batched._executor(program)
    blocks = [p for parts in executor._segments.values() for p in parts if isinstance(p, Block)]
    lines.append(f"native blocks: {len(blocks)}, holding {sum(len(b.ops) for b in blocks)} ops (one native call "
                 "each per run of their region, for all its lanes); the other data ops run as batched torch ops"
                 if executor._segments else "native blocks: none (no C compiler, or turned off)")
    packed = [b for b in blocks if b.packed is not None]
    if packed:
        lines.append(f"  {len(packed)} of them position-wise over a ragged size ("
                     + ", ".join(sorted({str(b.packed) for b in packed}))
                     + "): computed on the instances' real rows packed one after another, no padding")
    lines += [f"  left to torch: {note}" for note in executor.block_notes]
    kinds = sorted({op.op.name.lower() for op in program.walk()   # (sources and sizes are never per instance)
                    if op.op not in RULES.keys() | CONTROL | CREATION and op.op not in (Op.CONST, Op.DIM)})
    lines.append("data ops without a batching rule of their own (run through torch.vmap): "
                 + (", ".join(kinds) if kinds else "none"))
    schedule = batched.schedule
    if schedule is None:
        lines.append("(not called yet)")
    else:
        lines.append(f"last call (its largest group): {schedule.lanes} instances; branches whose instances split: "
                     f"{schedule.branches}; loop iterations: {schedule.loop_steps}")
        if schedule.padded_rows:
            lines.append(f"  position-wise blocks computed {schedule.packed_rows} rows, of the {schedule.padded_rows} "
                         "they would have padded to the longest instance")
        if schedule.lane_calls:
            lines.append(f"  masked blocks (attention over instances of different sizes) ran as {schedule.lane_calls} "
                         "calls, one per instance at its own size, the instances shared out among the workers")
        if schedule.bucketed_calls:
            lines.append(f"  masked blocks (attention over instances of different sizes) ran in {schedule.bucketed_calls} "
                         "calls over buckets of instances of similar sizes, each padded to its own longest")
        if schedule.loop_programs or schedule.stepped_loops:
            lines.append(f"  runs of loops with every step in one native call (loop programs: lanes sorted by trip "
                         f"count and by the arms they take, the steps run by the native loop; a loop ending on a "
                         f"condition drops its lanes step by step, a loop holding a loop runs both): "
                         f"{schedule.loop_programs}")
            lines += [f"    loop at {where} ran step by step from Python: {why}"
                      for where, why in schedule.stepped_loops.items()]
        for name, how in schedule.inspectors.items():
            lines.append(f"  @{name}: inspector " + _inspector(how))
        lines.append(f"  inspectors: {schedule.inspect_s * 1e3:.3f} ms")
        for name, (native, by_ops) in schedule.level_groups.items():
            loops = schedule.level_loops.get(name, 0)
            lines.append(f"  @{name}: {native} groups of calls (one height, one set of arms) ran as one native call "
                         f"each (level programs), {by_ops} op by op; "
                         + (f"{loops} call(s) of the native level loop ran the level programs" if loops else
                            "the level programs were called from Python, one call per group"))
        lines += [f"    no level program for @{name} with arms {path:#b}: {why}"
                  for (name, path, _), why in executor._levels.items() if isinstance(why, str)]
        for name, runs in schedule.levels.items():
            for per_level in runs:
                lines.append(f"  @{name}: {len(per_level)} levels, calls per level (height 0 first): "
                             + ", ".join(map(str, per_level)))
    return f"== captured IR (one instance) ==\n{program}\n\n" + "\n".join(lines) + "\n"


def _entry(compiled: CompiledFunction, example_inputs, example_kwargs):
    if example_inputs is None or len(compiled.cache) == 1:
        if len(compiled.cache) != 1:
            raise ValueError(f"this compiled function has {len(compiled.cache)} builds (one per specialization): "
                             "pass the example_inputs whose build to explain")
        (entry,) = compiled.cache.values()
        return entry
    args, kwargs = compiled._bind(tuple(example_inputs), example_kwargs or {})
    return compiled._prepare(args, kwargs)[2]   # the program calls of these sizes run (symbolic or not)


def _ir(program: Program, record) -> str:
    text = f"== captured IR (passes applied: {', '.join(name for name, _ in CAPTURE_PIPELINE)}) ==\n{program}"
    built = record.built if record is not None else None
    if built is None or built.config.control != "L1":   # the cpu backend's passes: cpu and cuda
        return (f"{text}\n\n== IR after the cpu backend's passes (none) ==\n"
                "(not the cpu backend: it runs the captured IR)")
    after = "(nothing to rewrite: the captured IR)" if built.program is program else str(built.program)
    return f"{text}\n\n== IR after the cpu backend's passes ({', '.join(built.passes) or 'none'}) ==\n{after}"


def _policy(record) -> str:
    if record is None:
        return "== policy ==\nnone: this backend runs the IR directly"
    built = record.built
    if not record.trials:
        head = f"== policy ==\nsimple: {built.config}, every worker on every operator (no candidates measured)"
    else:
        lines = ["== policy: candidates measured (bottom-up; a step is kept only if faster) ==",
                 "| step | candidate | measured ms | kept |", "|---|---|---|---|"]
        for t in record.trials:
            ms = f"{t.seconds * 1e3:.4g}" if t.seconds is not None else f"failed: {t.error}"
            lines.append(f"| {t.step} | {t.candidate} | {ms} | {'kept' if t.kept else ''} |")
        head = "\n".join(lines + [f"chosen: {built.config}"] + _sizes(record))
    return f"{head}\nbuild stages:\n" + "\n".join(f"  {line}" for line in built.summary().splitlines())


def _sizes(record) -> list[str]:
    """The measured policy's choice per sample size of a symbolic program."""
    if not record.sizes:
        return []
    lines = ["sizes: the chosen candidate specialized at each sample's sizes, against it with symbolic sizes",
             "| sizes | symbolic ms | specialized ms | calls of these sizes run |", "|---|---|---|---|"]
    for t in record.sizes:
        runs = "the specialized program" if t.kept else "the symbolic program"
        lines.append(f"| {t.sizes} | {t.symbolic * 1e3:.4g} | {t.specialized * 1e3:.4g} | {runs} |")
    return lines


def _levels(program: Program, record) -> str:
    native = record.built.native_constructs if record is not None else set()
    lines = ["== control flow: where each construct runs =="]
    for name, fn in program.functions.items():
        for op in fn.body.walk():
            if op.op in CONTROL:
                what = f"call @{op.attrs['callee']}" if "callee" in op.attrs else op.op.name.lower()
                level = "L1" if native is None else "L1 (in a native block)" if id(op) in native else "host"
                lines.append(f"{what} in @{name}{f' at {op.loc}' if op.loc else ''}: {level}")
    if len(lines) == 1:
        lines.append("(no control flow: one basic block)")
    return "\n".join(lines)


def _schedules(record) -> str:
    if record is None:
        return "== uProgram ==\n(this backend runs the IR directly: no uProgram)"
    built = record.built
    if built.config.control == "L1":   # one program, control flow inside (cpu, cuda)
        return "== uProgram ==\n" + format_uprogram(built.uprogram)
    parts = [f"-- basic block {k} (one native call) --\n{format_uprogram(p.uprogram)}"
             for k, p in enumerate(built.parts)]
    return "== uPrograms (control flow in Python; one per basic block) ==\n" + "\n".join(parts)
