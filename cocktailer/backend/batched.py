"""The batched executor's native code.

- Native blocks (`cocktailer.batching.blocks`): each block's program is an entry point of one
  library, built by the native stages, all compiled in one compiler run. A block whose program
  the native stages cannot build (an op whose kernel needs one of its sizes as a number, say) is
  left out, and the executor runs its ops one by one with torch: slower, the same answers.
- Native inspectors (`cocktailer.codegen.inspector`): a recursive function's control slice as
  one C function that finds every call of every instance and its height.
"""
from __future__ import annotations

import ctypes

from cocktailer.backend.config import Config
from cocktailer.backend.native import NATIVE_STAGES, Build, Part, build_parts
from cocktailer.backend.record import Record
from cocktailer.ir import Program
from cocktailer.codegen.inspector import InspectorSource, render_inspector
from cocktailer.runtime.compiler import compile_shared_library, load_library
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


def build_inspector(fn, sites, passthrough, control, if_results) -> tuple[InspectorSource, ctypes._CFuncPtr]:
    """The native inspector of a recursive function's control slice, compiled and loaded.
    Raises NotImplementedError (why) where the slice has no native form."""
    rendered = render_inspector(fn, sites, passthrough, control, if_results)
    path, _ = compile_shared_library(rendered.source)
    entry = load_library(path, rendered.source).ck_inspect
    entry.restype = ctypes.c_int64
    entry.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                      ctypes.c_int64, ctypes.c_int64, *[ctypes.c_void_p] * 7]
    return rendered, entry
