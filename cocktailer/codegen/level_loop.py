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
(an entry returned `failed[1]` at group `failed[0]`) or LOOP_OUT_OF_RANGE (group `failed[0]`
set its out-of-range flag: an index outside its instance's size). `preempted`: the OS
preemptions all the calls' workers counted.
"""
from __future__ import annotations

LOOP_DONE, LOOP_FAILED, LOOP_OUT_OF_RANGE = 0, 1, 2

LEVEL_LOOP_SOURCE = f"""
#include <stdint.h>

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

int64_t ck_run_levels(int64_t groups, const int64_t* group, const ck_level_t* levels, int nw,
                      int64_t* failed, int64_t* preempted) {{
  for (int64_t g = 0; g < groups; g++) {{
    const int64_t start = group[3 * g], lanes = group[3 * g + 1] - start;
    const ck_level_t* L = &levels[group[3 * g + 2]];
    for (int64_t k = 0; k < L->inputs; k++) L->in[k] = L->in_base[k] + start * L->in_stride[k];
    for (int64_t k = 0; k < L->outputs; k++) L->out[k] = L->out_base[k] + start * L->out_stride[k];
    if (L->lanes_at >= 0) L->err[L->lanes_at] = lanes;
    const int64_t code = L->fn(L->in, L->out, L->cst, L->arena, L->stack, L->max_depth, L->locals, L->rets,
                               L->err, nw);
    *preempted += L->err[1];
    if (code) {{ failed[0] = g; failed[1] = code; return {LOOP_FAILED}; }}
    if (L->flag >= 0 && *(const char*)L->out[L->flag]) {{ failed[0] = g; return {LOOP_OUT_OF_RANGE}; }}
  }}
  return {LOOP_DONE};
}}
"""
