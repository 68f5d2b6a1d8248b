"""Single-op kernels as a standalone shared library, for tests and microbenchmarks of the
kernels apart from the backend core (which renders whole programs).

    lib = Library([op1, op2, ...])          # renders, compiles (in the cache, runtime.cache), loads
    err = lib.run(0, [a, b, out], workers=2)  # tensors: operands then the result, contiguous

Kernel i becomes `void run_<i>(void** bufs, int64_t* err, int nw, int reps, int poison,
double* cpu)`: the dialect's parallel region on `nw` workers, which runs the kernel `reps`
times with a barrier before and after each, as between the ops of a compiled program. With
`poison` the result is overwritten (0x7f bytes) before every repetition but the first, so that
a worker writing outside its share -- even a compiler-invented store of a stale value -- may
race with the worker that owns those elements and show in the result. With `cpu` (non-NULL),
cpu[w] receives the CPU time worker w spent inside the kernel over all repetitions.
Buffers are bound by data_ptr(). `err` is 0, or 1 + the index of the failed check in
`messages[i]`.
"""
from __future__ import annotations

import ctypes
from typing import Sequence

import torch

from cocktailer.codegen.dialect import CPU, preamble
from cocktailer.codegen.kernels import KERNELS, PRELUDE
from cocktailer.codegen.kernels.context import KernelContext, ctype
from cocktailer.ir import Operation, Value
from cocktailer.runtime.compiler import compile_shared_library, load_library

_CLOCK = r"""
#include <time.h>
static double ck_thread_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
"""


def render(ops: Sequence[Operation], gpu_kernels: bool = False) -> tuple[str, list[list[str]]]:
    """C source with one `run_<i>` per op, and the run-time error messages of each.
    `gpu_kernels`: the kernels as the CUDA dialect renders them (no GEMM engine, work split at
    single elements: KernelContext.engine, line_shares), run here by the CPU's workers."""
    d = CPU
    parts, messages = [preamble(d), PRELUDE, _CLOCK], []
    for i, op in enumerate(ops):
        msgs: list[str] = []
        messages.append(msgs)
        slots = {v.id: j for j, v in enumerate([*op.operands, *op.results])}

        def ptr(v: Value, slots=slots) -> str:
            return f"(({ctype(v.type.dtype)}*)bufs[{slots[v.id]}])"

        def fail(message: str, msgs=msgs) -> str:
            msgs.append(message)
            return f"{{ {d.atomic_store('err[0]', len(msgs))} goto ct_fail; }}"

        names = iter(range(1 << 30))
        ctx = KernelContext(ptr=ptr, worker="w", workers="W", fail=fail, fresh=lambda p, n=names: f"{p}_{next(n)}",
                            simd=d.simd, engine=not gpu_kernels, line_shares=not gpu_kernels)
        body = KERNELS[op.op](op, ctx)
        out = op.results[0]
        nbytes, slot = out.type.numel * out.type.dtype.itemsize, slots[out.id]
        parts.append(f"void run_{i}(void** bufs, int64_t* err, int nw, int reps, int poison, double* cpu) {{\n"
                     f"ct_barrier_t ct_bar; memset(&ct_bar, 0, sizeof ct_bar);\n"
                     f"{d.parallel_begin}\n{{\n"
                     f"{d.worker_ids} ct_barrier_t* ct_team = &ct_bar; (void)ct_gw;\n"
                     f"double busy = 0;\n"
                     f"for (int rep = 0; rep < reps; ++rep) {{\n"
                     f"if (poison && rep > 0 && w == 0) memset(bufs[{slot}], 0x7f, {nbytes});\n"
                     f"{d.barrier}\n"
                     f"const double t0 = cpu ? ck_thread_seconds() : 0;\n"
                     f"{{\n{body}\n}}\n"
                     f"if (cpu) busy += ck_thread_seconds() - t0;\n"
                     f"{d.barrier}\n"
                     f"}}\nct_fail: ;\n"
                     f"if (cpu) cpu[w] = busy;\n}}\n}}\n")
    return "\n".join(parts), messages


class Library:
    def __init__(self, ops: Sequence[Operation], extra_flags: Sequence[str] = (), gpu_kernels: bool = False):
        self.ops = list(ops)
        self.source, self.messages = render(self.ops, gpu_kernels)
        path, _ = compile_shared_library(self.source, extra_flags)
        self.lib, self.path = load_library(path, self.source, extra_flags), str(path)
        self._fns = [getattr(self.lib, f"run_{i}") for i in range(len(self.ops))]

    def bind(self, i: int, tensors: Sequence[torch.Tensor], workers: int, reps: int = 1, poison: bool = True,
             cpu: "ctypes.Array | None" = None):
        """A no-argument callable running kernel i on `tensors` (the result last) `reps` times
        in one parallel region; returns the error code. `cpu`: a ctypes double array of
        `workers` entries that receives each worker's CPU seconds inside the kernel."""
        for t in tensors:
            assert t.is_contiguous()
        bufs = (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])
        err = (ctypes.c_int64 * 1)(0)
        fn, nt, nr, np_ = self._fns[i], ctypes.c_int(workers), ctypes.c_int(reps), ctypes.c_int(int(poison))

        def call() -> int:
            err[0] = 0
            fn(bufs, err, nt, nr, np_, cpu)
            return err[0]
        call.keepalive = (bufs, err, tensors, cpu)
        return call

    def run(self, i: int, tensors: Sequence[torch.Tensor], workers: int = 2, reps: int = 1) -> int:
        return self.bind(i, tensors, workers, reps)()
