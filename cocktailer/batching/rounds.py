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
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from cocktailer.batching.blocks import LANES
from cocktailer.batching.inspector import CallTree, grow
from cocktailer.batching.levels import LevelProgram, Straight, condition_slice, level_inputs
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
    return RoundProgram(decide, paths, reached, varying)


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


def _run(level: LevelProgram, stacked: list, calls, n: int, per_lane_sizes) -> list[torch.Tensor]:
    """One native call of `level` over the n `calls`; its outputs, short of the index flag."""
    outs = level.compiled(level_inputs(level, stacked, calls, 0, n, None, per_lane_sizes))
    if level.checks:
        if bool(outs[-1]):
            raise IndexError("an index is out of range for its instance's own size")
        outs = outs[:-1]
    return outs
