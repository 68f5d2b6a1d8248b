"""Memory planning (Cocktailer §4.1): every value is placed before the call.

- inputs and constants are bound zero-copy (pointer tables);
- intermediates of the entry function share one scratch arena, reused by liveness;
- each other (recursive) function's values live in a frame of the simulated stack, so that
  recursion needs no allocation: frame k of the stack is `stack + k * frame_bytes`; a
  parameter every call passes an input or constant through (the tree a recursion walks)
  aliases it instead of being copied into each frame;
- loop-carried values get buffers that hold them across iterations (the body's yields are
  copied into them), a loop's condition region reads the same buffers as its body;
- branch results are buffers both branches copy their yields into;
- the entry's results made by its top-level data ops are computed in the caller's output
  buffers, not copied there from the arena at the end;
- loop counters and trip counts are per-worker slots ("locals"), one set per frame;
- values of a symbolic size (`ir.Sym`: known at call time) get slots after the entry
  function's arena, shared by values of the same size whose live intervals do not overlap:
  the runtime computes the slots' offsets from the call's sizes and grows the arena when a
  call needs more than it has (`dynamic`). Inside other (recursive) functions the same slots
  follow each frame's fixed part (`frame_dynamic`): the frame's size is then the call's too;
- calls that fan out (run at once by different worker groups) are live together: each one's
  operands until the last of them starts, the results from the first, so no group writes a
  buffer another group still reads; so are the ops of a wave that runs side by side
  (Rammer's co-scheduling, `schedule.wavefront`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from cocktailer.ir import CONTROL, Function, Op, Operation, Program, Region, Sym, SymbolicSizeError, TensorType, Value
from cocktailer.ir.analysis import independent_call_runs
from cocktailer.schedule.wavefront import co_scheduled

ALIGN = 64


@dataclass
class Buffer:
    space: str      # "input", "const", "arena" (entry function), "frame" (other functions), "local",
                    # "dynamic" (a symbolic size, after the arena), "frame_dynamic" (one after the frame),
                    # "output" (an entry's result computed in the caller's output buffer)
    offset: int     # bytes into arena/frame, index into the input/const/output table, local slot, or dynamic slot
    nbytes: int | None   # None: an input of a symbolic size (read in place, never copied or planned)


@dataclass
class MemoryPlan:
    buffers: dict[int, Buffer] = field(default_factory=dict)        # value id -> buffer
    loop_slots: dict[int, tuple[int, int]] = field(default_factory=dict)  # id(loop op) -> (index slot, trip slot)
    arena_bytes: int = 0
    frame_bytes: int = 0
    locals_per_frame: int = 0
    const_names: list[str] = field(default_factory=list)
    dynamic: list[TensorType] = field(default_factory=list)   # per dynamic slot: the type of its values
    # the same for values of symbolic sizes in a recursive function's frame (after frame_bytes)
    frame_dynamic: list[TensorType] = field(default_factory=list)

    def of(self, value: Value) -> Buffer:
        return self.buffers[value.id]


def _nbytes(value: Value) -> int:
    return value.type.numel * value.type.dtype.itemsize


def _aligned(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN or ALIGN


class _Intervals:
    """Live intervals of one function's values in a pre-order numbering of its ops."""

    def __init__(self, fan_out: bool = False, wave_workers: int = 0, excluded_waves: frozenset = frozenset()):
        self.fan_out = fan_out
        self.wave_workers = wave_workers
        self.excluded_waves = excluded_waves
        self.start: dict[int, int] = {}
        self.end: dict[int, int] = {}
        self.values: dict[int, Value] = {}
        self.last_read: dict[int, int] = {}   # value id -> position of its last read by an op or a yield
        self.position: dict[int, int] = {}    # id(op) -> its position
        self.pos = 0

    def define(self, v: Value, at: int):
        self.values[v.id] = v
        self.start.setdefault(v.id, at)
        self.end[v.id] = max(self.end.get(v.id, at), at)

    def use(self, v: Value, at: int):
        if v.id in self.start:
            self.end[v.id] = max(self.end[v.id], at)

    def read(self, v: Value, at: int):
        self.use(v, at)
        self.last_read[v.id] = max(self.last_read.get(v.id, at), at)

    def walk(self, region: Region):
        together = self._together(region)
        for op in region.ops:
            self.pos += 1
            here = self.position[id(op)] = self.pos
            before, after = together.get(id(op), (0, 0))
            for v in op.operands:
                self.read(v, here + after)
            for r in op.results:          # control-flow results are written inside: live from the start
                self.define(r, here - before)
            for reg in _execution_order(op):
                for p in reg.params:
                    self.define(p, here)
                self.walk(reg)
                self.pos += 1
                for v in reg.yields:
                    self.read(v, self.pos)
            end = self.pos
            for p in (p for reg in op.regions for p in reg.params):
                self.use(p, end)
            for r in op.results:
                self.use(r, end)
            control = list(op.operands) if op.regions else []   # conditions and trip counts are read by every
            if op.op is Op.LOOP and op.loop_cond is not None:   # worker as it enters: keep them until the op ends
                control += op.loop_cond.yields
            for v in control:
                self.use(v, end)
            if op.op is Op.LOOP:          # values read in a loop but defined before it live through it
                self._extend_outer(op, here, end)

    def _extend_outer(self, op: Operation, start: int, end: int):
        for reg in op.regions:
            for v in reg.outside_reads():
                if v.id in self.start and self.start[v.id] < start:
                    self.end[v.id] = max(self.end[v.id], end)

    def _together(self, region: Region) -> dict[int, tuple[int, int]]:
        """id(op) -> (ops that run at the same time before it, after it), for calls that fan
        out and for co-scheduled waves (contiguous in the region: an op takes one position)."""
        runs = independent_call_runs(region) if self.fan_out else []
        if self.wave_workers:
            runs += [[op for op in region.ops if id(op) in wave]
                     for wave in co_scheduled(region, self.wave_workers, self.excluded_waves)]
        return {id(op): (k, len(run) - 1 - k) for run in runs for k, op in enumerate(run)}


def _execution_order(op: Operation) -> list[Region]:
    """A loop's condition runs before its body in every iteration: number it first, or the
    body could reuse the buffer of the flag other workers are still reading."""
    if op.op is Op.LOOP and op.loop_cond is not None:
        return [op.loop_cond, op.loop_body]
    return list(op.regions)


def _pack(intervals: _Intervals, ids: list[int]) -> tuple[dict[int, int], int]:
    """First-fit offsets for values whose live intervals do not overlap."""
    order = sorted(ids, key=lambda i: (intervals.start[i], -_nbytes(intervals.values[i])))
    placed: list[tuple[int, int, int]] = []   # (end, offset, size) of live buffers
    offsets, top = {}, 0
    for vid in order:
        size = _aligned(_nbytes(intervals.values[vid]))
        start = intervals.start[vid]
        placed = [p for p in placed if p[0] >= start]
        offset = 0
        for _, o, s in sorted(placed, key=lambda p: p[1]):
            if offset + size <= o:
                break
            offset = max(offset, o + s)
        offsets[vid] = offset
        placed.append((intervals.end[vid], offset, size))
        top = max(top, offset + size)
    return offsets, top


def _dynamic_slots(intervals: _Intervals, ids: list[int], table: list) -> dict[int, int]:
    """Slots for values of symbolic sizes (new ones appended to `table`: the plan's `dynamic`
    or `frame_dynamic`). Values of the
    same size at every call (the same dtype size times numbers, and the same Syms) whose live
    intervals do not overlap share a slot."""
    slots: dict[int, int] = {}
    free_after: dict[tuple, list[tuple[int, int]]] = {}   # size class -> (end of its last value, slot)
    for vid in sorted(ids, key=lambda i: intervals.start[i]):
        ty = intervals.values[vid].type
        numbers = ty.dtype.itemsize * math.prod(d for d in ty.shape if not isinstance(d, Sym))
        held = free_after.setdefault((numbers, tuple(sorted(s.name for s in ty.syms))), [])
        reusable = [k for k, (end, _) in enumerate(held) if end < intervals.start[vid]]
        if reusable:
            _, slot = held.pop(reusable[0])
        else:
            slot = len(table)
            table.append(ty)
        slots[vid] = slot
        held.append((intervals.end[vid], slot))
    return slots


def _plan_function(fn: Function, plan: MemoryPlan, space: str, fan_out: bool, waves: tuple,
                   passed_through: dict[int, Buffer] | None = None) -> int:
    intervals = _Intervals(fan_out, *waves)
    for p in fn.params:
        intervals.define(p, 0)
    intervals.walk(fn.body)
    intervals.pos += 1
    for v in fn.body.yields:   # what the function returns is read at its end: no update may write it in place
        intervals.read(v, intervals.pos)
    for p in fn.params:   # parameters are copied in by the caller; keep them for the whole call
        intervals.use(p, intervals.pos)

    slots = 0
    skip: set[int] = set()
    for op in fn.body.walk():
        if op.op is Op.CONST:
            name = op.attrs["name"]
            if name not in plan.const_names:
                plan.const_names.append(name)
            plan.buffers[op.results[0].id] = Buffer("const", plan.const_names.index(name), _nbytes(op.results[0]))
            skip.add(op.results[0].id)
        elif op.op is Op.LOOP:
            plan.loop_slots[id(op)] = (slots, slots + 1)
            for reg in op.regions:
                plan.buffers[reg.params[0].id] = Buffer("local", slots, 8)
                skip.add(reg.params[0].id)
            slots += 2
    if space == "arena":
        for i, p in enumerate(fn.params):
            plan.buffers[p.id] = Buffer("input", i, None if p.type.syms else _nbytes(p))
            skip.add(p.id)
    for p in fn.params:
        if passed_through and p.id in passed_through:
            plan.buffers[p.id] = passed_through[p.id]
            skip.add(p.id)

    cond_aliases = {}   # a loop's condition reads the carried buffers of its body
    for op in fn.body.walk():
        if op.op is Op.LOOP and op.loop_cond is not None:
            for c, b in zip(op.loop_cond.params[1:], op.loop_body.params[1:]):
                cond_aliases[c.id] = b.id
                skip.add(c.id)
    in_place = _in_place_updates(fn, intervals, skip)
    if space == "arena":
        for vid, (k, v) in _computed_into_outputs(fn, in_place, skip).items():
            plan.buffers[vid] = Buffer("output", k, None if v.type.syms else _nbytes(v))
            skip.add(vid)
    symbolic = [vid for vid, v in intervals.values.items() if vid not in skip and vid not in in_place and v.type.syms]
    table, dynamic_space = (plan.dynamic, "dynamic") if space == "arena" else (plan.frame_dynamic, "frame_dynamic")
    for vid, slot in _dynamic_slots(intervals, symbolic, table).items():
        plan.buffers[vid] = Buffer(dynamic_space, slot, None)
        skip.add(vid)
    offsets, top = _pack(intervals, [v for v in intervals.values if v not in skip and v not in in_place])
    for vid, off in offsets.items():
        plan.buffers[vid] = Buffer(space, off, _nbytes(intervals.values[vid]))
    for vid, src in in_place.items():   # in program order: a chain of updates ends at its first source
        plan.buffers[vid] = plan.buffers[src]
    for c, b in cond_aliases.items():
        plan.buffers[c] = plan.buffers[b]
    plan.locals_per_frame = max(plan.locals_per_frame, slots)
    return top


def _computed_into_outputs(fn: Function, in_place: dict[int, int], skip: set[int]) -> dict[int, tuple[int, Value]]:
    """The entry's results that its ops can write straight into the caller's output buffers
    (instead of the arena, then copied): made by a data op of the top-level region, returned
    once, and sharing no buffer with another value (an update written in place). A caller
    that hands the same memory as an input and as the output of a SCATTER or UPDATE of that
    input (`batching.loops`, a buffer of all lanes' rows) gets the write in place."""
    made = {r.id for op in fn.body.ops if op.op not in CONTROL and op.op is not Op.CONST for r in op.results}
    shared = set(in_place) | set(in_place.values())
    counts: dict[int, int] = {}
    for v in fn.body.yields:
        counts[v.id] = counts.get(v.id, 0) + 1
    return {v.id: (k, v) for k, v in enumerate(fn.body.yields)
            if v.id in made and counts[v.id] == 1 and v.id not in shared and v.id not in skip}


def _in_place_updates(fn: Function, intervals: _Intervals, skip: set[int]) -> dict[int, int]:
    """UPDATEs that can write into their source's buffer instead of a copy of it: the source
    is a buffer of this plan defined in the same region (a carried value in a loop body, say:
    the KV cache a decoding step writes one row of) and nothing reads it after the update.
    Returns result id -> source id; the two share one live interval."""
    aliases: dict[int, int] = {}
    for region in fn.body.regions():
        local = {p.id for p in region.params} | {r.id for op in region.ops for r in op.results}
        for op in region.ops:
            if op.op is not Op.UPDATE:
                continue
            src, result = op.operands[0], op.results[0]
            if src.id in skip or src.id not in local or src.id not in intervals.start or \
                    intervals.last_read.get(src.id) != intervals.position[id(op)] or \
                    any(v.id == src.id for v in op.operands[1:]):   # also the value written: not in place
                continue
            root = aliases.get(src.id, src.id)
            aliases[result.id] = root
            intervals.end[root] = max(intervals.end[root], intervals.end[result.id])
    return aliases


_UNKNOWN = object()


def _passed_through(program: Program, plan: MemoryPlan) -> dict[int, Buffer]:
    """Parameters to which every call passes the same read-only buffer (an input or a
    constant of the entry function), directly or through the caller's own such parameter, as
    a recursion passes the tree down: they alias that buffer instead of being copied into
    every frame. An optimistic fixpoint over the call sites."""
    source: dict[int, object] = {p.id: _UNKNOWN for name, fn in program.functions.items()
                                 if name != program.entry for p in fn.params}
    sites = [op for op in program.walk() if op.op is Op.CALL]
    changed = True
    while changed:
        changed = False
        for op in sites:
            for v, p in zip(op.operands, program.functions[op.attrs["callee"]].params):
                if v.id in source:   # the caller's own parameter
                    given = source[v.id]
                else:
                    known = plan.buffers.get(v.id)
                    given = known if known is not None and known.space in ("input", "const") else None
                if given is _UNKNOWN or source[p.id] is None or source[p.id] == given:
                    continue
                source[p.id] = given if source[p.id] is _UNKNOWN else None
                changed = True
    return {pid: b for pid, b in source.items() if isinstance(b, Buffer)}


def plan_memory(program: Program, config=None, excluded_waves: frozenset = frozenset()) -> MemoryPlan:
    """`config` (a backend.Config; None: neither of these): with `fan_out`, the placement runs
    independent adjacent calls at once (recursion unroll); with `wavefront`, it co-schedules
    waves on `workers` workers, except the `excluded_waves` (see schedule.wavefront.co_scheduled)."""
    fan_out = config is not None and config.fan_out
    waves = (config.workers if config is not None and config.wavefront else 0, excluded_waves)
    plan = MemoryPlan()
    plan.arena_bytes = _plan_function(program.main, plan, "arena", fan_out, waves)
    passed_through = _passed_through(program, plan)
    for name, fn in program.functions.items():
        if name != program.entry:
            plan.frame_bytes = max(plan.frame_bytes, _plan_function(fn, plan, "frame", fan_out, waves,
                                                                   passed_through))
    plan.locals_per_frame = max(plan.locals_per_frame, 1)
    return plan
