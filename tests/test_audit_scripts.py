"""audit_training on script targets, through the real server over stdio: the script's own optimizer steps are watched
as they run (no replay) under whatever it uses (plain loop, DDP, torch.compile, accelerate, HF Trainer, Lightning),
the script is stopped before step N+1, and the GP6xx rules judge what was watched."""

from __future__ import annotations

import importlib.util
import os

import pytest

from conftest import ROOT, assert_expected, assert_verdict
from report_consistency import assert_consistent

SCRIPTS = ROOT / "examples" / "scripts"
GP6 = [f"GP60{i}" for i in range(1, 10)] + ["GP610", "GP611", "GP612"]

# (project, args, needs, expect): expect as in examples/broken's EXPECT
CASES = [
    ("nanogpt", ["--max_iters=8"], None, {"codes": [], "healthy": True}),
    ("ddp", ["--steps=8"], None, {"codes": [], "healthy": True}),
    ("compiled", ["--steps=8"], None, {"codes": [], "healthy": True}),
    ("ddp_compiled", ["--steps=8"], None, {"codes": [], "healthy": True}),
    ("accelerate", ["--epochs=1"], "accelerate", {"codes": [], "healthy": True}),
    ("hf_trainer", ["--max_steps=8", "--warmup_steps=1"], "transformers", {"codes": [], "healthy": True}),
    ("lightning", ["--fast_dev_run=8"], "lightning", {"codes": [], "healthy": True}),
    ("lightning_broken", ["--fast_dev_run=8"], "lightning",
     {"codes": ["GP606"], "culprits": ["head.weight", "head.bias"]}),
    # bugs a user can still make where the framework owns the loop (issue 28)
    ("lightning_clip", ["--max_steps=8"], "lightning", {"codes": [], "healthy": True, "absent": ["GP605"]}),
    ("lightning_clip_broken", ["--max_steps=8"], "lightning",
     {"codes": ["GP605"], "culprits": ["head.weight", "head.bias"], "line": 36}),
    ("lightning_eval", ["--max_steps=8"], "lightning", {"codes": [], "healthy": True, "absent": ["GP610"]}),
    ("lightning_eval_broken", ["--max_steps=8"], "lightning",
     {"codes": ["GP610"], "culprits": [], "line": 36, "severity": "warning"}),
    ("lightning_late_head", ["--max_steps=8"], "lightning", {"codes": [], "healthy": True, "absent": ["GP606"]}),
    ("lightning_late_head_broken", ["--max_steps=8"], "lightning",
     {"codes": ["GP606"], "culprits": ["head.weight", "head.bias"], "line": 32}),
    ("hf_trainer_lr", ["--max_steps=8"], "transformers", {"codes": [], "healthy": True, "absent": ["GP603"]}),
    ("hf_trainer_lr_broken", ["--max_steps=8"], "transformers",
     {"codes": ["GP603"], "culprits": ["backbone.0.weight"], "line": 50}),
    ("steps_accelerate", ["--epochs=1"], "accelerate", {"codes": [], "healthy": True}),
    ("steps_accelerate_broken", ["--epochs=1"], "accelerate",
     {"codes": ["GP605"], "culprits": ["0.weight", "2.weight"], "line": 35}),
    ("steps_callback", ["--steps=8"], None, {"codes": [], "healthy": True}),
    ("steps_callback_broken", ["--steps=8"], None, {"codes": ["GP605"], "culprits": ["head.weight"], "line": 34}),
    ("steps_late_head", ["--steps=8"], None, {"codes": [], "healthy": True}),
    ("steps_late_head_broken", ["--steps=8"], None,
     {"codes": ["GP606"], "culprits": ["heads.aux.weight", "heads.aux.bias"], "line": 38}),
    ("steps_ema", ["--steps=8"], None, {"codes": [], "healthy": True}),
    ("steps_ema_broken", ["--steps=8"], None, {"codes": ["GP609"], "culprits": ["ema_teacher.0.weight"], "line": 28,
                                                 "severity": "error"}),
    ("steps_ema_outside", ["--steps=8"], None, {"codes": [], "healthy": True,
                                                "verified": "EMA copy held outside the model (written at train.py:40)"}),
    ("steps_ema_outside_broken", ["--steps=8"], None, {"codes": ["GP609"], "culprits": ["0.weight (its copy)"],
                                                         "line": 42, "severity": "error"}),
    ("steps_averaged_model", ["--steps=8"], None, {"codes": [], "healthy": True,
                                                   "verified": "the first update a full copy of the model, then the same "
                                                               "share at every step: an EMA update with decay 0.9"}),
    ("steps_averaged_model_broken", ["--steps=8"], None, {"codes": ["GP609"], "culprits": ["0.weight (its copy)"],
                                                            "line": 46, "severity": "error"}),
    ("steps_gradient_penalty", ["--steps=8"], None, {"codes": [], "healthy": True}),
    ("steps_gradient_penalty_broken", ["--steps=8"], None, {"codes": ["GP608"], "culprits": [], "line": 27}),
    ("steps_gan", ["--steps=8"], None, {"codes": [], "healthy": True, "absent": ["GP212", "GP602"]}),
    ("steps_gan_wrong_zero_grad", ["--steps=8"], None,
     {"codes": ["GP212"], "culprits": ["netG.0.weight", "netG.2.bias"], "line": 39, "absent": ["GP602"]}),
    ("steps_eval_mode", ["--steps=8"], None, {"codes": [], "healthy": True, "absent": ["GP610"]}),
    ("steps_eval_mode_broken", ["--steps=8"], None, {"codes": ["GP610"], "culprits": [], "line": 27, "severity": "warning"}),
    # the division by the accumulation steps applied twice, under a framework that divides already (GP611)
    ("accelerate_accum_twice_broken", ["--epochs=1"], "accelerate", {"codes": ["GP611"], "culprits": [], "line": 37}),
    ("accelerate_accum_tokens", ["--steps=8"], "accelerate", {"codes": [], "healthy": True, "absent": ["GP611"]}),
    ("hf_trainer_accum_broken", ["--max_steps=8"], "transformers", {"codes": ["GP611"], "culprits": [], "line": 51}),
    ("hf_trainer_accum", ["--max_steps=8"], "transformers", {"codes": [], "healthy": True, "absent": ["GP611"]}),
    ("lightning_accum_broken", ["--max_steps=8"], "lightning", {"codes": ["GP611"], "culprits": [], "line": 38}),
    ("lightning_accum", ["--max_steps=8"], "lightning", {"codes": [], "healthy": True, "absent": ["GP611"]}),
    ("steps_onecycle", [], None, {"codes": [], "healthy": True, "absent": ["GP612"]}),
    ("steps_onecycle_broken", [], None, {"codes": ["GP612"], "culprits": [], "line": 26, "severity": "warning"}),
]


async def audit_script(client, project: str, args: list[str], steps: int = 4) -> dict:
    target = {"project_dir": str(SCRIPTS / project), "script": "train.py", "args": args, "timeout_s": 240}
    result = await client.call_tool("audit_training", {"target": target, "steps": steps})
    assert not result.is_error, result.content
    assert_verdict(result.structured_content, project)
    return result.structured_content


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
async def test_audit_script_through_mcp(client, case):
    project, args, needs, expect = case
    if needs and importlib.util.find_spec(needs) is None:
        pytest.skip(f"needs {needs} (pip install 'gradprobe[frameworks]')")
    report = await audit_script(client, project, args)
    assert not [f for f in report["findings"] if f["code"] == "GP000"], report["findings"]
    assert_expected(report, expect, project)
    assert_consistent(report, project)
    step = report["facts"]["script_step"]
    assert step["optimizer_steps_watched"] == 4 and step["ended"] == "stopped before optimizer step 5", step
    assert step["watched"].startswith("the script's own steps") and step["model"], step
    assert len(report["facts"]["optimizer_steps"]) >= 4
    if expect.get("healthy"):
        assert report["ok"] and not [f for f in report["findings"] if f["code"] in GP6], report["findings"]
        assert report["facts"]["verified"], report["facts"]
        if "verified" in expect:  # an EMA copy held outside the model, found by what writes it, measured
            assert any(expect["verified"] in v for v in report["facts"]["verified"]), report["facts"]["verified"]


@pytest.mark.anyio
async def test_gradient_zeroed_by_a_callback_is_named_with_its_line(client):
    report = await audit_script(client, "steps_callback_broken", ["--steps=8"], steps=2)
    f = next(f for f in report["findings"] if f["code"] == "GP605")
    assert f["location"]["function"] == "on_after_backward" and "`mul_` at train.py:34" in f["message"]
    assert sorted(f["parameters"]) == ["head.bias", "head.weight"]
    rows = {r["name"]: r for r in report["facts"]["per_parameter"]}
    assert rows["head.weight"]["verdict"] == "zeroed-between" and rows["body.weight"]["verdict"] == "ok"


@pytest.mark.anyio
async def test_zero_grad_between_backward_and_step_under_accelerate(client):
    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("needs accelerate")
    report = await audit_script(client, "steps_accelerate_broken", ["--epochs=1"], steps=2)
    f = next(f for f in report["findings"] if f["code"] == "GP605")
    assert os.path.basename(f["location"]["file"]) == "train.py" and f["location"]["line"] == 35
    assert "Move zero_grad() at train.py:35" in f["fix"] and "after optimizer.step() (train.py:36)" in f["fix"]


@pytest.mark.anyio
async def test_head_attached_at_the_second_iteration(client):
    report = await audit_script(client, "steps_late_head_broken", ["--steps=8"])
    f = next(f for f in report["findings"] if f["code"] == "GP606")
    assert "attached to the model at train.py:38 during step 2" in f["message"], f["message"]
    assert "add_param_group" in f["fix"]
    healthy = await audit_script(client, "steps_late_head", ["--steps=8"])
    assert "6 of 6 trainable parameter tensors" in healthy["facts"]["headline"], healthy["facts"]["headline"]


@pytest.mark.anyio
async def test_script_that_ends_before_n_steps_is_audited_on_the_steps_it_took(client):
    report = await audit_script(client, "ddp", ["--steps=2"], steps=4)
    assert report["ok"] and not report["findings"], report["findings"]
    step = report["facts"]["script_step"]
    assert step["optimizer_steps_watched"] == 2 and "after 2 of 4 optimizer steps" in step["script_ended"], step
    # a script that finished has no more steps: not applicable, said, and the steps it took are verified
    assert report["verdict"]["status"] == "verified" and "The script ended after 2 of 4 optimizer steps" in report["summary"]
    assert [(e["check"], e["cause"]) for e in report["verdict"]["not_run"]] == [("optimizer steps 3 to 4", "not_applicable")]


@pytest.mark.anyio
async def test_script_without_an_optimizer_says_there_is_nothing_to_audit(client):
    target = {"project_dir": str(SCRIPTS / "nostep"), "script": "manual_sgd.py", "timeout_s": 60}
    result = await client.call_tool("audit_training", {"target": target})
    assert not result.is_error, result.content
    report = result.structured_content
    assert not report["findings"] and "no optimizer in existence" in report["summary"], report
    assert report["verdict"]["status"] == "not_checked" and report["summary"].startswith(
        "not checked: the audit of the training steps does not apply"), report["summary"]


@pytest.mark.anyio
async def test_ema_teacher_moves_by_its_decay_in_the_script_own_loop(client):
    """A mean teacher outside the optimizer, updated in place after each step: healthy, and its decay is measured."""
    report = await audit_script(client, "steps_ema", ["--steps=8", "--decay=0.9"])
    assert report["ok"] and not report["findings"], report["findings"]
    (copy,) = report["facts"]["ema_copies"]
    assert copy["copy"] == "ema_teacher" and copy["of"] == "student" and copy["moved_per_step"] == [True] * 4
    assert copy["kept_gap_per_step"] and all(abs(k - 0.9) < 1e-4 for k in copy["kept_gap_per_step"]), copy
    assert "4 more, outside the optimizer, were moved by an EMA-like update" in report["facts"]["headline"]


@pytest.mark.anyio
async def test_script_that_swallows_the_stop_is_audited_and_the_cost_is_measured(client):
    target = {"project_dir": str(SCRIPTS / "nostep"), "script": "swallows_stop.py", "timeout_s": 60}
    result = await client.call_tool("audit_training", {"target": target})
    assert not result.is_error, result.content
    report = result.structured_content
    assert report["ok"] and not report["findings"] and report["facts"]["script_swallowed_stop"], report
    step = report["facts"]["script_step"]
    assert step["optimizer_steps_watched"] == 4, step
    cost = step["cost"]
    assert 0 <= cost["in_gradprobe_measurements_seconds"] <= cost["watched_seconds"] and cost["ratio_to_unwatched_estimate"] >= 1


DIAGNOSE = [
    ("steps_accelerate_broken", ["--epochs=1"], "accelerate", {"codes": ["GP605"], "culprits": ["0.weight"], "line": 35}),
    ("steps_accelerate", ["--epochs=1"], "accelerate", {"codes": [], "healthy": True, "absent": ["GP605", "GP000"]}),
    ("steps_callback_broken", ["--steps=3"], None, {"codes": ["GP605"], "culprits": ["head.weight"], "line": 34}),
    ("steps_callback", ["--steps=3"], None, {"codes": [], "healthy": True, "absent": ["GP605", "GP000"]}),
    # Lightning runs backward and on_before_optimizer_step inside optimizer.step(closure): the step as it stood after it
    ("lightning_clip_broken", ["--max_steps=3"], "lightning", {"codes": ["GP605"], "culprits": ["head.weight"], "line": 36}),
    ("lightning_clip", ["--max_steps=3"], "lightning", {"codes": [], "healthy": True, "absent": ["GP605", "GP000"]}),
]


@pytest.mark.anyio
@pytest.mark.parametrize("case", DIAGNOSE, ids=[c[0] for c in DIAGNOSE])
async def test_diagnose_watches_the_script_first_step(client, case):
    """diagnose on a script: besides the checks on its step, the step as it ran: a gradient zeroed before step()."""
    project, args, needs, expect = case
    if needs and importlib.util.find_spec(needs) is None:
        pytest.skip(f"needs {needs}")
    target = {"project_dir": str(SCRIPTS / project), "script": "train.py", "args": args, "timeout_s": 240}
    result = await client.call_tool("diagnose", {"target": target})
    assert not result.is_error, result.content
    assert_expected(result.structured_content, expect, project)
    assert_consistent(result.structured_content, project)


@pytest.mark.anyio
async def test_diagnose_with_steps_watches_the_script_loop(client):
    """diagnose with steps on a script: one run; the script's own loop is watched for N steps (GP6xx, facts.steps and
    the step chart join the report), diagnose's checks run on the step after them."""
    target = {"project_dir": str(SCRIPTS / "steps_ema_broken"), "script": "train.py", "args": ["--steps=8"],
              "timeout_s": 240}
    result = await client.call_tool("diagnose", {"target": target, "steps": 2})
    assert not result.is_error, result.content
    report = result.structured_content
    assert not [f for f in report["findings"] if f["code"] == "GP000"], report["findings"]
    f = next(f for f in report["findings"] if f["code"] == "GP609")
    assert f["location"]["line"] == 28 and "ema_teacher.0.weight" in f["parameters"], f
    # the update was measured being computed and dropped (a rebound name), as in the build_model() form: an error
    assert f["severity"] == "error" and f["evidence"]["updates_computed_per_step"] == [4, 4], f
    assert f["evidence"]["writes_per_step"] == [0, 0], f
    steps = report["facts"]["steps"]
    assert len(steps["optimizer_steps"]) == 2 and steps["param_groups"], steps
    assert steps["script_step"]["ended"] == "stopped before optimizer step 3", steps["script_step"]
    assert "steps" in report["facts"]["checks"] and report["facts"]["script_step"]["captured_at"] == "optimizer.step"
    images = [c for c in result.content if getattr(c, "type", "") == "image"]
    assert len(images) >= 2, [getattr(c, "type", "") for c in result.content]  # the flow and the step chart


def test_cli_diagnose_steps_on_a_script():
    """`gradprobe diagnose --steps 2 --script train.py`: a healthy EMA teacher, recognised from its steps (no GP201)."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "gradprobe", "diagnose", "--json", "--steps", "2", "--script",
                          str(SCRIPTS / "steps_ema" / "train.py"), "--", "--steps=8"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["ok"] and not [f for f in report["findings"] if f["code"] in ("GP201", "GP609", "GP000")], report
    assert report["facts"]["steps"]["ema_copies"][0]["moved_per_step"] == [True, True]
    assert "GP201 not raised" in report["summary"]
