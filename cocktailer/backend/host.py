"""The "host" backend, the paper's CocktailerBase: control flow stays in Python (as in the
reference executor) and each basic block — a maximal run of data ops between control-flow
ops — is one native call.

    HOST_STAGES: workers -> native blocks -> memory plan -> placement -> render -> compile -> load
 Benchmarks compare it with control flow at L1 to show what
moving control flow into the native program buys.

It is also where Algorithm 1 (Cocktailer §3.2) places control flow a level at a time:
with `native_from=d`, every control-flow construct nested at least d deep in its function
(0: those of the function's body) runs inside the native block around it, merged with its
neighbouring data ops, while the constructs above stay in Python. Constraint 1 decides what
may move: a construct runs natively only if every op it controls has a native kernel
(through its regions and, for a call, the whole callee); a data op without one runs in
Python with torch, between native blocks."""
from __future__ import annotations

from dataclasses import replace

from cocktailer.backend.config import Config
from cocktailer.backend.native import NATIVE_STAGES, Build, Part, run_stages
from cocktailer.backend.record import Record
from cocktailer.codegen import kernels
from cocktailer.ir import CONTROL, Function, Op, Operation, Program, Region, Value
from cocktailer.ir.analysis import native_legal, nesting_depths, runs_in_python, sizes_of, value_users
from cocktailer.ir.program import clone_ops
from cocktailer.reference.executor import ReferenceExecutor, dead_after
from cocktailer.runtime.native import CompiledProgram, default_workers


class _Block:
    def __init__(self, ops: list[Operation], inputs: list[Value], outputs: list[Value]):
        self.ops, self.inputs, self.outputs = ops, inputs, outputs
        self.compiled: CompiledProgram | None = None


def _segments(region: Region, users: dict[int, set[int]], native: set[int]) -> list:
    """The region's ops as blocks (data ops with native kernels and the constructs in
    `native`, one native call each) and single ops run by Python (other constructs,
    constants, data ops without a native kernel)."""
    segments, run = [], []

    def close():
        if not run:
            return
        inside = {id(o) for o in Region(ops=list(run)).walk()}
        defined = {r.id for o in run for r in o.results}
        inputs = list({v.id: v for o in run for v in o.reads() if v.id not in defined}.values())
        outputs = [r for o in run for r in o.results if users.get(r.id, set()) - inside]
        segments.append(_Block(list(run), inputs, outputs))
        run.clear()

    for op in region.ops:
        if id(op) in native or (op.op not in CONTROL and op.op is not Op.CONST
                                and not runs_in_python(op, kernels.supported)):
            run.append(op)
        else:
            close()
            segments.append(op)
    close()
    return segments


def _callees(ops: list[Operation], program: Program) -> list[str]:
    """The functions the ops call, directly or through other functions."""
    found: list[str] = []
    pending = list(Region(ops=list(ops)).walk())
    while pending:
        op = pending.pop()
        name = op.attrs.get("callee") if op.op is Op.CALL else None
        if name is not None and name not in found:
            found.append(name)
            pending += list(program.functions[name].body.walk())
    return found


def _accesses(segment) -> tuple[set[int], set[int]]:
    """(ids read, ids defined) of a control-flow op or a basic block."""
    if isinstance(segment, Operation):
        return {v.id for v in segment.reads()}, {r.id for r in segment.results}
    return {v.id for v in segment.inputs}, {r.id for op in segment.ops for r in op.results}


class HostExecutor(ReferenceExecutor):
    """Runs the program's control flow in Python; `native`: id(construct) of the constructs
    that run inside native blocks instead. Its blocks are compiled by `build_host`."""

    def __init__(self, program: Program, native: set[int], config: Config, record: Record):
        super().__init__(program)
        self.native, self.config, self.record = native, config, record
        self.max_iterations = config.max_iterations
        self.library: str | None = None
        self.segments: dict[int, list] = {}
        users = {name: value_users(fn) for name, fn in program.functions.items()}
        pending = [(program.entry, program.main.body)]
        while pending:   # the regions Python runs: not those inside a construct that runs natively
            name, region = pending.pop()
            if id(region) in self.segments:
                continue
            self.segments[id(region)] = _segments(region, users[name], self.native)
            for op in (s for s in self.segments[id(region)] if isinstance(s, Operation)):
                pending += [(name, r) for r in op.regions]
                if op.op is Op.CALL:
                    pending.append((op.attrs["callee"], program.functions[op.attrs["callee"]].body))

    def block_program(self, block: _Block) -> Program:
        """A block as a program of its own: its inputs are parameters, its outputs the results.
        Values are fresh: a block taken from a recursive function calls that function, and one
        program must not define a value twice."""
        rename = {v.id: Value(v.type, v.hint) for v in block.inputs}
        params = [rename[v.id] for v in block.inputs]
        ops = clone_ops(block.ops, rename)
        functions = {"main": Function("main", Region(params, ops, [rename[v.id] for v in block.outputs]))}
        functions.update({name: self.program.functions[name] for name in _callees(block.ops, self.program)})
        return Program(functions, "main", self.program.constants, self.program.device, sizes=sizes_of(params))

    @property
    def identity(self) -> str:
        """Changes whenever the blocks' code or the worker count does (the profiler's cache key)."""
        return f"host:{self.library}:{self.config.workers}:{self.config.max_depth}"

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


def all_workers(b: Build) -> str:
    if b.config.workers:
        return f"{b.config.workers} (asked for)"
    b.config = b.record.config = replace(b.config, workers=default_workers())
    return f"{b.config.workers} (all CPUs)"


def native_blocks(b: Build) -> str:
    """Constraint 1, construct by construct: those nested at least `native_from` deep whose
    ops all have native kernels run inside the native block around them."""
    native_from = b.config.native_from
    depths = nesting_depths(b.program)
    legal = native_legal(b.program, kernels.supported) if native_from is not None else set()
    native = {k for k in legal if depths[k] >= native_from}
    executor = b.executable = HostExecutor(b.program, native, b.config, b.record)
    b.record.program, b.record.native_constructs = b.program, executor.native
    b.parts = [Part(executor.block_program(block), b.config, f"block_{k}") for k, block in enumerate(executor.blocks)]
    return f"{len(b.parts)} blocks, {len(executor.native)} constructs inside them"


HOST_STAGES = [("workers", all_workers), ("native blocks", native_blocks), *NATIVE_STAGES]


def build_host(program: Program, config: Config, record: Record) -> HostExecutor:
    build = Build(program, config, record)
    run_stages(HOST_STAGES, build)
    executor = build.executable
    for block, part in zip(executor.blocks, build.parts):
        block.compiled = part.compiled
        executor.library = part.compiled.library
    return executor
