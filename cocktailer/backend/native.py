"""The native build path, written once: programs (the cpu backend's one, the host backend's
basic blocks, the two variants of every wave) become entry points of one shared library.

    NATIVE_STAGES: fuse -> memory plan -> placement -> render -> compile -> load

Each part carries its own configuration (the wave variants differ in `wavefront`); one
compiler run serves all parts."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from cocktailer.backend.config import Config
from cocktailer.backend.record import Record
from cocktailer.codegen import kernels
from cocktailer.codegen.kernels.elementwise import int_divides
from cocktailer.codegen.kernels import matmul
from cocktailer.codegen.kernels.gemm import prepack_b
from cocktailer.codegen.dialect import Dialect, cuda
from cocktailer.codegen.renderer import CPU, Rendered, assemble, render
from cocktailer.ir import Program, SymbolicSizeError
from cocktailer.ir.analysis import runs_in_python
from cocktailer.passes.fuse import fuse_elementwise
from cocktailer.passes.views import fold_views_into_products
from cocktailer.runtime.compiler import compile_shared_library, gpu_arch, load_library
from cocktailer.runtime.native import CompiledProgram, Entry, Packed
from cocktailer.schedule import SimplePolicy
from cocktailer.schedule.memory import MemoryPlan, plan_memory
from cocktailer.schedule.utask import UProgram


@dataclass
class Part:
    program: Program
    config: Config                  # workers resolved
    entry: str = "cocktailer_run"
    excluded_waves: frozenset = frozenset()   # waves measured slower side by side (backend.waves)
    plan: MemoryPlan | None = None
    uprogram: UProgram | None = None
    rendered: Rendered | None = None
    compiled: CompiledProgram | None = None


@dataclass
class Build:
    """What a pipeline's stages work on: the program and its configuration, then the parts
    (native entry points) made of it, their one source and library, and the executable."""
    program: Program
    config: Config
    record: Record
    parts: list[Part] = field(default_factory=list)
    source: str = ""
    path: Path | None = None
    executable: object = None


def run_stages(stages: list, build: Build):
    """Run a pipeline's stages in order; each returns what its record entry says it did."""
    for name, stage in stages:
        with build.record.stage(name) as entry:
            entry.detail = stage(build)


def fuse(b: Build) -> str:
    """Each part's chains of elementwise ops as one loop each (`passes.fuse`), on a copy of its
    program. Not where waves are co-scheduled: their measurement chose among the unfused ops."""
    fused = 0
    for p in b.parts:
        if p.config.wavefront or not p.config.fuse:
            continue
        before = sum(1 for _ in p.program.walk())
        p.program = fuse_elementwise(p.program.clone(), _fusable)
        fused += before - sum(1 for _ in p.program.walk())
    return f"{fused} elementwise ops folded into the ops after them"


def dialect_of(config: Config) -> Dialect:
    """The C dialect a configuration's programs are rendered in."""
    return cuda(config.threads, config.control_stack == "shared") if config.backend == "cuda" else CPU


def fold_views(b: Build) -> str:
    """Each part's products read the reshapes and permutes of their operands in place
    (`passes.views`), where the GEMM can; the copies nothing else reads go. Where `fuse` runs."""
    folded = 0
    if not dialect_of(b.config).engine:
        return "not here: only the GEMM engine reads views"
    for p in b.parts:
        if p.config.wavefront or not p.config.fuse:
            continue
        p.program, removed = fold_views_into_products(p.program.clone(), matmul.reads_in_place)
        folded += removed
    return f"{folded} reshape and permute copies read in place by products"


def _fusable(op) -> bool:
    """An elementwise op with a kernel whose loop checks nothing before it runs."""
    return kernels.supported(op) and not int_divides(op)


def memory_plan(b: Build) -> str:
    b.record.parts += b.parts
    for p in b.parts:
        p.plan = plan_memory(p.program, p.config, p.excluded_waves)
    return _count(b)


def placement(b: Build) -> str:
    for p in b.parts:
        p.uprogram = SimplePolicy(p.config, p.excluded_waves).schedule(p.program, p.plan)
    return _count(b)


def render_parts(b: Build) -> str:
    if not b.parts:
        return "no native code"
    dialect = dialect_of(b.config)
    for p in b.parts:
        p.rendered = render(p.uprogram, p.plan, dialect, p.entry)
    b.source = b.record.source = assemble([p.rendered for p in b.parts], dialect)
    return f"{len(b.source.splitlines())} lines of {'CUDA C++' if dialect.launched else 'C'}"


def _compiled_as(b: Build) -> tuple[str, list[str]]:
    """(language, extra flags) the source is compiled as: C; CUDA for the program's GPU (its
    tensors are there), by nvcc; CUDA in its CPU execution mode (a virtual GPU): C++ (ct_cuda.h)."""
    if not dialect_of(b.config).launched:
        return "c", []
    if b.program.device.type == "cuda":
        return "cuda", [f"-arch={gpu_arch(b.program.device)}"]
    return "c++", []


def compile_library(b: Build) -> str:
    if not b.parts:
        return "no native code"
    language, flags = _compiled_as(b)
    b.path, cached = compile_shared_library(b.source, flags, language)
    return f"{'cache hit' if cached else ('nvcc' if language == 'cuda' else 'the C compiler') + ' ran'}: {b.path.name}"


def load(b: Build) -> str:
    if not b.parts:
        return "no native code"
    language, flags = _compiled_as(b)
    handle = load_library(b.path, b.source, flags, language)
    for p in b.parts:
        p.compiled = CompiledProgram(handle, str(b.path), _entry(p), p.config.workers, p.config.max_depth,
                                     b.record, p.config.max_iterations, device=p.program.device)
    return _count(b)


UP_TO_RENDER = [("fuse", fuse), ("views", fold_views), ("memory plan", memory_plan), ("placement", placement), ("render", render_parts)]
NATIVE_STAGES = UP_TO_RENDER + [("compile", compile_library), ("load", load)]


def build_parts(parts: list[Part], record: Record) -> list[CompiledProgram]:
    """Programs compiled as the entry points of one library, loaded (the wave variants)."""
    build = Build(parts[0].program, parts[0].config, record, parts) if parts else None
    if build is not None:
        run_stages(NATIVE_STAGES, build)
    return [p.compiled for p in parts]


def unsupported_ops(program: Program) -> list[str]:
    """Each data op no native kernel runs, with its types."""
    return sorted({f"{op.op.name.lower()} ({', '.join(str(v.type) for v in op.operands + op.results)})"
                   for op in program.walk() if runs_in_python(op, kernels.supported)})


def _count(b: Build) -> str:
    return f"{len(b.parts)} entry points" if len(b.parts) > 1 else ""


def _entry(part: Part) -> Entry:
    """What the runtime needs to call the part's entry point."""
    program, rendered, plan = part.program, part.rendered, part.plan
    return Entry(rendered.entry, rendered.errors, [p.type for p in program.main.params],
                 [v.type for v in program.main.body.yields],
                 [_constant(program, rendered, name) for name in plan.const_names],
                 plan.arena_bytes, plan.frame_bytes, plan.locals_per_frame, part.uprogram.fans_out,
                 part.uprogram.co_scheduled or part.uprogram.fine_barriers,
                 program.sizes, tuple(plan.dynamic), tuple(plan.frame_dynamic), dialect_of(part.config).threads)


def _constant(program: Program, rendered: Rendered, name: str):
    if name in rendered.prepacked:
        source, nr = rendered.prepacked[name]
        return Packed(program.constants[source], functools.partial(prepack_b, nr=nr), ("prepack_b", nr))
    return program.constants[name]
