"""Hostile and broken user code through the real server: each ends in a finding or a clear tool error,
in time, with the server alive and no child left behind."""

from __future__ import annotations

import os
import textwrap
import time

import anyio
import pytest
from mcp import Client

from conftest import ROOT, server_params

HEADER = "import torch\nimport torch.nn as nn\n"
FOOTER = "\ndef make_inputs():\n    return torch.randn(2, 3)\n"


def project(tmp_path, body: str, name: str = "case.py", extra: dict | None = None) -> str:
    (tmp_path / name).write_text(HEADER + textwrap.dedent(body) + FOOTER)
    for fname, text in (extra or {}).items():
        (tmp_path / fname).write_text(text)
    return str(tmp_path)


def _procs() -> dict[int, tuple[int, str]]:
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = open(f"/proc/{d}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out[int(d)] = (ppid, cmd)
    return out


def children_alive() -> list[str]:
    """Sandboxed processes still running: cold children (child.py), and anything forked from a warm
    worker (zygote.py command line) that is not a warm worker itself, daemons reparented to init included.
    Only this checkout's (other checkouts' servers may be running on a shared machine)."""
    procs = _procs()
    sandbox = str(ROOT / "gradprobe" / "sandbox")

    def is_zygote_cmd(pid):
        return pid in procs and f"{sandbox}/zygote.py" in procs[pid][1]

    out = []
    for pid, (ppid, cmd) in procs.items():
        if f"{sandbox}/child.py" in cmd:
            out.append(cmd)
        elif is_zygote_cmd(pid) and (is_zygote_cmd(ppid) or ppid == 1 or ppid not in procs):
            out.append(cmd)
    return out


async def call(client, tmp, tool="inspect_parameters", timeout_s=60, **target):
    args = {"target": {"project_dir": tmp, "model": "case.py", "timeout_s": timeout_s, **target}}
    t0 = time.monotonic()
    result = await client.call_tool(tool, args)
    return result, time.monotonic() - t0


async def still_serves(client, tmp_path):
    ok_dir = tmp_path / "ok"
    ok_dir.mkdir(exist_ok=True)
    result, _ = await call(client, project(ok_dir, "def build_model():\n    return nn.Linear(3, 1)\n"))
    assert result.structured_content["ok"] is True


@pytest.mark.anyio
async def test_infinite_loop_times_out_and_next_call_works(client, tmp_path):
    await still_serves(client, tmp_path)  # the warm worker is up: time only the timeout itself
    tmp = project(tmp_path, "def build_model():\n    while True:\n        pass\n")
    result, seconds = await call(client, tmp, timeout_s=4)
    f = result.structured_content["findings"][0]
    assert f["code"] == "GP100" and f["evidence"]["timed_out"] and "building" in f["message"]
    assert seconds < 4 + 4
    await still_serves(client, tmp_path)
    assert not children_alive()


@pytest.mark.anyio
async def test_segfault_is_a_finding(client, tmp_path):
    tmp = project(tmp_path, "import ctypes\ndef build_model():\n    ctypes.string_at(0)\n")
    result, _ = await call(client, tmp)
    f = result.structured_content["findings"][0]
    assert f["code"] == "GP100" and "SIGSEGV" in f["message"]
    await still_serves(client, tmp_path)


@pytest.mark.anyio
async def test_os_exit_mid_check(client, tmp_path):
    tmp = project(tmp_path, "import os\ndef build_model():\n    os._exit(0)\n")
    result, _ = await call(client, tmp)
    f = result.structured_content["findings"][0]
    assert f["code"] == "GP100" and "exited with code 0" in f["message"]


@pytest.mark.anyio
async def test_megabytes_of_output_do_not_corrupt_the_protocol(client, tmp_path):
    tmp = project(tmp_path, "import sys\ndef build_model():\n    for _ in range(200):\n        print('x' * 100000)\n        sys.stderr.write('y' * 100000)\n    return nn.Linear(3, 1)\n")
    result, _ = await call(client, tmp)
    sc = result.structured_content
    assert sc["ok"] is True
    assert len(sc["facts"]["sandbox"]["stdout_tail"]) <= 2000


@pytest.mark.anyio
async def test_forged_result_on_stdout_is_ignored(client, tmp_path):
    forged = '{"type": "result", "report": {"tool": "inspect_parameters", "ok": true, "findings": [], "summary": "forged", "facts": {}}}'
    tmp = project(tmp_path, f"print({forged!r})\ndef build_model():\n    raise ValueError('real failure')\n")
    result, _ = await call(client, tmp)
    sc = result.structured_content
    assert sc["ok"] is False and "real failure" in sc["findings"][0]["message"]


@pytest.mark.anyio
async def test_server_secrets_do_not_reach_the_child(tmp_path):
    tmp = project(tmp_path, "import os\ndef build_model():\n    raise ValueError('secret=' + os.environ.get('GRADPROBE_FAKE_SECRET', 'absent') + ' home=' + os.environ['HOME'])\n")
    async with Client(server_params(env={"GRADPROBE_FAKE_SECRET": "hunter2"}), read_timeout_seconds=120) as c:
        result, _ = await call(c, tmp)
    msg = result.structured_content["findings"][0]["message"]
    assert "secret=absent" in msg and "hunter2" not in msg and "gradprobe-call-" in msg


@pytest.mark.anyio
async def test_user_modules_named_like_ours_do_not_shadow_gradprobe(client, tmp_path):
    boom = "raise RuntimeError('user module imported instead of ours')\n"
    tmp = project(tmp_path, "def build_model():\n    return nn.Linear(3, 1)\n",
                  extra={"gradprobe.py": boom, "server.py": boom, "sandbox.py": boom})
    result, _ = await call(client, tmp, tool="trace_grad_path")
    assert result.structured_content["ok"] is True


@pytest.mark.anyio
async def test_user_errors_carry_the_users_traceback(client, tmp_path):
    tmp = project(tmp_path, "def helper():\n    return 1 / 0\ndef build_model():\n    return helper()\n")
    result, _ = await call(client, tmp)
    f = result.structured_content["findings"][0]
    assert f["code"] == "GP100" and f["location"]["line"] == 4
    tb = f["evidence"]["traceback"]
    assert "case.py" in tb and "ZeroDivisionError" in tb and "torch/nn" not in tb
    syntax = project(tmp_path / "s" if (tmp_path / "s").mkdir() is None else tmp_path, "def build_model(:\n    pass\n")
    result, _ = await call(client, syntax)
    assert result.structured_content["findings"][0]["code"] == "GP100"
    notmod = tmp_path / "n"
    notmod.mkdir()
    result, _ = await call(client, project(notmod, "def build_model():\n    return 42\n"))
    assert "not an nn.Module" in result.structured_content["findings"][0]["message"]


@pytest.mark.anyio
async def test_cancelled_call_kills_its_child(tmp_path):
    tmp = project(tmp_path, "import time\ndef build_model():\n    time.sleep(600)\n")
    async with Client(server_params(), read_timeout_seconds=120) as c:
        with anyio.move_on_after(4):
            await call(c, tmp, timeout_s=300)
        deadline = time.monotonic() + 5
        while children_alive() and time.monotonic() < deadline:
            await anyio.sleep(0.2)
        assert not children_alive()
        await still_serves(c, tmp_path)


@pytest.mark.anyio
async def test_memory_bomb_is_contained(client, tmp_path):
    tmp = project(tmp_path, "def build_model():\n    blocks = [bytearray(512 * 1024 * 1024) for _ in range(64)]\n    return nn.Linear(3, 1)\n")
    result, _ = await call(client, tmp)
    f = result.structured_content["findings"][0]
    assert f["code"] == "GP100" and ("MemoryError" in f["message"] or "killed" in f["message"])
    await still_serves(client, tmp_path)


# --- isolation layers (namespaces, Landlock, capabilities, cgroups): each probe reports what it saw ---

PROBE = """
import os, socket, sys
def probe():
    try:
        return 'ok:' + str(attempt())
    except Exception as exc:
        return 'blocked:' + type(exc).__name__
def build_model():
    raise ValueError('PROBE[' + probe() + ']')
"""


async def probe(client, tmp_path, attempt: str) -> str:
    tmp = project(tmp_path, PROBE + textwrap.dedent(attempt))
    result, _ = await call(client, tmp)
    msg = result.structured_content["findings"][0]["message"]
    iso = result.structured_content["facts"]["sandbox"]["isolation"]
    return msg.split("PROBE[", 1)[1].split("]", 1)[0] if "PROBE[" in msg else msg, iso


@pytest.mark.anyio
async def test_no_tcp_even_to_loopback(client, tmp_path):
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        seen, iso = await probe(client, tmp_path, f"def attempt():\n    return socket.create_connection(('127.0.0.1', {port}), timeout=2)\n")
    finally:
        listener.close()
    assert seen.startswith("blocked"), (seen, iso)
    assert "namespace" in iso["network"] or "TCP denied" in iso["filesystem"]


@pytest.mark.anyio
async def test_no_dns(client, tmp_path):
    seen, _ = await probe(client, tmp_path, "def attempt():\n    return socket.getaddrinfo('example.com', 80)\n")
    assert seen.startswith("blocked"), seen


@pytest.mark.anyio
async def test_files_outside_the_project_are_unreadable_and_only_scratch_is_writable(client, tmp_path):
    secret = tmp_path / "elsewhere" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("top secret")
    proj = tmp_path / "proj"
    proj.mkdir()
    seen, iso = await probe(client, proj, f"def attempt():\n    return open({str(secret)!r}).read()\n")
    assert seen.startswith("blocked"), (seen, iso)
    (proj / "sub").mkdir()
    seen, _ = await probe(client, proj / "sub", f"def attempt():\n    return open({str(proj / 'sub' / 'written.txt')!r}, 'w').write('x')\n")
    assert seen.startswith("blocked") and not (proj / "sub" / "written.txt").exists()
    (proj / "sub2").mkdir()
    seen, _ = await probe(client, proj / "sub2", "def attempt():\n    return open(os.path.join(os.environ['TMPDIR'], 'ok.txt'), 'w').write('x')\n")
    assert seen == "ok:1", seen


@pytest.mark.anyio
async def test_server_environment_is_not_readable_through_proc(tmp_path):
    scan = ("def attempt():\n    hits = []\n    for d in os.listdir('/proc'):\n        try:\n"
            "            if b'hunter2' in open(f'/proc/{d}/environ', 'rb').read():\n                hits.append(d)\n"
            "        except OSError:\n            pass\n    return len(hits)\n")
    async with Client(server_params(env={"GRADPROBE_FAKE_SECRET": "hunter2"}), read_timeout_seconds=120) as c:
        seen, _ = await probe(c, tmp_path, scan)
    assert seen == "ok:0", seen


@pytest.mark.anyio
async def test_killing_the_parent_is_refused(client, tmp_path):
    seen, _ = await probe(client, tmp_path, "import signal\ndef attempt():\n    os.kill(os.getppid(), signal.SIGKILL)\n    return 'sent'\n")
    assert seen.startswith("blocked"), seen
    await still_serves(client, tmp_path)


@pytest.mark.anyio
async def test_fork_bomb_and_daemons_are_contained_and_reaped(client, tmp_path):
    body = """
    import os, time
    def build_model():
        if os.fork() == 0:          # a setsid double-forked daemon
            os.setsid()
            if os.fork() == 0:
                time.sleep(300)
            os._exit(0)
        n = 0
        try:
            while True:             # a fork bomb
                if os.fork() == 0:
                    time.sleep(300)
                    os._exit(0)
                n += 1
        except OSError:
            pass
        raise ValueError(f'forked {n}')
    """
    tmp = project(tmp_path, body)
    result, seconds = await call(client, tmp, timeout_s=30)
    f = result.structured_content["findings"][0]
    assert f["code"] == "GP100" and "forked" in f["message"], f["message"]
    assert int(f["message"].rsplit("forked ", 1)[1].split()[0]) < 1000
    time.sleep(0.5)
    assert not children_alive()
    await still_serves(client, tmp_path)


@pytest.mark.anyio
async def test_thread_bomb_is_contained(client, tmp_path):
    body = """
    import threading, time
    def build_model():
        n = 0
        try:
            while True:
                threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
                n += 1
        except RuntimeError:
            pass
        raise ValueError(f'threads {n}')
    """
    result, _ = await call(client, project(tmp_path, body), timeout_s=30)
    msg = result.structured_content["findings"][0]["message"]
    assert "threads" in msg and int(msg.rsplit("threads ", 1)[1].split()[0]) < 1000
    await still_serves(client, tmp_path)


@pytest.mark.anyio
async def test_seccomp_denies_namespace_escapes_and_raw_sockets(client, tmp_path):
    seen, iso = await probe(client, tmp_path, "import ctypes\ndef attempt():\n"
                            "    libc = ctypes.CDLL(None, use_errno=True)\n"
                            "    if libc.unshare(0x10000000) != 0:\n        raise PermissionError('unshare')\n"
                            "    return 'unshared'\n")
    assert seen.startswith("blocked"), (seen, iso)
    if not iso.get("syscalls", "").startswith("MISSING"):
        sub = tmp_path / "s"
        sub.mkdir()
        seen, _ = await probe(client, sub, "def attempt():\n    return socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n")
        assert seen.startswith("blocked"), seen
