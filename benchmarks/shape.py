"""The shape of the code, as the gates see it: the longest functions (lines, cyclomatic complexity), the
longest modules, and how many places build a finding of each code.

    python benchmarks/shape.py [--root DIR] [--top 10]

DIR is a checkout (default: this one), so a before/after table is two runs. Complexity is ruff's C901
(mccabe) measure, read from `ruff check --select C901` with the limit at 0; torch is not imported.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = re.compile(r"GP\d{3}")


def complexities(package: Path) -> dict[tuple[str, int], int]:
    """(file, line of the def) -> mccabe complexity, for every function in the package."""
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--select", "C901", "--config",
                        "lint.mccabe.max-complexity=0", "--output-format", "json", str(package)],
                       capture_output=True, text=True, timeout=600)
    out: dict[tuple[str, int], int] = {}
    for item in json.loads(r.stdout or "[]"):
        m = re.search(r"\((\d+) > 0\)", item["message"])
        if m:
            out[(str(Path(item["filename"]).resolve()), item["location"]["row"])] = int(m.group(1))
    return out


def functions(package: Path) -> list[tuple[int, int, str]]:
    """(lines, complexity, qualified name) of every function, longest first."""
    cc = complexities(package)
    rows = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        rel = path.relative_to(package.parent)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                rows.append((lines, cc.get((str(path.resolve()), node.lineno), 1), f"{rel}:{node.lineno} {node.name}"))
    return sorted(rows, reverse=True)


def modules(package: Path) -> list[tuple[int, str]]:
    return sorted(((len(p.read_text(encoding="utf-8").splitlines()), str(p.relative_to(package.parent)))
                   for p in package.rglob("*.py")), reverse=True)


def emit_sites(package: Path) -> Counter[str]:
    """Code -> the number of calls that build a finding of it: `GP302.finding(` or `make_finding("GP302"`,
    or make_finding with the code in a variable (counted as "a code in a variable")."""
    sites: Counter[str] = Counter()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "finding" and isinstance(func.value, ast.Name) \
                    and CODE.fullmatch(func.value.id):
                sites[func.value.id] += 1
            elif getattr(func, "id", getattr(func, "attr", None)) == "make_finding" and node.args:
                first = node.args[0]
                sites[first.value if isinstance(first, ast.Constant) else "a code in a variable"] += 1
    return sites


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="a checkout of gradprobe (default: this one)")
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args(argv)
    package = args.root.resolve() / "gradprobe"
    print(f"## The {args.top} longest functions\n\n| function | lines | complexity |\n| --- | --- | --- |")
    for lines, cc, name in functions(package)[: args.top]:
        print(f"| `{name}` | {lines} | {cc} |")
    print(f"\n## The {args.top} longest modules\n\n| module | lines |\n| --- | --- |")
    for lines, name in modules(package)[: args.top]:
        print(f"| `{name}` | {lines} |")
    sites = emit_sites(package)
    print("\n## Places that build a finding of each code\n\n| code | places |\n| --- | --- |")
    for code in sorted(sites):
        print(f"| {code} | {sites[code]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
