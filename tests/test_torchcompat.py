"""Canaries: each PyTorch message and private API gradprobe depends on, triggered for real.

A PyTorch upgrade that rewords a message or moves a private API fails here, by name,
instead of silently changing findings (gradprobe/checks/torchcompat.py holds them all).
"""

from __future__ import annotations

import warnings
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from gradprobe.checks import torchcompat as tc


def _error_of(fn) -> str:
    with pytest.raises(Exception) as info:
        fn()
    return str(info.value)


def test_unconnected_loss_message():
    text = _error_of(lambda: torch.zeros(2).sum().backward())
    assert tc.LOSS_NOT_DIFFERENTIABLE.search(text) and tc.LOSS_DOES_NOT_REQUIRE_GRAD in text


def _explained(text: str) -> str:
    return tc.explain_backward_error(text)


def test_inplace_modification_message():
    def run():
        x = torch.ones(3, requires_grad=True)
        h = torch.sigmoid(x)
        h += 1
        h.sum().backward()
    assert "in place after it was used" in _explained(_error_of(run))


def test_second_backward_message():
    def run():
        x = torch.ones(3, requires_grad=True)
        y = (x.exp()).sum()
        y.backward()
        y.backward()
    assert "second time" in _explained(_error_of(run))


def test_leaf_inplace_message():
    def run():
        p = torch.ones(3, requires_grad=True)
        p.add_(1)
    assert "leaf tensor" in _explained(_error_of(run))


def test_inference_tensor_saved_message():
    def run():
        with torch.inference_mode():
            x = torch.ones(3)
        w = torch.ones(3, requires_grad=True)
        (w * x).sum().backward()
    assert "inference_mode" in _explained(_error_of(run))


class _TooFew(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        return x * w

    @staticmethod
    def backward(ctx, g):
        return (g,)


class _BadShape(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, b):
        return x + b

    @staticmethod
    def backward(ctx, g):
        return g, torch.ones(5)  # b has shape [3]


def test_wrong_gradient_count_message():
    text = _error_of(lambda: _TooFew.apply(torch.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)).sum().backward())
    m = tc.WRONG_GRADIENT_COUNT.search(text)
    assert m and (m.group(1), m.group(2)) == ("2", "1")
    assert "different number of gradients" in _explained(text)


def test_wrong_gradient_shape_message():
    x, b = torch.ones(4, 3, requires_grad=True), torch.ones(3, requires_grad=True)
    text = _error_of(lambda: _BadShape.apply(x, b).sum().backward())
    m = tc.WRONG_GRADIENT_SHAPE.search(text)
    assert m and m.group(1) == "1" and m.group(2) == "[5]" and m.group(3) == "[3]"
    assert tc.INVALID_GRADIENT.search(text)
    assert "wrong shape" in _explained(text)


def test_nonleaf_grad_warning():
    w = torch.ones(2, requires_grad=True)
    h = w * 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _ = h.grad
    assert any(tc.NONLEAF_GRAD_WARNING in str(c.message) for c in caught)


def test_reentrant_checkpoint_warning():
    from torch.utils.checkpoint import checkpoint

    lin = nn.Linear(2, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checkpoint(lin, torch.ones(1, 2), use_reentrant=True)
    assert any(tc.CHECKPOINT_NO_INPUT_GRAD_WARNING in str(c.message) for c in caught)


def test_anomaly_forward_trace_warning():
    def run():
        x = torch.ones(3, requires_grad=True)
        h = torch.sigmoid(x)
        h += 1
        h.sum().backward()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autograd.set_detect_anomaly(True):
            _error_of(run)
    traces = [str(c.message) for c in caught if tc.is_anomaly_forward_trace(str(c.message))]
    assert traces
    frames = tc.ANOMALY_FRAME.findall(traces[0])
    assert any(f[0] == __file__ and f[2] == "run" for f in frames)


def test_optimizer_construction_messages():
    p = nn.Parameter(torch.ones(2))
    assert tc.OPTIMIZER_EMPTY in _error_of(lambda: torch.optim.SGD([], lr=0.1))
    assert tc.OPTIMIZER_PARAM_IN_SEVERAL_GROUPS in _error_of(lambda: torch.optim.SGD([{"params": [p]}, {"params": [p]}], lr=0.1))
    assert tc.OPTIMIZER_NON_LEAF in _error_of(lambda: torch.optim.SGD([p * 2], lr=0.1))


def test_missing_super_init_message():
    class Net(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(2, 2)

    assert tc.MISSING_SUPER_INIT.search(_error_of(Net))


def test_gradcheck_error_text():
    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * x

        @staticmethod
        def backward(ctx, g):
            return g  # should be 2 x g

    x = torch.full((3,), 2.0, dtype=torch.float64, requires_grad=True)
    with pytest.raises(tc.GradcheckError) as info:
        torch.autograd.gradcheck(Wrong.apply, (x,), fast_mode=True, raise_exception=True)
    assert "Jacobian mismatch" in str(info.value)


def test_grad_mode_switch_is_seen_by_a_mode():
    seen = []

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Mode():
        with torch.no_grad():
            pass
    assert tc.GRAD_ENABLE in seen


def test_untraced_hides_ops_from_a_mode():
    seen = []

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", ""))
            return func(*args, **(kwargs or {}))

    x = torch.ones(2)
    with Mode():
        with tc.untraced():
            x.exp()
        x.sin()
    assert "sin" in seen and "exp" not in seen


def test_no_grad_decorator_wrapper_is_recognised():
    @torch.no_grad()
    def encode(x):
        return x

    assert tc.is_grad_mode_decorator_frame(encode.__code__)
    assert not tc.is_grad_mode_decorator_frame(test_no_grad_decorator_wrapper_is_recognised.__code__)


def test_multiprocessing_tensor_reducers_exist():
    import torch.multiprocessing

    reducers = tc.multiprocessing_tensor_reducers()
    assert reducers is ForkingPickler._extra_reducers
    assert any(isinstance(c, type) and issubclass(c, torch.Tensor) for c in reducers)


def test_tensor_hooks_are_visible():
    p = nn.Parameter(torch.ones(2))
    assert not tc.tensor_hooks(p)
    p.register_hook(lambda g: g * 0)
    assert len(tc.tensor_hooks(p)) == 1


def test_inplace_detail_names_shape_and_version():
    def run():
        w = torch.ones(2, 3, requires_grad=True)
        y = (w * 2).exp()
        y.mul_(2)  # exp saved its output: version 0 -> 1
        y.sum().backward()
    assert tc.inplace_detail(_error_of(run)) == ([2, 3], 1)


def test_non_scalar_loss_message():
    text = _error_of(lambda: (torch.ones(3, requires_grad=True) * 2).backward())
    assert tc.LOSS_NOT_SCALAR.search(text)


def test_requires_grad_descriptor_and_version_counter():
    p = nn.Parameter(torch.ones(2))
    desc = tc.requires_grad_descriptor()
    assert desc.__get__(p) is True
    desc.__set__(p, False)
    assert p.requires_grad is False
    t = torch.ones(2)
    v = tc.tensor_version(t)
    t.add_(1)
    assert tc.tensor_version(t) == v + 1


def test_custom_function_entry_sees_aliased_apply():
    """Function.apply resolves super().apply through the entry class at call time, so an alias bound before the patch is seen."""
    owner, name, c_apply = tc.custom_function_entry()
    assert name not in owner.__dict__  # torch defines no apply there: the watch adds and removes its own

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return 2 * x

        @staticmethod
        def backward(ctx, g):
            return 2 * g

    double = Double.apply  # bound before the patch, like `square = Square.apply` at import
    seen = []

    def watched(cls, *args):
        seen.append(cls)
        return c_apply.__get__(None, cls)(*args)

    setattr(owner, name, classmethod(watched))
    try:
        y = double(torch.ones(2, requires_grad=True))
    finally:
        delattr(owner, name)
    assert seen == [Double]
    assert tc.function_class_of_node(y.grad_fn) is Double
