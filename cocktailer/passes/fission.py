"""Loop distribution (fission): a loop whose body is a chain of recurrences becomes one loop
per recurrence, in order.

A stacked RNN's time loop runs every layer at every step; each layer carries its own state
and reads the layer below at the same step. Split into one loop per layer, a layer's weights
are read by consecutive steps while they are still in cache, and its input projection (the
layer below's output, now a whole sequence) leaves the loop as one GEMM (hoist.py). What a
later loop reads from an earlier one is stacked over the steps (the loop's stacked outputs)
and read back row by row.

How: the body's ops form a graph (an op reads another's result in the same step, or the value
it carried from the previous step); its strongly connected components that contain a carried
edge are the recurrences. Each becomes a loop, in topological order; an op outside every
recurrence joins the first recurrence that needs it (or the last loop). Applied to loops with
a trip count known before they run (a number, or a symbolic size: the stacked values then
have that many rows) and no exit condition, whose carried values are each produced and read
within one recurrence; anything else is left alone.
"""
from __future__ import annotations

from cocktailer.ir import INDEX, Op, Operation, Program, Region, Sym, TensorType, Value
from cocktailer.ir.analysis import known_trip_counts
from cocktailer.ir.program import replace_uses


def distribute_loops(program: Program) -> Program:
    for fn in program.functions.values():
        _distribute_region(fn.body, known_trip_counts(fn))
    return program


def _distribute_region(region: Region, trips: dict):
    """Inner loops first: distributing a loop moves its body's ops (inner loops included) into
    new regions and renames what they read, so a nested loop is split where it ends up."""
    ops: list[Operation] = []
    for op in region.ops:
        for inner in op.regions:
            _distribute_region(inner, trips)
        ops += (_distribute(op, trips) or [op]) if op.op is Op.LOOP else [op]
    region.ops = ops


def _distribute(loop: Operation, trips: dict) -> list[Operation] | None:
    if loop.loop_cond is not None or loop.loop_trip is None or loop.loop_stacked or loop.loop_trip.id not in trips:
        return None
    body = loop.loop_body
    ops, carried = body.ops, body.params[1:]
    producer = {r.id: k for k, op in enumerate(ops) for r in op.results}
    if any(y.id not in producer for y in body.yields):
        return None   # a carried value passed through unchanged, or swapped: not a chain of recurrences
    succ = _graph(ops, carried, body.yields, producer)
    stage = _stages(len(ops), succ)
    if stage is None:
        return None
    home = [stage[producer[y.id]] for y in body.yields]   # the loop that carries each value
    for j, p in enumerate(carried):
        if any(stage[k] != home[j] for k, op in enumerate(ops) if p.id in {v.id for v in op.reads()}):
            return None   # a recurrence reads another one's previous step
    steps = trips[loop.loop_trip.id]
    return _build(loop, steps if isinstance(steps, Sym) else int(steps), stage, home, producer)


def _graph(ops, carried, yields, producer) -> list[set[int]]:
    """succ[k]: ops that read op k's results in the same step, or (through a carried value)
    in the next one."""
    carried_from = {p.id: producer[y.id] for p, y in zip(carried, yields)}
    succ: list[set[int]] = [set() for _ in ops]
    for m, op in enumerate(ops):
        for v in op.reads():
            if v.id in producer:
                succ[producer[v.id]].add(m)
            elif v.id in carried_from:
                succ[carried_from[v.id]].add(m)
    return succ


def _stages(n: int, succ: list[set[int]]) -> list[int] | None:
    """The loop each op goes to, or None when there are fewer than two recurrences."""
    components = _sccs(n, succ)   # sinks first
    recurrent = [c for c in components if len(c) > 1 or c[0] in succ[c[0]]]
    if len(recurrent) < 2:
        return None
    order = {id(c): k for k, c in enumerate(reversed(recurrent))}
    last = len(recurrent) - 1
    stage: list[int] = [last] * n
    for c in components:   # successors are placed before their predecessors
        if id(c) in order:
            for k in c:
                stage[k] = order[id(c)]
        else:
            (k,) = c
            stage[k] = min((stage[m] for m in succ[k]), default=last)
    return stage


def _sccs(n: int, succ: list[set[int]]) -> list[list[int]]:
    """Tarjan's strongly connected components, iteratively, in reverse topological order."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    for root in range(n):
        if root in index:
            continue
        work = [(root, iter(sorted(succ[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    out.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(succ[child]))))
            elif child in on_stack:
                low[v] = min(low[v], index[child])
    return out


def _build(loop: Operation, steps: "int | Sym", stage: list[int], home: list[int], producer: dict) -> list[Operation]:
    body = loop.loop_body
    ops, counter, carried = body.ops, body.params[0], body.params[1:]
    n_stages = max(stage) + 1
    exports: list[list[Value]] = [[] for _ in range(n_stages)]   # values a later loop reads, per loop
    for m, op in enumerate(ops):
        for v in op.reads():
            k = producer.get(v.id)
            if k is not None and stage[k] < stage[m] and v not in exports[stage[k]]:
                exports[stage[k]].append(v)
    stacks: dict[int, Value] = {}   # value id -> its stacked result
    loops = []
    for s in range(n_stages):
        mine = [j for j in range(len(carried)) if home[j] == s]
        step = Value(INDEX, hint="t")
        params = [Value(carried[j].type, hint=carried[j].hint) for j in mine]
        rename = {counter.id: step, **{carried[j].id: p for j, p in zip(mine, params)}}
        reads = []
        for v in {v.id: v for m, op in enumerate(ops) if stage[m] == s for v in op.reads()}.values():
            if v.id in stacks:   # produced by an earlier loop: read its row for this step
                row = rename[v.id] = Value(v.type, hint=v.hint)
                reads.append(Operation(Op.SELECT, [stacks[v.id], step], [row], {"key": (("dyn",),)}, loc=loop.loc))
        mine_ops = [op for m, op in enumerate(ops) if stage[m] == s]
        replace_uses(mine_ops, rename)
        for v in exports[s]:
            stacks[v.id] = Value(TensorType((steps, *v.type.shape), v.type.dtype), hint="stacked")
        region = Region([step, *params], reads + mine_ops, [body.yields[j] for j in mine] + exports[s])
        attrs = {**loop.attrs, "has_trip": True, "stacked": len(exports[s])}
        results = [loop.results[j] for j in mine] + [stacks[v.id] for v in exports[s]]
        loops.append(Operation(Op.LOOP, [loop.loop_trip, *(loop.loop_inits[j] for j in mine)], results, attrs,
                               [region], loop.loc))
    return loops

