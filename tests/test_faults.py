"""Faults that must end cleanly: what a compiled function reads as constants changed after
compiling (a parameter replaced, new memory under a tensor), and Python arguments mutated
between calls. Each gives the eager answer on the next call (the program is compiled again
where needed), never a stale one."""
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass

import pytest
import torch
import torch.nn as nn

import cocktailer
from utils import backends_under_test


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("scale", torch.ones(3))

    def forward(self, x, n):
        for _ in range(n):
            x = torch.tanh(self.lin(x)) * self.scale
        return x


def _check(fast, model, *args):
    with torch.no_grad():
        torch.testing.assert_close(fast(*args), model(*args), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", backends_under_test())
@pytest.mark.parametrize("change", ["parameter", "data", "submodule", "buffer", "in_place"])
def test_replaced_parameters_are_seen(backend, change):
    torch.manual_seed(0)
    model = Net().eval()
    x, n = torch.randn(2, 3), torch.tensor(3)
    fast = cocktailer.compile(model, (x, n), backend=backend)
    _check(fast, model, x, n)
    with torch.no_grad():
        if change == "parameter":
            model.lin.weight = nn.Parameter(torch.randn(3, 3))
        elif change == "data":
            model.lin.weight.data = torch.randn(3, 3)
        elif change == "submodule":
            model.lin = nn.Linear(3, 3)
        elif change == "buffer":
            model.scale = torch.full((3,), 0.5)
        else:
            model.lin.weight.mul_(-1.0)
    _check(fast, model, x, n)


@pytest.mark.parametrize("backend", backends_under_test())
def test_two_compiles_of_one_model_share_derived_weights_and_both_follow_writes(backend):
    """A repeat compile reuses the folded and packed weights of the first (runtime.memo); a
    weight written in place after both must reach both, and a compile after the write."""
    torch.manual_seed(0)
    model = Net().eval()
    x, n = torch.randn(2, 3), torch.tensor(3)
    first = cocktailer.compile(model, (x, n), backend=backend)
    second = cocktailer.compile(model, (x, n), backend=backend)
    with torch.no_grad():
        model.lin.weight.mul_(-1.0)
    _check(first, model, x, n)
    _check(second, model, x, n)
    _check(cocktailer.compile(model, (x, n), backend=backend), model, x, n)
    with torch.no_grad():
        model.lin.weight.add_(0.5)
    _check(second, model, x, n)
    _check(first, model, x, n)


@dataclass
class Node:   # eq=True without frozen: unhashable, compared by value
    value: float
    children: list


class Tree:   # a plain object: hashable by identity, mutated in place by the user
    def __init__(self, depth):
        self.depth = depth
        self.children = []


def walk(x, tree):
    for child in tree.children:   # Python structure, read at capture
        x = walk(x, child) * 0.5 + 1.0
    return x + tree.depth


def scaled(x, node):
    return x * node.value + len(node.children)


def test_python_object_arguments_are_keyed_by_their_contents():
    for backend in backends_under_test():
        fast = cocktailer.compile(walk, backend=backend)
        x, tree = torch.randn(3), Tree(1)
        tree.children.append(Tree(2))
        _check_fn = lambda: torch.testing.assert_close(fast(x, tree), walk(x, tree))
        _check_fn()
        tree.children.append(Tree(3))      # the same object, other contents: not the old program
        _check_fn()
        tree.children[0].depth = 7
        _check_fn()
        cyclic = Tree(0)
        cyclic.parent = cyclic             # a cycle in the object graph is keyed, not followed forever
        torch.testing.assert_close(fast(x, cyclic), walk(x, cyclic))

        node = Node(2.0, [])
        fast2 = cocktailer.compile(scaled, backend=backend)
        torch.testing.assert_close(fast2(x, node), scaled(x, node))
        node.value, node.children = 3.0, [1, 2]
        torch.testing.assert_close(fast2(x, node), scaled(x, node))


RUNAWAY = textwrap.dedent("""
    import signal, sys, torch, cocktailer
    # Python's own handler, as in a terminal: a process started in the background of a
    # non-interactive shell (as CI may start the tests) inherits SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    def spin(x):
        while x.sum() > 0:   # never false for positive x
            x = x * 1.0
        return x
    fast = cocktailer.compile(spin, backend=sys.argv[1], options={"workers": 2})
    fast(torch.zeros(4))   # compiled, and a call that ends
    print("ready", flush=True)
    try:
        fast(torch.ones(4))
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    assert torch.equal(fast(torch.zeros(4)), torch.zeros(4))   # the next call runs as usual
    print("again", flush=True)
""")


@pytest.mark.parametrize("backend", ["cpu", "host"])
def test_ctrl_c_stops_a_runaway_loop(backend, tmp_path):
    """A `while` that never ends runs in native code (cpu) or in Python (host); Ctrl-C ends the
    call with KeyboardInterrupt either way, and the compiled function stays usable."""
    script = tmp_path / "runaway.py"   # a file: capture reads the function's source
    script.write_text(RUNAWAY)
    child = subprocess.Popen([sys.executable, str(script), backend], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
        time.sleep(0.3)   # inside the runaway call by now
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert out.split() == ["interrupted", "again"], err


@pytest.mark.parametrize("backend", ["cpu", "host"])
def test_iteration_guard_raises(backend):
    def count(x, n: int):
        i = torch.zeros((), dtype=torch.int64)
        while i < n:
            x = x + 1
            i = i + 1
        return x
    fast = cocktailer.compile(count, backend=backend, options={"max_iterations": 5})
    assert torch.equal(fast(torch.zeros(2), 5), torch.full((2,), 5.0))   # as many as allowed
    with pytest.raises(cocktailer.CompiledCallError, match=r"max_iterations option allows \(5\)"):
        fast(torch.zeros(2), 6)
    with pytest.raises(ValueError, match="max_iterations must be a positive int"):
        cocktailer.compile(count, backend=backend, options={"max_iterations": 0})
