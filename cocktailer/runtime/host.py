"""The "host" backend, the paper's CocktailerBase: control flow stays in Python (as in the
reference executor) and each basic block — a maximal run of data ops between control-flow
ops — is one native call. Benchmarks compare it with control flow at L1 to show what
moving control flow into the native program buys."""
from __future__ import annotations

from cocktailer.codegen.renderer import CPU, assemble, render
from cocktailer.ir import Function, Op, Operation, Program, Region, Value
from cocktailer.reference.executor import ReferenceExecutor, dead_after
from cocktailer.runtime.compiler import compile_shared_library
from cocktailer.runtime.cpu import check_native
from cocktailer.runtime.native import CompiledProgram
from cocktailer.schedule import Device, SimplePolicy
from cocktailer.schedule.memory import plan_memory
from cocktailer.codegen import kernels


class _Block:
    def __init__(self, ops: list[Operation], inputs: list[Value], outputs: list[Value]):
        self.ops, self.inputs, self.outputs = ops, inputs, outputs
        self.compiled: CompiledProgram | None = None


def _uses_outside(fn: Function) -> dict[int, set[int]]:
    """value id -> ids of the operations that read it (a read inside an op's regions counts
    as the op's); -1 for a function or region yield."""
    users: dict[int, set[int]] = {}
    for region in fn.body.regions():
        for op in region.ops:
            for v in op.reads():
                users.setdefault(v.id, set()).add(id(op))
        for v in region.yields:
            users.setdefault(v.id, set()).add(-1)
    return users


def _segments(region: Region, users: dict[int, set[int]]) -> list:
    """The region's ops as control-flow ops, constants (run by Python) and blocks."""
    segments, run = [], []

    def close():
        if not run:
            return
        inside = {id(o) for o in run}
        defined = {r.id for o in run for r in o.results}
        inputs = list({v.id: v for o in run for v in o.operands if v.id not in defined}.values())
        outputs = [r for o in run for r in o.results if users.get(r.id, set()) - inside]
        segments.append(_Block(list(run), inputs, outputs))
        run.clear()

    for op in region.ops:
        if op.regions or op.op in (Op.CALL, Op.CONST):
            close()
            segments.append(op)
        else:
            run.append(op)
    close()
    return segments


def _accesses(segment) -> tuple[set[int], set[int]]:
    """(ids read, ids defined) of a control-flow op or a basic block."""
    if isinstance(segment, Operation):
        return {v.id for v in segment.reads()}, {r.id for r in segment.results}
    return {v.id for v in segment.inputs}, {r.id for op in segment.ops for r in op.results}


class HostExecutor(ReferenceExecutor):
    def __init__(self, program: Program, workers: int | None = None):
        super().__init__(program)
        self.library: str | None = None
        check_native(program, "host")
        self.segments: dict[int, list] = {}
        for fn in program.functions.values():
            users = _uses_outside(fn)
            for region in fn.body.regions():
                self.segments[id(region)] = _segments(region, users)
        self._compile(self.blocks, workers)

    def _compile(self, blocks: list[_Block], workers: int | None):
        device = Device.cpu(workers)
        self.workers = device.workers
        parts = []
        for k, block in enumerate(blocks):
            sub = Program({"main": Function("main", Region(block.inputs, block.ops, block.outputs))}, "main",
                          self.program.constants, self.program.device)
            plan = plan_memory(sub)
            uprogram = SimplePolicy(device, can_run_natively=kernels.supported).schedule(sub, plan, "L1")
            parts.append((block, sub, uprogram, render(uprogram, plan, CPU, entry=f"block_{k}")))
        if not parts:
            return
        self.library = str(compile_shared_library(assemble([rendered for *_, rendered in parts])))
        for block, sub, uprogram, rendered in parts:
            block.compiled = CompiledProgram(sub, rendered, self.library, device.workers, 1, uprogram)

    @property
    def identity(self) -> str:
        """Changes whenever the blocks' code or the worker count does (the profiler's cache key)."""
        return f"host:{self.library}:{self.workers}"

    @property
    def blocks(self) -> list[_Block]:
        return [s for segments in self.segments.values() for s in segments if isinstance(s, _Block)]

    def run_region(self, region: Region, env: dict):
        segments = self.segments[id(region)]
        dead = self._dead.get(id(region))
        if dead is None:
            dead = self._dead[id(region)] = dead_after(region, [_accesses(s) for s in segments])
        for segment, gone in zip(segments, dead):
            if isinstance(segment, Operation):
                self.run_op(segment, env)
            else:
                outs = segment.compiled([env[v.id] for v in segment.inputs])
                for v, t in zip(segment.outputs, outs):
                    env[v.id] = t
            for vid in gone:
                env.pop(vid, None)   # a block's value used only inside it was never in env
        return [env[v.id] for v in region.yields]
