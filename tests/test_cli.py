"""The command line for people and CI: readable output, --json, and an exit code that guards CI."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import EXAMPLES, ROOT


def run(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "gradprobe", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_diagnose_broken_file_exits_nonzero_with_the_root_cause():
    out = run("diagnose", str(EXAMPLES / "gp303_no_grad_block.py"), "--no-color")
    assert out.returncode == 1, out.stderr
    assert "GP303" in out.stdout and "gp303_no_grad_block.py:15" in out.stdout and "fix:" in out.stdout


def test_diagnose_json_and_healthy_exit_zero():
    out = run("diagnose", str(EXAMPLES / "gp108_tied_decoder.py"), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] is True and report["tool"] == "diagnose"


def test_every_target_field_is_a_flag():
    out = run("trace_grad_path", "--project-dir", str(EXAMPLES), "--setup",
              "import torch.nn as nn\nmodel = nn.Linear(3, 1)\ninputs = torch.randn(2, 3)", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["facts"]["per_parameter"][0]["grad"] == "ok"
    bad = run("diagnose", str(EXAMPLES / "nope.py"))
    assert bad.returncode == 2 and "nope.py" in bad.stderr


def test_no_target_prints_usage():
    out = run("diagnose")
    assert out.returncode == 2 and out.stderr.startswith("usage: gradprobe diagnose") and "--project-dir" in out.stderr
    assert out.stdout == ""


def test_json_always_prints_json_errors_included():
    cases = [
        (("diagnose", "--json"), "usage"),                                            # no target
        (("diagnose", str(EXAMPLES / "nope.py"), "--json"), "bad-target"),          # missing file
        (("diagnose", str(EXAMPLES / "gp101_temperature_tensor.py"), "--seed", "x", "--json"), "usage"),  # argparse
        (("diagnose", str(EXAMPLES / "gp101_temperature_tensor.py"), "--device", "gpu", "--json"), "bad-target"),
    ]
    for args, kind in cases:
        out = run(*args)
        assert out.returncode == 2, (args, out.stderr)
        report = json.loads(out.stdout)
        assert report["ok"] is False and report["error"]["kind"] == kind and report["error"]["message"], report


def test_bad_target_is_one_sentence_naming_the_field():
    out = run("diagnose", str(EXAMPLES / "gp101_temperature_tensor.py"), "--device", "gpu")
    assert out.returncode == 2 and "device" in out.stderr and "cpu" in out.stderr
    assert "pydantic" not in out.stderr and "validation error" not in out.stderr


def test_model_as_an_absolute_path_is_the_project():
    out = run("inspect_parameters", "--model", str(EXAMPLES / "gp101_temperature_tensor.py"), "--json")
    assert out.returncode == 1, out.stdout + out.stderr
    assert json.loads(out.stdout)["findings"][0]["code"] == "GP101"


def test_gp100_text_shows_the_users_traceback():
    out = run("diagnose", str(EXAMPLES / "gp100_build_raises.py"), "--no-color")
    assert out.returncode == 1, out.stderr
    assert "GP100" in out.stdout and "Traceback (user frames only)" in out.stdout
    assert "self.check = self.layers[3]" in out.stdout and "IndexError" in out.stdout
    shown = out.stdout.split("Traceback", 1)[1]
    assert "loading.py" not in shown and "run_check.py" not in shown, "the traceback shows gradprobe's own frames"
