"""The inspector (ACROBAT's ahead-of-time inspector, Cortex's linearizer) of a recursive function
that runs level by level: every call the instances make, found breadth first by running the
function's control slice (`recursion.LevelPlan.control`); each call's height (leaves 0), which
orders the levels; and, while the levels run, a self-call read from the results table of the
level below instead of made.

Two inspectors find the same call tree:
- `NativeInspector`: the slice compiled to C (`codegen.inspector`), one pass over a queue of
  every instance's calls; for slices of scalar ops over the instance's tables (tree walks);
- `grow`: a whole round of calls at a time, for a slice that computes with tensors (a decision
  computed from a tensor, as DRNN's): each round run as native programs (`rounds.run_rounds`)
  where the slice's branches allow, else by the batched executor (`inspect`: runs of the slice's
  data ops as native blocks, the rest torch ops), for any slice. Both note each call's arms, so
  its levels get level programs.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import torch

from cocktailer.backend.batched import build_inspector
from cocktailer.batching.lanes import ARMS, CALLS, LANE, SIZES, Lanes, Packed, rows
from cocktailer.batching.recursion import LevelPlan
from cocktailer.codegen.inspector import INSPECT_DEEP, INSPECT_FULL, INSPECT_INDEX
from cocktailer.errors import CompiledCallError
from cocktailer.ir import Op, Operation


class ReadChildren:
    """Level mode's self-call: the callee already ran a level below; read its results."""

    def __init__(self, sites: tuple, children: dict, tables):
        self.sites, self.children, self.tables = sites, children, tables

    def __call__(self, op: Operation, env: dict, count: int) -> list:
        # (a call the inspector did not find is -1 here, which index_select refuses)
        child = self.children[self.sites.index(op)].index_select(0, env[LANE].rows())
        return [Lanes(t, child) for t in self.tables()]


class RecordCalls:
    """The inspector's self-call: note which lanes call, with which arguments; run nothing."""

    def __init__(self, plan: LevelPlan):
        self.sites, self.plan = plan.sites, plan
        self.made: list[tuple[int, torch.Tensor, dict]] = []

    def __call__(self, op: Operation, env: dict, count: int) -> list:
        varying = {j: rows(env[v.id], count) for j, v in enumerate(op.operands) if not self.plan.passthrough[j]}
        self.made.append((self.sites.index(op), env[LANE].rows(), varying))
        return [None] * len(op.results)


def slice_branches(plan: LevelPlan) -> tuple[int, ...] | None:
    """The id() of the control slice's branches in program order: bit b of a call's path says
    it took the first arm of the b-th (None: more than a path holds)."""
    found = tuple(id(op) for op in plan.function.body.walk() if op.op is Op.IF and id(op) in plan.control)
    return found if len(found) <= 63 else None


class RecordArms:
    """The torch inspector's branch: note, for each call of a round, the arms it takes."""

    def __init__(self, branches: tuple[int, ...], first: int, calls: int):
        self.bit = {op_id: b for b, op_id in enumerate(branches)}
        self.first = first   # the round's first call id
        self.path = torch.zeros(calls, dtype=torch.int64)

    def note(self, op: Operation, env: dict, cond, count: int):
        taken = cond.rows() if isinstance(cond, Lanes) else torch.full((count,), bool(cond))
        calls = env[LANE].rows() - self.first
        self.path.index_add_(0, calls, taken.to(torch.int64) << self.bit[id(op)])


@dataclass
class CallTree:
    """Every call of a recursive function that the instances make: call c belongs to lane
    `root[c]` of the outer call, takes `arguments[j][c]` for each parameter j that varies, and its
    site s calls `children[s][c]` (-1: that site is not reached). Heights order the levels."""
    calls: int
    root: torch.Tensor
    arguments: dict
    children: dict
    height: torch.Tensor
    path: torch.Tensor | None = None   # the arms each call takes (the native inspector's bits), if known

    def by_height(self, count: int) -> tuple["CallTree", list[tuple[int, int, int | None]], torch.Tensor]:
        """The same calls numbered level by level (height 0 first; within a level by the arms
        they take, where known), so that a group of calls is a range of ids and its roots,
        arguments and results are slices, not gathers; the groups as (start, end, path); and
        where the `count` outer lanes' calls (ids 0..count-1 here) went. The id arithmetic is
        numpy's: on a batch's few thousand calls, twenty torch ops cost more in their overhead
        than in the work (at batch 64, DRNN 256: 0.30 ms of a 2.5 ms call, 0.19 in numpy; RAE
        256: 0.52 ms, 0.32)."""
        height = self.height.numpy()
        path = None if self.path is None else self.path.numpy()
        order = np.argsort(height, kind="stable") if path is None else np.lexsort((path, height))
        position = np.empty_like(order)
        position[order] = np.arange(self.calls)
        index = torch.from_numpy(order)

        def moved(ids: torch.Tensor) -> torch.Tensor:   # (-1: not reached, stays)
            ids = ids.numpy()[order]
            return torch.from_numpy(np.where(ids < 0, ids, position[np.maximum(ids, 0)]))
        height, path = height[order], None if path is None else path[order]
        tree = CallTree(self.calls, self.root.index_select(0, index),
                        {j: a.index_select(0, index) for j, a in self.arguments.items()},
                        {s: moved(c) for s, c in self.children.items()},
                        torch.from_numpy(height), None if path is None else torch.from_numpy(path))
        changed = height[1:] != height[:-1]
        if path is not None:
            changed |= path[1:] != path[:-1]
        ends = (np.flatnonzero(changed) + 1).tolist() + [self.calls]
        starts = [0, *ends[:-1]]
        paths = [None] * len(starts) if path is None else path[starts].tolist()
        return tree, list(zip(starts, ends, paths)), torch.from_numpy(position[:count])

    def frame(self, plan: LevelPlan, args: list, start: int, end: int, hidden: dict, take_lanes) -> dict:
        """The env of the calls start..end-1 (one level, once numbered `by_height`)."""
        return frame(plan, args, self.root[start:end], {j: a[start:end] for j, a in self.arguments.items()},
                     torch.arange(start, end), hidden, take_lanes)


def inspect(executor, plan: LevelPlan, args: list, count: int, hidden: dict,
            branches: tuple[int, ...] | None, max_rounds: int) -> CallTree:
    """The call tree, found by `grow`, each round running the control slice of every call found
    in the round before as one batch (no Python loop over calls) through `executor` (a
    BatchedExecutor). Each call's path (the arms it takes at `branches`, `slice_branches(plan)`)
    is noted too, unless that is None (more branches than a path holds)."""
    def expand(roots: torch.Tensor, varying: dict, start: int, end: int) -> tuple[list, torch.Tensor | None]:
        frontier = torch.arange(start, end)
        env = frame(plan, args, roots, varying, frontier, hidden, executor.take)
        recorder = env[CALLS] = RecordCalls(plan)
        if branches is not None:
            arms = env[ARMS] = RecordArms(branches, start, len(frontier))
        executor.run_region(plan.function.body, env, len(frontier), only=plan.control)
        return recorder.made, arms.path if branches is not None else None
    return grow(plan, args, count, max_rounds, expand)


def grow(plan: LevelPlan, args: list, count: int, max_rounds: int, expand) -> CallTree:
    """The call tree, found breadth first: `expand(roots, varying, start, end)` runs the control
    slice of one round's calls (ids start..end-1, their roots and `varying` arguments, by
    parameter) and returns the calls they make, as (site, the callers' ids, their arguments by
    parameter), and the arms each caller took (None: not noted). Each round's calls get the
    next ids, so a round is a range of ids. Raises past `max_rounds` rounds, as the native
    inspector does past its depth."""
    varying = [j for j, through in enumerate(plan.passthrough) if not through]
    arguments = {j: [rows(args[j], count)] for j in varying}   # per round
    roots = [torch.arange(count)]
    links: list[tuple[int, torch.Tensor, torch.Tensor]] = []   # (site, parent calls, child calls)
    paths = []
    start, total = 0, count
    while total > start:
        if len(paths) == max_rounds:
            raise CompiledCallError(f"the program recursed deeper than the batched executor supports ({max_rounds})")
        made, path = expand(roots[-1], {j: arguments[j][-1] for j in varying}, start, total)
        paths.append(path)
        first, start = start, total
        for site, callers, _ in made:
            links.append((site, callers, torch.arange(total, total + len(callers))))
            total += len(callers)
        if total > start:
            callers = torch.cat([c for _, c, _ in made])
            roots.append(roots[-1].index_select(0, callers - first))
            for j in varying:
                arguments[j].append(torch.cat([args_[j] for _, _, args_ in made]))
    height = torch.zeros(total, dtype=torch.int64)
    for site, parents, children in reversed(links):   # children come after their parents
        height.scatter_reduce_(0, parents, height.index_select(0, children) + 1, "amax")
    children = {s: torch.full((total,), -1, dtype=torch.int64) for s in range(len(plan.sites))}
    for site, parents, kids in links:
        children[site][parents] = kids
    return CallTree(total, torch.cat(roots), {j: torch.cat(a) for j, a in arguments.items()}, children, height,
                    None if any(p is None for p in paths) else torch.cat(paths))


class NativeInspector:
    """The call tree of a level plan whose control slice has a native form (else the
    constructor raises NotImplementedError, saying why)."""

    def __init__(self, plan: LevelPlan, max_depth: int):
        self.plan, self.max_depth = plan, max_depth
        self.rendered, self.entry = build_inspector(plan.function, plan.sites, plan.passthrough, plan.control,
                                                    plan.if_results)
        self.capacity = 1024   # calls; grows (and is kept) when a batch has more

    def __call__(self, args: list, count: int, hidden: dict, sizes: dict, ragged: list) -> CallTree:
        r = self.rendered
        tables = [_table(args[j], count) for j in r.tables]
        per_lane = hidden[SIZES].rows() if SIZES in hidden else None
        syms = torch.stack([per_lane[:, ragged.index(sym)] if sym in ragged else torch.full((count,), sizes[sym])
                            for sym in r.syms], 1).contiguous() if r.syms else torch.zeros(count, 1, dtype=torch.int64)
        args0 = (torch.stack([rows(args[j], count).to(torch.int64) for j in r.varying], 1).contiguous()
                 if r.varying else torch.zeros(count, 1, dtype=torch.int64))
        while True:
            found = self._run(tables, syms, args0, count, max(self.capacity, count))
            if found is not None:
                return found
            self.capacity = max(self.capacity, count) * 4   # more calls than room: again, with more

    def _run(self, tables: list, syms: torch.Tensor, args0: torch.Tensor, count: int, cap: int) -> CallTree | None:
        """The call tree, or None where it has more than `cap` calls. `tables`: (data, each
        instance's first element, strides) each."""
        sites = len(self.plan.sites)
        pointers = (ctypes.c_void_p * max(len(tables), 1))(*[t.data_ptr() for t, _, _ in tables])
        firsts = torch.cat([f for _, f, _ in tables]) if tables else torch.zeros(1, dtype=torch.int64)
        strides = torch.tensor([s for _, _, st in tables for s in st] or [0], dtype=torch.int64)
        root, depth, height, path = (torch.empty(cap, dtype=torch.int64) for _ in range(4))
        arguments = torch.empty(cap, max(len(self.rendered.varying), 1), dtype=torch.int64)
        kids = torch.empty(cap, max(sites, 1), dtype=torch.int64)
        info = torch.zeros(4, dtype=torch.int64)
        n = self.entry(count, pointers, firsts.data_ptr(), strides.data_ptr(), syms.data_ptr(), args0.data_ptr(),
                       cap, self.max_depth, root.data_ptr(), depth.data_ptr(), arguments.data_ptr(),
                       kids.data_ptr(), height.data_ptr(), path.data_ptr(), info.data_ptr())
        if n == INSPECT_FULL:
            return None
        if n == INSPECT_INDEX:
            _, index, dim, size = info.tolist()
            raise IndexError(f"index {index} is out of bounds for dimension {dim} with size {size}")
        if n == INSPECT_DEEP:
            raise CompiledCallError(f"the program recursed deeper than the batched executor supports ({self.max_depth})")
        params = self.plan.function.params
        return CallTree(n, root[:n], {j: arguments[:n, k].to(params[j].type.dtype)
                                      for k, j in enumerate(self.rendered.varying)},
                        {s: kids[:n, s] for s in range(sites)}, height[:n], path[:n])


def _table(value, count: int) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
    """A table as the native inspector reads it in place: (data, each instance's first element
    in it, the strides of an instance's part). Packed rows (a tree's tables, instances of
    different node counts) are read where they lie, not padded to the largest first."""
    if isinstance(value, Packed):
        data = value.packed.contiguous()
        return data, value.layout.offsets * data.stride(0), data.stride()
    data = rows(value, count)
    return data, torch.arange(count, dtype=torch.int64) * data.stride(0), data.stride()[1:]


def frame(plan: LevelPlan, args: list, roots: torch.Tensor, varying: dict, ids: torch.Tensor,
           hidden: dict, take_lanes) -> dict:
    """The env of the calls `ids`: the parameters every self-call hands on are their root
    lane's (read through an index, not copied, with gather fusion), as are the sizes; the
    others their own."""
    env = {key: take_lanes(value, roots) for key, value in hidden.items()}
    for j, p in enumerate(plan.function.params):
        env[p.id] = take_lanes(args[j], roots) if plan.passthrough[j] else Lanes(varying[j])
    env[LANE] = Lanes(ids)
    return env
