"""Round programs: the rounds of an inspector whose control slice computes with tensors, each
as a few native calls.

A recursion whose calls depend on values it computes (DRNN expands a node while a gate
computed from the node's state says so) has no scalar tree walk for the native inspector
(`codegen.inspector`). Its inspector finds the call tree a round at a time: the control slice
of every call found in the round before, all instances' calls as one batch (ACROBAT §4.2: the
batch computes what a decision needs, then decides). The torch inspector (`inspector.inspect`)
runs each round op by op through the executor; a round program runs it as

- one program of the ops the slice's branches' conditions read, yielding every call's
  conditions (the arms it takes: its path);
- per set of arms taken, one program of the slice's ops along those arms, run over the round's
  calls that take them (gathered by an index), yielding the arguments of every self-call those
  arms make. The calls each group makes are the next round's.

Both are `levels.Straight` lines. The slice's branches must sit at the top of the body (none
inside another's arm), at most MAX_BRANCHES of them; anything else the straight line cannot
hold raises NotImplementedError, and the torch inspector runs the rounds.

`run_round_loop` runs every round in one call of the native round loop (`codegen.level_loop`),
which numbers the calls as `run_rounds` does; `run_rounds` drives the rounds from Python (the
ablation's "level loop" off, or conditions and arguments the loop cannot hold: `looped`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from cocktailer.backend.batched import LevelRun
from cocktailer.batching.blocks import LANES
from cocktailer.batching.inspector import CallTree, grow
from cocktailer.batching.lanes import rows
from cocktailer.batching.levels import PER_CALL, LevelProgram, Straight, condition_slice, level_inputs
from cocktailer.batching.recursion import LevelPlan
from cocktailer.ir import Op, Operation, Program, Region, TensorType

MAX_BRANCHES = 3   # branches in a slice a round program decides: one program per set of arms, 2**n


@dataclass
class RoundProgram:
    decide: LevelProgram | None        # each call's branch conditions, in the slice's order; None: no branch
    paths: dict[int, LevelProgram]     # for the calls that take the arms `path` (bit b: the first arm of branch
    #                                    b): the varying arguments of each self-call they make
    reached: dict[int, tuple[int, ...]]   # path -> the sites (indices into plan.sites) whose arguments its
    #                                       program yields, in that order
    varying: tuple[int, ...]           # the parameters that change from call to call, in the yields' order
    looped: str | None = None          # why the round loop cannot run these (None: it can)
    calls_cap: int = 4096              # calls the round loop makes room for (grows, and is kept, when a batch
    lanes_cap: int = 1024              # has more), and the widest round
    bindings: dict = field(default_factory=dict)   # the round loop's programs bound, kept across batches
    #                                                (bound at the room above, not at a batch's sizes)
    room: "RoundRoom | None" = None    # the round loop's tables, kept across batches too

    @property
    def levels(self) -> list[LevelProgram]:
        return [*([self.decide] if self.decide is not None else []), *self.paths.values()]


def round_program(plan: LevelPlan, program: Program, branches: tuple[int, ...] | None,
                  ragged: list) -> RoundProgram:
    """The round program of `plan` (not yet compiled); `branches`: the id() of the slice's
    branches, in the order the paths' bits name them (`inspector.slice_branches`)."""
    body = plan.function.body
    top = [op for op in body.ops if op.op is Op.IF and id(op) in plan.control]
    if branches is None or len(top) > MAX_BRANCHES:
        raise NotImplementedError(f"the control slice holds more than {MAX_BRANCHES} branches")
    if tuple(id(op) for op in top) != branches:
        raise NotImplementedError("a branch of the control slice is inside another branch's arm")
    outer = {p.id: ("stacked" if through else "arg", j)
             for j, (p, through) in enumerate(zip(plan.function.params, plan.passthrough))}
    varying = tuple(j for j, through in enumerate(plan.passthrough) if not through)
    decide = None
    if top:
        decide = _per_call(condition_slice(body, top, program, ragged, outer, set(), "")).build()
    paths, reached = {}, {}
    for path in range(2 ** len(top)):
        taken = {id(b): bool(path >> i & 1) for i, b in enumerate(top)}
        reached[path] = tuple(s for s, site in enumerate(plan.sites) if _reached(site, body, top, taken))
        arguments = [plan.sites[s].operands[j] for s in reached[path] for j in varying]
        straight = Straight(Region(list(body.params), body.ops, arguments), program, ragged, outer,
                            taken=taken, only=plan.control)
        paths[path] = _per_call(straight).build()
    return RoundProgram(decide, paths, reached, varying, _why_not_looped(plan, decide, paths, varying))


def _why_not_looped(plan: LevelPlan, decide: LevelProgram | None, paths: dict[int, LevelProgram],
                    varying: tuple[int, ...]) -> str | None:
    """Why the native round loop cannot run this round program (None: it can): it reads each
    condition as a byte per call and writes each self-call's arguments straight into rows of
    a fixed size and the parameter's dtype."""
    params = [plan.function.params[j].type for j in varying]
    if any(not all(isinstance(d, int) for d in t.shape) for t in params):
        return "a varying argument's size differs between calls"
    for level in paths.values():
        made = level.program.main.result_types[:len(level.outputs)]
        if any((t.dtype, tuple(t.shape[1:])) != (p.dtype, tuple(p.shape))
               for k, t in enumerate(made) for p in [params[k % len(params)]]):
            return "a self-call's argument has another dtype or shape than its parameter"
    conditions = [] if decide is None else decide.program.main.result_types[:len(decide.outputs)]
    if any(t.dtype is not torch.bool for t in conditions):
        return "a branch condition is not a bool"
    return None


def _per_call(straight: Straight) -> Straight:
    """`straight` with an input of one row per call (each call's instance), which gives the
    program its lane count whatever else it reads."""
    straight.input(("root",), TensorType((LANES,), torch.int64), lane=True)
    return straight


def _reached(site: Operation, body: Region, top: list[Operation], taken: dict) -> bool:
    """Whether the self-call `site` is made by a call whose top-level branches take `taken`."""
    if any(op is site for op in body.ops):
        return True
    for branch in top:
        for k, arm in enumerate(branch.regions):
            if any(op is site for op in arm.ops):
                return taken[id(branch)] == (k == 0)
    raise NotImplementedError("a self-call is inside a branch of a branch")


def run_rounds(rounds: RoundProgram, plan: LevelPlan, args: list, count: int, stacked: list,
               per_lane_sizes, max_rounds: int) -> CallTree:
    """The call tree, a round at a time (`inspector.grow`), each round by the round program's
    native calls. `stacked`: the outer call's arguments as `lanes.Table`s, where
    every call hands them on (`levels.level_inputs`); `per_lane_sizes`: the instances' sizes of
    their ragged dims."""
    def expand(roots: torch.Tensor, varying: dict, start: int, end: int) -> tuple[list, torch.Tensor]:
        calls = SimpleNamespace(root=roots, arguments=varying)
        path = torch.zeros(end - start, dtype=torch.int64)
        if rounds.decide is not None:
            for b, condition in enumerate(_run(rounds.decide, stacked, calls, end - start, per_lane_sizes)):
                path |= condition.to(torch.int64) << b
        taken = path.unique().tolist()
        made = []
        for p in taken:
            if not rounds.reached[p]:
                continue
            which = None if len(taken) == 1 else torch.nonzero(path == p).flatten()
            group = calls if which is None else SimpleNamespace(
                root=roots.index_select(0, which), arguments={j: a.index_select(0, which) for j, a in varying.items()})
            outs = _run(rounds.paths[p], stacked, group, len(group.root), per_lane_sizes)
            callers = torch.arange(start, end) if which is None else which + start
            width = len(rounds.varying)
            for k, site in enumerate(rounds.reached[p]):
                made.append((site, callers, dict(zip(rounds.varying, outs[k * width:(k + 1) * width]))))
        return made, path
    return grow(plan, args, count, max_rounds, expand)


def run_round_loop(rounds: RoundProgram, plan: LevelPlan, args: list, count: int, stacked: list,
                   per_lane_sizes, max_rounds: int) -> CallTree:
    """The call tree, every round found by one call of the native round loop
    (`codegen.level_loop`); the arguments as `run_rounds`'s. Where the calls or a round do not
    fit the room made for them, again with four times the room (kept for the next batch)."""
    while True:
        tree = _round_loop(rounds, plan, args, count, stacked, per_lane_sizes, max_rounds)
        if tree is not None:
            return tree
        rounds.calls_cap, rounds.lanes_cap = rounds.calls_cap * 4, rounds.lanes_cap * 4


@dataclass
class RoundRoom:
    """The round loop's tables for `calls` call ids and rounds of up to `lanes` calls: kept from
    one batch to the next (DRNN's are megabytes, and fresh pages fault on first touch)."""
    calls: int
    lanes: int
    columns: list[torch.Tensor]   # per call id: its instance, then each varying argument
    scratch: list[torch.Tensor]   # per call of a round: the same, gathered by the arms taken
    cond: list[torch.Tensor]      # per call id: each branch's condition
    kids: torch.Tensor            # per call id and site: the call it makes there (-1: none)
    path: torch.Tensor
    height: torch.Tensor
    order: torch.Tensor


def _room(rounds: RoundProgram, plan: LevelPlan, calls: int, lanes: int) -> RoundRoom:
    """The round loop's tables, made where the room kept is not of this size; no call made yet."""
    room = rounds.room
    if room is None or (room.calls, room.lanes) != (calls, lanes):
        params = plan.function.params
        columns = [torch.empty(calls, dtype=torch.int64),
                   *[torch.empty((calls, *params[j].type.shape), dtype=params[j].type.dtype) for j in rounds.varying]]
        branches = 0 if rounds.decide is None else len(rounds.decide.outputs)
        room = rounds.room = RoundRoom(
            calls, lanes, columns, [torch.empty((lanes, *c.shape[1:]), dtype=c.dtype) for c in columns],
            [torch.empty(calls, dtype=torch.bool) for _ in range(branches)],
            torch.empty((calls, len(plan.sites)), dtype=torch.int64), torch.empty(calls, dtype=torch.int64),
            torch.empty(calls, dtype=torch.int64), torch.empty(lanes, dtype=torch.int64))
    room.kids.fill_(-1)
    room.path.zero_()
    return room


def _round_loop(rounds: RoundProgram, plan: LevelPlan, args: list, count: int, stacked: list, per_lane_sizes,
                max_rounds: int) -> CallTree | None:
    """The call tree from one call of the round loop, or None where it did not fit. The tree's
    tensors are the room's: the next batch overwrites them."""
    calls, lanes = max(rounds.calls_cap, count), max(rounds.lanes_cap, count)
    room = _room(rounds, plan, calls, lanes)
    columns, scratch, cond, kids, path, height = room.columns, room.scratch, room.cond, room.kids, room.path, room.height
    for column, j in zip(columns[1:], rounds.varying):
        column[:count] = rows(args[j], count)

    def per_call(table: list[torch.Tensor]) -> SimpleNamespace:
        return SimpleNamespace(root=table[0], arguments=dict(zip(rounds.varying, table[1:])))

    def bind(level: LevelProgram, table: list[torch.Tensor], outputs: list[torch.Tensor]) -> int:
        inputs = level_inputs(level, stacked, per_call(table), 0, len(table[0]), None, per_lane_sizes)
        return run.add(level.compiled, inputs, [kind in PER_CALL for kind, *_ in level.inputs], lanes, outputs,
                       level.checks)

    run = LevelRun(rounds.bindings)
    decide = None if rounds.decide is None else bind(rounds.decide, columns, cond)
    paths = [None if not rounds.reached[p] else bind(level, scratch, [columns[1 + v] for _ in rounds.reached[p]
                                                                      for v in range(len(rounds.varying))])
             for p, level in sorted(rounds.paths.items())]
    found = run.run_rounds(decide, paths, [rounds.reached[p] for p in sorted(rounds.paths)], len(plan.sites),
                           count, max_rounds, cond, columns, scratch, kids, path, height, room.order)
    if found is None:
        return None
    return CallTree(found, columns[0][:found], {j: c[:found] for j, c in zip(rounds.varying, columns[1:])},
                    {s: kids[:found, s] for s in range(len(plan.sites))}, height[:found], path[:found])


def _run(level: LevelProgram, stacked: list, calls, n: int, per_lane_sizes) -> list[torch.Tensor]:
    """One native call of `level` over the n `calls`; its outputs, short of the index flag."""
    outs = level.compiled(level_inputs(level, stacked, calls, 0, n, None, per_lane_sizes))
    if level.checks:
        if bool(outs[-1]):
            raise IndexError("an index is out of range for its instance's own size")
        outs = outs[:-1]
    return outs
