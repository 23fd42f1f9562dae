"""The layering is a gate: the import contracts in pyproject.toml ([tool.importlinter]) hold, checked by `lint-imports`.

    cli -> server -> sandbox -> checks      (layers: a lower part never imports a higher one)
    checks imports neither sandbox nor server (it is a library: it knows nothing of how it is run)
    server imports neither checks nor torch  (directly: the child runs them)
    the child side never imports server
    nothing but server and cli imports server
    no import cycles: between the children of any package (acyclic_siblings), and between any two modules

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
    (acyclic,) = by_type["acyclic_siblings"]
    assert acyclic["ancestors"] == ["gradprobe"] and "depth" not in acyclic and "skip_descendants" not in acyclic
    assert set(acyclic.get("ignore_imports", [])) <= KNOWN_PACKAGE_CYCLES, "break a new cycle; do not ignore it"


# The known package-level cycles the acyclic contract ignores (pyproject.toml says why): this list may only shrink.
KNOWN_PACKAGE_CYCLES = {
    "gradprobe.loading -> gradprobe.checks.core.torchcompat",
    "gradprobe.loading -> gradprobe.checks.optimizer.group_sources",
    "gradprobe.sandbox.run_check -> gradprobe.scriptmode.*",
}


def module_cycles(package: str) -> list[list[str]]:
    """Every import cycle between modules of `package` (grimp's graph, imports under TYPE_CHECKING and inside functions
    included): one shortest cycle per strongly connected group of modules."""
    import grimp

    graph = grimp.build_graph(package, include_external_packages=False, cache_dir=None)
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(root: str) -> None:  # Tarjan's strongly connected components, iteratively
        work = [(root, iter(sorted(imports[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(imports[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    m = stack.pop()
                    group.add(m)
                    if m == node:
                        break
                if len(group) > 1:
                    groups.append(group)

    for m in sorted(imports):
        if m not in index:
            visit(m)
    cycles = []
    for group in groups:
        start = min(group)
        back = min((graph.find_shortest_chain(importer=b, imported=start) or () for b in imports[start] & group), key=len)
        cycles.append([start, *back])
    return cycles


def test_no_import_cycles_between_modules() -> None:
    """A module never imports, directly or through others, a module that imports it back."""
    if importlib.util.find_spec("grimp") is None:
        pytest.skip("grimp is not installed (it comes with import-linter: pip install -e '.[test]')")
    cycles = module_cycles("gradprobe")
    assert not cycles, "import cycles (move the shared piece to where it belongs):\n" + "\n".join(
        " -> ".join(c) for c in cycles)


def test_every_package_is_in_the_import_graph() -> None:
    """A folder without __init__.py is a namespace package: import-linter does not see its imports, so no contract covers it."""
    missing = sorted(str(d.relative_to(ROOT)) for d in (ROOT / "gradprobe").rglob("*")
                     if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")) and not (d / "__init__.py").exists())
    assert not missing, f"add an __init__.py to {missing}"


def test_every_import_of_gradprobe_resolves() -> None:
    """Every `from gradprobe.X import Y` in the package resolves, the ones inside functions too (mypy's
    ignore_missing_imports does not see a module of ours that moved; a lazy import only fails when its path runs)."""
    import ast
    import importlib

    missing = []
    for path in sorted((ROOT / "gradprobe").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("gradprobe")):
                continue
            try:
                module = importlib.import_module(str(node.module))
            except ImportError:
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}")
                continue
            for alias in node.names:
                if not hasattr(module, alias.name) and importlib.util.find_spec(f"{node.module}.{alias.name}") is None:
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{alias.name}")
    assert not missing, "imports that do not resolve:\n" + "\n".join(missing)
