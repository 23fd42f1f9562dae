"""The layering is a gate: the import contracts in pyproject.toml ([tool.importlinter]) hold, checked by `lint-imports`.

    cli -> server -> sandbox -> checks      (layers: a lower part never imports a higher one)
    checks imports neither sandbox nor server (it is a library: it knows nothing of how it is run)
    server imports neither checks nor torch  (directly: the child runs them)
    the child side never imports server
    nothing but server and cli imports server

docs/architecture.md draws the parts and these arrows.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: mypy's own dependency
    import tomli as tomllib


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_the_import_contracts_hold() -> None:
    if importlib.util.find_spec("importlinter") is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    beside = Path(sys.executable).parent / "lint-imports"  # the one installed with this interpreter's import-linter
    exe = str(beside) if beside.exists() else shutil.which("lint-imports") or "lint-imports"
    r = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(_contracts())} kept, 0 broken" in r.stdout, r.stdout


def test_the_contracts_say_what_the_architecture_says() -> None:
    """The rules of docs/architecture.md, each as a contract (so none can be dropped quietly)."""
    by_type: dict[str, list[dict]] = {}
    for c in _contracts():
        by_type.setdefault(c["type"], []).append(c)
    (layers,) = by_type["layers"]
    assert layers["layers"] == ["gradprobe.cli", "gradprobe.server", "gradprobe.sandbox", "gradprobe.checks"]
    forbidden = {(src, dst) for c in by_type["forbidden"] for src in c["source_modules"] for dst in c["forbidden_modules"]}
    assert {("gradprobe.checks", "gradprobe.sandbox"), ("gradprobe.checks", "gradprobe.server"),
            ("gradprobe.server", "gradprobe.checks"), ("gradprobe.server", "torch"),
            ("gradprobe.sandbox.child", "gradprobe.server"), ("gradprobe.loading", "gradprobe.server")} <= forbidden
    (protected,) = by_type["protected"]
    assert protected["protected_modules"] == ["gradprobe.server"]
    assert sorted(protected["allowed_importers"]) == ["gradprobe.cli", "gradprobe.server"]


def test_every_package_is_in_the_import_graph() -> None:
    """A folder without __init__.py is a namespace package: import-linter does not see its imports, so no contract covers it."""
    missing = sorted(str(d.relative_to(ROOT)) for d in (ROOT / "gradprobe").rglob("*")
                     if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")) and not (d / "__init__.py").exists())
    assert not missing, f"add an __init__.py to {missing}"
