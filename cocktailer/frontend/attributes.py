"""Attributes a program assigns on objects that outlive the call: `self.hidden = h` on a
module (or a submodule), `node.state = h` on an object passed in.

Capture runs the program (more than once, when it restarts), so every assignment is undone
after each attempt: the user's objects keep what they held before compiling. What the
program assigned becomes part of its result: tensors (alone or in tuples, lists and dicts)
are outputs like any other, and each call assigns them again, as real tensors, where eager
would have. An attribute set to a new Python value that holds no tensor (a counter) cannot
be repeated by a compiled call and is refused.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from cocktailer import pytree
from cocktailer.errors import UnsupportedError

_MISSING = object()


@dataclass(frozen=True)
class Target:
    """Where a call assigns: ("module", dotted submodule path) or ("argument", (leaf index,
    then the attributes or items that lead from that argument to the object: a tree's node))."""
    root: str
    path: object
    name: str

    def owner(self, module, leaves: list):
        if self.root == "module":
            return module.get_submodule(self.path)
        obj = leaves[self.path[0]]
        for step in self.path[1:]:
            obj = obj[step] if isinstance(step, int) else getattr(obj, step)
        return obj


class Snapshot:
    """The plain attributes of the objects a program can reach: the module's submodules, and
    the Python objects among its arguments (not tensors, numbers or containers)."""

    def __init__(self, fn, leaves: list):
        self.owners: list[tuple[str, object, object]] = []   # (root, path, object)
        if isinstance(fn, torch.nn.Module):
            self.owners += [("module", path, m) for path, m in fn.named_modules(remove_duplicate=False)]
        self.owners += [("argument", path, x) for path, x in _reachable(leaves)]
        self.before = [dict(_plain(obj)) for _, _, obj in self.owners]

    def restore(self):
        for (_, _, obj), before in zip(self.owners, self.before):
            now = _plain(obj)
            for name in set(now) - set(before):
                object.__delattr__(obj, name)
            for name, value in before.items():
                if now.get(name, _MISSING) is not value:
                    object.__setattr__(obj, name, value)

    def written(self) -> list[tuple[Target, object]]:
        """Every attribute that holds another object than before, with what it holds now."""
        out = []
        for (root, path, obj), before in zip(self.owners, self.before):
            for name, value in _plain(obj).items():
                if not _unchanged(before.get(name, _MISSING), value):
                    out.append((Target(root, path, name), value))
        return out


def check_written(written: list[tuple[Target, object]], loc):
    for target, value in written:
        leaves, _ = pytree.flatten(value)
        if not any(isinstance(x, torch.Tensor) for x in leaves):
            raise UnsupportedError(f"the program sets the attribute `{target.name}` of "
                                   f"{'the module' if target.root == 'module' else 'an argument'} to a Python "
                                   f"value ({type(value).__name__}); a compiled call would not set it again", loc,
                                   hint="keep such state outside the compiled function, or hold it in a tensor")


def assign(targets: list[Target], values: tuple, module, leaves: list):
    """After a call: set each attribute to what the program assigned it."""
    for target, value in zip(targets, values):
        setattr(target.owner(module, leaves), target.name, value)


def _unchanged(before, now) -> bool:
    """The same object, or an equal Python value (`self.mode = "eval"` again is no change)."""
    if before is now:
        return True
    if before is _MISSING or isinstance(before, torch.Tensor) or isinstance(now, torch.Tensor):
        return False
    try:
        return type(before) is type(now) and bool(before == now)
    except Exception:   # a comparison that is not a plain bool
        return False


def _reachable(leaves: list) -> list[tuple[tuple, object]]:
    """(path, object) for the Python objects among the arguments and every object reachable
    from them through attributes, lists and tuples (a tree's nodes), each once, by the first
    path found: the program may assign on any of them (`node.left.state = h`)."""
    seen: set[int] = set()
    out = []
    pending = [((k,), x) for k, x in enumerate(leaves)]
    while pending:
        path, x = pending.pop(0)
        if isinstance(x, (list, tuple)):
            pending += [(path + (i,), v) for i, v in enumerate(x)]
            continue
        if not _has_attributes(x) or id(x) in seen:
            continue
        seen.add(id(x))
        out.append((path, x))
        if not isinstance(x, torch.nn.Module):
            pending += [(path + (name,), v) for name, v in vars(x).items()]
    return out


def _has_attributes(x) -> bool:
    return hasattr(x, "__dict__") and not isinstance(x, (torch.Tensor, type)) and not callable(x)


def _plain(obj) -> dict:
    """An object's own attributes, without a module's parameters, buffers and submodules
    (those live in their own dicts, and writes to them are handled as constants)."""
    return {k: v for k, v in vars(obj).items() if not k.startswith("_")} if isinstance(obj, torch.nn.Module) \
        else dict(vars(obj))
