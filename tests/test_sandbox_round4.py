"""Issue 39, through the real server (stdio, and HTTP where it applies): a target's env never reaches a process that
runs before confinement; a planted interpreter in someone else's folder never runs; the server's own work (the model
file, the step chart) is capped and off its event loop; memory is one budget inside the server's own cgroup; a
root-owned private file in a root stays private; roots belong to tokens; the isolation account is the server's."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from conftest import ROOT, server_params, wait_healthy
from test_http import free_port
from test_sandbox_hostile import project

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (CI runs as root): makes users, cgroups, root files")


def _http_server(tmp: Path, *args: str, tokens: str | None = None, cwd: Path = ROOT) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "gradprobe", "serve", "--http", "--port", str(port), *args]
    if tokens is not None:
        (tmp / "tokens").write_text(tokens)
        cmd += ["--token-file", str(tmp / "tokens")]
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH")}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(tmp / "server.err", "wb"), cwd=cwd, env=env)
    return proc, f"http://127.0.0.1:{port}"


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _http_call(url: str, token: str | None, tool: str, args: dict):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http:
        async with Client(streamable_http_client(url + "/mcp", http_client=http)) as c:
            return await c.call_tool(tool, args)


def _text(result) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


# --- 1. the target's env reaches no process that runs before confinement ---------------------------------------------

def planted_locale(proj: Path, marker: Path) -> dict[str, str]:
    """A project that ships a gconv module (a shared object whose constructor appends its uid and pid namespace to
    `marker`, a path outside the project) and a locale whose character set loads it: glibc dlopens it while any
    process started with the returned env sets up its locale (Python does, before any of its own code runs)."""
    cc, localedef = shutil.which("cc") or shutil.which("gcc"), shutil.which("localedef")
    charmap = Path("/usr/share/i18n/charmaps/ISO-8859-1.gz")
    if not cc or not localedef or not charmap.exists():
        pytest.skip(f"needs a C compiler, localedef and glibc's charmaps (cc={cc}, localedef={localedef}, {charmap})")
    gconv, loc = proj / "gconv", proj / "loc"
    gconv.mkdir()
    loc.mkdir()
    (gconv / "gconv-modules").write_text("module PWN// INTERNAL pwn 1\nmodule INTERNAL PWN// pwn 1\n")
    (proj / "pwn.c").write_text(textwrap.dedent(f"""\
        #include <stdio.h>
        #include <unistd.h>
        __attribute__((constructor)) static void planted(void) {{
            char ns[128] = {{0}};
            ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
            FILE *f = fopen("{marker}", "a");
            if (f) {{ fprintf(f, "uid=%d %s\\n", (int)getuid(), n > 0 ? ns : "?"); fclose(f); }}
        }}
        int gconv(void) {{ return 0; }}
        int gconv_init(void *step) {{ return 1; }}
        """))
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(gconv / "pwn.so"), str(proj / "pwn.c")], check=True)
    text = gzip.decompress(charmap.read_bytes()).decode("latin-1")
    (proj / "PWN").write_text("\n".join("<code_set_name> PWN" if ln.startswith("<code_set_name>") else ln
                                        for ln in text.splitlines()) + "\n", encoding="latin-1")
    subprocess.run([localedef, "-c", "-i", "C", "-f", str(proj / "PWN"), str(loc / "pwn")], capture_output=True)
    env = {"GCONV_PATH": str(gconv), "LOCPATH": str(loc), "LC_ALL": "pwn"}
    probe = subprocess.run([sys.executable, "-I", "-c", "pass"], env={**env, "PATH": os.environ["PATH"]}, capture_output=True)
    assert marker.exists(), f"the planted module did not load in a plain process ({probe.stderr[-300:]!r})"
    marker.unlink()
    return env


def _served(proj: Path) -> None:
    (proj / "case.py").write_text("import torch.nn as nn\ndef build_model():\n    return nn.Linear(3, 1)\n")


@pytest.mark.anyio
async def test_a_planted_gconv_module_never_runs_outside_the_sandbox_over_stdio(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    marker = tmp_path / "ran-outside"
    env = planted_locale(proj, marker)
    _served(proj)
    async with Client(server_params(), read_timeout_seconds=300) as c:
        # `python` named: the cold launcher (the server's own interpreter) starts the call
        for extra in ({"python": sys.executable}, {}):
            r = await c.call_tool("inspect_parameters", {"target": {"project_dir": str(proj), "model": "case.py",
                                                                     "env": env, **extra}})
            assert r.is_error and "GCONV_PATH" in _text(r) and "cannot be given" in _text(r), _text(r)
    assert not marker.exists(), marker.read_text()


@pytest.mark.anyio
async def test_a_planted_gconv_module_never_runs_outside_the_sandbox_over_http(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    os.chmod(tmp_path, 0o755)
    marker = tmp_path / "ran-outside"
    env = planted_locale(proj, marker)
    _served(proj)
    allow = [a for name in env for a in ("--allow-env", name)]
    proc, url = _http_server(tmp_path, "--allow-root", str(proj), "--allow-python", sys.executable, *allow)
    try:
        try:
            code = proc.wait(timeout=60)  # an operator cannot allow these names: the server refuses to start
        except subprocess.TimeoutExpired:
            code = None
        if code is None:  # (the old server started: show what a call then does)
            wait_healthy(url, proc)
            target = {"project_dir": str(proj), "model": "case.py", "env": env, "python": sys.executable}
            await _http_call(url, None, "inspect_parameters", {"target": target})
    finally:
        _stop(proc)
    err = (tmp_path / "server.err").read_text()
    assert not marker.exists(), marker.read_text()
    assert code == 2 and "--allow-env GCONV_PATH" in err, err


def _environ_holders(value: bytes) -> list[tuple[int, str]]:
    """(pid, pid namespace) of every process whose environment block holds `value`."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if value in open(f"/proc/{d}/environ", "rb").read():
                out.append((int(d), os.readlink(f"/proc/{d}/ns/pid")))
        except OSError:
            continue
    return out


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["cold", "warm"])
async def test_the_targets_env_is_set_only_inside_the_sandbox(tmp_path, mode):
    """A variable the target sets reaches its code, and no process outside the call's pid namespace (the cold
    launcher, which becomes the call's keeper, ran before confinement) ever holds it."""
    value = f"round4-{os.getpid()}-{time.monotonic_ns()}"
    body = ("import os, time\ndef build_model():\n    time.sleep(4)\n"
            "    raise ValueError('SAW ' + os.environ.get('GP_ROUND4_MARK', 'nothing'))\n")
    tmp = project(tmp_path, body)
    host_ns = os.readlink("/proc/self/ns/pid")
    seen: list[tuple[int, str]] = []
    done = threading.Event()

    def scan() -> None:
        while not done.is_set():
            seen.extend(_environ_holders(value.encode()))
            time.sleep(0.05)

    args = ("--cold",) if mode == "cold" else ()
    async with Client(server_params(args=args), read_timeout_seconds=300) as c:
        thread = threading.Thread(target=scan, daemon=True)
        thread.start()
        try:
            r = await c.call_tool("inspect_parameters", {"target": {"project_dir": tmp, "model": "case.py",
                                                                     "env": {"GP_ROUND4_MARK": value}}})
        finally:
            done.set()
            thread.join()
    assert f"SAW {value}" in r.structured_content["findings"][0]["message"], r.structured_content["findings"][0]
    assert not [p for p in seen if p[1] == host_ns], seen


@pytest.mark.anyio
async def test_refused_names_are_skipped_by_the_child_too(tmp_path):
    """Below the server's validation (a library caller's Job): the launcher starts with the allow-list only, and the
    child sets none of the refused names, so the planted module runs nowhere."""
    from gradprobe.sandbox.protocol import Job
    from gradprobe.sandbox.runner import Limits, run_child

    proj = tmp_path / "proj"
    proj.mkdir()
    marker = tmp_path / "ran-outside"
    env = planted_locale(proj, marker)
    _served(proj)
    job = Job(tool="inspect_parameters", target={"project_dir": str(proj), "model": "case.py", "env": {**env, "OK_NAME": "1"},
                                                  "timeout_s": 120})
    outcome = await run_child(job, python=sys.executable, timeout_s=120, limits=Limits(memory_bytes=4 << 30))
    assert outcome.report is not None and outcome.report["ok"] is True, (outcome.tool_error, outcome.stderr[-2000:])
    assert not marker.exists(), marker.read_text()


# --- 2. an interpreter planted in someone else's folder never runs ----------------------------------------------------

@pytest.fixture(scope="module")
def intruder():
    """Another user of the machine (made here, removed after): the uid that plants an environment."""
    if os.geteuid() != 0:
        pytest.skip("needs root to add a user (useradd); CI runs as root")
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    name = f"gpintr{os.getpid() % 100000}"
    made = subprocess.run([useradd, "-M", "-N", "-r", "-s", "/usr/sbin/nologin", name], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"useradd failed: {made.stderr.strip()}")
    import pwd

    try:
        yield pwd.getpwnam(name).pw_uid
    finally:
        subprocess.run([shutil.which("userdel") or "/usr/sbin/userdel", name], capture_output=True)


PLANTED = """#!/bin/bash
job=$(cat | tr -d '"\\\\' | head -c 300)
head='{"type": "result", "report": {"tool": "inspect_parameters", "ok": true, "findings": [],'
printf '%s "summary": "PLANTED %s", "facts": {}}}\\n' "$head" "$job" >&"$GRADPROBE_RESULT_FD"
"""


def plant_env(where: Path, uid: int) -> None:
    """A `.venv` whose bin/python is a shell script that reads the call's job and writes its own report, owned by `uid`."""
    (where / ".venv" / "bin").mkdir(parents=True)
    (where / ".venv" / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).parent}\n")
    script = where / ".venv" / "bin" / "python"
    script.write_text(PLANTED)
    script.chmod(0o755)
    for path in (where / ".venv", where / ".venv" / "bin", where / ".venv" / "pyvenv.cfg", script):
        os.chown(path, uid, uid)


def victim(proj: Path) -> dict:
    proj.mkdir(parents=True)
    (proj / "case.py").write_text("import torch.nn as nn\ndef build_model():\n    return nn.Linear(3, 1)\n")
    return {"project_dir": str(proj), "model": "case.py", "setup": "SECRET = 'victim-secret-1234'"}


@pytest.mark.anyio
async def test_an_environment_planted_in_a_shared_parent_or_by_another_user_never_runs(tmp_path, intruder):
    shared = tmp_path / "shared"  # like /tmp: sticky, writable by all, and here even a repository's top
    shared.mkdir()
    (shared / ".git").mkdir()
    shared.chmod(0o1777)
    plant_env(shared, intruder)
    os.chmod(tmp_path, 0o755)
    target = victim(shared / "victim")
    async with Client(server_params(), read_timeout_seconds=300) as c:
        r = await c.call_tool("inspect_parameters", {"target": target})
        sc = r.structured_content
        assert not r.is_error and "PLANTED" not in str(sc) and sc["ok"] is True, _text(r)
        info = sc["facts"]["interpreter"]
        assert info["source"] == "server", info
        skipped = [x for x in info["looked_at"] if str(shared / ".venv") in x]
        assert skipped and "skipped" in skipped[0] and "sticky folder" in skipped[0], info["looked_at"]
        # the same environment inside the project itself, owned by the other user: skipped too
        mine = tmp_path / "mine"
        target = victim(mine / "proj")
        plant_env(mine / "proj", intruder)
        r = await c.call_tool("inspect_parameters", {"target": target})
        sc = r.structured_content
        assert not r.is_error and "PLANTED" not in str(sc) and sc["facts"]["interpreter"]["source"] == "server", _text(r)
        looked = sc["facts"]["interpreter"]["looked_at"]
        assert any("skipped" in x and f"owned by uid {intruder}" in x for x in looked), looked


@pytest.mark.anyio
async def test_over_http_the_search_never_goes_above_the_project(tmp_path, intruder):
    root = tmp_path / "root"
    root.mkdir()
    (root / ".git").mkdir()
    os.chmod(tmp_path, 0o755)
    plant_env(root, intruder)
    for path in (root / ".venv", root / ".venv" / "bin", root / ".venv" / "bin" / "python"):
        os.chown(path, 0, 0)  # even root's own environment above the project is not the project's
    target = victim(root / "victim")
    proc, url = _http_server(tmp_path, "--allow-root", str(root), cwd=tmp_path)
    try:
        wait_healthy(url, proc)
        r = await _http_call(url, None, "inspect_parameters", {"target": target})
    finally:
        _stop(proc)
    sc = r.structured_content
    assert not r.is_error and "PLANTED" not in str(sc), _text(r)
    assert sc["facts"]["interpreter"]["source"] == "server" and not any(
        str(root / ".venv") in x for x in sc["facts"]["interpreter"]["looked_at"]), sc["facts"]["interpreter"]


# --- 3. the server reads no model file whole, and nothing of a call's on its event loop --------------------------------

def _peak_rss(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.anyio
async def test_a_huge_model_file_neither_bloats_nor_stalls_the_server(tmp_path):
    """A 512 MiB sparse case.py: the server's peak memory does not grow by it, and /health is answered while the call
    is in progress (the old server read and parsed the whole file on its event loop: +1 GiB, every caller stalled)."""
    root = tmp_path / "root"
    root.mkdir()
    os.chmod(tmp_path, 0o755)
    big = root / "case.py"
    with open(big, "wb") as f:
        f.truncate(512 << 20)
    proc, url = _http_server(tmp_path, "--allow-root", str(root), cwd=tmp_path)
    answers: list[tuple[float, float]] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                if httpx2.get(f"{url}/health", timeout=60).status_code == 200:
                    answers.append((t0, time.monotonic()))
            except httpx2.HTTPError:
                pass
            time.sleep(0.02)

    try:
        wait_healthy(url, proc)
        before = _peak_rss(proc.pid)
        thread = threading.Thread(target=poll, daemon=True)
        started = time.monotonic()
        thread.start()
        r = await _http_call(url, None, "inspect_parameters", {"target": {"project_dir": str(root), "model": "case.py"}})
        finished = time.monotonic()
        stop.set()
        thread.join()
        grown = _peak_rss(proc.pid) - before
    finally:
        _stop(proc)
    assert not r.is_error or "outside" not in _text(r), _text(r)  # the call itself ends in a report or a tool error
    assert grown < 256 << 20, f"the server's peak RSS grew by {grown >> 20} MiB"
    during = [a for a in answers if a[0] >= started and a[1] < finished]
    assert during, f"no /health answer while the call was in progress ({len(answers)} answers in all)"


# --- 4. the step chart is drawn from what was measured, bounded first -------------------------------------------------

@pytest.mark.anyio
async def test_a_forged_param_groups_cannot_blow_up_the_answer(client, tmp_path):
    import base64
    import json as _json

    from test_sandbox_hostile import _forging

    series = [0.1234567] * 4000
    rows = [{"optimizer": 0, "group": i, "tensors": 3, "lr_as_applied": series, "grad_norm_at_step": series,
             "update_ratio": series} for i in range(12)]
    rows.append({"optimizer": "x" * 1000, "group": 1e300, "tensors": -1})
    report = {"tool": "audit_training", "ok": True, "findings": [], "summary": "s", "facts": {"param_groups": rows}}
    sent = len(_json.dumps(report))
    assert sent > 256 << 10
    (tmp_path / "case.py").write_text(_forging(report))
    r = await client.call_tool("audit_training", {"target": {"project_dir": str(tmp_path), "model": "case.py",
                                                              "timeout_s": 60}, "steps": 4})
    assert not r.is_error, _text(r)
    groups = r.structured_content["facts"]["param_groups"]
    assert all(len(g.get(k, [])) <= 4 for g in groups for k in ("lr_as_applied", "grad_norm_at_step", "update_ratio")), groups
    images = [base64.b64decode(c.data) for c in r.content if getattr(c, "type", "") == "image"]
    answer = len(_json.dumps(r.structured_content)) + sum(len(i) for i in images) + len(_text(r))
    assert images and images[0].startswith(b"<svg"), r.content
    assert answer < 64 << 10, f"{answer} bytes answered for {sent} bytes the child sent"


# --- 9. what the answer says about isolation is the server's own measurement ------------------------------------------

@pytest.mark.anyio
async def test_the_child_cannot_put_isolation_claims_anywhere_in_the_answer(client, tmp_path):
    from test_sandbox_hostile import _forging

    claim = {"verified_by_server": {"identity": "FORGED all good", "syscalls": "FORGED"}}
    facts = {"sandbox": {"child": "FORGED", "isolation": claim}, "isolation": claim,
             "steps": {"sandbox": {"isolation": claim}, "param_groups": []}, "notes": [{"isolation": "FORGED"}]}
    report = {"tool": "inspect_parameters", "ok": True, "findings": [], "summary": "s", "facts": facts}
    (tmp_path / "case.py").write_text(_forging(report))
    r = await client.call_tool("inspect_parameters", {"target": {"project_dir": str(tmp_path), "model": "case.py"}})
    sc = r.structured_content
    sandbox = dict(sc["facts"]["sandbox"])
    tails = sandbox.pop("stdout_tail") + sandbox.pop("stderr_tail")  # what the child printed: its own words, as such
    assert "FORGED" in tails  # (it did print the claim: the forgery went out on every descriptor it had)
    rest = {k: v for k, v in sc["facts"].items() if k != "sandbox"}
    assert "FORGED" not in str(rest) and "FORGED" not in str(sandbox), (rest, sandbox)
    assert sandbox["isolation"]["verified_by_server"]["identity"].startswith("uid "), sandbox["isolation"]
    # a report whose facts are not even an object is still answered, with the server's account
    (tmp_path / "case.py").write_text(_forging({**report, "facts": ["FORGED"]}))
    r = await client.call_tool("inspect_parameters", {"target": {"project_dir": str(tmp_path), "model": "case.py"}})
    assert not r.is_error and "verified_by_server" in r.structured_content["facts"]["sandbox"]["isolation"], _text(r)


# --- 7. a root-owned private file in an allowed root stays private -----------------------------------------------------

READER = """import torch.nn as nn
def build_model():
    seen = []
    for path in {paths!r}:
        try:
            seen.append(open(path).read().strip())
        except OSError as exc:
            seen.append(type(exc).__name__)
    raise ValueError('READ[' + '|'.join(seen) + ']')
"""


def _private_root(tmp_path: Path) -> tuple[Path, Path, Path]:
    """An allowed root holding a root-owned 0600 file (the operator's) and a world-readable one, and a caller's project."""
    root = tmp_path / "root"
    (root / "proj").mkdir(parents=True)
    os.chmod(tmp_path, 0o755)
    secret, public = root / "operator.secret", root / "public.txt"
    secret.write_text("OPERATOR-SECRET")
    secret.chmod(0o600)
    public.write_text("PUBLIC-TEXT")
    public.chmod(0o644)
    (root / "proj" / "case.py").write_text(READER.format(paths=[str(secret), str(public)]))
    return root, secret, public


def _read_back(result) -> str:
    sc = result.structured_content
    return _text(result) if result.is_error else sc["findings"][0]["message"]


@ROOT_ONLY
@pytest.mark.anyio
async def test_a_private_file_in_an_allowed_root_stays_private_over_stdio(tmp_path):
    root, secret, public = _private_root(tmp_path)
    async with Client(server_params(args=("--allow-root", str(root))), read_timeout_seconds=300) as c:
        target = {"project_dir": str(root / "proj"), "model": "case.py", "read_paths": [str(root)]}
        r = await c.call_tool("inspect_parameters", {"target": target})
        seen = _read_back(r)
        assert "OPERATOR-SECRET" not in seen and "READ[PermissionError|PUBLIC-TEXT]" in seen, seen
        r = await c.call_tool("inspect_parameters", {"target": {**target, "read_paths": [str(secret)]}})
        assert r.is_error and "not readable by the call" in _text(r) and "OPERATOR-SECRET" not in _text(r), _text(r)


@ROOT_ONLY
@pytest.mark.anyio
async def test_a_private_file_in_an_allowed_root_stays_private_over_http(tmp_path):
    root, secret, public = _private_root(tmp_path)
    keys = tmp_path / "keys"
    keys.mkdir()
    proc, url = _http_server(keys, "--allow-root", str(root), tokens="alice:alice-secret-token\n", cwd=tmp_path)
    try:
        wait_healthy(url, proc)
        results = []
        for target in ({"project_dir": str(root / "proj"), "model": "case.py", "read_paths": [str(root)]},
                       {"project_dir": str(root), "model": "proj/case.py"},
                       {"project_dir": str(root / "proj"), "model": "case.py", "read_paths": [str(secret)]}):
            results.append(await _http_call(url, "alice-secret-token", "inspect_parameters", {"target": target}))
    finally:
        _stop(proc)
    seen = [_read_back(r) for r in results]
    assert not any("OPERATOR-SECRET" in s for s in seen), seen
    assert "READ[PermissionError|PUBLIC-TEXT]" in seen[0] and "READ[PermissionError|PUBLIC-TEXT]" in seen[1], seen
    assert results[2].is_error and "not readable by the call" in seen[2], seen


# --- 8. roots belong to tokens -----------------------------------------------------------------------------------------

@pytest.mark.anyio
async def test_two_users_roots_on_one_server_stay_apart(tmp_path):
    """alice:TOKEN ROOT in the token file: each user's calls read only their own roots (bob once read alice's data
    through read_paths on a server whose roots held both)."""
    os.chmod(tmp_path, 0o755)
    home = tmp_path / "code"
    for user in ("alice", "bob"):
        (home / user / "proj").mkdir(parents=True)
        (home / user / "data").mkdir()
        (home / user / "data" / "notes.txt").write_text(f"{user.upper()}-DATA")
        (home / user / "proj" / "case.py").write_text(READER.format(paths=[str(home / u / "data" / "notes.txt")
                                                                            for u in ("alice", "bob")]))
    tokens = f"alice:alice-secret-token {home / 'alice'}\nbob:bob-secret-token {home / 'bob'}\ncarol:carol-secret-token\n"
    keys = tmp_path / "keys"
    keys.mkdir()
    proc, url = _http_server(keys, "--allow-root", str(home), tokens=tokens, cwd=tmp_path)

    async def as_user(user: str, **target):
        return await _http_call(url, f"{user}-secret-token", "inspect_parameters", {"target": target})

    try:
        wait_healthy(url, proc)
        bob_reads_alice = await as_user("bob", project_dir=str(home / "bob" / "proj"), model="case.py",
                                  read_paths=[str(home / "alice" / "data")])
        bob_in_alice = await as_user("bob", project_dir=str(home / "alice" / "proj"), model="case.py")
        alice_own = await as_user("alice", project_dir=str(home / "alice" / "proj"), model="case.py",
                            read_paths=[str(home / "alice" / "data")])
        carol_shared = await as_user("carol", project_dir=str(home / "bob" / "proj"), model="case.py",
                               read_paths=[str(home / "alice" / "data")])
    finally:
        _stop(proc)
    for r in (bob_reads_alice, bob_in_alice):
        assert r.is_error and "outside the roots" in _text(r) and "ALICE-DATA" not in _text(r), _text(r)
        assert str(home / "alice") not in _text(r).split("may read:")[-1], _text(r)  # bob is told only his own roots
    assert "READ[ALICE-DATA|FileNotFoundError]" in _read_back(alice_own), _read_back(alice_own)
    assert "ALICE-DATA" in _read_back(carol_shared)  # a user without roots of their own has the server's


def test_the_token_file_inside_a_root_is_refused(tmp_path):
    proc, url = _http_server(tmp_path, "--allow-root", str(tmp_path), tokens="alice:alice-secret-token\n", cwd=tmp_path)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        _stop(proc)
    assert code == 2 and "inside a root" in (tmp_path / "server.err").read_text()


# --- 5. memory is one budget for all checks together ------------------------------------------------------------------

SPAN = """import resource, time
import torch.nn as nn
def build_model():
    t0 = time.time()
    time.sleep(2.5)
    raise ValueError(f'SPAN[{t0:.3f} {time.time():.3f} {resource.getrlimit(resource.RLIMIT_AS)[0]}]')
"""


def _span(result) -> tuple[float, float, int]:
    text = _read_back(result)
    assert "SPAN[" in text, text
    a, b, cap = text.split("SPAN[", 1)[1].split("]", 1)[0].split()
    return float(a), float(b), int(cap)


def _mem_total() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


@pytest.mark.anyio
async def test_the_default_caps_of_the_checks_that_may_run_at_once_fit_in_the_machine(client, tmp_path):
    """Each check's default cap times the checks that run at once (one per core by default) is within the machine's
    memory (the old default let each take the machine's memory less a quarter: 35 GiB of checks on 23.5 GiB)."""
    r = await client.call_tool("inspect_parameters", {"target": {"project_dir": project(tmp_path, SPAN.replace(
        "time.sleep(2.5)", "pass")), "model": "case.py"}})
    _, _, cap = _span(r)
    assert cap * (os.cpu_count() or 2) <= _mem_total(), (cap, os.cpu_count(), _mem_total())


@pytest.mark.anyio
async def test_checks_asking_for_more_than_the_budget_together_wait_and_one_beyond_it_is_refused(tmp_path):
    for name in ("a", "b", "c", "d"):
        (tmp_path / name).mkdir()
        project(tmp_path / name, SPAN)
    args = ("--memory-budget-gb", "3", "--max-concurrent", "2")
    async with Client(server_params(args=args), read_timeout_seconds=300) as c:
        async def one(name: str, **extra):
            target = {"project_dir": str(tmp_path / name), "model": "case.py", **extra}
            return await c.call_tool("inspect_parameters", {"target": target})

        default = _span(await one("a"))
        assert default[2] == int(1.5 * (1 << 30)), default  # the budget over the two slots
        results: dict[str, object] = {}

        async def run(name: str, gb: float) -> None:
            results[name] = await one(name, memory_gb=gb)

        async with anyio.create_task_group() as tg:  # 2 + 2 GB > 3 GB: one waits for the other
            tg.start_soon(run, "a", 2)
            tg.start_soon(run, "b", 2)
        (a0, a1, _), (b0, b1, _) = _span(results["a"]), _span(results["b"])
        assert a1 <= b0 or b1 <= a0, ("overlapped", a0, a1, b0, b1)
        async with anyio.create_task_group() as tg:  # 1 + 1 GB fit: both run at once
            tg.start_soon(run, "c", 1)
            tg.start_soon(run, "d", 1)
        (c0, c1, _), (d0, d1, _) = _span(results["c"]), _span(results["d"])
        assert c0 < d1 and d0 < c1, ("did not overlap", c0, c1, d0, d1)
        r = await one("a", memory_gb=4)
        assert r.is_error and "3.0 GB" in _text(r) and "--memory-budget-gb" in _text(r), _text(r)


# --- 6. the calls' cgroups are bounded by the server's own ------------------------------------------------------------

CHARGE = """import resource
import torch.nn as nn
def build_model():
    blob = b'x' * (1 << 30)
    groups = open('/proc/self/cgroup').read().replace('\\n', ';')
    raise ValueError(f'CG[{groups}] AS[{resource.getrlimit(resource.RLIMIT_AS)[0]}] {len(blob)}')
"""


def _remove_group_tree(group: Path, top: Path) -> None:
    deadline = time.monotonic() + 20
    while group.exists() and time.monotonic() < deadline:
        for d, _, _ in sorted(os.walk(group), key=lambda x: -len(x[0])):
            try:
                for pid in open(os.path.join(d, "cgroup.procs")).read().split():
                    try:
                        open(top / "cgroup.procs", "w").write(pid)
                    except OSError:
                        pass
                os.rmdir(d)
            except OSError:
                pass
        time.sleep(0.2)


@ROOT_ONLY
@pytest.mark.anyio
async def test_a_server_in_a_memory_limited_cgroup_keeps_its_calls_inside_it(tmp_path):
    """The server started in a group with an 8 GiB limit (as under systemd's MemoryMax=): a call's gigabyte is charged
    to that group (v1: its subtree is made below the server's own group; pure v2: the limit is copied onto the
    subtree), and the default cap is sized from it (8 GiB less 2 for the server, over the slots)."""
    v1 = Path("/sys/fs/cgroup/memory")
    top = v1 if (v1 / "memory.limit_in_bytes").exists() else Path("/sys/fs/cgroup")
    limit_file = "memory.limit_in_bytes" if top == v1 else "memory.max"
    group = top / f"gradprobe-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        group.mkdir()
        (group / limit_file).write_text(str(8 << 30))
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "case.py").write_text(CHARGE)
    small = tmp_path / "small"
    small.mkdir()
    project(small, "def build_model():\n    return nn.Linear(3, 1)\n")
    params = server_params()
    params.command, params.args = "/bin/sh", ["-c", f'echo $$ > {group}/cgroup.procs && exec "$0" -m gradprobe serve',
                                              sys.executable]
    try:
        async with Client(params, read_timeout_seconds=300) as c:
            await c.call_tool("inspect_parameters", {"target": {"project_dir": str(small), "model": "case.py"}})
            if top == v1:
                (group / "memory.max_usage_in_bytes").write_text("0")  # the peak from here on
                before = int((group / "memory.usage_in_bytes").read_text())
            r = await c.call_tool("inspect_parameters", {"target": {"project_dir": str(proj), "model": "case.py"}})
            text = _read_back(r)
            assert "CG[" in text, text
            if top == v1:
                peak = int((group / "memory.max_usage_in_bytes").read_text())
                assert peak - before >= 900 << 20, f"the call's gigabyte was charged elsewhere ({(peak - before) >> 20} MiB)"
                mine = [p for p in text.split("CG[", 1)[1].split("]", 1)[0].split(";") if ":memory:" in p]
                assert mine and mine[0].split(":", 2)[2].startswith(f"/{group.name}/"), mine
            else:
                subtrees = list((top / "gradprobe").glob("srv-*/memory.max"))
                assert subtrees and all(int(p.read_text().split()[0]) <= 8 << 30 for p in subtrees
                                        if p.read_text().strip() != "max"), subtrees
            cap = int(text.split("AS[", 1)[1].split("]", 1)[0])
            assert cap == (6 << 30) // (os.cpu_count() or 2), cap
    finally:
        _remove_group_tree(group, top)


# --- one "inside a root" test for the server, the interpreter search and the child ------------------------------------

def test_one_inside_a_root_test_and_slash_is_never_a_root(tmp_path):
    from gradprobe.sandbox import interpreter, view
    from gradprobe.sandbox.roots import inside, resolved_inside
    from gradprobe.server import options, runtime

    assert inside("/srv/code/a", ["/srv/code"]) and inside("/srv/code", ["/srv/code/"])
    assert not inside("/srv/codex", ["/srv/code"]) and not inside("/etc/shadow", ["/"]) and not inside("/", ["/"])
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert resolved_inside(str(tmp_path / "link" / "x"), [str(tmp_path / "real")])
    for module in (interpreter, view, runtime, options):  # every site asks the one function
        assert "inside" in vars(module) or "resolved_inside" in vars(module), module.__name__
    out = subprocess.run([sys.executable, "-m", "gradprobe", "serve", "--allow-root", "/"], capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 2 and "--allow-root /" in out.stderr, out.stderr


@pytest.mark.anyio
async def test_a_project_that_holds_the_calls_scratch_dirs_is_refused_with_what_to_give(client):
    """A file saved straight into /tmp makes /tmp the project: bound into the view, it held this call's scratch (the
    sandbox could not be built: 'File exists') and every other call's. It is refused with the folder to give instead,
    and the server goes on."""
    marker = Path("/tmp") / f"gp_scratch_case_{os.getpid()}.py"
    marker.write_text("import torch\n\ndef build_model():\n    return torch.nn.Linear(2, 1)\n")
    try:
        r = await client.call_tool("inspect_parameters", {"target": {"project_dir": "/tmp", "model": marker.name}})
        assert r.is_error and "holds the scratch directories of gradprobe's calls" in _text(r), _text(r)
        assert "folder of their own" in _text(r), _text(r)
        r = await client.call_tool("inspect_parameters", {"target": {"project_dir": str(ROOT / "examples" / "broken"),
                                                                     "model": "healthy_cnn.py"}})
        assert not r.is_error, _text(r)
    finally:
        marker.unlink()
