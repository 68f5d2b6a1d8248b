"""Rammer's kernel choice by measurement, for wavefront co-scheduling (Rammer §3.3): a wave
that the placement would run side by side is timed in both variants — each op on all
workers in turn (fastest alone), and each on its own group of workers (most efficient per
worker) — and runs side by side only where that measured faster.

Each wave becomes a small program of its own that repeats the wave REPEATS times in a native
loop (a wave takes microseconds: one call from Python would time the call), on inputs of the
wave's shapes: its constants, else random floats and zero integers (a valid index). All
waves' variants are compiled into one library, by the same native stages as any program.
"""
from __future__ import annotations

import torch

from cocktailer.backend.config import Config
from cocktailer.backend.native import Part, build_parts
from cocktailer.backend.profiler import Profiler
from cocktailer.backend.record import Record
from cocktailer.ir import Function, Op, Operation, Program, Region, TensorType, Value
from cocktailer.ir.program import clone_ops
from cocktailer.schedule.wavefront import co_scheduled, wave_key

REPEATS = 20


def slower_side_by_side(program: Program, config: Config) -> set[tuple]:
    """The keys (`wave_key`) of the waves whose side-by-side variant did not measure faster
    than running each op on all `config.workers` workers, or could not be measured."""
    waves = [(region, wave) for fn in program.functions.values() for region in fn.body.regions()
             for wave in co_scheduled(region, config.workers)]
    if not waves:
        return set()
    constants = {op.results[0].id: op.attrs["name"] for op in program.walk() if op.op is Op.CONST}
    built = [_wave_program(program, region, wave, constants) for region, wave in waves]
    variant = {side: Config(workers=config.workers, max_depth=1, wavefront=side) for side in (False, True)}
    parts = [Part(sub, variant[side], f"wave_{k}") for k, (sub, side) in
             enumerate((sub, side) for sub, _ in built for side in (False, True))]
    runs = build_parts(parts, Record(config))
    slower = set()
    for w, ((_, inputs), (_, wave)) in enumerate(zip(built, waves)):
        profiler = Profiler([inputs], min_rounds=5, min_seconds=0.05, max_seconds=0.5, persist=False)
        try:
            alone, side = profiler.compare(runs[2 * w: 2 * w + 2])
        except Exception:   # an op that fails on made-up inputs: keep the variant that needs no proof
            side, alone = 1.0, 0.0
        if side >= alone:
            slower.add(wave_key(wave))
    return slower


def _wave_program(program: Program, region: Region, wave: dict,
                  constants: dict[int, str]) -> tuple[Program, list[torch.Tensor]]:
    """A program that runs the wave's ops REPEATS times, and inputs for it (`constants`: value
    id -> constant name, for the values the program binds to its constants)."""
    ops = [op for op in region.ops if id(op) in wave]
    defined = {r.id for op in ops for r in op.results}
    reads = list({v.id: v for op in ops for v in op.operands if v.id not in defined}.values())
    rename = {v.id: Value(v.type, v.hint) for v in reads}
    trip = Value(TensorType((), torch.int64), "repeats")
    body = Region([Value(TensorType((), torch.int64), "i")], clone_ops(ops, rename), [])
    loop = Operation(Op.LOOP, [trip], [], {"has_trip": True, "has_cond": False}, [body])
    main = Function("main", Region([rename[v.id] for v in reads] + [trip], [loop], []))
    inputs = [program.constants[constants[v.id]].detach().contiguous() if v.id in constants else _made_up(v.type)
              for v in reads]
    return Program({"main": main}, "main", program.constants, program.device), inputs + [torch.tensor(REPEATS)]


def _made_up(ty: TensorType) -> torch.Tensor:
    if ty.dtype.is_floating_point:
        return torch.randn(ty.shape, generator=torch.Generator().manual_seed(0)).to(ty.dtype)
    return torch.zeros(ty.shape, dtype=ty.dtype)
