"""A server without privilege: the call still gets its own user, mount and pid namespaces (as bubblewrap does
unprivileged), so calls share no /tmp or /dev/shm and a daemon dies with its call. Through the real server.

The interpreter here lives under /root (0700), so a real unprivileged uid cannot start it; the server runs as
uid 0 with every capability gone (`setpriv --bounding-set=-all --inh-caps=-all`), which can no more mount, unshare
or make namespaces without a user namespace than any other uid."""

from __future__ import annotations

import os
import secrets
import shutil
import time

import anyio
import pytest
from mcp import Client

from conftest import server_params
from test_sandbox_hostile import project

SETPRIV = shutil.which("setpriv")
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or SETPRIV is None, reason="needs root to drop it (setpriv)")

WRITER = """
import os, subprocess
def build_model():
    for d in ('/tmp', '/dev/shm', os.environ['HOME']):
        open(os.path.join(d, 'gp-unpriv-TOKEN'), 'w').write('x')
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv('/bin/sleep', ['sleep', 'SECONDS'])
        os._exit(0)
    os.wait()
    return nn.Linear(3, 1)
"""

READER = """
import os
def build_model():
    seen = [d for d in ('/tmp', '/dev/shm') if os.path.exists(os.path.join(d, 'gp-unpriv-TOKEN'))]
    seen += [os.path.join(r, n) for r, _, ns in os.walk('/tmp') for n in ns if n == 'gp-unpriv-TOKEN']
    raise ValueError('PROBE[' + ','.join(seen) + ']')
"""


def _sleepers(seconds: str) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if open(f"/proc/{d}/cmdline", "rb").read() == b"sleep\0" + seconds.encode() + b"\0":
                    out.append(int(d))
            except OSError:
                pass
    return out


@pytest.mark.anyio
async def test_calls_of_a_server_without_privilege_share_no_tmp_and_leave_no_daemon(tmp_path):
    token, seconds = secrets.token_hex(6), str(1000 + secrets.randbelow(9000))
    params = server_params()
    params.args = ["--bounding-set=-all,+setfcap", "--inh-caps=-all", "--", params.command, *params.args]
    params.command = SETPRIV
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    writer = project(tmp_path / "a", WRITER.replace("TOKEN", token).replace("SECONDS", seconds))
    reader = project(tmp_path / "b", READER.replace("TOKEN", token))
    try:
        with anyio.fail_after(120):
            async with Client(params, read_timeout_seconds=120) as c:
                first = await c.call_tool("inspect_parameters", {"target": {"project_dir": writer, "model": "case.py"}})
                assert first.structured_content["ok"] is True, first.structured_content["findings"][:1]
                iso = first.structured_content["facts"]["sandbox"]["isolation"]["verified_by_server"]
                assert "mnt" in iso["namespaces"] and "pid" in iso["namespaces"], iso
                assert "capabilities none" in iso["identity"], iso
                second = await c.call_tool("inspect_parameters", {"target": {"project_dir": reader, "model": "case.py"}})
                msg = second.structured_content["findings"][0]["message"]
                assert "PROBE[]" in msg, msg  # nothing of the first call's /tmp or /dev/shm
                deadline = time.monotonic() + 5
                while _sleepers(seconds) and time.monotonic() < deadline:
                    await anyio.sleep(0.1)
                assert not _sleepers(seconds)  # the setsid daemon died with its call
        assert not [d for d in ("/tmp", "/dev/shm") if os.path.exists(os.path.join(d, f"gp-unpriv-{token}"))]
    finally:
        for pid in _sleepers(seconds):
            os.kill(pid, 9)
        for d in ("/tmp", "/dev/shm"):
            try:
                os.unlink(os.path.join(d, f"gp-unpriv-{token}"))
            except OSError:
                pass
