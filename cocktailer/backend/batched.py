"""The batched executor's native code.

- Native blocks (`cocktailer.batching.blocks`): each block's program is an entry point of one
  library, built by the native stages, all compiled in one compiler run. A block whose program
  the native stages cannot build (an op whose kernel needs one of its sizes as a number, say) is
  left out, and the executor runs its ops one by one with torch: slower, the same answers.
- Native inspectors (`cocktailer.codegen.inspector`): a recursive function's control slice as
  one C function that finds every call of every instance and its height.
- The level loop (`cocktailer.codegen.level_loop`): one C function that runs a recursion's
  levels, calling each group's level program (a native block's entry point); beside it the
  round loop, which runs every round of an inspector whose control slice computes with tensors
  (`batching.rounds`), the while loop, which runs a loop that ends on a condition
  (`batching.loops`), and the lane loop, which calls a block once per instance at its own size
  (`batching.lane_calls`).
"""
from __future__ import annotations

import ctypes
import time

import numpy as np
import torch

from cocktailer.backend.config import Config
from cocktailer.backend.native import UP_TO_RENDER, Build, Part, build_parts
from cocktailer.backend.record import Record
from cocktailer.errors import ITERATIONS_EXCEEDED, CompiledCallError
from cocktailer.ir import Program, SymbolicSizeError
from cocktailer.codegen.inspector import InspectorSource, render_inspector
from cocktailer.codegen.level_loop import (LEVEL_LOOP_SOURCE, LOOP_FAILED, LOOP_OUT_OF_RANGE, MAX_PATHS, ROUNDS_DEEP,
                                          LOOP_FULL, LOOP_ITERATIONS)
from cocktailer.runtime.compiler import compile_shared_library, load_library
from cocktailer.runtime.native import ERR_SIZES, CompiledProgram, default_workers



def build_blocks(programs: list[Program]) -> tuple[list[CompiledProgram | None], list[str]]:
    """Each program's entry point (None where it cannot be built), and why those could not."""
    config = Config(backend="cpu", workers=default_workers())
    parts, why = [], []
    for k, program in enumerate(programs):
        part = Part(program, config, f"cocktailer_block_{k}")
        try:
            trial = Build(program, config, Record(config), [part])
            for _, stage in UP_TO_RENDER:
                stage(trial)
        except (Exception, SymbolicSizeError) as e:   # a capability probe: the block then runs op by op, with torch
            # (a kernel that needs a size as a number, the lane count say, raises the latter)
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
    entry.argtypes = [ctypes.c_int64, *[ctypes.c_void_p] * 5, ctypes.c_int64, ctypes.c_int64, *[ctypes.c_void_p] * 7]
    return rendered, entry


class LevelEntry(ctypes.Structure):
    """One level program bound for a batch, as the level loop reads it (`ck_level_t`)."""
    _fields_ = [("fn", ctypes.c_void_p), ("inputs", ctypes.c_int64), ("outputs", ctypes.c_int64),
                ("in_base", ctypes.c_void_p), ("in_stride", ctypes.c_void_p), ("in_", ctypes.c_void_p),
                ("out_base", ctypes.c_void_p), ("out_stride", ctypes.c_void_p), ("out", ctypes.c_void_p),
                ("cst", ctypes.c_void_p), ("arena", ctypes.c_void_p), ("stack", ctypes.c_void_p),
                ("max_depth", ctypes.c_int64), ("locals", ctypes.c_void_p), ("rets", ctypes.c_void_p),
                ("err", ctypes.c_void_p), ("lanes_at", ctypes.c_int64), ("flag", ctypes.c_int64)]


class RoundsLayout(ctypes.Structure):
    """What the round loop reads (`ck_rounds_t`)."""
    _fields_ = [("count", ctypes.c_int64), ("calls_cap", ctypes.c_int64), ("lanes_cap", ctypes.c_int64),
                ("max_rounds", ctypes.c_int64), ("decide", ctypes.c_void_p), ("branches", ctypes.c_int64),
                ("cond", ctypes.c_void_p), ("paths", ctypes.c_void_p), ("npaths", ctypes.c_int64),
                ("reached", ctypes.c_void_p), ("sites", ctypes.c_int64), ("varying", ctypes.c_int64),
                ("column", ctypes.c_void_p), ("row_bytes", ctypes.c_void_p), ("scratch", ctypes.c_void_p),
                ("kids", ctypes.c_void_p), ("path", ctypes.c_void_p), ("height", ctypes.c_void_p),
                ("order", ctypes.c_void_p)]


class WhileLayout(ctypes.Structure):
    """What the while loop reads (`ck_while_t`)."""
    _fields_ = [("count", ctypes.c_int64), ("steps_cap", ctypes.c_int64), ("max_iterations", ctypes.c_int64),
                ("trips", ctypes.c_void_p), ("cond", ctypes.c_void_p), ("body", ctypes.c_void_p),
                ("go", ctypes.c_void_p), ("counter", ctypes.c_void_p), ("holder", ctypes.c_void_p),
                ("lane_at", ctypes.c_void_p), ("source", ctypes.c_void_p), ("final_row", ctypes.c_void_p),
                ("ran", ctypes.c_void_p)]


class NestedLayout(ctypes.Structure):
    """What the nested loop reads (`ck_nested_t`)."""
    _fields_ = [("count", ctypes.c_int64), ("steps", ctypes.c_int64), ("max_iterations", ctypes.c_int64),
                ("active", ctypes.c_void_p),
                ("pre", ctypes.c_void_p), ("inner", ctypes.c_void_p), ("post", ctypes.c_void_p),
                ("trips", ctypes.c_void_p), ("inits", ctypes.c_int64), ("init_from", ctypes.c_void_p),
                ("carried", ctypes.c_void_p), ("row_bytes", ctypes.c_void_p), ("counter", ctypes.c_void_p),
                ("lane", ctypes.c_void_p), ("source", ctypes.c_void_p), ("outer_row", ctypes.c_void_p),
                ("lane_at", ctypes.c_void_p), ("at", ctypes.c_void_p), ("order", ctypes.c_void_p)]


class LanesLayout(ctypes.Structure):
    """What the lane loop reads (`ck_lanes_t`)."""
    _fields_ = [("fn", ctypes.c_void_p), ("inputs", ctypes.c_int64), ("outputs", ctypes.c_int64),
                ("in_base", ctypes.c_void_p), ("in_stride", ctypes.c_void_p), ("in_packed", ctypes.c_void_p),
                ("out_base", ctypes.c_void_p), ("out_stride", ctypes.c_void_p),
                ("cst", ctypes.c_void_p), ("stack", ctypes.c_void_p), ("max_depth", ctypes.c_int64),
                ("err", ctypes.c_void_p), ("nerr", ctypes.c_int64), ("lanes_at", ctypes.c_int64),
                ("size_at", ctypes.c_int64), ("arena", ctypes.c_void_p), ("arena_bytes", ctypes.c_int64),
                ("locals", ctypes.c_void_p), ("locals_len", ctypes.c_int64), ("rets", ctypes.c_void_p),
                ("rets_len", ctypes.c_int64)]


_library = None


def _loops():
    """The library of the native loops (`ck_run_levels`, `ck_run_rounds`, `ck_run_while`,
    `ck_run_nested`, `ck_run_lanes`), compiled once per process (and cached on disk)."""
    global _library
    if _library is None:
        path, _ = compile_shared_library(LEVEL_LOOP_SOURCE)
        library = load_library(path, LEVEL_LOOP_SOURCE)
        for entry in (library.ck_run_levels, library.ck_run_rounds, library.ck_run_while, library.ck_run_nested,
                      library.ck_run_lanes):
            entry.restype = ctypes.c_int64
        library.ck_run_levels.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                          ctypes.c_void_p, ctypes.c_void_p]
        library.ck_run_rounds.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                          ctypes.c_void_p]
        library.ck_run_while.argtypes = library.ck_run_nested.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                                                          ctypes.c_void_p]
        library.ck_run_lanes.argtypes = [ctypes.c_void_p, ctypes.c_int64, *[ctypes.c_void_p] * 3, ctypes.c_int,
                                         ctypes.c_void_p, ctypes.c_void_p]
        _library = library
    return _library


class LevelRun:
    """Level programs bound for one batch, and a run of groups (ranges of call ids, each with
    the program it runs) that one call of the level loop runs. `bindings`, where the caller
    keeps one across batches: bindings made before, by what they were made for (program,
    sizes, layouts), repointed at this batch's tensors instead of being made again."""

    def __init__(self, bindings: dict | None = None):
        self.programs: list[CompiledProgram] = []
        self.entries: list[LevelEntry] = []
        self.alive: list = []   # what the entries point into
        self.bindings = bindings
        self._taken: set[int] = set()   # bindings this run uses already (each is one entry's pointers)

    def add(self, compiled: CompiledProgram, inputs: list[torch.Tensor], per_call: list[bool], widest: int,
            outputs: list[torch.Tensor], flag: bool, out_per_call: list[bool] | None = None) -> int:
        """Bind a level program; its index for `run`. `inputs`: its inputs, those `per_call` with
        one row per call id (contiguous), the others the same for every group; `outputs`: the
        tables its results go to, one row per call id, except those not `out_per_call` (default:
        all are), which every group writes whole (a buffer written in place: the same tensor as
        an input); `flag`: its last output says an index was out of range. Bound at `widest`
        lanes, the most any of its groups has."""
        out_per_call = [True] * len(outputs) if out_per_call is None else out_per_call
        inputs = [x.contiguous() for x in inputs]
        key = None if self.bindings is None else (
            id(compiled), widest, flag, tuple(per_call), tuple(out_per_call),
            tuple((tuple(x.shape), x.stride(), x.dtype) for x in inputs), tuple((y.stride(), y.dtype) for y in outputs))
        binding = None if key is None else self.bindings.get(key)
        if binding is None or id(binding) in self._taken:
            binding = _Binding(compiled, inputs, per_call, widest, outputs, flag, out_per_call)
            if key is not None:
                if len(self.bindings) >= _MAX_BINDINGS:
                    self.bindings.clear()
                self.bindings[key] = binding
        else:
            binding.repoint(compiled, inputs, outputs)
        self._taken.add(id(binding))
        self.entries.append(binding.entry)
        self.programs.append(compiled)
        self.alive += [inputs, outputs, binding]
        return len(self.entries) - 1

    def run(self, groups: list[tuple[int, int, int]]) -> int | None:
        """Run the groups (start, end, program index), in order. Returns the first group whose
        flag said an index was out of range (the groups after it did not run), else None;
        raises what a failing entry's error code means."""
        table = torch.tensor(groups, dtype=torch.int64)
        entries = (LevelEntry * len(self.entries))(*self.entries)
        failed = torch.zeros(3, dtype=torch.int64)
        status = self._timed(lambda workers, preempted: _loops().ck_run_levels(
            len(groups), table.data_ptr(), ctypes.addressof(entries), workers, failed.data_ptr(), preempted))
        group, code, _ = failed.tolist()
        if status == LOOP_FAILED:
            self.programs[groups[group][2]].raise_error(code)
        return group if status == LOOP_OUT_OF_RANGE else None

    def run_rounds(self, decide: int | None, paths: list[int | None], reached: list[tuple[int, ...]], sites: int,
                   count: int, max_rounds: int, cond: list[torch.Tensor], columns: list[torch.Tensor],
                   scratch: list[torch.Tensor], kids: torch.Tensor, path: torch.Tensor, height: torch.Tensor,
                   order: torch.Tensor) -> int | None:
        """Run the round loop (`codegen.level_loop`) of the bound programs `decide` (None: no
        branch) and `paths` (by path; None: it reaches no site, `reached[p]` the sites it reaches
        otherwise) over one-row-per-call tensors. Returns the calls found, or None where they
        did not fit (`kids` rows, `order` lanes: bind again with more); raises past `max_rounds`
        rounds, for an index out of range, and what a failing entry's error code means."""
        assert len(paths) <= MAX_PATHS
        path_entries = (LevelEntry * len(paths))(*[LevelEntry() if k is None else self.entries[k] for k in paths])
        decide_entry = None if decide is None else LevelEntry.from_buffer_copy(self.entries[decide])
        reach = torch.full((len(paths), max(sites, 1)), -1, dtype=torch.int64)
        for p, found in enumerate(reached):
            reach[p, :len(found)] = torch.tensor(found, dtype=torch.int64)
        layout = RoundsLayout(
            count, kids.shape[0], order.shape[0], max_rounds,
            None if decide_entry is None else ctypes.addressof(decide_entry), len(cond),
            ctypes.addressof(cond_at := _pointers([c.data_ptr() for c in cond])),
            ctypes.addressof(path_entries), len(paths), reach.data_ptr(), sites, len(columns) - 1,
            ctypes.addressof(column_at := _pointers([c.data_ptr() for c in columns])),
            (row_bytes := _strides([c.stride(0) * c.element_size() for c in columns])).data_ptr(),
            ctypes.addressof(scratch_at := _pointers([c.data_ptr() for c in scratch])),
            kids.data_ptr(), path.data_ptr(), height.data_ptr(), order.data_ptr())
        found, failed = torch.zeros(1, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)
        status = self._timed(lambda workers, preempted: _loops().ck_run_rounds(
            ctypes.addressof(layout), workers, found.data_ptr(), failed.data_ptr(), preempted))
        if status == LOOP_FULL:
            return None
        if status == ROUNDS_DEEP:
            raise CompiledCallError(f"the program recursed deeper than the batched executor supports ({max_rounds})")
        which = int(failed[2])
        self._raise_for(status, failed, decide if which < 0 else paths[which], None)
        return int(found)

    def run_while(self, cond: int, body: int, count: int, trips: torch.Tensor | None, max_iterations: int | None,
                  go: torch.Tensor, counter: torch.Tensor, holder: torch.Tensor, lane_at: torch.Tensor,
                  source: torch.Tensor, final_row: torch.Tensor, ran: torch.Tensor, steps: int) -> bool:
        """Run the while loop (`codegen.level_loop`) of the bound programs `cond` (a byte per row
        in `go`) and `body` over the per-row and per-lane tensors it fills. Returns False where a
        lane was still in the loop after `steps` steps, the room made (run again with more);
        raises past `max_iterations` steps, for an index out of range, and what a failing
        entry's error code means."""
        layout = WhileLayout(count, steps, -1 if max_iterations is None else max_iterations,
                             None if trips is None else trips.data_ptr(),
                             ctypes.addressof(cond_entry := LevelEntry.from_buffer_copy(self.entries[cond])),
                             ctypes.addressof(body_entry := LevelEntry.from_buffer_copy(self.entries[body])),
                             go.data_ptr(), counter.data_ptr(), holder.data_ptr(), lane_at.data_ptr(),
                             source.data_ptr(), final_row.data_ptr(), ran.data_ptr())
        failed = torch.zeros(3, dtype=torch.int64)
        status = self._timed(lambda workers, preempted: _loops().ck_run_while(
            ctypes.addressof(layout), workers, failed.data_ptr(), preempted))
        if status == LOOP_FULL:
            return False
        self._raise_for(status, failed, body if int(failed[2]) else cond, max_iterations)
        return True

    def run_nested(self, programs: tuple[int, int, int], count: int, active: torch.Tensor, trips: torch.Tensor,
                   inits: list[torch.Tensor], carried: list[torch.Tensor], per_row: list[torch.Tensor],
                   lane_at: torch.Tensor, max_iterations: int | None):
        """Run the nested loop (`codegen.level_loop`) of the bound programs (pre, inner, post):
        `active` lanes per outer step, pre's inner `trips` and `inits` (one row per outer row),
        the inner loop's `carried` tables, its body's `per_row` inputs (counter, lane, source,
        outer row). Raises where an inner count is past `max_iterations`, for an
        index out of range, and what a failing entry's error code means."""
        entries = [LevelEntry.from_buffer_copy(self.entries[k]) for k in programs]
        scratch = torch.empty(2, count, dtype=torch.int64)
        layout = NestedLayout(count, len(active), -1 if max_iterations is None else max_iterations,
                              active.data_ptr(), *[ctypes.addressof(e) for e in entries],
                              trips.data_ptr(), len(inits),
                              ctypes.addressof(init_at := _pointers([t.data_ptr() for t in inits])),
                              ctypes.addressof(carried_at := _pointers([t.data_ptr() for t in carried])),
                              (row_bytes := _strides([t.stride(0) * t.element_size() for t in carried])).data_ptr(),
                              *[t.data_ptr() for t in per_row], lane_at.data_ptr(),
                              scratch[0].data_ptr(), scratch[1].data_ptr())
        failed = torch.zeros(3, dtype=torch.int64)
        status = self._timed(lambda workers, preempted: _loops().ck_run_nested(
            ctypes.addressof(layout), workers, failed.data_ptr(), preempted))
        self._raise_for(status, failed, programs[int(failed[2])], max_iterations)

    def _raise_for(self, status: int, failed: torch.Tensor, program: int, max_iterations: int | None):
        """Raise what a loop's `status` other than done means; `program`: the entry that failed
        (`failed[1]` its code)."""
        if status == LOOP_ITERATIONS:
            raise CompiledCallError(f"{ITERATIONS_EXCEEDED} ({max_iterations})")
        if status == LOOP_FAILED:
            self.programs[program].raise_error(int(failed[1]))
        if status == LOOP_OUT_OF_RANGE:
            raise IndexError("an index is out of range for its instance's own size")

    def _timed(self, call) -> int:
        """`call(workers, preempted)`, on the workers the programs choose, its time and
        preemptions reported to them."""
        preempted = ctypes.c_int64(0)
        workers = self.programs[0].active_workers.choose()
        start = time.perf_counter()
        status = call(workers, ctypes.byref(preempted))
        seconds = time.perf_counter() - start
        for program in {id(p): p for p in self.programs}.values():
            program.active_workers.report(workers, preempted.value, seconds)
        return status


def may_call_by_lane(compiled: CompiledProgram) -> bool:
    """Whether the lane loop may call this entry on one worker at a time, several at once: it
    keeps no recursion frames (one stack would serve every call) and places no uTask on a
    given worker."""
    return not compiled.entry.frame_bytes and not compiled.entry.needs_all_workers


def run_lanes(compiled: CompiledProgram, bound, lanes_at: int, size_at: int, inputs: list[tuple[torch.Tensor, str]],
              outputs: list[torch.Tensor], first: np.ndarray, size: np.ndarray, scratch) -> None:
    """Call the entry once per lane on the lane loop (`codegen.level_loop`): lane i at its own
    `size[i]` (err[] slot `size_at`; slot `lanes_at`: 1 lane), reading each of `inputs`, (tensor,
    kind), at row `first[i]` ("packed"), at row i ("lane") or whole ("shared"), and writing each
    of `outputs` at row `first[i]`; every tensor contiguous.
    `bound`: a call bound at the largest lane (its err[] the template, its arena the size each
    worker's needs); `scratch(key, numel, dtype)`: memory kept between batches. Raises what a
    failing call's code means. (In numpy and ctypes: a dozen torch ops on a few numbers each
    cost more than the call of a short block.)"""
    first, size = np.ascontiguousarray(first, dtype=np.int64), np.ascontiguousarray(size, dtype=np.int64)
    order = np.argsort(-size, kind="stable")
    workers = compiled.active_workers.choose()
    arena_bytes = -(-max(bound.arena_bytes, 1) // 64) * 64
    arena = scratch("arena", workers * arena_bytes, torch.uint8)
    locals_ = scratch("locals", workers * bound.locals.numel(), torch.int64)
    rets = scratch("rets", workers * bound.rets.numel(), torch.int64)
    in_base = _pointers([x.data_ptr() for x, _ in inputs])
    in_stride = _int64s([0 if kind == "shared" else x.stride(0) * x.element_size() for x, kind in inputs])
    in_packed = _int64s([int(kind == "packed") for _, kind in inputs])
    out_base = _pointers([y.data_ptr() for y in outputs])
    out_stride = _int64s([y.stride(0) * y.element_size() for y in outputs])
    layout = LanesLayout(ctypes.cast(bound.function, ctypes.c_void_p).value, len(inputs), len(outputs),
                         ctypes.addressof(in_base), ctypes.addressof(in_stride), ctypes.addressof(in_packed),
                         ctypes.addressof(out_base), ctypes.addressof(out_stride), ctypes.addressof(bound.constants),
                         bound.stack.data_ptr(), compiled.max_depth, ctypes.addressof(bound.err), len(bound.err),
                         lanes_at, size_at, arena.data_ptr(), arena_bytes, locals_.data_ptr(), bound.locals.numel(),
                         rets.data_ptr(), bound.rets.numel())
    failed, preempted = (ctypes.c_int64 * 2)(), ctypes.c_int64(0)
    start = time.perf_counter()
    status = _loops().ck_run_lanes(ctypes.addressof(layout), len(size), order.ctypes.data, first.ctypes.data,
                                   size.ctypes.data, workers, ctypes.addressof(failed), ctypes.byref(preempted))
    compiled.active_workers.report(workers, preempted.value, time.perf_counter() - start)
    if status == LOOP_FAILED:
        compiled.raise_error(int(failed[1]))


def _int64s(values: list[int]) -> ctypes.Array:
    return (ctypes.c_int64 * max(len(values), 1))(*values)


_MAX_BINDINGS = 32   # per cache: a caller meeting ever new sizes starts again


class _Binding:
    """A level program bound for the level loop: its entry, and what the entry points into."""

    def __init__(self, compiled: CompiledProgram, inputs: list[torch.Tensor], per_call: list[bool], widest: int,
                 outputs: list[torch.Tensor], flag: bool, out_per_call: list[bool]):
        self.bound = bound = compiled.bind([x[:widest] if lane else x for x, lane in zip(inputs, per_call)])
        lanes_at = [ERR_SIZES + k for k, (_, position, dim) in enumerate(compiled.entry.sizes)
                    if per_call[position] and dim == 0]
        outs = [*outputs, bound.outputs[-1]] if flag else list(outputs)
        self.pointers = [_pointers([x.data_ptr() for x in inputs]), _pointers([y.data_ptr() for y in outs])]
        self.strides = [_strides([x.stride(0) * x.element_size() if lane else 0 for x, lane in zip(inputs, per_call)]),
                        _strides([y.stride(0) * y.element_size() if lane else 0
                                  for y, lane in zip(outputs, out_per_call)] + [0] * flag)]
        self.room = [(ctypes.c_void_p * max(len(inputs), 1))(), (ctypes.c_void_p * max(len(outs), 1))()]
        self.entry = LevelEntry(
            ctypes.cast(bound.function, ctypes.c_void_p).value, len(inputs), len(outs),
            ctypes.addressof(self.pointers[0]), self.strides[0].data_ptr(), ctypes.addressof(self.room[0]),
            ctypes.addressof(self.pointers[1]), self.strides[1].data_ptr(), ctypes.addressof(self.room[1]),
            ctypes.addressof(bound.constants), bound.arena.data_ptr(), bound.stack.data_ptr(), compiled.max_depth,
            bound.locals.data_ptr(), bound.rets.data_ptr(), ctypes.addressof(bound.err),
            lanes_at[0] if lanes_at else -1, len(outs) - 1 if flag else -1)

    def repoint(self, compiled: CompiledProgram, inputs: list[torch.Tensor], outputs: list[torch.Tensor]):
        """The same binding for tensors of the same sizes and layouts elsewhere in memory."""
        for k, x in enumerate(inputs):
            self.pointers[0][k] = x.data_ptr()
        for k, y in enumerate(outputs):   # (the index flag, last, is the binding's own)
            self.pointers[1][k] = y.data_ptr()
        self.bound = compiled.rearm(self.bound)
        self.entry.arena, self.entry.stack = self.bound.arena.data_ptr(), self.bound.stack.data_ptr()


def _pointers(addresses: list[int]) -> ctypes.Array:
    return (ctypes.c_void_p * max(len(addresses), 1))(*addresses)


def _strides(strides: list[int]) -> torch.Tensor:
    return torch.tensor(strides or [0], dtype=torch.int64)
