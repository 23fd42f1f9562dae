"""audit_training's additions through the real server over stdio: GradScaler order (GP615) and skipped steps (GP617),
overfit one batch (GP616), a group's update ratio far off (GP618), the measured all-clear's accumulation and EMA
numbers, the per-group chart, and `diagnose` with `steps` (GP6xx merged; an EMA teacher outside the optimizer that its
EMA moves at every step is no GP201). The examples themselves are also run by test_examples.py.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys

import pytest

from conftest import EXAMPLES, ROOT, assert_verdict


async def call(client, tool: str, name: str, **options) -> tuple[dict, list]:
    result = await client.call_tool(tool, {"target": {"project_dir": str(EXAMPLES), "model": name}, **options})
    assert not result.is_error, result.content
    assert_verdict(result.structured_content, name)
    return result.structured_content, [c for c in result.content if getattr(c, "type", "") == "image"]


def svg_of(image) -> str:
    assert image.mime_type == "image/svg+xml"
    return base64.b64decode(image.data).decode()


@pytest.mark.anyio
async def test_clipping_before_unscale_is_measured_and_the_healthy_order_is_verified(client):
    report, _ = await call(client, "audit_training", "gp615_clip_before_unscale.py", steps=3)
    f = next(f for f in report["findings"] if f["code"] == "GP615")
    assert f["location"]["line"] == 33 and f["evidence"]["scale"] == 1024.0
    assert "still multiplied by the GradScaler's scale (1024)" in f["message"] and "3 of the 3" in f["message"]
    assert "scaler.unscale_(optimizer)" in f["fix"] and "gp615_clip_before_unscale.py:33" in f["fix"]
    healthy, images = await call(client, "audit_training", "healthy_steps_amp_unscale_then_clip.py", steps=3,
                                 overfit_steps=20)
    assert healthy["ok"] and not healthy["findings"], healthy["findings"]
    assert any(v.startswith("GradScaler: scale 1.02e+03, 0 of 3") for v in healthy["facts"]["verified"])
    assert healthy["facts"]["overfit_one_batch"]["trend"]["loss"] == "down"
    assert "Overfit one batch: over 20 steps on one fixed batch the loss went down" in healthy["summary"]
    (chart,) = images
    svg = svg_of(chart)
    assert svg.startswith("<svg") and "update/weight" in svg and "group 0" in svg and svg.count("<polyline") == 3


@pytest.mark.anyio
async def test_a_loss_that_rises_on_one_batch_is_gp616_and_a_slow_healthy_one_is_not(client):
    report, _ = await call(client, "audit_training", "gp616_loss_sign_flipped.py", steps=2, overfit_steps=20)
    f = next(f for f in report["findings"] if f["code"] == "GP616")
    assert f["severity"] == "error" and "the loss went up" in f["message"] and "All 4 trainable tensors moved" in f["message"]
    assert "log_likelihood went down" in f["message"] and f["location"]["function"] == "train_step"
    assert len(f["evidence"]["loss_per_step"]) == 20 and f["evidence"]["trend"]["loss"] == "up"
    healthy, _ = await call(client, "audit_training", "healthy_steps_overfit_one_batch.py", steps=2, overfit_steps=20)
    assert not [f for f in healthy["findings"] if f["code"] == "GP616"], healthy["findings"]
    terms = healthy["facts"]["overfit_one_batch"]["loss_per_step"]
    assert set(terms) == {"loss", "cross_entropy", "l2"} and all(len(v) == 20 for v in terms.values())
    off, _ = await call(client, "audit_training", "healthy_steps_overfit_one_batch.py", steps=2)
    assert "overfit_one_batch" not in off["facts"]  # opt-in


@pytest.mark.anyio
async def test_frozen_loss_with_nothing_moving_names_the_parameters(client, tmp_path):
    (tmp_path / "stuck.py").write_text(
        "import torch\nimport torch.nn as nn\n\n"
        "def build_model():\n    return nn.Linear(3, 2)\n\n"
        "def make_inputs():\n    return torch.randn(4, 3)\n\n"
        "def make_optimizer(model):\n    return torch.optim.SGD(model.parameters(), lr=0.0)\n\n"
        "def train_step(model, x, opt):\n"
        "    opt.zero_grad()\n    loss = model(x).square().mean()\n    loss.backward()\n    opt.step()\n    return loss\n")
    result = await client.call_tool("audit_training", {"target": {"project_dir": str(tmp_path), "model": "stuck.py"},
                                                       "steps": 2, "overfit_steps": 6})
    f = next(f for f in result.structured_content["findings"] if f["code"] == "GP616")
    assert "did not change" in f["message"] and sorted(f["parameters"]) == ["bias", "weight"]
    assert "optimizer.step()" in f["fix"] and "positive learning rate" in f["fix"]


@pytest.mark.anyio
async def test_a_scaler_that_skips_every_step_names_the_nonfinite_loss(client):
    report, _ = await call(client, "audit_training", "gp617_scaler_skips_every_step.py", steps=3)
    f = next(f for f in report["findings"] if f["code"] == "GP617")
    assert f["severity"] == "error" and f["location"]["line"] == 32 and "was inf before any scaling" in f["message"]
    assert f["evidence"]["skipped"] == [True, True, True] and f["evidence"]["scale"] == [1024.0, 512.0, 256.0]
    healthy, _ = await call(client, "audit_training", "healthy_steps_amp_masked_logits.py", steps=3)
    assert healthy["ok"] and not healthy["findings"], healthy["findings"]


@pytest.mark.anyio
async def test_a_scaler_backing_off_from_its_initial_scale_is_no_error(client):
    """Healthy fp16: the GradScaler's first scales overflow float16 and it skips steps while the loss is finite. The
    one step's NaN/Inf gradients (GP307) and the skipped update (GP207) are info with the scale and the loss; over a
    few steps GP617 is info (backing off); over enough steps the skips end, and a skipped step is no micro-batch
    boundary (no GP601 for the zero_grad() of each skipped iteration). Found by the sweep's --wrap fp16-scaler."""
    report, _ = await call(client, "diagnose", "healthy_fp16_scaler_backs_off.py", steps=3)
    assert report["ok"] and not [f for f in report["findings"] if f["severity"] != "info"], report["findings"]
    by = {f["code"]: f for f in report["findings"]}
    assert by["GP307"]["evidence"]["scale"] > 1 and "finite" in by["GP307"]["message"], by["GP307"]
    assert "GradScaler skipped optimizer.step()" in by["GP207"]["message"]
    assert "while the loss was finite" in by["GP617"]["message"] and "steps >=" in by["GP617"]["fix"]
    longer, _ = await call(client, "diagnose", "healthy_fp16_scaler_backs_off.py", steps=20)
    assert longer["ok"] and {f["code"] for f in longer["findings"]} <= {"GP307", "GP207"}, longer["findings"]


@pytest.mark.anyio
async def test_one_group_overwritten_each_step_is_gp618(client):
    report, _ = await call(client, "audit_training", "gp618_head_lr_typo.py", steps=4)
    f = next(f for f in report["findings"] if f["code"] == "GP618")
    assert f["severity"] == "warning" and sorted(f["parameters"]) == ["head.bias", "head.weight"]
    assert "lr as applied 10" in f["message"] and all(r >= 0.5 for r in f["evidence"]["update_ratio"])
    healthy, _ = await call(client, "audit_training", "healthy_steps_head_lr_higher.py", steps=4)
    assert healthy["ok"] and not healthy["findings"], healthy["findings"]


@pytest.mark.anyio
async def test_the_all_clear_states_accumulation_and_ema_as_numbers(client):
    acc, _ = await call(client, "audit_training", "healthy_steps_accumulation.py", steps=3)
    assert any("each multiplied by 0.25 before backward(): the accumulated gradient is 1.00x the mean" in v
               for v in acc["facts"]["verified"]), acc["facts"]["verified"]
    ema, _ = await call(client, "audit_training", "healthy_steps_ema_teacher.py", steps=3)
    assert any("the same share at every step: an EMA update with decay 0.9" in v for v in ema["facts"]["verified"])


@pytest.mark.anyio
async def test_diagnose_with_steps_recognises_an_ema_teacher_and_merges_the_audit(client):
    one, images = await call(client, "diagnose", "healthy_steps_ema_teacher_with_grad.py")
    assert [f["severity"] for f in one["findings"] if f["code"] == "GP201"] == ["error"]  # one step cannot tell
    assert "steps" not in one["facts"] and len(images) == 1
    report, images = await call(client, "diagnose", "healthy_steps_ema_teacher_with_grad.py", steps=3)
    assert report["ok"] and not [f for f in report["findings"] if f["code"] == "GP201"], report["findings"]
    assert "an EMA-like update moved it at each of the 3 steps, keeping 0.99 of its gap" in report["summary"]
    assert report["facts"]["steps"]["ema_copies"][0]["moved_per_step"] == [True, True, True]
    assert "steps" in report["facts"]["checks"] and len(images) == 2  # the flowchart and the steps chart
    assert "lr" in svg_of(images[1])
    broken, _ = await call(client, "diagnose", "gp601_accumulation_not_divided.py", steps=2)
    assert "GP601" in {f["code"] for f in broken["findings"]}


def test_cli_steps_prints_the_per_group_table():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "gradprobe", "diagnose", str(EXAMPLES / "healthy_steps_head_lr_higher.py"),
                          "--steps", "3", "--no-color"], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "per parameter group, per optimizer step:" in out.stdout and "update/weight" in out.stdout
    table = out.stdout.split("per parameter group, per optimizer step:")[1]
    assert "opt 0 group 1 (2 tensors)" in table and len([ln for ln in table.splitlines() if ln.strip()[:1] == "3"]) == 2


@pytest.mark.anyio
async def test_diagnose_with_steps_keeps_gp201_for_a_teacher_its_ema_never_moves(client, tmp_path):
    (tmp_path / "stuck_teacher.py").write_text(
        "import copy\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
        "class MT(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.student = nn.Linear(4, 3)\n"
        "        self.ema_teacher = copy.deepcopy(self.student)\n\n"
        "def build_model():\n    return MT()\n\n"
        "def make_inputs():\n    return torch.randn(6, 4)\n\n"
        "def make_optimizer(model):\n    return torch.optim.SGD(model.student.parameters(), lr=0.1)\n\n"
        "def train_step(model, x, opt):\n"
        "    opt.zero_grad()\n"
        "    loss = F.mse_loss(model.student(x), model.ema_teacher(x)) + model.student(x).square().mean()\n"
        "    loss.backward()\n    opt.step()\n"
        "    for t, s in zip(model.ema_teacher.parameters(), model.student.parameters()):\n"
        "        t = 0.99 * t + 0.01 * s.detach()  # rebinds the loop name: the teacher never moves\n")
    result = await client.call_tool("diagnose", {"target": {"project_dir": str(tmp_path), "model": "stuck_teacher.py"},
                                                 "steps": 3})
    report = result.structured_content
    codes = {f["code"] for f in report["findings"]}
    assert "GP201" in codes and "GP609" in codes, report["findings"]
    assert "GP201 not raised" not in report["summary"]


def test_a_skipped_step_leaves_no_torch_function_mode_behind():
    """A GradScaler that skips the step leaves the observer's grad-write window open until the audit closes it: the
    audit must close it inside its own update watch, or the watch pops the wrong mode and stays on torch's stack (in
    the library form, every later compiled model then ran in eager: GP701 went silent)."""
    from torch.overrides import _get_current_function_mode_stack

    from gradprobe.sandbox.run_check import run_job

    report = run_job({"tool": "audit_training", "target": {"project_dir": str(EXAMPLES),
                                                           "model": "gp617_scaler_skips_every_step.py"},
                      "options": {"steps": 3}}, lambda phase: None)
    assert [f["code"] for f in report["findings"]] == ["GP617"], report["findings"]
    assert _get_current_function_mode_stack() == []
