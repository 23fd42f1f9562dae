"""audit_training through the real server over stdio: several observed steps, the GP6xx codes, the measured all-clear.

Every gp6*/healthy_steps_* example is also run by test_examples.py (codes, culprits, line; healthy twins get no GP6xx).
"""

from __future__ import annotations

import pytest

from conftest import EXAMPLES, assert_verdict

GP6 = [f"GP60{i}" for i in range(1, 10)]


async def audit(client, name: str, steps: int = 4, **target) -> dict:
    result = await client.call_tool("audit_training", {"target": {"project_dir": str(EXAMPLES), "model": name, **target},
                                                       "steps": steps})
    assert not result.is_error, result.content
    assert_verdict(result.structured_content, name)
    return result.structured_content


@pytest.mark.anyio
async def test_accumulation_finding_states_what_was_measured(client):
    report = await audit(client, "gp601_accumulation_not_divided.py", steps=2)
    f = next(f for f in report["findings"] if f["code"] == "GP601")
    assert "4 backward() calls" in f["message"] and "not divided" in f["message"] and "4x their mean" in f["message"]
    assert f["location"]["line"] == 30 and f["evidence"]["backward_calls"] == 4
    assert "accum_steps" in f["fix"] and "gp601_accumulation_not_divided.py:30" in f["fix"]
    steps = report["facts"]["optimizer_steps"]
    assert [s["backward_calls"] for s in steps] == [4, 4]


@pytest.mark.anyio
async def test_healthy_accumulation_gets_a_measured_all_clear(client):
    report = await audit(client, "healthy_steps_accumulation.py", steps=3)
    assert not [f for f in report["findings"] if f["code"] in GP6 or f["severity"] == "error"], report["findings"]
    # the full-batch comparison cannot feed this train_step's (x, y) batch to the model: said, never an all-clear over it
    assert report["ok"] or [e["check"] for e in report["verdict"]["not_run"]] == [
        "the comparison of the accumulated gradient with one full batch"], report["verdict"]
    verified = report["facts"]["verified"]
    assert any(v.startswith("group 0 (4 tensors): lr as applied 0.001") for v in verified), verified
    assert any("4 backward() calls per optimizer step" in v and "DivBackward" in v for v in verified), verified
    # clip_grad_norm_(..., 1.0) with a gradient norm below 1 leaves it as it is: measured, not assumed
    assert "no gradient changed between backward() and optimizer.step()" in verified, verified
    assert "4 of 4 trainable parameter tensors" in report["facts"]["headline"]


@pytest.mark.anyio
async def test_gradient_zeroed_between_backward_and_step_names_the_line(client):
    report = await audit(client, "gp605_clip_callback_zeroes_head.py", steps=2)
    f = next(f for f in report["findings"] if f["code"] == "GP605")
    assert f["location"]["function"] == "sanitise_grads" and "mul_" in f["message"]
    assert sorted(f["parameters"]) == ["head.bias", "head.weight"]
    rows = {r["name"]: r for r in report["facts"]["per_parameter"]}
    assert rows["head.weight"]["verdict"] == "zeroed-between" and rows["body.weight"]["verdict"] == "ok"


@pytest.mark.anyio
async def test_clipping_that_scales_is_measured_not_flagged(client):
    report = await audit(client, "healthy_steps_clip_between.py", steps=2)
    assert report["ok"] and not report["findings"], report["findings"]
    changed = report["facts"]["changed_between_backward_and_step"]
    assert changed and all(0 < c["after"] < c["before"] for c in changed)
    assert {c["op"] for c in changed} >= {"clamp_"} or changed[0]["by"].startswith("healthy_steps_clip_between.py:")
    assert any("never to zero" in v for v in report["facts"]["verified"])


@pytest.mark.anyio
async def test_ema_teacher_outside_the_optimizer_is_healthy_and_its_decay_is_measured(client):
    report = await audit(client, "healthy_steps_ema_teacher.py", steps=3)
    assert report["ok"] and not report["findings"], report["findings"]
    (copy,) = report["facts"]["ema_copies"]
    assert copy["copy"] == "ema_teacher" and copy["of"] == "student" and copy["moved_per_step"] == [True, True, True]
    assert all(abs(k - 0.9) < 1e-4 for k in copy["kept_gap_per_step"]), copy  # DECAY = 0.9 in the example
    assert "4 more, outside the optimizer, were moved by an EMA-like update" in report["facts"]["headline"]


@pytest.mark.anyio
async def test_broken_ema_copies(client):
    never = await audit(client, "gp609_ema_never_moves.py", steps=3)
    f = next(f for f in never["findings"] if f["code"] == "GP609")
    assert f["severity"] == "error" and "did not change in any of the 3 steps" in f["message"]
    assert f["evidence"]["moved_per_step"] == [False, False, False]
    trained = await audit(client, "gp609_ema_teacher_in_optimizer.py", steps=3)
    f = next(f for f in trained["findings"] if f["code"] == "GP609")
    assert "both by optimizer.step()" in f["message"] and f["location"]["function"] == "make_optimizer"
    assert "kept 0.9 of their gap to student" in f["message"], f["message"]  # DECAY = 0.9, measured after the step


_TWINS = (
    "import copy\nimport torch\nimport torch.nn as nn\n\n"
    "class Two(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.a = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))\n"
    "        self.b = copy.deepcopy(self.a)\n\n"
    "def build_model():\n    return Two()\n\n"
    "def make_inputs():\n    return torch.randn(8, 4)\n\n"
    "def make_optimizer(model):\n    return torch.optim.SGD(model.parameters(), lr=0.1)\n\n"
    "def train_step(model, x, opt):\n"
    "    opt.zero_grad()\n"
    "    loss = (model.a(x) - model.b(x + 1)).square().mean() + model.a(x).square().mean()\n"
    "    loss.backward()\n    opt.step()\n"
    "    with torch.no_grad():\n"
    "        for t, s in zip(model.b.parameters(), model.a.parameters()):\n"
    "            {update}\n"
    "    return loss\n")


@pytest.mark.anyio
async def test_ema_copies_are_recognised_by_what_the_steps_do_not_by_name(client, tmp_path):
    """A teacher named `b`, in the optimizer and moved toward `a` by an EMA: GP609; the same pair where `b` is only
    clipped in place (WGAN-style, not toward a twin): no GP609; a reference named ema_model never written: info only."""
    (tmp_path / "trained.py").write_text(_TWINS.replace("{update}", "t.lerp_(s, 0.2)"))
    (tmp_path / "clipped.py").write_text(_TWINS.replace("{update}", "t.clamp_(-0.05, 0.05)"))
    trained = await audit(client, "trained.py", steps=3, project_dir=str(tmp_path))
    f = next(f for f in trained["findings"] if f["code"] == "GP609")
    assert f["severity"] == "error" and "b.0.weight" in f["parameters"] and f["evidence"]["twin"] == "a", f
    assert "kept 0.8 of their gap to a" in f["message"], f["message"]
    clipped = await audit(client, "clipped.py", steps=3, project_dir=str(tmp_path))
    assert not [f for f in clipped["findings"] if f["code"] == "GP609"], clipped["findings"]
    frozen = await audit(client, "healthy_steps_frozen_reference_named_ema.py", steps=3)
    (f,) = [f for f in frozen["findings"] if f["code"] == "GP609"]
    assert f["severity"] == "info" and "never written" in f["message"], f
    assert f["evidence"]["writes_per_step"] == [0, 0, 0] and f["evidence"]["updates_computed_per_step"] == [0, 0, 0]
    decay_one = await audit(client, "gp609_ema_neutral_name_decay_one.py", steps=3)
    f = next(f for f in decay_one["findings"] if f["code"] == "GP609")
    assert f["severity"] == "error" and "in-place write(s) into its tensors" in f["message"], f
    assert f["evidence"]["writes_per_step"] == [8, 8, 8]  # mul_ and add_ on 4 tensors per step


@pytest.mark.anyio
async def test_order_of_calls_and_frozen_parameters(client, tmp_path):
    (tmp_path / "lora_like.py").write_text(
        "import torch\nimport torch.nn as nn\n\n"
        "def build_model():\n"
        "    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))\n"
        "    m[0].requires_grad_(False)\n"
        "    return m\n\n"
        "def make_inputs():\n    return torch.randn(5, 4)\n\n"
        "def make_optimizer(model):\n"
        "    return torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)\n")
    result = await client.call_tool("audit_training", {"target": {"project_dir": str(tmp_path), "model": "lora_like.py"},
                                                       "steps": 2})
    report = result.structured_content
    assert report["ok"] and not report["findings"], report["findings"]
    assert any(v == "2 frozen tensor(s) unchanged over the steps" for v in report["facts"]["verified"])
    assert [e["event"] for e in report["facts"]["order"]] == ["zero_grad", "backward", "optimizer_step"] * 2
    assert report["facts"]["mode"] == "default"


@pytest.mark.anyio
async def test_script_without_a_loop_and_bad_steps(client):
    """Script mode is supported (tests/test_audit_scripts.py); a file with no training loop reaches no step: GP112."""
    r = await client.call_tool("audit_training", {"target": {"project_dir": str(EXAMPLES), "script": "healthy_cnn.py"}})
    assert not r.is_error and [f["code"] for f in r.structured_content["findings"]] == ["GP112"], r.content
    r = await client.call_tool("audit_training", {"target": {"project_dir": str(EXAMPLES), "model": "healthy_cnn.py"},
                                                  "steps": 0})
    assert r.is_error


@pytest.mark.anyio
async def test_a_step_that_raises_heads_the_summary_and_earlier_steps_stay_audited(client, tmp_path):
    (tmp_path / "flaky.py").write_text(
        "import torch\nimport torch.nn as nn\n\nCALLS = [0]\n\n"
        "def build_model():\n    return nn.Linear(3, 2)\n\n"
        "def make_inputs():\n    return torch.randn(4, 3)\n\n"
        "def make_optimizer(model):\n    return torch.optim.SGD(model.parameters(), lr=0.1)\n\n"
        "def train_step(model, x, opt):\n"
        "    CALLS[0] += 1\n"
        "    if CALLS[0] == 3:\n"
        "        raise ValueError('bad batch')\n"
        "    opt.zero_grad()\n    model(x).square().mean().backward()\n    opt.step()\n")
    result = await client.call_tool("audit_training", {"target": {"project_dir": str(tmp_path), "model": "flaky.py"}, "steps": 4})
    report = result.structured_content
    # the steps that did not run are said first (docs/verdicts.md), as GP121 at the line that raised
    assert report["summary"].startswith("partly checked: the audit of steps 3 to 4 did not run (step 3 of 4 raised "
                                        "(ValueError: bad batch); the steps before it were audited)"), report["summary"]
    assert report["facts"]["step_error_location"]["line"] == 18
    assert next(f for f in report["findings"] if f["code"] == "GP121")["location"]["line"] == 18
    assert len(report["facts"]["optimizer_steps"]) == 2 and report["facts"]["steps"] == 3


@pytest.mark.anyio
async def test_grad_scaler_scale_unscale_and_skipped_steps_are_measured(client, tmp_path):
    (tmp_path / "amp.py").write_text(
        "import torch\nimport torch.nn as nn\n\n"
        "def build_model():\n    return nn.Linear(3, 2)\n\n"
        "def make_inputs():\n    return torch.randn(4, 3)\n\n"
        "def make_optimizer(model):\n    return torch.optim.SGD(model.parameters(), lr=0.1)\n\n"
        "SCALER = torch.amp.GradScaler('cpu', init_scale=1024.0)\n\n"
        "def train_step(model, x, opt):\n"
        "    opt.zero_grad()\n"
        "    SCALER.scale(model(x).square().mean()).backward()\n"
        "    SCALER.unscale_(opt)\n"
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "    SCALER.step(opt)\n"
        "    SCALER.update()\n")
    result = await client.call_tool("audit_training", {"target": {"project_dir": str(tmp_path), "model": "amp.py"}, "steps": 2})
    report = result.structured_content
    assert report["ok"] and not report["findings"], report["findings"]
    assert [(s["scale"], s["skipped"]) for s in report["facts"]["grad_scaler"]] == [(1024.0, False), (1024.0, False)]
    changed = report["facts"]["changed_between_backward_and_step"]
    # unscale_ divides the gradient by the scale, then clipping scales it: both writes, with their lines
    assert changed and all(c["writes"][0].startswith("amp.py:18 ") and c["by"] == "amp.py:19" for c in changed), changed
    assert any(v.startswith("GradScaler: scale 1.02e+03, 0 of 2") for v in report["facts"]["verified"])


@pytest.mark.anyio
async def test_a_mean_teacher_under_no_grad_is_no_warning_in_diagnose(client):
    """The teacher's forward under no_grad cuts parameters no optimizer holds: a stop-gradient by design, said as info;
    the same cut in front of optimized parameters stays an error (examples/broken/gp303_no_grad_block.py)."""
    result = await client.call_tool("diagnose", {"target": {"project_dir": str(EXAMPLES),
                                                            "model": "healthy_steps_ema_teacher.py"}})
    report = result.structured_content
    assert report["ok"] and not [f for f in report["findings"] if f["severity"] != "info"], report["findings"]
    cut = next(f for f in report["findings"] if f["code"] == "GP303")
    assert "no optimizer holds them" in cut["message"] and cut["location"]["line"] == 35
    assert all(p.startswith("ema_teacher.") for p in cut["parameters"])
    bug = await client.call_tool("diagnose", {"target": {"project_dir": str(EXAMPLES), "model": "gp303_no_grad_block.py"}})
    assert [f["severity"] for f in bug.structured_content["findings"] if f["code"] == "GP303"] == ["error"]
