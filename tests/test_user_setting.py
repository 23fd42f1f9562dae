"""Issue 26 items 3, 4, 5 and 8: the user's data (read_paths), variables (env), memory sized to the machine, and
the first hour (script mode suggested, GP112 shows the script's output, the short schema, a closed pipe)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from mcp import Client

from conftest import ROOT, server_params
from gradprobe.server.options import GIB, HttpOptions, ServeOptions, default_memory_bytes, machine_memory_bytes
from gradprobe.target import Target

READER = textwrap.dedent("""\
    import os
    import torch

    scale = float(open({data!r}).read())
    assert os.environ.get("WANDB_MODE") == "disabled", "WANDB_MODE is " + repr(os.environ.get("WANDB_MODE"))
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    (model(torch.randn(3, 2)) * scale).sum().backward()
    opt.step()
    """)


def cli(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "gradprobe", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env)


@pytest.fixture
def data_script(tmp_path) -> dict:
    data = tmp_path / "datasets" / "scale.txt"
    data.parent.mkdir()
    data.write_text("1.5\n")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(READER.format(data=str(data)))
    return {"proj": proj, "data": data}


@pytest.mark.anyio
async def test_a_script_reading_data_outside_the_project_gets_the_way_to_allow_it_then_runs(client, data_script):
    target = {"project_dir": str(data_script["proj"]), "script": "train.py", "env": {"WANDB_MODE": "disabled"}}
    r = await client.call_tool("diagnose", {"target": target})
    sc = r.structured_content
    assert sc["findings"][0]["code"] == "GP112", sc["findings"]
    folder = str(data_script["data"].parent)
    assert "exists on this machine, outside the sandbox's view" in sc["summary"], sc["summary"]
    assert f'"read_paths": ["{folder}"]' in sc["summary"] and f"--read-path {folder}" in r.content[0].text, sc["summary"]
    r = await client.call_tool("diagnose", {"target": {**target, "read_paths": [folder]}})
    assert r.structured_content["ok"], r.content[0].text


@pytest.mark.anyio
async def test_env_reaches_the_child_and_only_what_the_target_names(client, data_script):
    folder = str(data_script["data"].parent)
    target = {"project_dir": str(data_script["proj"]), "script": "train.py", "read_paths": [folder]}
    r = await client.call_tool("diagnose", {"target": target})
    assert "WANDB_MODE is None" in json.dumps(r.structured_content), r.content[0].text
    r = await client.call_tool("diagnose", {"target": {**target, "env": {"HOME": "/root"}}})
    assert r.is_error and "HOME is set by gradprobe's sandbox" in r.content[0].text, r.content[0].text


def test_the_command_line_takes_read_paths_and_env(data_script):
    folder = str(data_script["data"].parent)
    out = cli("diagnose", "--script", "train.py", "--read-path", folder, "--env", "WANDB_MODE=disabled", cwd=data_script["proj"])
    assert out.returncode == 0 and "gradprobe diagnose: VERIFIED" in out.stdout, out.stdout + out.stderr


@pytest.mark.anyio
async def test_with_allowed_roots_read_paths_outside_them_are_refused(tmp_path, data_script):
    root = tmp_path / "root"
    root.mkdir()
    (root / "m.py").write_text("import torch.nn as nn\ndef build_model():\n    return nn.Linear(2, 2)\n")
    async with Client(server_params(args=("--allow-root", str(root))), read_timeout_seconds=300) as c:
        target = {"model": str(root / "m.py"), "read_paths": [str(data_script["data"].parent)]}
        r = await c.call_tool("inspect_parameters", {"target": target})
        assert r.is_error and "read_paths" in r.content[0].text and "outside the roots" in r.content[0].text, r.content[0].text


def test_over_http_only_the_variable_names_the_operator_allowed():
    target = Target(project_dir="/tmp", model="m.py", env={"WANDB_MODE": "disabled", "HF_TOKEN": "x"})
    http = ServeOptions(http=HttpOptions(), allowed_roots=("/tmp",), allowed_env=("WANDB_MODE",))
    refused = http.refuse(target)
    assert refused and refused.startswith("env: this server does not let callers set HF_TOKEN (") and "--allow-env" in refused
    assert ServeOptions().refuse(target) is None  # over stdio the user names their own variables


def test_the_default_memory_cap_comes_from_the_machine_leaving_room_for_the_server():
    have = machine_memory_bytes()
    assert have and default_memory_bytes() == max(GIB, have - max(2 * GIB, have // 4)) and default_memory_bytes() > 8 * GIB
    assert ServeOptions().refuse(Target(project_dir="/tmp", model="m.py", memory_gb=have / GIB * 4))
    assert ServeOptions().memory_ceiling <= default_memory_bytes()  # one check never asks for more than all together


def _per_call_default() -> int:
    """A server's default cap per check: the budget for all checks over the checks that may run at once."""
    return default_memory_bytes() // (os.cpu_count() or 2)


@pytest.mark.anyio
async def test_the_default_cap_reaches_the_child_and_a_target_may_set_its_own(client, tmp_path):
    probe = ("import resource\n"
             "def build_model():\n"
             "    raise RuntimeError(f'RLIMIT_AS={resource.getrlimit(resource.RLIMIT_AS)[0]}')\n")
    (tmp_path / "m.py").write_text(probe)
    r = await client.call_tool("inspect_parameters", {"target": {"model": str(tmp_path / "m.py")}})
    assert f"RLIMIT_AS={_per_call_default()}" in json.dumps(r.structured_content), r.content[0].text
    r = await client.call_tool("inspect_parameters", {"target": {"model": str(tmp_path / "m.py"), "memory_gb": 5}})
    assert f"RLIMIT_AS={5 * GIB}" in json.dumps(r.structured_content), r.content[0].text


@pytest.mark.anyio
async def test_gp113_says_how_much_it_had_and_the_exact_option(client, tmp_path):
    (tmp_path / "big.py").write_text(
        "import torch\nimport torch.nn as nn\n"
        "def build_model():\n    m = nn.Linear(2, 2)\n"
        "    m.big = torch.empty(4 * 1024**3, dtype=torch.uint8).fill_(1)\n    return m\n")
    r = await client.call_tool("inspect_parameters", {"target": {"model": str(tmp_path / "big.py"), "memory_gb": 3}})
    sc = r.structured_content
    assert any(f["code"] == "GP113" for f in sc["findings"]), sc["findings"]
    summary = sc["summary"]
    assert "capped at 3.0 GB" in summary and '"memory_gb": ' in summary and "--memory-gb " in summary, summary


def test_cli_diagnose_takes_memory_gb():
    out = cli("diagnose", "--help")
    assert "--memory-gb" in out.stdout, out.stdout


@pytest.mark.anyio
async def test_a_target_asking_more_than_the_servers_ceiling_is_refused(tmp_path):
    (tmp_path / "m.py").write_text("import torch.nn as nn\ndef build_model():\n    return nn.Linear(2, 2)\n")
    async with Client(server_params(args=("--memory-gb", "2", "--max-memory-gb", "3")), read_timeout_seconds=300) as c:
        r = await c.call_tool("inspect_parameters", {"target": {"model": str(tmp_path / "m.py"), "memory_gb": 4}})
        assert r.is_error and "more than this server allows" in r.content[0].text and "--max-memory-gb" in r.content[0].text


# --- the first hour -------------------------------------------------------------------------------------------------

TRAIN = textwrap.dedent("""\
    import sys
    import torch

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if len(sys.argv) < 2:
        print("usage: train.py STEPS (the number of steps to train)", file=sys.stderr)
        sys.exit(2)
    """)


def test_diagnose_on_a_script_without_build_model_suggests_script_mode(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    out = cli("diagnose", str(tmp_path / "train.py"))
    assert out.returncode == 2 and "defines no build_model()" in out.stderr, out.stderr
    assert "gradprobe diagnose --script train.py" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_gp112_text_shows_the_scripts_last_output(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    out = cli("diagnose", "--script", str(tmp_path / "train.py"))
    assert out.returncode == 1 and "GP112" in out.stdout, out.stdout + out.stderr
    assert "The script's last output (stderr):" in out.stdout and "usage: train.py STEPS" in out.stdout, out.stdout


@pytest.mark.anyio
async def test_the_short_form_is_what_the_schema_says(client):
    tools = (await client.list_tools()).tools
    for tool in tools:
        schema = tool.input_schema["$defs"]["Target"]
        assert "project_dir" not in schema.get("required", []), tool.name
        assert "python" in tool.description and "environment" in tool.description, tool.name


def test_a_closed_pipe_ends_the_command_line_quietly():
    example = ROOT / "examples" / "broken" / "gp303_no_grad_block.py"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(f"{sys.executable} -m gradprobe diagnose {example} | head -1", shell=True, capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.stdout.startswith("gradprobe diagnose") and out.stderr == "", out.stderr


def test_python_m_gradprobe_demo_from_the_parent_of_a_clone_named_gradprobe(tmp_path):
    (tmp_path / "gradprobe").symlink_to(ROOT, target_is_directory=True)  # a clone under its default name
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    env["PYTHONPATH"] = str(tmp_path / "gradprobe")
    out = subprocess.run([sys.executable, "-m", "gradprobe", "demo"], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env=env)
    # the demo's broken model is diagnosed (a clone reached through a symlink runs its child by the real path)
    assert out.returncode == 0 and "gradprobe diagnose: PROBLEMS FOUND" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    config = subprocess.run([sys.executable, "-m", "gradprobe", "mcp-config"], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path, env=env)
    assert json.loads(config.stdout)["mcpServers"]["gradprobe"]["args"][-1] == "serve", config.stderr
