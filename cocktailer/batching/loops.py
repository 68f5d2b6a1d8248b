"""Loop programs: a counted loop, every step for every lane, as one call of native code.

A loop whose trip count is known when it starts (`for t in range(n)`, n of each lane's own)
and whose body is a straight line (no branch, loop or call inside: `levels.Straight`) runs as
the body's program over `LANES` lanes, called once per step by the native level loop
(`codegen.level_loop`) instead of by Python one step at a time (the Cocktailer part: the
loop's control flow inside the compiled code; the shrinking active set is ACROBAT's):

- the lanes are sorted by trip count, longest first, so that the lanes still in the loop at
  step t are the first n_t of them: step t is the group of rows t*L .. t*L + n_t (L lanes);
- each carried value lives in a table of T+1 blocks of L rows: step t reads block t and writes
  block t+1, found by offsetting row pointers, so nothing is prepared per step. A lane's final
  value is in block `trip` of its row, which no later step writes (later steps run fewer lanes);
- the counter is an input of one row per lane: block t of it holds t in every row;
- a value stacked from every step (`outs.append(h)` ... `torch.stack(outs)`) lives in a table of
  T blocks of L rows, step t writing block t; each lane's rows past its own trip count are zeros
  (padding, as when the executor steps the loop);
- what the body reads from outside the loop: a weight or literal defined again inside (packed
  once, when the program loads: `blocks.constant_source`); another value the same for every
  lane as it is; a value of one row per lane either whole (each lane's row gathered through the sort)
  or, where the body indexes it (`x[t]`), one row of it read in the kernel (the gather fused),
  counted from the lane's own end when negative and checked against the lane's own size.

A loop this cannot hold (it ends on a condition, has control flow inside) runs step by step in
the executor, as before.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from cocktailer.backend.batched import LevelRun
from cocktailer.batching.blocks import LANES, constant_source
from cocktailer.batching.lanes import Lanes, rows
from cocktailer.batching.levels import LevelProgram, Straight
from cocktailer.ir import Operation, Program, Value


@dataclass
class LoopProgram:
    level: LevelProgram     # the body over LANES lanes, built and compiled
    outside: list[Value]    # the values the body reads from outside the loop (`("whole" | "table" | "shared", j)`)
    stacked: int            # how many of its yields, after the carried values, are stacked from every step


def loop_program(op: Operation, program: Program, ragged: list, varying: set[int],
                 producers: dict[int, Operation]) -> LoopProgram:
    """The loop program of `op` (not yet compiled). Raises NotImplementedError (why) where the
    loop has none. `varying`: the ids of the values that may differ by lane; `producers`: the
    op that defines each value, by id."""
    if op.loop_cond is not None:
        raise NotImplementedError("the loop ends on a condition, not a count")
    body = op.loop_body
    outer = {p.id: ("arg", k) for k, p in enumerate(body.params)}   # the counter, then the carried values
    outside = body.outside_reads()
    for j, v in enumerate(outside):
        source = constant_source(v, producers)
        outer[v.id] = ("stacked", j) if v.id in varying else ("const", source) if source else ("shared", j)
    straight = Straight(body, program, ragged, outer)
    for p in body.params:   # first, so that the lane count is read from a per-step input
        straight.value(p)
    level = straight.build()
    if not any(sym == LANES and level.inputs[position][0] == "arg" for sym, position, _ in level.program.sizes):
        raise NotImplementedError("the lane count is not read from an input that advances with the steps")
    return LoopProgram(level, outside, op.loop_stacked)


def run_loop_program(loop: LoopProgram, env: dict, count: int, trips: torch.Tensor, steps: int, carried: list,
                     per_lane_sizes: torch.Tensor | None, table) -> list:
    """The loop's results (its carried values, then its stacked ones) when every lane has run
    its own trip count (`trips`, one per lane; `steps` the largest), starting from `carried`; `table(k, shape, dtype)`
    gives uninitialized memory for table k (the tables are dead once this returns: nothing it
    returns is in them). Raises IndexError where an index fell outside its lane's size."""
    stacked_types = [y.type for y in loop.level.program.main.body.yields[len(carried):len(carried) + loop.stacked]]
    if steps <= 0:
        return carried + [Lanes(torch.empty((count, 0, *ty.shape[1:]), dtype=ty.dtype)) for ty in stacked_types]
    order = torch.argsort(trips, descending=True, stable=True)   # slot -> lane
    slot = torch.empty_like(order)
    slot[order] = torch.arange(count)
    still_in = count - torch.cumsum(torch.bincount(trips.clamp(min=0), minlength=steps + 1), 0)[:steps]
    tables = []
    for k, (value, param) in enumerate(zip(carried, loop.level.program.main.params[1:len(carried) + 1])):
        t = table(k, ((steps + 1) * count, *param.type.shape[1:]), param.type.dtype)
        torch.index_select(rows(value, count), 0, order, out=t[:count])
        tables.append(t)
    per_step = [table(len(carried) + j, (steps * count, *ty.shape[1:]), ty.dtype) for j, ty in enumerate(stacked_types)]
    inputs, advancing = _inputs(loop, env, count, steps, order, tables, per_lane_sizes)
    run = LevelRun()
    run.add(loop.level.compiled, inputs, advancing, count, [t[count:] for t in tables] + per_step, loop.level.checks)
    groups = [(t * count, t * count + n, 0) for t, n in enumerate(still_in.tolist())]
    if run.run(groups) is not None:
        raise IndexError("an index is out of range for its instance's own size")
    final = trips.clamp(min=0) * count + slot
    return [Lanes(t.index_select(0, final)) for t in tables] + [_by_lane(t, steps, count, slot, trips)
                                                                 for t in per_step]


def _by_lane(table: torch.Tensor, steps: int, count: int, slot: torch.Tensor, trips: torch.Tensor) -> Lanes:
    """A stacked value's table (a block of rows per step, in slot order) as one row per lane of
    every step's values, zeros past the lane's own trip count (rows no step wrote)."""
    out = table.view(steps, count, *table.shape[1:]).index_select(1, slot).movedim(1, 0)
    past = torch.arange(steps)[None, :] >= trips[:, None]
    return Lanes(out.masked_fill(past.view(count, steps, *[1] * (out.dim() - 2)), 0))


def _inputs(loop: LoopProgram, env: dict, count: int, steps: int, order: torch.Tensor, tables: list,
            per_lane_sizes) -> tuple[list, list[bool]]:
    """The tensors for the loop program's parameters, and which of them advance a block of
    rows per step (the counter, the carried values)."""
    out, per_step = [], []
    for kind, *which in loop.level.inputs:
        per_step.append(kind == "arg")
        if kind == "arg":
            out.append(torch.arange(steps).repeat_interleave(count) if which[0] == 0 else tables[which[0] - 1])
        elif kind == "root":
            out.append(order)
        elif kind == "sizes":
            out.append(per_lane_sizes[:, which[0]].contiguous())
        else:
            value = env[loop.outside[which[0]].id]
            if kind == "shared":
                out.append(value)
            else:
                stacked = rows(value, count).contiguous()
                out.append(torch.tensor(stacked.shape[1]) if kind == "rows" else
                           stacked.view(-1, *stacked.shape[2:]) if kind == "table" else stacked)
    return out, per_step
