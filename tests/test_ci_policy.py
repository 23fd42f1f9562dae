"""Issue 26 item 9: CI runs what it claims. Under CI a test that would skip for a missing Python package fails; a
GPU skip stays a skip; every skip is listed with its reason."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from conftest import ROOT

PROBE = '''
import pytest


def test_needs_a_package_nobody_installed():
    pytest.importorskip("no_such_package_for_gradprobe_tests")


@pytest.mark.skipif(True, reason="no CUDA device on this machine")
def test_needs_a_gpu():
    pass
'''


def _run(tmp_path, ci: bool) -> subprocess.CompletedProcess:
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")  # its addopts (-rs)
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(ROOT)
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           "test_probe.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_under_ci_a_missing_package_fails_and_a_gpu_skip_is_listed(tmp_path):
    out = _run(tmp_path, ci=True)
    assert "1 failed, 1 skipped" in out.stdout, out.stdout + out.stderr
    assert "add the package to the `test` extra" in out.stdout and "SKIPPED [1]" in out.stdout, out.stdout
    assert "no CUDA device on this machine" in out.stdout, out.stdout


def test_outside_ci_both_skip_with_their_reasons(tmp_path):
    out = _run(tmp_path, ci=False)
    assert "2 skipped" in out.stdout and "no_such_package_for_gradprobe_tests" in out.stdout, out.stdout + out.stderr


def _readme_commands() -> tuple[str, str]:
    """The README's venv line and its test command (the first indented line that runs pytest)."""
    text = (ROOT / "README.md").read_text()
    venv = next(line for line in text.splitlines() if "python3 -m venv" in line)
    test = next(line.strip() for line in text.splitlines() if line.startswith("    ") and "python -m pytest" in line)
    return venv, test


def test_ci_runs_the_readme_test_command_inside_a_virtualenv_it_makes():
    """Issue 40: CI proves the README's test command inside a fresh virtualenv, made as the README says."""
    venv, test = _readme_commands()
    assert test == "pip install torch==2.13.0 -e '.[test]' && python -m pytest", test
    assert "python3 -m venv .venv && . .venv/bin/activate" in venv, venv
    text = (ROOT / ".ci" / "run").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    made = lines.index("python3 -m venv .venv && . .venv/bin/activate")
    assert lines[made + 1:] == [test], lines
