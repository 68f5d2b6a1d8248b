"""Dialects: everything target-specific in generated code. The renderer, the synchronization
below and every kernel template are written once against these; a target is one `Dialect`
value (tinygrad's CStyleLanguage / CUDARenderer split).

What a dialect supplies:
- the parallel region every L1 unit (worker) enters, and who each worker is;
- the vector-loop annotation of L0 (SIMD lanes), with reductions;
- atomics and the wait primitives (pause, yield) that barriers are built from, as C macros
  (`CT_LOAD_ACQUIRE`, `CT_LOAD_RELAXED`, `CT_STORE_RELEASE`, `CT_STORE_RELAXED`,
  `CT_ADD_FETCH` (acquire-release), `CT_PAUSE`, `CT_YIELD`);
- where state shared by all workers lives (the barriers, the step array);
- how a worker reports that the OS preempted it (another process wanted its core): the
  runtime then picks each call's worker count by what has been faster (runtime.native.Workers);
- whether a worker is several lanes that each run its copy of the control flow (a CUDA block's
  threads): then each kernel's share of a worker is split again over its lanes (`share`), every
  kernel call ends with a barrier of the worker's lanes (`every`), a grid barrier or a step is
  taken by one lane for all (`lead`), and the entry is a kernel plus a host function that
  launches it (`launched`).

The CPU dialect's lanes are its SIMD loops, inside one thread; the CUDA one's (`cuda(threads)`)
are threads, and everything CUDA-specific is spelled in one header, `ct_cuda.h`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from importlib import resources


@dataclass(frozen=True)
class Dialect:
    name: str
    defines: tuple[str, ...]        # feature macros, before any header
    headers: tuple[str, ...]
    primitives: str                 # C definitions of the CT_* atomics and wait primitives
    function_prefix: str            # qualifiers of the entry point
    shared_decls: str               # declared before the parallel region: shared by all workers
    parallel_begin: str             # opens the region every worker runs; `nw` is the worker count
    worker_ids: str                 # declares ct_gw (this worker), w and W (its team's view), private state
    barrier: str                    # all workers of the team wait here
    simd_pragma: str                # marks a loop whose iterations are L0 lanes
    preemptions: tuple[str, str]    # each worker, entering and leaving: adds to err[1] how often it was preempted
    kernel_prefix: str = "__attribute__((noinline)) static"   # qualifiers of an operator's function
    share: tuple[str, str] = ("{w}", "{W}")   # a worker's share (w of W) as its lane's sub-share
    every: str = "{}"               # every lane evaluates an expression; true where it was on any lane
    lead: str = "{}"                # one lane evaluates it for the worker (a grid barrier's atomics)
    state_index: str = "ct_gw"      # whose copy of the control flow's state (loop counters, frames' slots)
    threads: int = 1                # lanes per worker that each run the control flow (CUDA threads)
    launched: bool = False          # the entry is a kernel (`<entry>_kernel`) and a host function launching it
    engine: bool = True             # the kernels may use the GEMM engine (KernelContext.engine)
    line_shares: bool = True        # work is split at cache lines (KernelContext.line_shares)
    cooperative: bool = False       # kernels may split one output over a worker's lanes (KernelContext.cooperative)
    state_in_shared: bool = False   # the control state (frames' slots, loop counters) in a block's shared
                                    # memory where the launch finds room for it (CT_BLOCK_SHARED)
    tally: str = ""                 # counts an event ({counts}: whether this worker counts it) for reports
    large_skeleton: str = '__attribute__((optimize("O0")))'   # qualifies an entry too long to optimize
    helpers: str = ""               # C the skeleton calls, after the shared synchronization (SYNC_C)

    def simd(self, *reductions: str) -> str:
        """The annotation of a vector loop, with reductions such as "+:acc"."""
        if not self.simd_pragma:
            return ""
        return " ".join([self.simd_pragma, *(f"reduction({r})" for r in reductions)])

    def shares(self, w: str, W: str) -> tuple[str, str]:
        return self.share[0].format(w=w), self.share[1].format(W=W)

    def by_lead(self, statement: str) -> str:
        """A C statement (an expression without value) one lane takes for its worker."""
        return f"{statement};" if self.lead == "{}" else f"(void){self.lead.format(f'({statement}, 0)')};"

    def atomic_store(self, dst: str, value) -> str:
        """A store other workers may read while it happens (an error code)."""
        return f"CT_STORE_RELAXED(&{dst}, {value});"


# How often the OS has taken this thread off its core for another (involuntary switches): the
# workers' preemption count (`Workers`); the native loops' library counts with it too.
THREAD_SWITCHES = """static inline long ct_switches(void) {
  struct rusage u;
  return getrusage(RUSAGE_THREAD, &u) ? 0 : u.ru_nivcsw;
}
"""

_GNU_ATOMICS = r"""
#define CT_LOAD_ACQUIRE(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define CT_LOAD_RELAXED(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define CT_STORE_RELEASE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define CT_STORE_RELAXED(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define CT_ADD_FETCH(p, v) __atomic_add_fetch((p), (v), __ATOMIC_ACQ_REL)
#if defined(__x86_64__) || defined(__i386__)
#define CT_PAUSE() __builtin_ia32_pause()
#else
#define CT_PAUSE() ((void)0)
#endif
#define CT_YIELD() sched_yield()
#define CT_FN static inline   /* a helper (on CUDA, a device function) */
#define CT_OUTLINED static inline   /* the same (on CUDA, one the kernel calls: see ct_cuda.h) */
""" + THREAD_SWITCHES

CPU = Dialect(
    name="c-openmp",
    defines=("_GNU_SOURCE",),   # RUSAGE_THREAD
    headers=("stdint.h", "string.h", "math.h", "omp.h", "sched.h", "sys/resource.h"),
    primitives=_GNU_ATOMICS,
    function_prefix="",
    shared_decls="ct_barrier_t ct_bars[CT_MAX_NEST * nw]; memset(ct_bars, 0, sizeof ct_bars); "
                 "int64_t ct_steps[CT_STEP_STRIDE * nw]; memset(ct_steps, 0, sizeof ct_steps);",
    parallel_begin="#pragma omp parallel num_threads(nw)",
    worker_ids="const int ct_gw = omp_get_thread_num(); int w = ct_gw, W = omp_get_num_threads();",
    barrier="if (ct_wait(ct_team, W, err)) goto ct_fail;",
    simd_pragma="#pragma omp simd",
    # only where there are several workers: one worker waits for no other
    preemptions=("const long ct_switches0 = nw > 1 ? ct_switches() : 0;",
                 "if (nw > 1) CT_ADD_FETCH(&err[1], (int64_t)(ct_switches() - ct_switches0));"),
)


CT_CUDA_H = resources.files("cocktailer.codegen").joinpath("ct_cuda.h").read_text()
# the shared memory each lane of a block has for the kernels' reductions (ct_cuda.h's)
SCRATCH_PER_LANE = int(re.search(r"CT_SCRATCH_PER_LANE = (\d+)", CT_CUDA_H).group(1))


def cuda(threads: int = 32, state_in_shared: bool = True) -> Dialect:
    """The CUDA dialect for blocks of `threads` threads: one block per worker (vEU), the program
    one persistent kernel launched cooperatively (`ct_cuda.h`'s `ct_launch`); its control state
    (the simulated stack's resume labels and caller frames, loop counters) in the block's shared
    memory where it fits, else (or with `state_in_shared` False) in global memory."""
    return replace(_CUDA, threads=threads, state_in_shared=state_in_shared)


_CUDA = Dialect(
    name="cuda",
    defines=(),
    headers=(),
    primitives=CT_CUDA_H,
    function_prefix="",
    shared_decls="ct_barrier_t* ct_bars = (ct_barrier_t*)ct_a.bars; int64_t* ct_steps = ct_a.steps;",
    parallel_begin="",
    worker_ids="const int ct_gw = CT_BLOCK; int w = ct_gw, W = CT_BLOCKS; "
               "const int64_t ct_gt = (int64_t)ct_gw * CT_LANES + CT_LANE;",
    barrier="if (ct_grid_wait(ct_team, W, err, w == 0)) goto ct_fail;",
    simd_pragma="",
    preemptions=("", ""),   # a GPU's blocks are not preempted by other processes
    kernel_prefix="CT_DEVICE CT_NOINLINE static",
    share=("CT_SUB({w})", "CT_SUBS({W})"),
    every="CT_EVERY({})",
    lead="CT_LEAD({})",
    state_index="ct_gt",
    launched=True,
    engine=False,
    line_shares=False,
    cooperative=True,
    tally="CT_TALLY({counts}, {kind}, {amount});",
    large_skeleton="CT_LARGE_SKELETON",
    helpers=r"""
/* The skeleton's barrier, called from each of its (thousands of) places rather than spelled out
   there (the C++ compiler took 40% longer on a virtual GPU's skeleton with it spelled out): the
   block's lanes meet, lane 0 waits for the grid's other blocks, and the barrier is counted.
   Inline: nvcc inlines it (called, the kernel needed 16 to 27 more registers: ABI calls), and a
   skeleton long enough for its compile time to matter is not optimized on the CPU anyway. */
CT_FN int ct_grid_wait(ct_barrier_t* team, int W, const int64_t* err, int counts) {
  CT_TALLY(counts, CT_T_BARRIERS, 1);
  return CT_LEAD(ct_wait(team, W, err));
}
""",
)

# Synchronization and copies every target shares, written with the dialect's primitives.
SYNC_C = r"""
/* A team's barrier: an arrival counter and a generation, on a cache line of its own. A waiter
   spins briefly, then yields its core: on a busy machine the worker it waits for may be
   descheduled, and spinning (as OpenMP's barrier does) would only keep it off the core.
   A team is a range of workers; the whole team is one, and a fan-out splits it into groups,
   each with its own barrier (CT_MAX_NEST levels of splitting at most). A waiter gives up when
   another worker failed and left (err is set), so no worker waits for one that is gone;
   ct_join is the barrier after a fan-out. */
typedef struct { int64_t count; int64_t gen; char pad[48]; } ct_barrier_t;
enum { CT_MAX_NEST = 8, CT_SLOTS = 8 };
CT_OUTLINED int ct_wait(ct_barrier_t* b, int W, const int64_t* err) {
  if (W == 1) return 0;
  const int64_t gen = CT_LOAD_ACQUIRE(&b->gen);
  if (CT_ADD_FETCH(&b->count, 1) == W) {
    CT_STORE_RELAXED(&b->count, 0);
    CT_STORE_RELEASE(&b->gen, gen + 1);
    return 0;
  }
  for (int spins = 0; CT_LOAD_ACQUIRE(&b->gen) == gen; ++spins) {
    if (err && CT_LOAD_RELAXED(err)) return 1;
    if (spins < 4096) CT_PAUSE(); else CT_YIELD();
  }
  return 0;
}
CT_FN int ct_join(ct_barrier_t* b, int W, const int64_t* err) { return ct_wait(b, W, err); }
/* Rammer's fine-grained barrier-rTask: every worker publishes how many steps (fine-grained
   barriers) it has passed in the step array, one cache line per worker; a worker that depends
   on worker p waits until p has passed the same step. Every worker passes the same steps in
   the same order (each runs its own copy of the control flow), so the counts agree. */
enum { CT_STEP_STRIDE = 8 };
CT_OUTLINED int ct_await(const int64_t* steps, int p, int64_t step, const int64_t* err) {
  for (int spins = 0; CT_LOAD_ACQUIRE(&steps[p * CT_STEP_STRIDE]) < step; ++spins) {
    if (CT_LOAD_RELAXED(err)) return 1;
    if (spins < 4096) CT_PAUSE(); else CT_YIELD();
  }
  return 0;
}
/* every worker copies its share of n bytes, in pieces of whole 16 bytes; below CT_COPY_ALONE
   bytes, the first worker all of them (on a CPU, splitting a small copy costs more than it
   saves; a GPU's dialect sets it to 0: each thread's piece is small) */
#ifndef CT_COPY_ALONE
#define CT_COPY_ALONE 4096
#endif
CT_OUTLINED void ct_copy(char* restrict dst, const char* restrict src, int64_t n, int w, int W) {
  if (dst == src) return;
#if CT_COPY_ALONE > 0
  if (n < CT_COPY_ALONE) { if (w == 0) memcpy(dst, src, (size_t)n); return; }
#endif
  int64_t chunk = ((n + W - 1) / W + 15) & ~(int64_t)15, begin = chunk * w;
  int64_t end = begin + chunk < n ? begin + chunk : n;
  if (begin < end) memcpy(dst + begin, src + begin, (size_t)(end - begin));
}
"""

# Workers run the same kernels concurrently on neighbouring data; GCC 12 (-O3 -march=native)
# produced wrong results under `restrict` there (a 2-row GEMV split by columns over two workers
# gave wrong rows intermittently; the same source without `restrict` was right in every run),
# so generated code promises no more than plain C pointers do.
_NO_RESTRICT = "#define restrict"


def preamble(dialect: Dialect) -> str:
    """What every generated file starts with: headers, the dialect's primitives, the shared
    synchronization."""
    head = "\n".join([*(f"#define {d}" for d in dialect.defines), *(f"#include <{h}>" for h in dialect.headers)])
    return "\n".join([head, dialect.primitives, _NO_RESTRICT, SYNC_C, dialect.helpers])
