"""Throughput mode (`cocktailer.batch`): every instance's result, and its arguments after the
call, equal the model run on it alone in eager PyTorch, whatever else is in the batch."""
import warnings

import pytest
import torch
import torch.nn as nn

import cocktailer
from cocktailer import models
from cocktailer.batching import Techniques
from cocktailer.data import chain_tree, perfect_tree, random_tree
from cocktailer.ir import Op, Operation
from cocktailer.models.throughput import BiRNN
from cocktailer.models.tree import tree_inputs
from cocktailer.runtime import find_compiler
from test_tree_objects import BinaryTreeRNN, binary_tree, walk
from utils import _clone, assert_same, randn

native = pytest.mark.skipif(find_compiler() is None, reason="no C compiler")


def assert_batch_matches(model, instances, **kwargs):
    """The batched call against eager, instance by instance: results and mutated arguments."""
    batched = cocktailer.batch(model, instances[0], **kwargs)
    mine, theirs = [_clone(a) for a in instances], [_clone(a) for a in instances]
    with torch.no_grad():
        outs = batched(mine)
        expected = [model(*a) for a in theirs]
    assert len(outs) == len(instances)
    for k, (out, want, a, b) in enumerate(zip(outs, expected, mine, theirs)):
        assert_same(out, want, rtol=1e-4, atol=1e-5, path=f"instance {k}")
        assert_same(a, b, rtol=1e-4, atol=1e-5, path=f"instance {k}'s arguments")
    return batched


# --------------------------------------------------------------------------- the zoo


@pytest.mark.parametrize("name", models.names())
def test_zoo_model_batched_equals_each_instance(name):
    w = models.make(name, batch=1, size="small", seed=0)
    instances = [w.inputs] + [models.make(name, batch=1, size="small", seed=s).inputs for s in range(1, 6)]
    assert_batch_matches(w.model.eval(), instances)


def _tree_instances(hidden: int, trees) -> list[tuple]:
    g = torch.Generator().manual_seed(1)
    table = torch.randn(50, hidden, generator=g)
    nodes = max(t.num_nodes for t in trees)
    return [tree_inputs(t, [int(i) for i in torch.randint(50, (t.num_leaves,), generator=g)], table, nodes)
            for t in trees]


@pytest.mark.parametrize("name", ["rae", "treelstm", "treefc"])
@pytest.mark.parametrize("count", [1, 8, 64])
def test_tree_models_mix_shallow_and_deep_trees(name, count):
    """A one-leaf tree, a depth-29 chain and random bracketings in one batch: level by level."""
    w = models.make(name, batch=1, size="small", seed=0)
    trees = [chain_tree(29), random_tree(1, 0), perfect_tree(3)]
    trees += [random_tree(1 + k % 17, k) for k in range(count)]
    batched = assert_batch_matches(w.model.eval(), _tree_instances(8, trees[:count]))
    if count > 1:
        (levels,) = batched.schedule.levels.values()
        assert len(levels[0]) == 30, "one level per height of the deepest tree"


def test_a_result_that_is_a_row_of_an_argument_is_that_row_in_each_instance_where_eager_returns_it():
    """RAE returns a one-leaf tree's input row itself (a view), any other tree's root a new
    tensor: per instance, the batch's result shares the argument's memory exactly where eager's
    does, at eager's row, so that a write into it reaches the argument as in eager."""
    w = models.make("rae", batch=1, size="small", seed=0)
    trees = [random_tree(1, 0), perfect_tree(2), random_tree(1, 1), chain_tree(5), random_tree(1, 2)]
    instances = _tree_instances(8, trees)
    batched = cocktailer.batch(w.model.eval(), instances[0])
    mine, theirs = [_clone(a) for a in instances], [_clone(a) for a in instances]
    with torch.no_grad():
        outs = batched(mine)
        expected = [w.model(*a) for a in theirs]
    for k, (out, want, a, b) in enumerate(zip(outs, expected, mine, theirs)):
        shares = want.untyped_storage().data_ptr() == b[3].untyped_storage().data_ptr()
        assert shares == (trees[k].num_nodes == 1)
        assert (out.untyped_storage().data_ptr() == a[3].untyped_storage().data_ptr()) == shares, f"instance {k}"
        assert out.data_ptr() - a[3].data_ptr() == want.data_ptr() - b[3].data_ptr() or not shares, f"instance {k}"
        out.add_(1.0)
        want.add_(1.0)
        assert_same(a, b, path=f"instance {k}'s arguments after a write into its result")


# --------------------------------------------------------------------------- loops and branches


class CountedLoop(nn.Module):
    """A loop whose trip count is each instance's own tensor."""

    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(6, 6)

    def forward(self, x, steps):
        for _ in range(steps):
            x = torch.tanh(self.cell(x))
        return x


class UntilThreshold(nn.Module):
    """A while loop on a tensor condition: instances leave after different numbers of steps."""

    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(4, 4)

    def forward(self, x, limit):
        total = torch.zeros(())
        while total < limit:
            x = torch.tanh(self.cell(x)) + 1
            total = total + x.sum()
        return x, total


class EarlyExit(nn.Module):
    """Berxit-style: leave the layer stack when the classifier is confident enough."""

    def __init__(self, layers=6, d=8):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.head = nn.Linear(d, 3)

    def forward(self, x, threshold):
        for layer in self.layers:
            x = torch.relu(layer(x)) + x
            p = torch.softmax(self.head(x), -1)
            if p.max() > threshold:
                return p
        return torch.softmax(self.head(x), -1)


class Branchy(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            y = x * 2
            if x[0] > 0.5:
                y = y - 1
        else:
            y = torch.exp(x)
        return y


def test_per_instance_trip_counts_from_1_to_60():
    model = CountedLoop().eval()
    steps = [1, 60, 7, 0, 33, 60, 2, 15]
    instances = [(randn(6, seed=k), torch.tensor(n)) for k, n in enumerate(steps)]
    assert_batch_matches(model, instances)


def test_while_loop_instances_leave_as_they_finish():
    model = UntilThreshold().eval()
    instances = [(randn(4, seed=k), torch.tensor(float(limit))) for k, limit in enumerate([0.5, 40, 3, 200, 9])]
    batched = assert_batch_matches(model, instances)
    longest = 0
    for x, limit in instances:   # the loop runs as long as its longest instance, not once per instance
        total, steps = torch.zeros(()), 0
        with torch.no_grad():
            while total < limit:
                x = torch.tanh(model.cell(x)) + 1
                total, steps = total + x.sum(), steps + 1
        longest = max(longest, steps)
    assert batched.schedule.loop_steps == longest > 1


def test_early_exit_at_different_layers():
    model = EarlyExit().eval()
    instances = [(randn(8, seed=k, scale=3.0), torch.tensor(t)) for k, t in enumerate([0.0, 0.5, 0.7, 0.99, 1.0, 0.4])]
    batched = assert_batch_matches(model, instances)
    assert batched.schedule.branches > 0


def test_a_branch_result_read_on_one_arms_lanes_is_taken_from_that_arm_alone():
    from cocktailer.batching.lanes import Lanes, Split, take
    stayed, left = torch.tensor([0, 2, 3]), torch.tensor([1, 4])
    state = Lanes(torch.arange(3 * 4.0).view(3, 4))
    placeholder = torch.zeros(4)   # what the arm of the lanes that left yields: shared, never read
    result = Split([(stayed, state), (left, placeholder)], 5, torch.float32)
    part = take(result, torch.tensor([2, 3]))   # lanes 2 and 3: rows 1 and 2 of the first arm
    assert result._base is None, "taking one arm's lanes must not put every lane's rows together"
    torch.testing.assert_close(part.rows(), state.base[1:])
    assert take(result, left) is placeholder
    mixed = take(result, torch.tensor([4, 0]))   # across both arms: from every lane's rows
    torch.testing.assert_close(mixed.rows(), torch.stack([placeholder, state.base[0]]))
    assert result.rank == 1 and result.count == 5


def test_an_early_exits_state_is_never_put_together_for_the_lanes_that_left(monkeypatch):
    """Berxit's layers are a chain of branches, each handing the state of the sentences still
    running to the next: the executor takes it from the arm that computed it, layer after
    layer, instead of writing every sentence's rows (with placeholders) into one tensor."""
    from cocktailer.batching.lanes import Split
    from cocktailer.models.throughput import berxit_instances
    put_together = []
    base = Split.base.fget
    monkeypatch.setattr(Split, "base", property(lambda self: put_together.append(self.rank) or base(self)))
    model, instances = berxit_instances(8, "small", seed=1)
    batched = assert_batch_matches(model, instances)
    assert batched.schedule.branches >= 2, "the sentences left at different layers"
    assert put_together and max(put_together) == 1, "only the class probabilities (rank 1) are put together"


def test_divergent_branches_run_each_arm_on_its_group():
    instances = [(randn(5, seed=k) + (k % 3 - 1),) for k in range(9)]
    batched = assert_batch_matches(Branchy(), instances)
    assert batched.schedule.branches >= 1


# --------------------------------------------------------------------------- recursion


class ParseFromResults(nn.Module):
    """Recursion whose second call happens only if the first call's result says so (a parser's
    action from what it built so far): the call tree is known only while running, so it runs
    depth-first, each call batched over the lanes that make it."""

    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(4, 4)

    def forward(self, h, depth):
        if depth >= 3:
            return h
        a = self.forward(torch.tanh(self.cell(h)), depth + 1)
        if a.sum() > 0:
            return a + self.forward(a * 0.5, depth + 1)
        return a


def test_tensor_dependent_recursion_runs_depth_first():
    model = ParseFromResults().eval()
    instances = [(randn(4, seed=k), torch.tensor(0)) for k in range(8)]
    batched = assert_batch_matches(model, instances)
    assert "forward" in batched.schedule.depth_first


def test_trees_of_node_objects():
    model = BinaryTreeRNN().eval()
    trees = [binary_tree(k, n) for k, n in enumerate([1, 5, 5, 9, 5])]
    eager_trees = [binary_tree(k, n) for k, n in enumerate([1, 5, 5, 9, 5])]
    batched = cocktailer.batch(model, (trees[0],))
    with torch.no_grad():
        outs = batched([(t,) for t in trees])
        expected = [model(t) for t in eager_trees]
    for out, want, mine, theirs in zip(outs, expected, trees, eager_trees):
        assert_same(out, want, rtol=1e-4, atol=1e-5)
        for a, b in zip(walk(mine), walk(theirs)):   # the fields the program assigns, on every node
            assert_same(a.state, b.state, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- sizes, aliasing, state


class SequenceRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(3, 5)

    def forward(self, xs):
        h = torch.zeros(5)
        outs = []
        for t in range(xs.shape[0]):
            h = self.cell(xs[t], h)
            outs.append(h)
        return torch.stack(outs), h


def test_sequences_of_different_lengths_share_one_program():
    model = SequenceRNN().eval()
    lengths = [7, 60, 1, 7, 12, 1, 2]
    instances = [(randn(n, 3, seed=k),) for k, n in enumerate(lengths)]
    batched = assert_batch_matches(model, instances)
    # one program for every length; length 1 (like 0) is always compiled apart (api's size rules)
    assert len(batched.single.cache) == 2
    assert batched.schedule.lanes == 5, "every length but 1 in one batch, each padded to the longest"
    assert batched.schedule.loop_programs == 1, "the loop and the outputs it stacks, in one native call"


class RunningSums(nn.Module):
    """A tensor created with the sequence's size (as a stack of SPINN's is), written row by row."""

    def forward(self, xs):
        out = torch.zeros_like(xs)
        acc = xs.new_zeros(xs.shape[1])
        for t in range(xs.shape[0]):
            acc = acc + xs[t]
            out[t] = acc
        return out, acc


def test_tensors_created_with_each_instances_own_size_batch_together():
    lengths = [7, 30, 2, 7, 12, 3]
    batched = assert_batch_matches(RunningSums().eval(), [(randn(n, 4, seed=k),) for k, n in enumerate(lengths)])
    assert batched.schedule.lanes == len(lengths)


class Attention(nn.Module):
    """Self-attention over one sentence (a softmax along it, a product that sums over it, heads
    split by a reshape after it), read at its first and third tokens."""

    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def heads(self, x):
        return x.view(x.shape[0], 2, 2).transpose(0, 1)

    def forward(self, x):
        n, d = x.shape
        q, k, v = self.heads(self.query(x)), self.heads(self.key(x)), self.heads(self.value(x))
        y = (torch.softmax(q @ k.transpose(1, 2), -1) @ v).transpose(0, 1)
        return y.contiguous().view(n, d), y[0] + y[2]


def test_attention_over_sentences_of_different_lengths_runs_as_one_batch():
    """Padding is masked where a softmax or a product would read it: each instance's result is
    its own sentence's alone."""
    lengths = [7, 30, 3, 12, 5]
    batched = assert_batch_matches(Attention().eval(), [(randn(n, 4, seed=k, scale=3.0),) for k, n in enumerate(lengths)])
    assert batched.schedule.lanes == len(lengths)
    with pytest.raises(cocktailer.BatchInputError, match="instance 1: IndexError") as e:   # y[2] of 2 tokens
        with torch.no_grad():
            batched([(randn(9, 4, seed=0),), (randn(2, 4, seed=1),), (randn(4, 4, seed=2),)])
    assert e.value.positions == [1]


class TokenEncoder(nn.Module):
    """Position-wise layers over a sentence's tokens (packed: no work for padding), attention
    over them (padded and masked), a decision read at the third token that sends some instances
    through two more position-wise layers, and the tokens returned with the third one."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.inp, self.norm = nn.Linear(d, d), nn.LayerNorm(d)
        self.ff, self.ff2, self.head = nn.Linear(d, 2 * d), nn.Linear(2 * d, d), nn.Linear(d, 1)

    def forward(self, x):
        h = self.norm(x + torch.nn.functional.gelu(self.inp(x)))
        h = self.norm(h + torch.softmax(h @ h.transpose(0, 1) / 3, -1) @ h)
        if self.head(h[2]).sum() > 0:
            h = torch.softmax(self.ff2(torch.relu(self.ff(h))).view(h.shape[0], 2, 4), -1).view(h.shape[0], 8)
        return h, h[2]


class InstanceKeys(nn.Module):
    """Attention over a sentence's tokens whose keys go through the instance's own matrix: its
    masked block reads values packed by token (queries, keys, values), a value with one row per
    instance (the matrix) and its mask."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.q, self.k, self.v, self.out = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x, w):
        y = torch.softmax(self.q(x) @ (self.k(x) @ w).transpose(0, 1) / 3, -1) @ self.v(x)
        return self.out(y)


@native
def test_a_masked_block_runs_once_per_instance_at_its_own_size():
    """Sentences of 2 to 41 tokens, each with its own key matrix: the attention block runs as
    one call per sentence on the native lane loop (rows read where they lie packed, the
    matrix at the instance's row), each result eager's, as with buckets and with one padded
    call; the same executor serves a second batch of other lengths."""
    from cocktailer.runtime.native import default_workers
    torch.manual_seed(3)
    model = InstanceKeys().eval()
    lengths = [5, 41, 2, 17, 3, 30, 9, 2, 26, 4] * -(-2 * default_workers() // 10)
    instances = [(randn(n, 8, seed=k), randn(8, 8, seed=100 + k)) for k, n in enumerate(lengths)]
    batched = assert_batch_matches(model, instances)
    assert batched.schedule.lane_calls == len(lengths)
    again = [(randn(n + 3, 8, seed=k), w) for k, (n, (_, w)) in enumerate(zip(lengths[::-1], instances))]
    with torch.no_grad():
        for out, args in zip(batched(again), again):
            assert_same(out, model(*args), rtol=1e-4, atol=1e-5)
    assert batched.schedule.lane_calls == len(lengths)
    for off in (Techniques(lane_calls=False), Techniques(lane_calls=False, buckets=False)):
        assert assert_batch_matches(model, instances, techniques=off).schedule.lane_calls == 0


class InstanceTemperature(nn.Module):
    """Attention whose scores each instance divides by its own temperature (a value of one
    element per instance) and whose values it scales by its own gate (a vector)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(d, d) for _ in range(3))

    def forward(self, x, t, g):
        return torch.softmax(self.q(x) @ self.k(x).transpose(0, 1) / t, -1) @ (self.v(x) * g)


@native
def test_an_instances_scalar_or_vector_broadcast_over_its_matrix_stays_in_the_native_block():
    """An elementwise op that reads an instance's value of a lower rank than its result (its
    temperature beside its scores, its gate beside its values) runs in the native block, the
    instance's value aligned to its own lane, not in the executor op by op; results eager's."""
    torch.manual_seed(5)
    model = InstanceTemperature().eval()
    instances = [(randn(n, 8, seed=k), torch.rand(1) + 0.5, randn(8, seed=50 + k))
                 for k, n in enumerate([5, 17, 3, 30, 9, 2, 12, 7])]
    batched = assert_batch_matches(model, instances)
    (executor,) = batched._executors.values()
    outside = [p.op for parts in executor._segments.values() for p in parts
               if isinstance(p, Operation) and p.op in (Op.DIV, Op.MUL)]
    assert outside == []


@native
def test_block_outputs_reuse_memory_from_call_to_call_and_results_stay_the_callers(monkeypatch):
    """Native blocks' outputs take the workspace's memory the same outputs had the call before
    (no page faults for fresh megabytes); what a call returns is never in it: the results of
    one call are intact after the next, and each call's are eager's."""
    from cocktailer.batching import executor as ex
    monkeypatch.setattr(ex, "OUTPUT_REUSE_BYTES", 0)   # every output, however small
    mlp = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8)).eval()   # its result: a block's output
    for model, shapes in ((TokenEncoder().eval(), ([3, 30, 7, 12, 4], [25, 3, 9, 16, 5])), (mlp, ([1] * 5, [1] * 6))):
        first, second = ([(randn(n, 8, seed=10 * j + k, scale=2.0).squeeze(0) if model is mlp else
                           randn(n, 8, seed=10 * j + k, scale=2.0),) for k, n in enumerate(lengths)]
                         for j, lengths in enumerate(shapes))
        batched = cocktailer.batch(model, first[0])
        with torch.no_grad():
            got_first = batched(first)
            got_second = batched(second)
            again = batched(first)
            for got, instances in ((got_first, first), (got_second, second), (again, first)):
                for k, (out, args) in enumerate(zip(got, instances)):
                    assert_same(out, model(*args), rtol=1e-4, atol=1e-5, path=f"instance {k}")
        executor, = batched._executors.values()
        assert any(key[0] == "output" for key in executor.workspace.buffers)
        assert executor.workspace.nbytes == sum(b.numel() * b.element_size()
                                                for b in executor.workspace.buffers.values())


@native
def test_position_wise_ops_compute_on_each_instances_own_tokens_only():
    """Sentences of 2 to 30 tokens: the position-wise blocks compute on the real tokens, packed
    one sentence after another; the results are each sentence's alone, through the attention
    between them, the branch that splits them and the tokens returned."""
    from cocktailer.batching.blocks import Block
    lengths = [7, 30, 3, 12, 5, 9, 3, 16]
    torch.manual_seed(4)   # (weights whatever ran before: the decision splits the sentences, each 0.16 or more from 0)
    model = TokenEncoder().eval()
    instances = [(randn(n, 8, seed=k, scale=2.0),) for k, n in enumerate(lengths)]
    batched = assert_batch_matches(model, instances)
    (executor,) = batched._executors.values()
    blocks = [p for parts in executor._segments.values() for p in parts if isinstance(p, Block)]
    packed = [b for b in blocks if b.packed is not None]
    assert len(packed) >= 2 and all(b.compiled is not None for b in blocks)
    # the attention's softmax and the product over the tokens mask the padding inside one block
    (attention,) = [b for b in blocks if b.masks]
    assert {"SOFTMAX", "MATMUL"} <= {op.op.name for op in attention.ops} and len(attention.masks) == 2
    schedule = batched.schedule
    assert schedule.branches == 1, "the third token's decision splits the sentences"
    assert 0 < schedule.packed_rows < schedule.padded_rows
    assert "position-wise" in cocktailer.explain(batched, file=None)
    # the same length for all: packed is padded, and a token past every sentence is named
    assert_batch_matches(model, [(randn(4, 8, seed=k),) for k in range(3)])
    with pytest.raises(cocktailer.BatchInputError, match="IndexError") as e:
        with torch.no_grad():
            batched([(randn(2, 8, seed=k),) for k in range(3)])
    assert e.value.positions == [0, 1, 2]
    # a one-token sentence is captured for itself: its index is out of range at capture, named too
    with pytest.raises(cocktailer.BatchInputError, match="instance 1: IndexError") as e:
        with torch.no_grad():
            batched([(randn(n, 8, seed=n),) for n in (4, 1, 6)])
    assert e.value.positions == [1]


class ProjectedRAE(nn.Module):
    """Every node's vector projected first (position-wise over the node table, so packed), then
    a recursion over the tree reads the projected table."""

    def __init__(self, h: int = 8):
        super().__init__()
        self.proj, self.enc = nn.Linear(h, h), nn.Linear(2 * h, h)

    def forward(self, left, right, is_leaf, inp, root):
        return self.encode(left, right, is_leaf, torch.tanh(self.proj(inp)) * 2, root)

    def encode(self, left, right, is_leaf, table, root):
        if is_leaf[root]:
            return table[root]
        a = self.encode(left, right, is_leaf, table, left[root])
        b = self.encode(left, right, is_leaf, table, right[root])
        return torch.tanh(self.enc(torch.cat([a, b], -1)))


@native
def test_a_packed_table_feeds_a_recursion_run_by_levels():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    table = torch.randn(30, 8, generator=g)
    instances = [tree_inputs(t, [int(i) for i in torch.randint(30, (t.num_leaves,), generator=g)], table, t.num_nodes)
                 for t in (random_tree(n, n) for n in (3, 9, 1, 14, 5, 21))]   # each tree its own node count
    batched = assert_batch_matches(ProjectedRAE().eval(), instances)
    assert 0 < batched.schedule.packed_rows < batched.schedule.padded_rows
    assert batched.schedule.levels, "the recursion ran level by level"


class LastAndMean(nn.Module):
    """Reads each sequence's own last element (a negative index into a padded dim) and
    averages over the sequence (a sum over it: padding must not join it)."""

    def forward(self, xs):
        return xs[-1] * 2, xs.mean(0)


@native
def test_per_node_tables_of_different_node_counts_are_read_where_they_were_given():
    """MV-RNN's inputs hold a matrix per node: level programs read each instance's rows from
    all of them one after another, never from a copy padded to the largest tree."""
    from cocktailer.models.throughput import mvrnn_instances
    model, instances = mvrnn_instances(8, "small", seed=3)
    instances = [a for a in instances if a[4].shape[0] > 1]   # (a lone leaf is compiled apart)
    assert len({a[4].shape[0] for a in instances}) > 2
    batched = assert_batch_matches(model, instances)
    executor, = batched._executors.values()
    vec, mat = 3, 4   # the per-node vectors and matrices
    assert {("rows", vec), ("rows", mat)} <= set(executor.workspace.buffers)
    assert not {("input", vec), ("input", mat)} & set(executor.workspace.buffers), "a per-node table was padded"
    assert batched.schedule.levels


def test_negative_indices_and_reductions_over_differing_lengths():
    instances = [(randn(n, 3, seed=k),) for k, n in enumerate([4, 9, 2, 9, 5])]
    batched = assert_batch_matches(LastAndMean(), instances)
    assert batched.schedule.lanes == 2, "a mean over the length keeps instances of one length together"


def test_trees_of_different_node_counts_run_as_one_batch():
    w = models.make("treelstm", batch=1, size="small", seed=0)
    trees = [random_tree(n, n) for n in (2, 17, 5, 9, 30, 3)]
    g = torch.Generator().manual_seed(0)
    table = torch.randn(50, 8, generator=g)
    instances = [tree_inputs(t, [int(i) for i in torch.randint(50, (t.num_leaves,), generator=g)], table, t.num_nodes)
                 for t in trees]   # unpadded: every tree its own node count
    batched = assert_batch_matches(w.model.eval(), instances)
    assert batched.schedule.lanes == len(trees)
    left, right, is_leaf, inp, root = instances[2]
    instances[2] = (left, right, is_leaf, inp, torch.tensor(int(trees[2].num_nodes)))   # one past its own end
    with pytest.raises(cocktailer.BatchInputError, match="instance 2: IndexError") as e:
        batched(instances)
    assert e.value.positions == [2]


class WritesInput(nn.Module):
    def forward(self, x, y):
        x.mul_(2)
        if y.sum() > 0:
            x += y
        return x


def test_writes_into_each_instances_inputs_and_returns_it():
    model = WritesInput()
    instances = [(randn(3, seed=k), randn(3, seed=10 + k)) for k in range(5)]
    batched = assert_batch_matches(model, instances)
    mine = [_clone(a) for a in instances]
    with torch.no_grad():
        outs = batched(mine)
    assert all(out is a[0] for out, a in zip(outs, mine)), "`return x` returns the instance's own tensor"


class WritesThroughReshape(nn.Module):
    """`reshape` is a view of a contiguous tensor and a copy of a transposed one: the write
    reaches the argument or not, by each instance's own layout."""

    def forward(self, x):
        y = x.reshape(-1)
        y.mul_(2)
        return x + 0, y


def test_instances_of_one_shape_and_different_layouts_each_get_their_own_program():
    square = [randn(3, 3, seed=k) for k in range(6)]
    instances = [(m if k % 2 else m.t(),) for k, m in enumerate(square)]   # contiguous, transposed, ...
    assert_batch_matches(WritesThroughReshape(), instances)


def _shared_table_modulo_each_instances_own(x, k, n):
    for _ in range(n):
        x = torch.sigmoid(x + (torch.arange(12).reshape(4, 3) % k))
    return x


def test_a_block_whose_kernel_needs_the_lane_count_as_a_number_runs_op_by_op():
    """A shared table against each instance's own number (broadcast over lanes) has no native
    kernel for a lane count known only at call time: that block runs with torch, the rest
    natively (seed 7241088 of the fuzzer ended its worker process here)."""
    instances = [(randn(4, 3, seed=k), torch.tensor(k % 3 + 1), torch.tensor(k % 4 + 1)) for k in range(5)]
    assert_batch_matches(_shared_table_modulo_each_instances_own, instances)


def test_results_are_ordinary_tensors_the_caller_may_write_into():
    model = CountedLoop().eval()
    instances = [(randn(6, seed=k), torch.tensor(k)) for k in range(4)]
    with torch.no_grad():
        outs = cocktailer.batch(model, instances[0])(_clone(instances))
        expected = [model(*a) + 1 for a in _clone(instances)]
    for out, want in zip(outs, expected):
        assert not out.is_inference()
        out += 1   # as on eager's result
        assert_same(out, want)


class SameForAll(nn.Module):
    """A result that is the same for every instance (computed from no input)."""

    def forward(self, x):
        return x * 2, torch.zeros(3) + 1


def test_a_result_the_same_for_every_instance_is_each_instances_own():
    instances = [(randn(3, seed=k),) for k in range(3)]
    with torch.no_grad():
        outs = cocktailer.batch(SameForAll(), instances[0])(instances)
    shared = [out[1] for out in outs]
    shared[0] += 1   # an instance's caller writes into its result
    assert not torch.equal(shared[0], shared[1]) and torch.equal(shared[1], shared[2])


@pytest.mark.parametrize("name", ["counted", "treelstm"])
def test_weights_changed_in_place_after_batching_are_used(name):
    """`load_state_dict`, an optimizer step: the transposed weights folded at capture are
    computed again before the next batch, as compile's are before its next call."""
    if name == "counted":
        model, instances = CountedLoop().eval(), [(randn(6, seed=k), torch.tensor(k % 4)) for k in range(6)]
        weight = model.cell.weight
    else:
        w = models.make(name, batch=1, size="small", seed=0)
        model = w.model.eval()
        instances = [w.inputs] + [models.make(name, batch=1, size="small", seed=s).inputs for s in range(1, 4)]
        weight = next(p for p in model.parameters() if p.dim() == 2)
    batched = assert_batch_matches(model, instances)
    with torch.no_grad():
        weight.mul_(-0.5)
        try:
            outs, expected = batched(_clone(instances)), [model(*a) for a in _clone(instances)]
        finally:
            weight.div_(-0.5)
    for k, (out, want) in enumerate(zip(outs, expected)):
        assert_same(out, want, rtol=1e-4, atol=1e-5, path=f"instance {k}")


@pytest.mark.parametrize("replace", ["parameter", "data"])
def test_a_weight_replaced_between_batches_is_used_though_the_layouts_were_seen(replace, monkeypatch):
    """Layouts seen in an earlier batch skip preparing their program while its guard holds;
    a parameter replaced (`layer.weight = nn.Parameter(...)`) or given new memory
    (`w.data = ...`) fails the guard and the next batch compiles for the new weights."""
    model = CountedLoop().eval()
    instances = [(randn(6, seed=k), torch.tensor(k % 4)) for k in range(6)]
    batched = assert_batch_matches(model, instances)
    prepares = []
    prepare = batched.single._prepare
    monkeypatch.setattr(batched.single, "_prepare", lambda *a: prepares.append(1) or prepare(*a))
    with torch.no_grad():
        batched(_clone(instances))
        assert not prepares   # every layout was seen and its program's weights are the model's
        new = model.cell.weight.detach() * -0.5
        if replace == "parameter":
            model.cell.weight = nn.Parameter(new)
        else:
            model.cell.weight.data = new
        outs, expected = batched(_clone(instances)), [model(*a) for a in _clone(instances)]
    assert prepares
    for k, (out, want) in enumerate(zip(outs, expected)):
        assert_same(out, want, rtol=1e-4, atol=1e-5, path=f"instance {k}")


def test_grad_mode_runs_eagerly_with_a_warning():
    model = CountedLoop()
    instances = [(randn(6, seed=k), torch.tensor(2)) for k in range(3)]
    batched = cocktailer.batch(model, instances[0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = batched(instances)
    assert any(issubclass(w.category, cocktailer.GradFallbackWarning) for w in caught)
    assert outs[0].requires_grad


# --------------------------------------------------------------------------- bad instances


def test_an_instance_of_another_rank_or_dtype_is_named():
    model = CountedLoop().eval()
    good = (randn(6, seed=0), torch.tensor(2))
    batched = cocktailer.batch(model, good)
    with pytest.raises(cocktailer.BatchInputError, match="instance 2: argument leaf 0 is a rank-2") as e:
        batched([good, good, (randn(2, 6, seed=1), torch.tensor(2))])
    assert e.value.positions == [2]
    with pytest.raises(cocktailer.BatchInputError, match="instance 1: .*torch.int32"):
        batched([good, (randn(6, seed=1), torch.tensor(2, dtype=torch.int32))])


def test_a_tree_index_out_of_range_is_named_and_nothing_is_returned():
    w = models.make("treefc", batch=1, size="small", seed=0)
    instances = _tree_instances(8, [perfect_tree(2)] * 4)
    left, right, is_leaf, inp, root = instances[3]
    instances[3] = (left, right, is_leaf, inp, torch.tensor(1000))
    batched = cocktailer.batch(w.model.eval(), instances[0])
    with pytest.raises(cocktailer.BatchInputError, match="instance 3: IndexError") as e:
        batched(instances)
    assert e.value.positions == [3]


@pytest.mark.parametrize("off", ["levels", "gather_fusion", "parameter_reuse", "native_blocks", "native_inspector",
                                 "level_programs", "level_loop", "loop_programs", "block_masks", "packed_rows",
                                 "buckets", "lane_calls"])
def test_each_technique_turned_off_gives_the_same_answers(off):
    """The ablation's configurations compute what the default does (only slower)."""
    techniques = Techniques(**{off: False})
    w = models.make("treelstm", batch=1, size="small", seed=0)
    trees = [chain_tree(9), random_tree(1, 0), random_tree(6, 1), random_tree(13, 2)]
    batched = assert_batch_matches(w.model.eval(), _tree_instances(8, trees), techniques=techniques)
    assert bool(batched.schedule.levels) == (off != "levels")
    assert_batch_matches(EarlyExit().eval(), [(randn(8, seed=k, scale=3.0), torch.tensor(t))
                                              for k, t in enumerate([0.0, 0.5, 0.7, 0.99])], techniques=techniques)
    batched = assert_batch_matches(CountedLoop().eval(), [(randn(6, seed=k), torch.tensor(n))
                                                          for k, n in enumerate([3, 0, 12])], techniques=techniques)
    assert bool(batched.schedule.loop_programs) == (off != "loop_programs")
    assert_batch_matches(SequenceRNN().eval(), [(randn(n, 3, seed=k),) for k, n in enumerate([4, 9, 2])],
                         techniques=techniques)
    torch.manual_seed(4)
    batched = assert_batch_matches(TokenEncoder().eval(), [(randn(n, 8, seed=k, scale=2.0),)
                                                           for k, n in enumerate([7, 30, 3, 12])], techniques=techniques)
    assert bool(batched.schedule.packed_rows) == (off not in ("packed_rows", "native_blocks"))
    (executor,) = batched._executors.values()
    masked = [p for parts in executor._segments.values() for p in parts if getattr(p, "masks", None)]
    assert bool(masked) == (off not in ("block_masks", "native_blocks"))


def _call_tree(batched, instances, native: bool, **techniques):
    """The call tree the batched run of `instances` found, by the native inspector (a tree walk,
    or round programs: in the native round loop unless `level_loop=False`) or the torch
    inspector."""
    from cocktailer.batching import executor as module
    (executor,) = batched._executors.values()
    executor._inspectors.clear()
    executor._rounds.clear()
    executor.techniques = Techniques(native_inspector=native, **techniques)
    found = []
    native_call, torch_inspect = module.NativeInspector.__call__, module.inspect
    rounds, round_loop = module.run_rounds, module.run_round_loop
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(module.NativeInspector, "__call__", lambda *a: found.append(native_call(*a)) or found[-1])
        patch.setattr(module, "inspect", lambda *a: found.append(torch_inspect(*a)) or found[-1])
        patch.setattr(module, "run_rounds", lambda *a: found.append(rounds(*a)) or found[-1])
        patch.setattr(module, "run_round_loop", lambda *a: found.append(round_loop(*a)) or found[-1])
        batched(instances)
    (tree,) = found
    return tree


def _calls(tree) -> list[tuple]:
    """Every call as (instance, height, its arguments, its children's heights): what does not
    depend on the order the inspector numbered the calls in."""
    heights = tree.height.tolist()
    kids = {s: c.tolist() for s, c in tree.children.items()}
    return sorted((int(tree.root[c]), heights[c], tuple(int(a[c]) for a in tree.arguments.values()),
                   tuple(heights[kids[s][c]] if kids[s][c] >= 0 else -1 for s in sorted(kids)))
                  for c in range(tree.calls))


@pytest.mark.parametrize("name", ["rae", "treelstm", "treefc"])
def test_the_native_inspector_finds_the_torch_inspectors_call_tree(name):
    w = models.make(name, batch=1, size="small", seed=0)
    trees = [chain_tree(12), random_tree(1, 0), perfect_tree(3)] + [random_tree(n, n) for n in (2, 7, 19, 30)]
    instances = _tree_instances(8, trees)
    batched = assert_batch_matches(w.model.eval(), instances)
    assert batched.schedule.inspectors == {next(iter(batched.schedule.levels)): "native"}
    native, torch_ops = _call_tree(batched, instances, True), _call_tree(batched, instances, False)
    assert native.calls == torch_ops.calls == sum(2 * t.num_leaves - 1 for t in trees)
    assert _calls(native) == _calls(torch_ops)
    assert torch.equal(torch.bincount(native.height), torch.bincount(torch_ops.height))   # calls per level


class Fibonacci(nn.Module):
    """A call tree of Fibonacci's shape, decided by an integer argument that changes per call."""

    def forward(self, x, n):
        if n < 2:
            return x * (n + 1)
        return torch.tanh(self.forward(x, n - 1) + 0.5 * self.forward(x, n - 2))


def test_the_native_inspector_passes_changing_integer_arguments_to_each_call():
    instances = [(randn(4, seed=k), torch.tensor(n)) for k, n in enumerate([9, 0, 1, 5, 12, 2])]
    batched = assert_batch_matches(Fibonacci().eval(), instances)
    assert batched.schedule.inspectors == {"forward": "native"}
    # the leaves read x whole (their instance's row of the stacked x), n per call
    native_groups, op_by_op = batched.schedule.level_groups["forward"]
    assert native_groups > 0 and op_by_op == 0
    native, torch_ops = _call_tree(batched, instances, True), _call_tree(batched, instances, False)
    assert _calls(native) == _calls(torch_ops)


def test_a_tree_with_a_cycle_is_named_instead_of_running_forever():
    """A node that is its own child: the native inspector stops at the recursion bound, and the
    instance is named (eager Python would raise RecursionError)."""
    w = models.make("treefc", batch=1, size="small", seed=0)
    instances = _tree_instances(8, [perfect_tree(2)] * 3)
    left, right, is_leaf, inp, root = instances[1]
    left = left.clone()
    left[int(root)] = int(root)
    instances[1] = (left, right, is_leaf, inp, root)
    batched = cocktailer.batch(w.model.eval(), instances[0])
    with pytest.raises(cocktailer.BatchInputError, match="instance 1: .*recursed deeper") as e:
        batched(instances)
    assert e.value.positions == [1]


@pytest.mark.parametrize("name", ["rae", "treelstm", "treefc"])
def test_each_level_of_a_tree_recursion_is_one_native_call(name):
    """Leaves and internal nodes take different arms: two level programs, one call per level,
    all made by one call of the native level loop."""
    w = models.make(name, batch=1, size="small", seed=0)
    trees = [chain_tree(12), random_tree(1, 0), perfect_tree(3)] + [random_tree(n, n) for n in (2, 7, 19, 30)]
    batched = assert_batch_matches(w.model.eval(), _tree_instances(8, trees))
    ((fn, per_level),) = batched.schedule.levels.items()
    assert batched.schedule.level_groups[fn] == [len(per_level[0]), 0]
    assert batched.schedule.level_loops == {fn: 1}
    (executor,) = batched._executors.values()
    assert sorted(type(v).__name__ for v in executor._levels.values()) == ["LevelProgram"] * 2


def test_each_calls_matrix_times_its_own_vector_runs_in_level_programs():
    """MV-RNN: every node's matrix times its sibling's vector, and a shared matrix times every
    node's stacked matrices: batched products over the calls, inside the level programs."""
    from cocktailer.models.throughput import INSTANCES
    model, instances = INSTANCES["mvrnn"](6, size="small")
    batched = assert_batch_matches(model.eval(), instances)
    native, op_by_op = batched.schedule.level_groups["forward"]
    assert native > 0 and op_by_op == 0


class OffsetLeaves(nn.Module):
    """Leaves read the vector of another node: `shift` past their own, counted from the end
    when negative; read outside the control slice, so the level programs check it."""

    def __init__(self, shift: int):
        super().__init__()
        self.shift = shift

    def forward(self, left, right, is_leaf, inp, root):
        if is_leaf[root]:
            return inp[root + self.shift] * 2
        return torch.tanh(self.forward(left, right, is_leaf, inp, left[root])
                          + self.forward(left, right, is_leaf, inp, right[root]))


def _tree(left: list[int], right: list[int], root: int, seed: int) -> tuple:
    """A tree's tables at its own node count (no padding), a random vector per node."""
    g = torch.Generator().manual_seed(seed)
    left, right = torch.tensor(left), torch.tensor(right)
    return left, right, left < 0, torch.randn(len(left), 8, generator=g), torch.tensor(root)


TWO_LEAVES = ([1, -1, -1], [2, -1, -1], 0)                  # its last node is a leaf
THREE_LEAVES = ([-1, -1, -1, 0, 3], [-1, -1, -1, 1, 2], 4)   # its last node is the root
ONE_LEAF = ([-1], [-1], 0)


def test_level_programs_count_negative_indices_from_each_instances_own_end():
    """inp[node - 2] of node 0 is the tree's own second to last row, not the padded table's
    (which repeats the last row: a wrong count would read it)."""
    instances = [_tree(*THREE_LEAVES, 0), _tree(*TWO_LEAVES, 1), _tree(*THREE_LEAVES, 2)]
    batched = assert_batch_matches(OffsetLeaves(-2).eval(), instances)
    assert batched.schedule.level_groups["forward"][1] == 0


def test_level_programs_name_the_instances_that_index_past_their_own_rows():
    """inp[node + 1] of a tree's last node is outside it, inside the padded table."""
    instances = [_tree(*THREE_LEAVES, 0), _tree(*TWO_LEAVES, 1), _tree(*THREE_LEAVES, 2), _tree(*TWO_LEAVES, 3)]
    batched = assert_batch_matches(OffsetLeaves(1).eval(), [instances[0], instances[2]])
    with pytest.raises(cocktailer.BatchInputError, match="instance 1: IndexError") as e:
        with torch.no_grad():
            batched(instances)
    assert e.value.positions == [1, 3]


def test_instances_that_fail_while_captured_are_all_named():
    """A one-node tree has sizes of its own (1 is never symbolic): it is captured, and the model
    fails on it while it runs there, before any batch runs."""
    instances = [_tree(*THREE_LEAVES, 0), _tree(*ONE_LEAF, 1), _tree(*THREE_LEAVES, 2), _tree(*ONE_LEAF, 3)]
    batched = assert_batch_matches(OffsetLeaves(1).eval(), [instances[0], instances[2]])
    with pytest.raises(cocktailer.BatchInputError, match="instance 1: IndexError") as e:
        with torch.no_grad():
            batched(instances)
    assert e.value.positions == [1, 3]


def _lanes_of(*shape, dtype=torch.float32, high=None, seed=0):
    from cocktailer.batching.lanes import Lanes
    g = torch.Generator().manual_seed(seed)
    if high is not None:
        return Lanes(torch.randint(-high, high, shape, generator=g, dtype=dtype))
    return Lanes(torch.randn(*shape, generator=g).to(dtype))


_K = 5   # lanes
_UPDATES = [   # (x, v, dynamic indices, key)
    (_lanes_of(_K, 1, 50, dtype=torch.int64, high=9), _lanes_of(_K, 1, dtype=torch.int64, high=9),
     [_lanes_of(_K, dtype=torch.int64, high=50)], (("slice", None, None, None), ("dyn",))),   # a decoder's token
    (torch.randn(6, 4), _lanes_of(_K, 4), [_lanes_of(_K, dtype=torch.int64, high=6, seed=1)], (("dyn",),)),
    (_lanes_of(_K, 3, 4), torch.randn(3), [], (("int", 1), ("slice", 0, 3, None))),
    (_lanes_of(_K, 4), _lanes_of(_K, 2, seed=2), [], (("new",), ("slice", 1, 3, None))),
    (_lanes_of(_K, 3, 4, 2), _lanes_of(_K, 4, seed=3), [_lanes_of(_K, dtype=torch.int64, high=3, seed=4),
                                                       torch.tensor(-1)],
     (("dyn",), ("slice", None, None, None), ("dyn",))),
    (_lanes_of(_K, 4), _lanes_of(_K, 1, 4, seed=5), [], (("slice", None, None, None),)),
    (_lanes_of(_K, 3, 4), _lanes_of(_K, seed=6), [_lanes_of(_K, dtype=torch.int64, high=3, seed=7)],
     (("dyn",), ("int", 2))),
]
_GATHERS = [   # (table, index, dim)
    (torch.randn(10, 3), _lanes_of(_K, dtype=torch.int64, high=10), 0),   # an embedding lookup
    (torch.randn(10, 3), _lanes_of(_K, 2, dtype=torch.int64, high=10, seed=1), 0),
    (torch.randn(3, 10), _lanes_of(_K, dtype=torch.int64, high=10, seed=2), 1),
    (_lanes_of(_K, 10, 3), torch.tensor(-2), 0),
    (_lanes_of(_K, 3, 10), torch.tensor([4, -1, 0]), 1),
]


_CONVS = [   # (images, filters, bias, attrs)
    (_lanes_of(_K, 2, 3, 9, 7), torch.randn(4, 3, 3, 3), torch.randn(4), dict(stride=(1, 1), padding=(1, 1))),
    (_lanes_of(_K, 4, 8, 8), torch.randn(6, 2, 3, 3), None, dict(stride=(2, 2), padding=(0, 1), groups=2)),
]


@pytest.mark.parametrize("case", range(len(_UPDATES) + len(_GATHERS) + len(_CONVS)))
def test_update_gather_and_conv_rules_compute_what_each_lane_computes(case):
    """The batching rules of UPDATE (a write at each lane's own index), GATHER (a shared table
    read at each lane's indices) and CONV2D (every lane's images through shared filters)
    against torch.vmap of the op's meaning, per lane."""
    from cocktailer.batching.lanes import RULES, Lanes, _vmapped, rows
    from cocktailer.ir import Op
    if case < len(_UPDATES):
        x, v, dynamic, key = _UPDATES[case]
        op, operands, attrs = Op.UPDATE, [x, v, *dynamic], {"key": key}
        expected = _vmapped(op, [Lanes(rows(x, _K)), v, *dynamic], attrs, _K)
    elif case < len(_UPDATES) + len(_GATHERS):
        table, index, dim = _GATHERS[case - len(_UPDATES)]
        op, operands, attrs = Op.GATHER, [table, index], {"dim": dim}
        expected = _vmapped(op, operands, attrs, _K)
    else:
        images, filters, bias, attrs = _CONVS[case - len(_UPDATES) - len(_GATHERS)]
        op, operands = Op.CONV2D, [images, filters] + ([bias] if bias is not None else [])
        attrs = {"dilation": (1, 1), "groups": 1, **attrs}
        expected = _vmapped(op, operands, attrs, _K)
    torch.testing.assert_close(RULES[op](op, operands, attrs, _K), expected, rtol=1e-5, atol=1e-5)


def test_a_decoders_token_lookup_and_write_have_batching_rules():
    """seq2seq looks up each instance's last token in the embedding and writes it at the
    instance's own step: both by the rules above, none through torch.vmap."""
    w = models.make("seq2seq", batch=1, size="small", seed=0)
    instances = [w.inputs] + [models.make("seq2seq", batch=1, size="small", seed=s).inputs for s in range(1, 4)]
    batched = assert_batch_matches(w.model.eval(), instances)
    assert "(run through torch.vmap): none" in cocktailer.explain(batched)


def test_convolutions_over_each_instances_images_have_a_batching_rule():
    """BlockDrop's convolutions, where instances skip different blocks: each group's images
    through the shared filters in one convolution, none through torch.vmap."""
    w = models.make("blockdrop", batch=1, size="small", seed=0)
    instances = [w.inputs] + [models.make("blockdrop", batch=1, size="small", seed=s).inputs for s in range(1, 4)]
    batched = assert_batch_matches(w.model.eval(), instances)
    assert "(run through torch.vmap): none" in cocktailer.explain(batched)


def test_runs_of_data_ops_are_native_blocks():
    """The TreeLSTM's leaf and node cells are one native call each per level, over all lanes."""
    from cocktailer.batching.blocks import Block
    w = models.make("treelstm", batch=1, size="small", seed=0)
    batched = assert_batch_matches(w.model.eval(), _tree_instances(8, [random_tree(n, n) for n in (3, 9, 1, 14)]))
    (executor,) = batched._executors.values()
    blocks = [p for parts in executor._segments.values() for p in parts if isinstance(p, Block)]
    assert len(blocks) >= 2 and max(len(b.ops) for b in blocks) >= 15, [len(b.ops) for b in blocks]
    assert all(b.compiled is not None for b in blocks) and not executor.block_notes
    assert "native blocks: " in cocktailer.explain(batched, file=None)


class RowCell(nn.Module):
    """A GRU-like cell over one instance's vector made a (1, K) row, as `nn.Linear` is often fed."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = torch.sigmoid(self.a(x.view(1, 8)))
        return torch.tanh(self.b(h) * 2).view(4)


def test_each_instances_row_times_a_weight_is_one_gemm_in_a_native_block():
    """(1, K) rows of every instance times a shared weight: the lanes fold into the GEMM's rows."""
    from cocktailer.batching.blocks import Block
    batched = assert_batch_matches(RowCell().eval(), [(randn(8, seed=k),) for k in range(5)])
    (executor,) = batched._executors.values()
    blocks = [p for parts in executor._segments.values() for p in parts if isinstance(p, Block)]
    assert sum(op.op.name == "MATMUL" for b in blocks for op in b.ops) == 2
    assert all(b.compiled is not None for b in blocks) and not executor.block_notes


class ConstantThenIndex(nn.Module):
    """Indices that vary by instance after constant ones (which drop their dims first)."""

    def forward(self, x, k):
        a = x[-1, k[2] % 3]
        b = x[1:, 0, k[0]]
        c = x[None, 1, k[1] % 3]
        return a * 2, b, c


def test_per_instance_indices_after_constant_ones():
    instances = [(randn(4, 3, 5, seed=j), torch.tensor([j % 5, (j + 2) % 3, j])) for j in range(5)]
    assert_batch_matches(ConstantThenIndex(), instances)


def _gather_twice_program():
    """main(kids: i64[lanes], table: f32[calls, 4]) -> table[kids] * 2: a level program's shape."""
    from cocktailer.batching.blocks import LANES
    from cocktailer.batching.levels import CALLS_SYM
    from cocktailer.ir import Function, Op, Operation, Program, Region, TensorType, Value
    from cocktailer.ir.analysis import sizes_of
    kids, table = Value(TensorType((LANES,), torch.int64)), Value(TensorType((CALLS_SYM, 4), torch.float32))
    rows_, two, out = (Value(TensorType((LANES, 4), torch.float32)), Value(TensorType((), torch.float32)),
                       Value(TensorType((LANES, 4), torch.float32)))
    ops = [Operation(Op.GATHER, [table, kids], [rows_], {"dim": 0}),
           Operation(Op.SCALAR, [], [two], {"value": 2.0, "dtype": torch.float32}),
           Operation(Op.MUL, [rows_, two], [out], {})]
    main = Function("main", Region([kids, table], ops, [out]))
    return Program({"main": main}, "main", {}, torch.device("cpu"), sizes=sizes_of([kids, table]))


@native
def test_the_native_level_loop_runs_each_group_at_its_own_rows_and_lane_count():
    """Groups of 3, 1 and 4 calls through one bound program: each reads its own rows of the
    per-call inputs and writes its own rows of the results; a failing group stops the loop
    with its program's error, after the groups before it ran."""
    from cocktailer.backend.batched import LevelRun, build_blocks
    (compiled,), _ = build_blocks([_gather_twice_program()])
    table = torch.randn(6, 4)
    kids = torch.tensor([5, 0, 3, 3, 1, 2, 4, 0])
    results = torch.full((8, 4), float("nan"))
    loop = LevelRun()
    index = loop.add(compiled, [kids, table], [True, False], widest=4, outputs=[results], flag=False)
    assert loop.run([(0, 3, index), (3, 4, index), (4, 8, index)]) is None
    torch.testing.assert_close(results, table[kids] * 2)
    kids[5], results[:] = 7, float("nan")   # row 7 of a 6-row table, in the last group
    with pytest.raises(cocktailer.CompiledCallError, match="index out of range"):
        loop.run([(0, 3, index), (3, 4, index), (4, 8, index)])
    torch.testing.assert_close(results[:4], table[kids[:4]] * 2)
    assert results[4:].isnan().all()


class Lookahead(nn.Module):
    """Steps of its own count, each reading row t + 1 of its own sequence (past its end at the
    last step where the count is the sequence's length)."""

    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(3, 3)

    def forward(self, xs, steps):
        h = xs.new_zeros(3)
        for t in range(steps):
            h = torch.tanh(self.cell(xs[t + 1]) + h)
        return h


@native
def test_counted_loops_run_every_step_in_one_native_call():
    """A bidirectional RNN over sentences of 1 to 60 words (x[t] forward, x[-1 - t] backward,
    each from the sentence's own end), and a loop of each instance's own count (0 among them):
    each loop is one loop program, and every lane's result is its own."""
    model = BiRNN(hidden=5).eval()
    lengths = [7, 60, 2, 33, 60, 15, 3]
    batched = assert_batch_matches(model, [(randn(n, 5, seed=k),) for k, n in enumerate(lengths)])
    assert batched.schedule.loop_programs == 2 and not batched.schedule.stepped_loops
    assert batched.schedule.loop_steps == 2 * 60
    assert "every step in one native call (loop programs: " in cocktailer.explain(batched, file=None)
    steps = [1, 60, 7, 0, 33, 60, 2, 15]
    batched = assert_batch_matches(CountedLoop().eval(), [(randn(6, seed=k), torch.tensor(n))
                                                          for k, n in enumerate(steps)])
    assert batched.schedule.loop_programs == 1 and batched.schedule.loop_steps == 60


@native
def test_loop_programs_name_the_instances_that_index_past_their_own_rows():
    model = Lookahead().eval()
    instances = [(randn(n, 3, seed=k), torch.tensor(steps)) for k, (n, steps) in
                 enumerate([(9, 8), (4, 4), (12, 3), (6, 6)])]
    batched = assert_batch_matches(model, [instances[0], instances[2]])
    assert batched.schedule.loop_programs == 1
    with pytest.raises(cocktailer.BatchInputError, match="instance 1: IndexError") as e:
        with torch.no_grad():
            batched(instances)
    assert e.value.positions == [1, 3]


class Toggle(nn.Module):
    """At each of its own `steps`, one of two cells, as the instance's own flag for the step
    says (a branch decided by an input: instances take different arms at the same step)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, xs, flags, steps):
        h = xs.new_zeros(4)
        for t in range(steps):
            if flags[t] > 0:
                h = torch.tanh(self.a(h) + xs[t])
            else:
                h = torch.sigmoid(self.b(h)) - xs[-1 - t]
        return h


def _loop_programs(batched) -> list:
    """The loop programs of every executor of `batched` (instances of size 1 have their own)."""
    from cocktailer.batching.loops import LoopProgram
    return [loop for executor in batched._executors.values() for loop in executor._loops.values()
            if isinstance(loop, LoopProgram)]


def _toggles(specs) -> list[tuple]:
    """(rows, flags, steps) per instance from (rows, steps) pairs: random flags of its own."""
    g = torch.Generator().manual_seed(5)
    return [(randn(n, 4, seed=k), torch.randint(2, (n,), generator=g), torch.tensor(steps))
            for k, (n, steps) in enumerate(specs)]


@native
def test_a_loop_whose_branch_its_inputs_decide_runs_each_arm_on_its_own_lanes_in_one_native_call():
    instances = _toggles([(9, 9), (40, 40), (1, 1), (40, 17), (6, 0), (25, 25)])
    batched = assert_batch_matches(Toggle().eval(), instances)
    assert batched.schedule.loop_programs == 1 and not batched.schedule.stepped_loops
    assert batched.schedule.branches == 0, "no branch split in Python: each step's arms are groups of the native loop"
    loops = _loop_programs(batched)
    assert loops and all(sorted(loop.paths) == [0, 1] and loop.decide is not None for loop in loops)


@native
def test_a_branch_the_loop_decides_from_a_carried_value_keeps_it_stepping():
    """`if h.sum() > 0` is known only step by step: the loop runs from Python, and says why."""
    class SignFlip(nn.Module):
        def forward(self, xs):
            h = xs.new_zeros(3)
            for t in range(xs.shape[0]):
                h = h + xs[t] if h.sum() <= 0 else h - xs[t]
            return h
    batched = assert_batch_matches(SignFlip().eval(), [(randn(n, 3, seed=n),) for n in (5, 12, 1)])
    assert batched.schedule.loop_programs == 0
    assert "decided by a value the loop carries" in " ".join(batched.schedule.stepped_loops.values())


@native
def test_loop_programs_name_the_instances_whose_branch_reads_past_their_own_rows():
    instances = _toggles([(9, 9), (4, 5), (12, 3), (6, 7)])
    batched = assert_batch_matches(Toggle().eval(), [instances[0], instances[2]])
    with pytest.raises(cocktailer.BatchInputError, match="instance 1: IndexError") as e:
        with torch.no_grad():
            batched(instances)
    assert e.value.positions == [1, 3]


class Scratchpad(nn.Module):
    """A buffer of the sequence's own length written one row per step (as a KV cache or
    SPINN's stack is): the row before read first (at t = 0 the last row: still zeros), the
    row written from it, then read back after the write."""

    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(4, 4)

    def forward(self, xs):
        buf = torch.zeros_like(xs)
        h = xs.new_zeros(4)
        for t in range(xs.shape[0]):
            before = buf[t - 1]
            buf[t] = torch.tanh(self.cell(xs[t]) + before)
            h = h * 0.5 + buf[t]
        return buf, h


class Overtaking(Scratchpad):
    """Reads row 0 (a copy, not a view, which would see the write), then writes row 0 with a
    value that does not depend on what it read."""

    def forward(self, xs):
        buf = self.cell(xs)
        h = xs.new_zeros(4)
        for t in range(xs.shape[0]):
            old = buf[0].clone()
            buf[0] = xs[t] * 2
            h = h + old
        return buf, h


@native
def test_a_buffer_written_a_row_per_step_is_written_in_place():
    """The buffer is not copied per step: the loop program writes each lane's row in one
    buffer of all lanes' rows (SCATTER into its own input), and the buffer is the result."""
    from cocktailer.ir import Op
    batched = assert_batch_matches(Scratchpad().eval(), [(randn(n, 4, seed=n),) for n in (7, 30, 2, 7, 1, 12)])
    assert batched.schedule.loop_programs == 1
    loops = _loop_programs(batched)
    assert loops and all(len(loop.kept) == 1 for loop in loops)
    assert all(("buffer", *loop.kept) in body.outputs and any(op.op is Op.SCATTER for op in body.program.main.body.ops)
               for loop in loops for body in loop.paths.values())


class KeptOrReplaced(nn.Module):
    """The carried value passes one arm untouched and is replaced on the other: used only a
    row at a time (not at all) on one path, it is still not a buffer to keep in place (the
    fuzzer's crash: kept, the other arm's rows were written over the buffer of every lane)."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.full((4,), 2.0))

    def forward(self, z, flags):
        w = z * self.scale
        for t in range(flags.shape[0]):
            if flags[t] > 0:
                w = torch.full_like(w, -1.0) + t
        return w


@native
def test_a_value_replaced_on_one_path_only_is_not_kept_in_place():
    g = torch.Generator().manual_seed(3)
    instances = [(randn(4, seed=k), torch.randint(2, (n,), generator=g)) for k, n in enumerate([5, 1, 9, 3, 9])]
    batched = assert_batch_matches(KeptOrReplaced().eval(), instances)
    assert batched.schedule.loop_programs == 1
    assert all(not loop.kept for loop in _loop_programs(batched))


@native
def test_a_write_that_may_overtake_a_read_of_its_row_keeps_the_loop_stepping():
    batched = assert_batch_matches(Overtaking().eval(), [(randn(n, 4, seed=n),) for n in (3, 8, 1)])
    assert batched.schedule.loop_programs == 0
    assert "may overtake a read" in " ".join(batched.schedule.stepped_loops.values())


@native
def test_a_loop_program_stops_at_max_iterations():
    batched = cocktailer.batch(CountedLoop().eval(), (randn(6, seed=0), torch.tensor(3)), max_iterations=10)
    with torch.no_grad():
        batched([(randn(6, seed=0), torch.tensor(10)), (randn(6, seed=1), torch.tensor(4))])
        assert batched.schedule.loop_programs == 1
        with pytest.raises(cocktailer.BatchInputError, match=r"instance 1: .*max_iterations option allows \(10\)"):
            batched([(randn(6, seed=0), torch.tensor(4)), (randn(6, seed=1), torch.tensor(11))])


class StepUntil(nn.Module):
    """A counted loop that also ends on a condition (`break`): each step reads a column of its
    own state at an index of its own step, writes its state into a row of one buffer and its
    argmax into a column of another."""

    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(4, 4)

    def forward(self, h, bound, budget):
        rows = torch.zeros(12, 4)
        marks = torch.zeros(1, 12, dtype=torch.long)
        for t in range(budget):
            g = h.view(2, 2)[:, t % 2]
            h = torch.tanh(self.cell(h) + torch.cat([g, g])) + 0.3
            rows[t] = h
            marks[:, t] = h.argmax()
            if h.sum() > bound:
                break
        return h, rows, marks


class FillUntil(nn.Module):
    """A while loop on a tensor condition and a count, writing a row of a buffer each step."""

    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(4, 4)

    def forward(self, h, bound):
        rows = torch.zeros(40, 4)
        i = 0
        while i < 40 and h.sum() < bound:
            h = torch.tanh(self.cell(h)) + 0.5
            rows[i] = h
            i += 1
        return h, rows


@native
def test_loops_that_end_on_a_condition_run_every_step_in_one_native_call():
    """A while loop, a loop with a `break`, and seq2seq's decoder stopping at each instance's
    EOS: each is one call of the native while loop, which drops the instances whose condition
    ends them step by step; none runs step by step from Python."""
    batched = assert_batch_matches(UntilThreshold().eval(), [(randn(4, seed=k), torch.tensor(float(limit)))
                                                             for k, limit in enumerate([0.5, 40, -1, 200, 9])])
    assert batched.schedule.loop_programs == 1 and not batched.schedule.stepped_loops
    instances = [(randn(4, seed=k), torch.tensor(float(bound)), torch.tensor(n))
                 for k, (bound, n) in enumerate([(1.0, 12), (50.0, 12), (3.0, 5), (2.5, 1), (50.0, 7)])]
    batched = assert_batch_matches(StepUntil().eval(), instances)
    assert batched.schedule.loop_programs == 1 and not batched.schedule.stepped_loops
    assert batched.schedule.loop_steps == 12
    w = models.make("seq2seq", batch=1, size="small", seed=0)
    instances = [w.inputs] + [models.make("seq2seq", batch=1, size="small", seed=s).inputs for s in range(1, 6)]
    batched = assert_batch_matches(w.model.eval(), instances)
    assert batched.schedule.loop_programs == 1 and not batched.schedule.stepped_loops


@native
def test_a_while_loop_runs_again_with_more_room_when_an_instance_outlasts_it():
    """The while loop makes room for the steps the last batch needed; an instance still in the
    loop when that runs out runs the loop again with more, from the same values (the buffer
    the body writes in place is a fresh copy each time)."""
    model = FillUntil().eval()
    instances = [(randn(4, seed=k), torch.tensor(float(bound))) for k, bound in enumerate([0.5, 3.0, 100.0, -5.0, 9.0])]
    batched = assert_batch_matches(model, instances[:1])
    (loop,) = _loop_programs(batched)
    assert loop.kept   # the rows buffer, written in place
    loop.steps_cap = 2
    with torch.no_grad():
        outs = batched(instances)
        for k, (out, args) in enumerate(zip(outs, instances)):
            assert_same(out, model(*args), rtol=1e-4, atol=1e-5, path=f"instance {k}")
    assert loop.steps_cap == 128 and batched.schedule.loop_steps == 40


@native
def test_a_while_loop_names_the_instances_past_max_iterations_or_their_own_rows():
    batched = cocktailer.batch(UntilThreshold().eval(), (randn(4, seed=0), torch.tensor(3.0)), max_iterations=10)
    with torch.no_grad():
        batched([(randn(4, seed=0), torch.tensor(3.0)), (randn(4, seed=1), torch.tensor(5.0))])
        assert batched.schedule.loop_programs == 1
        with pytest.raises(cocktailer.BatchInputError, match=r"instance 1: .*max_iterations option allows \(10\)"):
            batched([(randn(4, seed=0), torch.tensor(3.0)), (randn(4, seed=1), torch.tensor(500.0))])
    model = SumUntil().eval()
    instances = [(randn(n, 3, seed=n), torch.tensor(float(bound))) for n, bound in [(6, 2.0), (3, 1e9), (9, 4.0)]]
    batched = assert_batch_matches(model, [instances[0], instances[2]])
    assert batched.schedule.loop_programs == 1 and not batched.schedule.stepped_loops
    with pytest.raises(cocktailer.BatchInputError, match="instance 1: IndexError") as e:
        with torch.no_grad():
            batched(instances)
    assert e.value.positions == [1]


class SumUntil(nn.Module):
    """Adds its rows until their sum passes a bound: past its last row, an IndexError."""

    def forward(self, xs, bound):
        total = torch.zeros(3)
        i = 0
        while total.sum() < bound:
            total = total + xs[i].abs()
            i += 1
        return total


class NestedSteps(nn.Module):
    """A loop over rows whose body holds a loop of the row's own count: the inner body reads the
    outer carried value, a value the outer body made before it, and its own counter; after it,
    the outer body reads the inner result and that value again. `peek` rows are read at the
    inner counter, past the instance's own rows where its counts are too large."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, xs, counts, peek):
        h = torch.zeros(4)
        for t in range(xs.shape[0]):
            x = xs[t] * 2
            g = h
            for s in range(counts[t]):
                g = torch.tanh(self.a(g) + x + h * 0.1 + peek[s] + s * 0.01)
            h = torch.tanh(self.b(g) + x)
        return h


@native
def test_a_loop_holding_a_loop_runs_every_step_in_one_native_call():
    """Rows of 0 to 9, inner counts of 0 to 7 (instances leave the inner loop at different steps
    within one outer step, and the outer loop at different steps): one nested program, nothing
    stepped from Python; then NestedRNN the same."""
    g = torch.Generator().manual_seed(5)
    instances = [(randn(n, 4, seed=n), torch.randint(0, 8, (n,), generator=g), randn(7, 4, seed=20 + n))
                 for n in (3, 9, 1, 0, 5, 9)]
    batched = assert_batch_matches(NestedSteps().eval(), instances)
    assert batched.schedule.loop_programs == 1 and not batched.schedule.stepped_loops
    from cocktailer.batching.loops import NestedProgram
    assert any(isinstance(loop, NestedProgram) for executor in batched._executors.values()
               for loop in executor._loops.values())
    from cocktailer.models.throughput import nestedrnn_instances
    model, instances = nestedrnn_instances(6, "small", seed=2)
    batched = assert_batch_matches(model, instances)
    assert batched.schedule.loop_programs == 1 and not batched.schedule.stepped_loops


class FixedInner(nn.Module):
    """An inner loop whose count and initial value come from outside the outer loop."""

    def forward(self, xs, z):
        h = torch.zeros(3)
        for t in range(xs.shape[0]):
            g = z
            for _ in range(2):
                g = torch.tanh(g + xs[t])
            h = h + g
        return h


@native
def test_an_inner_loop_may_count_and_start_from_values_made_outside_the_outer_loop():
    instances = [(randn(n, 3, seed=n), randn(3, seed=10 + n)) for n in (4, 1, 6)]
    batched = assert_batch_matches(FixedInner().eval(), instances)
    assert batched.schedule.loop_programs == 1 and not batched.schedule.stepped_loops


@native
def test_a_nested_loop_names_the_instances_that_index_past_their_own_rows():
    short = (randn(2, 4, seed=1), torch.tensor([3, 6]), randn(4, 4, seed=2))   # peek[4], peek[5]: past its 4 rows
    fine = [(randn(3, 4, seed=3), torch.tensor([2, 0, 4]), randn(5, 4, seed=4)),
            (randn(1, 4, seed=5), torch.tensor([1]), randn(1, 4, seed=6))]
    batched = assert_batch_matches(NestedSteps().eval(), fine)
    assert batched.schedule.loop_programs == 1
    with pytest.raises(cocktailer.BatchInputError, match="instance 1: IndexError") as e:
        with torch.no_grad():
            batched([fine[0], short, fine[1]])
    assert e.value.positions == [1]
    long = (randn(2, 4, seed=7), torch.tensor([1, 6]), randn(6, 4, seed=8))
    batched = cocktailer.batch(NestedSteps().eval(), fine[0], max_iterations=5)
    with torch.no_grad(), pytest.raises(cocktailer.BatchInputError, match=r"instance 2: .*max_iterations option "
                                                                           r"allows \(5\)"):
        batched([fine[0], fine[1], long])
    from cocktailer.batching.loops import NestedProgram   # (the nested program raised, not a loop stepped in Python)
    assert any(isinstance(loop, NestedProgram) for executor in batched._executors.values()
               for loop in executor._loops.values())


@native
def test_weights_moved_out_of_loops_are_constants_of_the_native_code():
    """Loop-invariant code motion moves a cell's weights out of its loop; inside a loop program
    or a native block of a loop stepped from Python they are read as constants of the program
    (packed for the GEMM once, when it loads), not as inputs (packed again at every call)."""
    from cocktailer.batching.blocks import Block
    from cocktailer.ir import Op
    batched = assert_batch_matches(BiRNN(hidden=5).eval(), [(randn(n, 5, seed=k),) for k, n in enumerate([3, 9])])
    (executor,) = batched._executors.values()
    loops = list(executor._loops.values())
    assert len(loops) == 2 and all(kind != "shared" for loop in loops for level in loop.levels
                                   for kind, *_ in level.inputs)
    instances = [(randn(4, seed=k), torch.tensor(float(limit))) for k, limit in enumerate([3, 40])]
    batched = assert_batch_matches(UntilThreshold().eval(), instances)
    (executor,) = batched._executors.values()
    blocks = [b for segs in executor._segments.values() for b in segs if isinstance(b, Block)]
    reads = [executor.producers.get(v.id) for b in blocks for v in b.inputs]
    assert blocks and not any(op is not None and op.op in (Op.CONST, Op.SCALAR) for op in reads)


@native
def test_a_call_tree_decided_by_tensors_is_found_by_round_programs():
    """DRNN decides whether a node expands from its state, a tensor: no scalar tree walk finds
    its call tree, so each round of its inspector runs as native programs (one deciding every
    call's branch, one computing the expanding calls' children), all rounds in one call of the
    native round loop, and finds the call tree that the rounds driven from Python and the torch
    inspector find; each level's calls still run as one native call."""
    from cocktailer.models.throughput import drnn_instances
    model, instances = drnn_instances(12, "small", seed=3)
    batched = assert_batch_matches(model.eval(), instances)
    assert batched.schedule.inspectors == {"generate": "round loop"}
    assert "every round in one call of the native round loop" in cocktailer.explain(batched)
    native_groups, op_by_op = batched.schedule.level_groups["generate"]
    assert native_groups >= len(batched.schedule.levels["generate"][0]) > 2 and op_by_op == 0
    by_loop = _call_tree(batched, instances, True)
    by_rounds = _call_tree(batched, instances, True, level_loop=False)
    by_torch_ops = _call_tree(batched, instances, False)
    assert by_loop.calls == by_torch_ops.calls > 2 * len(instances)
    _assert_same_tree(by_loop, by_rounds)
    # (numbered in another order: compared by what does not depend on the order)
    for count in (lambda t: t.path, lambda t: t.height, lambda t: t.root):
        assert torch.equal(torch.bincount(count(by_loop)), torch.bincount(count(by_torch_ops)))
    for j, values in by_loop.arguments.items():
        torch.testing.assert_close(values.sum(0), by_torch_ops.arguments[j].sum(0), rtol=1e-4, atol=1e-4)


@native
def test_the_round_loop_makes_room_when_a_batch_has_more_calls_than_it_had():
    """The round loop binds its programs for the calls and the widest round it made room for
    last time; a batch with more is run again with more room, and finds the same tree."""
    from cocktailer.models.throughput import drnn_instances
    model, instances = drnn_instances(40, "small", seed=5)
    batched = assert_batch_matches(model.eval(), instances[:4])
    (executor,) = batched._executors.values()
    (rounds,) = executor._rounds.values()
    rounds.calls_cap, rounds.lanes_cap = 8, 4
    from cocktailer.batching import executor as module
    found, loop = [], module.run_round_loop
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "run_round_loop", lambda *a: found.append(loop(*a)) or found[-1])
        outs = batched(instances)
        for k, (out, args) in enumerate(zip(outs, instances)):
            assert_same(out, model(*args), rtol=1e-4, atol=1e-5, path=f"instance {k}")
    (by_loop,) = found
    assert by_loop.calls > 4 * len(instances) and rounds.calls_cap >= by_loop.calls
    _assert_same_tree(by_loop, _call_tree(batched, instances, True, level_loop=False))


@native
def test_the_round_loops_bindings_serve_later_batches_and_weights_changed_in_place():
    """The round loop's programs are bound once, for the room it made, and repointed for every
    later batch, whatever its instances; packed weights written in place since are packed again."""
    from cocktailer.models.throughput import drnn_instances
    model, instances = drnn_instances(24, "small", seed=7)
    model.eval()
    batched = assert_batch_matches(model, instances[:8])
    (executor,) = batched._executors.values()
    (rounds,) = executor._rounds.values()
    bound = dict(rounds.bindings)
    assert bound
    for batch in (instances[8:], instances[:5], instances):
        with torch.no_grad():
            outs = batched(_clone(batch))
            for k, (out, args) in enumerate(zip(outs, batch)):
                assert_same(out, model(*args), rtol=1e-4, atol=1e-5, path=f"instance {k}")
    assert all(rounds.bindings.get(key) is binding for key, binding in bound.items())
    with torch.no_grad():
        model.ancestral.weight.mul_(-0.5)
        outs = batched(_clone(instances))
        expected = [model(*args) for args in instances]
        model.ancestral.weight.div_(-0.5)
    for k, (out, want) in enumerate(zip(outs, expected)):
        assert_same(out, want, rtol=1e-4, atol=1e-5, path=f"instance {k} after the weights changed")


@native
def test_the_level_loops_bindings_serve_a_batch_of_the_same_calls_again():
    """The level loop keeps its programs' bindings by what they were bound for (sizes, layouts):
    a batch whose call tree has the sizes of an earlier one repoints them instead of binding
    again, and batches of other sizes in between do not disturb them."""
    from cocktailer.models.throughput import drnn_instances
    model, instances = drnn_instances(24, "small", seed=7)
    model.eval()
    batched = assert_batch_matches(model, instances[:8])
    (executor,) = batched._executors.values()
    (bindings,) = executor._level_bindings.values()
    bound = dict(bindings)
    assert bound
    for batch in (instances[8:], instances[:5], instances[:8], instances):
        with torch.no_grad():
            outs = batched(_clone(batch))
        for k, (out, args) in enumerate(zip(outs, batch)):
            assert_same(out, model(*args), rtol=1e-4, atol=1e-5, path=f"instance {k}")
    assert all(bindings.get(key) is binding for key, binding in bound.items())


def _assert_same_tree(found, expected):
    """The round loop numbers the calls as the rounds driven from Python do (by round, then by
    the arms taken, then by site), so the trees are the same tensors."""
    assert found.calls == expected.calls
    for name in ("root", "height", "path"):
        assert torch.equal(getattr(found, name), getattr(expected, name)), name
    assert found.children.keys() == expected.children.keys()
    for s, kids in found.children.items():
        assert torch.equal(kids, expected.children[s])
    for j, values in found.arguments.items():
        torch.testing.assert_close(values, expected.arguments[j], rtol=1e-5, atol=1e-6)


@native
def test_levels_found_by_the_torch_inspector_run_as_level_programs():
    """With the native inspectors off, DRNN's inspector runs the control slice in the executor
    (torch ops, and native blocks of the slice's own ops), and notes the arms each call takes,
    so each level's calls still run as one native call."""
    from cocktailer.models.throughput import drnn_instances
    model, instances = drnn_instances(12, "small", seed=3)
    batched = assert_batch_matches(model.eval(), instances, techniques=Techniques(native_inspector=False))
    assert "rounds as native programs: no" in batched.schedule.inspectors["generate"]
    native_groups, op_by_op = batched.schedule.level_groups["generate"]
    assert native_groups >= len(batched.schedule.levels["generate"][0]) > 2 and op_by_op == 0
    from cocktailer.batching.blocks import Block   # the slice's own runs of data ops are native blocks too
    (executor,) = batched._executors.values()
    assert any(isinstance(part, Block) for key, parts in executor._segments.items() if isinstance(key, tuple)
               for part in parts)


class FollowLinks(nn.Module):
    """Follows each node's link while the state it computes says so: `links[i]` (-1: none) is
    the next node. A link past the instance's own nodes is an IndexError in eager."""

    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(4, 4)

    def forward(self, links, h, i):
        h = torch.tanh(self.cell(h))
        if i >= 0 and h.sum() < 3.5:
            return h + self.forward(links, h, links[i])
        return h


class NestedGates(nn.Module):
    """A second gate inside the first one's arm: no round program (its branches are not all at
    the top of the body), so the torch inspector runs the rounds."""

    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(4, 4)

    def forward(self, h, budget):
        if budget > 0 and h.sum() > -2:
            g = torch.tanh(self.cell(h))
            if g[0] > -0.5:
                return h + self.forward(g, budget - 1) + self.forward(g * 0.5, budget - 1)
            return h + self.forward(g, budget - 1)
        return h


def _links(count: int, past_end: bool = False) -> torch.Tensor:
    """Node k links to k + 1; the last to nothing, or past the end."""
    links = torch.arange(1, count + 1)
    links[-1] = count if past_end else -1
    return links


@native
def test_round_programs_name_the_instances_that_index_past_their_own_rows():
    instances = [(_links(n, past_end=k % 2 == 1), randn(4, seed=k), torch.tensor(0))
                 for k, n in enumerate([3, 5, 2, 6])]
    longer = (_links(7), randn(4, seed=9), torch.tensor(0))
    batched = assert_batch_matches(FollowLinks().eval(), [instances[0], instances[2], longer])
    assert batched.schedule.inspectors == {"forward": "round loop"}
    with pytest.raises(cocktailer.BatchInputError, match="instance 1: IndexError") as e:
        with torch.no_grad():
            batched(instances)
    assert e.value.positions == [1, 3]


@native
@pytest.mark.parametrize("level_loop", [True, False])
def test_rounds_past_the_recursion_limit_raise(level_loop, monkeypatch):
    """A chain of calls longer than the batched executor's recursion limit is an error that says
    so, whether the round loop or Python runs the rounds."""
    from cocktailer.batching import executor as module
    instances = [(_links(6), randn(4, seed=1) * 0.01, torch.tensor(0))]
    batched = cocktailer.batch(FollowLinks().eval(), instances[0], techniques=Techniques(level_loop=level_loop))
    monkeypatch.setattr(module, "RECURSION_LIMIT", 3)
    with torch.no_grad(), pytest.raises(cocktailer.CompiledCallError, match=r"deeper than the batched executor "
                                                                              r"supports \(3\)"):
        batched(instances)


@native
def test_a_branch_inside_a_branch_of_the_slice_leaves_the_rounds_to_the_torch_inspector():
    instances = [(randn(4, seed=k), torch.tensor(b)) for k, b in enumerate([0, 3, 1, 4, 2])]
    batched = assert_batch_matches(NestedGates().eval(), instances)
    assert "inside another branch's arm" in batched.schedule.inspectors["forward"]


class ReturnedAndUpdatedCopy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, s):
        soft = torch.softmax(self.lin(s), -1)
        copy = soft.clone()
        copy[1] = soft[0] * 0
        return soft, copy.sum(0)


def test_a_blocks_output_is_not_written_by_an_update_of_its_copy():
    """Fuzz seed 7251127: the block returns `soft` and sums an updated copy of it; the
    update wrote `soft`'s own rows (every lane's row 1 came out zero)."""
    torch.manual_seed(0)
    assert_batch_matches(ReturnedAndUpdatedCopy().eval(), [(randn(n, 6, seed=n),) for n in (8, 2, 5, 9)])


def test_a_call_tree_is_numbered_by_height_then_by_arms():
    """Calls renumbered level by level (height 0 first), within a level by the arms they take,
    else in their order: every group a range of ids; each child id, and each outer lane's
    call, follows its call to its new number (-1, a site not reached, stays)."""
    from cocktailer.batching.inspector import CallTree
    height = torch.tensor([2, 0, 1, 0, 0, 1])
    path = torch.tensor([0, 1, 0, 0, 1, 2])
    root = torch.tensor([0, 0, 0, 1, 1, 1])
    children = {0: torch.tensor([2, -1, 1, -1, -1, 3])}
    arguments = {0: torch.arange(6.0)[:, None].expand(6, 2)}
    tree, groups, outer = CallTree(6, root, arguments, children, height, path).by_height(2)
    order = [3, 1, 4, 2, 5, 0]   # height 0 (arms 0, 1, 1), height 1 (arms 0, 2), height 2
    assert tree.height.tolist() == [0, 0, 0, 1, 1, 2] and tree.path.tolist() == [0, 1, 1, 0, 2, 0]
    assert tree.root.tolist() == [root[k].item() for k in order]
    assert tree.arguments[0][:, 0].tolist() == [float(k) for k in order]
    new = {old: at for at, old in enumerate(order)}
    assert tree.children[0].tolist() == [-1 if c < 0 else new[c] for c in children[0][order].tolist()]
    assert groups == [(0, 1, 0), (1, 3, 1), (3, 4, 0), (4, 5, 2), (5, 6, 0)]
    assert outer.tolist() == [new[0], new[1]]
    unarmed, groups, _ = CallTree(6, root, arguments, children, height).by_height(2)
    assert unarmed.path is None and groups == [(0, 3, None), (3, 5, None), (5, 6, None)]
