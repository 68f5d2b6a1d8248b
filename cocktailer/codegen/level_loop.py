"""C source of the level loop: a recursion's levels run by native code, one level program after
another, instead of by Python calling each (Cocktailer's control flow inside the compiled code,
over Cortex's level-by-level execution).

Once the inspector has numbered a batch's calls level by level (`batching.inspector`), a group is
a range of call ids start..end-1 that runs one level program (`batching.levels`). Each level
program is a generated entry point (`renderer`), bound once per batch at the largest group's lane
count (its arena laid out for that many lanes serves any fewer). For group g the loop points each
input and output at row `start` (`base + start * stride`; stride 0: the same tensor for every
group, a weight or the results tables the group gathers from), puts the group's lane count in
its entry's `err[]` size slot, and calls it. Results go straight into the results tables.

    int64_t ck_run_levels(int64_t groups, const int64_t* group, const ck_level_t* levels, int nw,
                          int64_t* failed, int64_t* preempted)

`group[3 * g + 0..2]`: start, end, and which of `levels` runs it. Returns LOOP_DONE, LOOP_FAILED
(an entry returned `failed[1]` at group `failed[0]`) or LOOP_OUT_OF_RANGE (group `failed[0]` set
its out-of-range flag: an index outside its instance's size); `failed` has room for three, as
every loop here notes the failing program in `failed[2]`. `preempted`: the OS preemptions all
the calls' workers counted.

The round loop: the rounds of an inspector whose control slice computes with tensors
(`batching.rounds`: DRNN's expansion gate), run by native code instead of by Python a round at
a time (ACROBAT §4.2: the batch computes what the decision needs, decides, and only the calls
that expand run the spawn). A round is the range of call ids found by the round before (the
first: one call per instance, ids 0..count-1). For each round the loop calls

- the decide program over the round's calls, writing each call's branch conditions (`cond[b]`,
  one byte per call id) from which it takes the call's path (bit b: the first arm of branch b);
- per path taken, the path program over the calls taking it: their per-call columns (`column[0]`
  the call's instance, `column[1 + v]` its v-th varying argument) gathered into `scratch`, and
  its outputs (for the k-th self-call site it reaches and varying argument v, output
  `k * varying + v`) written straight into the columns at the children's new ids.

Each child gets its caller's instance and a `kids` entry (caller, site); once no round finds
more calls, heights (leaves 0) are taken from the children, last id first (children come after
their parents).

    int64_t ck_run_rounds(const ck_rounds_t* R, int nw, int64_t* found, int64_t* failed,
                          int64_t* preempted)

Returns LOOP_DONE (`found[0]` calls), LOOP_FAILED, LOOP_OUT_OF_RANGE (`failed[0]`: the round,
`failed[2]`: the path whose program failed, -1: decide's),
LOOP_FULL (more calls than `calls_cap`, or a round wider than `lanes_cap`: the caller binds
again with more room) or ROUNDS_DEEP (more rounds than `max_rounds`).

The while loop: a loop that ends on a condition each lane computes from what the loop carries
(a decoder's EOS), every step in native code (`batching.loops`: the lanes' carried values in a
table of a block of `count` rows per step; step t reads block t and writes block t+1). Block t
holds, in its first rows, the lanes still in the loop when step t - 1 ended (`holder`: which
lane each row is). For each step the loop calls

- the condition program over those rows, one byte per row in `go` (and a lane also leaves once
  t reaches its own trip count, where the loop has one): a lane that leaves keeps its values
  where they are (`final_row`, after `ran` steps);
- the body over the lanes that stay, compacted: body row i of step t is lane `lane_at`, reads
  its carried values from row `source` through an index (the gather fused into the kernel) and
  writes row i of block t+1.

    int64_t ck_run_while(const ck_while_t* W, int nw, int64_t* failed, int64_t* preempted)

Returns LOOP_DONE, LOOP_FAILED (`failed[0]`: the step, `failed[1]` the code, `failed[2]` 0: the
condition's program, 1: the body's), LOOP_OUT_OF_RANGE, LOOP_FULL (a lane is still in the
loop after `steps_cap` steps: the caller runs it again with more blocks) or LOOP_ITERATIONS
(a lane is still in the loop after `max_iterations` steps, where that is not negative).

The nested loop: a counted loop whose body holds a counted loop (`batching.loops.NestedProgram`).
The outer loop's lanes are sorted by trip count, so those in the loop at step t are the first
`active[t]` rows of block t (as a counted loop's are). Per outer step the loop calls

- `pre` (the outer body's ops before the inner loop) over those rows; it writes, among the
  values the rest of the step reads, each row's inner trip count (`trips`) and the inner
  loop's initial values, which the loop copies into block 0 of the inner loop's tables;
- `inner`, step by step, over the rows still in the inner loop, compacted: inner step s writes
  block 1 + s % 2 of its tables and reads each row's previous values at `source` (block 0, or
  the block step s - 1 wrote), and what `pre` made at the row's outer row (`outer_row`); a row
  that leaves has its last values copied back to its row of block 0, which no step reads again;
- `post` (the ops after the inner loop) over the step's rows again, reading each row's last
  inner values from its row of block 0 and writing the outer carried values' block t + 1.

    int64_t ck_run_nested(const ck_nested_t* N, int nw, int64_t* failed, int64_t* preempted)

Returns LOOP_DONE, LOOP_FAILED (`failed[0]`: the outer step, `failed[1]` the code, `failed[2]`
0, 1, 2: pre's, inner's, post's program), LOOP_OUT_OF_RANGE or LOOP_ITERATIONS (an inner count
past `max_iterations`, where that is not negative).

The lane loop: a masked block over instances of different sizes (attention over sentences of 2
to 50 tokens, `batching.lane_calls`) called for one instance at a time at its own size, the
instances shared out among the workers, each call on one worker. No instance is padded, no
rows are gathered into buckets and scattered back, and no barrier separates the block's ops:
an instance's products and softmax run in its worker's cache. Lane i's inputs are read at row
`first[i]` (a packed value: its rows one after another) or row i (a value with a row per lane)
or are the same for every lane (stride 0); its outputs are written at row `first[i]` of the
packed outputs. Each call has its own copy of the bound call's `err[]` with the lane count set
to 1 and the ragged size to the instance's own, and its worker's own arena, locals and slots
(bound at the largest instance, an arena serves any smaller). Lanes go to workers largest
first, one at a time, so that the last lanes to start are the shortest.

    int64_t ck_run_lanes(const ck_lanes_t* P, int64_t count, const int64_t* order, const int64_t* first,
                         const int64_t* size, int nw, int64_t* failed, int64_t* preempted)

Returns LOOP_DONE or LOOP_FAILED (`failed[0]`: the lane, `failed[1]`: the entry's code).
"""
from __future__ import annotations

from cocktailer.codegen.dialect import THREAD_SWITCHES

LOOP_DONE, LOOP_FAILED, LOOP_OUT_OF_RANGE, LOOP_FULL, ROUNDS_DEEP, LOOP_ITERATIONS = 0, 1, 2, 3, 4, 5
MAX_PATHS = 8   # paths a round loop decides between (three branches)

LEVEL_LOOP_SOURCE = f"""
#define _GNU_SOURCE   /* RUSAGE_THREAD */
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>

typedef int64_t (*ck_entry_t)(void**, void**, void**, char*, char*, int64_t, int64_t*, int64_t*, int64_t*, int);

typedef struct {{
  ck_entry_t fn;
  int64_t inputs, outputs;
  char* const* in_base; const int64_t* in_stride; void** in;     /* in: room for the pointers */
  char* const* out_base; const int64_t* out_stride; void** out;
  void** cst; char* arena; char* stack; int64_t max_depth; int64_t* locals; int64_t* rets; int64_t* err;
  int64_t lanes_at;   /* err[] slot of the lane count; -1: none */
  int64_t flag;       /* output whose first byte, set, says an index was out of range; -1: none */
}} ck_level_t;

/* call L over `lanes` lanes, its inputs from row `start` (its outputs already pointed at) */
static int64_t ck_call(const ck_level_t* L, int64_t start, int64_t lanes, int nw, int64_t* preempted) {{
  for (int64_t k = 0; k < L->inputs; k++) L->in[k] = L->in_base[k] + start * L->in_stride[k];
  if (L->lanes_at >= 0) L->err[L->lanes_at] = lanes;
  const int64_t code = L->fn(L->in, L->out, L->cst, L->arena, L->stack, L->max_depth, L->locals, L->rets,
                             L->err, nw);
  *preempted += L->err[1];
  return code;
}}

/* point L's outputs at row `start` */
static void ck_point(const ck_level_t* L, int64_t start) {{
  for (int64_t k = 0; k < L->outputs; k++) L->out[k] = L->out_base[k] + start * L->out_stride[k];
}}

/* what a call of L that returned `code` means for the loop; `which` (the program) noted in failed[2] */
static int64_t ck_done(const ck_level_t* L, int64_t code, int64_t* failed, int64_t which) {{
  failed[2] = which;
  if (code) {{ failed[1] = code; return {LOOP_FAILED}; }}
  return L->flag >= 0 && *(const char*)L->out[L->flag] ? {LOOP_OUT_OF_RANGE} : {LOOP_DONE};
}}

/* call L over `lanes` lanes, its inputs from row `in_start`, its outputs at row `out_start` */
static int64_t ck_step(const ck_level_t* L, int64_t in_start, int64_t out_start, int64_t lanes, int nw,
                       int64_t* failed, int64_t which, int64_t* preempted) {{
  ck_point(L, out_start);
  return ck_done(L, ck_call(L, in_start, lanes, nw, preempted), failed, which);
}}

int64_t ck_run_levels(int64_t groups, const int64_t* group, const ck_level_t* levels, int nw,
                      int64_t* failed, int64_t* preempted) {{
  for (int64_t g = 0; g < groups; g++) {{
    const int64_t start = group[3 * g], lanes = group[3 * g + 1] - start;
    failed[0] = g;
    const int64_t status = ck_step(&levels[group[3 * g + 2]], start, start, lanes, nw, failed, 0, preempted);
    if (status) return status;
  }}
  return {LOOP_DONE};
}}

typedef struct {{
  int64_t count, calls_cap, lanes_cap, max_rounds;
  const ck_level_t* decide;     /* NULL: the slice has no branch (every call takes path 0) */
  int64_t branches;             /* conditions decide writes: cond[b], one byte per call id */
  char* const* cond;
  const ck_level_t* paths;      /* one per path; fn NULL: no program (the path reaches no site) */
  int64_t npaths;
  const int64_t* reached;       /* npaths x sites: the sites path p reaches, in its outputs' order, then -1 */
  int64_t sites, varying;
  char* const* column;          /* 1 + varying per-call columns: the instance (int64), the varying arguments */
  const int64_t* row_bytes;
  char* const* scratch;         /* the same columns, for the calls of one path gathered (lanes_cap rows) */
  int64_t* kids;                /* calls_cap x sites, -1 where a site is not reached */
  int64_t* path;                /* per call id */
  int64_t* height;              /* per call id */
  int64_t* order;               /* lanes_cap: a round's calls grouped by path */
}} ck_rounds_t;

int64_t ck_run_rounds(const ck_rounds_t* R, int nw, int64_t* found, int64_t* failed, int64_t* preempted) {{
  const int64_t columns = 1 + R->varying;
  int64_t start = 0, total = R->count, round = 0;
  int64_t* root = (int64_t*)R->column[0];
  for (int64_t c = 0; c < total; c++) root[c] = c;
  while (total > start) {{
    const int64_t end = total, n = end - start;
    if (round == R->max_rounds) return {ROUNDS_DEEP};
    if (n > R->lanes_cap) return {LOOP_FULL};
    failed[0] = round;
    int64_t members[{MAX_PATHS}] = {{0}};
    int64_t status;
    if (R->decide && (status = ck_step(R->decide, start, start, n, nw, failed, -1, preempted))) return status;
    for (int64_t c = start; c < end; c++) {{
      int64_t p = 0;
      for (int64_t b = 0; b < R->branches; b++) p |= (int64_t)(R->cond[b][c] != 0) << b;
      R->path[c] = p;
      members[p]++;
    }}
    int64_t first[{MAX_PATHS}], at[{MAX_PATHS}];
    for (int64_t p = 0, sum = 0; p < R->npaths; p++) {{ first[p] = at[p] = sum; sum += members[p]; }}
    for (int64_t c = start; c < end; c++) R->order[at[R->path[c]]++] = c;
    for (int64_t p = 0; p < R->npaths; p++) {{
      const ck_level_t* P = &R->paths[p];
      const int64_t* sites = R->reached + p * R->sites;
      int64_t reach = 0;
      while (reach < R->sites && sites[reach] >= 0) reach++;
      const int64_t g = members[p];
      if (!g || !reach) continue;
      if (total + reach * g > R->calls_cap) return {LOOP_FULL};
      const int64_t* calls = R->order + first[p];
      for (int64_t i = 0; i < g; i++)
        for (int64_t k = 0; k < columns; k++)
          memcpy(R->scratch[k] + i * R->row_bytes[k], R->column[k] + calls[i] * R->row_bytes[k], R->row_bytes[k]);
      for (int64_t k = 0; k < P->outputs; k++)
        P->out[k] = k == P->flag ? P->out_base[k]
                    : P->out_base[k] + (total + k / R->varying * g) * P->out_stride[k];
      if ((status = ck_done(P, ck_call(P, 0, g, nw, preempted), failed, p))) return status;
      for (int64_t r = 0; r < reach; r++)
        for (int64_t i = 0; i < g; i++) {{
          const int64_t child = total + r * g + i;
          root[child] = root[calls[i]];
          R->kids[calls[i] * R->sites + sites[r]] = child;
        }}
      total += reach * g;
    }}
    start = end;
    round++;
  }}
  for (int64_t c = total - 1; c >= 0; c--) {{
    int64_t h = 0;
    for (int64_t s = 0; s < R->sites; s++) {{
      const int64_t kid = R->kids[c * R->sites + s];
      if (kid >= 0 && R->height[kid] + 1 > h) h = R->height[kid] + 1;
    }}
    R->height[c] = h;
  }}
  found[0] = total;
  return {LOOP_DONE};
}}

typedef struct {{
  int64_t count, steps_cap, max_iterations;   /* max_iterations < 0: no limit */
  const int64_t* trips;                        /* each lane's trip count; NULL: none */
  const ck_level_t* cond;
  const ck_level_t* body;
  const char* go;                              /* the condition's output: a byte per row */
  int64_t *counter, *holder, *lane_at, *source;   /* a row per (block, lane): (steps_cap + 1) * count */
  int64_t *final_row, *ran;                    /* per lane */
}} ck_while_t;

int64_t ck_run_while(const ck_while_t* W, int nw, int64_t* failed, int64_t* preempted) {{
  const int64_t L = W->count;
  int64_t n = L;
  for (int64_t r = 0; r < L; r++) W->holder[r] = r;
  for (int64_t t = 0;; t++) {{
    const int64_t block = t * L;
    failed[0] = t;
    for (int64_t r = 0; r < n; r++) W->counter[block + r] = t;
    int64_t status = ck_step(W->cond, block, block, n, nw, failed, 0, preempted);
    if (status) return status;
    int64_t m = 0;
    for (int64_t r = 0; r < n; r++) {{
      const int64_t row = block + r, lane = W->holder[row];
      if ((W->trips && t >= W->trips[lane]) || !W->go[row]) {{ W->final_row[lane] = row; W->ran[lane] = t; continue; }}
      W->lane_at[block + m] = lane;
      W->source[block + m] = row;
      m++;
    }}
    if (!m) return {LOOP_DONE};
    if (W->max_iterations >= 0 && t >= W->max_iterations) return {LOOP_ITERATIONS};
    if (t >= W->steps_cap) return {LOOP_FULL};
    if ((status = ck_step(W->body, block, block, m, nw, failed, 1, preempted))) return status;
    for (int64_t i = 0; i < m; i++) W->holder[block + L + i] = W->lane_at[block + i];
    n = m;
  }}
}}

typedef struct {{
  int64_t count, steps, max_iterations;   /* max_iterations < 0: no limit on an inner count */
  const int64_t* active;                /* per outer step: the rows of the lanes still in the loop */
  const ck_level_t *pre, *inner, *post;
  const int64_t* trips;                 /* the inner trip count pre wrote, a row per (outer step, lane) */
  int64_t inits;                        /* the inner loop's carried values */
  char* const* init_from;               /* each one's initial value, as pre wrote it (a row per outer row) */
  char* const* carried;                 /* each one's table: three blocks of count rows */
  const int64_t* row_bytes;
  int64_t *counter, *lane, *source, *outer_row;   /* the inner body's per-row inputs (count rows) */
  const int64_t* lane_at;               /* each outer row's lane */
  int64_t *at, *order;                  /* count entries each: a row's inner row now, the rows still inside */
}} ck_nested_t;

int64_t ck_run_nested(const ck_nested_t* N, int nw, int64_t* failed, int64_t* preempted) {{
  const int64_t L = N->count;
  int64_t status;
  for (int64_t t = 0; t < N->steps && N->active[t]; t++) {{
    const int64_t n = N->active[t], block = t * L;
    failed[0] = t;
    if ((status = ck_step(N->pre, block, block, n, nw, failed, 0, preempted))) return status;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {{
      for (int64_t k = 0; k < N->inits; k++)
        memcpy(N->carried[k] + i * N->row_bytes[k], N->init_from[k] + (block + i) * N->row_bytes[k],
               N->row_bytes[k]);
      N->at[i] = i;   /* block 0 row i: its initial, then its last, inner values */
      if (N->max_iterations >= 0 && N->trips[block + i] > N->max_iterations) return {LOOP_ITERATIONS};
      if (N->trips[block + i] > 0) N->order[m++] = i;
    }}
    for (int64_t s = 0; m; s++) {{
      const int64_t into = (1 + s % 2) * L;
      for (int64_t j = 0; j < m; j++) {{
        const int64_t i = N->order[j];
        N->counter[j] = s;
        N->lane[j] = N->lane_at[block + i];
        N->source[j] = N->at[i];
        N->outer_row[j] = block + i;
      }}
      if ((status = ck_step(N->inner, 0, into, m, nw, failed, 1, preempted))) return status;
      int64_t still = 0;
      for (int64_t j = 0; j < m; j++) {{
        const int64_t i = N->order[j];
        N->at[i] = into + j;
        if (N->trips[block + i] > s + 1) {{ N->order[still++] = i; continue; }}
        for (int64_t k = 0; k < N->inits; k++)   /* its last values, before a later step writes over them */
          memcpy(N->carried[k] + i * N->row_bytes[k], N->carried[k] + (into + j) * N->row_bytes[k], N->row_bytes[k]);
      }}
      m = still;
    }}
    if ((status = ck_step(N->post, block, block, n, nw, failed, 2, preempted))) return status;
  }}
  return {LOOP_DONE};
}}
typedef struct {{
  ck_entry_t fn;
  int64_t inputs, outputs;
  char* const* in_base; const int64_t* in_stride; const int64_t* in_packed;   /* in_packed[k]: at row first[i] */
  char* const* out_base; const int64_t* out_stride;                           /* all at row first[i] */
  void** cst; char* stack; int64_t max_depth;
  const int64_t* err; int64_t nerr;     /* the bound call's err[], which each call copies */
  int64_t lanes_at, size_at;            /* err[] slots of the lane count and of the ragged size (-1: none) */
  char* arena; int64_t arena_bytes;     /* worker w's: arena + w * arena_bytes; likewise locals and rets */
  int64_t* locals; int64_t locals_len; int64_t* rets; int64_t rets_len;
}} ck_lanes_t;

{THREAD_SWITCHES}
int64_t ck_run_lanes(const ck_lanes_t* P, int64_t count, const int64_t* order, const int64_t* first,
                     const int64_t* size, int nw, int64_t* failed, int64_t* preempted) {{
  int64_t status = {LOOP_DONE}, switches = 0;
  #pragma omp parallel num_threads(nw) reduction(+:switches)
  {{
    const int w = omp_get_thread_num();
    const long switches0 = ct_switches();
    void* in[P->inputs > 0 ? P->inputs : 1];
    void* out[P->outputs > 0 ? P->outputs : 1];
    int64_t err[P->nerr];
    memcpy(err, P->err, (size_t)P->nerr * sizeof(int64_t));
    #pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < count; i++) {{
      const int64_t lane = order[i], row = first[lane];
      if (size[lane] == 0 || __atomic_load_n(&status, __ATOMIC_RELAXED) != {LOOP_DONE}) continue;
      for (int64_t k = 0; k < P->inputs; k++)
        in[k] = P->in_base[k] + (P->in_packed[k] ? row : lane) * P->in_stride[k];
      for (int64_t k = 0; k < P->outputs; k++) out[k] = P->out_base[k] + row * P->out_stride[k];
      err[P->lanes_at] = 1;
      if (P->size_at >= 0) err[P->size_at] = size[lane];
      const int64_t code = P->fn(in, out, P->cst, P->arena + w * P->arena_bytes, P->stack, P->max_depth,
                                 P->locals + w * P->locals_len, P->rets + w * P->rets_len, err, 1);
      if (code) {{
        #pragma omp critical(ck_lanes_failed)
        if (status == {LOOP_DONE}) {{ failed[0] = lane; failed[1] = code; __atomic_store_n(&status, {LOOP_FAILED}, __ATOMIC_RELAXED); }}
      }}
    }}
    switches += ct_switches() - switches0;
  }}
  *preempted += switches;
  return status;
}}
"""
