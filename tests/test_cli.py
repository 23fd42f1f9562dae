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
