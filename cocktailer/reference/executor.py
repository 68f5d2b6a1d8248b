"""Runs a Program op by op with torch, control flow in Python. It is the living definition
of the IR's semantics (see cocktailer.ir.ops) and the "reference" backend."""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import Sequence

import torch

from cocktailer.errors import ITERATIONS_EXCEEDED, CompiledCallError
from cocktailer.ir import CREATION, SEMANTICS, Function, Op, Operation, Program, Region, Sym
from cocktailer.ir.infer import attrs_at

# Each level of IR recursion costs a few Python frames here.
RECURSION_LIMIT = 100_000


class ReferenceExecutor:
    max_iterations: int | None = None   # the most iterations one run of a loop may take (None: any)

    def __init__(self, program: Program):
        self.program = program
        self._dead: dict[int, list[list[int]]] = {}   # id(region) -> values to drop after each op
        self._call = threading.local()   # .sizes: this thread's call's symbolic sizes (Sym -> int)

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        self._call.sizes = {sym: inputs[position].shape[dim] for sym, position, dim in self.program.sizes}
        with _recursion_limit(RECURSION_LIMIT):
            try:
                return self.run_function(self.program.main, list(inputs))
            except RecursionError:
                raise CompiledCallError("the program recursed deeper than the reference executor supports "
                                        f"(Python recursion limit {RECURSION_LIMIT})") from None

    def run_function(self, fn: Function, args: list[torch.Tensor]) -> list[torch.Tensor]:
        env = {p.id: a for p, a in zip(fn.params, args)}
        return self.run_region(fn.body, env)

    def run_region(self, region: Region, env: dict) -> list[torch.Tensor]:
        """Runs the ops; a value of this region is dropped after its last use (a ResNet-101
        at batch 64 does not fit in memory with every intermediate kept)."""
        dead = self._dead.get(id(region))
        if dead is None:
            steps = [({v.id for v in op.reads()}, {r.id for r in op.results}) for op in region.ops]
            dead = self._dead[id(region)] = dead_after(region, steps)
        for op, gone in zip(region.ops, dead):
            self.run_op(op, env)
            for vid in gone:
                del env[vid]
        return [env[v.id] for v in region.yields]

    def run_op(self, op: Operation, env: dict):
        kind = op.op
        if kind is Op.IF:
            outs = self.run_region(op.regions[0] if bool(env[op.operands[0].id]) else op.regions[1], env)
        elif kind is Op.LOOP:
            outs = self.run_loop(op, env)
        elif kind is Op.CALL:
            outs = self.run_function(self.program.functions[op.attrs["callee"]], [env[v.id] for v in op.operands])
        elif kind is Op.CONST:
            outs = [self.program.constants[op.attrs["name"]]]
        else:
            attrs = op.attrs
            if kind in CREATION:
                attrs = {**attrs, "device": self.program.device}
            attrs = attrs_at(attrs, getattr(self._call, "sizes", {}))   # a symbolic size in a shape: the call's
            outs = [SEMANTICS[kind](*(env[v.id] for v in op.operands), **attrs)]
        for r, value in zip(op.results, outs):
            env[r.id] = value

    def run_loop(self, op: Operation, env: dict) -> list[torch.Tensor]:
        trip = int(env[op.loop_trip.id]) if op.loop_trip is not None else None
        carried = [env[v.id] for v in op.loop_inits]
        body, cond, k = op.loop_body, op.loop_cond, op.loop_stacked
        steps: list[list[torch.Tensor]] = []   # stacked outputs, per iteration
        i = 0
        while trip is None or i < trip:
            index = torch.tensor(i, dtype=torch.int64, device=self.program.device)
            if cond is not None:
                _bind(cond, env, index, carried)
                if not bool(self.run_region(cond, env)[0]):
                    break
            if self.max_iterations is not None and i >= self.max_iterations:
                raise CompiledCallError(f"{ITERATIONS_EXCEEDED} ({self.max_iterations})")
            _bind(body, env, index, carried)
            yields = self.run_region(body, env)
            carried = yields[:len(yields) - k]
            steps.append(yields[len(yields) - k:])
            i += 1
        return carried + [_stack([s[j] for s in steps], r.type) for j, r in enumerate(op.results[len(carried):])]


def dead_after(region: Region, steps: list[tuple[set[int], set[int]]]) -> list[list[int]]:
    """For each step of `region` (an op, or a group of them), given as (the ids it reads,
    nested regions included; the ids it defines): the values of the region (its parameters
    and what its steps define) that no later step reads and the region does not yield."""
    last = {p.id: 0 for p in region.params}
    for k, (_, defines) in enumerate(steps):
        last.update({vid: k for vid in defines})
    for k, (reads, _) in enumerate(steps):
        for vid in reads & last.keys():
            last[vid] = max(last[vid], k)
    kept = {v.id for v in region.yields}
    dead: list[list[int]] = [[] for _ in steps]
    for vid, k in last.items():
        if vid not in kept and dead:
            dead[k].append(vid)
    return dead


def _stack(values: list[torch.Tensor], ty) -> torch.Tensor:
    if not isinstance(ty.shape[0], Sym) and len(values) != ty.shape[0]:   # a symbolic one ran its call's count
        raise RuntimeError(f"a stacked loop output of {ty.shape[0]} steps ran {len(values)}")
    return torch.stack(values) if values else torch.empty(ty.shape, dtype=ty.dtype)


def _bind(region: Region, env: dict, index: torch.Tensor, carried: list):
    env[region.params[0].id] = index
    for p, v in zip(region.params[1:], carried):
        env[p.id] = v


@contextmanager
def _recursion_limit(limit: int):
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, limit))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)
