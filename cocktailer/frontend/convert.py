"""Source-to-source conversion of user functions so that their control flow can be traced.

Three rewrites of the function's AST, in order:
  1. `lower_jumps`: `return`/`break`/`continue` inside control flow become flag variables
     and guards (`if not __ct_brk_3: ...`), loop `else:` clauses become guarded code;
  2. `functionalize`: each `if`/`while`/`for` becomes nested functions taking and returning
     the variables it assigns that are live (a liveness analysis picks them) and a call of
     `__ct__.if_stmt` / `while_stmt` / `for_stmt`;
  3. `rewrite_expressions`: `and`/`or`/`not`/`x if c else y` and every call go through
     `__ct__`, so that tensors reaching them are traced.
The result is compiled with the user's file name and line numbers: errors and locations
in the IR point at the user's code.
"""
from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
import types
from typing import Callable

from cocktailer.errors import UnsupportedError
from cocktailer.frontend import control
from cocktailer.ir import SourceLoc

CT = "__ct__"
P = control.INTERNAL_PREFIX
RET, RET_SET = control.RETURN_VALUE, P + "retset"

_NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef,
                  ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_REFUSED = {
    ast.Try: ("try/except", "handle errors outside the compiled function"),
    ast.Yield: ("a generator (yield)", "return a tensor or a tuple instead"),
    ast.YieldFrom: ("a generator (yield from)", "return a tensor or a tuple instead"),
    ast.Await: ("await", "compiled functions are synchronous"),
    ast.AsyncFor: ("async for", "compiled functions are synchronous"),
    ast.AsyncWith: ("async with", "compiled functions are synchronous"),
    ast.Global: ("a `global` statement", "pass the value as an argument"),
    ast.Nonlocal: ("a `nonlocal` statement", "return the value instead"),
    ast.Match: ("a match statement", "use if/elif"),
}
if hasattr(ast, "TryStar"):
    _REFUSED[ast.TryStar] = _REFUSED[ast.Try]


class _Source:
    """Where the function's text lives, to report and compile at the user's own lines."""

    def __init__(self, fn: Callable):
        self.filename = fn.__code__.co_filename
        lines, first = inspect.getsourcelines(fn)
        self.offset = first - 1
        self.text = textwrap.dedent("".join(lines))

    def loc(self, node: ast.AST) -> SourceLoc:
        return SourceLoc(self.filename, getattr(node, "lineno", 0) + self.offset)

    def key(self, node: ast.AST) -> tuple:
        return (self.filename, node.lineno + self.offset, node.col_offset)


# -- small AST builders ----------------------------------------------------------------------

def _load(name: str) -> ast.Name:
    return ast.Name(name, ast.Load())


def _store(name: str) -> ast.Name:
    return ast.Name(name, ast.Store())


def _ct(attr: str) -> ast.Attribute:
    return ast.Attribute(_load(CT), attr, ast.Load())


def _call(func: ast.expr, *args: ast.expr) -> ast.Call:
    return ast.Call(func, list(args), [])


def _const(v) -> ast.Constant:
    return ast.Constant(v)


def _tuple(names, ctx) -> ast.Tuple:
    return ast.Tuple([ast.Name(n, ctx()) for n in names], ctx())


def _assign(name: str, value: ast.expr) -> ast.Assign:
    return ast.Assign([_store(name)], value)


def _def(name: str, params: list[str], body: list[ast.stmt]) -> ast.FunctionDef:
    args = ast.arguments(posonlyargs=[], args=[ast.arg(p) for p in params], vararg=None, kwonlyargs=[],
                         kw_defaults=[], kwarg=None, defaults=[])
    return ast.FunctionDef(name, args, body or [ast.Pass()], [], None, type_params=[]) \
        if "type_params" in ast.FunctionDef._fields else ast.FunctionDef(name, args, body or [ast.Pass()], [], None)


def _not_any(flags) -> ast.expr:
    flags = sorted(flags)
    test = _load(flags[0]) if len(flags) == 1 else ast.BoolOp(ast.Or(), [_load(f) for f in flags])
    return ast.UnaryOp(ast.Not(), test)


def _and(*tests: ast.expr) -> ast.expr:
    tests = [t for t in tests if t is not None]
    return tests[0] if len(tests) == 1 else ast.BoolOp(ast.And(), tests)


# -- name analysis ---------------------------------------------------------------------------

def _walk_scope(node: ast.AST):
    """Nodes of `node` without descending into nested scopes (but yielding them)."""
    todo = list(ast.iter_child_nodes(node))
    while todo:
        n = todo.pop()
        yield n
        if not isinstance(n, _NESTED_SCOPES):
            todo.extend(ast.iter_child_nodes(n))


def _stores(nodes) -> set[str]:
    out = set()
    for node in nodes:
        for n in itertools.chain([node], _walk_scope(node)):
            if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
                out.add(n.id)
            elif isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name):
                out.add(n.value.id)   # `h[i] = v` changes what `h` holds: a loop or branch must carry it
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(n.name)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                out.update((a.asname or a.name).split(".")[0] for a in n.names)
    return out


# Methods that change the object they are called on (Python's containers).
_MUTATING = {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "add", "discard",
             "popitem", "appendleft", "extendleft", "popleft", "sort", "reverse"}


def _mutated(nodes) -> set[str]:
    """Names whose object a method call changes (`outs.append(h)`): a loop or branch must
    carry them too, so that a list growing in a tensor loop is noticed (and refused)."""
    out = set()
    for node in nodes:
        for n in itertools.chain([node], _walk_scope(node)):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _MUTATING \
                    and isinstance(n.func.value, ast.Name):
                out.add(n.func.value.id)
    return out


def _rebound(nodes) -> list[str]:
    """Names assigned a new object (not `x += v`, which updates a tensor in place)."""
    out = set()
    for node in nodes:
        for n in itertools.chain([node], _walk_scope(node)):
            if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
                out.add(n.id)
        for n in itertools.chain([node], _walk_scope(node)):
            if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name) and \
                    not _assigned_elsewhere(nodes, n.target):
                out.discard(n.target.id)
    return sorted(out)


def _assigned_elsewhere(nodes, target: ast.Name) -> bool:
    return any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id == target.id and n is not target
               for node in nodes for n in itertools.chain([node], _walk_scope(node)))


def _updated_in_place(nodes) -> list[str]:
    """Names only written through (`h[i] = v`, `lst.append(v)`), never rebound: after the
    construct they must still be the same object, updated, so that aliases of it see the writes."""
    rebound, written = set(), set()
    for node in nodes:
        for n in itertools.chain([node], _walk_scope(node)):
            if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
                rebound.add(n.id)
            elif isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name):
                written.add(n.value.id)
    return sorted((written | _mutated(nodes)) - rebound)


def _loads(node) -> set[str]:
    """Names read by `node`, nested scopes included (a closure reads its free names)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _uses_kills(stmts) -> tuple[set[str], set[str]]:
    """Upward-exposed uses (read before any write) and definite writes of a block."""
    uses, kills = set(), set()
    for s in stmts:
        u, k = _stmt_uses_kills(s)
        uses |= u - kills
        kills |= k
    return uses, kills


def _stmt_uses_kills(s: ast.stmt) -> tuple[set[str], set[str]]:
    if isinstance(s, ast.If):
        bu, bk = _uses_kills(s.body)
        ou, ok = _uses_kills(s.orelse)
        return _loads(s.test) | bu | ou, bk & ok
    if isinstance(s, ast.While):
        bu, _ = _uses_kills(s.body)
        return _loads(s.test) | bu | _uses_kills(s.orelse)[0], set()
    if isinstance(s, ast.For):
        bu, _ = _uses_kills(s.body)
        return _loads(s.iter) | (bu - _stores([s.target])) | _uses_kills(s.orelse)[0], set()
    if isinstance(s, ast.With):
        bu, bk = _uses_kills(s.body)
        items = set().union(*(_loads(i.context_expr) for i in s.items))
        return items | bu, bk | _stores([i.optional_vars for i in s.items if i.optional_vars])
    if isinstance(s, ast.AugAssign):
        return _loads(s) | _stores([s.target]), _stores([s.target])
    return _loads(s), _stores([s])


def _always_returns(stmts: list[ast.stmt]) -> bool:
    """Whether every path through `stmts` ends in a `return` (or a `raise`)."""
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, (ast.Return, ast.Raise)):
        return True
    if isinstance(last, ast.If):
        return _always_returns(last.body) and _always_returns(last.orelse)
    if isinstance(last, ast.With):
        return _always_returns(last.body)
    return False


# -- pass 1: return / break / continue become flags -----------------------------------------------

class _Jumps:
    def __init__(self, src: _Source):
        self.src = src
        self.ids = itertools.count()

    def function(self, fdef: ast.FunctionDef) -> list[ast.stmt]:
        nested_return = any(isinstance(n, ast.Return) for s in fdef.body
                            if isinstance(s, (ast.If, ast.While, ast.For, ast.With)) for n in _walk_scope(s))
        self.lower_returns = nested_return
        if not nested_return:
            return self.block(fdef.body, None)
        body = [_assign(RET, _call(_ct("undefined"), _const("return value"))), _assign(RET_SET, _const(False))]
        falls_off = not _always_returns(fdef.body)
        body += self.block(fdef.body, None)
        returned = _load(RET_SET) if falls_off else _const(True)
        return body + [ast.Return(_call(_ct("final_return"), _load(RET), returned))]

    def block(self, stmts: list[ast.stmt], loop) -> list[ast.stmt]:
        out = []
        for i, s in enumerate(stmts):
            flags = self.may_set(s, loop)   # before lowering s, which removes its jumps
            out += self.stmt(s, loop)
            if flags:
                rest = self.block(stmts[i + 1:], loop)
                if rest:
                    guard = ast.copy_location(ast.If(_not_any(flags), rest, []), stmts[i + 1])
                    guard.ct_returned = flags == {RET_SET}   # its else path has returned: its variables are dead
                    out.append(guard)
                break
        return out

    def may_set(self, s: ast.stmt, loop) -> set[str]:
        flags = set()
        if self.lower_returns and any(isinstance(n, ast.Return) for n in itertools.chain([s], _walk_scope(s))):
            flags.add(RET_SET)
        if loop is not None:
            flags |= {loop[0] for n in self._own_jumps(s, ast.Break)} | {loop[1] for n in self._own_jumps(s, ast.Continue)}
        return flags

    def _own_jumps(self, s, kind):
        """break/continue statements of the current loop (not of loops nested in it)."""
        if isinstance(s, kind):
            yield s
            return
        if isinstance(s, (ast.While, ast.For) + _NESTED_SCOPES):
            return
        for child in ast.iter_child_nodes(s):
            yield from self._own_jumps(child, kind)

    def stmt(self, s: ast.stmt, loop) -> list[ast.stmt]:
        at = lambda nodes: [ast.copy_location(n, s) for n in nodes]
        if isinstance(s, ast.Return) and self.lower_returns:
            value = s.value if s.value is not None else _const(None)
            return at([_assign(RET, value), _assign(RET_SET, _const(True))])
        if isinstance(s, ast.Break):
            return at([_assign(loop[0], _const(True))])
        if isinstance(s, ast.Continue):
            return at([_assign(loop[1], _const(True))])
        if isinstance(s, ast.If):
            s.body, s.orelse = self.block(s.body, loop), self.block(s.orelse, loop)
            return [s]
        if isinstance(s, ast.With):
            s.body = self.block(s.body, loop)
            return [s]
        if isinstance(s, (ast.While, ast.For)):
            return self.loop(s, loop)
        return [s]

    def loop(self, s, outer) -> list[ast.stmt]:
        n = next(self.ids)
        brk, cont = f"{P}brk_{n}", f"{P}cont_{n}"
        has_break = any(True for c in s.body for _ in self._own_jumps(c, ast.Break))
        has_continue = any(True for c in s.body for _ in self._own_jumps(c, ast.Continue))
        returns = any(isinstance(x, ast.Return) for c in s.body for x in itertools.chain([c], _walk_scope(c)))
        body = self.block(s.body, (brk, cont))
        if has_continue:
            body = [ast.copy_location(_assign(cont, _const(False)), s)] + body
        s.body = body
        flags = ({brk} if has_break else set()) | ({RET_SET} if returns else set())
        stop = _not_any(flags) if flags else None
        if isinstance(s, ast.While):
            s.test = _and(stop, s.test)
        else:
            s.ct_cond = stop      # read by functionalize
            s.ct_returned = flags == {RET_SET}
        orelse, s.orelse = self.block(s.orelse, outer), []
        pre = [ast.copy_location(_assign(brk, _const(False)), s)] if has_break else []
        post = []
        if orelse:
            post = [ast.copy_location(ast.If(_not_any({brk}), orelse, []), s)] if has_break else orelse
        return pre + [s] + post


# -- pass 2: control flow becomes functions and __ct__ calls -------------------------------------

class _Functionalize:
    def __init__(self, src: _Source, local_names: set[str]):
        self.src = src
        self.ids = itertools.count()
        self.local_names = local_names   # the function's own variables (parameters included)

    def _changed(self, nodes) -> set[str]:
        """What a construct changes: names it assigns, and local containers it mutates."""
        return _stores(nodes) | (_mutated(nodes) & self.local_names)

    def block(self, stmts: list[ast.stmt], live_out: set[str]) -> list[ast.stmt]:
        lives, live = [], set(live_out)
        for s in reversed(stmts):
            lives.append(live)
            u, k = _stmt_uses_kills(s)
            live = (live - k) | u
        out = []
        for s, lo in zip(stmts, reversed(lives)):
            out += self.stmt(s, lo)
        return out

    def stmt(self, s: ast.stmt, live_out: set[str]) -> list[ast.stmt]:
        if isinstance(s, ast.If):
            return self.if_(s, live_out)
        if isinstance(s, ast.While):
            return self.while_(s, live_out)
        if isinstance(s, ast.For):
            return self.for_(s, live_out)
        if isinstance(s, ast.With):
            s.body = self.block(s.body, live_out)
        return [s]

    def _state(self, assigned: set[str], needed: set[str]) -> list[str]:
        return sorted(assigned & needed)

    def _emit(self, s, state: list[str], defs: list[ast.stmt], call: ast.Call) -> list[ast.stmt]:
        out = defs + [ast.Assign([_tuple(state, ast.Store)], call) if state else ast.Expr(call)]
        return [ast.fix_missing_locations(ast.copy_location(n, s)) for n in out]

    def if_(self, s: ast.If, live_out: set[str]) -> list[ast.stmt]:
        n = next(self.ids)
        needed = live_out | _uses_kills(s.body)[0] | _uses_kills(s.orelse)[0]
        state = self._state(self._changed(s.body + s.orelse), needed)
        ret = ast.Return(_tuple(state, ast.Load))
        then_fn = _construct_def(f"{P}then_{n}", state, self.block(s.body, set(state)) + [ret])
        else_fn = _construct_def(f"{P}else_{n}", state, self.block(s.orelse, set(state)) + [ret])
        call = _call(_ct("if_stmt"), s.test, _load(then_fn.name), _load(else_fn.name), _tuple(state, ast.Load),
                     _const(tuple(state)), _const(self.src.key(s)), _const(tuple(_updated_in_place(s.body + s.orelse))),
                     _const(getattr(s, "ct_returned", False)))
        return self._emit(s, state, [then_fn, else_fn], call)

    def while_(self, s: ast.While, live_out: set[str]) -> list[ast.stmt]:
        n = next(self.ids)
        needed = live_out | _uses_kills(s.body)[0] | _loads(s.test)
        state = self._state(self._changed(s.body), needed)
        cond_fn = _construct_def(f"{P}cond_{n}", state, [ast.Return(s.test)])
        body_fn = _construct_def(f"{P}body_{n}", state, self.block(s.body, set(state) | _loads(s.test)) +
                       [ast.Return(_tuple(state, ast.Load))])
        call = _call(_ct("while_stmt"), _load(cond_fn.name), _load(body_fn.name), _tuple(state, ast.Load),
                     _const(tuple(state)), _const(self.src.key(s)), _const(tuple(_updated_in_place(s.body))),
                     _const(tuple(_rebound(s.body))))
        return self._emit(s, state, [cond_fn, body_fn], call)

    def for_(self, s: ast.For, live_out: set[str]) -> list[ast.stmt]:
        n = next(self.ids)
        targets = _stores([s.target])
        if targets & live_out:
            raise UnsupportedError(f"the loop variable {', '.join(sorted(targets & live_out))} is read after the loop",
                                   self.src.loc(s), hint="copy it into another variable inside the loop")
        cond = getattr(s, "ct_cond", None)
        needed = live_out | _uses_kills(s.body)[0] | (_loads(cond) if cond is not None else set())
        state = self._state(self._changed(s.body) - targets, needed)
        item = f"{P}item_{n}"
        bind = ast.Assign([s.target], _load(item))
        body_fn = _construct_def(f"{P}body_{n}", [item] + state,
                       [bind] + self.block(s.body, set(state)) + [ast.Return(_tuple(state, ast.Load))])
        defs = [body_fn]
        cond_arg = _const(None)
        if cond is not None:
            cond_fn = _construct_def(f"{P}cond_{n}", state, [ast.Return(cond)])
            defs.append(cond_fn)
            cond_arg = _load(cond_fn.name)
        iterable = s.iter
        if _is_call_of(iterable, "range"):   # len(x) in its bounds: x's length, symbolic where x's is
            iterable = ast.Call(_ct("range_"), [ast.Call(_ct("len_"), a.args, a.keywords) if _is_call_of(a, "len")
                                                else a for a in iterable.args], iterable.keywords)
        call = _call(_ct("for_stmt"), iterable, _load(body_fn.name), cond_arg, _tuple(state, ast.Load),
                     _const(tuple(state)), _const(self.src.key(s)), _const(tuple(_updated_in_place(s.body))),
                     _const(tuple(_rebound(s.body))), _const(getattr(s, "ct_returned", False)))
        return self._emit(s, state, defs, call)


def _is_call_of(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name


def _construct_def(name: str, params: list[str], body: list[ast.stmt]) -> ast.FunctionDef:
    """A construct's branch or body as a function. The names it assigns are its locals:
    they start unassigned, as the converted function's own do, so that a construct nested
    in it can hand them on (`if c: out = f(x) else: out = g(x)` inside a loop body)."""
    fresh = sorted(_stores(body) - set(params))
    init = [_assign(n, _call(_ct("undefined"), _const(n))) for n in fresh]
    return _def(name, params, init + body)


# -- pass 3: expressions -------------------------------------------------------------------------

class _Expressions(ast.NodeTransformer):
    def __init__(self, first_param: str | None):
        self.first_param = first_param

    def visit_BoolOp(self, node: ast.BoolOp):
        self.generic_visit(node)
        fn = "and_" if isinstance(node.op, ast.And) else "or_"
        out = node.values[-1]
        for value in reversed(node.values[:-1]):
            out = _call(_ct(fn), value, ast.Lambda(_def("_", [], []).args, out))
        return ast.copy_location(out, node)

    def visit_UnaryOp(self, node: ast.UnaryOp):
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            return ast.copy_location(_call(_ct("not_"), node.operand), node)
        return node

    def visit_Compare(self, node: ast.Compare):
        """`x is None` / `x is not None` ask the object (a linearized tree's node answers with a tensor)."""
        self.generic_visit(node)
        if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.Is, ast.IsNot)):
            return node
        left, right = node.left, node.comparators[0]
        if isinstance(left, ast.Constant) and left.value is None:
            left, right = right, left
        if not (isinstance(right, ast.Constant) and right.value is None):
            return node
        test = _call(_ct("is_none"), left)
        return ast.copy_location(test if isinstance(node.ops[0], ast.Is) else _call(_ct("not_"), test), node)

    def visit_IfExp(self, node: ast.IfExp):
        self.generic_visit(node)
        no_args = _def("_", [], []).args
        return ast.copy_location(_call(_ct("ifexp"), node.test, ast.Lambda(no_args, node.body),
                                       ast.Lambda(no_args, node.orelse)), node)

    def visit_Raise(self, node: ast.Raise):
        self.generic_visit(node)
        if node.exc is None:
            return node
        return ast.copy_location(ast.Expr(_call(_ct("raise_"), node.exc)), node)

    def visit_Assert(self, node: ast.Assert):
        self.generic_visit(node)
        return ast.copy_location(ast.Expr(_call(_ct("assert_"), node.test, node.msg or _const(None))), node)

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == CT:
            return node
        if isinstance(func, ast.Name) and func.id == "super" and not node.args and self.first_param:
            node.args = [_load("__class__"), _load(self.first_param)]
        return ast.copy_location(ast.Call(_ct("call"), [func] + node.args, node.keywords), node)


# -- putting it together ---------------------------------------------------------------------------

def _refuse_unsupported(src: _Source, fdef: ast.FunctionDef):
    for n in _walk_scope(fdef):
        kind = _REFUSED.get(type(n))
        if kind is not None:
            raise UnsupportedError(f"{kind[0]} is not supported in a compiled function", src.loc(n), hint=kind[1])


def _find_def(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    raise UnsupportedError(f"cannot find the source of function `{name}`")


def convert_ast(fn: Callable) -> tuple[ast.Module, _Source]:
    src = _Source(fn)
    fdef = _find_def(ast.parse(src.text), fn.__name__)
    if isinstance(fdef, ast.AsyncFunctionDef):
        raise UnsupportedError("an async function", src.loc(fdef))
    _refuse_unsupported(src, fdef)
    fdef.decorator_list = []
    fdef.name = f"{P}converted"   # the factory must not shadow the function's own name (recursion)
    params = [a.arg for a in fdef.args.posonlyargs + fdef.args.args + fdef.args.kwonlyargs]
    params += [a.arg for a in (fdef.args.vararg, fdef.args.kwarg) if a is not None]
    body = _Jumps(src).function(fdef)
    local_names = sorted(_stores(body) - set(params))
    body = _Functionalize(src, set(local_names) | set(params)).block(body, set())
    init = [ast.copy_location(_assign(n, _call(_ct("undefined"), _const(n))), fdef) for n in local_names]
    fdef.body = init + body
    fdef = _Expressions(params[0] if params else None).visit(fdef)
    # Close over the original function's free variables through a factory's parameters.
    freevars = list(fn.__code__.co_freevars)
    factory = _def(f"{P}factory", freevars, [fdef, ast.Return(_load(fdef.name))])
    module = ast.Module([factory], [])
    ast.fix_missing_locations(module)
    ast.increment_lineno(module, src.offset)
    return module, src


_CACHE: dict[types.CodeType, Callable] = {}


def convert(fn: types.FunctionType) -> types.FunctionType | None:
    """The converted twin of a plain Python function (None if its source is unavailable)."""
    factory = _CACHE.get(fn.__code__)
    if factory is None:
        try:
            module, src = convert_ast(fn)
        except (OSError, TypeError):
            return None
        namespace = dict(fn.__globals__)
        namespace[CT] = control
        exec(compile(module, src.filename, "exec"), namespace)
        factory = namespace[f"{P}factory"]
        _CACHE[fn.__code__] = factory
    cells = [_cell_value(c) for c in (fn.__closure__ or ())]
    converted = factory(*cells)
    converted.__defaults__ = fn.__defaults__
    converted.__kwdefaults__ = fn.__kwdefaults__
    converted.__wrapped__ = fn
    converted.__name__, converted.__qualname__ = fn.__name__, fn.__qualname__
    return converted


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:
        return control.undefined("<free variable>")
