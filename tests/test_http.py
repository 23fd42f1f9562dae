"""Streamable HTTP for teams, over real HTTP on 127.0.0.1: auth, Host/Origin protection, roots, both eras."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from conftest import EXAMPLES, ROOT, wait_healthy
from gradprobe.tools import NAMES

TOKENS = "alice:alice-secret-token\nbob:bob-secret-token\n"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def http_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("http")
    (tmp / "tokens").write_text(TOKENS)
    outside = tmp_path_factory.mktemp("outside")
    (outside / "case.py").write_text("import torch.nn as nn\ndef build_model():\n    return nn.Linear(2, 2)\n")
    inside = tmp / "root"
    inside.mkdir()
    (inside / "escape").symlink_to(outside)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gradprobe", "serve", "--http", "--port", str(port), "--token-file", str(tmp / "tokens"),
         "--allow-root", str(EXAMPLES), "--allow-root", str(inside), "--header-timeout", "2", "--body-timeout", "2"],
        stdout=open(tmp / "access.log", "w"), stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc)
    yield {"url": url, "inside": inside, "outside": outside, "port": port}
    proc.terminate()
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    err += (tmp / "access.log").read_text()  # uvicorn's access log goes to stdout
    assert "alice-secret-token" not in err and "bob-secret-token" not in err, "a token reached the log"
    assert '"caller": "alice", "tool": "inspect_parameters"' in err, "audit lines name the caller"
    assert "?[redacted]" in err, "the query string of a refused request is redacted, not dropped silently"


def authed(token: str = "alice-secret-token") -> httpx2.AsyncClient:
    return httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=300))


def test_unauthenticated_and_wrong_token_get_401(http_server):
    url = http_server["url"] + "/mcp"
    r = httpx2.post(url, json=INIT, headers=HEADERS)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    r = httpx2.post(url, json=INIT, headers={**HEADERS, "Authorization": "Bearer not-a-token"})
    assert r.status_code == 401
    r = httpx2.post(url, json=INIT, headers={**HEADERS, "Authorization": "Bearer alice-secret-token"})
    assert r.status_code == 200


def test_a_half_sent_request_is_dropped_after_the_header_timeout(http_server):
    with socket.create_connection(("127.0.0.1", http_server["port"])) as s:
        s.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # and nothing more
        s.settimeout(8)
        t0 = time.monotonic()
        assert s.recv(1024) == b"" and time.monotonic() - t0 < 7  # closed by the server, not by our timeout


def _closed_by_server(s: socket.socket, wait_s: float = 8.0) -> bool:
    """Whether the server closed `s` (EOF or reset) before our own `wait_s` ran out; what it sent first is ignored."""
    s.settimeout(wait_s)
    try:
        while s.recv(4096):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


def _authed_head(port: int, length: int) -> bytes:
    return (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer alice-secret-token\r\n"
            f"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def test_a_request_whose_body_never_comes_is_dropped_after_the_body_timeout(http_server):
    with socket.create_connection(("127.0.0.1", http_server["port"])) as s:
        s.sendall(_authed_head(http_server["port"], 4096) + b'{"jsonrpc": "2.0", ')  # and nothing more
        assert _closed_by_server(s)  # (--body-timeout 2) closed by the server, not by our 8 s


def test_a_body_trickled_a_byte_at_a_time_is_dropped_after_the_body_timeout(http_server):
    import select

    with socket.create_connection(("127.0.0.1", http_server["port"])) as s:
        s.sendall(_authed_head(http_server["port"], 4096))
        for _ in range(40):  # 40 bytes over ~12 s, each well inside any per-read timeout: the body's total is bounded
            try:
                s.sendall(b" ")
            except (BrokenPipeError, ConnectionResetError):
                break
            if select.select([s], [], [], 0.3)[0]:
                break
        assert _closed_by_server(s, 1.0), "the trickling request was still open after 40 bytes"


def test_a_token_in_the_query_string_is_refused_and_never_logged(http_server):
    r = httpx2.post(http_server["url"] + "/mcp?access_token=alice-secret-token", json=INIT, headers=HEADERS)
    assert r.status_code == 401  # and the fixture's teardown finds no token in the server's log


@pytest.mark.anyio
async def test_only_listed_interpreters_and_one_answer_for_outside_or_missing(http_server):
    inside = http_server["inside"]
    fake = inside / "python"
    fake.write_text("#!/bin/sh\nid > /tmp/gradprobe-should-not-run\n")
    fake.chmod(0o755)
    (inside / "case.py").write_text("import torch.nn as nn\ndef build_model():\n    return nn.Linear(2, 2)\n")
    async with authed("bob-secret-token") as http:
        async with Client(streamable_http_client(http_server["url"] + "/mcp", http_client=http)) as c:
            target = {"project_dir": str(inside), "model": "case.py", "python": str(fake)}
            r = await c.call_tool("inspect_parameters", {"target": target})
            assert r.is_error and "--allow-python" in r.content[0].text, r.content[0].text
            answers = []
            for model in (f"../../{http_server['outside'].name}/case.py", "../../no-such-dir/nothing.py"):
                r = await c.call_tool("inspect_parameters", {"target": {"project_dir": str(inside), "model": model}})
                assert r.is_error and "is outside the roots" in r.content[0].text, r.content[0].text
                answers.append(r.content[0].text.split("' is outside")[-1])
            assert answers[0] == answers[1], answers


def test_bad_host_and_origin_are_refused(http_server):
    url = http_server["url"] + "/mcp"
    auth = {**HEADERS, "Authorization": "Bearer alice-secret-token"}
    assert httpx2.post(url, json=INIT, headers={**auth, "Host": "evil.example:80"}).status_code == 421
    assert httpx2.post(url, json=INIT, headers={**auth, "Origin": "http://evil.example"}).status_code == 403


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_authenticated_calls_in_both_eras(http_server, mode):
    async with authed() as http:
        async with Client(streamable_http_client(http_server["url"] + "/mcp", http_client=http), mode=mode) as c:
            assert len((await c.list_tools()).tools) == len(NAMES)
            target = {"project_dir": str(EXAMPLES), "model": "gp101_temperature_tensor.py"}
            r = await c.call_tool("inspect_parameters", {"target": target})
            assert r.structured_content["findings"][0]["code"] == "GP101"


@pytest.mark.anyio
async def test_paths_outside_the_roots_are_refused_before_any_child(http_server):
    inside, outside = http_server["inside"], http_server["outside"]
    attempts = [
        str(outside),                              # an absolute path elsewhere
        str(inside / ".." / outside.name),         # .. out of the root
        str(inside / "escape"),                    # a symlink inside the root pointing out
    ]
    async with authed("bob-secret-token") as http:
        async with Client(streamable_http_client(http_server["url"] + "/mcp", http_client=http)) as c:
            for path in attempts:
                r = await c.call_tool("inspect_parameters", {"target": {"project_dir": path, "model": "case.py"}})
                assert r.is_error, path
                assert "outside the roots" in r.content[0].text


def test_non_loopback_bind_without_auth_is_refused():
    env = {k: v for k, v in os.environ.items() if k != "GRADPROBE_TOKENS"}
    out = subprocess.run([sys.executable, "-m", "gradprobe", "serve", "--http", "--host", "0.0.0.0", "--port", str(free_port())],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2 and "without authentication" in out.stderr


def sse_events(text: str) -> list[dict]:
    """The events of an SSE body, each as {field: value} (data lines joined)."""
    events = []
    for block in text.replace("\r\n", "\n").strip().split("\n\n"):
        event: dict = {}
        for line in block.split("\n"):
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            event[field] = event[field] + "\n" + value if field in event and field == "data" else value
        events.append(event)
    return events


def test_sse_streams_send_a_priming_event_with_retry_and_resume(http_server):
    """Each SSE stream opens with an id, empty data and `retry`; a client that lost it resumes with Last-Event-ID."""
    url = http_server["url"] + "/mcp"
    auth = {**HEADERS, "Authorization": "Bearer alice-secret-token"}
    r = httpx2.post(url, json=INIT, headers=auth)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    first, *rest = sse_events(r.text)
    assert first.get("id") and first.get("data") == "" and int(first["retry"]) > 0, first
    assert any('"serverInfo"' in e.get("data", "") for e in rest)
    session = {**auth, "mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    httpx2.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
    r = httpx2.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=session)
    priming, *answer = sse_events(r.text)
    assert priming.get("id") and "retry" in priming and any('"diagnose"' in e.get("data", "") for e in answer)
    with httpx2.stream("GET", url, headers={**session, "Accept": "text/event-stream", "Last-Event-ID": priming["id"]},
                       timeout=10) as replay:
        assert replay.status_code == 200
        seen = ""
        for chunk in replay.iter_text():
            seen += chunk
            if '"diagnose"' in seen:
                break
    assert '"diagnose"' in seen, "the tools/list answer was not replayed after the priming event"


@pytest.mark.anyio
async def test_model_given_as_an_absolute_path_alone_and_roots_still_apply(http_server):
    async with authed() as http:
        async with Client(streamable_http_client(http_server["url"] + "/mcp", http_client=http)) as c:
            r = await c.call_tool("inspect_parameters", {"target": {"model": str(EXAMPLES / "gp101_temperature_tensor.py")}})
            assert not r.is_error, r.content
            assert r.structured_content["findings"][0]["code"] == "GP101"
            r = await c.call_tool("inspect_parameters", {"target": {"model": str(http_server["outside"] / "case.py")}})
            assert r.is_error and "outside the roots" in r.content[0].text


def test_connection_cap_idle_connections_and_a_flood_of_bad_requests(tmp_path):
    """Its own server (--max-connections 8 --header-timeout 1): connections past the cap make room by closing the
    oldest idle ones (so /health is still served), idle ones are closed by the server; hundreds of bad requests
    write a bounded log (a count of the lines dropped, never one line per request), and what a request brings (a
    Host header with a newline-like C1 byte) reaches the log escaped."""
    (tmp_path / "tokens").write_text(TOKENS)
    port = free_port()
    out, err = tmp_path / "stdout.log", tmp_path / "stderr.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gradprobe", "serve", "--http", "--port", str(port), "--token-file", str(tmp_path / "tokens"),
         "--allow-root", str(EXAMPLES), "--cold", "--max-connections", "8", "--header-timeout", "1", "--body-timeout", "1"],
        stdout=open(out, "wb"), stderr=open(err, "wb"), cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
        time.sleep(0.2)  # the server has accepted them
        assert httpx2.get(f"{url}/health", timeout=5).status_code == 200  # past the cap: idle ones made room
        assert all(_closed_by_server(s) for s in idle)  # idle ones are closed by the server (--header-timeout 1) ...
        for s in idle:
            s.close()
        assert httpx2.get(f"{url}/health", timeout=5).status_code == 200  # ... and it serves again
        n = 400
        for _ in range(n):
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
                _closed_by_server(s, 5)
        time.sleep(1.1)  # a new second: the next line carries the count of those dropped
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(_authed_head(port, 2).replace(f"127.0.0.1:{port}".encode(), b"evil\x9b31m.example") + b"{}")
            _closed_by_server(s, 5)
        time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    log = out.read_bytes() + err.read_bytes()
    bad = log.count(b"Invalid HTTP request")
    assert 0 < bad < n / 2, f"{bad} lines for {n} bad requests"
    assert b"log lines dropped]" in log, log[-3000:]
    assert b"\x9b" not in log and b"\xc2\x9b" not in log and b"evil\\x9b31m" in log, log[-2000:]
