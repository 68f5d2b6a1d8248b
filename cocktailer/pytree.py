"""Flatten nested tuples, lists and dicts to a list of leaves and back. Named tuples (and
torch's result tuples, `torch.return_types.max` ...) are containers too, rebuilt as their type,
and so is a class that says how (`_pytree_flatten()` -> (children, aux), and a static
`_pytree_unflatten(aux, children)`: a linearized tree's node, see frontend.nodes)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Spec:
    kind: str                 # "leaf", "tuple", "list", "dict", "named", "custom"
    children: tuple = ()      # child Specs
    keys: tuple = ()          # dict keys, in order; for "named", (its type,); for "custom", (type, aux)

    @property
    def num_leaves(self) -> int:
        return 1 if self.kind == "leaf" else sum(c.num_leaves for c in self.children)


LEAF = Spec("leaf")


def flatten(tree: Any) -> tuple[list, Spec]:
    leaves: list = []

    def go(node) -> Spec:
        if type(node) is tuple or type(node) is list:
            return Spec(type(node).__name__, tuple(go(c) for c in node))
        if _named_tuple(type(node)):
            return Spec("named", tuple(go(c) for c in node), (type(node),))
        if type(node) is dict:
            keys = tuple(node)
            return Spec("dict", tuple(go(node[k]) for k in keys), keys)
        if hasattr(type(node), "_pytree_flatten"):
            children, aux = node._pytree_flatten()
            return Spec("custom", tuple(go(c) for c in children), (type(node), aux))
        leaves.append(node)
        return LEAF

    return leaves, go(tree)


def unflatten(spec: Spec, leaves: list) -> Any:
    it = iter(leaves)

    def go(s: Spec):
        if s.kind == "leaf":
            return next(it)
        children = [go(c) for c in s.children]
        if s.kind == "dict":
            return dict(zip(s.keys, children))
        if s.kind == "custom":
            return s.keys[0]._pytree_unflatten(s.keys[1], children)
        if s.kind == "named":
            kind = s.keys[0]
            return kind(children) if kind.__module__ == "torch.return_types" else kind(*children)
        return tuple(children) if s.kind == "tuple" else children

    return go(spec)


def _named_tuple(kind: type) -> bool:
    """A collections.namedtuple / typing.NamedTuple class, or a torch.return_types one."""
    return issubclass(kind, tuple) and (hasattr(kind, "_fields") or kind.__module__ == "torch.return_types")


def tree_map(fn: Callable, tree: Any) -> Any:
    leaves, spec = flatten(tree)
    return unflatten(spec, [fn(x) for x in leaves])
