"""Placement: IR Program -> uProgram, the simple policy.

Cocktailer's scheduling primitives: `schedule_operator` turns a data op into a uOperator,
`schedule_control_flow` places a control-flow op at a unit level if legal; the worker count
(SetResource) is the configuration's. The simple policy puts control flow at L1 (the
backend has checked Constraint 1: every op has a native kernel): each worker runs its own
copy of the control flow and its share of every uOperator, and a global barrier comes before
every op that reads a buffer written since the last barrier (read after write) or writes a
buffer read or written since then (write after read: the memory plan reuses buffers), and
before every control-flow construct. With `wavefront` (Rammer's co-scheduling), the
independent ops of a wave may instead run side by side on groups of workers (`place_wave`),
and where not every worker must wait for every other, a fine-grained barrier (`Sync`: a step
array of per-worker counters) makes each worker wait only for those it depends on. The
measured policy (`search.py`, Algorithm 1) chooses among configurations of this one."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from cocktailer.ir import Op, Operation, Program, Region, Sym, Value
from cocktailer.ir.analysis import independent_call_runs
from cocktailer.ir.ops import BINARY, UNARY
from cocktailer.schedule.device import Device
from cocktailer.schedule.memory import MemoryPlan
from cocktailer.schedule.wavefront import co_scheduled, op_work
from cocktailer.schedule.utask import Barrier, Block, BranchUTask, FanOut, LoopUTask, Sync, UOperator, UProgram, UTaskRef

MAP_OPS = UNARY | BINARY | {Op.WHERE, Op.FULL, Op.FUSED}


def map_partition(op: Operation) -> tuple[int, int] | None:
    """How a map-style uOperator deals its uTasks: output elements in one contiguous block per
    worker, cut at 64-byte lines (the kernels' `ck_range(n, 64 // itemsize, w, W)`). Two ops
    with the same key give every worker the same elements, so a worker that reads element i
    of a value it wrote itself needs no barrier in between (Rammer: synchronize only where a
    dependency crosses units). A dialect that splits at single elements (`line_shares` False:
    CUDA) gives every op of one count the same shares: the key only distinguishes more."""
    if op.op not in MAP_OPS:
        return None
    out = op.results[0].type   # a symbolic size deals alike wherever it is the same one
    count = math.prod(d for d in out.shape if not isinstance(d, Sym)), tuple(sorted(s.name for s in out.syms))
    return count, max(1, 64 // out.dtype.itemsize)


# Below this much work in its largest operator, a program runs on one worker: splitting ops
# that small costs more in barriers than it saves (a batch-1 RNN cell of hidden 8 runs faster
# alone). The measured policy (Algorithm 1) replaces this rule by measurement.
MIN_WORK_FOR_PARALLELISM = 1 << 15


def useful_workers(program: Program, available: int) -> int:
    """SetResource for the simple policy: all workers, unless every op is tiny."""
    largest = max((op_work(op) for op in program.walk() if op.op not in (Op.IF, Op.LOOP, Op.CALL)), default=0)
    return available if largest >= MIN_WORK_FOR_PARALLELISM else 1


class SimplePolicy:
    """Control flow at L1; one uTask per worker for every operator; global barriers, or with
    wavefront co-scheduling, waves side by side and fine-grained barriers where they apply.
    `config`: a backend.Config with its worker count resolved; `excluded_waves`: waves
    measured slower side by side (backend.waves)."""

    def __init__(self, config, excluded_waves: frozenset = frozenset()):
        self.config = config
        self.device = Device.cuda(config.workers, config.threads) if config.backend == "cuda" \
            else Device.cpu(config.workers)
        self.excluded_waves = excluded_waves
        self.units = {level.name: level.count for level in self.device.unit_levels}

    # -- the scheduling primitives ----------------------------------------------------
    def schedule_operator(self, op: Operation) -> UOperator:
        return UOperator(op, self.units["L1"])

    def schedule_control_flow(self, level: str) -> tuple[bool, str]:
        """Constraint 1 for whole operators: control flow at L0 would split an op's uTasks
        across control-flow copies that disagree, so it is never legal there."""
        if level == "L0":
            return False, "L0 (SIMD lanes) cannot hold control flow over whole operators"
        return True, f"legal at {level}: every op it controls has a native kernel"

    # -- the policy ---------------------------------------------------------------------
    def schedule(self, program: Program, plan: MemoryPlan, control_level: str = "L1") -> UProgram:
        ok, why = self.schedule_control_flow(control_level)
        if not ok:
            raise ValueError(f"control flow cannot run at {control_level}: {why}")
        self.plan = plan
        functions = {name: self._block(fn.body) for name, fn in program.functions.items()}
        c = self.config
        fan = "; independent calls fan out to worker groups" if c.fan_out else ""
        barriers = "global barriers where all wait for all, else fine-grained ones" if c.fine_barriers \
            else "global barriers"
        tasks = ("wavefront: independent operators of a wave side by side on worker groups where balanced, "
                 f"else one uTask per worker; {barriers}" if c.wavefront
                 else "one uTask per worker per operator; global barriers")
        return UProgram(program, self.device, functions, control_level,
                        [f"control flow at {control_level} ({why}); {self.units['L1']} worker(s); {tasks}{fan}"])

    def _range(self, v: Value) -> tuple | None:
        """The shared memory a value occupies (inputs and constants are never written;
        locals are per worker)."""
        buf = self.plan.of(v)
        if buf.space in ("dynamic", "frame_dynamic", "output"):   # a slot (an output buffer) of its own
            return (buf.space, buf.offset, buf.offset + 1)
        return (buf.space, buf.offset, buf.offset + buf.nbytes) if buf.space in ("arena", "frame") else None

    def _block(self, region: Region) -> Block:
        block = Block()
        fine = self.config.fine_barriers
        hazards = _Hazards(self.units["L1"], fine)
        groups = {k: g for wave in co_scheduled(region, self.units["L1"], self.excluded_waves)
                  for k, g in wave.items()} if self.config.wavefront else {}
        fan_outs = {id(run[0]): run for run in independent_call_runs(region)} if self.config.fan_out else {}
        grouped = {id(op) for run in fan_outs.values() for op in run}
        for op in region.ops:
            if op.regions or op.op is Op.CALL:
                if id(op) in grouped and id(op) not in fan_outs:
                    continue   # scheduled with the first call of its fan-out
                if hazards.pending():
                    block.items.append(Barrier(tuple(op.operands)))
                run = fan_outs.get(id(op))
                block.items.append(FanOut([self._control(c) for c in run], "L1") if run else self._control(op))
                hazards = _Hazards(self.units["L1"], fine)   # control flow ends with a barrier
                continue
            group = groups.get(id(op))
            key = map_partition(op)
            aligned = lambda v: key if key is not None and v.type.shape == op.results[0].type.shape else None
            reads = [(r, aligned(v)) for v in op.reads() if (r := self._range(v)) is not None]
            writes = [(r, key) for v in op.results if (r := self._range(v)) is not None]
            waits = hazards.waits(group, reads, writes)
            if waits:
                block.items.append(hazards.synchronize(waits, tuple(op.operands)))
            block.items.append(self.schedule_operator(op) if group is None else UOperator(op, group[1] - group[0], group))
            hazards.record(group, reads, writes)
        return block

    def _control(self, op: Operation):
        if op.op is Op.IF:
            return BranchUTask(op, self._block(op.regions[0]), self._block(op.regions[1]), "L1")
        if op.op is Op.LOOP:
            cond = self._block(op.loop_cond) if op.loop_cond is not None else None
            return LoopUTask(op, self._block(op.loop_body), cond, "L1")
        return UTaskRef(op, op.attrs["callee"], "L1")


class _Hazards:
    """The accesses to shared memory since each worker last synchronized with the workers
    that made them, for choosing where to synchronize and whom to wait for: a worker about
    to read memory another worker wrote, or to write memory another read or wrote, must
    first wait for that worker (read after write, write after read/write: the memory plan
    reuses buffers). Two accesses by the same group to the same buffer with the same map
    partition touch each worker's own elements only, and need no wait."""

    def __init__(self, workers: int, fine: bool = True):
        self.workers = workers
        self.fine = fine   # False: every synchronization is a global barrier
        self._keep([])

    def _keep(self, records: list["_Access"]):
        """The records still pending, and the indexes over them: by place (an access is only
        checked against records of its own slot, or of its own byte space: a host backend's
        block of a thousand ops has a thousand output slots, each checked against every later
        op before), and the newest of each (span, partition, group, write), so that an access
        like one no worker has waited for yet adds nothing (a buffer read by many ops is one
        record)."""
        self.records = records
        self._places: dict[tuple, list[_Access]] = {}
        self._newest: dict[tuple, _Access] = {}
        for r in records:
            self._index(r)

    def _index(self, r: "_Access"):
        self._places.setdefault(_place(r.span), []).append(r)
        self._newest[r.key] = r

    def pending(self) -> bool:
        return bool(self.records)

    def waits(self, group, reads: list[tuple], writes: list[tuple]) -> dict[int, set[int]]:
        """For each worker of `group` (None: all), the workers it must wait for first."""
        accesses = [(a, False) for a in reads] + [(a, True) for a in writes]
        waits: dict[int, set[int]] = {}
        for a, write in accesses:
            for rec in self._places.get(_place(a[0]), ()):
                if not rec.conflicts(a, group, write):
                    continue
                for x in _members(group, self.workers):
                    others = rec.workers - {x}
                    if others and x not in rec.synced:
                        waits.setdefault(x, set()).update(others)
        return waits

    def synchronize(self, waits: dict[int, set[int]], reason: tuple) -> Barrier | Sync:
        """A global barrier where every worker waits for every other; else a fine-grained one."""
        everyone = set(range(self.workers))
        if not self.fine or all(waits.get(x, set()) >= everyone - {x} for x in everyone):
            self._keep([])
            return Barrier(reason)
        for x, on in waits.items():
            for rec in self.records:
                if rec.workers - {x} <= on:
                    rec.synced.add(x)
        self._keep([r for r in self.records if not r.settled(everyone)])
        return Sync({x: tuple(sorted(on)) for x, on in sorted(waits.items())})

    def record(self, group, reads: list[tuple], writes: list[tuple]):
        members = frozenset(_members(group, self.workers))
        for (span, partition), write in [(a, False) for a in reads] + [(a, True) for a in writes]:
            newest = self._newest.get((span, partition, group, write))
            if newest is None or newest.synced:
                access = _Access(span, partition, group, members, write)
                self.records.append(access)
                self._index(access)


# Spaces whose spans are slots of their own (SimplePolicy._range): only the same slot overlaps
_SLOT_SPACES = ("dynamic", "frame_dynamic", "output")


def _place(span: tuple) -> tuple:
    """Where records that may overlap `span` are kept: its slot, or its whole byte space."""
    return (span[0], span[1]) if span[0] in _SLOT_SPACES else (span[0],)


@dataclass
class _Access:
    span: tuple           # (space, begin, end) of shared memory
    partition: tuple | None
    group: tuple | None
    workers: frozenset
    write: bool
    synced: set = field(default_factory=set)   # workers that waited for all of `workers` since

    @property
    def key(self) -> tuple:
        return self.span, self.partition, self.group, self.write

    def conflicts(self, access: tuple, group, write: bool) -> bool:
        span, partition = access
        if not (write or self.write) or span[0] != self.span[0] or not (span[1] < self.span[2] and self.span[1] < span[2]):
            return False
        return not (partition is not None and partition == self.partition and span == self.span and group == self.group)

    def settled(self, everyone: set[int]) -> bool:
        """Every worker has waited for it, or made it alone."""
        return all(x in self.synced or self.workers == {x} for x in everyone)


def _members(group, workers: int) -> range:
    return range(*group) if group is not None else range(workers)
