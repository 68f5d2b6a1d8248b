"""uProgram -> C source: the whole program, control flow included, as one native function.

All L1 units (workers) enter one parallel region and each runs its own copy of the control
flow: loops are C loops, branches read the device-computed condition after a barrier,
and recursion runs on an explicit stack of frames (the frame's tensors + a per-worker
resume label), entered with `goto` and left through a `switch` on the resume label, so it
needs no native recursion and its depth is checked. Data ops are rendered by the kernel
library (`codegen.kernels`), each worker computing its share. A `Dialect` (`dialect.py`)
holds everything target-specific (the CPU one is OpenMP); the CUDA one is a configuration of
the same renderer and templates.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cocktailer.codegen.dialect import CPU, Dialect, preamble
from cocktailer.codegen.kernels import KERNELS, PORTABLE_PRELUDE, PRELUDE, KernelContext, ctype, kernel_scratch_bytes
from cocktailer.codegen.kernels import matmul
from cocktailer.codegen.kernels.common import product
from cocktailer.errors import INTERRUPTED, ITERATIONS_EXCEEDED
from cocktailer.ir import Op, Operation, Program, Sym, SymbolicSizeError, Value
from cocktailer.runtime.compiler import PROGRAM_MARK
from cocktailer.runtime.native import ERR_SIZES as SIZES_AT   # err[]: where the call's symbolic sizes start
from cocktailer.schedule.memory import MemoryPlan
from cocktailer.schedule.utask import Barrier, Block, BranchUTask, FanOut, LoopUTask, Sync, UOperator, UProgram, UTaskRef


@dataclass
class Rendered:
    source: str
    errors: list[str]               # runtime error messages; err[0] == i + 1 means errors[i]
    plan: MemoryPlan
    entry: str = "cocktailer_run"   # the C function to call
    prepacked: dict = field(default_factory=dict)   # constant slot name -> (source constant, NR) to prepack


class Renderer:
    def __init__(self, uprogram: UProgram, plan: MemoryPlan, dialect: Dialect = CPU, entry: str = "cocktailer_run"):
        self.entry = entry
        self.up = uprogram
        self.program: Program = uprogram.program
        self.plan = plan
        self.d = dialect
        self.lines: list[str] = []
        self.synced = False   # whether every worker has passed a barrier since the last work (see barrier)
        self.errors: list[str] = []
        self.names = 0
        self.sites: dict[str, list[int]] = {}   # callee -> call-site ids
        self.kernels: dict[str, str] = {}        # kernel body -> the C function that runs it
        self.signatures: dict[str, int] = {}     # function -> number of buffer arguments
        self.prepacked: dict[str, tuple[str, int]] = {}   # constant slot name -> (source constant, NR)
        self.size_slots = {sym: SIZES_AT + k for k, (sym, _, _) in enumerate(self.program.sizes)}
        self.dynamic_at = SIZES_AT + len(self.program.sizes)   # err[]: then the dynamic slots' offsets,
        self.frame_dynamic_at = self.dynamic_at + len(plan.dynamic)   # those in a frame, the frame's bytes

    # -- addressing -------------------------------------------------------------------
    def size(self, dim) -> str:
        """A dim's size in C: a number, or the call's value of a symbolic size (in err[]). A
        program without that size among its own (a host backend's basic block) needs a number."""
        if not isinstance(dim, Sym):
            return str(dim)
        if dim not in self.size_slots:
            raise SymbolicSizeError(dim, "a part of the program that is not called with its sizes")
        return f"err[{self.size_slots[dim]}]"

    def nbytes(self, ty) -> str:
        """A value's byte count in C: a number, or an expression of the call's sizes."""
        return str(product(ty.dtype.itemsize, *(self.size(d) if isinstance(d, Sym) else d for d in ty.shape)))

    def ptr(self, v: Value, base: str | None = None) -> str:
        buf = self.plan.of(v)
        ty = ctype(v.type.dtype)
        if buf.space == "input":
            return f"(({ty}*)in[{buf.offset}])"
        if buf.space == "const":
            return f"(({ty}*)cst[{buf.offset}])"
        if buf.space == "output":
            return f"(({ty}*)out[{buf.offset}])"
        if buf.space == "local":
            return f"(&CT_L[{buf.offset}])"
        if buf.space == "dynamic":   # at the offset the runtime computed for this call's sizes
            return f"(({ty}*)(arena + err[{self.dynamic_at + buf.offset}]))"
        if buf.space == "frame_dynamic":   # the same, from the frame
            return f"(({ty}*)({base or 'fp'} + err[{self.frame_dynamic_at + buf.offset}]))"
        return f"(({ty}*)({base or self._base(buf.space)} + {buf.offset}))"

    def _base(self, space: str) -> str:
        return "arena" if space == "arena" else "fp"

    def byte_ptr(self, v: Value, base: str | None = None) -> str:
        return f"((char*){self.ptr(v, base)})"

    def fresh(self, prefix: str) -> str:
        self.names += 1
        return f"{prefix}_{self.names}"

    def _error_code(self, message: str) -> int:
        if message not in self.errors:
            self.errors.append(message)
        return self.errors.index(message) + 1

    def fail(self, message: str) -> str:
        """Inside an operator's function: record the error and return (its caller then leaves
        the program; every worker checks the same data, so all of them leave)."""
        return f"{{ {self.d.atomic_store('err[0]', self._error_code(message))} return 1; }}"

    def fail_here(self, message: str) -> str:
        """In the control-flow skeleton itself: record the error and leave the program."""
        return f"{{ {self.d.atomic_store('err[0]', self._error_code(message))} goto ct_fail; }}"

    def emit(self, line: str = ""):
        """A line of the skeleton; as far as barriers know, work (see `barrier`)."""
        self.lines.append(line)
        self.synced = False

    def keep(self, line: str):
        """A line that reads what every worker has and writes nothing (a branch on a condition
        computed before a barrier): the workers stay as synchronized as they were."""
        self.lines.append(line)

    def barrier(self):
        """Every worker waits for all of them. A second barrier with nothing between is left
        out: after the first, nothing is left for it to order (a branch's arm that only
        yields, a loop body ending in a barrier before its carried copies). On a GPU each is a
        grid barrier and two block barriers."""
        if not self.synced:
            self.lines.append(self.d.barrier)
            self.synced = True

    # -- items ------------------------------------------------------------------------
    def block(self, block: Block):
        for item in block.items:
            if isinstance(item, UOperator):
                self.operator(item)
            elif isinstance(item, Barrier):
                self.barrier()
            elif isinstance(item, Sync):
                self.sync(item)
            elif isinstance(item, BranchUTask):
                self.branch(item)
            elif isinstance(item, LoopUTask):
                self.loop(item)
            elif isinstance(item, UTaskRef):
                self.call(item)
            elif isinstance(item, FanOut):
                self.fan_out(item)

    def operator(self, item: UOperator):
        """Each operator runs as a C function called by every worker, with its buffers as
        arguments: an unrolled program repeats the same op on the same shapes thousands of
        times, and those share one function (GCC's time grows superlinearly with code size)."""
        op = item.op
        if op.op is Op.CONST:
            return   # bound zero-copy: the constant table holds its pointer
        args: dict[object, str] = {}    # value id (or a prepacked constant's name) -> parameter name
        passed: dict[object, str] = {}  # the same keys -> the pointer the skeleton passes

        def argument(key, pointer: str) -> str:
            if key not in args:
                args[key], passed[key] = f"a{len(args)}", pointer
            return args[key]

        def param(v: Value) -> str:
            return f"(({ctype(v.type.dtype)}*){argument(v.id, self.ptr(v))})"

        def prepacked(v: Value, nr: int) -> str | None:
            buf = self.plan.of(v)
            if buf.space != "const" or v.type.dtype != torch.float32:
                return None
            index = self._prepack(self.plan.const_names[buf.offset], nr)
            return f"((const float*){argument(('prepacked', index), f'((float*)cst[{index}])')})"
        names = iter(range(1 << 30))
        ctx = KernelContext(ptr=param, worker="w", workers="W", fail=self.fail,
                            fresh=lambda prefix: f"{prefix}_{next(names)}", prepacked=prepacked, simd=self.d.simd,
                            size=self.size, engine=self.d.engine, line_shares=self.d.line_shares,
                            cooperative=self.d.cooperative, pieces=str(self.up.device.workers))
        body = KERNELS[op.op](op, ctx)
        function = self.kernels.get(body)
        if function is None:
            function = self.kernels[body] = f"{self.entry}_k{len(self.kernels)}"
        # no value numbers here: they come from a process-wide counter, and the same program
        # must render to the same source (the library cache's key) in every compile
        loc = f" /* {op.op.name.lower()}{', ' + str(op.loc) if op.loc else ''} */"
        pointers = ", ".join(f"(char*){passed[key]}" for key in args) + (", " if args else "")
        if item.group is None:
            call = "{}({}{}, {}, err)".format(function, pointers, *self.d.shares("w", "W"))
        else:   # only the op's group of workers runs it, each with its rank in the group
            lo, hi = item.group
            call = "w >= {} && w < {} && {}({}{}, {}, err)".format(lo, hi, function, pointers,
                                                                  *self.d.shares(f"w - {lo}", f"{hi - lo}"))
        if self.d.tally:   # (a host backend's block cannot always spell its operands' sizes)
            counts = "w == 0" if item.group is None else f"w == {item.group[0]}"   # its first worker counts it
            self.tally(counts, "CT_T_OPERATORS", 1)
            self.tally(counts, "CT_T_BYTES", " + ".join(self.nbytes(v.type) for v in (*op.operands, *op.results)))
        self.emit(f"if ({self.d.every.format(call)}) goto ct_fail;{loc}")
        self.signatures[function] = len(args)

    def tally(self, counts: str, kind: str, amount):
        """Count an event for reports (the dialect's tally; the CPU one counts nothing)."""
        if self.d.tally:
            self.emit(self.d.tally.format(counts=counts, kind=kind, amount=amount))

    def sync(self, item: Sync):
        """Publish this worker's step, then wait for the workers it depends on to reach it."""
        self.tally("ct_gw == 0", "CT_T_STEPS", 1)   # every worker passes every step
        self.emit("ct_step++; " + self.d.by_lead("CT_STORE_RELEASE(&ct_steps[ct_gw * CT_STEP_STRIDE], ct_step)"))
        cases = []
        for w, on in item.waits.items():
            waits = " || ".join(f"ct_await(ct_steps, {p}, ct_step, err)" for p in on)
            cases.append(f"case {w}: if ({self.d.lead.format(waits)}) goto ct_fail; break;")
        self.emit(f"switch (w) {{ {' '.join(cases)} default: break; }}")

    def _prepack(self, source: str, nr: int) -> int:
        """The constant table's slot for constant `source` prepacked for NR-wide panels; the
        runtime fills it (gemm.prepack_b) when it loads the program and when `source` changes."""
        name = f"prepacked({source}; nr={nr})"
        if name not in self.plan.const_names:
            self.plan.const_names.append(name)
            self.prepacked[name] = (source, nr)
        return self.plan.const_names.index(name)

    def copies(self, pairs: list[tuple[str, str, int]]):
        """Copy (dst, src, nbytes) triples, each worker its share, then a barrier."""
        for dst, src, n in pairs:
            if n != "0":
                self.tally("w == 0", "CT_T_BYTES", f"2 * ({n})")
                self.emit("ct_copy({}, {}, {}, {}, {});".format(dst, src, n, *self.d.shares("w", "W")))
        self.barrier()

    def moves(self, sources: list[Value], targets: list[Value], base_src=None, base_dst=None) -> list[tuple]:
        return [(self.byte_ptr(t, base_dst), self.byte_ptr(s, base_src), self.nbytes(t.type))
                for s, t in zip(sources, targets) if not self._same_memory(s, t, base_src, base_dst)]

    def _computed_in_output(self, v: Value, k: int) -> bool:
        buf = self.plan.of(v)
        return buf.space == "output" and buf.offset == k

    def _same_memory(self, s: Value, t: Value, base_src, base_dst) -> bool:
        """Whether s and t are one buffer (inputs and constants are the same wherever they are
        addressed from; arena and frame buffers only relative to the same base)."""
        a, b = self.plan.of(s), self.plan.of(t)
        return a == b and (a.space in ("input", "const") or base_src == base_dst)

    def branch(self, item: BranchUTask):
        op = item.op
        before = self.synced
        self.keep(f"if (*(const uint8_t*){self.ptr(op.operands[0])}) {{")
        self.block(item.then)
        self.barrier()
        self.copies(self.moves(op.regions[0].yields, op.results))
        after_then, self.synced = self.synced, before
        self.keep("} else {")
        self.block(item.orelse)
        self.barrier()
        self.copies(self.moves(op.regions[1].yields, op.results))
        self.keep("}")
        self.synced = self.synced and after_then

    def loop(self, item: LoopUTask):
        op = item.op
        i, trip = self.plan.loop_slots[id(op)]
        body = op.loop_body
        carried = body.params[1:]
        self.copies(self.moves(op.loop_inits, carried))
        has_trip = op.loop_trip is not None
        self.emit(f"CT_L[{trip}] = {f'*{self.ptr(op.loop_trip)}' if has_trip else '0'};")
        bound = f"CT_L[{i}] < CT_L[{trip}]" if has_trip else "1"
        self.emit(f"for (CT_L[{i}] = 0; {bound}; CT_L[{i}]++) {{")
        if item.cond is not None:
            self.block(item.cond)
            self.barrier()
            self.keep(f"if (!*(const uint8_t*){self.ptr(op.loop_cond.yields[0])}) break;")
        self.back_edge_checks(f"CT_L[{i}]")
        self.block(item.body)
        self.barrier()
        if op.loop_stacked:
            self.copies(self.stack_rows(op, f"CT_L[{i}]"))
        self.carry(op.loop_carried_yields, carried, op.results)
        self.emit("}")
        self.copies(self.moves(carried, op.results))

    def back_edge_checks(self, iteration: str | None):
        """Before each loop iteration (`iteration`: its counter) and each call (None): stop once
        the loop has run the iterations the max_iterations option allows, or once a SIGINT has
        arrived since the call began (runtime.interrupt counts them). The worker that sees it
        sets the error code; the others leave at their next barrier, as for any error."""
        if iteration is not None:
            self.emit(f"if ({iteration} >= ct_max_iterations) {self.fail_here(ITERATIONS_EXCEEDED)}")
        interrupted = self.d.every.format("CT_LOAD_RELAXED(ct_sigints) != ct_sigints0")
        self.emit(f"if ({interrupted}) {self.fail_here(INTERRUPTED)}")

    def stack_rows(self, op: Operation, step: str) -> list[tuple[str, str, int]]:
        """This iteration's stacked yields into row `step` of their stacked results."""
        stacked = op.loop_body.yields[len(op.loop_body.yields) - op.loop_stacked:]
        stacks = op.results[len(op.loop_inits):]
        rows = []
        for y, s in zip(stacked, stacks):
            n = self.nbytes(y.type)
            rows.append((f"({self.byte_ptr(s)} + {step} * {n})", self.byte_ptr(y), n))
        return rows

    def carry(self, yields: list[Value], carried: list[Value], staging: list[Value]):
        """Yields become the next iteration's carried values. If a yield is another carried
        value (`a, b = b, a`), go through the loop's result buffers so nothing is overwritten early."""
        carried_ids = {v.id for v in carried}
        if any(y.id in carried_ids and y.id != c.id for y, c in zip(yields, carried)):
            self.copies(self.moves(yields, staging))
            self.copies(self.moves(staging, carried))
        else:
            self.copies(self.moves(yields, carried))

    def call(self, item: UTaskRef):
        op = item.op
        callee = self.program.functions[item.callee]
        site = sum(len(s) for s in self.sites.values())
        self.sites.setdefault(item.callee, []).append(site)
        self.emit(f"if (sp + 1 >= max_depth) {self.fail_here('recursion deeper than the compiled maximum depth')}")
        self.back_edge_checks(None)
        self.emit("{ char* nfp = stack + (sp + 1) * FRAME;")
        self.copies(self.moves(op.operands, callee.params, base_dst="nfp"))
        self.emit("}")
        self.emit(f"CT_F(sp + 1) = (int64_t)(intptr_t)fp; sp++; fp = stack + sp * FRAME; CT_R(sp) = {site}; "
                  f"goto fn_{item.callee};")
        self.emit(f"site_{site}: ;")
        self.emit("{ char* cfp = stack + (sp + 1) * FRAME;")
        self.copies(self.moves(callee.body.yields, op.results, base_src="cfp"))
        self.emit("}")

    def fan_out(self, item: FanOut):
        """Split the team into G = min(calls, workers) groups (contiguous ranges of workers);
        group g runs calls g, g + G, ... with its own barrier and stack. The team's state is
        saved in this frame's per-worker slots: the calls leave by `goto`, so C locals would
        not survive them, and a call that fans out again saves its own in the next frame."""
        n = len(item.calls)
        self.emit(f"/* fan-out: {n} independent calls at once, one group of workers each */")
        self.emit("CT_S(sp, 2) = w; CT_S(sp, 3) = W; CT_S(sp, 4) = ct_lead; CT_S(sp, 5) = ct_nest;")
        self.emit(f"{{ const int G = ct_nest + 1 < CT_MAX_NEST && W > 1 ? (W < {n} ? W : {n}) : 1; int g = 0;")
        self.emit("  while ((int64_t)(g + 1) * W / G <= w) g++;")
        self.emit("  CT_S(sp, 6) = g; CT_S(sp, 7) = G;")
        self.emit("  if (G > 1) { const int lo = (int)((int64_t)g * W / G), hi = (int)((int64_t)(g + 1) * W / G);")
        self.emit("    ct_lead += lo; ct_nest++; w -= lo; W = hi - lo; CT_TEAM(); } }")
        for i, call in enumerate(item.calls):
            self.emit(f"if (CT_S(sp, 6) == {i} % CT_S(sp, 7)) {{")
            self.call(call)
            self.emit("}")
        self.emit("if (CT_S(sp, 7) > 1) {")
        self.emit("  w = (int)CT_S(sp, 2); W = (int)CT_S(sp, 3); ct_lead = (int)CT_S(sp, 4); ct_nest = (int)CT_S(sp, 5);")
        self.emit(f"  CT_TEAM(); if ({self.d.lead.format('ct_join(ct_team, W, err)')}) goto ct_fail; }}")

    def _resume(self, name: str) -> str:
        cases = " ".join(f"case {s}: goto site_{s};" for s in self.sites.get(name, []))
        return f"switch (CT_R(sp + 1)) {{ {cases} default: goto ct_fail; }}"

    def function(self, name: str):
        self.emit(f"fn_{name}: ;")
        self.block(self.up.functions[name])
        self.barrier()
        self.emit("fp = (char*)(intptr_t)CT_F(sp); sp--;")
        self.emit(f"@@resume {name}@@")   # filled in by render(): call sites of later functions are not known yet

    # -- the whole program ------------------------------------------------------------------
    def render(self) -> Rendered:
        """The entry function alone (no headers or preludes; see `assemble`)."""
        plan, d = self.plan, self.d
        main = self.program.main
        if d.launched:   # the kernel; `entry` itself, on the host, launches it (see _launcher)
            self.emit(f"CT_GLOBAL void {self.entry}_kernel(ct_args ct_a) {{")
            self.emit("  void** in = ct_a.in; void** out = ct_a.out; void** cst = ct_a.cst; char* arena = ct_a.arena;")
            self.emit("  char* stack_all = ct_a.stack_all; const int64_t max_depth = ct_a.max_depth; "
                      "int64_t* locals = ct_a.locals;")
            self.emit("  int64_t* rets = ct_a.rets; int64_t* err = ct_a.err;")
        else:
            self.emit(f"{d.function_prefix}int64_t {self.entry}(void** in, void** out, void** cst, char* arena, "
                      "char* stack_all, int64_t max_depth, int64_t* locals, int64_t* rets, int64_t* err, int nw) {")
        if plan.frame_dynamic:   # values of symbolic sizes in frames: the frame's size is the call's
            self.emit(f"  enum {{ NLOC = {plan.locals_per_frame} }}; "
                      f"const int64_t FRAME = err[{self.frame_dynamic_at + len(plan.frame_dynamic)}];")
        else:
            self.emit(f"  enum {{ FRAME = {max(plan.frame_bytes, 64)}, NLOC = {plan.locals_per_frame} }};")
        if not d.launched:   # the launch does it, before any block starts
            self.emit("  err[0] = 0; err[1] = 0;   /* an error code; how often workers were preempted */")
        self.emit("  /* err[2]: the SIGINT counter's address (0: none); err[3]: the most iterations of a loop (0: any); */")
        self.emit("  /* err[4...]: the call's symbolic sizes (Program.sizes), then the offsets of the values of */")
        self.emit("  /* symbolic sizes in the arena (MemoryPlan.dynamic), those in a frame and the frame's bytes */")
        self.emit("  const int64_t* const ct_sigints = err[2] ? (const int64_t*)(intptr_t)err[2] : &err[2];")
        self.emit("  const int64_t ct_sigints0 = " + ("ct_a.sigints0;" if d.launched else "CT_LOAD_RELAXED(ct_sigints);"))
        self.emit("  const int64_t ct_max_iterations = err[3] > 0 ? err[3] : INT64_MAX;")
        self.emit(f"  {d.shared_decls}")
        self.emit(f"  {d.parallel_begin}")
        self.emit("  {")
        self.emit(f"  {d.worker_ids}")
        self.emit(f"  {d.preemptions[0]}")
        self.emit("  int64_t sp = -1; char* fp = arena;")
        self.emit("  int ct_lead = 0, ct_nest = 0;   /* this worker's team: its first worker, its depth of splitting */")
        self.emit("  int64_t ct_step = 0;   /* fine-grained barriers passed (see ct_await) */")
        stack = "stack_all + (int64_t)ct_lead * max_depth * FRAME"
        if self._frames_in_shared():   # a team of one block: its frames in its shared memory, where the launch found room
            stack = f"W == 1 && ct_a.frames_offset >= 0 ? CT_BLOCK_SCRATCH + ct_a.frames_offset : {stack}"
        self.emit(f"  ct_barrier_t* ct_team = &ct_bars[0]; char* stack = {stack};")
        self.emit(f"  #define CT_TEAM() (ct_team = &ct_bars[ct_lead * CT_MAX_NEST + ct_nest], stack = {stack})")
        slots = f"rets + (int64_t){d.state_index} * (max_depth + 1) * CT_SLOTS"
        counters = f"locals + (int64_t){d.state_index} * (max_depth + 1) * NLOC"
        if d.state_in_shared:   # where the launch found room (ct_a.state_offset): each lane's rows there
            self.emit(f"  const int64_t ct_frames = {self._state_frames()};")
            slots = (f"ct_a.state_offset >= 0 ? (int64_t*)(CT_BLOCK_SCRATCH + ct_a.state_offset) + "
                     f"(int64_t)CT_LANE * ct_frames * (CT_SLOTS + NLOC) : {slots}")
            counters = f"ct_a.state_offset >= 0 ? ct_slots + ct_frames * CT_SLOTS : {counters}"
        self.emit(f"  int64_t* ct_slots = {slots};")
        self.emit("  #define CT_S(d, k) ct_slots[((d) + 1) * CT_SLOTS + (k)]   /* per worker and depth */")
        self.emit("  #define CT_R(d) CT_S(d, 0)   /* resume label of the call at depth d */")
        self.emit("  #define CT_F(d) CT_S(d, 1)   /* its caller's frame */")
        self.emit(f"  int64_t* L0 = {counters};")
        self.emit("  #define CT_L (L0 + (sp + 1) * NLOC)   /* this frame's loop counters */")
        workers_check = len(self.lines)   # after every declaration: C++ (CUDA) jumps over none
        self.block(self.up.functions[self.program.entry])
        self.barrier()
        outs = [(f"((char*)out[{k}])", self.byte_ptr(v), self.nbytes(v.type))
                for k, v in enumerate(main.body.yields) if not self._computed_in_output(v, k)]
        self.copies(outs)
        self.emit("goto ct_end;")
        for name in self.program.functions:
            if name != self.program.entry:
                self.function(name)
        if self.up.co_scheduled or self.up.fine_barriers:   # ops placed on worker k: fewer threads would skip them
            message = "the runtime started fewer worker threads than the schedule places uTasks on"
            self.lines.insert(workers_check, f"  if (W != {self.up.device.workers}) {self.fail_here(message)}")
        self.lines = [self._resume(line[len("@@resume "):-2]) if line.startswith("@@resume ") else line
                      for line in self.lines]
        self.emit("ct_fail: ;")
        self.emit("ct_end: ;")
        self.emit(f"  {d.preemptions[1]}")
        self.emit("  #undef CT_L")
        self.emit("  #undef CT_TEAM")
        self.emit("  #undef CT_S")
        self.emit("  #undef CT_R")
        self.emit("  #undef CT_F")
        self.emit("  }")
        if d.launched:
            self.emit("}")
            self._launcher()
        else:
            self.emit("  return err[0];")
            self.emit("}")
        if len(self.lines) > SKELETON_OPTIMIZE_LINES:
            self.lines[0] = f"{d.large_skeleton} {self.lines[0]}"
        functions = []
        for body, name in self.kernels.items():
            params = "".join(f"char* a{k}, " for k in range(self.signatures[name]))
            functions.append(f"{d.kernel_prefix} int {name}({params}int w, int W, int64_t* err) {{\n"
                             f"{body}\nreturn 0;\n}}")
        return Rendered("\n".join(functions + self.lines) + "\n", self.errors, plan, self.entry, self.prepacked)

    def _state_frames(self) -> str:
        """Frames of control state a lane keeps (C, with max_depth): one per depth of a recursion,
        else the entry's alone."""
        return "(max_depth + 1)" if len(self.program.functions) > 1 else "1"

    def _frames_in_shared(self) -> bool:
        """Whether a team of one block keeps the recursion's frames (their tensors) in its shared
        memory where they fit (Cocktailer measures both places): as the control state, on the
        CUDA dialect unless `control_stack="global"`, for frames of a size known when rendered.
        A team of several blocks keeps them in global memory, which all its blocks write."""
        return self.d.state_in_shared and len(self.program.functions) > 1 and not self.plan.frame_dynamic

    def _has_products(self) -> bool:
        """Whether a kernel of the program is a tiled MATMUL (its tiles in the block's shared memory)."""
        return any(op.op is Op.MATMUL and matmul.tiled(op) for op in self.program.walk())

    def _launcher(self):
        """The entry point on the host: one launch of the kernel, a block per worker (`nw`),
        with the grid's barriers and step array (ct_cuda.h's ct_launch zeroes them, and err),
        and how many entries the tables and err[] have (the GPU launch copies them over)."""
        self.emit(f"CT_HOST int64_t {self.entry}(void** in, void** out, void** cst, char* arena, char* stack_all, "
                  "int64_t max_depth, int64_t* locals, int64_t* rets, int64_t* err, int nw) {")
        main, plan = self.program.main, self.plan
        counts = [len(main.params), len(main.body.yields), len(plan.const_names),
                  self.frame_dynamic_at + len(plan.frame_dynamic) + 1]   # err[]'s entries: see render()
        self.emit("  ct_args a = { in, out, cst, arena, stack_all, max_depth, locals, rets, err, nw, 0, 0, 0,")
        scratch = kernel_scratch_bytes(self.d.threads, self._has_products())
        self.emit("                (int64_t)sizeof(ct_barrier_t) * CT_MAX_NEST * nw, "
                  f"(int64_t)sizeof(int64_t) * CT_STEP_STRIDE * nw, (int64_t){scratch}, "
                  f"-1, -1, {', '.join(map(str, counts))} }};")
        if self.d.state_in_shared:   # the control state in the block's shared memory, where it fits
            self.emit(f"  const int64_t ct_state = (int64_t){self._state_frames()} * (CT_SLOTS + "
                      f"{max(plan.locals_per_frame, 1)}) * (int64_t)sizeof(int64_t) * {self.d.threads};")
            self.emit("  if (a.shared_bytes + ct_state <= ct_shared_limit()) { a.state_offset = a.shared_bytes; "
                      "a.shared_bytes += ct_state; }")
        if self._frames_in_shared():   # then a team of one block's recursion frames, where they fit
            # only where a team of one block can occur: a grid of one, or fan-outs that split it
            # down to single blocks (CT_MAX_NEST - 1 splits at most, each in at most `widest`
            # groups); else the memory would sit unused and take the SM's L1 share for nothing
            widest = max((len(i.calls) for i in self.up.items() if isinstance(i, FanOut)), default=1)
            self.emit("  int64_t ct_smallest = nw;   /* the smallest team fan-outs leave */")
            self.emit(f"  for (int ct_i = 1; ct_i < CT_MAX_NEST && ct_smallest > 1 && {widest} > 1; ++ct_i) "
                      f"ct_smallest /= ct_smallest < {widest} ? ct_smallest : {widest};")
            self.emit(f"  const int64_t ct_frames_at = (a.shared_bytes + 63) / 64 * 64, "
                      f"ct_frames_bytes = max_depth * {max(plan.frame_bytes, 64)};")
            self.emit("  if (ct_smallest == 1 && ct_frames_at + ct_frames_bytes <= ct_shared_limit()) { "
                      "a.frames_offset = ct_frames_at; a.shared_bytes = ct_frames_at + ct_frames_bytes; }")
        self.emit(f"  return ct_launch({self.entry}_kernel, a, {self.d.threads});")
        self.emit("}")


# The entry function is the program's skeleton: kernel calls, barriers and control flow; the
# kernels are separate functions. A traced graph unrolls into tens of thousands of calls, and
# GCC's time on one function that long grows superlinearly (the 50,000-call NASRNN skeleton:
# over 5 minutes at -O1, 42 s at -O0); what the optimizer saves in a skeleton is a few
# instructions per kernel call (the 15,000-call LSTM skeleton ran within the noise of -O3).
# Already at a few thousand lines -O3 costs seconds: a 4,950-line skeleton of branch-guarded
# alias updates took GCC 13 s (2.2 s at -O0), SkipNet's 2,173-line one (paper size) most of its
# 7-8 s compile (5.7-6.6 s with it at -O0) while its runs stayed at 180-220 ms either way.
SKELETON_OPTIMIZE_LINES = 1000


def assemble(functions: list[Rendered], dialect: Dialect = CPU) -> str:
    """One C source: the dialect's preamble, the kernels' prelude, then (after PROGRAM_MARK:
    programs compiled together share what is before it) the entry functions."""
    return "\n".join([preamble(dialect), PRELUDE if dialect.engine else PORTABLE_PRELUDE, PROGRAM_MARK,
                      *(f.source for f in functions)])


def render(uprogram: UProgram, plan: MemoryPlan, dialect: Dialect = CPU, entry: str = "cocktailer_run") -> Rendered:
    return Renderer(uprogram, plan, dialect, entry).render()
