"""What one caller, or anyone who can reach the port, can take from the others over HTTP: sessions and connections.
A real server on 127.0.0.1, raw sockets and plain HTTP requests, bounded loops."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from conftest import ROOT, wait_healthy
from test_http import HEADERS, INIT, TOKENS, authed, free_port
from test_sandbox_hostile import project
from test_sandbox_memory import SCAN, _halves

PER_CALLER = 32  # gradprobe.server.sessions.PER_CALLER
PER_ADDRESS = 64  # gradprobe.server.http.connection_caps(256)[0]: connections one source address keeps
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("limits")
    tmp.chmod(0o755)  # with roots, a call reads its project as others would: the root is readable to them
    keys = tmp_path_factory.mktemp("limits-tokens")  # the token file lives outside every root (the server insists)
    (keys / "tokens").write_text(TOKENS)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gradprobe", "serve", "--http", "--port", str(port), "--token-file", str(keys / "tokens"),
         "--allow-root", str(tmp), "--header-timeout", "60"],  # idle connections are not dropped by the timeout here
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc)
    yield {"url": url, "port": port, "root": tmp}
    proc.terminate()
    try:
        proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def _open_session(http: httpx2.Client, url: str, token: str) -> tuple[int, str | None]:
    r = http.post(url + "/mcp", json=INIT, headers={**HEADERS, "Authorization": f"Bearer {token}"})
    return r.status_code, r.headers.get("mcp-session-id")


def _use(http: httpx2.Client, url: str, token: str, sid: str) -> int:
    headers = {**HEADERS, "Authorization": f"Bearer {token}", "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"}
    return http.post(url + "/mcp", json=INITIALIZED, headers=headers).status_code


def test_one_caller_opening_many_sessions_pays_for_it_alone(server):
    url = server["url"]
    with httpx2.Client(timeout=30) as http:
        sids = []
        for _ in range(PER_CALLER + 8):
            status, sid = _open_session(http, url, "alice-secret-token")
            assert status == 200 and sid
            sids.append(sid)
        assert _use(http, url, "alice-secret-token", sids[0]) == 404  # her oldest idle sessions made room
        assert _use(http, url, "alice-secret-token", sids[-1]) == 202
        live = sum(_use(http, url, "alice-secret-token", s) == 202 for s in sids)
        assert live <= PER_CALLER, live
        status, sid = _open_session(http, url, "bob-secret-token")  # nobody else's session went
        assert status == 200 and _use(http, url, "bob-secret-token", sid) == 202


def test_idle_connections_cannot_switch_the_server_off(server):
    """300 connections that never send a byte (more than --max-connections): /health and authenticated work are
    still served; the server dropped idle ones to make room."""
    socks = []
    try:
        for _ in range(300):
            s = socket.socket()
            s.settimeout(5)
            s.connect(("127.0.0.1", server["port"]))
            socks.append(s)
        time.sleep(0.5)
        with httpx2.Client(timeout=30) as http:
            assert http.get(server["url"] + "/health").status_code == 200
            status, sid = _open_session(http, server["url"], "bob-secret-token")
            assert status == 200 and _use(http, server["url"], "bob-secret-token", sid) == 202
        closed = 0
        for s in socks:
            s.setblocking(False)
            try:
                closed += s.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        assert closed >= 300 - PER_ADDRESS, closed  # one address holds at most its share
    finally:
        for s in socks:
            s.close()


@pytest.mark.anyio
async def test_one_users_request_is_not_in_the_next_users_memory(server):
    """Over HTTP: alice's call carries a marker in inline `setup`; bob's next call searches its whole memory."""
    import json

    a, b = _halves()
    setup = f"import torch, torch.nn as nn\nKEY = '{a}{b}'\nmodel = nn.Linear(3, 1)\ninputs = torch.randn(2, 3)\n"
    probe = server["root"] / "bob"
    probe.mkdir()
    tmp = project(probe, SCAN.replace("PAIRS", repr([(a, b)])))
    async with authed("alice-secret-token") as http:
        async with Client(streamable_http_client(server["url"] + "/mcp", http_client=http)) as c:
            r = await c.call_tool("inspect_parameters", {"target": {"project_dir": str(server["root"]), "setup": setup}})
            assert not r.is_error, r.content
    async with authed("bob-secret-token") as http:
        async with Client(streamable_http_client(server["url"] + "/mcp", http_client=http)) as c:
            r = await c.call_tool("inspect_parameters", {"target": {"project_dir": tmp, "model": "case.py"}})
    msg = r.structured_content["findings"][0]["message"]
    assert "PROBE[" in msg, msg
    seen = json.loads(msg.split("PROBE[", 1)[1].rsplit("]", 1)[0])
    assert seen["scanned"] > 10 << 20 and seen["halves"] >= 1, seen
    assert seen["raw"] == {} and seen["objects"] == [], seen
