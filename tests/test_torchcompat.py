"""Canaries: each PyTorch message and private API gradprobe depends on, triggered for real.

A PyTorch upgrade that rewords a message or moves a private API fails here, by name,
instead of silently changing findings (gradprobe/checks/core/torchcompat.py holds them all).
"""

from __future__ import annotations

import warnings
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from gradprobe.checks.core import torchcompat as tc


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


_ALLOCATION_UNDER_RLIMIT = r"""
import json, resource, sys, torch
from gradprobe.checks.core import torchcompat as tc

# what the sandbox does on CPU: cap the address space (here 1 GiB above what the interpreter holds now)
vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + 2**30, resource.RLIM_INFINITY))
out = []
for make in (lambda: torch.empty(2**30, dtype=torch.float32),       # 4 GiB in one tensor
             lambda: torch.ones(2**15, 2**15) @ torch.ones(2**15, 2**15),  # an op's output
             lambda: bytearray(2**32)):                             # Python's own MemoryError
    try:
        make()
        out.append({"raised": None})
    except Exception as exc:
        out.append({"raised": type(exc).__name__, "text": str(exc), "facts": tc.allocation_failure(exc)})
json.dump(out, sys.stdout)
"""


def test_allocation_failure_under_a_lowered_address_space_limit():
    """The CPU allocator's message under RLIMIT_AS (what the sandbox applies on CPU), and Python's MemoryError."""
    import json
    import os
    import subprocess
    import sys

    from conftest import ROOT

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _ALLOCATION_UNDER_RLIMIT], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    tensor, matmul, plain = json.loads(done.stdout)
    assert tensor["raised"] == "RuntimeError" and tc.ALLOCATION_FAILURE.search(tensor["text"]), tensor
    assert tensor["facts"]["device"] == "cpu" and tensor["facts"]["requested_bytes"] == 2**32, tensor
    assert matmul["raised"] == "RuntimeError" and matmul["facts"]["requested_bytes"] == 2**32, matmul
    assert plain["raised"] == "MemoryError" and plain["facts"]["device"] == "python", plain


def test_allocation_failure_is_recognised_through_a_reraise_and_nothing_else_is():
    def reraised():
        try:
            torch.empty(2**62)  # an overflowing size is a user's error, not an allocation failure
        except RuntimeError as exc:
            assert tc.allocation_failure(exc) is None
        try:
            raise MemoryError()
        except MemoryError as exc:
            raise ValueError("the library wrapped it") from exc

    with pytest.raises(ValueError) as info:
        reraised()
    assert tc.allocation_failure(info.value)["exception"] == "MemoryError"
    assert tc.allocation_failure(RuntimeError("element 0 of tensors does not require grad")) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine (the CUDA allocator's message)")
def test_cuda_out_of_memory_message():
    with pytest.raises(Exception) as info:
        torch.empty(2**42, device="cuda")  # 16 TiB
    facts = tc.allocation_failure(info.value)
    assert facts is not None and facts["device"] == "cuda" and tc.ALLOCATION_FAILURE.search(str(info.value)), str(info.value)
    assert facts.get("requested"), str(info.value)
