"""Peers for throughput mode: many tree instances per call (the setting of the ACROBAT and
Cortex papers), for the tree models of cocktailer.models.tree (RAE, TreeLSTM, TreeFC).

- `hand_batched(name, model)`: what a skilled PyTorch user writes by hand: linearize every
  instance's tree into global index arrays, compute node heights with tensor ops, then run
  level by level (all leaves at once, then one batched step per height), one GEMM per Linear
  per level, children gathered from a results table.
- `dynet_port(name, model)`: the same model in DyNet (the `dynet38` package), weights copied
  from torch, one computation graph per call holding every instance, so DyNet's automatic
  batching batches across instances.

DyNet picks its autobatching strategy once per process, when it is initialised (see
`init_dynet`): 0 off, 1 agenda-based (run next the ready batch whose kind of op has the lowest
average depth), 2 depth-based (batch ops of one kind at the same depth). So `dynet_time` runs
a port in a fresh process:

    python -m bench.batch_peers --dynet treelstm --size paper --batch 64 --strategy agenda --runs 10

prints one JSON line: the raw seconds of each timed call, and a checksum and the largest
error against eager PyTorch computed in that process.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Callable

import torch
import torch.nn as nn

MODELS = ("rae", "treelstm", "treefc")
# --dynet-autobatch values (dynet's BatchedExecutionEngine; 0 means the unbatched engine). 3, an
# undocumented agenda variant that waits until a depth's ops of a kind are all ready, is left out.
STRATEGIES = {"none": 0, "agenda": 1, "depth": 2}
DYNET_MEM_MB = 1024   # MB; autobatching cannot grow DyNet's memory pools, so they are sized up front

Peer = Callable[[list], list]


# --------------------------------------------------------------------------- hand-batched torch


def linearize(instances: list[tuple]) -> tuple:
    """(left, right, is_leaf, inp, roots, leaves, levels) over all instances: node tables
    concatenated (global id = instance offset + local id), `leaves` the reachable leaves and
    `levels[k]` the reachable internal nodes of height k + 1."""
    sizes = torch.tensor([a[0].shape[0] for a in instances])
    offsets = torch.cumsum(sizes, 0) - sizes
    node_offset = offsets.repeat_interleave(sizes)
    left = torch.cat([a[0] for a in instances])
    right = torch.cat([a[1] for a in instances])
    left = torch.where(left >= 0, left + node_offset, -1)
    right = torch.where(right >= 0, right + node_offset, -1)
    is_leaf = torch.cat([a[2] for a in instances])
    inp = torch.cat([a[3] for a in instances])
    roots = torch.stack([a[4] for a in instances]) + offsets

    # Reachable nodes: walk down from the roots one level per step. A leaf's children are never
    # read (as in the models), and padding nodes are leaves nobody reaches.
    reach = torch.zeros(left.shape[0], dtype=torch.bool)
    frontier = roots
    while frontier.numel():
        reach[frontier] = True
        inner = frontier[~is_leaf[frontier]]
        frontier = torch.cat([left[inner], right[inner]])
    nodes = reach.nonzero().squeeze(1)
    leaves, inner = nodes[is_leaf[nodes]], nodes[~is_leaf[nodes]]

    # Heights (leaf 0) as the fixed point of h = 1 + max(h[left], h[right]) over internal
    # nodes: one vectorized step per level, done when a step changes nothing.
    height = torch.zeros(left.shape[0], dtype=torch.int64)
    l_in, r_in = left[inner], right[inner]
    while True:
        new = 1 + torch.maximum(height[l_in], height[r_in])
        if torch.equal(new, height[inner]):
            break
        height[inner] = new
    h = height[inner]
    levels = inner[torch.argsort(h, stable=True)].split(torch.bincount(h)[1:].tolist()) if inner.numel() else ()
    return left, right, is_leaf, inp, roots, leaves, levels


def _children(table: torch.Tensor, left, right, idx) -> tuple[torch.Tensor, torch.Tensor]:
    return table.index_select(0, left.index_select(0, idx)), table.index_select(0, right.index_select(0, idx))


def _rae(model, left, right, inp, leaves, levels) -> torch.Tensor:
    out = torch.empty_like(inp)   # results table, by global node id (rows of unreached nodes unused)
    out.index_copy_(0, leaves, inp.index_select(0, leaves))
    for idx in levels:
        l, r = _children(out, left, right, idx)
        out.index_copy_(0, idx, torch.tanh(model.encode(torch.cat([l, r], 1))))
    return out


def _treefc(model, left, right, inp, leaves, levels) -> torch.Tensor:
    out = torch.empty_like(inp)
    out.index_copy_(0, leaves, inp.index_select(0, leaves))
    for idx in levels:
        l, r = _children(out, left, right, idx)
        out.index_copy_(0, idx, torch.tanh(model.left(l) + model.right(r)))
    return out


def _treelstm(model, left, right, inp, leaves, levels) -> torch.Tensor:
    h_tab, c_tab = torch.empty_like(inp), torch.empty_like(inp)
    i, o, u = model.leaf(inp.index_select(0, leaves)).chunk(3, -1)   # one GEMM for all leaves
    c = torch.sigmoid(i) * torch.tanh(u)
    h_tab.index_copy_(0, leaves, torch.sigmoid(o) * torch.tanh(c))
    c_tab.index_copy_(0, leaves, c)
    for idx in levels:
        h_l, h_r = _children(h_tab, left, right, idx)
        c_l, c_r = _children(c_tab, left, right, idx)
        i, f_l, f_r, o, u = model.node(torch.cat([h_l, h_r], 1)).chunk(5, -1)
        c = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f_l) * c_l + torch.sigmoid(f_r) * c_r
        h_tab.index_copy_(0, idx, torch.sigmoid(o) * torch.tanh(c))
        c_tab.index_copy_(0, idx, c)
    return h_tab


_LEVELWISE = {"rae": _rae, "treelstm": _treelstm, "treefc": _treefc}


def hand_batched(name: str, model: nn.Module) -> Peer:
    """instances -> each instance's root result, computed level by level across all instances.
    The linearization runs inside the call, so it is timed with it."""
    run = _LEVELWISE[name]

    def call(instances: list[tuple]) -> list[torch.Tensor]:
        with torch.inference_mode():
            left, right, _, inp, roots, leaves, levels = linearize(instances)
            return list(run(model, left, right, inp, leaves, levels).index_select(0, roots))
    return call


def zoo_hand_batched(name: str, model: nn.Module, batch_dims: list[int]) -> Peer:
    """The zoo's sequence and early-exit models are written for a batch already (masked where
    instances diverge: BlockDrop and SkipNet blend each block's output with `where`, the LSTMs
    run every instance to the common length). What a user does with single instances of them:
    concatenate along each input's batch dim (`batch_dims`), call once, split the result. The
    seq2seq decoder needs one change to give each instance's own answer: tokens after an
    instance's EOS are masked to padding (its batch loop runs until every instance is done)."""
    if name == "seq2seq":
        return _masked_decoder(model)

    def call(instances: list[tuple]) -> list[torch.Tensor]:
        with torch.inference_mode():
            out = model(*(torch.cat(column, d) for column, d in zip(zip(*instances), batch_dims)))
            return list(out.split(1, 0))
    return call


def _masked_decoder(model: nn.Module) -> Peer:
    def call(instances: list[tuple]) -> list[torch.Tensor]:
        with torch.inference_mode():
            h = torch.cat([a[0] for a in instances])
            c = torch.cat([a[1] for a in instances])
            eos_bias = torch.cat([a[2] for a in instances], 1)
            batch = h.shape[0]
            out = torch.full((batch, model.max_len), model.pad, dtype=torch.long)
            tok = torch.full((batch,), model.sos, dtype=torch.long)
            done = torch.zeros(batch, dtype=torch.bool)
            for t in range(model.max_len):
                h, c = model.cell(model.embed(tok), (h, c))
                tok = (model.proj(h) + eos_bias[t].unsqueeze(1) * model.eos_onehot).argmax(-1)
                out[:, t] = torch.where(done, model.pad, tok)   # an instance that finished writes padding
                done = done | (tok == model.eos)
                if bool(done.all()):
                    break
            return list(out.split(1, 0))
    return call


# --------------------------------------------------------------------------- DyNet


def init_dynet(strategy: str = "agenda", mem_mb: int = DYNET_MEM_MB, seed: int = 1):
    """Import dynet with the autobatching `strategy` (a key of STRATEGIES). The choice is made
    once per process, when dynet is first imported; a later call with another choice fails."""
    import dynet_config
    wanted = STRATEGIES[strategy]
    if "dynet" in sys.modules:
        have = (dynet_config.get() or {}).get("autobatch", 0)
        if have != wanted:
            raise RuntimeError(f"dynet already initialised with autobatch={have}, not {wanted}: use dynet_time")
    else:
        dynet_config.set(mem=str(mem_mb), autobatch=wanted, random_seed=seed)
    import dynet
    return dynet


def _params(pc, linear: nn.Linear) -> tuple:
    """(weight, bias or None) of `linear` as DyNet parameters in `pc`, copied."""
    w = pc.parameters_from_numpy(linear.weight.detach().numpy().astype("float32"))
    b = None if linear.bias is None else pc.parameters_from_numpy(linear.bias.detach().numpy().astype("float32"))
    return w, b


def dynet_port(name: str, model: nn.Module) -> Peer:
    """instances -> each instance's root result, from one DyNet graph per call with every
    instance in it. Imports dynet on first use (unbatched unless init_dynet chose a strategy)."""
    import dynet as dy
    pc = dy.ParameterCollection()
    build = {"rae": _dy_rae, "treelstm": _dy_treelstm, "treefc": _dy_treefc}[name](dy, pc, model)

    def call(instances: list[tuple]) -> list[torch.Tensor]:
        dy.renew_cg()
        roots = []
        for left, right, is_leaf, inp, root in instances:
            tree = (left.tolist(), right.tolist(), is_leaf.tolist(), inp.numpy())
            roots.append(build(tree, int(root)))
        # One forward over all roots: this is where autobatching sees every instance at once.
        values = dy.concatenate_cols(roots).npvalue().reshape(-1, len(roots))
        return list(torch.from_numpy(values.T.astype("float32")))
    call.params = pc   # keeps the parameters alive with the port
    return call


def _dy_rae(dy, pc, model):
    w, b = _params(pc, model.encode)

    def enc(tree, n):
        left, right, is_leaf, inp = tree
        if is_leaf[n]:
            return dy.inputTensor(inp[n])
        return dy.tanh(dy.affine_transform([b, w, dy.concatenate([enc(tree, left[n]), enc(tree, right[n])])]))
    return enc


def _dy_treefc(dy, pc, model):
    (wl, bl), (wr, _) = _params(pc, model.left), _params(pc, model.right)

    def enc(tree, n):
        left, right, is_leaf, inp = tree
        if is_leaf[n]:
            return dy.inputTensor(inp[n])
        return dy.tanh(dy.affine_transform([bl, wl, enc(tree, left[n])]) + wr * enc(tree, right[n]))
    return enc


def _dy_treelstm(dy, pc, model):
    (wl, bl), (wn, bn) = _params(pc, model.leaf), _params(pc, model.node)
    hid = model.leaf.out_features // 3

    def gates(x, k):   # torch's .chunk(k, -1) of one affine output
        return [dy.pick_range(x, j * hid, (j + 1) * hid) for j in range(k)]

    def enc(tree, n):
        left, right, is_leaf, inp = tree
        if is_leaf[n]:
            i, o, u = gates(dy.affine_transform([bl, wl, dy.inputTensor(inp[n])]), 3)
            c = dy.cmult(dy.logistic(i), dy.tanh(u))
            return dy.cmult(dy.logistic(o), dy.tanh(c)), c
        h_l, c_l = enc(tree, left[n])
        h_r, c_r = enc(tree, right[n])
        i, f_l, f_r, o, u = gates(dy.affine_transform([bn, wn, dy.concatenate([h_l, h_r])]), 5)
        c = (dy.cmult(dy.logistic(i), dy.tanh(u)) + dy.cmult(dy.logistic(f_l), c_l)
             + dy.cmult(dy.logistic(f_r), c_r))
        return dy.cmult(dy.logistic(o), dy.tanh(c)), c
    return lambda tree, n: enc(tree, n)[0]


# --------------------------------------------------------------------------- a port in its own process


def dynet_time(name: str, size: str, batch: int, seed: int, strategy: str, runs: int,
               mem_mb: int = DYNET_MEM_MB, timeout: float = 1800) -> dict:
    """Runs the DyNet port of `name` on `cocktailer.models.make(name, batch, size=size,
    seed=seed)` in a fresh process under `strategy`; its JSON report (see `_run_dynet`)."""
    from bench import machine
    done = subprocess.run([sys.executable, "-m", "bench.batch_peers", "--dynet", name, "--size", size,
                           "--batch", str(batch), "--seed", str(seed), "--strategy", strategy,
                           "--runs", str(runs), "--mem", str(mem_mb)],
                          capture_output=True, text=True, cwd=machine.REPO, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"dynet {name} ({strategy}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _run_dynet(name: str, size: str, batch: int, seed: int, strategy: str, runs: int, mem_mb: int) -> dict:
    """In this (fresh) process: one warm-up call, then `runs` timed calls of the port."""
    init_dynet(strategy, mem_mb)
    from cocktailer import models
    w = models.make(name, batch, size=size, seed=seed)
    instances = w.config["instances"]
    port = dynet_port(name, w.model)
    with torch.inference_mode():
        expected = [w.model(*a) for a in instances]
    got = port(instances)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        port(instances)
        times.append((time.perf_counter_ns() - t0) * 1e-9)
    err = max(float((g - e).abs().max()) for g, e in zip(got, expected))
    rel = max(float(((g - e).abs() / (e.abs() + 1e-30)).max()) for g, e in zip(got, expected))
    return {"name": name, "size": size, "batch": batch, "seed": seed, "strategy": strategy,
            "autobatch": STRATEGIES[strategy], "times_s": times,
            "checksum": float(sum(g.double().sum() for g in got)),
            "max_abs_err": err, "max_rel_err": rel,
            "close": all(torch.allclose(g, e, rtol=1e-4, atol=1e-5) for g, e in zip(got, expected))}


class DynetServer:
    """A DyNet port in a process of its own (DyNet's autobatching strategy is per process) on the
    caller's model and instances, timed one call at a time on request, so that a benchmark can
    interleave it with the systems it runs in-process. Calling it runs the port once there and
    returns that call's seconds (`reports_seconds`); `check` is its results against eager."""
    reports_seconds = True

    def __init__(self, name: str, model: nn.Module, instances: list, strategy: str, mem_mb: int = DYNET_MEM_MB):
        import tempfile
        from bench import machine
        self._file = tempfile.NamedTemporaryFile(suffix=".pt", delete=False)
        torch.save({"name": name, "model": model, "instances": instances}, self._file.name)
        self._proc = subprocess.Popen([sys.executable, "-m", "bench.batch_peers", "--serve", self._file.name,
                                       "--strategy", strategy, "--mem", str(mem_mb)], cwd=machine.REPO,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.check = json.loads(self._proc.stdout.readline())

    def __call__(self) -> float:
        self._proc.stdin.write("run\n")
        self._proc.stdin.flush()
        return float(self._proc.stdout.readline())

    def close(self):
        import os
        self._proc.stdin.close()
        self._proc.wait(timeout=60)
        os.unlink(self._file.name)


def _serve(path: str, strategy: str, mem_mb: int):
    """The DynetServer's process: the check as one JSON line, then one line of seconds per request."""
    init_dynet(strategy, mem_mb)
    job = torch.load(path, weights_only=False)
    model, instances = job["model"], job["instances"]
    port = dynet_port(job["name"], model)
    with torch.inference_mode():
        expected = [model(*a) for a in instances]
    got = port(instances)
    print(json.dumps({"strategy": strategy, "max_abs_err": max(float((g - e).abs().max()) for g, e in zip(got, expected)),
                      "close": all(torch.allclose(g, e, rtol=1e-4, atol=1e-5) for g, e in zip(got, expected))}),
          flush=True)
    for _ in sys.stdin:
        t0 = time.perf_counter_ns()
        port(instances)
        print((time.perf_counter_ns() - t0) * 1e-9, flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", help="run as a DynetServer on this job file")
    p.add_argument("--dynet", choices=MODELS, help="the model whose DyNet port to run")
    p.add_argument("--size", default="paper")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--strategy", choices=list(STRATEGIES), default="agenda")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--mem", type=int, default=DYNET_MEM_MB, help="DyNet's memory pools, MB")
    a = p.parse_args(argv)
    if a.serve:
        return _serve(a.serve, a.strategy, a.mem)
    if not a.dynet:
        p.error("--dynet or --serve is required")
    print(json.dumps(_run_dynet(a.dynet, a.size, a.batch, a.seed, a.strategy, a.runs, a.mem)))


if __name__ == "__main__":
    main()
