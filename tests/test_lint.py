"""The lint and type gate: `ruff check gradprobe tests benchmarks` and `mypy` (config in pyproject.toml) must pass."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from conftest import ROOT


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[test]')")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_is_clean():
    r = _run("ruff", "check", "gradprobe", "tests", "benchmarks")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_is_clean():
    r = _run("mypy")
    assert r.returncode == 0, r.stdout + r.stderr
