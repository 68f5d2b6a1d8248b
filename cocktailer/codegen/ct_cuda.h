/* cocktailer's CUDA portability header: the one place a CUDA primitive is spelled.

   A generated CUDA program (codegen.dialect.cuda()) is one persistent kernel: one block per L1
   worker (vEU); every thread of a block runs its block's copy of the control flow, and each
   operator's share of a worker is split again over the block's threads (its lanes). The
   program itself only uses the names below:

     CT_GLOBAL, CT_DEVICE             a kernel entry, a function called on the device
     CT_NOINLINE                      an operator's function: called, not inlined into the kernel
                                      (ptxas's time and the kernel's registers grow with its size)
     CT_LARGE_SKELETON                a kernel too long to optimize (the virtual GPU compiles it at -O0)
     CT_UNROLL(n)                     before a loop: unroll it n times at most (nvcc; registers)
     CT_BLOCK, CT_BLOCKS, CT_LANE, CT_LANES   this block and the grid's, this thread and the block's
     ct_block_any(x)                  block barrier; true on every lane if x was true on any
     CT_BLOCK_SHARED                  this block's shared memory (int64_t*, args.shared_bytes of it):
                                      CT_SCRATCH_PER_LANE bytes a lane for the kernels (CT_BLOCK_SCRATCH),
                                      then the control state where it fits
     CT_BLOCK_BARRIER()               a barrier of the block's lanes inside a kernel all of them call
     ct_shared_limit()                the most shared memory a block may have
     CT_LOAD_ACQUIRE ... CT_ADD_FETCH atomics on int64_t shared by blocks (device scope)
     CT_PAUSE(), CT_YIELD()           what a spinning lane does while it waits
     ct_launch(kernel, args, threads) one cooperative launch of `args.nw` blocks; returns err[0],
                                      or CT_LAUNCH_FAILED (ct_launch_error(err[1]) says why)

   Two executions of the same source:
   - nvcc (__CUDACC__): the real GPU. The launch is cooperative, so a grid that cannot be
     resident at once fails to launch instead of hanging at its first grid barrier.
   - any other C++ compiler: a virtual GPU on the CPU, an OS thread per block and a fiber per
     CUDA thread, switched at block barriers; atomics are the compiler's. With
     COCKTAILER_SHAKE=1 in the environment, a block's lanes run in a random order each round
     and yield their core at random before barriers and in spins, to try other interleavings.

   Rule the tests check: state shared by blocks (grid barriers, the step array, the error code)
   is only touched through the CT_* atomics, never by plain loads and stores; x86's strong
   ordering would hide a missing fence on the CPU, a GPU would not. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

typedef struct {
  void** in; void** out; void** cst; char* arena; char* stack_all; int64_t max_depth;
  int64_t* locals; int64_t* rets; int64_t* err; int nw;
  int64_t sigints0;     /* the SIGINT counter when the call began (read once, by the host) */
  void* bars; int64_t* steps;   /* grid barriers and the step array, zeroed by ct_launch */
  int64_t bar_bytes, step_bytes;
  int64_t shared_bytes;   /* the block's shared memory: the kernels' scratch, then the control state's */
  int64_t state_offset;   /* where in it the control state starts (-1: in locals and rets) */
  int64_t frames_offset;  /* where a team of one block keeps its recursion frames in it (-1: in stack_all) */
  int n_in, n_out, n_cst, n_err;   /* entries of in, out, cst and err: what ct_stage copies to the device */
} ct_args;
/* ct_launch's code when the GPU launch itself failed (err[1] then holds the cudaError_t:
   ct_launch_error names it); generated programs' own codes are positive */
enum { CT_LAUNCH_FAILED = -2 };
typedef void (*ct_kernel)(ct_args);
/* What one call did, for reports without a GPU (bench/cuda_report.py): operators run, bytes
   they and the copies read and write, grid barriers, fine-grained steps, the shared memory
   the launch gave each block. Counted on the virtual GPU only, once per event (by its team's
   first worker's lane 0, or the launch); read and reset by ct_tallies. */
enum { CT_T_OPERATORS, CT_T_BYTES, CT_T_BARRIERS, CT_T_STEPS, CT_T_SHARED_BYTES, CT_TALLIES };
static int64_t ct_tally[CT_TALLIES];

#ifdef __CUDACC__
/* ---------------------------------------------------------------- the real GPU */
#include <cuda/atomic>
#include <cuda_runtime.h>
/* the skeleton declares the state of every construct (frames, team, step count) whether or not
   the program has one: as the CPU build's -Wno-unused-variable, and nothing else */
#pragma nv_diag_suppress 177
#define CT_GLOBAL extern "C" __global__
#define CT_DEVICE __device__
#define CT_NOINLINE __noinline__
#define CT_LARGE_SKELETON
#define CT_PRAGMA(x) _Pragma(#x)
#define CT_UNROLL(n) CT_PRAGMA(unroll n)
#define CT_BLOCK ((int)blockIdx.x)
#define CT_BLOCKS ((int)gridDim.x)
#define CT_LANE ((int)threadIdx.x)
#define CT_LANES ((int)blockDim.x)
#define CT_HOST extern "C" __host__
typedef cuda::atomic_ref<int64_t, cuda::thread_scope_device> ct_atomic;
__device__ static inline int64_t ct_load_acquire(int64_t* p) { return ct_atomic(*p).load(cuda::memory_order_acquire); }
__device__ static inline int64_t ct_load_relaxed(int64_t* p) { return ct_atomic(*p).load(cuda::memory_order_relaxed); }
__device__ static inline void ct_store_release(int64_t* p, int64_t v) { ct_atomic(*p).store(v, cuda::memory_order_release); }
__device__ static inline void ct_store_relaxed(int64_t* p, int64_t v) { ct_atomic(*p).store(v, cuda::memory_order_relaxed); }
__device__ static inline int64_t ct_add_fetch(int64_t* p, int64_t v) {
  return ct_atomic(*p).fetch_add(v, cuda::memory_order_acq_rel) + v;
}
#define CT_PAUSE() __nanosleep(32)
#define CT_YIELD() __nanosleep(1000)
__device__ static inline int ct_block_any(int x) { return __syncthreads_or(x); }
extern __shared__ int64_t ct_shared_mem[];
#define CT_BLOCK_SHARED (ct_shared_mem)
/* the device's opt-in limit per block (227 KB on an H100), read once */
static inline int64_t ct_shared_limit(void) {
  static int64_t limit = -1;
  if (limit < 0) {
    int device = 0, bytes = 0;
    limit = cudaGetDevice(&device) == cudaSuccess &&
            cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess ? bytes : 0;
  }
  return limit;
}

/* the device's memory, for ct_stage (below) */
typedef cudaError_t ct_status;
#define CT_OK cudaSuccess
#define CT_NO_MEMORY cudaErrorMemoryAllocation
static inline ct_status ct_device_alloc(char** p, size_t n) { return cudaMalloc((void**)p, n); }
static inline void ct_device_free(char* p) { cudaFree(p); }
static inline ct_status ct_to_device(void* d, const void* s, size_t n) { return cudaMemcpy(d, s, n, cudaMemcpyHostToDevice); }
static inline ct_status ct_to_host(void* d, const void* s, size_t n) { return cudaMemcpy(d, s, n, cudaMemcpyDeviceToHost); }
enum { CT_SIGINTS_READABLE = 0 };   /* the host's SIGINT counter is not readable on the device */
#define CT_BAD_DEVICE cudaErrorInvalidDevice
static inline ct_status ct_current_device(int* d) { return cudaGetDevice(d); }
static inline ct_status ct_stage(ct_args* a);

/* One cooperative launch on the staged call (ct_stage), err[0..1] copied back after. A GPU
   program is not interrupted by Ctrl-C (see CT_SIGINTS_READABLE). */
static inline int64_t ct_launch(ct_kernel kernel, ct_args a, int threads) {
  int64_t* host_err = a.err;
  a.sigints0 = 0;
  ct_status e = ct_stage(&a);
  void* params[] = { &a };
  if (e == CT_OK && a.shared_bytes > 48 * 1024)   /* above the default, a kernel must ask for it */
    e = cudaFuncSetAttribute((const void*)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)a.shared_bytes);
  if (e == CT_OK)
    e = cudaLaunchCooperativeKernel((const void*)kernel, dim3(a.nw), dim3(threads), params, (size_t)a.shared_bytes, 0);
  if (e == CT_OK) e = cudaDeviceSynchronize();
  if (e == CT_OK) e = ct_to_host(host_err, a.err, 2 * sizeof(int64_t));
  if (e == CT_OK) return host_err[0];
  host_err[1] = (int64_t)e;
  return CT_LAUNCH_FAILED;
}
CT_HOST const char* ct_launch_error(int64_t code) { return cudaGetErrorString((cudaError_t)code); }

#else
/* ---------------------------------------------------------------- a virtual GPU on the CPU */
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <ucontext.h>
#ifdef __SANITIZE_THREAD__
#include <sanitizer/tsan_interface.h>
#endif
/* A fiber (a lane, or its block's thread between lanes) and the switch from one to another.
   On x86-64 a switch pushes the callee-saved registers and the FP control words on the fiber's
   own stack and swaps stack pointers: a few instructions, where swapcontext also makes a system
   call for the signal mask (a quarter of a microsecond, at every lane's every block barrier).
   Elsewhere, and under ThreadSanitizer (whose tests run this path), ucontext. */
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
typedef struct { void* sp; } ct_fiber;
extern "C" void ct_fiber_jump(void** save, void* load) __attribute__((visibility("hidden")));
__asm__(".text\n.p2align 4\n.globl ct_fiber_jump\n.hidden ct_fiber_jump\n.type ct_fiber_jump, @function\n"
        "ct_fiber_jump:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n.size ct_fiber_jump, .-ct_fiber_jump\n");
static inline void ct_fiber_switch(ct_fiber* from, ct_fiber* to) { ct_fiber_jump(&from->sp, to->sp); }
/* A fiber that starts in `entry` (which never returns) on the stack [stack, stack + bytes): the
   frame ct_fiber_jump pops, the creator's FP control words in it, and `entry`'s return address
   0 where a call would have put it (16-byte alignment after it, as the ABI wants at a call). */
static inline int ct_fiber_make(ct_fiber* f, char* stack, size_t bytes, void (*entry)(void)) {
  const uintptr_t top = (uintptr_t)(stack + bytes) & ~(uintptr_t)15;
  uint64_t* frame = (uint64_t*)(top - 9 * sizeof(uint64_t));
  const uint32_t mxcsr = __builtin_ia32_stmxcsr();
  uint16_t x87;
  __asm__ volatile("fnstcw %0" : "=m"(x87));
  memset(frame, 0, 9 * sizeof(uint64_t));
  memcpy(frame, &mxcsr, sizeof mxcsr);
  memcpy((char*)frame + 4, &x87, sizeof x87);
  frame[7] = (uint64_t)(uintptr_t)entry;   /* r15, r14, r13, r12, rbx, rbp (zero) come before it */
  f->sp = frame;
  return 1;
}
#else
typedef struct { ucontext_t context; } ct_fiber;
static inline void ct_fiber_switch(ct_fiber* from, ct_fiber* to) { swapcontext(&from->context, &to->context); }
static inline int ct_fiber_make(ct_fiber* f, char* stack, size_t bytes, void (*entry)(void)) {
  if (getcontext(&f->context)) return 0;
  f->context.uc_stack.ss_sp = stack;
  f->context.uc_stack.ss_size = bytes;
  f->context.uc_link = 0;
  makecontext(&f->context, entry, 0);
  return 1;
}
#endif
#define CT_GLOBAL static
#define CT_DEVICE
#define CT_NOINLINE __attribute__((noinline))
/* a kernel of tens of thousands of lines (a recursion's many call sites): optimizing it takes
   the C++ compiler minutes and gigabytes, for a few instructions per operator call */
#define CT_LARGE_SKELETON __attribute__((optimize("O0")))
#define CT_UNROLL(n)
#define CT_HOST extern "C"
/* A block is one OS thread; its lanes are fibers that it runs in turn, each up to its
   next block barrier: a barrier is where a lane hands the thread to the next one, and a pass
   over the lanes is one round of barriers. Blocks run at once, as on a GPU; a block's lanes
   interleave only at barriers, which is all CUDA promises them (a lane reading another's write
   without a barrier between is a race: COCKTAILER_SHAKE=1 runs them in a random order each
   round, so such a read sees the write in some rounds and not in others; ThreadSanitizer builds
   see each lane as a thread of its own, ordered by barriers alone). An OS thread per lane put
   every block barrier through the kernel's scheduler: thousands of them a call. */
enum { CT_LANE_WAITING = 1, CT_LANE_DONE };
typedef struct ct_vblock ct_vblock;
typedef struct {
  int block, blocks, lane, lanes; int64_t round; ct_vblock* vb; unsigned seed;
  int state; ct_fiber fiber; char* stack; void* tsan_fiber;
} ct_vthread;
struct ct_vblock {
  int any[3];           /* ct_block_any's flags: round r sets any[r % 3], see there */
  int64_t* shared;      /* the block's shared memory */
  ct_vthread* lanes;    /* its lanes, and the thread that runs them in turn */
  ct_fiber scheduler; void* tsan_scheduler;
};
/* the lane running on this OS thread now; atomic, as the lane's state, because the block's
   thread writes them and the lane reads them with no barrier between (see ct_to_lane) */
static thread_local ct_vthread* ct_running;
#define ct_me (__atomic_load_n(&ct_running, __ATOMIC_RELAXED))
static int ct_shake = 0;
#define CT_BLOCK (ct_me->block)
#define CT_BLOCKS (ct_me->blocks)
#define CT_LANE (ct_me->lane)
#define CT_LANES (ct_me->lanes)
#define CT_BLOCK_SHARED (ct_me->vb->shared)
/* as an H100's opt-in limit per block, so that the virtual GPU makes the GPU's choices */
static inline int64_t ct_shared_limit(void) { return 227 * 1024; }
static inline void ct_maybe_yield(void) {
  if (ct_shake && (rand_r(&ct_me->seed) & 3) == 0) sched_yield();
}
static inline int64_t ct_load_acquire(int64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline int64_t ct_load_relaxed(int64_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline void ct_store_release(int64_t* p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline void ct_store_relaxed(int64_t* p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
static inline int64_t ct_add_fetch(int64_t* p, int64_t v) { return __atomic_add_fetch(p, v, __ATOMIC_ACQ_REL); }
#define CT_PAUSE() ct_maybe_yield()
#define CT_YIELD() sched_yield()

/* From a lane to its block's thread (at a barrier, or at the kernel's end), and back. For
   ThreadSanitizer, switches order nothing (the block's thread runs every lane: ordering through
   it would order each lane after the one before it in the same round); a barrier orders each
   lane's steps before it before every lane's steps after it, through a flag per round (three,
   as ct_block_any's: a lane past barrier r must not acquire what another released arriving at
   barrier r + 1 in the same pass). The first switch to a lane orders the launch's set-up
   before it, and a lane's last switch orders all it did before the launch's end. */
static inline void ct_to_scheduler(ct_vthread* me, int round, int last) {
#ifdef __SANITIZE_THREAD__
  __tsan_release(&me->vb->any[round % 3]);
  __tsan_switch_to_fiber(me->vb->tsan_scheduler, last ? 0 : __tsan_switch_to_fiber_no_sync);
#endif
  (void)last;
  ct_fiber_switch(&me->fiber, &me->vb->scheduler);
#ifdef __SANITIZE_THREAD__
  __tsan_acquire(&me->vb->any[round % 3]);
#endif
  (void)round;
}
static inline void ct_to_lane(ct_vthread* lane, int first) {
  __atomic_store_n(&ct_running, lane, __ATOMIC_RELAXED);
#ifdef __SANITIZE_THREAD__
  __tsan_switch_to_fiber(lane->tsan_fiber, first ? 0 : __tsan_switch_to_fiber_no_sync);
#endif
  (void)first;
  ct_fiber_switch(&lane->vb->scheduler, &lane->fiber);
}
static inline void ct_block_barrier(void) {
  ct_vthread* me = ct_me;
  __atomic_store_n(&me->state, CT_LANE_WAITING, __ATOMIC_RELAXED);
  ct_to_scheduler(me, (int)(me->round % 3), 0);
}
/* __syncthreads_or. Round r of a block's lanes ORs into any[r % 3], waits, reads it; lane 0
   then clears any[(r + 2) % 3], the flag of round r + 2: its writers have not passed this
   round's barrier's successor, and its last readers (round r - 1) have passed this one. */
static inline int ct_block_any(int x) {
  ct_vblock* b = ct_me->vb;
  const int slot = (int)(ct_me->round % 3);
  ct_maybe_yield();
  if (x) __atomic_store_n(&b->any[slot], 1, __ATOMIC_RELAXED);
  ct_block_barrier();
  const int any = __atomic_load_n(&b->any[slot], __ATOMIC_RELAXED);
  if (ct_me->lane == 0) __atomic_store_n(&b->any[(slot + 2) % 3], 0, __ATOMIC_RELAXED);
  ct_me->round++;
  return any;
}

typedef struct { ct_kernel kernel; ct_args* args; ct_vblock* vb; int* gate; } ct_vstart;
static thread_local ct_vstart* ct_starting;
static void ct_lane_main(void) {
  ct_starting->kernel(*ct_starting->args);
  ct_vthread* me = ct_me;
  __atomic_store_n(&me->state, CT_LANE_DONE, __ATOMIC_RELAXED);
  ct_to_scheduler(me, 0, 1);   /* never resumed */
}
/* Runs the block's lanes in rounds until all have returned (in a random order each round
   under COCKTAILER_SHAKE). A lane that returns while others wait at a barrier no longer
   counts for it, as an exited thread on a GPU. */
static void ct_run_lanes(ct_vblock* b, int lanes) {
  int* order = (int*)malloc((size_t)lanes * sizeof(int));
  unsigned seed = (unsigned)b->lanes[0].block * 40503u + 1u;
  for (int left = lanes, first = 1; left > 0; first = 0) {
    for (int l = 0; l < lanes; ++l) order[l] = l;
    for (int l = lanes - 1; ct_shake && l > 0; --l) {
      const int k = (int)(rand_r(&seed) % (unsigned)(l + 1)), t = order[l];
      order[l] = order[k]; order[k] = t;
    }
    for (int k = 0; k < lanes; ++k) {
      ct_vthread* lane = &b->lanes[order[k]];
      if (__atomic_load_n(&lane->state, __ATOMIC_RELAXED) == CT_LANE_DONE) continue;
      ct_to_lane(lane, first);
      left -= __atomic_load_n(&lane->state, __ATOMIC_RELAXED) == CT_LANE_DONE;
    }
  }
  free(order);
}
/* A lane's stack, as an OS thread's: 8 MB reserved, touched pages only backed, a guard page
   below so that an overflow faults instead of writing over another lane's. */
enum { CT_LANE_STACK = 8 << 20, CT_GUARD = 4096 };
static int ct_make_lane(ct_vthread* lane) {
  char* stack = (char*)mmap(0, CT_LANE_STACK, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED) return 0;
  lane->stack = stack;
  mprotect(stack, CT_GUARD, PROT_NONE);
  if (!ct_fiber_make(&lane->fiber, stack + CT_GUARD, CT_LANE_STACK - CT_GUARD, ct_lane_main)) return 0;
#ifdef __SANITIZE_THREAD__
  lane->tsan_fiber = __tsan_create_fiber(0);
#endif
  return 1;
}
static void ct_free_lane(ct_vthread* lane) {
  if (lane->stack) munmap(lane->stack, CT_LANE_STACK);
#ifdef __SANITIZE_THREAD__
  if (lane->tsan_fiber) __tsan_destroy_fiber(lane->tsan_fiber);
#endif
}
static void* ct_vblock_main(void* p) {
  ct_vstart* s = (ct_vstart*)p;
  int gate;
  while ((gate = __atomic_load_n(s->gate, __ATOMIC_ACQUIRE)) == 0) sched_yield();
  if (gate == 1) {
    ct_starting = s;
#ifdef __SANITIZE_THREAD__
    s->vb->tsan_scheduler = __tsan_get_current_fiber();
#endif
    ct_run_lanes(s->vb, s->vb->lanes[0].lanes);
  }
  return 0;
}

/* the "device" memory of the virtual GPU is the host's, for ct_stage (below) */
typedef int ct_status;
#define CT_OK 0
#define CT_NO_MEMORY 1
static inline ct_status ct_device_alloc(char** p, size_t n) { *p = (char*)malloc(n); return *p ? CT_OK : CT_NO_MEMORY; }
static inline void ct_device_free(char* p) { free(p); }
static inline ct_status ct_to_device(void* d, const void* s, size_t n) { memcpy(d, s, n); return CT_OK; }
static inline ct_status ct_to_host(void* d, const void* s, size_t n) { memcpy(d, s, n); return CT_OK; }
enum { CT_SIGINTS_READABLE = 1 };
#define CT_BAD_DEVICE 1
static inline ct_status ct_current_device(int* d) { *d = 0; return CT_OK; }
static inline ct_status ct_stage(ct_args* a);

/* An OS thread per block, a fiber per CUDA thread, on the call staged as for the GPU (ct_stage:
   a short count of a table shows here too). Blocks start together once all exist: where one
   cannot be created, none runs (the others would wait for it at their first grid barrier) and
   the launch fails. */
static inline int64_t ct_launch(ct_kernel kernel, ct_args a, int threads) {
  int64_t* host_err = a.err;
  a.sigints0 = __atomic_load_n(a.err[2] ? (const int64_t*)(intptr_t)a.err[2] : &a.err[2], __ATOMIC_RELAXED);
  const char* shake = getenv("COCKTAILER_SHAKE");
  ct_shake = shake != 0 && shake[0] == '1';
  ct_vblock* blocks = (ct_vblock*)calloc((size_t)a.nw, sizeof(ct_vblock));
  ct_vthread* lanes = (ct_vthread*)calloc((size_t)a.nw * threads, sizeof(ct_vthread));
  ct_vstart* starts = (ct_vstart*)calloc((size_t)a.nw, sizeof(ct_vstart));
  pthread_t* ids = (pthread_t*)calloc((size_t)a.nw, sizeof(pthread_t));
  char* shared = (char*)calloc((size_t)a.nw, (size_t)a.shared_bytes + 64);
  int64_t code = CT_LAUNCH_FAILED;
  int gate = 0, made = 0;
  __atomic_add_fetch(&ct_tally[CT_T_SHARED_BYTES], a.shared_bytes, __ATOMIC_RELAXED);
  if (blocks && lanes && starts && ids && shared && ct_stage(&a) == CT_OK) {
    for (; made < a.nw * threads; ++made) {
      const int b = made / threads, l = made % threads;
      ct_vthread* lane = &lanes[made];
      lane->block = b; lane->blocks = a.nw; lane->lane = l; lane->lanes = threads;
      lane->vb = &blocks[b]; lane->seed = (unsigned)made * 2654435761u;
      if (!ct_make_lane(lane)) break;
    }
    int started = 0;
    for (; made == a.nw * threads && started < a.nw; ++started) {
      blocks[started].shared = (int64_t*)(shared + (size_t)started * ((size_t)a.shared_bytes + 64));
      blocks[started].lanes = &lanes[(size_t)started * threads];
      const ct_vstart start = { kernel, &a, &blocks[started], &gate };
      starts[started] = start;
      if (pthread_create(&ids[started], 0, ct_vblock_main, &starts[started])) break;
    }
    __atomic_store_n(&gate, started == a.nw ? 1 : 2, __ATOMIC_RELEASE);
    for (int t = 0; t < started; ++t) pthread_join(ids[t], 0);
    if (started == a.nw) {
      ct_to_host(host_err, a.err, 2 * sizeof(int64_t));
      code = host_err[0];
    }
  }
  for (int k = 0; lanes && k < a.nw * threads; ++k) ct_free_lane(&lanes[k]);
  free(blocks); free(lanes); free(starts); free(ids); free(shared);
  return code;
}
CT_HOST const char* ct_launch_error(int64_t code) {
  (void)code;
  return "the virtual GPU could not start an OS thread per block, a fiber per CUDA thread (or allocate their state)";
}
#endif

/* The call as the device sees it. The runtime binds device memory (on the virtual GPU, the
   host's): the tensors, the arena, the stack, the loop counters and the frames' slots; the
   tables of pointers (in, out, cst) and err[] are host arrays, copied here into one device
   buffer after which come the grid's barriers and step array (zeroed); `a` is repointed at
   the copies. The buffer is kept from call to call, per host thread as the runtime's scratch
   (on a GPU, cudaMalloc and cudaFree synchronize the device), and per device: a thread may
   call programs on several GPUs. */
enum { CT_STAGED_DEVICES = 16 };
static inline ct_status ct_stage(ct_args* a) {
  static thread_local char* buffers[CT_STAGED_DEVICES];
  static thread_local size_t sizes[CT_STAGED_DEVICES];
  int on = 0;
  ct_status e = ct_current_device(&on);
  if (e != CT_OK) return e;
  if (on < 0 || on >= CT_STAGED_DEVICES) return CT_BAD_DEVICE;
  char*& dev = buffers[on];
  size_t& dev_bytes = sizes[on];
  const size_t n_ptrs = (size_t)(a->n_in + a->n_out + a->n_cst), err_bytes = (size_t)a->n_err * sizeof(int64_t);
  const size_t bytes = n_ptrs * sizeof(void*) + err_bytes + (size_t)a->bar_bytes + (size_t)a->step_bytes;
  char* host = (char*)calloc(1, bytes);
  if (!host) return CT_NO_MEMORY;
  void** ptrs = (void**)host;
  memcpy(ptrs, a->in, (size_t)a->n_in * sizeof(void*));
  memcpy(ptrs + a->n_in, a->out, (size_t)a->n_out * sizeof(void*));
  memcpy(ptrs + a->n_in + a->n_out, a->cst, (size_t)a->n_cst * sizeof(void*));
  int64_t* err = (int64_t*)(ptrs + n_ptrs);
  memcpy(err, a->err, err_bytes);
  err[0] = 0; err[1] = 0;   /* an error code; how often workers were preempted (never, here) */
  if (!CT_SIGINTS_READABLE) err[2] = 0;
  if (dev_bytes < bytes) {
    if (dev) ct_device_free(dev);
    dev_bytes = 0;
    e = ct_device_alloc(&dev, bytes);
    if (e == CT_OK) dev_bytes = bytes; else dev = 0;
  }
  if (e == CT_OK) e = ct_to_device(dev, host, bytes);
  free(host);
  if (e != CT_OK) return e;
  void** dev_ptrs = (void**)dev;
  a->in = dev_ptrs; a->out = dev_ptrs + a->n_in; a->cst = dev_ptrs + a->n_in + a->n_out;
  a->err = (int64_t*)(dev_ptrs + n_ptrs);
  a->bars = (char*)a->err + err_bytes;
  a->steps = (int64_t*)((char*)a->bars + a->bar_bytes);
  return CT_OK;
}

#ifdef __CUDACC__
#define CT_TALLY(counts, k, n) ((void)0)
#else
/* a function, not an expression at each of the skeleton's thousands of places (compile time) */
static CT_NOINLINE void ct_count(int counts, int k, int64_t n) {
  if (counts && CT_LANE == 0) __atomic_add_fetch(&ct_tally[k], n, __ATOMIC_RELAXED);
}
#define CT_TALLY(counts, k, n) ct_count((counts), (k), (n))
#endif
CT_HOST void ct_tallies(int64_t* out) {
  for (int k = 0; k < CT_TALLIES; ++k) { out[k] = ct_tally[k]; ct_tally[k] = 0; }
}

#define CT_LOAD_ACQUIRE(p) ct_load_acquire((int64_t*)(p))
#define CT_LOAD_RELAXED(p) ct_load_relaxed((int64_t*)(p))
#define CT_STORE_RELEASE(p, v) ct_store_release((int64_t*)(p), (v))
#define CT_STORE_RELAXED(p, v) ct_store_relaxed((int64_t*)(p), (v))
#define CT_ADD_FETCH(p, v) ct_add_fetch((int64_t*)(p), (v))

/* A worker's share (w of W) split again over its lanes: the sub-worker this lane is, of how
   many. ck_range's shares nest (units * w / W), so a block's lanes together take exactly the
   share the worker would have taken alone. */
#define CT_SUB(w) ((w) * CT_LANES + CT_LANE)
#define CT_SUBS(W) ((W) * CT_LANES)
/* every lane evaluates x, then a block barrier: true on every lane if it was on any */
#define CT_EVERY(x) ct_block_any((x) ? 1 : 0)
#define CT_BLOCK_BARRIER() ((void)ct_block_any(0))
/* a copy's pieces go to every thread of the grid, however small (ct_copy) */
#define CT_COPY_ALONE 0
/* the kernels' shared scratch (a lane's partial result of a reduction done by the block) */
enum { CT_SCRATCH_PER_LANE = 16 };
#define CT_BLOCK_SCRATCH ((char*)CT_BLOCK_SHARED)
/* a block barrier, lane 0 alone evaluates x (a grid barrier's atomics), then true on every
   lane if it was true there */
#define CT_LEAD(x) (ct_block_any(0), ct_block_any(CT_LANE == 0 && (x)))
#define CT_FN CT_DEVICE static inline   /* a helper the kernels call */
/* barriers' waits and copies: called from every place in the skeleton, so not inlined there */
#define CT_OUTLINED CT_DEVICE CT_NOINLINE static
