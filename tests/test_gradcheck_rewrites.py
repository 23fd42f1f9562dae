"""Custom Functions judged by what they compute (issue 16): intentional gradient rewrites are info, wrong derivatives
are GP401 at the line that computes them, and aliases of apply are seen. Real torch Functions, the library in-process;
the same classes run through the real MCP server in the examples (gp401_*, healthy_gradient_reversal, ...)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn as nn

from gradprobe.checks import inspect_parameters, run_gradcheck
from gradprobe.checks.gradcheck.engine import check_function

C = math.sqrt(2.0 / math.pi)


class Reverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return -ctx.alpha * g, None


class Scale(torch.autograd.Function):  # identity forward, gradient x 0.1 (no scalar argument: the pass-through says it)
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return 0.1 * g


class RoundSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, g):
        return g


class IgnoresInput(torch.autograd.Function):  # the output does not depend on x at all, yet backward says it does
    @staticmethod
    def forward(ctx, x):
        return torch.zeros_like(x) + 1.0

    @staticmethod
    def backward(ctx, g):
        return g


class ExpNegSignBug(torch.autograd.Function):  # d/dx exp(-x) = -exp(-x): a dropped sign is -1 x the truth, a bug
    @staticmethod
    def forward(ctx, x):
        y = torch.exp(-x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y


class CubeWrongPower(torch.autograd.Function):  # 2x instead of 3x^2: element-dependent
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2 * x


class GeluBugInner(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        return 0.5 * z * (1.0 + torch.tanh(C * (z + 0.044715 * z.pow(3))))

    @staticmethod
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        t = torch.tanh(C * (z + 0.044715 * z.pow(3)))
        d_inner = C * (1.0 + 0.044715 * z.pow(2))  # BUG-INNER: the factor 3 is missing
        d = 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * d_inner
        return g * d


class GeluBugOuter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        return 0.5 * z * (1.0 + torch.tanh(C * (z + 0.044715 * z.pow(3))))

    @staticmethod
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        t = torch.tanh(C * (z + 0.044715 * z.pow(3)))
        d_inner = C * (1.0 + 3 * 0.044715 * z.pow(2))
        d = 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t) * d_inner  # BUG-OUTER: sech^2 written as 1 - t
        return g * d


def _line_of(cls, marker: str) -> int:
    lines, start = inspect.getsourcelines(cls.backward)
    return start + next(i for i, line in enumerate(lines) if marker in line)


def _check(cls, *inputs, fast=None):
    findings, _ = check_function(cls, inputs, {}, None, fast_mode=fast)
    return [f for f in findings if f["code"] in ("GP401", "GP409")]


@pytest.mark.parametrize("fast", [False, True], ids=["full", "projections"])
@pytest.mark.parametrize(("cls", "args", "kind"), [
    (Reverse, (0.5,), "reversal"), (Scale, (), "scaling"), (RoundSTE, (), "surrogate")])
def test_intentional_rewrites_are_info_saying_what_they_are(cls, args, kind, fast):
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    found = _check(cls, x, *args, fast=fast)
    assert [(f["code"], f["severity"]) for f in found] == [("GP409", "info")], found
    assert found[0]["evidence"]["rewrite"] == kind
    if kind == "reversal":
        assert found[0]["evidence"]["factor"] == pytest.approx(-0.5)
        assert "gradient reversal" in found[0]["message"]


@pytest.mark.parametrize("fast", [False, True], ids=["full", "projections"])
@pytest.mark.parametrize("cls", [IgnoresInput, ExpNegSignBug, CubeWrongPower])
def test_wrong_derivatives_stay_errors(cls, fast):
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    found = _check(cls, x, fast=fast)
    assert [(f["code"], f["severity"]) for f in found] == [("GP401", "error")], found


def test_a_uniform_factor_on_a_real_derivative_is_an_error_that_says_so():
    found = _check(ExpNegSignBug, torch.randn(5, dtype=torch.float64, requires_grad=True))
    assert found[0]["severity"] == "error"
    assert found[0]["evidence"]["uniform_factor"] == pytest.approx(-1.0)


@pytest.mark.parametrize("fast", [False, True], ids=["full", "projections"])
@pytest.mark.parametrize(("cls", "marker"), [(GeluBugInner, "BUG-INNER"), (GeluBugOuter, "BUG-OUTER")])
def test_gp401_points_at_the_line_that_computes_the_wrong_value(cls, marker, fast):
    z = (2 * torch.randn(3, 5, dtype=torch.float64)).requires_grad_()
    found = _check(cls, z, fast=fast)
    assert found and found[0]["severity"] == "error"
    assert found[0]["location"]["line"] == _line_of(cls, marker)


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3  # wrong on purpose: backward below says 2x

    @staticmethod
    def backward(ctx, g):
        return g * 2


square = _Square.apply  # bound before any watch is entered


class _AliasNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return square(self.lin(x)).sum()


def test_an_alias_of_apply_is_checked_and_is_no_direct_forward_call():
    report = run_gradcheck(_AliasNet(), torch.randn(2, 3), function="_Square")
    codes = {f["code"] for f in report["findings"] if f["severity"] == "error"}
    assert "GP406" not in codes
    gp401 = [f for f in report["findings"] if f["code"] == "GP401"]
    assert gp401 and {"lin.weight", "lin.bias"} <= set(gp401[0]["parameters"])  # the parameters behind the wrong input


class _CausalAttention(nn.Module):
    def __init__(self, n=6, d=4):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.register_buffer("bias", torch.tril(torch.ones(n, n)).view(1, 1, n, n))  # nanoGPT's causal mask

    def forward(self, x):
        return self.qkv(x)


class _WeightAsBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("weight", torch.randn(4, 4))


class _FixedBetaAct(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("beta", torch.tensor(0.5))  # a fixed constant of the activation


def test_gp104_is_quiet_about_a_causal_mask_named_bias_but_not_about_a_weight_buffer():
    assert not [f for f in inspect_parameters(_CausalAttention())["findings"] if f["code"] == "GP104"]
    assert not [f for f in inspect_parameters(_FixedBetaAct())["findings"] if f["code"] == "GP104"]
    assert [f for f in inspect_parameters(_WeightAsBuffer())["findings"] if f["code"] == "GP104"]


def test_gp108_does_not_say_trained_about_a_frozen_tie():
    m = nn.Module()
    m.emb = nn.Embedding(5, 3)
    m.head = nn.Linear(3, 5, bias=False)
    m.head.weight = m.emb.weight
    m.requires_grad_(False)
    (f,) = [f for f in inspect_parameters(m)["findings"] if f["code"] == "GP108"]
    assert "trained" not in f["message"] and "frozen" in f["message"]
