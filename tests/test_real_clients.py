"""Real MCP clients people use: the MCP Inspector CLI and the TypeScript SDK (inside desktop/IDE hosts),
plus the example Python client program. npm packages go to a scratch cache; the tests skip only
when node/npm are missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EXAMPLES, ROOT, one_process_at_a_time
from gradprobe.tools import NAMES

PACKAGES = ["@modelcontextprotocol/inspector@2.12.0", "@modelcontextprotocol/sdk@1.32.2"]
CACHE = Path(os.environ.get("GRADPROBE_NPM_CACHE", Path.home() / ".cache" / "gradprobe-test-npm"))


@pytest.fixture(scope="module")
def npm_dir() -> Path:
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("node/npm are not installed on this machine")
    marker = CACHE / ".installed"
    with one_process_at_a_time(CACHE):
        if not marker.exists() or marker.read_text() != " ".join(PACKAGES):
            CACHE.mkdir(parents=True, exist_ok=True)
            subprocess.run(["npm", "init", "-y"], cwd=CACHE, check=True, capture_output=True)
            subprocess.run(["npm", "install", *PACKAGES, "--no-audit", "--no-fund"], cwd=CACHE, check=True,
                           capture_output=True, timeout=600)
            marker.write_text(" ".join(PACKAGES))
    return CACHE


def inspector(npm_dir: Path, *args: str) -> subprocess.CompletedProcess:
    exe = str(npm_dir / "node_modules" / ".bin" / "inspector")
    return subprocess.run([exe, "--cli", sys.executable, "-m", "gradprobe", "serve", *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_inspector_cli_lists_tools_and_diagnoses(npm_dir):
    listed = inspector(npm_dir, "--method", "tools/list")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert {t["name"] for t in json.loads(listed.stdout)["tools"]} >= {"diagnose", "trace_grad_path"}
    args = json.dumps({"target": {"project_dir": str(EXAMPLES), "model": "gp303_no_grad_block.py"}})
    called = inspector(npm_dir, "--method", "tools/call", "--tool-name", "diagnose", "--tool-args-json", args)
    assert called.returncode == 0, called.stderr[-2000:]
    result = json.loads(called.stdout)
    f = result["structuredContent"]["findings"][0]
    assert f["code"] == "GP303" and f["location"]["line"] == 15
    assert [c["type"] for c in result["content"]] == ["text", "image"]


def test_typescript_sdk_client(npm_dir):
    script = npm_dir / "ts_client.mjs"
    shutil.copy(ROOT / "examples" / "clients" / "ts_client.mjs", script)
    out = subprocess.run(["node", str(script), str(EXAMPLES), "gp305_argmax_codebook.py", sys.executable],
                         capture_output=True, text=True, timeout=300, cwd=npm_dir)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["hasOutputSchema"] and len(data["tools"]) == len(NAMES)
    assert data["root"]["code"] == "GP305" and data["ok"] is False
    assert "image/svg+xml" in data["contentTypes"]
    assert "checking" in data["progress"]


def test_python_client_program():
    client = str(ROOT / "examples" / "clients" / "python_client.py")
    out = subprocess.run([sys.executable, client, str(EXAMPLES / "gp201_optimizer_misses_head.py")],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "GP201" in out.stdout and "gp201_optimizer_misses_head.py:28" in out.stdout
