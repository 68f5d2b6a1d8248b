"""Scheduling: IR Program -> uProgram.

The interfaces follow Cocktailer's scheduling primitives so that Algorithm 1 (a later issue)
plugs in: `schedule_operator` turns a data op into a uOperator, `schedule_control_flow`
places a control-flow op at a unit level if legal, `set_resource` fixes how many units of a
level a uProgram uses, and `profiler` measures a candidate. `SimplePolicy` is the
baseline: control flow at L1 whenever legal (Constraint 1), each worker runs its own copy
of the control flow and its share of every uOperator, and a global barrier before every op
that reads a buffer written since the last barrier (read after write) or writes a buffer
read or written since then (write after read: the memory plan reuses buffers), and before
every control-flow construct."""
from __future__ import annotations

from typing import Callable

from cocktailer.ir import Op, Operation, Program, Region, Value
from cocktailer.ir.ops import BINARY, UNARY
from cocktailer.schedule.device import Device
from cocktailer.schedule.memory import MemoryPlan
from cocktailer.passes.calls import independent_call_runs
from cocktailer.schedule.utask import Barrier, Block, BranchUTask, FanOut, LoopUTask, UOperator, UProgram, UTaskRef

MAP_OPS = UNARY | BINARY | {Op.WHERE, Op.FULL}


def map_partition(op: Operation) -> tuple[int, int] | None:
    """How a map-style uOperator deals its uTasks: output elements in one contiguous block per
    worker, cut at 64-byte lines (the kernels' `ck_range(n, 64 // itemsize, w, W)`). Two ops
    with the same key give every worker the same elements, so a worker that reads element i
    of a value it wrote itself needs no barrier in between (Rammer: synchronize only where a
    dependency crosses units)."""
    if op.op not in MAP_OPS:
        return None
    out = op.results[0].type
    return out.numel, max(1, 64 // out.dtype.itemsize)


# Below this much work in its largest operator, a program runs on one worker: splitting ops
# that small costs more in barriers than it saves (a batch-1 RNN cell of hidden 8 runs faster
# alone). The profiler-driven policy (Algorithm 1) replaces this rule by measurement.
MIN_WORK_FOR_PARALLELISM = 1 << 15


def op_work(op: Operation) -> int:
    """Multiply-adds of a contraction, elements written otherwise."""
    out = op.results[0].type if op.results else None
    if out is None:
        return 0
    if op.op is Op.MATMUL:
        return out.numel * op.operands[0].type.shape[-1]
    if op.op is Op.CONV2D:
        w = op.operands[1].type.shape
        return out.numel * w[1] * w[2] * w[3]
    return out.numel


def useful_workers(program: Program, available: int) -> int:
    """SetResource for the simple policy: all workers, unless every op is tiny."""
    largest = max((op_work(op) for op in program.walk() if op.op not in (Op.IF, Op.LOOP, Op.CALL)), default=0)
    return available if largest >= MIN_WORK_FOR_PARALLELISM else 1


class SimplePolicy:
    """Control flow at L1; one uTask per worker for every operator; global barriers."""

    def __init__(self, device: Device, profiler: Callable[[UProgram], float] | None = None,
                 can_run_natively: Callable[[Operation], bool] = lambda op: True, fan_out: bool = False):
        self.device = device
        self.fan_out = fan_out              # run adjacent independent calls on worker groups at once
        self.profiler = profiler            # unused by this policy; Algorithm 1 compares candidates with it
        self.can_run_natively = can_run_natively
        self.units = {level.name: level.count for level in device.unit_levels}

    # -- the scheduling primitives ----------------------------------------------------
    def schedule_operator(self, op: Operation) -> UOperator:
        return UOperator(op, self.units["L1"])

    def schedule_control_flow(self, program: Program, level: str) -> tuple[bool, str]:
        """Constraint 1: control flow may sit at L1 only if every data op it controls runs
        on L1 units (here: every op has a native kernel); L0 would split an op's uTasks
        across control-flow copies that disagree, so it is never legal for whole ops."""
        if level == "L0":
            return False, "L0 (SIMD lanes) cannot hold control flow over whole operators"
        unsupported = sorted({op.op.name for op in program.walk() if op.op not in (Op.IF, Op.LOOP, Op.CALL, Op.CONST)
                              and not self.can_run_natively(op)})
        if level == "L1" and unsupported:
            return False, f"ops without a native kernel: {', '.join(unsupported)}"
        return True, f"legal at {level}"

    def set_resource(self, uprogram: UProgram, level: str, units: int):
        self.units[level] = units

    # -- the policy ---------------------------------------------------------------------
    def schedule(self, program: Program, plan: MemoryPlan, control_level: str = "L1") -> UProgram:
        ok, why = self.schedule_control_flow(program, control_level)
        if not ok:
            raise ValueError(f"control flow cannot run at {control_level}: {why}")
        self.plan = plan
        functions = {name: self._block(fn.body) for name, fn in program.functions.items()}
        fan = "; independent calls fan out to worker groups" if self.fan_out else ""
        return UProgram(program, self.device, functions, control_level,
                        [f"control flow at {control_level} ({why}); {self.units['L1']} worker(s); "
                         f"one uTask per worker per operator; global barriers{fan}"])

    def _range(self, v: Value) -> tuple | None:
        """The shared memory a value occupies (inputs and constants are never written;
        locals are per worker)."""
        buf = self.plan.of(v)
        return (buf.space, buf.offset, buf.offset + buf.nbytes) if buf.space in ("arena", "frame") else None

    def _block(self, region: Region) -> Block:
        block = Block()
        read: list[tuple] = []      # (range, partition) read since the last barrier
        written: list[tuple] = []   # (range, partition) written since the last barrier
        fan_outs = {id(run[0]): run for run in independent_call_runs(region)} if self.fan_out else {}
        grouped = {id(op) for run in fan_outs.values() for op in run}
        for op in region.ops:
            if op.regions or op.op is Op.CALL:
                if id(op) in grouped and id(op) not in fan_outs:
                    continue   # scheduled with the first call of its fan-out
                if read or written:
                    block.items.append(Barrier(tuple(op.operands)))
                run = fan_outs.get(id(op))
                block.items.append(FanOut([self._control(c) for c in run], "L1") if run else self._control(op))
                read, written = [], []   # control flow ends with a barrier
                continue
            key = map_partition(op)
            aligned = lambda v: key if key is not None and v.type.shape == op.results[0].type.shape else None
            reads = [(r, aligned(v)) for v in op.reads() if (r := self._range(v)) is not None]
            writes = [(r, key) for v in op.results if (r := self._range(v)) is not None]
            if _conflict(reads, written) or _conflict(writes, read + written):
                block.items.append(Barrier(tuple(op.operands)))
                read, written = [], []
            block.items.append(self.schedule_operator(op))
            read += reads
            written += writes
        return block

    def _control(self, op: Operation):
        if op.op is Op.IF:
            return BranchUTask(op, self._block(op.regions[0]), self._block(op.regions[1]), "L1")
        if op.op is Op.LOOP:
            cond = self._block(op.loop_cond) if op.loop_cond is not None else None
            return LoopUTask(op, self._block(op.loop_body), cond, "L1")
        return UTaskRef(op, op.attrs["callee"], "L1")


def _conflict(accesses: list[tuple], earlier: list[tuple]) -> bool:
    """Whether any access overlaps an earlier one by another worker: same memory, unless both
    cover exactly the same buffer with the same partition (each worker its own elements)."""
    for (x, kx) in accesses:
        for (y, ky) in earlier:
            if x[0] == y[0] and x[1] < y[2] and y[1] < x[2]:
                if not (kx is not None and kx == ky and x == y):
                    return True
    return False
