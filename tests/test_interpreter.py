"""Issue 26 items 1, 2, 6 and issue 25 items 2, 3: which interpreter runs a target, found from the project,
resolved once, named in every report; every way it goes wrong is a clear message. Through the real server
(stdio) and the real command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from mcp import Client

from conftest import ROOT, server_params

MODEL = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    import onlyhere  # lives only in the project's .venv


    def build_model():
        return nn.Linear(3, onlyhere.WIDTH)


    def make_inputs():
        return torch.randn(4, 3)
    """)
SCRIPT = textwrap.dedent("""\
    import torch
    import onlyhere

    model = torch.nn.Linear(3, onlyhere.WIDTH)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 3)).pow(2).mean().backward()
        opt.step()
    """)


def site_packages(prefix: Path) -> Path:
    return prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def make_venv(where: Path, with_torch: bool = True) -> Path:
    """A venv without pip; torch reaches it through a .pth naming the installed site-packages (no download)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    if with_torch:
        import torch

        (site_packages(where) / "server_torch.pth").write_text(str(Path(torch.__file__).parent.parent) + "\n")
    return where / "bin" / "python"


@pytest.fixture(scope="module")
def venv_project(tmp_path_factory) -> dict:
    proj = tmp_path_factory.mktemp("own-env") / "proj"
    proj.mkdir()
    py = make_venv(proj / ".venv")
    pkg = site_packages(proj / ".venv") / "onlyhere"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("WIDTH = 2\n")
    (proj / "model.py").write_text(MODEL)
    (proj / "train.py").write_text(SCRIPT)
    return {"dir": proj, "python": str(py)}


def cli(*args: str, cwd: str | Path = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "gradprobe", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env)


def assert_names_project_env(sc: dict, text: str, py: str) -> None:
    info = sc["facts"]["interpreter"]
    assert info["path"] == py and info["source"] == "project", info
    assert info["python_version"] == ".".join(map(str, sys.version_info[:3])) and info["torch_version"], info
    assert "the project's own environment" in info["chosen_because"], info
    assert f"Interpreter: {py}" in text and "torch " in text, text


@pytest.mark.anyio
async def test_a_projects_own_venv_runs_the_build_model_form_with_no_python_field(client, venv_project):
    target = {"model": str(venv_project["dir"] / "model.py")}
    r = await client.call_tool("diagnose", {"target": target})
    sc = r.structured_content
    assert not r.is_error and sc["ok"], r.content[0].text
    assert_names_project_env(sc, r.content[0].text, venv_project["python"])


@pytest.mark.anyio
async def test_a_projects_own_venv_runs_the_script_form(client, venv_project):
    r = await client.call_tool("diagnose", {"target": {"project_dir": str(venv_project["dir"]), "script": "train.py"}})
    sc = r.structured_content
    assert not r.is_error and sc["ok"], r.content[0].text
    assert_names_project_env(sc, r.content[0].text, venv_project["python"])


def test_the_command_line_finds_the_projects_venv_too(venv_project):
    out = cli("diagnose", str(venv_project["dir"] / "model.py"), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["facts"]["interpreter"]["path"] == venv_project["python"]
    text = cli("diagnose", "--script", "train.py", cwd=venv_project["dir"])
    assert text.returncode == 0 and f"Interpreter: {venv_project['python']}" in text.stdout, text.stdout + text.stderr


def test_a_relative_python_on_the_command_line_is_made_absolute_against_the_callers_directory(venv_project):
    out = cli("diagnose", "model.py", "--python", ".venv/bin/python", "--json", cwd=venv_project["dir"])
    assert out.returncode == 0, out.stdout + out.stderr
    info = json.loads(out.stdout)["facts"]["interpreter"]
    assert info["path"] == venv_project["python"] and info["source"] == "target", info


@pytest.mark.anyio
async def test_a_relative_python_over_mcp_is_refused_saying_so(client, venv_project):
    target = {"model": str(venv_project["dir"] / "model.py"), "python": ".venv/bin/python"}
    r = await client.call_tool("diagnose", {"target": target})
    assert r.is_error and "relative path" in r.content[0].text and "absolute path" in r.content[0].text, r.content[0].text


@pytest.mark.anyio
async def test_a_missing_module_names_the_interpreter_the_environments_and_how_to_choose(client, venv_project, tmp_path):
    r = await client.call_tool("diagnose", {"target": {"model": str(venv_project["dir"] / "model.py"), "python": "server"}})
    sc = r.structured_content
    assert sc["findings"][0]["code"] == "GP100", sc["findings"]
    summary = sc["summary"]
    assert "No module named 'onlyhere' in the interpreter that ran the code" in summary and sys.executable in summary, summary
    assert "`python`" in summary and '"server"' in summary, summary
    assert sc["facts"]["interpreter"]["source"] == "server"
    # no environment of its own: the report lists where it looked
    (tmp_path / "model.py").write_text(MODEL)
    r = await client.call_tool("diagnose", {"target": {"model": str(tmp_path / "model.py")}})
    summary = r.structured_content["summary"]
    assert "Environments looked at:" in summary and str(tmp_path / ".venv") in summary, summary
    assert "no environment of the project's own was found" in summary, summary


@pytest.mark.anyio
async def test_a_dangling_bin_python_is_a_clear_tool_error(client, tmp_path):
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").symlink_to("/nonexistent/python3.9")
    (tmp_path / "model.py").write_text(MODEL)
    r = await client.call_tool("diagnose", {"target": {"model": str(tmp_path / "model.py")}})
    text = r.content[0].text
    assert r.is_error and "dangling link" in text and "/nonexistent/python3.9" in text and "Traceback" not in text, text


@pytest.mark.anyio
async def test_an_interpreter_that_is_not_python_is_not_blamed_on_the_users_code(client, venv_project):
    target = {"model": str(venv_project["dir"] / "model.py"), "python": "/bin/true"}
    r = await client.call_tool("inspect_parameters", {"target": target})
    f = r.structured_content["findings"][0]
    assert "The interpreter /bin/true" in f["message"] and "No user code ran" in f["message"], f
    assert "not a Python" in f["message"] and "`python`" in f["fix"], f


@pytest.mark.anyio
async def test_a_torch_older_than_supported_is_a_clear_tool_error(client, tmp_path):
    py = make_venv(tmp_path / "old", with_torch=False)
    fake = site_packages(tmp_path / "old") / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("__version__ = '1.13.1'\n")
    (tmp_path / "model.py").write_text(MODEL)
    r = await client.call_tool("inspect_parameters", {"target": {"model": str(tmp_path / "model.py"), "python": str(py)}})
    text = r.content[0].text
    assert r.is_error and "1.13.1" in text and "older than gradprobe supports" in text and str(py) in text, text


async def _strict_call(c: Client, target: dict):
    r = await c.call_tool("inspect_parameters", {"target": target})
    return r, r.content[0].text


@pytest.mark.anyio
async def test_with_allowed_roots_only_environments_inside_or_listed_count(tmp_path, venv_project):
    """--allow-python compares the environment: a venv made from the listed base interpreter is not that interpreter;
    a project's .venv that lives outside the roots (a symlink out) is ignored, saying so."""
    root = tmp_path / "root"
    proj = root / "proj"
    proj.mkdir(parents=True)
    (proj / "model.py").write_text("import torch.nn as nn\ndef build_model():\n    return nn.Linear(2, 2)\n")
    other = make_venv(tmp_path / "elsewhere-venv")
    args = ("--allow-root", str(root), "--allow-python", sys.executable)
    async with Client(server_params(args=args), read_timeout_seconds=300) as c:
        r, text = await _strict_call(c, {"model": str(proj / "model.py"), "python": str(other)})
        assert r.is_error and "--allow-python" in text, text
        (proj / ".venv").symlink_to(tmp_path / "elsewhere-venv")
        r, text = await _strict_call(c, {"model": str(proj / "model.py")})
        info = r.structured_content["facts"]["interpreter"]
        assert info["source"] == "server" and "ignored" in info["chosen_because"], info
        (proj / ".venv").unlink()
        inside = make_venv(proj / ".venv")
        r, text = await _strict_call(c, {"model": str(proj / "model.py")})
        info = r.structured_content["facts"]["interpreter"]
        assert info["path"] == str(inside) and info["source"] == "project", info


@pytest.mark.anyio
async def test_a_symlinked_interpreter_flipped_during_calls_never_runs_a_planted_script(tmp_path):
    """25.2: the interpreter is resolved once; what runs and what is bound is that open file."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "model.py").write_text("import torch.nn as nn\ndef build_model():\n    return nn.Linear(2, 2)\n")
    planted = tmp_path / "planted"
    planted.write_text("#!/bin/sh\necho PLANTED-RAN >&2\ncat /etc/shadow >&2\nexit 0\n")
    planted.chmod(0o755)
    # The link that flips is an environment's own bin/python (a venv made here, torch through a .pth), so the
    # interpreter it names has torch whether the suite runs in the machine's Python, a venv or a uv environment:
    # a link elsewhere to a venv's python runs the base interpreter, which has no torch in a venv.
    link = make_venv(tmp_path / "env")
    real = os.path.realpath(link)
    stop = threading.Event()

    def flip() -> None:
        tmp = link.parent / "python.new"
        n = 0
        while not stop.is_set():
            n += 1
            if tmp.is_symlink():
                tmp.unlink()
            tmp.symlink_to(planted if n % 2 else real)
            os.replace(tmp, link)
            time.sleep(0.0005)

    args = ("--allow-root", str(root), "--allow-python", str(link), "--cold")
    outcomes = []
    async with Client(server_params(args=args), read_timeout_seconds=300) as c:
        thread = threading.Thread(target=flip, daemon=True)
        thread.start()
        try:
            for _ in range(16):
                target = {"model": str(root / "model.py"), "python": str(link), "timeout_s": 60}
                r = await c.call_tool("inspect_parameters", {"target": target})
                blob = json.dumps(r.structured_content) + r.content[0].text
                assert "PLANTED-RAN" not in blob and "root:" not in blob, blob[:2000]
                outcomes.append("refused" if r.is_error else "ran")
                if r.is_error:
                    assert "--allow-python" in r.content[0].text, r.content[0].text
                else:
                    assert r.structured_content["facts"]["interpreter"]["resolved"] == real
        finally:
            stop.set()
            thread.join()
    assert "ran" in outcomes, outcomes


@pytest.mark.anyio
async def test_the_servers_working_directory_is_not_in_any_calls_view(tmp_path):
    """25.3: `python -m gradprobe serve` puts its working directory first on sys.path; nothing of it is bound."""
    home = tmp_path / "home"
    home.mkdir()
    secret = home / "id_rsa"
    secret.write_text("SECRET-KEY-MATERIAL\n")
    proj = tmp_path / "proj"
    proj.mkdir()
    probe = textwrap.dedent(f"""\
        import os
        seen = []
        for path in ({str(secret)!r}, {str(home)!r}):
            try:
                seen.append(open(path).read() if os.path.isfile(path) else ",".join(os.listdir(path)))
            except OSError as exc:
                seen.append(type(exc).__name__)
        raise RuntimeError("PROBE:" + "|".join(seen))
        """)
    (proj / "model.py").write_text(probe + "\ndef build_model():\n    pass\n")
    params = server_params()
    params.cwd = str(home)
    async with Client(params, read_timeout_seconds=300) as c:
        for python in (None, sys.executable):
            target = {"model": str(proj / "model.py"), **({"python": python} if python else {})}
            r = await c.call_tool("inspect_parameters", {"target": target})
            blob = json.dumps(r.structured_content)
            assert "PROBE:" in blob and "SECRET-KEY-MATERIAL" not in blob and "id_rsa" not in blob, blob[:2000]


@pytest.mark.anyio
async def test_a_project_environment_that_is_the_servers_own_keeps_the_warm_worker(client, tmp_path):
    (tmp_path / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    (tmp_path / "model.py").write_text("import torch.nn as nn\ndef build_model():\n    return nn.Linear(2, 2)\n")
    r = await client.call_tool("inspect_parameters", {"target": {"model": str(tmp_path / "model.py")}})
    sc = r.structured_content
    assert sc["facts"]["interpreter"]["source"] == "server", sc["facts"]["interpreter"]
    assert "which is the server's own" in sc["facts"]["interpreter"]["chosen_because"]
    assert sc["facts"]["sandbox"]["child"] == "forked from the warm worker", sc["facts"]["sandbox"]
