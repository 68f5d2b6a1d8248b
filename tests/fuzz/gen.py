"""A seeded generator of small PyTorch programs with control flow and aliasing.

`generate(seed)` gives a `Program`: Python source of a function `f` (and maybe a recursive
helper `rec`, or a module with a parameter and a buffer), and `inputs(k)`, the k-th input
set (different values, trip counts and trees, so that the same program takes different
paths). What the programs mix, nested: loops with 0, 1 or many steps (Python and tensor trip
counts), tensor `while` with `break`/`continue`, `if`/`elif`/`else` on tensor predicates,
early `return`, recursion over trees with loops inside (and over trees the program generates,
decided by tensors), views (slices, `t()`, `reshape`,
`detach`, `.data`, `chunk`), aliases of inputs and of each other, in-place ops (`+=`, `*=`,
`add_`, `x[i] = v`, `copy_`, `fill_`, masks, `out=`, `inplace=True`), several outputs,
tuples, integer and boolean tensors.

Every variable keeps one shape and dtype for its life, so most programs are valid; those
that eager PyTorch rejects are discarded by the harness.

Programs are trees of `Stmt` (a line, or a header with a body and an else body), so that a
failing one can be minimized statement by statement (see minimize.py).
"""
from __future__ import annotations

import functools
import pathlib
import random
import tempfile
from dataclasses import dataclass, field

import torch

SHAPES = [(4, 3), (3,), (4,), ()]
REBIND_RATE = 0.15   # of the statements in a branch or loop, how many more rebind variables to each other
VIEWS_OF = {   # shape -> [(view expression with {v}, result shape)]
    (4, 3): [("{v}[{i4}]", (3,)), ("{v}[:, {i3}]", (4,)), ("{v}[1:3]", None), ("{v}.t()", (3, 4)),
             ("{v}.reshape(-1)", (12,)), ("{v}.view(12)", (12,)), ("{v}.detach()", (4, 3)), ("{v}.data", (4, 3)),
             ("{v}.chunk(2)[0]", None), ("{v}[{d4}]", (3,)), ("{v}.unsqueeze(0).squeeze(0)", (4, 3)),
             ("{v}.narrow(0, 1, 2)", None), ("{v}[{i4}, {i3}]", ())],
    (3,): [("{v}[{i3}]", ()), ("{v}[1:]", None), ("{v}.view(3)", (3,)), ("{v}.detach()", (3,)), ("{v}[{d3}]", ())],
    (4,): [("{v}[{i4}]", ()), ("{v}[:2]", None), ("{v}.reshape(2, 2)", None), ("{v}[{d4}]", ())],
    (): [("{v}.view(())", ()), ("{v}.detach()", ())],
}


@dataclass
class Stmt:
    line: str | None = None                  # a simple statement
    header: str | None = None                # `if ...:`, `for ...:`, `while ...:`, `def ...:`
    body: list = field(default_factory=list)
    orelse: list = field(default_factory=list)
    rebind: bool = False                     # drawn from the rebind sequence (`Generator.rebind`)

    def render(self, indent: int = 0) -> list[str]:
        pad = "    " * indent
        if self.header is None:
            return [pad + self.line]
        out = [pad + self.header]
        out += [line for s in self.body for line in s.render(indent + 1)] or [pad + "    pass"]
        if self.orelse:
            out.append(pad + "else:")
            out += [line for s in self.orelse for line in s.render(indent + 1)]
        return out


@dataclass
class Program:
    seed: int
    dtype: torch.dtype
    params: list[tuple[str, str]]       # (name, kind) of f's arguments
    body: list[Stmt]
    helper: list[Stmt] = field(default_factory=list)    # `def rec(...)`, when the program recurses
    module: bool = False                # f is the forward of a module with `lin` and buffer `buf`
    nodes: int = 5                      # tree size, when it recurses
    seeded_buffer = True                # build() fills the module's `buf` with seeded values

    @property
    def source(self) -> str:
        lines = ["import torch", "import torch.nn.functional as F", ""]
        if self.helper:
            lines += [line for s in self.helper for line in s.render()] + [""]
        args = ", ".join(name for name, _ in self.params)
        if self.module:
            lines += ["class M(torch.nn.Module):", "    def __init__(self):", "        super().__init__()",
                      "        self.lin = torch.nn.Linear(3, 3)",
                      "        self.register_buffer('buf', torch.zeros(4, 3))", "",
                      f"    def forward(self, {args}):"]
            lines += [line for s in self.body for line in s.render(2)]
        else:
            lines += [f"def f({args}):"] + [line for s in self.body for line in s.render(1)]
        return "\n".join(lines) + "\n"

    def build(self):
        """The callable: f, or a fresh module M() with seeded weights. The source is written
        to a file first: cocktailer reads a function's source to convert its control flow."""
        path = _source_dir() / f"fuzz_{self.seed}_{abs(hash(self.source)) % 10**8}.py"
        if not path.exists():
            path.write_text(self.source)
        namespace: dict = {"__name__": f"fuzz_{self.seed}"}
        exec(compile(self.source, str(path), "exec"), namespace)
        if not self.module:
            return namespace["f"]
        torch.manual_seed(self.seed)
        model = namespace["M"]().to(self.dtype).eval()
        with torch.no_grad():
            model.buf.copy_(torch.randn(4, 3, dtype=self.dtype))
        return model

    def inputs(self, k: int) -> tuple:
        g = torch.Generator().manual_seed(self.seed * 1000 + k)
        rng = random.Random(self.seed * 1000 + k)
        left, right, leaf = _tree(self.nodes, rng)
        make = {
            "x": lambda: torch.randn(4, 3, generator=g, dtype=self.dtype),
            "y": lambda: torch.randn(3, generator=g, dtype=self.dtype),
            "z": lambda: torch.randn(4, generator=g, dtype=self.dtype),
            "c": lambda: torch.randn((), generator=g, dtype=self.dtype) * 0.5,
            "n": lambda: torch.tensor(rng.choice([0, 1, 2, 3, 4])),
            "k": lambda: torch.randint(0, 8, (4,), generator=g),
            "m": lambda: torch.rand(4, 3, generator=g) > 0.5,
            "left": lambda: left, "right": lambda: right, "is_leaf": lambda: leaf,
            "data": lambda: torch.randn(self.nodes, 3, generator=g, dtype=self.dtype),
            "root": lambda: torch.tensor(0),
            "budget": lambda: torch.tensor(rng.choice([0, 1, 2, 3, 4])),
            "tree": lambda: _object_tree(self.nodes, rng, g, self.dtype),
        }
        return tuple(make[kind]() for _, kind in self.params)


@functools.cache
def _source_dir() -> pathlib.Path:
    return pathlib.Path(tempfile.mkdtemp(prefix="cocktailer-fuzz-"))


def _tree(nodes: int, rng: random.Random):
    """A random full binary tree of `nodes` nodes (odd), root 0, as child-index tensors."""
    left, right, leaf = [-1] * nodes, [-1] * nodes, [True] * nodes
    frontier, next_id = [0], 1
    while next_id + 1 < nodes:
        parent = frontier.pop(rng.randrange(len(frontier)))
        left[parent], right[parent], leaf[parent] = next_id, next_id + 1, False
        frontier += [next_id, next_id + 1]
        next_id += 2
    return torch.tensor(left), torch.tensor(right), torch.tensor(leaf)


class FuzzNode:
    """A node of a tree passed as Python objects (cocktailer linearizes such trees)."""

    def __init__(self, x: torch.Tensor, left=None, right=None):
        self.x, self.left, self.right = x, left, right

    def literal(self):
        """The tree as nested tuples (x, left, right), plus `state` where the program set it."""
        kids = tuple(None if c is None else c.literal() for c in (self.left, self.right))
        state = getattr(self, "state", None)
        return (self.x.tolist(), *kids) + ((state.tolist(),) if state is not None else ())

    @staticmethod
    def build(literal, dtype):
        x, left, right = literal[:3]
        return FuzzNode(torch.tensor(x, dtype=dtype), *(None if c is None else FuzzNode.build(c, dtype)
                                                         for c in (left, right)))


def _object_tree(nodes: int, rng: random.Random, g: torch.Generator, dtype) -> FuzzNode:
    left, right, _ = _tree(nodes, rng)
    made = [FuzzNode(torch.randn(3, generator=g, dtype=dtype)) for _ in range(nodes)]
    for i, node in enumerate(made):
        if left[i] >= 0:
            node.left, node.right = made[int(left[i])], made[int(right[i])]
    return made[0]


@dataclass
class Var:
    shape: tuple
    kind: str = "float"      # "float", "int", "bool"


class Generator:
    def __init__(self, seed: int):
        self.seed = seed
        self.rng = random.Random(seed)
        self.names = 0
        self.loop_depth = 0
        self.depth = 0
        self.in_helper = False
        self.protected: set[str] = set()   # loop counters: never rebound by generated statements
        # rebinds of variables to each other inside branches and loops come from a sequence of
        # their own, so that every seed's program keeps the statements it had before them
        self.rebinds = random.Random(seed * 7919 + 2)
        self.temps = 0   # temporaries of rebinds (`t1`, ...): named apart, the `v` names stay as they were

    # -- entry -----------------------------------------------------------------------------
    def program(self) -> Program:
        r = self.rng
        dtype = torch.float64 if r.random() < 0.7 else torch.float32
        params = [("x", "x")] + [(p, p) for p in ("y", "z", "c", "n", "k", "m") if r.random() < 0.6]
        recursive = r.random() < 0.2
        objects = recursive and r.random() < 0.4   # the tree as node objects, not index tensors
        # a tree the program generates, each node expanding on a gate of its state (drawn apart
        # from the main sequence, so that the other seeds' programs stay as they were)
        generated = recursive and not objects and random.Random(self.seed * 7919 + 1).random() < 0.4
        self.nodes = r.choice([1, 3, 5, 7])
        if objects:
            params += [("tree", "tree")]
        elif generated:
            params += [("budget", "budget")]
        elif recursive:
            params += [("left", "left"), ("right", "right"), ("is_leaf", "is_leaf"), ("data", "data"),
                       ("root", "root")]
        self.module = not recursive and r.random() < 0.15
        self.vars = {name: _input_var(kind, self.nodes) for name, kind in params if kind != "tree"}
        if self.module:
            self.vars["self.buf"] = Var((4, 3))
        self.outputs = self._output_signature()
        self.base = "x"
        helper = (self._object_helper() if objects else self._generator_helper() if generated else
                  self._helper() if recursive else [])
        body = []
        if recursive:
            body.append(Stmt("r0 = rec(tree)" if objects else "r0 = rec(x[0], budget)" if generated else
                             "r0 = rec(left, right, is_leaf, data, root)"))
            self.vars["r0"] = Var((3,))
        body += self.block(r.randint(3, 9))
        body.append(self.ret())
        return Program(self.seed, dtype, params, body, helper, self.module, nodes=self.nodes)

    def _output_signature(self) -> list[tuple]:
        shapes = [self.rng.choice(SHAPES) for _ in range(self.rng.choice([1, 1, 2, 3]))]
        return shapes

    # -- statements --------------------------------------------------------------------------
    def block(self, n: int) -> list[Stmt]:
        out = []
        for _ in range(n):
            out += self.stmt()
        return out

    def stmt(self) -> list[Stmt]:
        rebind = self.rebind() if self.depth > 0 and self.rebinds.random() < REBIND_RATE else []
        return rebind + self._stmt()

    def _stmt(self) -> list[Stmt]:
        r = self.rng
        choices = [(self.assign, 5), (self.alias, 3), (self.write, 6)]
        if self.depth < 3:
            choices += [(self.if_, 3), (self.for_, 2), (self.while_, 1)]
        if self.depth > 0 and not self.in_helper and r.random() < 0.3:
            choices += [(lambda: [self.ret()], 1)]
        if self.depth == 0:
            choices += [(self.python_list, 1), (self.swap, 1)]
        choices += [(self.refusable, 0.08)]
        fn = r.choices([c for c, _ in choices], [w for _, w in choices])[0]
        return fn()

    def new(self, shape, kind="float") -> str:
        self.names += 1
        name = f"v{self.names}"
        self.vars[name] = Var(tuple(shape), kind)
        return name

    def assign(self) -> list[Stmt]:
        r = self.rng
        rebind = [n for n, v in self.vars.items() if not n.startswith("self.") and v.kind == "float"
                  and n not in self.protected]
        if rebind and r.random() < 0.4:
            name = r.choice(rebind)
            return [Stmt(f"{name} = {self.expr(self.vars[name].shape)}")]
        shape = r.choice(SHAPES)
        value = self.expr(shape)
        return [Stmt(f"{self.new(shape)} = {value}")]

    def alias(self) -> list[Stmt]:
        r = self.rng
        sources = [n for n, v in self.vars.items() if v.kind == "float" and v.shape in VIEWS_OF]
        src = r.choice(sources)
        if r.random() < 0.3:   # another name for the same tensor
            return [Stmt(f"{self.new(self.vars[src].shape)} = {src}")]
        template, shape = r.choice(VIEWS_OF[self.vars[src].shape])
        if shape is None:
            shape = _eval_shape(template, self.vars[src].shape)
        return [Stmt(f"{self.new(shape)} = {self.fill(template, v=src)}")]

    def write(self) -> list[Stmt]:
        r = self.rng
        targets = [n for n, v in self.vars.items() if v.kind == "float"]
        name = r.choice(targets)
        shape = self.vars[name].shape
        e = lambda s=shape: self.expr(s, small=True)
        options = [
            lambda: f"{name} += {e()}", lambda: f"{name} -= {e()}", lambda: f"{name} *= 0.5",
            lambda: f"{name}.add_({e()})", lambda: f"{name}.mul_({r.choice(['0.5', '-1.0', '1.5'])})",
            lambda: f"{name}.copy_({e()})", lambda: f"{name}.clamp_(-2.0, 2.0)", lambda: f"{name}.tanh_()",
            lambda: f"{name}.fill_({r.choice(['0.5', '-1.0'])})",
            lambda: f"F.relu({name}, inplace=True)",
            lambda: f"torch.add({e()}, 1.0, out={name})",
        ]
        if shape == (4, 3):
            options += [lambda: f"{name}[{self.index(4)}] = {e((3,))}", lambda: f"{name}[:, {self.index(3)}] += {e((4,))}",
                        lambda: f"{name}[1:3] *= -1.0", lambda: f"{name}[{self.index(4)}, {self.index(3)}] = 2.0"]
            if "m" in self.vars:
                options.append(lambda: f"{name}[m] = {r.choice(['0.0', '1.5'])}")
        elif shape in ((3,), (4,)):
            size = shape[0]
            options += [lambda: f"{name}[{self.index(size)}] = {e(())}", lambda: f"{name}[1:] += 1.0"]
        return [Stmt(r.choice(options)())]

    def swap(self) -> list[Stmt]:
        pairs = self._same_shape_groups()
        if not pairs:
            return self.assign()
        a, b = self.rng.sample(self.rng.choice(pairs), 2)
        return [Stmt(f"{a}, {b} = {b}, {a}")]

    def _same_shape_groups(self) -> list[list[str]]:
        """The float variables that may be rebound (not buffers, not loop counters), by shape,
        where a shape has two or more."""
        same = {}
        for n, v in self.vars.items():
            if v.kind == "float" and not n.startswith("self.") and n not in self.protected:
                same.setdefault(v.shape, []).append(n)
        return [names for names in same.values() if len(names) >= 2]

    def rebind(self) -> list[Stmt]:
        """A variable rebound to another one's tensor, or to a view of it of its own shape, or
        two swapped, or two made overlapping views of a new tensor, inside a branch or loop: after the construct a variable may be any of
        several others' memory, reached by several ways (fuzz seed 7247001)."""
        r = self.rebinds
        groups = self._same_shape_groups()
        if not groups:
            return []
        a, b = r.sample(r.choice(groups), 2)
        shape = self.vars[a].shape
        views = [template for template, out in VIEWS_OF.get(shape, []) if out == shape and "{i" not in template
                 and "{d" not in template]
        choice = r.random()
        if choice < 0.35:
            return [Stmt(f"{a}, {b} = {b}, {a}", rebind=True)]
        if choice >= 0.85 and shape and shape[0] >= 2:
            # overlapping views of a temporary no variable keeps (dead after this statement)
            self.temps += 1
            t = f"t{self.temps}"
            return [Stmt(f"{t} = torch.cat([{b}, {a}[:1]])", rebind=True),
                    Stmt(f"{a}, {b} = {t}[:-1], {t}[1:]", rebind=True)]
        if choice < 0.7 or not views:
            return [Stmt(f"{a} = {b}", rebind=True)]
        return [Stmt(f"{a} = " + r.choice(views).format(v=b), rebind=True)]   # no index in these: the main sequence is left alone

    def refusable(self) -> list[Stmt]:
        """What cocktailer may refuse (to check the refusal is clean and names the line):
        data-dependent shapes, Python values of tensors, randomness, unsupported ops, a list
        growing in a tensor loop, a loop-carried shape change."""
        r = self.rng
        x = self.pick((4, 3))
        options = [
            lambda: [Stmt(f"{self.new(())} = {x}[{x} > 0].sum()")],
            lambda: [Stmt(f"{self.new((4, 3))} = {x} * float({x}.sum())")],
            lambda: [Stmt(f"{self.new((3,))} = torch.rand(3, dtype={x}.dtype)")],
            lambda: [Stmt(f"{self.new((4, 3))} = torch.cummax({x}, 0).values")],
            lambda: [Stmt(f"{self.new((4,))} = {x}[:, int({x}[0, 0] > 0)]")],
        ]
        if "n" in self.vars:
            lst = f"l{self.names + 1}"
            self.names += 1
            options += [
                lambda: [Stmt(f"{lst} = []"), Stmt(header="for j in range(n):", body=[Stmt(f"{lst}.append({x}[0])")]),
                         Stmt(f"{self.new(())} = torch.tensor(float(len({lst})))")],
                lambda: [Stmt(f"{(v := self.new((4, 3)))} = {x} * 1"),
                         Stmt(header="for j in range(n):", body=[Stmt(f"{v} = torch.cat([{v}, {v}])[:4]"),
                                                                Stmt(f"{v} = torch.cat([{v}, {v}], 1)")])]]
        return r.choice(options)()

    def python_list(self) -> list[Stmt]:
        """A Python list filled in a loop with a Python trip count (unrolled), then stacked."""
        shape = self.rng.choice([(3,), (4,)])
        steps = self.rng.randint(1, 3)
        lst = f"l{self.names + 1}"
        self.names += 1
        out = [Stmt(f"{lst} = []"),
               Stmt(header=f"for j in range({steps}):", body=[Stmt(f"{lst}.append({self.expr(shape)} * (j + 1))")])]
        out.append(Stmt(f"{self.new((steps,) + shape)} = torch.stack({lst})"))
        return out

    # -- control flow -------------------------------------------------------------------------
    def nested(self, n: int) -> list[Stmt]:
        """A block in a construct: names it creates are gone after it (they may be unassigned)."""
        saved = dict(self.vars)
        self.depth += 1
        body = self.block(n)
        self.depth -= 1
        self.vars = saved
        return body

    def if_(self) -> list[Stmt]:
        r = self.rng
        head = Stmt(header=f"if {self.predicate()}:", body=self.nested(r.randint(1, 4)))
        tail = head
        for _ in range(r.choice([0, 0, 1, 2])):   # elif
            nxt = Stmt(header=f"if {self.predicate()}:", body=self.nested(r.randint(1, 3)))
            tail.orelse = [nxt]
            tail = nxt
        if r.random() < 0.6:
            tail.orelse = self.nested(r.randint(1, 3))
        return [head]

    def for_(self) -> list[Stmt]:
        r = self.rng
        var = f"i{self.loop_depth}"
        trip = r.choice(["0", "1", "3", "n"] if "n" in self.vars else ["0", "1", "3"])
        self.vars[var] = Var((), "int") if trip == "n" else Var((), "pyint")
        self.loop_depth += 1
        body = self.nested(r.randint(1, 4))
        if r.random() < 0.3:
            self._insert_jump(body)
        self.loop_depth -= 1
        del self.vars[var]
        return [Stmt(header=f"for {var} in range({trip}):", body=body)]

    def while_(self) -> list[Stmt]:
        r = self.rng
        counter = f"w{self.loop_depth}"
        self.loop_depth += 1
        self.protected.add(counter)
        body = self.nested(r.randint(1, 4))
        if r.random() < 0.4:
            self._insert_jump(body)
        body.insert(0, Stmt(f"{counter} += 1"))
        self.protected.discard(counter)
        self.loop_depth -= 1
        limit = r.randint(1, 4)
        return [Stmt(f"{counter} = 0"), Stmt(header=f"while {counter} < {limit} and {self.predicate()}:", body=body)]

    def _insert_jump(self, body: list[Stmt]):
        """A break or continue at a place drawn among the body's main statements (rebinds
        between them leave the main sequence as it was)."""
        main = [k for k, stmt in enumerate(body) if not stmt.rebind] + [len(body)]
        body.insert(main[self.rng.randrange(len(main))], self.jump())

    def jump(self) -> Stmt:
        return Stmt(header=f"if {self.predicate()}:", body=[Stmt(self.rng.choice(["break", "continue"]))])

    def ret(self) -> Stmt:
        values = [self.expr(shape) if self.rng.random() < 0.5 else self.pick(shape) for shape in self.outputs]
        return Stmt("return " + (values[0] if len(values) == 1 else "(" + ", ".join(values) + ")"))

    # -- recursion ---------------------------------------------------------------------------------
    def _helper(self) -> list[Stmt]:
        saved, self.vars = self.vars, {"data": Var((self.nodes, 3)), "node": Var((), "int")}
        self.in_helper, self.base = True, "data"
        r = self.rng
        leaf_value = r.choice(["data[node]", "data[node] * 2.0", "torch.tanh(data[node])"])
        leaf = [Stmt(f"data[node] += 1.0")] if r.random() < 0.4 else []
        leaf.append(Stmt(f"return {leaf_value}"))
        self.vars.update(a=Var((3,)), b=Var((3,)))
        body = [Stmt(header="if is_leaf[node]:", body=leaf),
                Stmt("a = rec(left, right, is_leaf, data, left[node])"),
                Stmt("b = rec(left, right, is_leaf, data, right[node])")]
        self.depth = 1
        body += self.block(r.randint(1, 3))
        self.depth = 0
        body.append(Stmt(f"return torch.tanh({self.expr((3,))} + a - b)"))
        self.vars = saved
        self.in_helper, self.base = False, "x"
        return [Stmt(header="def rec(left, right, is_leaf, data, node):", body=body)]

    def _generator_helper(self) -> list[Stmt]:
        """A tree generated top-down, as DRNN's: a node expands while its budget lasts and a gate
        computed from its state says so (the call tree depends on tensors), its children's
        states computed from its own."""
        saved, self.vars = self.vars, {"h": Var((3,)), "budget": Var((), "int")}
        self.in_helper, self.base = True, "h"
        r = self.rng
        self.depth = 1
        body = self.block(r.randint(0, 2))
        gate = f"if budget > 0 and ({self.expr((3,))}).sum() > {r.choice(['-1.0', '0.0', '0.5'])}:"
        expand = [Stmt(f"a = rec(torch.tanh({self.expr((3,))}), budget - 1)")]
        if r.random() < 0.3:   # the second call's state may read the first's result: then it runs depth-first
            self.vars["a"] = Var((3,))
        expand.append(Stmt(f"b = rec(({self.expr((3,))}) * 0.5, budget - 1)"))
        self.vars.update(a=Var((3,)), b=Var((3,)))
        expand.append(Stmt(f"return torch.tanh({self.expr((3,))} + a - b)"))
        body += [Stmt(header=gate, body=expand),
                 Stmt(f"return {r.choice(['h', 'h * 2.0', 'torch.tanh(h)'])}")]
        self.depth = 0
        self.vars = saved
        self.in_helper, self.base = False, "x"
        return [Stmt(header="def rec(h, budget):", body=body)]

    def _object_helper(self) -> list[Stmt]:
        """The same recursion over FuzzNode objects: `node.left is None` for a leaf, the node's
        tensor written in place, its `state` assigned."""
        saved, self.vars = self.vars, {"v": Var((3,))}
        self.in_helper, self.base = True, "v"
        r = self.rng
        leaf = [Stmt("v += 1.0")] if r.random() < 0.4 else []
        leaf += [Stmt(f"node.state = {r.choice(['v * 2.0', 'torch.tanh(v)'])}"), Stmt("return node.state")]
        self.vars.update(a=Var((3,)), b=Var((3,)))
        body = [Stmt("v = node.x"), Stmt(header="if node.left is None:", body=leaf),
                Stmt("a = rec(node.left)"), Stmt("b = rec(node.right)")]
        self.depth = 1
        body += self.block(r.randint(1, 3))
        self.depth = 0
        body += [Stmt(f"node.state = torch.tanh({self.expr((3,))} + a - b)"), Stmt("return node.state")]
        self.vars = saved
        self.in_helper, self.base = False, "x"
        return [Stmt(header="def rec(node):", body=body)]

    # -- expressions ----------------------------------------------------------------------------------
    def pick(self, shape, kind="float") -> str:
        names = [n for n, v in self.vars.items() if v.shape == tuple(shape) and v.kind == kind]
        return self.rng.choice(names) if names else f"({self.expr(shape)})"

    def expr(self, shape, small=False, depth=0) -> str:
        r = self.rng
        shape = tuple(shape)
        if depth > 2 or r.random() < 0.3:
            return self.leaf(shape)
        sub = lambda s=shape: self.expr(s, small, depth + 1)
        # every option is a primary expression (a call or parenthesized): postfix ops bind to all of it
        options = [
            lambda: f"torch.tanh({sub()})", lambda: f"({sub()} + {sub()})", lambda: f"({sub()} - {sub()} * 0.5)",
            lambda: f"(torch.sigmoid({sub()}) * {sub()})", lambda: f"torch.relu({sub()})",
            lambda: f"torch.where({self.mask(shape)}, {sub()}, {sub()})", lambda: f"{sub()}.clamp(-1.5, 1.5)",
        ]
        if shape == (4,):
            options += [lambda: f"torch.topk({self.expr((4, 3), small, depth + 1)}, 2, dim=1).values.sum(1)",
                        lambda: f"{self.expr((4, 3), small, depth + 1)}.sum(1)",
                        lambda: f"({self.expr((4, 3), small, depth + 1)} @ {self.expr((3,), small, depth + 1)})",
                        lambda: f"{self.expr((4, 3), small, depth + 1)}.amax(1)"]
        elif shape == (3,):
            options += [lambda: f"torch.sort({sub()}, descending=True).values",
                        lambda: f"{self.expr((4, 3), small, depth + 1)}.mean(0)",
                        lambda: f"{self.pick((4, 3))}[{self.index(4)}]"]
        elif shape == ():
            options += [lambda: f"{self.expr(r.choice([(3,), (4,), (4, 3)]), small, depth + 1)}.sum()",
                        lambda: f"{self.pick((3,))}[{self.index(3)}]"]
        elif shape == (4, 3):
            options += [lambda: f"torch.cumsum({sub()}, {r.randrange(2)})",
                        lambda: f"{sub()}.gather(1, {self.gather_index()})",
                        lambda: f"{sub()}.new_zeros(4, 3).scatter_add(1, {self.gather_index()}, {sub()})",
                        lambda: f"({self.expr((4,), small, depth + 1)}.unsqueeze(1) * {self.expr((3,), small, depth + 1)})",
                        lambda: f"torch.stack([{sub((3,))}, {sub((3,))}, {sub((3,))}, {sub((3,))}])"]
            if self.module:
                options.append(lambda: f"self.lin({sub()})")
        return r.choice(options)()

    def leaf(self, shape) -> str:
        r = self.rng
        names = [n for n, v in self.vars.items() if v.shape == shape and v.kind == "float"]
        if names and r.random() < 0.85:
            return r.choice(names)
        if shape == () and "c" in self.vars:
            return "c"
        return r.choice([f"{self.base}.new_zeros({shape})", f"({self.base}.new_ones({shape}) * 0.5)",
                         f"{self.base}.new_full({shape}, -0.25)"])

    def gather_index(self) -> str:
        """An int64 (4, 3) index into dim 1 of a (4, 3) tensor: constant, or from `k`."""
        if "k" in self.vars and self.rng.random() < 0.5:
            return "((k.unsqueeze(1) + torch.arange(3)) % 3)"
        return f"(torch.arange(12).reshape(4, 3) * {self.rng.randrange(1, 5)} % 3)"

    def mask(self, shape) -> str:
        if shape == (4, 3) and "m" in self.vars and self.rng.random() < 0.5:
            return "m"
        return f"({self.expr(shape, depth=2)} > 0)"

    def index(self, size: int) -> str:
        """A Python int, a loop variable, or a 0-d tensor index into a dim of `size`."""
        r = self.rng
        loops = [n for n, v in self.vars.items() if n.startswith("i") and v.kind in ("int", "pyint")]
        options = [str(r.randrange(size)), str(-1)]
        if loops:
            options.append(f"{r.choice(loops)} % {size}")
        if "k" in self.vars:
            options.append(f"k[{r.randrange(4)}] % {size}")
        return r.choice(options)

    def predicate(self) -> str:
        r = self.rng
        options = [lambda: f"{self.expr(())} > {'c' if 'c' in self.vars else '0.0'}",
                   lambda: f"{self.expr(r.choice([(3,), (4,)]))}.sum() < 0.5",
                   lambda: f"({self.expr((4, 3))} > 0.5).any()"]
        if "n" in self.vars:
            options.append(lambda: f"n > {r.randint(0, 3)}")
        if "m" in self.vars:
            options.append(lambda: f"m[{r.randrange(4)}, {r.randrange(3)}]")
        if "k" in self.vars:
            options.append(lambda: f"k[{r.randrange(4)}] > 3")
        pred = r.choice(options)()
        if r.random() < 0.15:
            pred = f"not ({pred})" if r.random() < 0.5 else f"({pred}) and ({r.choice(options)()})"
        return pred

    def fill(self, template: str, **names) -> str:
        return template.format(i4=self.index(4), i3=self.index(3),
                               d4=f"k[0] % 4" if "k" in self.vars else "torch.tensor(1)",
                               d3=f"k[1] % 3" if "k" in self.vars else "torch.tensor(2)", **names)

def _input_var(kind: str, nodes: int) -> Var:
    return {"x": Var((4, 3)), "y": Var((3,)), "z": Var((4,)), "c": Var(()), "n": Var((), "int"),
            "k": Var((4,), "int"), "m": Var((4, 3), "bool"), "left": Var((nodes,), "int"),
            "right": Var((nodes,), "int"), "is_leaf": Var((nodes,), "bool"), "data": Var((nodes, 3)),
            "root": Var((), "int"), "budget": Var((), "int")}[kind]


def _eval_shape(template: str, shape: tuple) -> tuple:
    expr = template.format(v="t", i4="1", i3="1", d4="1", d3="1")
    return tuple(eval(expr, {"t": torch.empty(shape, device="meta"), "torch": torch}).shape)


def generate(seed: int) -> Program:
    return Generator(seed).program()
