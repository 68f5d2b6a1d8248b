"""JAX ports of the zoo's models, run the way the Cocktailer paper's JAX baseline ran them:
`jax.jit` over the data flow, loops as `lax.fori_loop` / `lax.while_loop`, branches as
`lax.cond`, and recursion (which `jit` cannot express) in Python, with the straight-line
work between recursive calls in jitted cells.

The port is written from the program cocktailer captures from the torch model, not by hand
per model: the same ops, loops, branches and calls, with the model's weights copied as
numpy arrays. So every model of the zoo has a port the day it lands, and the port's result
can be checked for equality with eager PyTorch on the same inputs.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from cocktailer import pytree
from cocktailer.ir import Function, Op, Operation, Program, Region, Value
from bench.jax_ops import JAX_OPS, np_dtype

# The IR's indices and trip counts are int64; without x64 JAX would silently make them int32.
jax.config.update("jax_enable_x64", True)

RECURSION_LIMIT = 100_000


@dataclass
class Cell:
    """A run of ops of a host-level region that contains no recursion: one jitted call."""
    ops: list[Operation]
    free: list[Value]            # values it reads from before it
    consts: list[str]            # constants it reads
    outs: list[Value]            # values it defines that are read after it
    fn: Callable = field(default=None, repr=False)
    const_args: dict = field(default_factory=dict, repr=False)   # its constants, looked up once


class JaxPort:
    """Call with the model's tensor inputs (flat, as JAX arrays); returns the flat outputs."""

    def __init__(self, program: Program):
        self.program = program
        self.consts = {name: jnp.asarray(t.detach().cpu().numpy()) for name, t in program.constants.items()}
        self.host = host_functions(program)
        self._plans: dict[int, list] = {}

    @staticmethod
    def inputs(tensors: Sequence) -> list:
        """The model's input tensors as JAX arrays (converted once, outside any timing)."""
        return [jnp.asarray(t.detach().cpu().numpy()) for t in tensors]

    def info(self) -> dict:
        cells = sum(isinstance(s, Cell) for plan in self._plans.values() for s in plan)
        if not self.host:
            return {"jit": "whole program", "cells": cells}
        return {"jit": "cells", "cells": cells, "python_recursion": sorted(self.host),
                "note": f"recursion in Python around {cells} jitted cells"}

    def __call__(self, inputs: Sequence) -> list:
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old, RECURSION_LIMIT))
        try:
            outs = self.run_host_function(self.program.main, list(inputs))
        finally:
            sys.setrecursionlimit(old)
        return jax.block_until_ready(outs)

    # -- host level: Python control flow around jitted cells ---------------------------------
    def run_host_function(self, fn: Function, args: list) -> list:
        env = {p.id: a for p, a in zip(fn.params, args)}
        return self.run_host_region(fn.body, env)

    def run_host_region(self, region: Region, env: dict) -> list:
        for step in self._plan(region):
            if isinstance(step, Cell):
                outs = step.fn(step.const_args, *(env[v.id] for v in step.free))
                env.update((v.id, x) for v, x in zip(step.outs, outs))
            else:
                self.run_host_op(step, env)
        return [env[v.id] for v in region.yields]

    def run_host_op(self, op: Operation, env: dict):
        if op.op is Op.IF:   # the condition goes to Python: the device-to-host copy the paper counts
            outs = self.run_host_region(op.regions[0] if bool(env[op.operands[0].id]) else op.regions[1], env)
        elif op.op is Op.LOOP:
            outs = self._host_loop(op, env)
        else:
            outs = self.run_host_function(self.program.functions[op.attrs["callee"]], [env[v.id] for v in op.operands])
        env.update((r.id, x) for r, x in zip(op.results, outs))

    def _host_loop(self, op: Operation, env: dict) -> list:
        trip = int(env[op.loop_trip.id]) if op.loop_trip is not None else None
        carried, i = [env[v.id] for v in op.loop_inits], 0
        while trip is None or i < trip:
            index = jnp.asarray(i, jnp.int64)
            cond = op.loop_cond
            if cond is not None and not bool(self.run_host_region(cond, _bind(cond, env, index, carried))[0]):
                break
            carried = self.run_host_region(op.loop_body, _bind(op.loop_body, env, index, carried))
            i += 1
        return carried

    def _plan(self, region: Region) -> list:
        plan = self._plans.get(id(region))
        if plan is None:
            plan = self._plans[id(region)] = [self._jit(s) if isinstance(s, Cell) else s
                                              for s in split_cells(region, self.is_host_op)]
        return plan

    def _jit(self, cell: Cell) -> Cell:
        def run(consts, *free):
            env = dict(zip((v.id for v in cell.free), free))
            for op in cell.ops:
                self.trace_op(op, env, consts)
            return [env[v.id] for v in cell.outs]
        cell.fn = jax.jit(run)
        cell.const_args = {n: self.consts[n] for n in cell.consts}
        return cell

    def is_host_op(self, op: Operation) -> bool:
        if op.op is Op.CALL:
            return op.attrs["callee"] in self.host
        return any(self.is_host_op(inner) for r in op.regions for inner in r.walk())

    # -- traced level: inside jit, control flow as lax primitives ----------------------------
    def trace_region(self, region: Region, env: dict, consts: dict) -> list:
        for op in region.ops:
            self.trace_op(op, env, consts)
        return [env[v.id] for v in region.yields]

    def trace_op(self, op: Operation, env: dict, consts: dict):
        kind = op.op
        if kind is Op.IF:
            outs = lax.cond(env[op.operands[0].id], *(self._branch(r, op, env, consts) for r in op.regions))
        elif kind is Op.LOOP:
            outs = self._trace_loop(op, env, consts)
        elif kind is Op.CALL:
            fn = self.program.functions[op.attrs["callee"]]
            outs = self.trace_region(fn.body, {p.id: env[v.id] for p, v in zip(fn.params, op.operands)}, consts)
        elif kind is Op.CONST:
            outs = [consts[op.attrs["name"]]]
        else:
            outs = [JAX_OPS[kind](*(env[v.id] for v in op.operands), **_attrs(op))]
        env.update((r.id, _as_type(x, r)) for r, x in zip(op.results, outs))

    def _branch(self, region: Region, op: Operation, env: dict, consts: dict) -> Callable:
        return lambda: [_as_type(x, r) for x, r in zip(self.trace_region(region, dict(env), consts), op.results)]

    def _trace_loop(self, op: Operation, env: dict, consts: dict) -> list:
        trip = env[op.loop_trip.id] if op.loop_trip is not None else None

        def body(i, carried):
            outs = self.trace_region(op.loop_body, _bind(op.loop_body, env, i, carried), consts)
            return [_as_type(x, r) for x, r in zip(outs, op.results)]

        inits = [_as_type(env[v.id], r) for v, r in zip(op.loop_inits, op.results)]
        if op.loop_cond is None:
            return lax.fori_loop(jnp.asarray(0, jnp.int64), trip, body, inits)

        def cond(state):
            i, carried = state
            go = self.trace_region(op.loop_cond, _bind(op.loop_cond, env, i, carried), consts)[0]
            return go if trip is None else jnp.logical_and(i < trip, go)

        return lax.while_loop(cond, lambda s: (s[0] + 1, body(*s)), (jnp.asarray(0, jnp.int64), inits))[1]


def structured(program: Program, outs: list, inputs: list | None = None):
    """The port's flat results in the structure of the model's output (what eager returns).
    Outputs that are views of the inputs (or of each other) are rebuilt on `inputs`, the call's
    torch tensors, as the compiled program's are; a program that writes into its inputs has no
    JAX port (JAX arrays are immutable)."""
    boundary = program.boundary
    if boundary.written or (not boundary.plain and inputs is None):
        raise NotImplementedError("the JAX port returns new arrays only (this program writes into its inputs, "
                                  "or its outputs alias its inputs and the inputs were not given)")
    if boundary.plain:
        outs = [outs[boundary.slots[o.index].value] for o in boundary.outputs]
    else:
        yields = [torch.from_numpy(np.array(o)) for o in outs]
        sizes = {sym: inputs[position].shape[dim] for sym, position, dim in program.sizes}
        outs = boundary.outputs_of(yields, inputs, program.constants, sizes)
    spec, kinds = program.output_spec
    it = iter(outs)
    return pytree.unflatten(spec, [next(it) if is_tensor else value for is_tensor, value in kinds])


def _bind(region: Region, env: dict, index, carried) -> dict:
    local = dict(env)
    local[region.params[0].id] = index
    local.update((p.id, v) for p, v in zip(region.params[1:], carried))
    return local


def _attrs(op: Operation) -> dict:
    if op.op in (Op.RESHAPE, Op.EXPAND):   # the IR's static type has the -1s resolved
        return {"shape": op.results[0].type.shape}
    return op.attrs


def _as_type(x, value: Value):
    want = np_dtype(value.type.dtype)
    return x if x.dtype == want else x.astype(want)


# -- which functions need Python, and how a host-level region splits into jitted cells ---------

def host_functions(program: Program) -> set[str]:
    """Functions that recurse or call one that does: jit cannot trace them."""
    calls = {name: {op.attrs["callee"] for op in fn.body.walk() if op.op is Op.CALL}
             for name, fn in program.functions.items()}
    reach = {name: _reachable(name, calls) for name in calls}
    recursive = {name for name in calls if name in reach[name]}
    return {name for name in calls if recursive & (reach[name] | {name})}


def _reachable(start: str, calls: dict) -> set[str]:
    seen, todo = set(), list(calls[start])
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(calls.get(name, ()))
    return seen


def split_cells(region: Region, is_host: Callable[[Operation], bool]) -> list:
    """The region's ops as maximal runs of jittable ops (Cells) and single host-level ops."""
    steps, run = [], []
    for n, op in enumerate(region.ops):
        if is_host(op):
            if run:
                steps.append(_cell(run, region, n))
            steps.append(op)
            run = []
        else:
            run.append(op)
    if run:
        steps.append(_cell(run, region, len(region.ops)))
    return steps


def _cell(ops: list[Operation], region: Region, end: int) -> Cell:
    defined, used, consts = set(), [], []
    for op in ops:
        for inner in [op, *(o for r in op.regions for o in r.walk())]:
            used += inner.operands
            defined.update(v.id for v in inner.results)
            defined.update(v.id for r in inner.regions for v in r.params)
            used += [v for r in inner.regions for v in r.yields]
            if inner.op is Op.CONST:
                consts.append(inner.attrs["name"])
    later = {v.id for v in region.yields}
    for op in region.ops[end:]:
        for inner in [op, *(o for r in op.regions for o in r.walk())]:
            later.update(v.id for v in inner.operands)
            later.update(v.id for r in inner.regions for v in r.yields)
    free = list({v.id: v for v in used if v.id not in defined}.values())
    outs = [r for op in ops for r in op.results if r.id in later]
    return Cell(ops, free, sorted(set(consts)), outs)
