"""Microbenchmark of the C kernels' MATMUL and CONV2D (cocktailer.codegen.kernels) against
PyTorch's own CPU kernels (MKL sgemm, oneDNN convolution) at the evaluation models' shapes.

    python -m bench.kernels [--quick] [--workers 2] [--filter TEXT] [--json out.json]

Both sides run with the same number of threads (torch.set_num_threads; our kernel's parallel
region with that many workers), on the same tensors, in one process, in alternating rounds;
each round times a batch of calls. Two clocks:

- busy: CPU time on the critical path, per call. Torch: the CPU time each thread of the one
  libgomp pool (which torch, MKL and oneDNN use) spends in a batch of calls, the largest of
  them; threads wait passively (OMP_WAIT_POLICY=PASSIVE is set before torch loads), so time
  spent waiting or descheduled is not in it. Ours: the CPU time each worker spends inside the
  kernel (repeated in one parallel region with barriers between, as in a compiled program),
  the largest of them; the barriers are the backend core's cost, not the kernel's. Time spent
  descheduled while other processes hold the cores is in neither, so this is the number to
  compare on a shared machine, and the table's ratio.
- wall: plain elapsed time per call, which load from other processes inflates (and, for ours,
  the passive barriers between repetitions).

The table shows medians over rounds; ratio = ours / torch busy time (below 1: we are faster).
Not a test: tests check results, never speed.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # before libgomp loads (with torch)

import argparse
import ctypes
import json
import statistics
import time

import torch
import torch.nn.functional as F

from bench.machine import describe
from cocktailer.codegen.kernels import conv, matmul
from cocktailer.codegen.kernels.standalone import Library
from cocktailer.runtime.compiler import compile_shared_library, load_library
from cocktailer.ir import Op, Operation, TensorType, Value, infer_type

# (name, M, K, N): the models' linear layers (x @ W^T with W^T materialized as K x N) and
# attention's score/value products; "xB" is the batch size.
MATMULS = [
    ("lstm x1", 1, 256, 1024), ("nasrnn x1", 1, 256, 2048), ("treelstm x1", 1, 512, 2048),
    ("attention-proj x1", 1, 768, 768), ("seq2seq-out x1", 1, 256, 3797), ("rae x1", 1, 1024, 512),
    ("lstm x64", 64, 256, 1024), ("nasrnn x64", 64, 256, 2048), ("treelstm x64", 64, 512, 2048),
    ("attention-proj x64", 64, 768, 768), ("seq2seq-out x64", 64, 256, 3797), ("rae x64", 64, 1024, 512),
    ("attention-prefill x1", 31, 768, 768), ("attention-prefill x64", 1984, 768, 768),
    # Berxit 256's layers at batch 64: the tokens of every sentence still running (1363 at the
    # first layer, 542 on average over the twelve)
    ("berxit-ffn1 1363", 1363, 256, 1024), ("berxit-qkv 542", 542, 256, 768), ("berxit-out 542", 542, 256, 256),
    ("berxit-ffn1 542", 542, 256, 1024), ("berxit-ffn2 542", 542, 1024, 256),
]
BATCHED = [  # (name, batch shape, M, K, N)
    ("attention-scores x1", (1, 12), 1, 64, 64), ("attention-scores x64", (64, 12), 1, 64, 64),
]
# (name, Cin, Cout, kernel, stride, pad, H x W input); run at each of --conv-batches
CONVS = [
    ("blockdrop stem", 3, 16, 3, 1, 1, 32), ("blockdrop s1 3x3", 16, 16, 3, 1, 1, 32),
    ("blockdrop s2 3x3/2", 16, 32, 3, 2, 1, 32), ("blockdrop s2 3x3", 32, 32, 3, 1, 1, 16),
    ("blockdrop s2 1x1/2", 16, 32, 1, 2, 0, 32), ("blockdrop s3 3x3/2", 32, 64, 3, 2, 1, 16),
    ("blockdrop s3 3x3", 64, 64, 3, 1, 1, 8),
    ("skipnet stem 7x7/2", 3, 64, 7, 2, 3, 224), ("skipnet s1 1x1", 256, 64, 1, 1, 0, 56),
    ("skipnet s1 3x3", 64, 64, 3, 1, 1, 56), ("skipnet s1 1x1 up", 64, 256, 1, 1, 0, 56),
    ("skipnet s2 3x3/2", 128, 128, 3, 2, 1, 56), ("skipnet s2 3x3", 128, 128, 3, 1, 1, 28),
    ("skipnet s3 1x1", 1024, 256, 1, 1, 0, 14), ("skipnet s3 3x3", 256, 256, 3, 1, 1, 14),
    ("skipnet s3 1x1 up", 256, 1024, 1, 1, 0, 14), ("skipnet s4 3x3", 512, 512, 3, 1, 1, 7),
    ("skipnet s4 1x1 up", 512, 2048, 1, 1, 0, 7), ("skipnet gate 1x1", 1024, 10, 1, 1, 0, 1),
]


def _operation(kind: Op, inputs: list[torch.Tensor], **attrs) -> Operation:
    operands = [Value(TensorType.of(t)) for t in inputs]
    return Operation(kind, operands, [Value(infer_type(kind, [v.type for v in operands], attrs))], attrs)


_CLOCKS_C = r"""
#include <omp.h>
#include <pthread.h>
#include <time.h>
int thread_clocks(int n, clockid_t* ids) {
  int got = 0;
  #pragma omp parallel num_threads(n)
  {
    clockid_t c;
    pthread_getcpuclockid(pthread_self(), &c);
    ids[omp_get_thread_num()] = c;
    #pragma omp atomic
    got++;
  }
  return got;
}
"""


def thread_clocks(workers: int) -> list[int]:
    """CPU clock ids of the OpenMP pool's threads (the caller's included)."""
    lib = load_library(compile_shared_library(_CLOCKS_C)[0], _CLOCKS_C)
    ids = (ctypes.c_int * workers)()
    n = lib.thread_clocks(workers, ids)
    return list(ids[:n])


def _rounds(fns, seconds: float, clocks: list[int]) -> tuple[list[list[float]], list[list[float]]]:
    """fns: (callable, operations it performs). Alternate them until `seconds` have passed.
    Per round and function: busy and wall seconds per operation."""
    for f, _ in fns:
        f()
    busy: list[list[float]] = [[] for _ in fns]
    wall: list[list[float]] = [[] for _ in fns]
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(busy[0]) < 5:
        for b, w, (f, n) in zip(busy, wall, fns):
            c0 = [time.clock_gettime(c) for c in clocks]
            t0 = time.perf_counter()
            f()
            w.append((time.perf_counter() - t0) / n)
            b.append(max(time.clock_gettime(c) - x for c, x in zip(clocks, c0)) / n)
    return busy, wall


def _repeat(f, n: int):
    def run():
        for _ in range(n):
            f()
    return run


def _cases(batches: tuple[int, ...]):
    g = torch.Generator().manual_seed(0)
    for name, M, K, N in MATMULS:
        a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
        w = b.t().contiguous()
        op = _operation(Op.MATMUL, [a, b])
        yield (name, f"{M}x{K} @ {K}x{N}", 2 * M * K * N, op, [a, b],
               {"torch.matmul": lambda a=a, b=b: torch.matmul(a, b), "F.linear": lambda a=a, w=w: F.linear(a, w)},
               matmul.path(op))
    for name, batch, M, K, N in BATCHED:
        a, b = torch.randn(*batch, M, K, generator=g), torch.randn(*batch, K, N, generator=g)
        op = _operation(Op.MATMUL, [a, b])
        yield (name, f"{list(batch)}x{M}x{K} @ {K}x{N}", 2 * a.numel() // K * K * N, op,
               [a, b], {"torch.matmul": lambda a=a, b=b: torch.matmul(a, b)}, matmul.path(op))
    for nb in batches:
        for name, cin, cout, k, s, p, h in CONVS:
            x, wt = torch.randn(nb, cin, h, h, generator=g), torch.randn(cout, cin, k, k, generator=g)
            attrs = dict(stride=(s, s), padding=(p, p), dilation=(1, 1), groups=1)
            op = _operation(Op.CONV2D, [x, wt], **attrs)
            oh = op.results[0].type.shape[-1]
            flops = 2 * nb * cout * oh * oh * cin * k * k
            yield (f"{name} x{nb}", f"{cin}->{cout} k{k} s{s} {h}x{h}", flops, op, [x, wt],
                   {"F.conv2d": lambda x=x, wt=wt, s=s, p=p: F.conv2d(x, wt, None, s, p)}, conv.path(op))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="shorter rounds, conv at batch 1 only")
    ap.add_argument("--filter", default="", help="only cases whose name contains this")
    ap.add_argument("--seconds", type=float, default=None, help="measuring time per case")
    ap.add_argument("--json", default=None)
    ap.add_argument("--conv-batches", default="1,8,64", help="batch sizes of the conv cases")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.workers)
    seconds = args.seconds or (0.5 if args.quick else 2.0)
    cases = [c for c in _cases((1,) if args.quick else tuple(int(b) for b in args.conv_batches.split(","))) if args.filter in c[0]]
    lib = Library([c[3] for c in cases])
    clocks = thread_clocks(args.workers)
    rows = []
    print(f"{'case':26} {'shape':28} {'kernel':>13} {'ours us':>9} {'torch us':>9} {'ratio':>6} {'GFLOP/s':>8}"
          f"   wall: ours / torch us")
    for i, (name, shape, flops, op, inputs, peers, kernel) in enumerate(cases):
        rtype = op.results[0].type
        out = torch.empty(rtype.shape, dtype=rtype.dtype)
        ref = (peers.get("torch.matmul") or peers["F.conv2d"])()
        lib.run(i, [*inputs, out], args.workers)
        assert torch.allclose(out, ref, rtol=1e-3, atol=1e-3 * ref.abs().max().item()), name
        probe, _ = _rounds([(lib.bind(i, [*inputs, out], args.workers), 1)] + [(p, 1) for p in peers.values()], 0.1,
                           clocks)
        inner = max(1, int(2e-3 / max(min(statistics.median(s) for s in probe), 1e-7)))
        # ours: `inner` repetitions in one parallel region, barriers between (as between a program's ops)
        cpu = (ctypes.c_double * args.workers)()
        batch = lib.bind(i, [*inputs, out], args.workers, reps=inner, poison=False, cpu=cpu)
        kernel_busy: list[float] = []

        def ours():
            batch()
            kernel_busy.append(max(cpu) / inner)
        busy, wall = _rounds([(ours, inner)] + [(_repeat(p, inner), inner) for p in peers.values()], seconds, clocks)
        busy[0] = kernel_busy[-len(busy[0]):]
        med = [statistics.median(s) for s in busy]
        wmed = [statistics.median(s) for s in wall]
        best = min(range(1, len(med)), key=lambda j: med[j])
        ratio = med[0] / med[best]
        rows.append({"case": name, "shape": shape, "kernel": kernel, "flops": flops,
                     "ours": {"busy_s": med[0], "busy_min_s": min(busy[0]), "wall_s": wmed[0]},
                     "torch": {p: {"busy_s": m, "busy_min_s": min(b), "wall_s": w}
                               for p, m, b, w in zip(peers, med[1:], busy[1:], wmed[1:])},
                     "best_torch": list(peers)[best - 1], "ratio": ratio})
        print(f"{name:26} {shape:28} {kernel:>13} {med[0] * 1e6:9.1f} {med[best] * 1e6:9.1f} {ratio:6.2f} "
              f"{flops / med[0] * 1e-9:8.1f}   {wmed[0] * 1e6:.1f} / {wmed[best] * 1e6:.1f} ({list(peers)[best - 1]})",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": describe(), "workers": args.workers, "torch": torch.__version__,
                       "load": os.getloadavg(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
