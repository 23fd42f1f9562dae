"""A server started in the system temp directory works; /health says the warm worker is up only once it has
imported torch; a call's timeout counts from when its child starts on the user's code. Through the real server."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import anyio
import httpx2
import pytest
from mcp import Client

from conftest import EXAMPLES, ROOT, server_params
from test_http import free_port
from test_sandbox_hostile import project


@pytest.mark.anyio
async def test_a_server_whose_cwd_is_the_temp_dir_works(tmp_path):
    params = server_params()
    params.cwd = tempfile.gettempdir()  # `python -m gradprobe serve` there puts it first on sys.path
    target = {"project_dir": str(EXAMPLES), "model": "gp103_heads_in_dict.py", "timeout_s": 60}
    with anyio.fail_after(120):
        async with Client(params, read_timeout_seconds=120) as c:
            result = await c.call_tool("inspect_parameters", {"target": target})
    assert not result.is_error, result.content
    assert any(f["code"] == "GP103" for f in result.structured_content["findings"]), result.structured_content


def _zygote_of(server: int) -> int | None:
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
                if int(stat[1]) == server and b"sandbox/zygote.py" in open(f"/proc/{d}/cmdline", "rb").read():
                    return int(d)
            except (OSError, ValueError, IndexError):
                pass
    return None


def test_health_reports_the_warm_worker_only_once_it_has_imported_torch(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gradprobe", "serve", "--http", "--port", str(port),
                             "--allow-root", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                up = httpx2.get(f"http://127.0.0.1:{port}/health", timeout=2).json().get("warm_worker")
            except (httpx2.HTTPError, ValueError):
                up = None
            if up:
                zygote = _zygote_of(proc.pid)
                assert zygote is not None
                assert "libtorch" in open(f"/proc/{zygote}/maps").read()  # it has imported torch
                return
            time.sleep(0.05)
        raise AssertionError("the warm worker never became ready")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.anyio
async def test_the_timeout_counts_from_the_users_code(client, tmp_path):
    """A cold child (the target names its interpreter) imports torch before the user's code: not inside the call's
    3 s, of which the user's code takes 2."""
    tmp = project(tmp_path, "import time\ndef build_model():\n    time.sleep(2)\n    return nn.Linear(3, 1)\n")
    target = {"project_dir": tmp, "model": "case.py", "timeout_s": 3, "python": sys.executable}
    result = await client.call_tool("inspect_parameters", {"target": target})
    sc = result.structured_content
    assert sc["ok"] is True, sc["findings"][:1]
