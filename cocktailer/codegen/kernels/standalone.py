"""Single-op kernels as a standalone shared library, for tests and microbenchmarks of the
kernels apart from the backend core (which renders whole programs).

    lib = Library([op1, op2, ...])          # renders, compiles (cached by source hash), loads
    err = lib.run(0, [a, b, out], workers=2)  # tensors: operands then the result, contiguous

Kernel i becomes `void run_<i>(void** bufs, int64_t* err, int nthreads)`: a
`#pragma omp parallel num_threads(nthreads)` region around the kernel; buffers are bound
by data_ptr(). `err` is 0, or 1 + the index of the failed check in `messages[i]`.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from typing import Sequence

import torch

from cocktailer.codegen.kernels import KERNELS, PRELUDE
from cocktailer.codegen.kernels.context import KernelContext, ctype
from cocktailer.ir import Operation, Value

CC = os.environ.get("CC", "gcc")
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
CACHE = os.path.join(tempfile.gettempdir(), "cocktailer-kernels")


def render(ops: Sequence[Operation]) -> tuple[str, list[list[str]]]:
    """C source with one `run_<i>` per op, and the run-time error messages of each."""
    parts, messages = [PRELUDE], []
    for i, op in enumerate(ops):
        msgs: list[str] = []
        messages.append(msgs)
        slots = {v.id: j for j, v in enumerate([*op.operands, *op.results])}

        def ptr(v: Value, slots=slots) -> str:
            return f"(({ctype(v.type.dtype)}*)bufs[{slots[v.id]}])"

        def fail(message: str, msgs=msgs) -> str:
            msgs.append(message)
            return f"{{\n#pragma omp atomic write\nerr[0] = {len(msgs)};\ngoto ct_fail; }}"

        names = iter(range(1 << 30))
        ctx = KernelContext(ptr=ptr, worker="w", workers="W", fail=fail, fresh=lambda p, n=names: f"{p}_{next(n)}")
        body = KERNELS[op.op](op, ctx)
        parts.append(f"void run_{i}(void** bufs, int64_t* err, int nthreads) {{\n"
                     f"#pragma omp parallel num_threads(nthreads)\n{{\n"
                     f"const int w = omp_get_thread_num(); const int W = omp_get_num_threads();\n"
                     f"{{\n{body}\n}}\ngoto ct_fail; ct_fail: ;\n}}\n}}\n")
    return "\n".join(parts), messages


def compile_source(source: str, extra_flags: Sequence[str] = ()) -> str:
    """Path of the shared library built from `source` (reused when the source is unchanged)."""
    os.makedirs(CACHE, exist_ok=True)
    flags = [*CFLAGS, *extra_flags]
    key = hashlib.sha256((source + "\0" + " ".join(flags)).encode()).hexdigest()[:24]
    so = os.path.join(CACHE, f"k{key}.so")
    if not os.path.exists(so):
        c = os.path.join(CACHE, f"k{key}.c")
        with open(c, "w") as f:
            f.write(source)
        tmp = f"{so}.{os.getpid()}.tmp"
        proc = subprocess.run([CC, *flags, c, "-o", tmp, "-lm"], capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"{CC} failed on {c}:\n{proc.stderr[-6000:]}")
        os.replace(tmp, so)
    return so


class Library:
    def __init__(self, ops: Sequence[Operation], extra_flags: Sequence[str] = ()):
        self.ops = list(ops)
        self.source, self.messages = render(self.ops)
        self.path = compile_source(self.source, extra_flags)
        self.lib = ctypes.CDLL(self.path)
        self._fns = [getattr(self.lib, f"run_{i}") for i in range(len(self.ops))]

    def bind(self, i: int, tensors: Sequence[torch.Tensor], workers: int):
        """A no-argument callable running kernel i on `tensors`; returns the error code."""
        for t in tensors:
            assert t.is_contiguous()
        bufs = (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])
        err = (ctypes.c_int64 * 1)(0)
        fn, nt = self._fns[i], ctypes.c_int(workers)

        def call() -> int:
            err[0] = 0
            fn(bufs, err, nt)
            return err[0]
        call.keepalive = (bufs, err, tensors)
        return call

    def run(self, i: int, tensors: Sequence[torch.Tensor], workers: int = 2) -> int:
        return self.bind(i, tensors, workers)()
