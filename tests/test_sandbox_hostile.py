"""Hostile and broken user code through the real server: each ends in a finding or a clear tool error,
in time, with the server alive and no child left behind."""

from __future__ import annotations

import os
import sys
import textwrap
import time

import anyio
import pytest
from mcp import Client

from conftest import server_params

HEADER = "import torch\nimport torch.nn as nn\n"
FOOTER = "\ndef make_inputs():\n    return torch.randn(2, 3)\n"


def project(tmp_path, body: str, name: str = "case.py", extra: dict | None = None) -> str:
    (tmp_path / name).write_text(HEADER + textwrap.dedent(body) + FOOTER)
    for fname, text in (extra or {}).items():
        (tmp_path / fname).write_text(text)
    return str(tmp_path)


def _procs() -> dict[int, tuple[int, str, str]]:
    raw = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = open(f"/proc/{d}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            stat = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
            cgroup = open(f"/proc/{d}/cgroup").read()
            comm = open(f"/proc/{d}/comm").read().strip()
            uid = open(f"/proc/{d}/status").read().split("\nUid:", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            continue
        raw[int(d)] = (int(stat[1]), stat[0], cmd, cgroup, comm, uid)
    out = {}
    for pid, (ppid, state, cmd, cgroup, _comm, _uid) in raw.items():
        if state == "Z":
            cmd = f"<zombie {pid} of {ppid}>"
        elif _is_spare(pid, raw) or any(_is_spare(k, raw) and raw[k][0] == pid for k in raw):
            cmd = "<spare>"  # the warm worker's next call, forked ahead of time and waiting for its job
        out[pid] = (ppid, cmd, cgroup)
    return out


def _is_spare(pid: int, raw: dict) -> bool:
    """An idle spare's pid 1 (still uid 0: no call's code ever ran as root; named gp-spare until its job comes)
    whose parent, its keeper, is a child of a warm worker."""
    ppid, _, _, _, comm, uid = raw[pid]
    keeper = raw.get(ppid)
    return (comm == "gp-spare" and uid == "0" and keeper is not None and keeper[4] == "gp-spare"
            and "gradprobe/sandbox/zygote.py" in raw.get(keeper[0], (0, "", ""))[2])


def children_alive() -> list[str]:
    """Sandboxed processes still running that one of *this test run's* servers started: every descendant of a
    `gradprobe serve` child of this process other than its warm worker and its idle spare, and anything in one of
    those servers' cgroup subtrees (daemons that left the tree). Other gradprobe servers on the machine are not
    looked at."""
    procs = _procs()
    servers = {pid for pid, (ppid, cmd, _) in procs.items() if ppid == os.getpid() and "gradprobe serve" in cmd}
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    out = []
    todo = [k for s in servers for k in kids.get(s, [])]
    while todo:
        pid = todo.pop()
        ppid, cmd, _ = procs[pid]
        if not (ppid in servers and "gradprobe/sandbox/zygote.py" in cmd) and cmd != "<spare>":
            out.append(cmd)
        todo += kids.get(pid, [])
    marks = [f"/srv-{s}-" for s in servers]
    out += [cmd for pid, (_, cmd, cg) in procs.items() if any(m in cg for m in marks) and cmd not in out and cmd != "<spare>"]
    return out


def none_left(within_s: float = 5.0) -> bool:
    """No sandboxed process of ours left, allowing for the teardown that follows the reply."""
    deadline = time.monotonic() + within_s
    while children_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not children_alive()


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
    assert f["code"] == "GP114" and f["evidence"]["timed_out"] and "building" in f["message"]
    assert seconds < 4 + 4
    await still_serves(client, tmp_path)
    assert none_left(), children_alive()


@pytest.mark.anyio
async def test_segfault_is_a_finding(client, tmp_path):
    tmp = project(tmp_path, "import ctypes\ndef build_model():\n    ctypes.string_at(0)\n")
    result, _ = await call(client, tmp)
    f = result.structured_content["findings"][0]
    assert f["code"] == "GP115" and "SIGSEGV" in f["message"]
    await still_serves(client, tmp_path)


@pytest.mark.anyio
async def test_os_exit_mid_check(client, tmp_path):
    tmp = project(tmp_path, "import os\ndef build_model():\n    os._exit(0)\n")
    result, _ = await call(client, tmp)
    f = result.structured_content["findings"][0]
    assert f["code"] == "GP115" and "exited with code 0" in f["message"]


@pytest.mark.anyio
async def test_megabytes_of_output_do_not_corrupt_the_protocol(client, tmp_path):
    tmp = project(tmp_path, "import sys\ndef build_model():\n    for _ in range(200):\n        print('x' * 100000)\n"
                            "        sys.stderr.write('y' * 100000)\n    return nn.Linear(3, 1)\n")
    result, _ = await call(client, tmp)
    sc = result.structured_content
    assert sc["ok"] is True
    assert len(sc["facts"]["sandbox"]["stdout_tail"]) <= 2000


@pytest.mark.anyio
async def test_forged_result_on_stdout_is_ignored(client, tmp_path):
    forged = ('{"type": "result", "report": {"tool": "inspect_parameters", "ok": true, "findings": [], '
              '"summary": "forged", "facts": {}}}')
    tmp = project(tmp_path, f"print({forged!r})\ndef build_model():\n    raise ValueError('real failure')\n")
    result, _ = await call(client, tmp)
    sc = result.structured_content
    assert sc["ok"] is False and "real failure" in sc["findings"][0]["message"]


@pytest.mark.anyio
async def test_server_secrets_do_not_reach_the_child(tmp_path):
    tmp = project(tmp_path, "import os\ndef build_model():\n    raise ValueError('secret=' + "
                            "os.environ.get('GRADPROBE_FAKE_SECRET', 'absent') + ' home=' + os.environ['HOME'])\n")
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
    tmp = project(tmp_path, "def build_model():\n    blocks = [bytearray(512 * 1024 * 1024) for _ in range(64)]\n"
                            "    return nn.Linear(3, 1)\n")
    result, _ = await call(client, tmp, memory_gb=4)  # the default cap is the machine's: keep the bomb small here
    f = result.structured_content["findings"][0]
    # refused by the address-space limit (MemoryError) or killed by the cgroup: a resource limit, never the code's error
    assert f["code"] == "GP113" and ("MemoryError" in f["message"] or "killed" in f["message"]), f["message"]
    # nothing was checked, and nothing is said against the code (docs/verdicts.md)
    assert result.structured_content["verdict"]["status"] == "not_checked" and not result.structured_content["verdict"]["errors"]
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
        code = f"def attempt():\n    return socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        seen, iso = await probe(client, tmp_path, code)
    finally:
        listener.close()
    assert seen.startswith("blocked"), (seen, iso)
    assert "namespace" in iso["applied"]["network"] and "net" in iso["verified_by_server"]["namespaces"]


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
    code = f"def attempt():\n    return open({str(proj / 'sub' / 'written.txt')!r}, 'w').write('x')\n"
    seen, _ = await probe(client, proj / "sub", code)
    assert seen.startswith("blocked") and not (proj / "sub" / "written.txt").exists()
    (proj / "sub2").mkdir()
    code = "def attempt():\n    return open(os.path.join(os.environ['TMPDIR'], 'ok.txt'), 'w').write('x')\n"
    seen, _ = await probe(client, proj / "sub2", code)
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
    # the child is pid 1 of its own pid namespace: its parent has no pid it could name (getppid() == 0)
    seen, _ = await probe(client, tmp_path, "import signal\ndef attempt():\n    ppid = os.getppid()\n"
                          "    if ppid == 0:\n        raise PermissionError('no parent visible')\n"
                          "    os.kill(ppid, signal.SIGKILL)\n    return 'sent'\n")
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
    # 512 forks of a torch-sized process take seconds on a busy 2-core machine: the limit is for a hang, not speed
    result, seconds = await call(client, tmp, timeout_s=120)
    f = result.structured_content["findings"][0]
    assert f["code"] == "GP100" and "forked" in f["message"], f["message"]
    assert int(f["message"].rsplit("forked ", 1)[1].split()[0]) < 1000
    assert none_left(), children_alive()
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
    if iso["verified_by_server"]["syscalls"] == "seccomp filter active":
        sub = tmp_path / "s"
        sub.mkdir()
        seen, _ = await probe(client, sub, "def attempt():\n    return socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n")
        assert seen.startswith("blocked"), seen
        # IPv4 is allowed only inside the call's own network namespace (a torchrun rendezvous on 127.0.0.1):
        # nothing outside it is reachable
        out = tmp_path / "o"
        out.mkdir()
        seen, _ = await probe(client, out, "def attempt():\n    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
                                           "    s.settimeout(3)\n    s.connect(('1.1.1.1', 53))\n    return 'connected'\n")
        assert seen.startswith("blocked"), seen


# --- issue 17: what an attacker found beyond the first suite ---


def _fake_interpreter(tmp_path, marker: str) -> str:
    """An executable that is not Python: it reports what it can do, leaves a daemon, and exits."""
    script = tmp_path / "fakepython"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        echo "uid=$(id -u)" >&2
        grep -l hunter2 /proc/[0-9]*/environ >/dev/null 2>&1 && echo "LEAK:environ" >&2
        cat /etc/shadow >/dev/null 2>&1 && echo "LEAK:shadow" >&2
        echo x > {tmp_path}/written-outside 2>/dev/null && echo "LEAK:write" >&2
        (exec 3<>/dev/tcp/127.0.0.1/22) 2>/dev/null && echo "LEAK:tcp" >&2
        setsid bash -c 'exec -a {marker} sleep 300' </dev/null >/dev/null 2>&1 &
        echo "procs=$(ls -d /proc/[0-9]* | wc -l)" >&2
        exit 3
        """))
    script.chmod(0o755)
    return str(script)


@pytest.mark.anyio
async def test_a_named_interpreter_that_is_not_python_starts_inside_every_layer(tmp_path):
    marker = f"gradprobe-test-daemon-{os.getpid()}-{time.monotonic_ns()}"
    fake = _fake_interpreter(tmp_path, marker)
    proj = tmp_path / "proj"
    proj.mkdir()
    tmp = project(proj, "def build_model():\n    return nn.Linear(3, 1)\n")
    async with Client(server_params(env={"GRADPROBE_FAKE_SECRET": "hunter2"}), read_timeout_seconds=120) as c:
        result, _ = await call(c, tmp, python=fake)
        sc = result.structured_content
        f = sc["findings"][0]
        err = f["evidence"]["stderr_tail"]
        # it ran (inside every layer) but ended before gradprobe's child started: the interpreter's failure, GP117
        assert f["code"] == "GP117" and "exited with code 3" in f["message"], f
        assert "uid=65534" in err and "LEAK" not in err, err
        assert int(err.split("procs=")[1].split()[0]) <= 8, err  # its own pid namespace (the host has hundreds)
        assert not (tmp_path / "written-outside").exists()
        verified = sc["facts"]["sandbox"]["isolation"]["verified_by_server"]
        assert verified["identity"].startswith("uid 65534") and "MISSING" not in str(verified), verified
    time.sleep(0.5)
    assert not [p for p in _procs().values() if marker in p[1]], "the daemon outlived the call"


@pytest.mark.anyio
async def test_32bit_syscall_entry_is_killed(client, tmp_path):
    # socket(AF_INET, SOCK_STREAM, 0) through `int 0x80` (i386 number 359), from a 64-bit process
    attempt = """
    import ctypes, mmap
    def attempt():
        code = bytes.fromhex('53' 'b867010000' 'bb02000000' 'b901000000' '31d2' 'cd80' '5b' 'c3')
        buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        buf.write(code)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        fd = ctypes.CFUNCTYPE(ctypes.c_int)(addr)()
        if fd < 0:
            raise PermissionError(fd)
        return fd
    """
    seen, iso = await probe(client, tmp_path, attempt)
    assert "SIGSYS" in seen or seen.startswith("blocked"), (seen, iso)


@pytest.mark.anyio
async def test_clone3_is_enosys_and_namespace_clones_are_denied(client, tmp_path):
    attempt = """
    import ctypes
    def attempt():
        libc = ctypes.CDLL(None, use_errno=True)
        r3 = libc.syscall(435, None, 0)
        e3 = ctypes.get_errno()
        rn = libc.syscall(56, 0x10000000 | 17, None, None, None, None)  # clone(CLONE_NEWUSER | SIGCHLD)
        en = ctypes.get_errno()
        return f'{r3},{e3},{rn},{en}'
    """
    seen, _ = await probe(client, tmp_path, attempt)
    assert seen == "ok:-1,38,-1,1", seen  # ENOSYS, EPERM


@pytest.mark.anyio
async def test_child_is_not_root_and_cannot_touch_the_installation_or_project(client, tmp_path):
    (tmp_path / "data.txt").write_text("x")
    attempt = f"""
    import sys
    def attempt():
        out = [str(os.getuid())]
        for what, fn in (('shadow', lambda: open('/etc/shadow').read()),
                         ('chmod-python', lambda: os.chmod(os.path.realpath(sys.executable), 0o4755)),
                         ('chmod-project', lambda: os.chmod({str(tmp_path / 'data.txt')!r}, 0o777)),
                         ('utime-project', lambda: os.utime({str(tmp_path / 'data.txt')!r}, (0, 0)))):
            try:
                fn()
                out.append(what)
            except OSError:
                pass
        return ','.join(out)
    """
    mode = os.stat(os.path.realpath(sys.executable)).st_mode
    seen, _ = await probe(client, tmp_path, attempt)
    assert seen == "ok:65534", seen
    assert os.stat(os.path.realpath(sys.executable)).st_mode == mode
    assert os.stat(tmp_path / "data.txt").st_mtime > 0


@pytest.mark.anyio
async def test_no_unix_socket_outside_the_call_is_reachable(client, tmp_path):
    import socket

    where = tmp_path / "elsewhere"
    where.mkdir()
    path = str(where / "planted.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    os.chmod(path, 0o777)
    os.chmod(where, 0o755)
    listener.listen(1)
    listener.settimeout(0.1)
    proj = tmp_path / "proj"
    proj.mkdir()
    try:
        code = f"def attempt():\n    s = socket.socket(socket.AF_UNIX)\n    s.connect({path!r})\n    return s.send(b'x')\n"
        seen, _ = await probe(client, proj, code)
        try:
            conn, _ = listener.accept()
            got = conn.recv(1)
        except OSError:
            got = b""
    finally:
        listener.close()
    assert seen.startswith("blocked") and got == b"", seen


@pytest.mark.anyio
async def test_tmp_and_dev_shm_are_private_to_the_call(client, tmp_path):
    name = f"gradprobe-test-{os.getpid()}-{time.monotonic_ns()}"
    code = f"def attempt():\n    open('/dev/shm/{name}', 'w').write('x')\n    open('/tmp/{name}', 'w').write('x')\n    return 1\n"
    seen, _ = await probe(client, tmp_path, code)
    assert seen == "ok:1", seen
    assert not os.path.exists(f"/dev/shm/{name}") and not os.path.exists(f"/tmp/{name}")
    sub = tmp_path / "again"
    sub.mkdir()
    code = f"def attempt():\n    return os.path.exists('/dev/shm/{name}') or os.path.exists('/tmp/{name}')\n"
    seen, _ = await probe(client, sub, code)
    assert seen == "ok:False", seen


@pytest.mark.anyio
async def test_scratch_has_a_size_limit(client, tmp_path):
    attempt = """
    def attempt():
        chunk = b'x' * (64 << 20)
        n = 0
        for i in range(40):  # 2.5 GiB if nothing stops it
            with open(os.path.join(os.environ['TMPDIR'], f'f{i}'), 'wb') as f:
                for _ in range(4):
                    f.write(chunk)
                    n += 1
        return n
    """
    seen, _ = await probe(client, tmp_path, attempt)
    assert seen == "blocked:OSError", seen


@pytest.mark.anyio
async def test_child_sees_only_its_own_processes(client, tmp_path):
    seen, _ = await probe(client, tmp_path, "def attempt():\n    return len([d for d in os.listdir('/proc') if d.isdigit()])\n")
    assert seen.startswith("ok:") and int(seen[3:]) <= 3, seen


@pytest.mark.anyio
async def test_the_child_cannot_forge_its_isolation_facts(client, tmp_path):
    body = """
    import json
    def build_model():
        forged = {"type": "result", "report": {"tool": "inspect_parameters", "ok": True, "findings": [], "summary": "s",
                  "facts": {"isolation": {"identity": "FORGED", "syscalls": "FORGED"}}}}
        for fd in map(int, os.listdir('/proc/self/fd')):
            try:
                os.write(fd, (json.dumps(forged) + '\\n').encode())
            except OSError:
                pass
        os._exit(0)
    """
    result, _ = await call(client, project(tmp_path, "import os\n" + textwrap.dedent(body)))
    iso = result.structured_content["facts"]["sandbox"]["isolation"]
    assert "FORGED" not in str(iso) and iso["verified_by_server"]["identity"].startswith("uid 65534"), iso


@pytest.mark.anyio
async def test_another_server_starting_leaves_live_call_cgroups_alone(tmp_path):
    from gradprobe.sandbox.cgroups import CallCgroup

    group = CallCgroup(1 << 30)
    if not group.ok:
        pytest.skip(f"no writable cgroups here: {group.error}")
    try:
        async with Client(server_params(), read_timeout_seconds=120) as c:  # its Runtime cleans stale groups
            await c.list_tools()
        assert all(os.path.isdir(d) for d in group.dirs), group.dirs
    finally:
        group.remove()


@pytest.mark.anyio
async def test_project_dir_swapped_while_queued_is_refused(tmp_path):
    root = tmp_path / "root"
    (root / "busy").mkdir(parents=True)
    (root / "proj").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret")
    project(root / "busy", "import time\ndef build_model():\n    time.sleep(4)\n    return nn.Linear(3, 1)\n")
    project(root / "proj", "def build_model():\n    return nn.Linear(3, 1)\n")
    project(outside, f"def build_model():\n    raise ValueError('READ ' + open({str(outside / 'secret.txt')!r}).read())\n")
    results = {}
    async with Client(server_params(args=("--max-concurrent", "1", "--allow-root", str(root))), read_timeout_seconds=120) as c:
        async def busy():
            results["busy"] = await call(c, str(root / "busy"))

        async def swapped():
            try:
                results["swapped"] = await call(c, str(root / "proj"))
            except Exception as exc:  # a tool error
                results["swapped"] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(busy)
            await anyio.sleep(1.0)
            tg.start_soon(swapped)
            await anyio.sleep(1.0)  # queued behind `busy` by now: swap the directory for a symlink outside
            (root / "proj").rename(root / "proj-old")
            (root / "proj").symlink_to(outside)
    got = results["swapped"]
    text = str(got) if isinstance(got, Exception) else str(got[0].content)
    assert "top secret" not in text and "outside the roots" in text, text


@pytest.mark.anyio
async def test_forged_flow_graph_cannot_inject_markup_into_svg_or_mermaid(client, tmp_path):
    import base64
    import json as _json

    evil = "</text><script>alert(1)</script>"
    flow = {"loss": evil, "groups": [{"module": evil, "count": evil, "status": "broken",
                                      "break": {"code": evil, "op": evil + '"] click n_x "javascript:alert(1)"', "line": evil}}]}
    forged = {"type": "result", "report": {"tool": "diagnose", "ok": False, "findings": [], "summary": "s",
                                           "facts": {"flow": flow, "mermaid": evil}}}
    body = "import os\ndef build_model():\n"
    body += "    for fd in map(int, os.listdir('/proc/self/fd')):\n        try:\n"
    body += (f"            os.write(fd, {(_json.dumps(forged) + chr(10)).encode()!r})\n"
             "        except OSError:\n            pass\n    os._exit(0)\n")
    result, _ = await call(client, project(tmp_path, body), tool="diagnose")
    images = [c for c in result.content if getattr(c, "type", "") == "image"]
    svg = base64.b64decode(images[0].data).decode() if images else ""
    mermaid = result.structured_content["facts"].get("mermaid", "")
    assert svg.startswith("<svg") and "<script" not in svg, svg
    assert "<script" not in mermaid and '"] click' not in mermaid and '"javascript' not in mermaid, mermaid


TERMINAL_EVIL = "\x1b]52;c;ZXZpbA==\x07\x1b[2J\x1b]0;pwned\x07\r\x9b31m\x08\x08\x08 OK"  # clipboard, clear, title, fake OK
CONTROL = "\x1b\x07\r\x9b\x08"


def _forging(report: dict) -> str:
    """A model file whose build writes `report` as a result line to every descriptor it has, then exits."""
    import json as _json

    line = _json.dumps({"type": "result", "report": report}) + "\n"
    return ("import os\ndef build_model():\n    for fd in map(int, os.listdir('/proc/self/fd')):\n        try:\n"
            f"            os.write(fd, {line.encode()!r})\n        except OSError:\n            pass\n    os._exit(0)\n")


def _cli(*args: str):
    import subprocess

    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH")}
    out = subprocess.run([sys.executable, "-m", "gradprobe", *args, "--no-color"], capture_output=True, timeout=300, env=env)
    # bytes decoded by hand: text mode would turn a carriage return into a newline before the check sees it
    return subprocess.CompletedProcess(out.args, out.returncode, out.stdout.decode("utf-8", "replace"),
                                       out.stderr.decode("utf-8", "replace"))


def test_cli_output_carries_no_terminal_control_characters(tmp_path):
    evil = TERMINAL_EVIL.encode("unicode_escape").decode()
    (tmp_path / "case.py").write_text(f"import torch.nn as nn\ndef build_model():\n    raise ValueError('{evil}')\n")
    out = _cli("inspect_parameters", str(tmp_path / "case.py"))
    assert "ValueError" in out.stdout, out.stdout + out.stderr
    assert not any(ch in out.stdout + out.stderr for ch in CONTROL), repr(out.stdout + out.stderr)


def test_cli_prints_a_forged_report_without_terminal_control_characters(tmp_path):
    e = TERMINAL_EVIL
    flow = {"loss": e, "groups": [{"module": e, "count": 1, "status": "broken", "break": {"code": e, "op": e, "line": 3}}]}
    finding = {"code": "GP101" + e, "name": e, "severity": "error", "message": e, "parameters": [e] * 3,
               "location": {"file": "/x/" + e, "line": e, "code": e}, "evidence": {"traceback": e}, "fix": e}
    report = {"tool": "diagnose" + e, "ok": e, "summary": e, "findings": [finding], "facts": {"flow": flow}}
    (tmp_path / "case.py").write_text(_forging(report))
    out = _cli("diagnose", str(tmp_path / "case.py"), "--mermaid")
    assert "pwned" in out.stdout and "ZXZpbA==" in out.stdout, out.stdout + out.stderr  # the text is shown ...
    assert not any(ch in out.stdout + out.stderr for ch in CONTROL), repr(out.stdout + out.stderr)  # ... inert


def test_cli_prints_a_forged_tool_error_without_terminal_control_characters(tmp_path):
    (tmp_path / "case.py").write_text(_forging({"tool_error": TERMINAL_EVIL}))
    out = _cli("inspect_parameters", str(tmp_path / "case.py"))
    assert out.returncode == 2 and "pwned" in out.stderr, out.stdout + out.stderr
    assert not any(ch in out.stdout + out.stderr for ch in CONTROL), repr(out.stdout + out.stderr)
    out = _cli("inspect_parameters", str(tmp_path / "case.py"), "--json")
    assert "pwned" in out.stdout and not any(ch in out.stdout for ch in CONTROL), repr(out.stdout)  # JSON escapes


@pytest.mark.anyio
async def test_a_newline_in_a_field_cannot_forge_an_audit_line(tmp_path):
    """The server's audit log (stderr over stdio) holds one JSON record per call: a caller's newline, carriage
    return or terminal escape in `model` or `project_dir` stays inside its record, escaped."""
    import json as _json

    from mcp.client.stdio import stdio_client

    forged = 'x.py\n2026-01-01 00:00:00,000 gradprobe.audit call {"caller": "admin", "tool": "forged", "outcome": "ok"}'
    fields = {"model": forged + "\r\x1b[2K", "project_dir": str(tmp_path) + "\n" + forged.split("\n", 1)[1]}
    log = tmp_path / "server.err"
    with open(log, "w") as errlog:
        async with Client(stdio_client(server_params(), errlog=errlog), read_timeout_seconds=300) as c:
            for target in ({"project_dir": str(tmp_path), "model": fields["model"]},
                           {"project_dir": fields["project_dir"], "model": "x.py"}):
                r = await c.call_tool("inspect_parameters", {"target": target})
                assert r.is_error, r
    text = log.read_text()
    assert not any(ch in text for ch in "\r\x1b") and not any(line.startswith("2026-01-01") for line in text.splitlines()), text
    records = [line.split(" ", 3) for line in text.splitlines() if line.split(" ", 3)[2:3] == ["gradprobe.audit"]]
    assert len(records) == 2 and all(r[3].startswith("call {") for r in records), text
    parsed = [_json.loads(r[3][len("call "):]) for r in records]
    assert [p["caller"] for p in parsed] == ["local", "local"] and [p["tool"] for p in parsed] == ["inspect_parameters"] * 2
    assert parsed[0]["model"] == fields["model"] and parsed[1]["project"] == fields["project_dir"], parsed
