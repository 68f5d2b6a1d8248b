"""Unsupported constructs raise UnsupportedError naming the user's file and line, and the
construct, with a hint; the compiler's own files never appear in the message."""
import os

import pytest
import torch
import torch.nn as nn

import cocktailer
from cocktailer import UnsupportedError

COMPILER_DIR = os.path.dirname(cocktailer.__file__)
THIS_FILE = os.path.basename(__file__)


def _line_of(fn, text):
    import inspect
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _capture_error(fn, *inputs) -> UnsupportedError:
    with pytest.raises(UnsupportedError) as info:
        cocktailer.capture(fn, inputs)
    message = str(info.value)
    assert THIS_FILE in message
    assert COMPILER_DIR not in message, message
    assert "hint:" in message
    return info.value


def uses_try(x):
    try:
        return x + 1
    except RuntimeError:
        return x


def uses_generator(x):
    yield x * 2


def uses_unknown_op(x):
    y = x * 2
    return torch.fft.fft(y)


def uses_bool_mask(x):
    return x[x > 0]


def uses_global(x):
    global _COUNTER
    _COUNTER = 1
    return x


def appends_in_tensor_loop(x, n):
    outs = []
    for i in range(n):
        outs.append(x * i)
    return torch.stack(outs)


def changes_shape_in_loop(x):
    while x.sum() < 100:
        x = torch.cat([x, x])
    return x


def raises_in_branch(x):
    if x.sum() > 0:
        raise ValueError("positive")
    return x


def test_try_except():
    err = _capture_error(uses_try, torch.ones(3))
    assert "try/except" in str(err) and err.loc.lineno == _line_of(uses_try, "try:")


def test_generator():
    err = _capture_error(uses_generator, torch.ones(3))
    assert "generator" in str(err) and err.loc.lineno == _line_of(uses_generator, "yield")


def test_unknown_op():
    err = _capture_error(uses_unknown_op, torch.ones(4))
    assert "torch.fft" in str(err) or "fft" in str(err)
    assert err.loc.lineno == _line_of(uses_unknown_op, "torch.fft.fft")


def test_data_dependent_shape():
    err = _capture_error(uses_bool_mask, torch.randn(5))
    assert "mask" in str(err) and err.loc.lineno == _line_of(uses_bool_mask, "x[x > 0]")


def test_global_statement():
    err = _capture_error(uses_global, torch.ones(2))
    assert "global" in str(err)


def test_list_append_in_loop_with_tensor_trip_count():
    err = _capture_error(appends_in_tensor_loop, torch.ones(2), torch.tensor(3))
    assert "list" in str(err)


def test_loop_carried_shape_change():
    err = _capture_error(changes_shape_in_loop, torch.ones(2))
    assert "f32[2]" in str(err) and "f32[4]" in str(err)


def test_raise_in_tensor_branch():
    err = _capture_error(raises_in_branch, torch.ones(2))
    assert "raise" in str(err) and err.loc.lineno == _line_of(raises_in_branch, "raise ValueError")


def test_raise_on_python_condition_is_the_users_error():
    def check(x, flag: bool):
        if flag:
            raise ValueError("user said no")
        return x
    with pytest.raises(ValueError, match="user said no"):
        cocktailer.capture(check, (torch.ones(2), True))


def test_an_index_past_a_size_the_capture_knows_is_the_users_index_error():
    """x[2] of a 1-row x (a size of 1 is always compiled for itself) fails as eager does, with
    torch's IndexError, not as a bug in cocktailer."""
    def second(x):
        return x[2] * 2
    fast = cocktailer.compile(second, (torch.ones(5, 3),))
    with pytest.raises(IndexError, match="index 2 is out of bounds for dimension 0 with size 1"):
        second(torch.ones(1, 3))
    with pytest.raises(IndexError, match="index 2 is out of bounds for dimension 0 with size 1"):
        fast(torch.ones(1, 3))


def test_list_append_with_python_trip_count_is_unrolled():
    def f(x):
        outs = []
        for i in range(3):
            outs.append(x * i)
        return torch.stack(outs)
    x = torch.randn(4)
    assert torch.equal(cocktailer.compile(f, (x,))(x), f(x))
    assert "loop" not in str(cocktailer.capture(f, (x,)))


def test_training_mode_refused():
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)).train()
    err = _capture_error(model, torch.ones(1, 3))
    assert "eval()" in str(err)


def test_grad_falls_back_to_eager_with_one_warning():
    model = nn.Linear(3, 2)   # parameters require grad
    x = torch.randn(4, 3)
    fast = cocktailer.compile(model)
    with pytest.warns(cocktailer.GradFallbackWarning):
        y = fast(x)
    assert y.requires_grad
    y.sum().backward()
    assert model.weight.grad is not None
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fast(x)                      # warned once only
        with torch.no_grad():
            assert torch.allclose(fast(x), model(x))


def test_unknown_backend():
    with pytest.raises(ValueError, match="available"):
        cocktailer.compile(lambda x: x, backend="tpu")


def test_inputs_on_several_devices():
    meta = torch.empty(2, device="meta")
    with pytest.raises(UnsupportedError, match="several devices"):
        cocktailer.capture(lambda a, b: a + b, (torch.ones(2), meta))


def fails_on_the_path_not_taken(x):
    if x.sum() > 0:
        return x + 1
    return x + name_that_does_not_exist   # noqa: F821 (eager never gets here for positive inputs)


def test_user_code_failing_on_a_traced_path_is_an_error_at_its_line():
    err = _capture_error(fails_on_the_path_not_taken, torch.ones(3))
    assert "NameError" in str(err) and err.loc.lineno == _line_of(fails_on_the_path_not_taken, "name_that_does_not")


def test_a_failure_of_cocktailer_itself_says_so_at_the_users_line(monkeypatch):
    from cocktailer.frontend import lowering

    def broken(L, x, *args, **kwargs):   # fails inside cocktailer's own code (a KeyError in the tracer)
        return L.t.const_tensor(object())
    monkeypatch.setitem(lowering._BY_NAME, "tanh", broken)

    def f(x):
        return torch.tanh(x) * 2
    with pytest.raises(cocktailer.InternalError, match="bug in cocktailer") as info:
        cocktailer.capture(f, (torch.ones(2),))
    assert THIS_FILE in str(info.value) and "KeyError" in str(info.value)
