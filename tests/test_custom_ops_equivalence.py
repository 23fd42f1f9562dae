"""A custom or fused op against its reference (issue 37 item 4), through the real server: custom Functions checked at
perturbed weights too (a backward exact only while a norm weight is all ones), with tolerances from the dtype they
compute in (a float32 cast inside is no wrong derivative), blaming the input and the line; a module the user marks as
the replacement of another compared on the same weights and inputs (GP804). The examples run in test_examples.py."""

from __future__ import annotations

import textwrap

import pytest
import torch

from conftest import EXAMPLES, line_of, one_finding

RMS = EXAMPLES / "gp401_rmsnorm_backward_drops_weight.py"
RMS_OK = EXAMPLES / "healthy_rmsnorm_function.py"
F32_OK = EXAMPLES / "healthy_float32_internal_function.py"
F32_BAD = EXAMPLES / "gp401_float32_internal_wrong_backward.py"
ATTN = EXAMPLES / "gp804_fused_attention_mask.py"


async def _call(client, tool: str, target: dict, **options) -> dict:
    result = await client.call_tool(tool, {"target": target, **options})
    assert not result.is_error, result.content
    return result.structured_content


def _target(path) -> dict:
    return {"project_dir": str(path.parent), "model": path.name}


@pytest.mark.anyio
async def test_a_backward_exact_only_at_init_is_found_at_perturbed_weights(client):
    """The RMSNorm whose backward drops the weight: exact at the recorded weights (all ones), wrong once they move; the
    finding says so, names the input (its upstream parameters) and the weight, and points at the grad_x line."""
    report = await _call(client, "run_gradcheck", _target(RMS))
    f = one_finding(report["findings"], "GP401")
    assert f["evidence"]["exact_at_recorded_inputs"] is True
    assert "exact at the recorded weights (input 1 (1.norm.weight) all 1)" in f["message"]
    assert "wrong at perturbed weights" in f["message"] and "the gradient of input 0" in f["message"]
    assert [m["input_index"] for m in f["evidence"]["mismatches"]] == [0]
    assert f["location"]["line"] == line_of(RMS, "grad_x = rstd * (grad_out - x_hat")
    fn = report["facts"]["functions"][0]
    assert fn["perturbed"]["result"] == "wrong" and fn["perturbed"]["inputs"][0]["recorded"] == "all 1"
    # diagnose runs the same check on its observed step
    d = await _call(client, "diagnose", _target(RMS))
    assert one_finding(d["findings"], "GP401")["evidence"]["exact_at_recorded_inputs"] is True


@pytest.mark.anyio
async def test_the_correct_twin_says_what_was_verified(client):
    report = await _call(client, "run_gradcheck", _target(RMS_OK))
    assert report["ok"] and not [f for f in report["findings"] if f["code"] == "GP401"]
    fn = report["facts"]["functions"][0]
    assert fn["perturbed"]["result"] == "exact" and fn["perturbed"]["largest_abs_error"] < 1e-6
    (line,) = report["facts"]["verified"]
    assert line.startswith("RMSNormFunction: backward matches finite differences at the recorded inputs and at its "
                           "weight-like inputs perturbed"), line


@pytest.mark.anyio
async def test_float32_inside_sets_the_tolerances_and_a_wrong_one_still_fails(client):
    """A correct SwiGLU computing in float32 inside: measured (GP405 at the cast), checked with eps^(1/3) steps and
    float32 tolerances, no GP401 (a plain float64 gradcheck fails it). The same Function with a wrong derivative: GP401
    at the backward's line."""
    ok = await _call(client, "run_gradcheck", _target(F32_OK))
    assert ok["ok"] and not [f for f in ok["findings"] if f["code"] == "GP401"], ok["findings"]
    info = one_finding(ok["findings"], "GP405")
    assert info["evidence"]["compute_dtype"] == "float32" and info["severity"] == "info"
    assert info["location"]["line"] == line_of(F32_OK, "a32, b32 = a.float(), b.float()")
    eps = torch.finfo(torch.float32).eps
    assert info["evidence"]["step"] == pytest.approx(eps ** (1 / 3))
    assert info["evidence"]["rtol"] < 0.01  # still tight enough to see a wrong derivative
    bad = await _call(client, "run_gradcheck", _target(F32_BAD))
    f = one_finding(bad["findings"], "GP401")
    assert f["location"]["line"] == line_of(F32_BAD, "grad_a = g * b32 * s * (1 + a32 * s)")
    assert f["evidence"]["mismatches"][0]["input_index"] == 0


def test_a_plain_float64_gradcheck_fails_the_correct_float32_function():
    """What the tolerances fix: torch's own gradcheck at its defaults rejects the correct float32-internal Function."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("f32_ok", F32_OK)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    a, b = (torch.randn(3, 16, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert not torch.autograd.gradcheck(mod.SwiGLUFunction.apply, (a, b), raise_exception=False)


@pytest.mark.anyio
async def test_a_fused_module_against_its_reference(client):
    """The fused attention whose mask lets token t see t+1: GP804 naming the module, the mask's line, the output first;
    its twin agrees to float64 rounding, at the recorded and perturbed weights, and says so."""
    option = {"module": f"{ATTN.name}:FusedAttention", "replaces": f"{ATTN.name}:Attention"}
    report = await _call(client, "run_gradcheck", _target(ATTN), reference=option)
    f = one_finding(report["findings"], "GP804")
    assert f["location"]["line"] == line_of(ATTN, ".triu(2)")
    assert f["message"].startswith("attn (FusedAttention) differs from its reference Attention") and "the output" in f["message"]
    assert f["evidence"]["differences"][0]["tensor"] == "the output" and f["evidence"]["state"] == "recorded"
    healthy = EXAMPLES / "healthy_fused_attention_matches_reference.py"
    option = {"module": f"{healthy.name}:FusedAttention", "replaces": f"{healthy.name}:Attention"}
    ok = await _call(client, "run_gradcheck", _target(healthy), reference=option)
    assert ok["ok"] and not [f for f in ok["findings"] if f["code"] == "GP804"]
    (line,) = [v for v in ok["facts"]["verified"] if v.startswith("reference:")]
    comp = ok["facts"]["reference"]["comparisons"][0]
    assert comp["largest_relative_difference"] < 1e-12 and comp["compared"] == 6, comp
    assert "agree at the recorded and perturbed weights" in line


FUSED_PAIR = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d=6, h=12):
        super().__init__()
        self.fc1 = nn.Linear(d, h, bias=False)
        self.bias = nn.Parameter(torch.zeros(h))
        self.fc2 = nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x) + self.bias))


class FusedMLP(MLP):
    """A fused bias-GELU that forgets the bias: equal while the bias is zero."""

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fused = FusedMLP()
        self.ref = MLP()

    def forward(self, x):
        return self.fused(x) + self.ref(x)


def build_model():
    return Net()


def make_inputs():
    return torch.randn(4, 6)
'''


NORM_PAIR = '''
import torch
import torch.nn as nn


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        rstd = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)
        ctx.save_for_backward(x, rstd)
        return x * rstd * weight

    @staticmethod
    def backward(ctx, grad_out):
        x, rstd = ctx.saved_tensors
        x_hat = x * rstd
        grad_x = rstd * (grad_out - x_hat * (grad_out * x_hat).mean(dim=-1, keepdim=True))
        return grad_x, (grad_out * x_hat).reshape(-1, x.shape[-1]).sum(dim=0)


class RMSNorm(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6) * self.weight


class FusedRMSNorm(RMSNorm):
    def forward(self, x):
        return RMSNormFunction.apply(x, self.weight)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(5, 8)
        self.fused = FusedRMSNorm()
        self.ref = RMSNorm()
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        h = self.inp(x)
        return self.out(self.fused(h) + self.ref(h))


def build_model():
    return Net()


def make_inputs():
    return torch.randn(4, 5)
'''


@pytest.mark.anyio
async def test_two_modules_inside_the_model_differ_only_at_perturbed_weights(client, tmp_path):
    """A pair of submodule paths: the reference loads the fused norm's weights; output and gradients equal at init
    (weight all ones), the gradients different at perturbed weights: GP804 at the custom Function's backward, beside
    GP401 for the Function itself."""
    (tmp_path / "pair.py").write_text(NORM_PAIR)
    report = await _call(client, "run_gradcheck", {"project_dir": str(tmp_path), "model": "pair.py"},
                         reference={"module": "fused", "replaces": "ref"})
    f = one_finding(report["findings"], "GP804")
    assert "gives the same output as its reference ref at perturbed weights but different gradients" in f["message"], f
    assert f["evidence"]["state"] == "perturbed" and f["evidence"]["perturbed"][0]["recorded"] == "all 1"
    assert f["evidence"]["differences"][0]["tensor"] == "the gradient of input 0"
    assert f["location"]["function"] == "RMSNormFunction.backward"
    assert one_finding(report["findings"], "GP401")["evidence"]["exact_at_recorded_inputs"] is True


@pytest.mark.anyio
async def test_a_reference_that_cannot_take_the_weights_is_not_run_and_said(client, tmp_path):
    """A reference whose parameters the custom state_dict does not fill: no comparison, no error, the reason in
    not_run (cause user_code); a class reference built from the custom module's attributes; `map` renames keys."""
    src = FUSED_PAIR + textwrap.dedent('''

        class Other(nn.Module):
            def __init__(self, d, h):
                super().__init__()
                self.first = nn.Linear(d, h, bias=False)
                self.shift = nn.Parameter(torch.zeros(h))
                self.second = nn.Linear(h, d)

            def forward(self, x):
                return self.second(F.gelu(self.first(x) + self.shift))


        def rename(sd):
            names = {"fc1.weight": "first.weight", "bias": "shift", "fc2.weight": "second.weight", "fc2.bias": "second.bias"}
            return {names[k]: v for k, v in sd.items()}
        ''')
    src = src.replace("    def __init__(self, d=6, h=12):\n        super().__init__()\n",
                      "    def __init__(self, d=6, h=12):\n        super().__init__()\n        self.d, self.h = d, h\n", 1)
    (tmp_path / "pair.py").write_text(src)
    target = {"project_dir": str(tmp_path), "model": "pair.py"}
    unmapped = await _call(client, "run_gradcheck", target, reference={"module": "ref", "replaces": "pair.py:Other"})
    # nothing was compared: never ok, the verdict says partly checked (the reference could not take the weights)
    assert unmapped["verdict"]["status"] == "partial" and not [f for f in unmapped["findings"] if f["code"] == "GP804"]
    (nr,) = unmapped["facts"]["not_run"]
    assert nr["cause"] == "user_code" and "unfilled" in nr["why"], nr
    mapped = await _call(client, "run_gradcheck", target,
                         reference={"module": "ref", "replaces": "pair.py:Other", "map": "pair.py:rename"})
    assert mapped["ok"] and not mapped["facts"].get("not_run"), mapped["facts"]
    assert mapped["facts"]["reference"]["comparisons"][0]["largest_relative_difference"] < 1e-12
    fused = await _call(client, "run_gradcheck", target,
                        reference={"module": "pair.py:FusedMLP", "replaces": "pair.py:Other", "map": "pair.py:rename"})
    f = one_finding(fused["findings"], "GP804")  # the fused bias-GELU forgets the bias: its gradient is None at once
    assert f["evidence"]["state"] == "recorded" and "the gradient of bias (one is None)" in f["message"], f


def test_custom_ops_run_contract():
    """The comparison module's `run` (what check_equivalence calls)."""
    from gradprobe.checks.equivalence import custom_ops
    from gradprobe.loading import load_target

    out = custom_ops.run(load_target({"project_dir": str(EXAMPLES), "model": RMS.name}), {})
    assert set(out) == {"applies", "why_not", "findings", "verified", "not_run", "facts"}
    assert out["applies"] and "GP401" in [f["code"] for f in out["findings"]] and out["verified"] == []
    ok = custom_ops.run(load_target({"project_dir": str(EXAMPLES), "model": RMS_OK.name}), {})
    assert ok["verified"] and not [f for f in ok["findings"] if f["severity"] == "error"]
    none = custom_ops.run(load_target({"project_dir": str(EXAMPLES), "model": "healthy_cnn.py"}), {})
    assert not none["applies"] and none["why_not"]


class _RMS(torch.autograd.Function):
    """RMSNorm whose backward drops the weight (as the example), for the library-level checks below."""

    @staticmethod
    def forward(ctx, x, w):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        ctx.save_for_backward(x, rstd)
        return x * rstd * w

    @staticmethod
    def backward(ctx, g):
        x, rstd = ctx.saved_tensors
        xh = x * rstd
        return rstd * (g - xh * (g * xh).mean(-1, keepdim=True)), (g * xh).reshape(-1, x.shape[-1]).sum(0)


class _Divide(torch.autograd.Function):
    """x / w with a correct backward: defined only while no element of w is zero."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x / w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g / w, (-g * x / (w * w)).sum(0)


def test_perturbed_check_in_fast_mode_and_signs_kept():
    """Too large for full Jacobians: the perturbed check compares random projections (`perturbed_fast`). A weight of
    one sign moves multiplicatively: a division by 96 weights of 1 never meets a zero (additive noise of 0.5 would put
    one within reach of zero about every other time), so a correct one stays clean."""
    from gradprobe.checks.gradcheck.engine import check_function

    torch.manual_seed(0)
    x = torch.randn(64, 128, requires_grad=True)
    found, info = check_function(_RMS, (x, torch.ones(128, requires_grad=True)), {1: ["norm.weight"]}, weights_at=[1],
                                 fast_mode=True)
    f = one_finding(found, "GP401")
    assert "disagrees with finite differences at perturbed weights" in f["message"] and info["mode"].startswith("fast")
    x = torch.randn(2, 96, requires_grad=True)
    found, info = check_function(_Divide, (x, torch.ones(96, requires_grad=True)), {1: ["scale"]}, weights_at=[1])
    assert not [f for f in found if f["severity"] == "error"], found
    assert info["perturbed"]["result"] == "exact" and "sign kept" in info["perturbed"]["inputs"][0]["perturbed_by"]


@pytest.mark.anyio
async def test_check_equivalence_runs_the_custom_op_and_storage_comparisons(client):
    """check_equivalence holds all five comparisons: on a build_model() target the custom Functions at perturbed
    weights (GP401) and a fused module named in `reference` (GP804) are found, and storage is said as verified."""
    rms = await _call(client, "check_equivalence", _target(RMS))
    f = one_finding(rms["findings"], "GP401")
    assert "wrong at perturbed weights" in f["message"], f
    assert any(v.startswith("storage:") for v in rms["facts"]["verified"]), rms["facts"]["verified"]
    option = {"module": f"{ATTN.name}:FusedAttention", "replaces": f"{ATTN.name}:Attention"}
    attn = await _call(client, "check_equivalence", _target(ATTN), reference=option)
    assert one_finding(attn["findings"], "GP804")["location"]["line"] == line_of(ATTN, ".triu(2)")
    ok = await _call(client, "check_equivalence", _target(RMS_OK))
    assert ok["ok"] and not [f for f in ok["findings"] if f["severity"] == "error"], ok["findings"]
    assert any("perturbed" in v for v in ok["facts"]["verified"]), ok["facts"]["verified"]
