"""Script targets through the real server over stdio: real training scripts run to their first
step (plain argparse, Lightning, Hugging Face Trainer, accelerate, torchrun-style DDP), each
healthy and with one seed bug; and scripts that never reach a step end in GP112, never a hang."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from conftest import ROOT, assert_expected

SCRIPTS = ROOT / "examples" / "scripts"

# (project, script, args, needs, expect): expect as in examples/broken's EXPECT, plus `file` for the line's file
CASES = [
    ("nanogpt", "train.py", ["--max_iters=3"], None, {"codes": [], "healthy": True}),
    ("nanogpt_broken", "train.py", ["--max_iters=3"], None,
     {"codes": ["GP103"], "culprits": ["h.0.attn.c_attn.weight"], "line": 49, "file": "model.py"}),
    ("lightning", "train.py", ["--fast_dev_run=1"], "lightning", {"codes": [], "healthy": True}),
    ("lightning_broken", "train.py", ["--fast_dev_run=1"], "lightning",
     {"codes": ["GP201"], "culprits": ["head.weight", "head.bias"], "line": 24, "file": "lit.py"}),
    ("hf_trainer", "train.py", ["--max_steps=1", "--warmup_steps=1"], "transformers",
     {"codes": ["GP205"], "culprits": [], "severity": "info", "healthy": True}),
    ("hf_trainer", "train.py", ["--max_steps=3", "--warmup_steps=1"], "transformers",
     {"codes": ["GP205"], "culprits": ["judged on a later step"], "severity": "info", "healthy": True}),
    # a first step at a real learning rate (no warm-up from 0): the frozen base is measured frozen (no GP503/GP508)
    ("hf_trainer", "train.py", ["--max_steps=1"], "transformers",
     {"codes": [], "healthy": True, "absent": ["GP503", "GP508"]}),
    ("hf_trainer_broken", "train.py", ["--max_steps=1"], "transformers",
     {"codes": ["GP101"], "culprits": ["prompt"], "line": 14, "file": "prompt_model.py"}),
    ("accelerate", "train.py", ["--epochs=1"], "accelerate", {"codes": [], "healthy": True}),
    ("accelerate_broken", "train.py", ["--epochs=1"], "accelerate",
     {"codes": ["GP303"], "culprits": ["prompt_emb", "prompt_mlp.0.weight"], "line": 18, "file": "model.py"}),
    ("ddp", "train.py", ["--steps=2"], None, {"codes": [], "healthy": True}),
    ("ddp_broken", "train.py", ["--steps=2"], None,
     {"codes": ["GP302"], "culprits": ["doc.0.weight", "doc.2.bias"], "line": 34, "file": "train.py"}),
    ("amp_fp16_no_scaler_broken", "train.py", ["--steps=3"], None,
     {"codes": ["GP708"], "culprits": ["encoder.weight"], "line": 44, "file": "train.py"}),
    ("amp_fp16_scaler", "train.py", ["--steps=3"], None, {"codes": [], "healthy": True, "absent": ["GP708"]}),
    ("amp_bf16", "train.py", ["--steps=3"], None, {"codes": [], "healthy": True, "absent": ["GP708"]}),
    ("nostep", "loops_forever.py", [], None, {"codes": ["GP112"], "culprits": [], "line": 10, "timeout_s": 10}),
    ("nostep", "blocked_in_c.py", [], None, {"codes": ["GP112"], "culprits": ["blocked"], "timeout_s": 8}),
    ("nostep", "catches_exception.py", [], None, {"codes": ["GP112"], "culprits": [], "line": 11}),
    ("nostep", "exits_early.py", [], None, {"codes": ["GP112"], "culprits": [], "line": 11}),
    ("nostep", "swallows_stop.py", [], None, {"codes": [], "healthy": True}),
    ("nostep", "manual_sgd.py", [], None, {"codes": [], "healthy": True}),
]


def _id(case) -> str:
    return f"{case[0]}/{case[1]}" + ("".join(a for a in case[2] if "warmup" in a or "max_steps=3" in a))


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
async def test_script_through_mcp(client, case):
    project, script, args, needs, expect = case
    if needs and importlib.util.find_spec(needs) is None:
        pytest.skip(f"needs {needs} (pip install 'gradprobe[frameworks]')")
    target = {"project_dir": str(SCRIPTS / project), "script": script, "args": args,
              "timeout_s": expect.get("timeout_s", 240)}
    result = await client.call_tool("diagnose", {"target": target})
    assert not result.is_error, result.content
    report = result.structured_content
    assert_expected(report, expect, _id(case))
    if expect.get("file"):
        hits = [f for f in report["findings"] if f["code"] in expect["codes"] and f.get("location")]
        assert any(os.path.basename(f["location"]["file"]) == expect["file"] for f in hits), hits
    if expect.get("healthy"):
        step = report["facts"]["script_step"]
        assert step["captured_at"] in ("optimizer.step", "backward")
        assert step["model"], step


LIT = [("lightning", {"codes": [], "healthy": True}),
       ("lightning_broken", {"codes": ["GP201"], "culprits": ["head.weight", "head.bias"], "line": 24})]


@pytest.mark.anyio
@pytest.mark.parametrize("project,expect", LIT, ids=[p for p, _ in LIT])
async def test_lightning_module_as_target(client, project, expect):
    """"model": "lit.py:LitModel": its configure_optimizers, a train_dataloader batch, its training_step."""
    if importlib.util.find_spec("lightning") is None:
        pytest.skip("needs lightning (pip install 'gradprobe[frameworks]')")
    target = {"project_dir": str(SCRIPTS / project), "model": "lit.py:LitModel", "timeout_s": 240}
    result = await client.call_tool("diagnose", {"target": target})
    assert not result.is_error, result.content
    report = result.structured_content
    assert_expected(report, expect, project)
    assert report["facts"]["target"]["lightning"] == ["configure_optimizers", "train_dataloader", "training_step"]


def test_cli_script_form():
    """`gradprobe diagnose --script train.py -- ARGS`: the script's own arguments after `--`."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    broken = subprocess.run([sys.executable, "-m", "gradprobe", "diagnose", "--json", "--script",
                             str(SCRIPTS / "nanogpt_broken" / "train.py"), "--", "--max_iters=2", "--eval_iters=1"],
                            capture_output=True, text=True, env=env, timeout=600, cwd=SCRIPTS / "nanogpt_broken")
    assert broken.returncode == 1, broken.stderr[-2000:]
    import json

    report = json.loads(broken.stdout)
    assert report["findings"][0]["code"] == "GP103" and report["findings"][0]["location"]["line"] == 49
    assert report["facts"]["script_step"]["captured_at"] == "optimizer.step"
    bad_args = subprocess.run([sys.executable, "-m", "gradprobe", "diagnose", "--script",
                               str(SCRIPTS / "nanogpt" / "train.py"), "--", "--no-such-flag"],
                              capture_output=True, text=True, env=env, timeout=600, cwd=SCRIPTS / "nanogpt")
    assert bad_args.returncode == 1 and "GP112" in bad_args.stdout, bad_args.stdout[-2000:]


@pytest.mark.anyio
async def test_script_target_errors_before_any_child(client):
    """A script outside project_dir, a missing script, or script with model: tool errors, nothing runs."""
    base = str(SCRIPTS / "nanogpt")
    for target, words in (({"project_dir": base, "script": "../nostep/exits_early.py"}, "outside project_dir"),
                          ({"project_dir": base, "script": "nope.py"}, "not found"),
                          ({"project_dir": base, "script": "train.py", "model": "model.py:GPT"}, "brings its own model")):
        result = await client.call_tool("diagnose", {"target": target})
        assert result.is_error and words in str(result.content), result.content


@pytest.mark.anyio
async def test_module_entry_point(client):
    """`"module": "train"` runs like `python -m train` from project_dir."""
    target = {"project_dir": str(SCRIPTS / "nanogpt_broken"), "module": "train", "args": ["--max_iters=2"], "timeout_s": 240}
    result = await client.call_tool("diagnose", {"target": target})
    assert not result.is_error, result.content
    report = result.structured_content
    assert_expected(report, {"codes": ["GP103"], "culprits": ["h.0.ln_1.weight"], "line": 49}, "module train")
