"""Throughput mode: `cocktailer.batch` against the ways a user runs many instances today.

    python -m bench.batching [--models rae,treelstm,treefc,seq2seq,blockdrop,lstm]
                             [--hidden 256,512] [--batch 8,64] [--seconds 3] [--out DIR]
    python -m bench.batching --ablation [--models rae,treelstm,treefc] [--hidden 256] [--batch 64]

Instances: the tree models (RAE, TreeLSTM, TreeFC) over SST trees drawn from the bundled
sample in their natural node counts (unpadded; TreeFC on perfect trees of height 7, as in
Cortex), every leaf's vector from a seeded embedding; the ACROBAT / Cortex models of
`cocktailer.models.throughput` (TreeGRU, MV-RNN, BiRNN, StackRNN, NestedRNN, DRNN, Berxit) from
their generators at size `--hidden`; the other zoo models (paper size) on inputs of different
seeds, one instance each (seq2seq decodes to each instance's EOS, BlockDrop skips each
instance's own blocks). `--hidden` applies to the first two groups.

Systems, all on the same instances in one process, timed in interleaved rounds:
- eager: the model on one instance after another (PyTorch eager);
- compile: `cocktailer.compile(model, dynamic=True)` (cpu backend), one instance per call;
- batch: `cocktailer.batch(model)`, all instances per call;
- hand-batched: for the tree models `bench.batch_peers.hand_batched`, level by level over index
  arrays, its linearization timed with it; for the zoo's others (written for a batch, masked
  where instances diverge) the instances concatenated into one call of the model, the seq2seq
  decoder masking tokens after each instance's EOS (`zoo_hand_batched`); for the ACROBAT /
  Cortex models `bench.throughput_peers` (level-batched trees, packed sequences, masked early exit);
- dynet-agenda, dynet-depth (tree models): DyNet's autobatching, each strategy in a process of
  its own serving one timed call per round (`bench.batch_peers.DynetServer`);
- jax-vmap (where JAX is installed and the model is ported, `bench.jax_peers`): one instance's
  computation written for JAX, masked (every node computed at every level), vmapped and jitted.

Every system's results are checked against eager per instance before it is timed. The table
gives each system's median per call and instances per second, the batched run's speedup over
each peer, and the time of its inspectors (finding the call trees) on their own. Its floor
column is the eager loop's product flops (counted by torch's flop counter) at this machine's
float32 matmul peak (a 2048-square product, measured in the same run): a system that runs the
same products cannot take less, so eager over floor is the most it can gain over the eager loop
(where that is under 10, the issue's 10x is out of reach). A system can go below the floor only
by dropping products: NestedRNN's inner cell reads the same word at every step, and the batched
run computes that input's product once per word, not once per step. The process
keeps freed memory for reuse (`machine.keep_freed_memory`): left to glibc, tensors of megabytes
are faulted in again a page at a time on every call, and which system pays depends on what
ran before it.

--ablation (ACROBAT's Figure 6): the batched executor with its techniques added one at a time,
timed interleaved on the same instances: one instance per call; all instances per call with
recursion depth-first, each lane's operands copied, a product per lane and every op a torch op;
+ parameter reuse (a product with a shared weight as one GEMM); + gather fusion (operands read
through index arrays); + level-by-level recursion (the inspector as torch ops, each level op by
op); + native blocks (runs of data ops as one native call); + native inspector (the call tree
found by the control slice compiled to C, or, where the slice computes with tensors, each of
its rounds as native programs); + level programs (a level's calls that take the same
arms as one native call, called from Python); + native level loop (every level's programs called
by one native loop); + loop programs (a counted loop with a straight-line body, every step in one
native call); + masks in blocks (a softmax or product over a ragged size, attention's, masks the
padding inside its native block instead of running as a masked torch op); + packed rows
(position-wise blocks over a ragged size compute on the instances' real rows, not the padding);
+ buckets (a masked block over instances of very different sizes runs once per bucket of
similar sizes, padded to the bucket's longest); + lane calls (the same block once per instance
at its own size, the instances shared out among the workers by a native loop: the default). A step that does not apply to a model (loop programs to a tree
recursion, levels to an RNN) changes nothing but noise.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import replace
import pathlib
import random
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

import cocktailer
from bench import machine, roofline
from bench.results import write_small_run
from bench.timing import Budget, measure_interleaved, summarize
from cocktailer import models
from cocktailer.batching import Techniques
from cocktailer.data import load_sst, perfect_tree
from cocktailer.models.throughput import INSTANCES
from cocktailer.models.tree import RAE, TreeFC, TreeLSTM, tree_inputs

TREES = {"rae": RAE, "treelstm": TreeLSTM, "treefc": TreeFC}
DEFAULT_MODELS = "rae,treelstm,treefc,treegru,mvrnn,birnn,stackrnn,nestedrnn,drnn,berxit,seq2seq,blockdrop,lstm"


def tree_workload(name: str, hidden: int, batch: int, seed: int = 0) -> tuple[torch.nn.Module, list]:
    torch.manual_seed(seed)
    model = TREES[name](hidden).eval()
    g = torch.Generator().manual_seed(seed + 1)
    if name == "treefc":
        trees = [perfect_tree(7)] * batch
        vocab = 1000
    else:
        sample, rng = load_sst(), random.Random(seed)
        trees = [rng.choice(sample) for _ in range(batch)]
        vocab = 2000
    table = torch.randn(vocab, hidden, generator=g)
    return model, [tree_inputs(t, torch.randint(vocab, (t.num_leaves,), generator=g).tolist(), table, t.num_nodes)
                   for t in trees]


def workload(name: str, hidden: int | None, batch: int) -> tuple[torch.nn.Module, list]:
    if name in TREES:
        return tree_workload(name, hidden, batch)
    if name in INSTANCES:
        model, instances = INSTANCES[name](batch, size=str(hidden))
        return model.eval(), instances
    return zoo_workload(name, batch)


def zoo_workload(name: str, batch: int) -> tuple[torch.nn.Module, list]:
    w = models.make(name, 1, size="paper", seed=0)
    return w.model.eval(), [w.inputs] + [models.make(name, 1, size="paper", seed=s).inputs for s in range(1, batch)]


def zoo_batch_dims(name: str) -> list[int]:
    """Each input's batch dim in the zoo's (batched) model: where batch 1 and batch 2 differ."""
    one, two = models.make(name, 1, size="small").inputs, models.make(name, 2, size="small").inputs
    return [next(d for d, (a, b) in enumerate(zip(x.shape, y.shape)) if a != b) for x, y in zip(one, two)]


def systems(name: str, model, instances: list, with_dynet: bool) -> dict:
    """name -> a function running every instance once."""
    fast = cocktailer.compile(model, instances[0], backend="cpu", dynamic=True)
    batched = cocktailer.batch(model, instances[0])
    out = {"eager": lambda: [model(*a) for a in instances],
           "compile": lambda: [fast(*a) for a in instances],
           "batch": lambda: batched(instances)}
    from bench.batch_peers import DynetServer, hand_batched, zoo_hand_batched
    from bench.throughput_peers import MODELS as THROUGHPUT_PEERS, throughput_hand_batched
    if name in TREES:
        peer = hand_batched(name, model)
    elif name in THROUGHPUT_PEERS:
        peer = throughput_hand_batched(name, model)
    elif name not in INSTANCES:
        peer = zoo_hand_batched(name, model, zoo_batch_dims(name))
    else:
        peer = None
    if peer is not None:
        out["hand-batched"] = lambda: peer(instances)
    jax = _jax_peer(name, model)
    if jax is not None:
        out["jax-vmap"] = lambda: jax(instances)
    if name in TREES and with_dynet:
        for strategy in ("agenda", "depth"):
            out[f"dynet-{strategy}"] = DynetServer(name, model, instances, strategy)
    out["batch"].batched = batched
    return out


def _jax_peer(name: str, model):
    """JAX's vmap of the model (masked), where JAX is installed and the model is ported."""
    try:
        from bench.jax_peers import MODELS, jax_vmapped
    except ImportError:
        return None
    return jax_vmapped(name, model) if name in MODELS else None


def _flat(x) -> list[torch.Tensor]:
    return [x] if isinstance(x, torch.Tensor) else [t for y in x for t in _flat(y)]


def check(fns: dict, instances: list) -> dict:
    """Each system's largest difference from eager, per instance, over every result tensor."""
    expected = fns["eager"]()
    errors = {}
    for system, fn in fns.items():
        if getattr(fn, "reports_seconds", False):
            errors[system] = fn.check["max_abs_err"] if fn.check["close"] else float("inf")
            continue
        got = fn()
        errors[system] = max(float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
                             for g, e in zip(got, expected) for a, b in zip(_flat(g), _flat(e)))
    return errors


def matmul_flops(model, instances: list) -> int:
    """The products' flops (2*M*N*K, batched and convolutions too) of the eager loop over
    `instances`: what a system that runs the same products must compute, however it batches
    them (one that drops products, hoisting a loop-invariant one, computes less)."""
    with FlopCounterMode(display=False) as counter:
        for a in instances:
            model(*a)
    return counter.get_total_flops()


def run_workload(name: str, hidden: int | None, batch: int, budget: Budget, with_dynet: bool) -> dict:
    model, instances = workload(name, hidden, batch)
    with torch.inference_mode():
        flops = matmul_flops(model, instances)
        fns = systems(name, model, instances, with_dynet)
        try:
            errors = check(fns, instances)
            order = list(fns)
            times = measure_interleaved([fns[s] for s in order], budget)
            batched = fns["batch"].batched
            start = time.perf_counter()
            batched(instances)
            one_call = time.perf_counter() - start
            schedule = batched.schedule
        finally:
            for fn in fns.values():
                if hasattr(fn, "close"):
                    fn.close()
    return {"model": name, "hidden": hidden, "batch": batch,
            "sizes": [[list(t.shape) for t in a if isinstance(t, torch.Tensor)] for a in instances],
            "max_abs_err": errors, "matmul_flops": flops,
            "systems": {s: {"times_s": t, **summarize(t)} for s, t in zip(order, times)},
            "inspect_s": schedule.inspect_s, "inspect_share": schedule.inspect_s / one_call,
            "levels": {f: [len(r) for r in runs] for f, runs in schedule.levels.items()},
            "branches": schedule.branches, "loop_steps": schedule.loop_steps}


_OFF = Techniques(levels=False, gather_fusion=False, parameter_reuse=False, native_blocks=False,
                  native_inspector=False, level_programs=False, loop_programs=False)
_LEVELS = Techniques(native_blocks=False, native_inspector=False, level_programs=False, loop_programs=False)
_PADDED = {"block_masks": False, "packed_rows": False, "lane_calls": False}   # the ragged techniques, added last
ABLATION = [   # (name, techniques, instances per call: 1 or all)
    ("one instance per call", Techniques(), 1),
    ("batched, depth-first", _OFF, None),
    ("+ parameter reuse", replace(_OFF, parameter_reuse=True), None),
    ("+ gather fusion", replace(_OFF, parameter_reuse=True, gather_fusion=True), None),
    ("+ levels", _LEVELS, None),
    ("+ native blocks", replace(_LEVELS, native_blocks=True, **_PADDED), None),
    ("+ native inspector", Techniques(level_programs=False, loop_programs=False, **_PADDED), None),
    ("+ level programs", Techniques(level_loop=False, loop_programs=False, **_PADDED), None),
    ("+ native level loop", Techniques(loop_programs=False, **_PADDED), None),
    ("+ loop programs", Techniques(**_PADDED), None),
    ("+ masks in blocks", Techniques(packed_rows=False, lane_calls=False), None),
    ("+ packed rows", Techniques(buckets=False, lane_calls=False), None),
    ("+ buckets", Techniques(lane_calls=False), None),
    ("+ lane calls (default)", Techniques(), None),
]


def run_ablation(name: str, hidden: int | None, batch: int, budget: Budget) -> dict:
    model, instances = workload(name, hidden, batch)
    fns = []
    with torch.inference_mode():
        expected = [model(*a) for a in instances]
        for label, techniques, per_call in ABLATION:
            batched = cocktailer.batch(model, instances[0], techniques=techniques)
            fn = (lambda b=batched: [b([a])[0] for a in instances]) if per_call == 1 else \
                (lambda b=batched: b(instances))
            got = fn()
            error = max(float((a.double() - b.double()).abs().max())
                        for g, e in zip(got, expected) for a, b in zip(_flat(g), _flat(e)))
            fns.append((label, fn, error))
        times = measure_interleaved([fn for _, fn, _ in fns], budget)
    return {"model": name, "hidden": hidden, "batch": batch,
            "steps": [{"name": label, "max_abs_err": error, "times_s": t, **summarize(t)}
                      for (label, _, error), t in zip(fns, times)]}


def ablation_table(data: dict) -> str:
    lines = ["# Throughput mode: each batching technique added in turn (ACROBAT Figure 6)", "",
             machine.summary(data["machine"]), f"- command: `{data['command']}`", "",
             "Median ms per call of all the instances; in parentheses, the speedup over the step before.", ""]
    labels = [label for label, _, _ in ABLATION]
    lines += ["| model | hidden | batch | " + " | ".join(labels) + " |", "|" + "---|" * (len(labels) + 3)]
    for w in data["ablation"]:
        ms = [step["median_s"] * 1e3 for step in w["steps"]]
        cells = [f"{ms[0]:.3g}"] + [f"{m:.3g} ({p / m:.2f}x)" for p, m in zip(ms, ms[1:])]
        lines.append(f"| {w['model']} | {w['hidden'] or ''} | {w['batch']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def table(data: dict) -> str:
    names = ["eager", "compile", "hand-batched", "dynet-agenda", "dynet-depth", "jax-vmap", "batch"]
    lines = ["# Throughput mode: many instances per call", "", machine.summary(data["machine"]),
             f"- command: `{data['command']}`", f"- allocator: {data.get('allocator', 'not recorded')}", "",
             "Median ms per call of all the instances (instances/s in parentheses for batch); "
             "x: batch's speedup over that system; inspect: the batched run's inspectors alone; "
             "floor: the eager loop's product flops at this machine's float32 matmul peak "
             f"({data['peak_flops'] / 1e9:.0f} GFLOP/s, measured in this run), the least time of a system "
             "running the same products; in parentheses eager over floor, the most such a system can gain "
             "over the eager loop (below the floor: products dropped, as loop-invariant ones hoisted).", "",
             "| model | hidden | batch | " + " | ".join(names) + " | inspect ms | floor ms | max error vs eager |",
             "|" + "---|" * (len(names) + 6)]
    for w in data["workloads"]:
        ms = {s: v["median_s"] * 1e3 for s, v in w["systems"].items()}
        ours = ms["batch"]
        cells = []
        for s in names:
            if s not in ms:
                cells.append("")
            elif s == "batch":
                cells.append(f"**{ours:.3g}** ({w['batch'] / ours * 1e3:.0f}/s)")
            else:
                cells.append(f"{ms[s]:.3g} ({ms[s] / ours:.2f}x)")
        worst = max(v for v in w["max_abs_err"].values())
        floor = _floor_s(w, data["peak_flops"])
        lines.append(f"| {w['model']} | {w['hidden'] or ''} | {w['batch']} | " + " | ".join(cells)
                     + f" | {w['inspect_s'] * 1e3:.2f} | {floor * 1e3:.3g} ({ms['eager'] / 1e3 / floor:.1f}x)"
                     + f" | {worst:.1e} |")
    return "\n".join(lines + [""] + _goals(data["workloads"], data["peak_flops"])) + "\n"


def _floor_s(workload: dict, peak_flops: float) -> float:
    return workload["matmul_flops"] / peak_flops


def _goals(workloads: list[dict], peak_flops: float) -> list[str]:
    """The issue's goals at the largest batch, from this run's medians."""
    if not workloads:
        return []
    top = max(w["batch"] for w in workloads)
    at_top = [w for w in workloads if w["batch"] == top]

    def ratio(w, peer):
        ms = {s: v["median_s"] for s, v in w["systems"].items()}
        return ms[peer] / ms["batch"] if peer in ms else None

    def geomean(xs):
        xs = [x for x in xs if x]
        return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None
    dynet = [max(filter(None, [ratio(w, "dynet-agenda"), ratio(w, "dynet-depth")]), default=None) for w in at_top]
    hand = [(w, ratio(w, "hand-batched")) for w in at_top if ratio(w, "hand-batched")]
    trees = [w for w in at_top if w["model"] in TREES or w["model"] in ("treegru", "mvrnn")]
    eager_trees = [ratio(w, "eager") for w in trees]
    lines = [f"At batch {top}:"]
    g = geomean(dynet)
    lines.append(f"- over DyNet (its better strategy), geomean of {sum(1 for d in dynet if d)} workloads: "
                 + (f"{g:.2f}x (goal: at least 2.3x)" if g else "not measured"))
    lines.append(f"- faster than hand-batched PyTorch on {sum(1 for _, r in hand if r > 1)} of {len(hand)} workloads "
                 "(goal: all): " + ", ".join(f"{w['model']}/{w['hidden'] or '-'} {r:.2f}x" for w, r in hand))
    if eager_trees:
        lines.append(f"- over the eager loop on the tree models: {min(eager_trees):.1f}x to {max(eager_trees):.1f}x "
                     "(goal: at least 10x); " + _reachable(trees, eager_trees, peak_flops))
    return lines


def _reachable(trees: list[dict], over_eager: list[float], peak_flops: float) -> str:
    """Which tree workloads' eager loops take 10 floors or more (where 10x is possible for a
    system running the eager loop's products) and on how many of them the batched run reached it."""
    def label(w):
        return f"{w['model']}/{w['hidden'] or '-'}"
    bound = {label(w): w["systems"]["eager"]["median_s"] / _floor_s(w, peak_flops) for w in trees}
    possible = [(label(w), r) for w, r in zip(trees, over_eager) if bound[label(w)] >= 10]
    out_of_reach = [f"{name} (eager {b:.1f} floors)" for name, b in bound.items() if b < 10]
    return (f"10x possible at this machine's matmul peak on {len(possible)} of {len(trees)}, reached on "
            f"{sum(1 for _, r in possible if r >= 10)} of them"
            + (f"; out of reach for a system running the eager loop's products: {', '.join(out_of_reach)}"
               if out_of_reach else ""))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=DEFAULT_MODELS)
    p.add_argument("--hidden", default="256,512", help="the tree models' hidden sizes")
    p.add_argument("--batch", default="8,64")
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per system, at least")
    p.add_argument("--no-dynet", action="store_true")
    p.add_argument("--ablation", action="store_true", help="the techniques added in turn, instead of the peers")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/batching"))
    a = p.parse_args(argv)
    budget = Budget(warmup=2, min_runs=5, min_seconds=a.seconds, max_seconds=4 * a.seconds)
    data = {"machine": machine.describe(), "command": "python -m bench.batching " + " ".join(argv or []),
            "allocator": machine.keep_freed_memory(), "workloads": [], "ablation": []}
    if not a.ablation:
        data["peak_flops"] = roofline.measure_machine()["peak_flops"]
    for name in a.models.split(","):
        for hidden in ([int(h) for h in a.hidden.split(",")] if name in TREES or name in INSTANCES else [None]):
            for batch in (int(b) for b in a.batch.split(",")):
                print(f"{name} hidden={hidden} batch={batch}", flush=True)
                if a.ablation:
                    data["ablation"].append(run_ablation(name, hidden, batch, budget))
                else:
                    data["workloads"].append(run_workload(name, hidden, batch, budget, not a.no_dynet))
    write_small_run(a.out, data, ablation_table(data) if a.ablation else table(data))


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
