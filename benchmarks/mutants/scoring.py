"""Score case directories through the real server over MCP, judged as ../shared/tools/score_corpus.py judges.

`judge` is that script's rule, verbatim in effect: a HIT is a finding with an expected code that names
every culprit (in `parameters`, or for a Function / a parameterless bug anywhere in the finding's
text); LINE is right when that finding's location.line is within 2 of the expected line and its file
ends with the expected file. The case directories are bugzoo-format (case.py + expected.json), so the
shared script can score the same directory too.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

REPO = Path(__file__).resolve().parents[2]


def finding_text(f: dict) -> str:
    return json.dumps(f, sort_keys=True, default=str)


def names_culprit(f: dict, culprit: str) -> bool:
    params = [str(p) for p in (f.get("parameters") or [])]
    for p in params:
        if p == culprit or p.endswith("." + culprit) or culprit.endswith("." + p):
            return True
    return culprit in finding_text(f)


def judge(expected: dict, findings: list[dict]) -> dict:
    codes = set(expected.get("codes") or [])
    culprits = list(expected.get("culprits") or [])
    fn = expected.get("function")
    if fn and fn not in culprits:
        culprits.append(fn)
    if not expected.get("buggy"):
        errors = [f for f in findings if f.get("severity") == "error"]
        return {"ok": not errors, "kind": "control", "errors": [f.get("code") for f in errors]}
    matching = [f for f in findings if f.get("code") in codes]
    hits = [f for f in matching if all(names_culprit(f, c) for c in culprits)]
    line = expected.get("line")
    want_file = expected.get("file")
    line_ok = None
    if hits and line:
        line_ok = any(
            isinstance((f.get("location") or {}).get("line"), int)
            and abs(f["location"]["line"] - line) <= 2
            and (not want_file or str(f["location"].get("file") or "").replace("\\", "/").endswith(want_file))
            for f in hits
        )
    return {"ok": bool(hits), "kind": "buggy", "code_seen": bool(matching), "line_ok": line_ok,
            "codes_seen": sorted({f.get("code") for f in findings})}


def _summary(f: dict) -> dict:
    loc = f.get("location") or {}
    return {"code": f.get("code"), "severity": f.get("severity"), "parameters": (f.get("parameters") or [])[:6],
            "n_parameters": len(f.get("parameters") or []), "file": loc.get("file"), "line": loc.get("line"),
            "message": str(f.get("message") or "")[:240]}


async def _score(cases: list[Path], tool: str, timeout: float, on_row: Callable[[dict], None]) -> list[dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    params = StdioServerParameters(command=sys.executable, args=["-m", "gradprobe", "serve"], env=env, cwd=str(REPO))
    rows = []
    async with Client(params, read_timeout_seconds=timeout) as client:
        for case in cases:
            expected = json.loads((case / "expected.json").read_text())
            project = Path(tempfile.mkdtemp(prefix="gp-case-")) / "project"
            shutil.copytree(case, project, ignore=shutil.ignore_patterns("expected.json", "__pycache__"))
            t0 = time.perf_counter()
            try:
                res = await client.call_tool(tool, {"target": {"project_dir": str(project), "model": "case.py",
                                                               "device": "cpu"}})
                findings = (res.structured_content or {}).get("findings") or []
                verdict = judge(expected, findings)
                verdict["findings"] = [_summary(f) for f in findings]
                if res.structured_content and not res.is_error:  # the report's own verdict, and whether it is consistent
                    from gradprobe.verdict import inconsistencies

                    verdict["verdict"] = (res.structured_content.get("verdict") or {}).get("status")
                    verdict["verdict_problems"] = inconsistencies(res.structured_content)
                if res.is_error:
                    verdict["error"] = " ".join(getattr(c, "text", "") for c in res.content)[:300]
            except Exception as exc:  # a protocol failure is a miss, and is shown
                verdict = {"ok": False, "kind": "buggy" if expected.get("buggy") else "control",
                           "error": repr(exc)[:300]}
            shutil.rmtree(project.parent, ignore_errors=True)
            verdict.update(id=case.name, s=round(time.perf_counter() - t0, 2))
            rows.append(verdict)
            on_row(verdict)
    return rows


def score(cases: list[Path], tool: str = "diagnose", timeout: float = 180.0,
          on_row: Callable[[dict], None] = lambda r: None) -> list[dict[str, Any]]:
    return anyio.run(_score, cases, tool, timeout, on_row)
