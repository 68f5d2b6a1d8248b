"""Loop programs: a counted loop, every step for every lane, as one call of native code.

A loop whose trip count is known when it starts (`for t in range(n)`, n of each lane's own)
and whose body is a straight line once its branches are decided (`levels.Straight`) runs as
the body's program over `LANES` lanes, called once per step and arm by the native level loop
(`codegen.level_loop`) instead of by Python one step at a time (the Cocktailer part: the
loop's control flow inside the compiled code; the shrinking active set is ACROBAT's):

- every step has a block of L rows (L lanes), holding the lanes still in the loop at that step
  first (the lanes are sorted by trip count, longest first) and, where the body branches, those
  taking the same arms next to each other: each arm runs on its own lanes (ACROBAT's ghost
  operators), never both arms masked. A step is then one group of rows per set of arms taken;
- a branch is decided before the loop runs, for every lane and step at once, by a program of
  the ops its condition reads (the shift/reduce transition of step t, say); a condition that
  reads a carried value keeps the loop stepping in Python, since it is known only step by step;
- each carried value lives in a table of T+1 blocks: step t reads block t and writes block
  t+1, found by offsetting row pointers; where the lanes change order between steps (branches)
  each row reads its lane's previous row through an index (the gather fused into the kernel).
  A lane's final value is in block `trip`, which no later step writes;
- a carried value the body only reads and writes a row at a time (a stack, a cache: `buf[i]`,
  `buf[i] = x`) is not copied per step but kept in one buffer of every lane's rows and written
  in place (a SCATTER into its own buffer), when the step writes it once, after the reads the
  write depends on;
- the counter is an input of one row per lane: block t of it holds t in every row;
- a value stacked from every step (`outs.append(h)` ... `torch.stack(outs)`) lives in a table of
  T blocks, step t writing block t; each lane's rows past its own trip count are zeros
  (padding, as when the executor steps the loop);
- what the body reads from outside the loop: a weight or literal defined again inside (packed
  once, when the program loads: `blocks.constant_source`); another value the same for every
  lane as it is; a value of one row per lane either whole (each lane's row gathered) or, where
  the body indexes it (`x[t]`), one row of it read in the kernel (the gather fused), counted
  from the lane's own end when negative and checked against the lane's own size.

A branch whose arms compute nothing, only choose between two values (`stop = True if
done.all() else stop`), is no branch here: each lane takes its value by a WHERE.

A loop that ends on a condition (`while not done`, a decoder's EOS) has a program of its
condition too, and runs in the native while loop (`codegen.level_loop`): no layout is known
before it runs, so the loop decides step by step which lanes stay (the condition over the rows
of block t), compacts them to the front of the step's rows, and the body reads each one's
carried values through an index (`source`), as a branchy counted loop does. Its body must hold
no other branch. Where a lane is still in the loop after the blocks there is room for, it runs
again with four times as many (kept for the next batch).

A counted loop whose body holds one counted loop (NestedRNN: words, then each word's own
number of inner steps) is a `NestedProgram` of three straight lines, run by the native nested
loop (`codegen.level_loop`): the outer body's ops before the inner loop, over the outer lanes
still in the loop, yielding what the rest of the step reads into tables of a block of rows per
outer step (the inner trip count and initial values among them); the inner body, step by step
over the lanes still in the inner loop, reading those values at each lane's outer row; and the
ops after it, reading each lane's last inner values.

A loop this cannot hold (it holds a call, a loop it cannot nest, a branch inside a branch or
decided by a carried value, or ends on a condition and branches) runs step by step in the
executor, as before.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from cocktailer.backend.batched import LevelRun
from cocktailer.batching.blocks import LANES, constant_source
from cocktailer.batching.lanes import Lanes, Table, rows
from cocktailer.batching.levels import LevelProgram, Straight, chooses_only, condition_slice, one_row
from cocktailer.ir import Op, Operation, Program, Region, TensorType, Value

MAX_BRANCHES = 3   # branches in a loop body a loop program decides: one program per set of arms, 2**n
ADVANCING = ("arg", "root", "source")   # the inputs of one row per step and lane


@dataclass
class LoopProgram:
    paths: dict[int, LevelProgram]   # the body for the lanes that take the arms `path` (bit b: the first arm
    #                                  of the body's b-th branch); {0: body} where it has none
    decide: LevelProgram | None      # the branches' conditions, for any (step, lane) rows; None: no branch
    cond: LevelProgram | None        # the loop's own condition, for the rows of one step; None: a counted loop
    outside: list[Value]             # the values the body reads from outside the loop (`("whole" | "table" | "shared", j)`)
    types: list[TensorType]          # the body's yields, one lane's: the carried values, then the stacked ones
    carried: int                     # how many of its yields are carried values
    kept: frozenset[int]             # the carried values kept in a buffer written in place
    steps_cap: int = 64              # a loop with a condition: the steps it makes room for (grows, and is kept)

    @property
    def levels(self) -> list[LevelProgram]:
        return [*([self.decide] if self.decide is not None else []), *([self.cond] if self.cond is not None else []),
                *self.paths.values()]


def any_loop_program(op: Operation, program: Program, ragged: list, varying: set[int],
                     producers: dict[int, Operation]) -> "LoopProgram | NestedProgram":
    """The loop program of `op`, or its nested program where its body holds a loop."""
    make = nested_program if any(o.op is Op.LOOP for o in op.loop_body.ops) else loop_program
    return make(op, program, ragged, varying, producers)


def loop_program(op: Operation, program: Program, ragged: list, varying: set[int],
                 producers: dict[int, Operation]) -> LoopProgram:
    """The loop program of `op` (not yet compiled). Raises NotImplementedError (why) where the
    loop has none. `varying`: the ids of the values that may differ by lane; `producers`: the
    op that defines each value, by id."""
    body = op.loop_body
    branches = [o for o in body.ops if o.op is Op.IF and not chooses_only(o)]
    if len(branches) > MAX_BRANCHES:
        raise NotImplementedError(f"the body holds more than {MAX_BRANCHES} branches")
    if op.loop_cond is not None and branches:
        raise NotImplementedError("the loop ends on a condition and its body branches")
    if op.loop_cond is not None and op.loop_stacked:   # (the frontend stacks lists only for counted loops)
        raise NotImplementedError("the loop ends on a condition and stacks a value per step")
    carried = len(op.loop_inits)
    kept = frozenset(k for k, p in enumerate(body.params[1:]) if _rows_only(p, k, body))
    if op.loop_cond is not None:
        kept = frozenset(k for k in kept if _rows_only(op.loop_cond.params[1 + k], k, op.loop_cond, carries=False))
    outside = list({v.id: v for region in [body, *([op.loop_cond] if op.loop_cond else [])]
                    for v in region.outside_reads()}.values())
    shared = {}
    for j, v in enumerate(outside):
        source = constant_source(v, producers)
        shared[v.id] = ("stacked", j) if v.id in varying else ("const", source) if source else ("shared", j)
    by_index = branches or op.loop_cond is not None   # lanes change order between steps
    outer = {**shared, body.params[0].id: ("arg", 0)}   # the counter
    for k, p in enumerate(body.params[1:]):
        outer[p.id] = ("buffer", k) if k in kept else ("carried", k) if by_index else ("arg", k + 1)
    paths = {path: _body(body, program, ragged, outer, {id(b): bool(path >> i & 1) for i, b in enumerate(branches)})
             for path in range(2 ** len(branches))}
    decide = _decider(body, branches, program, ragged, outer) if branches else None
    cond = _condition(op.loop_cond, program, ragged, shared, kept) if op.loop_cond is not None else None
    return LoopProgram(paths, decide, cond, outside, [y.type for y in body.yields], carried, kept)


@dataclass
class NestedProgram:
    """A counted loop whose body holds one counted loop, as three programs the native nested
    loop (`codegen.level_loop`) calls per outer step: `pre` (the outer body's ops before the
    inner loop) over the outer lanes still in the loop, then `inner` step by step over the lanes
    still in the inner loop, then `post` (the ops after it)."""
    pre: LevelProgram       # yields `exported` (the inner loop's trip count and inits among them)
    inner: LevelProgram
    post: LevelProgram
    exported: list[Value]   # the values `pre` yields, in order: each in a table of a block of rows per outer step
    trip: int               # which of them is the inner trip count
    inits: list[int]        # which are the inner loop's initial values (copied into its carried tables)
    outside: list[Value]
    types: list[TensorType]   # the outer yields, one lane's
    inner_types: list[TensorType]
    kept: frozenset = frozenset()   # (no carried value is kept in a buffer written in place)

    @property
    def levels(self) -> list[LevelProgram]:
        return [self.pre, self.inner, self.post]


def nested_program(op: Operation, program: Program, ragged: list, varying: set[int],
                   producers: dict[int, Operation]) -> NestedProgram:
    """The nested program of the counted loop `op`, whose body holds one counted loop at its top
    level; raises NotImplementedError (why) where there is none."""
    body = op.loop_body
    loops = [i for i, o in enumerate(body.ops) if o.op is Op.LOOP]
    if len(loops) != 1 or op.loop_cond is not None or op.loop_stacked:
        raise NotImplementedError("the body holds a loop, not one counted loop in a counted loop")
    inner_op = body.ops[loops[0]]
    if inner_op.loop_cond is not None or inner_op.loop_stacked or inner_op.loop_trip is None:
        raise NotImplementedError("the loop in the body ends on a condition or stacks a value per step")
    if inner_op.loop_trip.type.dtype is not torch.int64:
        raise NotImplementedError("the loop in the body counts in another dtype than int64")
    if any(o.op is Op.IF and not chooses_only(o) for region in (body, inner_op.loop_body) for o in region.ops) or \
            any(o.op is Op.LOOP for o in inner_op.loop_body.ops):
        raise NotImplementedError("the body or the loop in it branches or holds another loop")
    pre_ops, post_ops = body.ops[:loops[0]], body.ops[loops[0] + 1:]
    defined_pre = {r.id for o in pre_ops for r in o.results}
    inner_body = inner_op.loop_body
    params = {p.id for p in body.params}
    later = [v for v in [*inner_body.outside_reads(), *Region([], post_ops, body.yields).outside_reads()]
             if v.id in defined_pre or v.id in params]   # (values from outside the loop are read as they are)
    exported = list({v.id: v for v in [inner_op.loop_trip, *inner_op.loop_inits, *later]}.values())
    outside = body.outside_reads()
    shared = {}
    for j, v in enumerate(outside):
        source = constant_source(v, producers)
        shared[v.id] = ("stacked", j) if v.id in varying else ("const", source) if source else ("shared", j)
    # outer body: the counter and carried values one row per lane (the outer lanes sorted, a prefix per step)
    outer = {**shared, body.params[0].id: ("arg", 0)}
    outer.update({p.id: ("arg", k + 1) for k, p in enumerate(body.params[1:])})
    pre = Straight(Region(list(body.params), pre_ops, exported), program, ragged, outer)
    pre.value(body.params[0])   # the counter: an input that advances with the outer steps gives the lane count
    pre = pre.build()
    # inner body: its carried values at `source`, what the outer body made at the lane's outer row
    into = {**shared, inner_body.params[0].id: ("arg", 0)}
    into.update({p.id: ("carried", k) for k, p in enumerate(inner_body.params[1:])})
    into.update({v.id: ("gather", (("exported", j), ("outer_row",))) for j, v in enumerate(exported)})
    inner = Straight(inner_body, program, ragged, into)
    for p in inner_body.params:
        inner.value(p)
    inner = _counted_lanes(inner.build())
    # after: the outer rows again, the inner loop's results at each lane's last inner row
    after = {**outer, **{v.id: ("row", ("exported", j)) for j, v in enumerate(exported) if v.id not in params}}
    after.update({r.id: ("gather", (("inner", k), ("final",))) for k, r in enumerate(inner_op.results)})
    post = Straight(Region(list(body.params), post_ops, body.yields), program, ragged, after)
    post.value(body.params[0])
    post = post.build()
    ids = [v.id for v in exported]
    return NestedProgram(pre, inner, post, exported, ids.index(inner_op.loop_trip.id),
                         [ids.index(v.id) for v in inner_op.loop_inits], outside,
                         [y.type for y in body.yields], [v.type for v in inner_op.loop_inits])


def _condition(region: Region, program: Program, ragged: list, shared: dict, kept: frozenset) -> LevelProgram:
    """The program of the loop's condition over the rows of one step, each lane's carried values
    read from its row as they are (those kept in a buffer, from the buffer)."""
    outer = {**shared, region.params[0].id: ("arg", 0)}
    for k, p in enumerate(region.params[1:]):
        outer[p.id] = ("buffer", k) if k in kept else ("arg", k + 1)
    straight = Straight(region, program, ragged, outer)
    straight.value(region.params[0])   # the counter: an input of one row per (step, lane) gives the lane count
    return _counted_lanes(straight.build())


def _body(body: Region, program: Program, ragged: list, outer: dict, taken: dict) -> LevelProgram:
    straight = Straight(body, program, ragged, outer, taken=taken)
    for p in body.params:   # first, so that the lane count is read from a per-step input
        if outer[p.id][0] != "buffer":
            straight.value(p)
    return _counted_lanes(straight.build())


def _counted_lanes(level: LevelProgram) -> LevelProgram:
    """`level`, which must read its lane count from an input that advances with the steps (a
    program whose per-lane inputs all went unused would have none to read it from)."""
    if not any(sym == LANES and level.inputs[position][0] in ADVANCING for sym, position, _ in level.program.sizes):
        raise NotImplementedError("the lane count is not read from an input that advances with the steps")
    return level


def _decider(body: Region, branches: list[Operation], program: Program, ragged: list, outer: dict) -> LevelProgram:
    """The program of the ops the branches' conditions read (their slice), yielding each
    condition per row: for rows of any steps and lanes at once, since it reads no carried value."""
    straight = condition_slice(body, branches, program, ragged, outer, {p.id for p in body.params[1:]},
                               "a value the loop carries (known only step by step)")
    straight.value(body.params[0])   # the counter: an input of one row per (step, lane) gives the lane count
    return _counted_lanes(straight.build())


def _rows_only(p: Value, k: int, body: Region, carries: bool = True) -> bool:
    """Whether the body uses carried value `p` (k-th) only a row at a time (`p[i]`, `p[i] = x`,
    through the branches it passes) and, where it `carries`, carries its last version on as
    value k (a loop's condition carries nothing)."""
    if p.type.rank < 1:
        return False
    versions = {p.id}

    def region_ok(region: Region) -> bool:
        for o in region.ops:
            for i, v in enumerate(o.operands):
                if v.id in versions and not (o.op in (Op.SELECT, Op.UPDATE) and i == 0 and one_row(o.attrs["key"])):
                    return False
            if o.op is Op.UPDATE and o.operands[0].id in versions:
                versions.add(o.results[0].id)
            if o.op is Op.IF:
                if not all(region_ok(r) for r in o.regions):
                    return False
                for n, r in enumerate(o.results):
                    from_arms = [a.yields[n].id in versions for a in o.regions]
                    if any(from_arms) and not all(from_arms):   # the buffer on one path, another value on the other
                        return False
                    if all(from_arms):
                        versions.add(r.id)
            elif o.regions and any(v.id in versions for r in o.regions for v in r.outside_reads()):
                return False
        return True

    if not carries:
        return region_ok(body) and not any(y.id in versions for y in body.yields)
    return region_ok(body) and body.yields[k].id in versions and \
        all(y.id not in versions for n, y in enumerate(body.yields) if n != k)


# ----------------------------------------------------------------------------- running


@dataclass
class _Layout:
    """Where each lane's row of every step is: block t (rows t*L ..) holds the lanes in the loop
    at step t, ordered by the arms they take, then by trip count (longest first)."""
    order: torch.Tensor     # slot -> lane, longest trip first (block 0's order)
    slot: torch.Tensor      # lane -> slot
    lane_at: torch.Tensor   # row of any block -> its lane (rows past a step's lanes: 0)
    row_of: torch.Tensor    # (steps, L): lane l's row in block t (where it is in the loop)
    groups: list[tuple[int, int, int]]   # (first row, end row, path): the runs of rows taking the same arms


def _active(trips: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (step, lane) pairs of the lanes in the loop at each step, step by step."""
    return torch.nonzero(torch.arange(steps)[:, None] < trips[None, :], as_tuple=True)


def _layout(trips: torch.Tensor, steps: int, count: int, active: tuple, path: torch.Tensor | None) -> _Layout:
    """`active`: `_active(trips, steps)`; `path`: the arms each of those pairs takes (None: no branch)."""
    order = torch.argsort(trips, descending=True, stable=True)
    slot = torch.empty_like(order)
    slot[order] = torch.arange(count)
    t, lane = active
    path = torch.zeros_like(t) if path is None else path
    by = torch.argsort((t * (int(path.max()) + 1) + path) * count + slot[lane])
    t, lane, path = t[by], lane[by], path[by]
    still_in = torch.bincount(t, minlength=steps)
    r = torch.arange(len(t)) - (torch.cumsum(still_in, 0) - still_in)[t]
    rows_ = t * count + r
    lane_at = torch.zeros(steps * count, dtype=torch.int64)
    lane_at[rows_] = lane
    row_of = torch.zeros((steps, count), dtype=torch.int64)
    row_of[t, lane] = r
    change = torch.ones(len(t), dtype=torch.bool)
    change[1:] = (t[1:] != t[:-1]) | (path[1:] != path[:-1])
    starts = torch.nonzero(change).flatten()
    ends = torch.cat([starts[1:], torch.tensor([len(t)])]) - 1
    groups = list(zip(rows_[starts].tolist(), (rows_[ends] + 1).tolist(), path[starts].tolist()))
    return _Layout(order, slot, lane_at, row_of, groups)


def run_loop_program(loop: LoopProgram, env: dict, count: int, trips: torch.Tensor, steps: int, carried: list,
                     per_lane_sizes: torch.Tensor | None, table) -> list:
    """The loop's results (its carried values, then its stacked ones) when every lane has run
    its own trip count (`trips`, one per lane; `steps` the largest), starting from `carried`; `table(k, shape, dtype)`
    gives uninitialized memory for table k (the tables are dead once this returns: nothing it
    returns is in them). Raises IndexError where an index fell outside its lane's size."""
    stacked_types = loop.types[loop.carried:]
    if steps <= 0:
        return carried + [Lanes(torch.empty((count, 0, *ty.shape), dtype=ty.dtype)) for ty in stacked_types]
    active, stacked = _active(trips, steps), {}
    path = _decide(loop, env, count, active, per_lane_sizes, stacked) if loop.decide is not None else None
    layout = _layout(trips, steps, count, active, path)
    tables = _carried_tables(loop, carried, count, steps, layout.order, table)
    per_step = [table(loop.carried + j, (steps * count, *ty.shape), ty.dtype) for j, ty in enumerate(stacked_types)]
    counter = torch.arange(steps).repeat_interleave(count)
    per_row = {"counter": counter, "root": layout.lane_at,   # (sources: only where lanes change order)
               "source": _sources(layout, counter, count) if loop.decide is not None else None}
    run, index = LevelRun(), {}
    for p in sorted({p for _, _, p in layout.groups}):
        level = loop.paths[p]
        inputs, advancing = _inputs(level, loop, env, count, per_row, tables, per_lane_sizes, stacked)
        outputs = _outputs(level, loop, tables, per_step, count)
        widest = max(end - start for start, end, q in layout.groups if q == p)
        index[p] = run.add(level.compiled, inputs, advancing, widest, outputs, level.checks,
                           [kind != "buffer" for kind, _ in level.outputs])
    if run.run([(start, end, index[p]) for start, end, p in layout.groups]) is not None:
        raise IndexError("an index is out of range for its instance's own size")
    lanes = torch.arange(count)
    final = torch.where(trips > 0, trips * count + layout.row_of[(trips - 1).clamp(min=0), lanes], layout.slot)
    return [Lanes(t.view(count, -1, *t.shape[1:]) if k in loop.kept else t.index_select(0, final))
            for k, t in enumerate(tables)] + [_by_lane(t, steps, count, layout, trips) for t in per_step]


def run_while_program(loop: LoopProgram, env: dict, count: int, trips: torch.Tensor | None, carried: list,
                      per_lane_sizes: torch.Tensor | None, table, max_iterations: int | None) -> tuple[list, int]:
    """The carried values of a loop that ends on a condition (`loop.cond`) when every lane has
    left it, and the steps it ran; `trips`: each lane's trip count too, where the loop has one. Where a
    lane is still in the loop after the steps there is room for, again with four times as many
    (kept for the next batch): the body writes only the tables and fresh copies of the buffers
    it keeps, so a run again starts from the same values."""
    while True:
        steps = loop.steps_cap if trips is None else max(int(trips.max()), 0)
        done = _run_while(loop, env, count, trips, carried, per_lane_sizes, table, max_iterations, steps)
        if done is not None:
            return done
        loop.steps_cap *= 4


def _run_while(loop: LoopProgram, env: dict, count: int, trips: torch.Tensor | None, carried: list,
               per_lane_sizes, table, max_iterations: int | None, steps: int) -> tuple[list, int] | None:
    """`run_while_program`'s results, with room for `steps` steps; None where that was too few."""
    tables = _carried_tables(loop, carried, count, steps, torch.arange(count), table)
    rows_ = (steps + 1) * count
    counter, holder, lane_at, source = (torch.zeros(rows_, dtype=torch.int64) for _ in range(4))
    go = torch.empty(rows_, dtype=torch.bool)
    final_row, ran = torch.empty(count, dtype=torch.int64), torch.empty(count, dtype=torch.int64)
    run, stacked = LevelRun(), {}
    inputs, advancing = _inputs(loop.cond, loop, env, count, {"counter": counter, "root": holder}, tables,
                                per_lane_sizes, stacked)
    cond = run.add(loop.cond.compiled, inputs, advancing, count, [go], loop.cond.checks)
    (level,) = loop.paths.values()
    inputs, advancing = _inputs(level, loop, env, count, {"counter": counter, "root": lane_at, "source": source},
                                tables, per_lane_sizes, stacked)
    body = run.add(level.compiled, inputs, advancing, count, _outputs(level, loop, tables, [], count),
                   level.checks, [kind != "buffer" for kind, _ in level.outputs])
    if not run.run_while(cond, body, count, None if trips is None else trips.contiguous(), max_iterations, go,
                         counter, holder, lane_at, source, final_row, ran, steps):
        return None
    return ([Lanes(t.view(count, -1, *t.shape[1:]) if k in loop.kept else t.index_select(0, final_row))
             for k, t in enumerate(tables)], int(ran.max()) if count else 0)


def run_nested_program(nest: NestedProgram, env: dict, count: int, trips: torch.Tensor, steps: int, carried: list,
                       per_lane_sizes: torch.Tensor | None, table, max_iterations: int | None = None) -> list:
    """The carried values of a counted loop holding a counted loop (`nest`) when every lane has
    run its own trip count (`trips`; `steps` the largest); `table` as `run_loop_program`'s.
    Raises where an inner count is past `max_iterations`."""
    if steps <= 0:
        return carried
    layout = _layout(trips, steps, count, _active(trips, steps), None)
    tables = _carried_tables(nest, carried, count, steps, layout.order, table)
    exported = [table(("exported", j), (steps * count, *v.type.shape), v.type.dtype)
                for j, v in enumerate(nest.exported)]
    inner = [table(("inner", k), (3 * count, *ty.shape), ty.dtype) for k, ty in enumerate(nest.inner_types)]
    final = torch.arange(count).repeat(steps)   # an outer row's last inner values: its row of the inner block 0
    counter, lane, source, outer_row = (torch.zeros(count, dtype=torch.int64) for _ in range(4))
    outer_rows = {"counter": torch.arange(steps).repeat_interleave(count), "root": layout.lane_at}
    made = {"exported": exported, "inner": inner}
    stacked, run = {}, LevelRun()

    def bind(level: LevelProgram, per_row: dict, whole: set, outputs: list, start_rows: bool) -> int:
        inputs, advancing = [], []
        for kind, *which in level.inputs:
            if kind in made:   # a table of rows: read whole (gathered at an index) or a row per lane
                inputs.append(made[kind][which[0]])
                advancing.append(kind not in whole)
            elif kind in ("final", "outer_row"):
                inputs.append(per_row[kind])
                advancing.append(True)
            else:
                inputs.append(_input(kind, which, nest, env, count, per_row, tables if start_rows else inner,
                                     per_lane_sizes, stacked))
                advancing.append(kind in ADVANCING)
        return run.add(level.compiled, inputs, advancing, count, outputs, level.checks)

    pre = bind(nest.pre, outer_rows, set(), exported, True)
    inner_rows = {"counter": counter, "root": lane, "source": source, "outer_row": outer_row}
    body = bind(nest.inner, inner_rows, {"exported", "inner"}, inner, False)
    post = bind(nest.post, {**outer_rows, "final": final}, {"inner"}, [t[count:] for t in tables], True)
    active = torch.bincount(_active(trips, steps)[0], minlength=steps)
    run.run_nested((pre, body, post), count, active, exported[nest.trip], [exported[j] for j in nest.inits], inner,
                   [counter, lane, source, outer_row], layout.lane_at, max_iterations)
    lanes = torch.arange(count)
    last = torch.where(trips > 0, trips * count + layout.row_of[(trips - 1).clamp(min=0), lanes], layout.slot)
    return [Lanes(t.index_select(0, last)) for t in tables]


def _carried_tables(loop: LoopProgram | NestedProgram, carried: list, count: int, steps: int, order: torch.Tensor,
                    table) -> list:
    """A table of steps + 1 blocks of `count` rows per carried value, block 0 its initial value
    of each lane in `order`; a buffer kept in place as its own copy (it is returned)."""
    tables = []
    for k, value in enumerate(carried):
        value = rows(value, count)
        if k in loop.kept:
            tables.append(value.clone(memory_format=torch.contiguous_format).view(-1, *value.shape[2:]))
            continue
        t = table(k, ((steps + 1) * count, *value.shape[1:]), value.dtype)
        torch.index_select(value, 0, order, out=t[:count])
        tables.append(t)
    return tables


def _outputs(level: LevelProgram, loop: LoopProgram, tables: list, per_step: list, count: int) -> list:
    """Where the body's outputs go: a carried value's table from block 1 (step t writes block
    t + 1), a kept buffer in place, a stacked value's table from block 0."""
    return [tables[i] if kind == "buffer" else tables[i][count:] if i < loop.carried else per_step[i - loop.carried]
            for kind, i in level.outputs]


def _decide(loop: LoopProgram, env: dict, count: int, active: tuple, per_lane_sizes, stacked: dict) -> torch.Tensor:
    """The arms (a path, bit b the first arm of branch b) each lane takes at each step where it
    is in the loop, in `_active`'s order: the decider's one native call over all those rows."""
    t, lane = active
    level = loop.decide
    inputs, advancing = _inputs(level, loop, env, count, {"counter": t, "root": lane}, [], per_lane_sizes, stacked)
    conditions = [torch.empty(len(t), dtype=torch.bool) for _ in level.outputs]
    run = LevelRun()
    run.add(level.compiled, inputs, advancing, len(t), conditions, level.checks)
    if run.run([(0, len(t), 0)]) is not None:
        raise IndexError("an index is out of range for its instance's own size")
    return sum(c.to(torch.int64) << b for b, c in enumerate(conditions))


def _sources(layout: _Layout, t: torch.Tensor, count: int) -> torch.Tensor:
    """Row r of block t: the row of its carried values' table that holds its lane's values
    after step t - 1 (in block t, where step t - 1 wrote them, or block 0 at the start); `t`:
    each row's step."""
    lane = layout.lane_at
    before = torch.where(t > 0, layout.row_of[(t - 1).clamp(min=0), lane], layout.slot[lane])
    return t * count + before


def _by_lane(table: torch.Tensor, steps: int, count: int, layout: _Layout, trips: torch.Tensor) -> Lanes:
    """A stacked value's table (a block of rows per step) as one row per lane of every step's
    values, zeros past the lane's own trip count (rows no step wrote for it)."""
    at = torch.arange(steps)[None, :] * count + layout.row_of.T
    out = table.index_select(0, at.flatten()).view(count, steps, *table.shape[1:])
    past = torch.arange(steps)[None, :] >= trips[:, None]
    return Lanes(out.masked_fill(past.view(count, steps, *[1] * (out.dim() - 2)), 0))


def _inputs(level: LevelProgram, loop: LoopProgram, env: dict, count: int, per_row: dict, tables: list,
            per_lane_sizes, stacked: dict) -> tuple[list, list[bool]]:
    """The tensors for a program's parameters, and which of them advance a block of rows per
    step (the counter, the lanes, their rows in the tables before, the carried values).
    `stacked`: the values from outside made one row per lane so far, by index (the decider and
    every set of arms read the same ones)."""
    out, advancing = [], []
    for kind, *which in level.inputs:
        advancing.append(kind in ADVANCING)
        out.append(_input(kind, which, loop, env, count, per_row, tables, per_lane_sizes, stacked))
    return out, advancing


def _input(kind: str, which: list, loop, env: dict, count: int, per_row: dict, tables: list, per_lane_sizes,
           stacked: dict) -> torch.Tensor:
    """The tensor for one parameter of a loop's program (`_inputs`)."""
    if kind == "arg":
        return per_row["counter"] if which[0] == 0 else tables[which[0] - 1]
    if kind in ("root", "source"):
        return per_row[kind]
    if kind in ("carried", "buffer"):
        return tables[which[0]]
    if kind == "buffer_rows":
        return torch.tensor(tables[which[0]].shape[0] // count)
    if kind == "sizes":
        return per_lane_sizes[:, which[0]].contiguous()
    value = env[loop.outside[which[0]].id]
    if kind == "shared":
        return value
    if which[0] not in stacked:
        stacked[which[0]] = Table(value, count)
    table = stacked[which[0]]
    return (torch.tensor(table.width) if kind == "rows" else table.flat() if kind == "table" else
            table.offsets() if kind == "offsets" else table.whole())
