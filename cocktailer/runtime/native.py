"""A loaded native program: bind torch tensors zero-copy, call, report errors.

The runtime knows the calling convention of a generated entry point, not how it was made:
the backend says what the scratch memory holds, which constants to bind and how to pack the
ones kept in a layout of their own (`Packed`)."""
from __future__ import annotations

import contextlib
import ctypes
import math
import os
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import torch

from cocktailer.errors import INTERRUPTED, ITERATIONS_EXCEEDED, CompiledCallError
from cocktailer.ir import Sym, TensorType
from cocktailer.runtime import interrupt
from cocktailer.runtime.memo import DERIVED, version as version_of

_ARGTYPES = [ctypes.c_void_p] * 9 + [ctypes.c_int]
SLOTS_PER_FRAME = 8   # the generated code's CT_SLOTS: resume label, caller frame, fan-out state
# err[] of the calling convention: the error code (0: none), how often the OS preempted a worker,
# the address of the SIGINT counter (runtime.interrupt), the most iterations one loop may run (0: any)
ERR_CODE, ERR_PREEMPTED, ERR_SIGINTS, ERR_MAX_ITERATIONS, ERR_SIZES = range(5)   # then one slot per symbolic size
# A CUDA entry's return code when the launch itself failed (ct_cuda.h): err[1] then says why
LAUNCH_FAILED = -2


@dataclass(frozen=True)
class Packed:
    """A constant bound in a layout of its own (a GEMM's weights in panels): packed when the
    program loads, and again, in place, whenever `source` has been written since."""
    source: torch.Tensor
    pack: Callable[[torch.Tensor], torch.Tensor]
    kind: tuple = ()     # what `pack` does (with `source`, what the packed tensor is: loads share it)


@dataclass(frozen=True)
class Entry:
    """What the runtime must know of a generated entry point `cocktailer_run`-alike."""
    name: str
    errors: list[str]                 # err == k + 1 means errors[k]
    inputs: list[TensorType]
    outputs: list[TensorType]
    constants: list                   # per constant slot: a tensor, or Packed
    arena_bytes: int
    frame_bytes: int
    locals_per_frame: int
    stack_per_worker: bool            # calls fan out to worker groups: one stack of frames per worker
    needs_all_workers: bool           # uTasks are placed on given workers: no call may run on fewer
    sizes: tuple = ()                 # (Sym, input, dim) of each symbolic size, in the order err[ERR_SIZES:] holds them
    dynamic: tuple = ()               # the type of each value of a symbolic size the arena holds after
                                      # arena_bytes (err[] holds their offsets after the sizes)
    frame_dynamic: tuple = ()         # the same after each frame's frame_bytes (err[]: their offsets, then
                                      # the frame's size)
    lanes: int = 1                    # threads per worker that each keep the control flow's state
                                      # (loop counters, frame slots): a CUDA block's

    def arena_layout(self, sizes: dict) -> tuple[list[int], int]:
        """For a call's sizes (Sym -> int): the byte offset of each dynamic value in the arena,
        and the bytes the arena then needs."""
        return _after(self.arena_bytes, self.dynamic, sizes)

    def frame_layout(self, sizes: dict) -> tuple[list[int], int]:
        """The same for a frame of the recursion stack: offsets from the frame, the frame's bytes."""
        offsets, top = _after(max(self.frame_bytes, 64), self.frame_dynamic, sizes)
        return offsets, -(-top // ARENA_ALIGN) * ARENA_ALIGN


def _after(fixed: int, types: tuple, sizes: dict) -> tuple[list[int], int]:
    """Offsets of values of these types, placed one after another from `fixed` bytes, aligned."""
    offsets, top = [], fixed
    for ty in types:
        offsets.append(top)
        top += -(-_size_of(ty, sizes) * ty.dtype.itemsize // ARENA_ALIGN) * ARENA_ALIGN or ARENA_ALIGN
    return offsets, top


ARENA_ALIGN = 64
_MAX_LAYOUTS = 1024


def _size_of(ty: TensorType, sizes: dict) -> int:
    return math.prod(sizes.get(d, d) for d in ty.shape)


def _shape_of(ty: TensorType, sizes: dict) -> tuple:
    return tuple(sizes.get(d, d) for d in ty.shape) if ty.syms else ty.shape


class _Layout(NamedTuple):
    """Where a call's values of symbolic sizes go (CompiledProgram._layout)."""
    arena_offsets: list[int]
    arena_bytes: int
    frame_offsets: list[int]
    frame_bytes: int
    shapes: list[tuple]   # the outputs'


class Bound(NamedTuple):
    """A call of an entry point, bound (`CompiledProgram.bind`); the tensors stay alive with it."""
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    input_pointers: ctypes.Array
    output_pointers: ctypes.Array
    arena: torch.Tensor          # the thread's (shared), its first `arena_bytes` this call's
    arena_bytes: int
    stack: torch.Tensor
    locals: torch.Tensor
    rets: torch.Tensor
    err: ctypes.Array
    workers: int
    function: ctypes._CFuncPtr   # the entry point
    constants: ctypes.Array      # its constant table


class Workers:
    """How many workers the next call runs on.

    On a quiet machine, all of them. Once a call reports that the OS preempted one of its
    workers (another process wants the cores), calls are contended: workers that meet at
    barriers may wait out each other's time slices (a 2-worker LSTM beside one busy process
    took 600 ms a call, 13 ms on one worker), or may still beat fewer workers (an attention
    decoder: 5.5 ms on 2, 8.5 ms on 1). So while contended, each call runs on whichever of all
    or half the workers has been faster lately (the median of its last three contended calls),
    and the other is tried again now and then, after a wait that doubles each time it loses
    and is at least PROBE_COST times what it took (so trying costs a few percent). A call on
    all workers that no preemption disturbed ends the contention; its time replaces those of
    all workers' contended calls, and the wait starts again, at least PROBE_COST times what
    the other count took when last tried. Else, on a machine that is busy now and then, all
    workers would be remembered slower than they are and the wait would keep growing: the
    RAE ran 1,255 of 3,000 calls on one worker at 0.91 ms, against 0.50 ms on two.

    A try that beats the count that runs wins outright, its own count's older samples dropped:
    samples of a contention that has passed (child processes starting beside a batch) kept a
    level loop on one worker at 97 ms a call, against 51 ms on two, for good.

    Waits are counted in this program's own time (the seconds its calls took), not the
    clock's: a program called once in a longer run (a batched block, once per layer of a 450
    ms batch) would otherwise be tried on fewer workers after nearly every preemption, and
    Berxit ran 17% of its blocks on one worker, each twice as slow, none of them faster.

    A preempted call on all workers that took no longer than SLOWED times its quiet calls
    lately (the median of the last three) starts no contention: the OS took a worker off its
    core for a moment and gave it back (a kernel thread, a peer's spinning thread), and trying
    half the workers costs up to a call's time again. Berxit's blocks, interleaved with other
    systems in the benchmark, were preempted at 5% of their calls and ran 8% of them on one
    worker, each about twice as slow: 103 ms of native time a batch, against 92 ms with both
    workers on every call (one run of each). With this rule 3-9% still did in later runs: some
    preemptions do slow a call down.

    A program's first call is no sample of either count: it pays once for what later calls
    find ready (scratch and weights touched for the first time). Taken as all workers' time,
    it made a batched TreeFC's level loop run its next 24 calls on one worker (101 ms cold on
    two, 92 ms on one, 47 ms on two once warm)."""

    FIRST_WAIT, MAX_WAIT = 0.05, 30.0   # seconds before the slower count is tried again
    PROBE_COST = 20
    SLOWED = 1.5   # a preempted call slower than this times the quiet ones starts a contention

    def __init__(self, most: int, adaptive: bool):
        self.most, self.fewer = most, max(1, most // 2)
        self.adaptive = adaptive and most > 1
        self.contended = False
        self.recent: dict[int, deque] = {}   # worker count -> seconds of its last contended calls
        self.quiet: deque = deque(maxlen=3)  # seconds of the last calls on all workers nothing preempted
        self.wait, self.retry_at = self.FIRST_WAIT, 0.0
        self.spent = 0.0   # seconds of every call reported: the clock the waits are counted on
        self.cold = True   # no call reported yet

    def _best(self) -> int:
        """The count whose last few contended calls had the lower median (one slow or lucky
        call does not decide)."""
        return min(self.recent, key=lambda n: statistics.median(self.recent[n]))

    def choose(self) -> int:
        if not self.contended:
            return self.most
        best = self._best()
        other = self.fewer if best == self.most else self.most
        return other if other not in self.recent or self.spent >= self.retry_at else best

    def report(self, used: int, preempted: int, seconds: float):
        if not self.adaptive or self.cold:
            self.cold = False
            return
        self.spent += seconds
        if used == self.most and not preempted:
            self.quiet.append(seconds)
            if self.contended:   # over: under the next contention, all workers start from this call
                self.contended = False
                self.recent[used] = deque([seconds], maxlen=3)
                fewer = self.recent.get(self.fewer)
                self.wait = max(self.FIRST_WAIT, self.PROBE_COST * statistics.median(fewer) if fewer else 0.0)
                self.retry_at = self.spent + self.wait
            return
        if not self.contended and self.quiet and seconds <= self.SLOWED * statistics.median(self.quiet):
            return   # preempted for a moment: no slower than quiet calls
        self.contended = True
        best_before = self._best() if self.recent else used
        if used != best_before and seconds < statistics.median(self.recent[best_before]):
            # a try of the other count beat the count that runs: it wins, and its samples from
            # before go (a spell of contention that has passed would outvote it for good)
            self.recent[used] = deque([seconds], maxlen=3)
        else:
            self.recent.setdefault(used, deque(maxlen=3)).append(seconds)
        best = self._best()
        if used != best:   # the count tried lost: try it later, later each time it loses
            self.wait = min(max(2 * self.wait, self.PROBE_COST * seconds), self.MAX_WAIT)
            self.retry_at = self.spent + self.wait
        elif best != best_before:   # it won: it runs now, the other is tried after the wait
            self.wait = min(max(self.wait, self.PROBE_COST * statistics.median(self.recent[best_before])),
                            self.MAX_WAIT)
            self.retry_at = self.spent + self.wait


Allocate = Callable[[tuple, torch.dtype], torch.Tensor]   # memory for an output: (shape, dtype) -> uninitialized tensor


def _fresh(shape: tuple, dtype: torch.dtype, device: torch.device | None = None) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


def _on(x: torch.Tensor, device: torch.device) -> bool:
    """Whether `x` is on `device` ("cuda" without an index: on any GPU)."""
    if x.device == device:   # (the common case, settled by one comparison: a seventh of the rest's time)
        return True
    return x.device.type == device.type and (device.index is None or x.device.index == device.index)


_ARENAS = threading.local()


def _shared_arena(device: torch.device, nbytes: int) -> torch.Tensor:
    """The calling thread's scratch arena on `device`, at least `nbytes` long: one for every
    program, grown by half again when a call needs more. An arena holds a call's intermediates
    only while the call runs, and a thread makes one call at a time, so programs called one
    after another (a batch's native blocks, a program's host-driven parts) compute in the same
    memory, still in cache from the last call, where an arena each would be cold memory at
    every call. (Berxit 256 at batch 64 calls 37 blocks a batch: 67.7 -> 61.4 ms back to back.)"""
    arenas = getattr(_ARENAS, "by_device", None)
    if arenas is None:
        arenas = _ARENAS.by_device = {}
    arena = arenas.get(device)
    if arena is None or arena.numel() < nbytes:
        nbytes = max(nbytes + nbytes // 2, 64)
        arena = arenas[device] = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return arena


class CompiledProgram:
    """Calls the generated entry once per inference. Inputs, constants and outputs are torch
    tensors bound by pointer; the scratch arena (`_shared_arena`), the recursion stack and
    per-worker loop counters are allocated once per thread and reused, so calls are thread-safe. All of them
    are on `device`: a CUDA program's on its GPU (the launch copies the pointer tables)."""

    fresh_outputs = True   # every output is a tensor of its own, allocated by the call

    def __init__(self, handle: ctypes.CDLL, library: str, entry: Entry, workers: int, max_depth: int,
                 record=None, max_iterations: int | None = None, device: torch.device | None = None):
        self.library = library
        self.device = torch.device(device or "cpu")
        self._launch_error = getattr(handle, "ct_launch_error", None)   # a CUDA program's (ct_cuda.h)
        if self._launch_error is not None:
            self._launch_error.argtypes, self._launch_error.restype = [ctypes.c_int64], ctypes.c_char_p
        self.entry = entry
        self.workers = workers
        self.max_depth = max_depth
        self.max_iterations = max_iterations   # None: loops run as long as their program says
        self.record = record   # what built it (backend.Record: explain prints it); opaque here
        self._fn = getattr(handle, entry.name)
        self._fn.argtypes = _ARGTYPES
        self._fn.restype = ctypes.c_int64
        self._constants = [DERIVED.get(c.kind, [c.source], lambda c=c: c.pack(c.source)) if isinstance(c, Packed)
                           else c.detach().to(self.device).contiguous() for c in entry.constants]
        self._packed_from = {k: version_of(c.source) for k, c in enumerate(entry.constants) if isinstance(c, Packed)}
        self._const_table = (ctypes.c_void_p * max(len(self._constants), 1))(*[t.data_ptr() for t in self._constants])
        self._local = threading.local()
        self._layouts: dict[tuple, _Layout] = {}   # a call's sizes -> where its values of symbolic sizes go
        self.active_workers = Workers(workers, adaptive=not entry.needs_all_workers)
        # per input: its dtype, rank and the (dim, size) of its dims that are numbers (checked per call)
        self._expected = [(ty.dtype, ty.rank, tuple((d, n) for d, n in enumerate(ty.shape) if not isinstance(n, Sym)))
                          for ty in entry.inputs]

    def _scratch(self):
        """(stack, locals, rets, err) of this program's calls on this thread; the arena is the
        thread's, shared with every other program (`_shared_arena`)."""
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            e, frames, on = self.entry, self.max_depth + 1, self.device
            stacks = self.workers if e.stack_per_worker else 1   # a group of workers per stack
            scratch = self._local.scratch = (
                torch.empty(max(e.frame_bytes, 64) * self.max_depth * stacks, dtype=torch.uint8, device=on)
                if e.frame_bytes else torch.empty(64, dtype=torch.uint8, device=on),
                torch.empty(self.workers * e.lanes * frames * e.locals_per_frame, dtype=torch.int64, device=on),
                torch.empty(self.workers * e.lanes * frames * SLOTS_PER_FRAME, dtype=torch.int64, device=on),
                (ctypes.c_int64 * (ERR_SIZES + len(e.sizes) + len(e.dynamic) + len(e.frame_dynamic) + 1))())
        return scratch   # err[]: see ERR_CODE...; after the sizes, the dynamic offsets, then the frame's bytes

    def _layout(self, values: tuple) -> "_Layout":
        """For a call's sizes (their values, in entry.sizes's order): where the values of
        symbolic sizes go, the outputs' shapes. Kept per sizes: a service meets the same
        lengths again, and this is per-call work in Python."""
        layout = self._layouts.get(values)
        if layout is None:
            sizes = {sym: n for (sym, _, _), n in zip(self.entry.sizes, values)}
            layout = _Layout(*self.entry.arena_layout(sizes), *self.entry.frame_layout(sizes),
                             [_shape_of(t, sizes) for t in self.entry.outputs])
            if len(self._layouts) >= _MAX_LAYOUTS:
                self._layouts.clear()
            self._layouts[values] = layout
        return layout

    def _arena_for(self, layout: "_Layout", err) -> torch.Tensor:
        """The arena for this call's sizes (the thread's shared one, grown if they need more);
        the dynamic values' offsets into err[]."""
        at = ERR_SIZES + len(self.entry.sizes)
        for j, offset in enumerate(layout.arena_offsets):
            err[at + j] = offset
        return _shared_arena(self.device, layout.arena_bytes)

    def _stack_for(self, layout: "_Layout", err) -> torch.Tensor:
        """The same for the recursion stack: its frames are this call's frame size apart."""
        at = ERR_SIZES + len(self.entry.sizes) + len(self.entry.dynamic)
        for j, offset in enumerate(layout.frame_offsets):
            err[at + j] = offset
        err[at + len(layout.frame_offsets)] = layout.frame_bytes
        stacks = self.workers if self.entry.stack_per_worker else 1
        return self._grown_stack(layout.frame_bytes * self.max_depth * stacks)

    def _grown_stack(self, nbytes: int) -> torch.Tensor:
        """The recursion stack, grown by half again if it is below nbytes."""
        scratch = self._local.scratch
        if scratch[0].numel() < nbytes:
            self._local.scratch = (torch.empty(nbytes + nbytes // 2, dtype=torch.uint8, device=self.device),
                                   *scratch[1:])
        return self._local.scratch[0]

    def _refresh_packed(self):
        """Pack again, in place, the constants whose source changed since they were packed
        (their pointers are in the constant table)."""
        for k, version in self._packed_from.items():
            packed = self.entry.constants[k]
            if version_of(packed.source) != version:
                self._constants[k].copy_(packed.pack(packed.source))
                self._packed_from[k] = version_of(packed.source)

    @property
    def identity(self) -> str:
        """Changes whenever the code or the worker count does (the profiler's cache key)."""
        return f"{self.library}:{self.entry.name}:{self.workers}"

    def check_inputs(self, inputs: Sequence[torch.Tensor]):
        if len(inputs) != len(self._expected):
            raise CompiledCallError(f"expected {len(self.entry.inputs)} tensor inputs, got {len(inputs)}")
        for k, (x, (dtype, rank, fixed)) in enumerate(zip(inputs, self._expected)):
            if not _on(x, self.device):
                where = "the CPU" if self.device.type == "cpu" else str(self.device)
                raise CompiledCallError(f"input {k} is on {x.device}; this program was compiled for {where}")
            if x.dtype != dtype or x.dim() != rank or any(x.shape[d] != n for d, n in fixed):
                raise CompiledCallError(f"input {k} is {TensorType.of(x)}; this program was compiled for "
                                        f"{self.entry.inputs[k]}")

    def bind(self, inputs: Sequence[torch.Tensor], alloc: Allocate | None = None) -> "Bound":
        """Everything a call of these inputs needs, short of the call: its scratch laid out for
        their sizes, its outputs allocated (by `alloc(shape, dtype)` where given, else fresh), the
        worker count chosen. A caller that makes the call itself (`codegen.level_loop`) may
        repoint inputs and outputs at tensors of sizes no larger, between calls."""
        self.check_inputs(inputs)
        inputs = [x.contiguous() for x in inputs]
        stack, locals_, rets, err = self._scratch()
        layout, arena, stack = self._armed(inputs, stack, err)
        alloc = alloc or (lambda shape, dtype: _fresh(shape, dtype, self.device))
        outputs = [alloc(shape, t.dtype) for shape, t in zip(layout.shapes, self.entry.outputs)]
        return Bound(inputs, outputs, (ctypes.c_void_p * max(len(inputs), 1))(*[x.data_ptr() for x in inputs]),
                     (ctypes.c_void_p * max(len(outputs), 1))(*[y.data_ptr() for y in outputs]),
                     arena, layout.arena_bytes, stack, locals_, rets, err, self.active_workers.choose(), self._fn,
                     self._const_table)

    def rearm(self, bound: "Bound") -> "Bound":
        """A bound call ready to be made again, on tensors of the same sizes (a caller that
        repoints its inputs and outputs itself, `codegen.level_loop`): err[] is shared by every
        call of this program and scratch may have grown since, so both are set again."""
        stack, *_ = self._scratch()
        _, arena, stack = self._armed(bound.inputs, stack, bound.err)
        return bound._replace(arena=arena, stack=stack)

    def _armed(self, inputs: Sequence[torch.Tensor], stack: torch.Tensor, err):
        """(layout, arena, stack) of a call of `inputs`, with its sizes, scratch offsets and
        signal counter written into err[], and packed constants refreshed."""
        if self._packed_from:
            self._refresh_packed()
        values = tuple(inputs[position].shape[dim] for _, position, dim in self.entry.sizes)
        for k, n in enumerate(values):
            err[ERR_SIZES + k] = n
        layout = self._layout(values)
        arena = self._arena_for(layout, err)
        if self.entry.frame_dynamic:
            stack = self._stack_for(layout, err)
        err[ERR_SIGINTS], err[ERR_MAX_ITERATIONS] = interrupt.arm(), self.max_iterations or 0
        return layout, arena, stack

    def __call__(self, inputs: Sequence[torch.Tensor], alloc: Allocate | None = None) -> list[torch.Tensor]:
        b = self.bind(inputs, alloc)
        start = time.perf_counter()
        with self._on_device():
            code = b.function(b.input_pointers, b.output_pointers, b.constants, b.arena.data_ptr(), b.stack.data_ptr(),
                              self.max_depth, b.locals.data_ptr(), b.rets.data_ptr(), b.err, b.workers)
        self.active_workers.report(b.workers, b.err[ERR_PREEMPTED], time.perf_counter() - start)
        if code:
            self.raise_error(code, b.err)
        return b.outputs   # inputs written in place come back as the last outputs; the caller copies them

    def _on_device(self):
        """Where a CUDA program's launch runs: its tensors' GPU made current (the launch uses the
        current one), after the work torch queued on its current stream for that GPU (the launch
        is on the default stream, which a stream of torch's does not wait for)."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        torch.cuda.current_stream(self.device).synchronize()
        return torch.cuda.device(self.device)

    def raise_error(self, code: int, err=None):
        """Raise what the entry's return code `code` (non-zero) means (`err`: the call's err[])."""
        if code == LAUNCH_FAILED and self._launch_error is not None:
            why = self._launch_error(err[ERR_PREEMPTED] if err is not None else 0).decode()
            raise CompiledCallError(f"the CUDA launch failed: {why}")
        errors = self.entry.errors
        message = errors[code - 1] if 0 < code <= len(errors) else f"error {code}"
        if message == INTERRUPTED:
            # Python's own handler ran too (the C handler chains to it): with the default one,
            # KeyboardInterrupt is pending and surfaces here; a handler of the user's may not raise
            raise KeyboardInterrupt(message)
        if "recursion deeper" in message:
            message += f" ({self.max_depth}); compile with a larger max_depth"
        if message == ITERATIONS_EXCEEDED:
            message += f" ({self.max_iterations})"
        raise CompiledCallError(message)


def default_workers() -> int:
    """The CPUs this process may run on (its affinity mask: a container's or taskset's limit)."""
    return len(os.sched_getaffinity(0))
