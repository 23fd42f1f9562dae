"""The shape gates, run by `python -m pytest` (so CI keeps them):

- ruff (config in pyproject.toml): the usual rules, plus C901 (no function more complex than 15) and E501
  (no line over 130 columns) on gradprobe/, tests/ and benchmarks/;
- mypy with `disallow_untyped_defs`: every function in gradprobe/ is annotated;
- no module over 600 lines in gradprobe/, benchmarks/, and among the tests' helper modules (conftest.py, factories.py:
  every tests/ module that is not a test_*.py file); split it by idea: one module, one idea.

The layering is the other gate: tests/test_architecture.py.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: mypy's own dependency
    import tomli as tomllib

MAX_MODULE_LINES = 600


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[test]')")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_is_clean() -> None:
    """Includes the complexity (C901, max 15) and line-length (E501, 130) gates: see [tool.ruff] in pyproject.toml."""
    r = _run("ruff", "check", "--output-format", "concise", "gradprobe", "tests", "benchmarks")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_ruff_gates_are_configured() -> None:
    """The gates live in pyproject.toml, so an editor's ruff and CI's agree; this test keeps them from being dropped."""
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    assert {"C901", "E501"} <= set(lint["lint"]["select"])
    assert lint["lint"]["mccabe"]["max-complexity"] <= 15
    assert lint["line-length"] <= 130


def test_mypy_is_clean() -> None:
    """Every function in gradprobe/ annotated: `disallow_untyped_defs = true` in [tool.mypy]."""
    r = _run("mypy")
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_function_must_be_annotated() -> None:
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy.get("disallow_untyped_defs") is True and mypy.get("packages") == ["gradprobe"]


def _gated_modules() -> list[Path]:
    """The modules the size gate covers: all of gradprobe/ and benchmarks/, and the tests' helpers (the test_*.py files
    themselves are not gated)."""
    helpers = [p for p in sorted((ROOT / "tests").rglob("*.py")) if not p.name.startswith("test_")]
    return sorted((ROOT / "gradprobe").rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py")) + helpers


def test_no_module_is_over_600_lines() -> None:
    gated = _gated_modules()
    assert {"conftest.py", "factories.py", "sweep.py", "operators.py"} <= {p.name for p in gated}
    lines = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines()) for p in gated}
    long = {name: n for name, n in lines.items() if n > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by idea): {long}"
