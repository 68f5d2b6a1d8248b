"""The batched executor's native blocks (`cocktailer.batching.blocks`): each block's program is
an entry point of one library, built by the native stages, all compiled in one compiler run.

A block whose program the native stages cannot build (an op whose kernel needs one of its sizes
as a number, say) is left out, and the executor runs its ops one by one with torch: slower, the
same answers."""
from __future__ import annotations

from cocktailer.backend.config import Config
from cocktailer.backend.native import NATIVE_STAGES, Build, Part, build_parts
from cocktailer.backend.record import Record
from cocktailer.ir import Program
from cocktailer.runtime.native import CompiledProgram, default_workers

_UP_TO_RENDER = NATIVE_STAGES[:3]   # memory plan, placement, render: whether a part can be built


def build_blocks(programs: list[Program]) -> tuple[list[CompiledProgram | None], list[str]]:
    """Each program's entry point (None where it cannot be built), and why those could not."""
    config = Config(backend="cpu", workers=default_workers())
    parts, why = [], []
    for k, program in enumerate(programs):
        part = Part(program, config, f"cocktailer_block_{k}")
        try:
            trial = Build(program, config, Record(config), [part])
            for _, stage in _UP_TO_RENDER:
                stage(trial)
        except Exception as e:   # a capability probe: the block then runs op by op, with torch
            why.append(f"block {k}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            parts.append(None)
            continue
        parts.append(Part(program, config, part.entry))
    built = iter(build_parts([p for p in parts if p is not None], Record(config)))
    return [next(built) if p is not None else None for p in parts], why
