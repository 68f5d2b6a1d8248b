"""Runs one program for many instances at once: each op once for every lane that reaches it.

- Data ops run batched by their rules (`lanes.py`): a product with a weight is one GEMM over
  the lanes, a per-lane row of a table one gather.
- A branch whose condition differs by lane splits the lanes into two groups; each arm runs
  batched over its group only (ACROBAT's ghost operators: never both arms masked), and the
  results are scattered back into lane order.
- A loop runs while any lane is still in it; lanes whose condition (or trip count) ends leave
  the active set, so finished instances cost nothing more.
- A recursive function runs level by level where an inspector can find the call tree first
  (`recursion.py`, `inspector.py`: Cortex's linearized trees, ACROBAT's inline depth): the
  calls of every instance whose subtrees have the same height run as one batch, children's
  results read from a table. Other recursion runs depth-first, each call batched over the
  lanes that make it.
- Runs of data ops between control-flow ops are native blocks (`blocks.py`), one call each.

The reference executor defines what every op means; this executor is checked against it and
against eager PyTorch per instance (tests/test_batch.py).
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field

import torch

from cocktailer.backend.batched import build_blocks
from cocktailer.batching.blocks import Block, batched_program, lane_mask, lane_varying, run_block, segments
from cocktailer.batching.buckets import bucketed_size, buckets, run_bucketed
from cocktailer.batching.lane_calls import lane_call_size, run_by_lane, worth_it
from cocktailer.batching.inspector import NativeInspector, ReadChildren, inspect, slice_branches
from cocktailer.batching.levels import LevelProgram, level_inputs, level_program, run_level_loop
from cocktailer.batching.loops import (LoopProgram, NestedProgram, any_loop_program, run_loop_program,
                                      run_nested_program, run_while_program)
from cocktailer.batching.lanes import (ARMS, CALLS, CHECKED, HIDDEN, RULES, SHARED_BY_LANES, SIZES, Lanes, Packed,
                                      RowLayout, Split, Table, apply, matmul_per_lane, merged, rows, take)
from cocktailer.batching.ragged import constant_indices, masked_operands, padding_fill, ragged_syms
from cocktailer.batching.recursion import LevelPlan, plan_levels, recursive
from cocktailer.batching.rounds import RoundProgram, round_program, run_round_loop, run_rounds
from cocktailer.codegen.kernels.common import strides_of
from cocktailer.errors import ITERATIONS_EXCEEDED, CompiledCallError
from cocktailer.ir import CREATION, Function, Op, Operation, Program, Region, Sym, SymbolicSizeError
from cocktailer.ir.analysis import value_users
from cocktailer.ir.infer import attrs_at
from cocktailer.reference.executor import RECURSION_LIMIT, _recursion_limit
from cocktailer.runtime.compiler import find_compiler



OUTPUT_REUSE_BYTES = 64 << 10   # native blocks' outputs at least this large reuse the workspace's memory
WORKSPACE_BYTES = 256 << 20     # ... while it holds less than this
LAYOUTS = "layouts"   # env key: (the lanes' sizes, what is made of them: packed layouts, masks: `_kept`)
_MASKED = (Op.MATMUL, Op.SOFTMAX, Op.LOG_SOFTMAX)   # may read padding, which the executor masks (ragged.masked)


@dataclass(frozen=True)
class Techniques:
    """What the batched executor does beyond running each op for all its lanes at once; all on
    by default, turned off one at a time for the ablation (`python -m bench.batching --ablation`)."""
    levels: bool = True            # recursion level by level from an inspector (else depth-first)
    gather_fusion: bool = True     # lanes read operands through index arrays (else each lane's rows are copied)
    parameter_reuse: bool = True   # a product with a shared weight is one GEMM (else one product per lane)
    native_blocks: bool = True     # runs of data ops as one native call each (else one torch op per op)
    native_inspector: bool = True  # call trees found by the control slice compiled to C, or a round at a time by
    #                                native programs (else the executor runs each round)
    level_programs: bool = True    # a level's calls that take the same arms as one native call (else op by op)
    level_loop: bool = True        # a recursion's level programs called by one native loop (else from Python)
    loop_programs: bool = True     # a loop with a straight-line body, every step, as one native call: counted,
    #                                ending on a condition, or holding a counted loop (else Python runs each step)
    block_masks: bool = True       # a softmax or product that reads padding masks it inside its native block
    #                                (else it runs as a torch op, masked by the executor)
    packed_rows: bool = True       # position-wise blocks over a ragged size compute on the instances' real rows
    #                                packed (else on rows padded to the longest)
    buckets: bool = True           # a masked block over instances of very different sizes runs once per bucket
    #                                of similar sizes, padded to its own longest (else once, to the longest of all)
    lane_calls: bool = True        # ... or once per instance at its own size, the instances shared out among
    #                                the workers by a native loop (else in buckets, where those are on)


@dataclass
class Schedule:
    """What the last batched run did, for `explain`."""
    lanes: int = 0
    levels: dict = field(default_factory=dict)        # function -> calls per level (height 0 first)
    depth_first: dict = field(default_factory=dict)   # function -> why it did not run level by level
    branches: int = 0          # branches whose lanes split between the arms
    loop_steps: int = 0        # loop iterations run (each for all the lanes still in the loop)
    inspect_s: float = 0.0     # seconds the inspectors took (finding call trees and their heights)
    inspectors: dict = field(default_factory=dict)   # function -> "native", or why its inspector runs torch ops
    level_groups: dict = field(default_factory=dict)  # function -> [groups run as level programs, groups run op by op]
    level_loops: dict = field(default_factory=dict)   # function -> calls of the native level loop (each runs a
    #                                                   run of groups with level programs)
    loop_programs: int = 0     # runs of loops whose steps all ran as one native call
    stepped_loops: dict = field(default_factory=dict)   # where a loop ran step by step from Python -> why
    packed_rows: int = 0       # rows the position-wise (packed) blocks computed, over all their runs
    padded_rows: int = 0       # rows they would have computed padded to the longest instance
    bucketed_calls: int = 0    # calls of masked blocks, each over a bucket of instances of similar sizes
    lane_calls: int = 0        # calls of masked blocks, each over one instance at its own size


class Workspace:
    """Memory kept from one batched call to the next, for what no call's results outlive (the
    stacked inputs, the results tables of recursions): fresh tensors of megabytes cost a page
    fault per 4 KiB on every call (TreeLSTM at batch 64: 25 ms a call with them, 20 without)."""

    def __init__(self):
        self.buffers: dict[tuple, torch.Tensor] = {}
        self.nbytes = 0

    def take(self, key: tuple, shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An uninitialized tensor, in the memory last taken under `key` where it is large enough."""
        n = math.prod(shape)
        buffer = self.buffers.get(key)
        if buffer is None or buffer.dtype != dtype or buffer.device != device or buffer.numel() < n:
            if buffer is not None:
                self.nbytes -= buffer.numel() * buffer.element_size()
            # (room for a batch a little larger)
            buffer = self.buffers[key] = torch.empty(n + n // 4, dtype=dtype, device=device)
            self.nbytes += buffer.numel() * buffer.element_size()
        return buffer.as_strided(shape, strides_of(shape))   # (a slice and a view took 1.8 us, this 1.4)

    def pointers(self) -> set[int]:
        return {b.untyped_storage().data_ptr() for b in self.buffers.values()}


class BatchedExecutor:
    max_iterations: int | None = None   # the most iterations one run of a loop may take (None: any)

    def __init__(self, program: Program, techniques: Techniques = Techniques()):
        self.program = program
        self.device = torch.device(program.device)
        self.techniques = techniques
        self.take = take if techniques.gather_fusion else _take_copied
        self.rules = RULES if techniques.parameter_reuse else {**RULES, Op.MATMUL: matmul_per_lane}
        self._plans: dict[str, LevelPlan | str | None] = {}
        self._inspectors: dict[str, NativeInspector | str] = {}   # function -> its native inspector, or why none
        self._levels: dict[tuple, LevelProgram | str] = {}   # (function, path, branches) -> its level program, or why
        self._loops: dict[int, LoopProgram | str] = {}   # id(loop op) -> its loop program, or why none
        self._rounds: dict[str, RoundProgram | str] = {}   # function -> its inspector's round program, or why none
        self._level_bindings: dict[str, dict] = {}   # function -> its level loop's programs bound, kept across batches
        self._varying: set[int] | None = None   # the ids of the values that may differ by lane (lane_varying)
        self._producers: dict[int, Operation] | None = None
        self._outside: dict[int, list[int]] = {}   # id(region) -> the ids of the values it reads from outside
        self.sizes: dict = {}   # the sizes every lane of this call shares
        self._padded_sizes: dict = {}   # those and the largest lane's of the others (created tensors are padded)
        self.schedule = Schedule()
        self.ragged = sorted(ragged_syms(program), key=lambda sym: sym.name)
        self._ragged_reads = {sym: (position, dim) for sym, position, dim in reversed(program.sizes)}
        self._checked: dict[int, tuple] = {}   # id(op) -> its per-lane and constant indices into ragged dims
        self._masks: dict[int, list] = {}      # id(op) -> the padding it would read, which is masked (masked_operands)
        self._padded = False   # whether this call's instances differ in a ragged size
        self._segments: dict = {}   # id(region) -> its ops, runs of them as native blocks; (id(region), id(slice))
        #                             -> the same for the ops of a control slice
        self._users: dict[int, set] = {}
        self._sliced: set[int] = set()   # id() of the control slices whose blocks are built
        self._slice_branches: dict[str, tuple | None] = {}   # function -> its slice's branches (slice_branches)
        self.workspace = Workspace()   # stacked inputs and results tables, memory reused by every call
        self._outputs_taken = 0        # native blocks' outputs this call has taken from the workspace
        self._tables_taken = 0
        self.block_notes: list[str] = []
        # native code runs on the CPU's memory: instances on another device run as torch ops
        self._native = find_compiler() is not None and self.device.type == "cpu"
        if techniques.native_blocks and self._native:
            self._build_blocks()

    @property
    def producers(self) -> dict[int, Operation]:
        """The op that defines each value, by id."""
        if self._producers is None:
            self._producers = {r.id: op for op in self.program.walk() for r in op.results}
        return self._producers

    @property
    def varying(self) -> set[int]:
        if self._varying is None:
            self._varying = lane_varying(self.program, set(self.ragged))
        return self._varying

    def _build_blocks(self):
        self._users = {vid: ops for fn in self.program.functions.values() for vid, ops in value_users(fn).items()}
        built = {id(region): segments(region, self.varying, self._users, set(self.ragged), self.producers,
                                      self.techniques.packed_rows, self.techniques.block_masks)
                 for fn in self.program.functions.values() for region in fn.body.regions()}
        self.block_notes = self._compiled(built)

    def _compiled(self, built: dict) -> list[str]:
        """Compile the blocks of `built` (key -> a region's segments) in one library and add the
        segments to the executor's; a block that could not be built runs its ops one by one.
        Returns why those could not."""
        blocks = [b for segs in built.values() for b in segs if isinstance(b, Block)]
        compiled, notes = build_blocks([batched_program(b, self.program) for b in blocks])
        for block, entry in zip(blocks, compiled):
            block.compiled = entry
        for key, segs in built.items():
            self._segments[key] = [part for s in segs
                                   for part in ([s] if not isinstance(s, Block) or s.compiled else s.ops)]
        return notes

    def _build_slice_blocks(self, plan: LevelPlan):
        """Native blocks of a control slice the torch inspector runs (its ops only, region by
        region), built on its first run."""
        if not (self.techniques.native_blocks and self._native) or id(plan.control) in self._sliced:
            return
        self._sliced.add(id(plan.control))
        built = {(id(region), id(plan.control)): segments(_Only(region, plan.control), self.varying, self._users,
                                                          set(self.ragged), self.producers,
                                                          self.techniques.packed_rows, self.techniques.block_masks)
                 for region in plan.function.body.regions()}
        self.block_notes += self._compiled(built)

    def group_key(self, tensors: list[torch.Tensor]) -> tuple:
        """Instances with equal keys run together: every size but the ragged ones must agree."""
        params = self.program.main.params
        return tuple((t.dtype, tuple(None if d in self.ragged else n for d, n in zip(p.type.shape, t.shape)))
                     for p, t in zip(params, tensors))

    def __call__(self, instances: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
        """Each instance's results (one list of inputs each, with equal `group_key`s)."""
        count = len(instances)
        first = instances[0]
        self.sizes = {sym: first[position].shape[dim] for sym, position, dim in self.program.sizes
                      if sym not in self.ragged}
        self.schedule = Schedule(lanes=count)
        self._tables_taken = self._outputs_taken = 0
        lane_sizes = torch.tensor([[inst[self._ragged_reads[sym][0]].shape[self._ragged_reads[sym][1]]
                                    for sym in self.ragged] for inst in instances], dtype=torch.int64)
        # a tensor created with a size that differs by lane is created padded, as the inputs are
        self._padded_sizes = {**self.sizes, **{sym: int(n) for sym, n in
                                                zip(self.ragged, lane_sizes.amax(0).tolist() if count else [])}}
        self._padded = bool((lane_sizes != lane_sizes[:1]).any())   # (else torch's own index checks suffice)
        layouts: dict = {}
        args = [self._stacked(k, column, layouts) for k, column in enumerate(zip(*instances))]
        hidden = {SIZES: Lanes(lane_sizes)} if self.ragged else {}
        with _recursion_limit(RECURSION_LIMIT):   # depth-first recursion costs Python frames per level
            try:
                outs = [rows(v, count) for v in self.run_function(self.program.main, args, count, hidden)]
            except RecursionError:
                raise CompiledCallError("the program recursed deeper than the batched executor supports "
                                        f"(Python recursion limit {RECURSION_LIMIT})") from None
        return self._per_instance(outs, lane_sizes, count)

    def _per_instance(self, outs: list[torch.Tensor], lane_sizes: torch.Tensor, count: int) -> list[list]:
        """Each instance's yields from the batch's (one row per instance): a row each, cut back
        to the instance's sizes; those the boundary reads only as numbers (an alias's flag, its
        index) as Python numbers, read for all instances at once."""
        types = [v.type for v in self.program.main.body.yields]
        numbers = [k in self.program.boundary.numbers and not ty.shape for k, ty in enumerate(types)]
        own = iter(self._memory_of_their_own([out for out, number in zip(outs, numbers) if not number]))
        per_output = []
        for out, ty, number in zip(outs, types, numbers):
            if number:
                per_output.append(out.tolist())
            elif any(d in self.ragged for d in ty.shape):
                own_rows = next(own).unbind(0)
                per_output.append([self._unpadded(row, ty, sizes) for row, sizes in zip(own_rows, lane_sizes)])
            else:
                per_output.append(list(next(own).unbind(0)))
        return [list(results) for results in zip(*per_output)] if per_output else [[] for _ in range(count)]

    def _stacked(self, k: int, column: tuple, layouts: dict) -> Lanes:
        """Input k of every instance as one value, in the workspace. Where only the first dim
        differs (node counts, lengths), every instance's rows one after another (`Packed`):
        position-wise blocks and level programs read them so; a reader of the padded rows pads
        them once. Else each is padded to the largest along the dims where they differ by
        repeating its last element (so that padding holds values the instance has: no division
        by a zero nobody wrote; nothing reads padding, indices are checked). `layouts`: the row
        layout per list of lengths (the tables of a tree share theirs)."""
        first = column[0]
        shapes = [t.shape for t in column]   # (each `t.shape` makes a new object: read once)
        if shapes.count(shapes[0]) == len(shapes):
            return Lanes(torch.stack(column, out=self.workspace.take(("input", k), (len(column), *first.shape),
                                                                   first.dtype, first.device)))
        lengths = tuple(s[0] for s in shapes) if first.dim() else ()
        if lengths and all(lengths) and (first.dim() == 1 or all(s[1:] == shapes[0][1:] for s in shapes)):
            layout = layouts.get(lengths)
            if layout is None:
                layout = layouts[lengths] = RowLayout(torch.tensor(lengths), max(lengths))
            packed = torch.cat(column, out=self.workspace.take(("rows", k), (layout.total, *first.shape[1:]),
                                                               first.dtype, first.device))
            pad_into = functools.partial(self.workspace.take, ("input", k),
                                         (layout.count * layout.width, *first.shape[1:]), first.dtype, first.device)
            return Packed(packed, layout, pad_into=pad_into)
        shape = [max(t.shape[d] for t in column) for d in range(first.dim())]
        return Lanes(torch.stack([_padded(t, shape) for t in column]))

    def _memory_of_their_own(self, outs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The batch's results (one row per instance), each in memory of its own, so that every
        instance's results are fresh tensors (`CompiledFunction._finish` need not check them):
        not the workspace's (the next call reuses it), not a constant's, not another result's,
        and not one row repeated for every instance (a result the same for all, stride 0), which
        would let a write into one instance's result reach the others'."""
        taken = self.workspace.pointers() | {c.untyped_storage().data_ptr() for c in self.program.constants.values()}
        fresh = []
        for out in outs:
            if out.untyped_storage().data_ptr() in taken or (out.dim() and out.stride(0) == 0):
                out = out.clone()
            taken.add(out.untyped_storage().data_ptr())
            fresh.append(out)
        return fresh

    def _unpadded(self, value: torch.Tensor, ty, sizes: torch.Tensor) -> torch.Tensor:
        """One instance's result cut back to its own sizes along the ragged dims."""
        if not any(d in self.ragged for d in ty.shape):
            return value
        return value[tuple(slice(0, int(sizes[self.ragged.index(d)])) if d in self.ragged else slice(None)
                           for d in ty.shape)]

    # ----------------------------------------------------------------------- functions

    def run_function(self, fn: Function, args: list, count: int, hidden: dict) -> list:
        """`hidden`: the caller's per-lane sizes (SIZES), if any."""
        plan = self._plan(fn.name)
        if isinstance(plan, LevelPlan):
            return self._run_levels(plan, args, count, hidden)
        env = {p.id: a for p, a in zip(fn.params, args)}
        env.update(hidden)
        return self.run_region(fn.body, env, count)

    def _plan(self, name: str) -> LevelPlan | str | None:
        """How function `name` runs: by levels (its plan), depth-first (why), or None: it is not
        recursive."""
        if name not in self._plans:
            self._plans[name] = (None if not recursive(self.program, name) else
                                 plan_levels(self.program, name) if self.techniques.levels else "levels are turned off")
        plan = self._plans[name]
        if isinstance(plan, str):
            self.schedule.depth_first[name] = plan
        return plan

    # ----------------------------------------------------------------------- regions and ops

    def run_region(self, region: Region, env: dict, count: int, only: frozenset | None = None) -> list:
        """The region's yields for `count` lanes; with `only`, just those ops (an inspector's
        control slice), and None for the yields they do not compute."""
        parts = self._segments.get(id(region) if only is None else (id(region), id(only)))
        if parts is not None:
            for part in parts:
                if isinstance(part, Block):
                    if self._run_apart(part, env, count):
                        continue
                    layout = None if part.packed is None else self._layout(env, part.packed, count)
                    run_block(part, env, count, layout, [self._mask(env, key, count) for key in part.masks],
                              self._block_output)
                    if layout is not None:
                        self.schedule.packed_rows += layout.total
                        self.schedule.padded_rows += layout.count * layout.width
                else:
                    self.run_op(part, env, count, only)
        else:
            for op in region.ops:
                if only is None or id(op) in only:
                    self.run_op(op, env, count, only)
        return [env.get(v.id) for v in region.yields]

    def _block_output(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """Memory for a native block's output: the n-th large one a call asks for reuses the
        workspace memory the n-th of the last call had (nothing a call returns is in it). Fresh
        megabytes cost a page fault per 4 KiB (a Berxit batch of 64 faulted 4,800 times a call);
        small ones come from the allocator's pools anyway. Fresh where the workspace would pass
        WORKSPACE_BYTES (a long run of stepped loops asks for outputs at every step)."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < OUTPUT_REUSE_BYTES or self.workspace.nbytes + nbytes > WORKSPACE_BYTES:
            return torch.empty(shape, dtype=dtype, device=self.device)
        self._outputs_taken += 1
        return self.workspace.take(("output", self._outputs_taken), shape, dtype, self.device)

    def _run_apart(self, block: Block, env: dict, count: int) -> bool:
        """Run a masked block once per lane at its own size (`lane_calls.py`), else once per
        bucket of lanes of similar size (`buckets.py`), if it may and that costs less than one
        call over all lanes; whether it ran."""
        if block.compiled is None or SIZES not in env:
            return False
        sym = lane_call_size(block, self.ragged) if self.techniques.lane_calls else None
        if sym is not None and worth_it(count, block.compiled.workers):
            run_by_lane(block, env, count, sym, self._layout(env, sym, count), self._block_output, self._lane_scratch)
            self.schedule.lane_calls += count
            return True
        sym = bucketed_size(block, self.ragged) if self.techniques.buckets else None
        if sym is None:
            return False
        layout = self._layout(env, sym, count)
        plan = buckets(layout)
        if plan is None:
            return False
        run_bucketed(block, env, count, sym, layout, plan, self._block_output)
        self.schedule.bucketed_calls += len(plan)
        return True

    def _lane_scratch(self, key: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Memory the lane loop's workers compute in, kept from one call to the next."""
        return self.workspace.take(("lane calls", key), (numel,), dtype, self.device)

    def _layout(self, env: dict, sym: Sym, count: int) -> RowLayout:
        """Where the rows of ragged size `sym` of the env's lanes lie packed, made once per env."""
        kept = self._kept(env)
        layout = kept.get(sym)
        if layout is None:
            layout = kept[sym] = RowLayout(self._lane_sizes(env, sym, count), self._padded_sizes[sym])
        return layout

    def _mask(self, env: dict, key: tuple, count: int) -> torch.Tensor:
        """A block's mask input (`blocks.lane_mask`) for the env's lanes, made once per env."""
        sym, rank, dim = key
        kept = self._kept(env)
        mask = kept.get(key)
        if mask is None:
            mask = kept[key] = lane_mask(self._lane_sizes(env, sym, count), self._padded_sizes[sym], rank, dim)
        return mask

    def _lane_sizes(self, env: dict, sym: Sym, count: int) -> torch.Tensor:
        """Each of the env's lanes' own size `sym` (where it holds none: the padded width)."""
        if SIZES not in env:
            return torch.full((count,), self._padded_sizes[sym], dtype=torch.int64)
        return env[SIZES].rows()[:, self.ragged.index(sym)]

    @staticmethod
    def _kept(env: dict) -> dict:
        """What is made once per env from its lanes' sizes (layouts, masks), kept beside them:
        an env of other lanes has other sizes, and makes its own."""
        sizes = env.get(SIZES)
        kept = env.get(LAYOUTS)
        if kept is None or kept[0] is not sizes:
            kept = env[LAYOUTS] = (sizes, {})
        return kept[1]

    def run_op(self, op: Operation, env: dict, count: int, only: frozenset | None = None):
        kind = op.op
        if kind is Op.IF:
            outs = self._run_if(op, env, count, only)
        elif kind is Op.LOOP:
            outs = self._run_loop(op, env, count)
        elif kind is Op.CALL:
            outs = self._run_call(op, env, count)
        elif kind is Op.CONST:
            outs = [self.program.constants[op.attrs["name"]]]
        elif kind is Op.DIM and op.operands[0].type.shape[op.attrs["dim"]] in self.ragged:
            column = self.ragged.index(op.operands[0].type.shape[op.attrs["dim"]])
            outs = [Lanes(env[SIZES].rows()[:, column])]   # each instance's own size
        else:
            attrs = {**op.attrs, "device": self.program.device} if kind in CREATION else op.attrs
            operands = [env[v.id] for v in op.operands]
            if kind in (Op.SELECT, Op.UPDATE) and self.ragged:
                operands = self._checked_indices(op, operands, env)
            elif kind in _MASKED and self._padded:
                operands = self._masked_padding(op, operands, env, count)
            outs = [apply(op, operands, attrs_at(attrs, self._padded_sizes), count, self.rules)]
        for r, value in zip(op.results, outs):
            if value is not None:
                env[r.id] = value

    def _checked_indices(self, op: Operation, operands: list, env: dict) -> list:
        """A per-lane index into a ragged dim, checked against the lane's own size (padding must
        not be read) and counted from the lane's own end when negative, as eager indexes."""
        if not self._padded or id(op) in env.get(CHECKED, ()):
            return operands
        checks = self._checked.get(id(op))
        if checks is None:
            checks = self._checked[id(op)] = (_ragged_indices(op, self.ragged),
                                              [(dim, self.ragged.index(size), k) for dim, size, k
                                               in constant_indices(op) if size in self.ragged])
        per_lane, constant = checks
        for dim, column, k in constant:   # (from the start: the analysis keeps negative ones equal)
            shortest = self._layout(env, self.ragged[column], env[SIZES].count).shortest   # (made once per env)
            if k >= shortest:
                raise IndexError(f"index {k} is out of bounds for dimension {dim} with size {shortest}")
        if not per_lane:
            return operands
        operands = list(operands)
        sizes = env[SIZES].rows()
        for position, dim, column in per_lane:
            index, limit = operands[position], sizes[:, column]
            raw = index.rows() if isinstance(index, Lanes) else index.expand(len(limit))
            value = torch.where(raw < 0, raw + limit, raw)
            bad = (value < 0) | (value >= limit)
            if bool(bad.any()):
                k = int(torch.nonzero(bad)[0])
                raise IndexError(f"index {int(raw[k])} is out of bounds for dimension {dim} with size {int(limit[k])}")
            operands[position] = Lanes(value)
        return operands

    def _masked_padding(self, op: Operation, operands: list, env: dict, count: int) -> list:
        """The operands of a product that sums over a ragged dim with their padding zeroed, or
        of a softmax along one with its padding at -inf: each lane's result is its own alone."""
        if id(op) not in self._masks:
            self._masks[id(op)] = masked_operands(op, self.ragged)
        if not self._masks[id(op)]:
            return operands
        operands = list(operands)
        for k, dim, size in self._masks[id(op)]:
            operands[k] = _fill_padding(rows(operands[k], count), dim, env[SIZES].rows()[:, self.ragged.index(size)],
                                        padding_fill(op))
        return operands

    def _restricted(self, owner, env: dict, lanes: torch.Tensor | None) -> dict:
        """An env for running the regions of `owner` (an op, or one region) on the lanes `lanes`
        of the current ones (all: None): the values they read from outside, and the hidden keys."""
        outside = self._outside.get(id(owner))
        if outside is None:
            regions = owner.regions if isinstance(owner, Operation) else [owner]
            outside = self._outside[id(owner)] = list({v.id for r in regions for v in r.outside_reads()})
        sub = {vid: env[vid] for vid in outside if vid in env}
        for key in HIDDEN:
            if key in env:
                sub[key] = env[key]
        if lanes is not None:
            sub = {k: (self.take(v, lanes) if k not in SHARED_BY_LANES else v) for k, v in sub.items()}
        return sub

    def _run_if(self, op: Operation, env: dict, count: int, only: frozenset | None) -> list:
        cond = env[op.operands[0].id]
        then, other = op.regions
        if only is not None and ARMS in env:
            env[ARMS].note(op, env, cond, count)
        if not isinstance(cond, Lanes):
            return self.run_region(then if bool(cond) else other, env, count, only)
        taken = cond.rows()
        chosen = torch.nonzero(taken).flatten()
        if len(chosen) in (0, count):
            return self.run_region(then if len(chosen) else other, env, count, only)
        rest = torch.nonzero(~taken).flatten()
        if only is None:   # (not the inspector's)
            self.schedule.branches += 1
        arms = [(lanes, self.run_region(region, self._restricted(region, env, lanes), len(lanes), only))
                for lanes, region in ((chosen, then), (rest, other))]
        return [self._scatter(arms, k, r.type.dtype, count) for k, r in enumerate(op.results)]

    @staticmethod
    def _scatter(arms: list, k: int, dtype: torch.dtype, count: int):
        """Result k of a branch, each arm's rows put back in lane order."""
        values = [(lanes, outs[k]) for lanes, outs in arms]
        if any(v is None for _, v in values):   # an inspector's branch: a result it does not need
            return None
        first = values[0][1]
        if all(isinstance(v, Packed) and v.layout.width == first.layout.width for _, v in values):
            return merged(values, count)   # (real rows only, as the arms computed them)
        return Split(values, count, dtype)   # (put together only if some reader needs every lane)

    def _run_call(self, op: Operation, env: dict, count: int) -> list:
        handler = env.get(CALLS)
        args = [env[v.id] for v in op.operands]
        if handler is not None and op in handler.sites:
            return handler(op, env, count)
        return self.run_function(self.program.functions[op.attrs["callee"]], args, count,
                                 {SIZES: env[SIZES]} if SIZES in env else {})

    # ----------------------------------------------------------------------- loops

    def _run_loop(self, op: Operation, env: dict, count: int) -> list:
        """Runs while any lane is in the loop. A lane whose trip count or condition ends it
        leaves: its carried values are kept aside, and the others run on without it. A loop
        with a loop program runs all its steps in one native call (`loops.py`)."""
        trip = env[op.loop_trip.id] if op.loop_trip is not None else None
        loop = self._loop_program(op)
        if isinstance(loop, (LoopProgram, NestedProgram)):
            return self._run_loop_program(loop, op, env, count, trip)
        trips = trip.rows() if isinstance(trip, Lanes) else None
        stacked_count = op.loop_stacked
        carried = [env[v.id] for v in op.loop_inits]
        finals: list = [None] * len(carried)   # rows of lanes that left the loop, in lane order
        active = None   # the lanes still in the loop (None: all)
        steps: list[tuple] = []   # (the lanes in the loop, the stacked outputs) per iteration
        finished, i = False, 0
        while trips is not None or trip is None or i < int(trip):
            inside = self._restricted(op, env, active)
            done = trips <= i if active is None and trips is not None else (
                trips[active] <= i if trips is not None else None)
            if op.loop_cond is not None:
                cond_env = dict(inside)
                _bind(op.loop_cond, cond_env, i, carried, self.program.device)
                go = self.run_region(op.loop_cond, cond_env, _count(active, count))[0]
                stop = ~go.rows() if isinstance(go, Lanes) else torch.full((_count(active, count),), not bool(go))
                done = stop if done is None else (done | stop)
            if done is not None and bool(done.any()):
                lanes = active if active is not None else torch.arange(count)
                leaving, staying = torch.nonzero(done).flatten(), torch.nonzero(~done).flatten()
                finals = [_keep(f, c, lanes[leaving], leaving, count) for f, c in zip(finals, carried)]
                if len(staying) == 0:
                    finished = True
                    break
                carried = [self.take(c, staying) for c in carried]
                active = lanes[staying]
                inside = self._restricted(op, env, active)
            if self.max_iterations is not None and i >= self.max_iterations:
                raise CompiledCallError(f"{ITERATIONS_EXCEEDED} ({self.max_iterations})")
            body_env = dict(inside)
            _bind(op.loop_body, body_env, i, carried, self.program.device)
            yields = self.run_region(op.loop_body, body_env, _count(active, count))
            carried, step = yields[:len(yields) - stacked_count], yields[len(yields) - stacked_count:]
            steps.append((active, step))
            self.schedule.loop_steps += 1
            i += 1
        if finished:
            outs = finals
        elif active is None and all(f is None for f in finals):
            outs = carried
        else:
            lanes = active if active is not None else torch.arange(count)
            outs = [_keep(f, c, lanes, torch.arange(len(lanes)), count) for f, c in zip(finals, carried)]
        return outs + [self._stack([(lanes, s[j]) for lanes, s in steps], r, count)
                       for j, r in enumerate(op.results[len(outs):])]

    def _run_loop_program(self, loop: LoopProgram | NestedProgram, op: Operation, env: dict, count: int,
                          trip) -> list:
        trips = None if trip is None else (trip.rows() if isinstance(trip, Lanes) else trip.reshape(1).expand(count))
        trips = None if trips is None else trips.to(torch.int64)
        sizes = env[SIZES].rows() if SIZES in env else None
        device = self.device
        carried = [env[v.id] for v in op.loop_inits]
        # (a loop's tables are dead when its run returns: its next run reuses them)
        table = lambda k, shape, dtype: self.workspace.take(("loop", id(op), k), shape, dtype, device)   # noqa: E731
        if isinstance(loop, LoopProgram) and loop.cond is not None:
            outs, steps = run_while_program(loop, env, count, trips, carried, sizes, table, self.max_iterations)
        else:
            steps = int(trips.max())
            if self.max_iterations is not None and steps > self.max_iterations:
                raise CompiledCallError(f"{ITERATIONS_EXCEEDED} ({self.max_iterations})")
            if isinstance(loop, NestedProgram):
                outs = run_nested_program(loop, env, count, trips, steps, carried, sizes, table, self.max_iterations)
            else:
                outs = run_loop_program(loop, env, count, trips, steps, carried, sizes, table)
        self.schedule.loop_programs += 1
        self.schedule.loop_steps += max(steps, 0)
        return outs

    def _loop_program(self, op: Operation) -> LoopProgram | NestedProgram | str:
        found = self._straight(self._loops, id(op), self.techniques.loop_programs, "loop programs",
                               lambda: any_loop_program(op, self.program, self.ragged, self.varying, self.producers))
        if isinstance(found, str):
            self.schedule.stepped_loops[_where(op)] = found
        return found

    def _stack(self, steps: list[tuple], result, count: int):
        """A stacked loop output from its per-iteration values. Where lanes left the loop at
        different iterations (a ragged trip count), each lane's rows stop at its own count and
        the rest is padding, cut off where the output leaves the program."""
        if not steps:
            rest = [self._padded_sizes.get(d, 0) if isinstance(d, Sym) else d for d in result.type.shape[1:]]
            return Lanes(torch.empty((count, 0, *rest), dtype=result.type.dtype, device=self.program.device))
        values = [v for _, v in steps]
        if all(lanes is None for lanes, _ in steps):
            if not any(isinstance(v, Lanes) for v in values):
                return torch.stack(values)
            return Lanes(torch.stack([rows(v, count) for v in values], dim=1))
        first = rows(values[0], count if steps[0][0] is None else len(steps[0][0]))
        out = torch.zeros((count, len(steps), *first.shape[1:]), dtype=first.dtype, device=first.device)
        for i, (lanes, v) in enumerate(steps):
            lanes = torch.arange(count) if lanes is None else lanes
            out[lanes, i] = rows(v, len(lanes))
        return Lanes(out)

    # ----------------------------------------------------------------------- recursion by levels

    def _run_levels(self, plan: LevelPlan, args: list, count: int, hidden: dict) -> list:
        native = self._native_inspector(plan)   # (built on first use: not timed as inspection)
        rounds = None
        if isinstance(native, NativeInspector):
            branches = native.rendered.branches
        else:
            if plan.function.name not in self._slice_branches:
                self._slice_branches[plan.function.name] = slice_branches(plan)
            branches = self._slice_branches[plan.function.name]
            rounds = self._round_program(plan, branches)
            if not isinstance(rounds, RoundProgram):
                self._build_slice_blocks(plan)
        # the outer call's arguments every call hands on, one row per instance (native programs' inputs)
        stacked = ([Table(a, count) if through else None for a, through in zip(args, plan.passthrough)]
                   if isinstance(rounds, RoundProgram) or self.techniques.level_programs else None)
        sizes = hidden[SIZES].rows() if SIZES in hidden else None
        start = time.perf_counter()
        if isinstance(native, NativeInspector):
            tree = native(args, count, hidden, self.sizes, self.ragged)
        elif isinstance(rounds, RoundProgram) and self.techniques.level_loop and rounds.looped is None:
            tree = run_round_loop(rounds, plan, args, count, stacked, sizes, RECURSION_LIMIT)
        elif isinstance(rounds, RoundProgram):
            tree = run_rounds(rounds, plan, args, count, stacked, sizes, RECURSION_LIMIT)
        else:
            tree = inspect(self, plan, args, count, hidden, branches, RECURSION_LIMIT)
        self.schedule.inspect_s += time.perf_counter() - start
        fn = plan.function
        tree, groups, outer = tree.by_height(count)
        tables: list[torch.Tensor] | None = None
        counts = self.schedule.level_groups.setdefault(fn.name, [0, 0])
        levels = [self._level_program(plan, path, branches) if path is not None else None for _, _, path in groups]
        for level in levels:
            counts[not isinstance(level, LevelProgram)] += 1
        if any(isinstance(level, LevelProgram) for level in levels):
            tables = [self._table((tree.calls, *t.shape), t.dtype) for t in fn.result_types]
        for run in self._runs(groups, levels):
            if isinstance(run[0][2], LevelProgram) and self.techniques.level_loop:
                run_level_loop(run, stacked, tree, tables, sizes, self._level_bindings.setdefault(fn.name, {}))
                self.schedule.level_loops[fn.name] = self.schedule.level_loops.get(fn.name, 0) + 1
            elif isinstance(run[0][2], LevelProgram):
                for start, end, level in run:
                    _run_level_program(level, level_inputs(level, stacked, tree, start, end, tables, sizes), tables,
                                       start, end)
            else:
                for start, end, _ in run:
                    tables = self._run_level_ops(plan, args, tree, start, end, hidden, tables)
        self.schedule.levels.setdefault(fn.name, []).append(torch.bincount(tree.height).tolist())
        return [Lanes(table, outer) for table in tables]

    def _table(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialized results table from the workspace: the n-th table a call asks for
        reuses the n-th table's memory."""
        self._tables_taken += 1
        return self.workspace.take(("table", self._tables_taken), shape, dtype, self.device)

    def _run_level_ops(self, plan: LevelPlan, args: list, tree, start: int, end: int, hidden: dict,
                       tables: list | None) -> list:
        """The calls start..end-1 of one level run op by op; their results into the tables (made
        here if None). Returns the tables."""
        fn = plan.function
        env = tree.frame(plan, args, start, end, hidden, self.take)
        env[CALLS] = ReadChildren(plan.sites, tree.children, lambda: tables)
        env[CHECKED] = plan.control   # the inspector checked the indices these ops read, for every call
        yields = self.run_region(fn.body, env, end - start)
        if tables is None:
            tables = [self._table((tree.calls, *_row_shape(v)), t.dtype) for v, t in zip(yields, fn.result_types)]
        for table, v in zip(tables, yields):
            table[start:end] = rows(v, end - start)
        return tables

    @staticmethod
    def _runs(groups: list, levels: list) -> list[list[tuple]]:
        """The groups (start, end, their level program or why none) in order, cut into runs of
        those with level programs and runs of those without."""
        runs: list[list[tuple]] = []
        for (start, end, _), level in zip(groups, levels):
            native = isinstance(level, LevelProgram)
            if not runs or native != isinstance(runs[-1][0][2], LevelProgram):
                runs.append([])
            runs[-1].append((start, end, level))
        return runs

    def _round_program(self, plan: LevelPlan, branches: tuple[int, ...] | None) -> RoundProgram | str:
        """The round program of the inspector of `plan`, whose slice has no native tree walk, or
        why it has none (the torch inspector then runs its rounds)."""
        found = self._straight(self._rounds, plan.function.name, self.techniques.native_inspector, "native inspectors",
                               lambda: round_program(plan, self.program, branches, self.ragged))
        if not isinstance(found, RoundProgram):
            self.schedule.inspectors[plan.function.name] += f"; its rounds as native programs: no, {found}"
        elif found.looped is not None and self.techniques.level_loop:
            self.schedule.inspectors[plan.function.name] = f"rounds: {found.looped}"
        else:
            self.schedule.inspectors[plan.function.name] = "round loop" if self.techniques.level_loop else "rounds"
        return found

    def _level_program(self, plan: LevelPlan, path: int, branches: tuple[int, ...]) -> LevelProgram | str:
        """The level program of the calls of `plan` that take the arms `path` (bit b: the first
        arm of branches[b], in the order of the inspector that found them), or why none."""
        return self._straight(self._levels, (plan.function.name, path, branches), self.techniques.level_programs,
                              "level programs", lambda: level_program(plan, self.program, path, branches, self.ragged))

    def _straight(self, cache: dict, key, enabled: bool, what: str, build):
        """cache[key]: what `build()` makes (a LevelProgram, or a LoopProgram holding several),
        compiled, or why there is none; built on first use."""
        if key not in cache:
            if not enabled:
                cache[key] = f"{what} are turned off"
            elif not self._native:
                cache[key] = "no C compiler, or the instances are not on the CPU"
            else:
                try:
                    made = build()
                except (NotImplementedError, SymbolicSizeError) as e:   # (a size it needs as a number)
                    cache[key] = str(e)
                else:
                    levels = made.levels if isinstance(made, (LoopProgram, NestedProgram, RoundProgram)) else [made]
                    compiled, notes = build_blocks([level.program for level in levels])
                    for level, c in zip(levels, compiled):
                        level.compiled = c
                    cache[key] = notes[0] if any(c is None for c in compiled) else made
        return cache[key]

    def _native_inspector(self, plan: LevelPlan) -> NativeInspector | str:
        name = plan.function.name
        if name not in self._inspectors:
            if not self.techniques.native_inspector:
                self._inspectors[name] = "the native inspector is turned off"
            elif not self._native:
                self._inspectors[name] = "no C compiler, or the instances are not on the CPU"
            else:
                try:
                    self._inspectors[name] = NativeInspector(plan, RECURSION_LIMIT)
                except (NotImplementedError, SymbolicSizeError) as e:
                    self._inspectors[name] = str(e)
        found = self._inspectors[name]
        self.schedule.inspectors[name] = "native" if isinstance(found, NativeInspector) else found
        return found


class _Only:
    """A region's ops that are in `only` (a control slice), for `segments`."""

    def __init__(self, region: Region, only: frozenset):
        self.ops = [op for op in region.ops if id(op) in only]


def _run_level_program(level: LevelProgram, inputs: list, tables: list, start: int, end: int):
    """One native call for the calls start..end-1; their results into the tables."""
    outs = level.compiled(inputs)
    if level.checks and bool(outs[-1]):
        raise IndexError("an index is out of range for its instance's own size")
    for table, out in zip(tables, outs):
        table[start:end] = out


def _fill_padding(x: torch.Tensor, dim: int, sizes: torch.Tensor, fill) -> Lanes:
    """x (one row per lane) with `fill` past each lane's own size along its dim `dim`."""
    return Lanes(x.masked_fill(~lane_mask(sizes.to(x.device), x.shape[dim + 1], x.dim() - 1, dim), fill))


def _where(op: Operation) -> str:
    """An op's place in the user's source, for explain."""
    return str(op.loc) if op.loc is not None else f"loop %{op.results[0].id if op.results else '?'}"


def _count(active, count: int) -> int:
    return count if active is None else len(active)


def _bind(region: Region, env: dict, i: int, carried: list, device):
    env[region.params[0].id] = torch.tensor(i, dtype=torch.int64, device=device)
    for p, v in zip(region.params[1:], carried):
        env[p.id] = v


def _keep(final, value, lanes: torch.Tensor, which: torch.Tensor, count: int):
    """`final` (rows in the loop's lane order) with the rows `which` of `value` put at `lanes`."""
    part = rows(take(value, which), len(which))
    if final is None:
        final = Lanes(torch.empty((count, *part.shape[1:]), dtype=part.dtype, device=part.device))
    final.base[lanes] = part
    return final


def _row_shape(value) -> tuple:
    """The shape of one lane's row of a value."""
    return tuple(value.base.shape[1:] if isinstance(value, Lanes) else value.shape)


def _padded(t: torch.Tensor, shape: list[int]) -> torch.Tensor:
    for dim, want in enumerate(shape):
        have = t.shape[dim]
        if have == want:
            continue
        if have == 0:
            t = torch.zeros((*t.shape[:dim], want, *t.shape[dim + 1:]), dtype=t.dtype, device=t.device)
        else:
            t = t.index_select(dim, torch.arange(want, device=t.device).clamp_(max=have - 1))
    return t


def _ragged_indices(op: Operation, ragged: list) -> list[tuple[int, int, int]]:
    """(operand position, dim, ragged column) of each per-lane index of a SELECT/UPDATE that
    indexes a ragged dim."""
    shape = op.operands[0].type.shape
    first = 1 if op.op is Op.SELECT else 2   # UPDATE's operands: (x, v, *dynamic indices)
    found, dim, k = [], 0, 0
    for item in op.attrs["key"]:
        if item[0] == "new":
            continue
        if item[0] == "dyn":
            if dim < len(shape) and shape[dim] in ragged:
                found.append((first + k, dim, ragged.index(shape[dim])))
            k += 1
        dim += 1
    return found


def _take_copied(value, lanes: torch.Tensor):
    """`take` without gather fusion: the lanes' rows copied out (the ablation's baseline)."""
    taken = take(value, lanes)   # (a branch's result may give one arm's value, shared by its lanes)
    return Lanes(taken.rows()) if isinstance(taken, Lanes) else taken
