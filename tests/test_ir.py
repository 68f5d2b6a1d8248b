"""The IR: verifier rules, printer text, reference semantics, DCE and the traced graph."""
import pytest
import torch

import cocktailer
from cocktailer.ir import (BOOL, INDEX, Function, Op, Operation, Program, Region, TensorType, Value,
                           VerifyError, format_program, verify)
from cocktailer.passes.dce import dce
from cocktailer.reference import ReferenceExecutor
from cocktailer.reference.trace import traced_graph

F32_4 = TensorType((4,), torch.float32)


def program_of(body: Region, functions=()) -> Program:
    return Program({"main": Function("main", body), **{f.name: f for f in functions}}, "main", {},
                   torch.device("cpu"))


def op(kind, operands, result_types, regions=(), **attrs):
    return Operation(kind, list(operands), [Value(t) for t in result_types], attrs, list(regions))


def counting_loop() -> Program:
    """main(x, n): for i in range(n): x = x + 1.0"""
    x, n = Value(F32_4), Value(INDEX)
    i, c = Value(INDEX), Value(F32_4)
    one = op(Op.SCALAR, [], [TensorType((), torch.float32)], value=1.0, dtype=torch.float32)
    add = op(Op.ADD, [c, one.results[0]], [F32_4])
    body = Region([i, c], [add], [add.results[0]])
    loop = op(Op.LOOP, [n, x], [F32_4], [body], has_trip=True, has_cond=False)
    return program_of(Region([x, n], [one, loop], [loop.results[0]]))


def test_verifier_accepts_and_reference_runs_a_loop():
    prog = verify(counting_loop())
    out = ReferenceExecutor(prog)([torch.zeros(4), torch.tensor(3)])
    assert torch.equal(out[0], torch.full((4,), 3.0))
    assert torch.equal(ReferenceExecutor(prog)([torch.zeros(4), torch.tensor(0)])[0], torch.zeros(4))


def test_printer_shows_loop_structure():
    text = format_program(counting_loop())
    lines = text.splitlines()
    assert lines[0].startswith("func @main(") and lines[0].endswith("-> (f32[4]) {")
    assert any(l.strip().startswith("%") and "= loop trip=%" in l and "carry(%" in l for l in lines)
    assert any(l.strip().startswith("^(%") and "i64[]" in l for l in lines)
    assert any(l.strip().startswith("yield %") for l in lines)
    assert lines[-2].strip().startswith("return %") and lines[-1] == "}"


def test_verifier_rejects_type_mismatch():
    x = Value(F32_4)
    bad = op(Op.NEG, [x], [TensorType((5,), torch.float32)])
    with pytest.raises(VerifyError, match="result type f32\\[5\\] but the op computes f32\\[4\\]"):
        verify(program_of(Region([x], [bad], [bad.results[0]])))


def test_verifier_rejects_use_before_definition():
    x, ghost = Value(F32_4), Value(F32_4)
    add = op(Op.ADD, [x, ghost], [F32_4])
    with pytest.raises(VerifyError, match="not visible"):
        verify(program_of(Region([x], [add], [add.results[0]])))


def test_verifier_rejects_value_escaping_a_branch():
    x, c = Value(F32_4), Value(BOOL)
    inner = op(Op.NEG, [x], [F32_4])
    branch = op(Op.IF, [c], [F32_4], [Region([], [inner], [inner.results[0]]), Region([], [], [x])])
    leak = op(Op.EXP, [inner.results[0]], [F32_4])
    with pytest.raises(VerifyError, match="not visible"):
        verify(program_of(Region([x, c], [branch, leak], [leak.results[0]])))


def test_verifier_rejects_branch_type_mismatch():
    x, c = Value(F32_4), Value(BOOL)
    other = op(Op.FULL, [], [TensorType((3,), torch.float32)], shape=(3,), value=0, dtype=torch.float32)
    branch = op(Op.IF, [c], [F32_4], [Region([], [], [x]), Region([], [other], [other.results[0]])])
    with pytest.raises(VerifyError, match="branch yields"):
        verify(program_of(Region([x, c], [branch], [branch.results[0]])))


def test_verifier_rejects_non_bool_condition():
    x = Value(F32_4)
    cond = Value(TensorType((), torch.float32))
    branch = op(Op.IF, [cond], [F32_4], [Region([], [], [x]), Region([], [], [x])])
    with pytest.raises(VerifyError, match="bool"):
        verify(program_of(Region([x, cond], [branch], [branch.results[0]])))


def test_verifier_rejects_call_of_unknown_function_and_bad_arity():
    x = Value(F32_4)
    call = op(Op.CALL, [x], [F32_4], callee="nowhere")
    with pytest.raises(VerifyError, match="unknown function"):
        verify(program_of(Region([x], [call], [call.results[0]])))
    add = op(Op.ADD, [x], [F32_4])
    with pytest.raises(VerifyError, match="expects 2 operands"):
        verify(program_of(Region([x], [add], [add.results[0]])))


def test_verifier_rejects_recursive_call_with_wrong_types():
    p = Value(F32_4)
    callee = Function("f", Region([p], [], [p]))
    x = Value(TensorType((4,), torch.float64))
    call = op(Op.CALL, [x], [F32_4], callee="f")
    with pytest.raises(VerifyError, match="arguments vs @f"):
        verify(program_of(Region([x], [call], [call.results[0]]), [callee]))


def test_dce_removes_unused_ops_including_control_flow():
    prog = counting_loop()
    x = prog.main.params[0]
    dead = op(Op.EXP, [x], [F32_4])
    prog.main.body.ops.insert(0, dead)
    prog.main.body.yields = [x]
    dce(prog)
    assert prog.main.body.ops == []


def test_dce_removes_a_function_whose_calls_were_dead():
    """Rendered, a function nothing calls is code nothing jumps to (nvcc warned of its frame
    pointer, set and never read)."""
    p = Value(F32_4)
    callee = Function("f", Region([p], [op(Op.EXP, [p], [F32_4])], []))
    callee.body.yields = [callee.body.ops[0].results[0]]
    x = Value(F32_4)
    call = op(Op.CALL, [x], [F32_4], callee="f")
    prog = program_of(Region([x], [call], [x]), [callee])
    dce(prog)
    assert list(prog.functions) == [prog.entry] and prog.main.body.ops == []


def test_every_op_has_reference_semantics_or_is_control_flow():
    from cocktailer.ir.ops import CONTROL, SEMANTICS
    missing = [o for o in Op if o not in SEMANTICS and o not in CONTROL and o is not Op.CONST]
    assert missing == []


def test_select_and_update_with_dynamic_index_match_torch():
    from cocktailer.ir.ops import SEMANTICS
    x, v, i = torch.randn(2, 5, 3), torch.randn(2, 3), torch.tensor(4)
    key = (("slice", None, None, None), ("dyn",))
    assert torch.equal(SEMANTICS[Op.SELECT](x, i, key=key), x[:, 4])
    expected = x.clone()
    expected[:, 4] = v
    assert torch.equal(SEMANTICS[Op.UPDATE](x, v, i, key=key), expected)
    assert torch.equal(x, x.clone())   # UPDATE did not write into its operand


def test_traced_graph_has_no_control_flow_and_same_result():
    def model(x, n):
        for i in range(n):
            if x.sum() > 0:
                x = x - 1.5
            else:
                x = x * 2 + 1
        return x
    x, n = torch.randn(4), torch.tensor(5)
    prog = cocktailer.capture(model, (x, n))
    traced = verify(traced_graph(prog, [x, n]))
    assert not any(o.op in (Op.IF, Op.LOOP, Op.CALL) for o in traced.walk())
    assert torch.allclose(ReferenceExecutor(traced)([x, n])[0], model(x, n))
    fast = cocktailer.compile_traced(model, (x, n))
    assert torch.allclose(fast(x, n), model(x, n))


def test_capture_prints_loops_branches_and_calls():
    class Tree(torch.nn.Module):
        def forward(self, left, right, is_leaf, inp, root):
            if is_leaf[root]:
                return inp[root]
            return self.forward(left, right, is_leaf, inp, left[root]) + \
                self.forward(left, right, is_leaf, inp, right[root])
    left, right = torch.tensor([1, -1, -1]), torch.tensor([2, -1, -1])
    args = (left, right, torch.tensor([False, True, True]), torch.randn(3, 2), torch.tensor(0))
    text = str(cocktailer.capture(Tree(), args))
    assert "func @main" in text and "func @forward" in text
    assert text.count("call @forward") == 3   # main calls it once, it calls itself twice
    assert " if %" in text


def test_type_inference_shortcuts_agree_with_torch_meta_kernels():
    """Elementwise ops, reductions and CAT infer their types without meta tensors (whose
    Python kernels import torch._dynamo): the same types, and errors where torch has them."""
    from cocktailer.ir.infer import _SHORTCUTS, infer_type
    from cocktailer.ir.ops import BINARY, CREATION, REDUCE, UNARY
    dtypes = [torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool]
    shapes = [(), (1,), (3,), (2, 3), (2, 1, 3), (4, 1), (0, 3)]

    def meta(op, types, attrs):
        return TensorType.of(cocktailer.ir.SEMANTICS[op](*(t.meta() for t in types), **attrs))

    def same(op, types, attrs):
        try:
            expected = meta(op, types, attrs)
        except Exception:
            expected = None
        try:
            got = infer_type(op, types, attrs)
        except Exception:
            got = None
        assert got == expected, (op, types, attrs)
    cases = []
    for a in dtypes:
        for sa in shapes:
            cases += [(op, [TensorType(sa, a)], {"dtype": torch.float64} if op is Op.CAST else {})
                      for op in UNARY - {Op.NOT}]
            cases.append((Op.NOT, [TensorType(sa, torch.bool)], {}))
            for b in (torch.float32, torch.int64, torch.bool):
                for sb in ((), (3,), (2, 1, 3)):
                    if sa in shapes[::2]:
                        cases += [(op, [TensorType(sa, a), TensorType(sb, b)], {}) for op in BINARY]
            for dims in (None, (0,), (-1,), (0, 1), (5,)):
                for keepdim in (False, True):
                    cases += [(op, [TensorType(sa, a)], {"dims": dims, "keepdim": keepdim})
                              for op in REDUCE - {Op.ARGMAX, Op.ARGMIN}]
            for dim in (None, 0, -1, 3):
                cases += [(op, [TensorType(sa, a)], {"dim": dim, "keepdim": dim == 0}) for op in (Op.ARGMAX, Op.ARGMIN)]
            for sb in shapes:
                cases.append((Op.CAT, [TensorType(sa, a), TensorType(sb, a)], {"dim": -1}))
    cases.append((Op.WHERE, [TensorType((2, 1), torch.bool), TensorType((3,), torch.int64),
                             TensorType((), torch.float32)], {}))
    assert {op for op, _, _ in cases} >= set(_SHORTCUTS) - CREATION
    for case in cases:
        same(*case)


def test_remembered_types_tell_equal_attributes_of_other_types_apart():
    """Type inference remembers what it inferred, by value: 1, 1.0 and True are equal keys in
    Python but give a full tensor three dtypes, and a list attribute is not remembered at all."""
    from cocktailer.ir.infer import infer_type
    fulls = [infer_type(Op.FULL, [], {"shape": (2,), "value": v, "dtype": None}) for v in (1, 1.0, True, 1)]
    assert [t.dtype for t in fulls] == [torch.int64, torch.float32, torch.bool, torch.int64]
    shaped = [infer_type(Op.FULL, [], {"shape": s, "value": 0.0, "dtype": None}) for s in ((2, 3), [2, 3], (3, 2))]
    assert [t.shape for t in shaped] == [(2, 3), (2, 3), (3, 2)]
