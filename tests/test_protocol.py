"""The server through the official client: tools/list (pinned), both protocol eras, progress, errors, resources."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mcp import Client

from conftest import EXAMPLES, ROOT, server_params
from gradprobe.findings import catalogue
from gradprobe.tools import NAMES

SNAPSHOT = Path(__file__).parent / "snapshots" / "tools_list.json"
TOOLS = set(NAMES)


def example(model: str, **extra: object) -> dict:
    """The arguments of a call on one of examples/broken."""
    return {"target": {"project_dir": str(EXAMPLES), "model": model, **extra}}


@pytest.mark.anyio
async def test_tools_list_matches_snapshot(client):
    tools = (await client.list_tools()).tools
    assert {t.name for t in tools} == TOOLS
    wire = sorted((t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools), key=lambda t: t["name"])
    for t in wire:
        assert t["annotations"]["readOnlyHint"] is True
        assert "target" in t["inputSchema"]["properties"] and t["outputSchema"]["title"] == "Report"
    if os.environ.get("GRADPROBE_UPDATE_SNAPSHOTS") or not SNAPSHOT.exists():
        SNAPSHOT.write_text(json.dumps(wire, indent=1, sort_keys=True) + "\n")
    assert wire == json.loads(SNAPSHOT.read_text()), "tools/list changed: review, then rerun with GRADPROBE_UPDATE_SNAPSHOTS=1"


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_both_protocol_eras_call_a_tool(mode):
    async with Client(server_params(), mode=mode, read_timeout_seconds=120) as c:
        result = await c.call_tool("inspect_parameters", example("gp102_scales_in_dict.py"))
        sc = result.structured_content
        assert sc["ok"] is False and sc["findings"][0]["code"] == "GP102"
        text = result.content[0].text
        assert "GP102" in text and "scales" in text  # the short text rendering a model reads


@pytest.mark.anyio
async def test_progress_notifications_arrive(client):
    seen = []

    async def on_progress(progress, total, message):
        seen.append(message)

    await client.call_tool("inspect_parameters", example("gp101_temperature_tensor.py"),
                           progress_callback=on_progress)
    assert "importing" in seen and "building" in seen and "checking" in seen, seen


@pytest.mark.anyio
async def test_caller_mistakes_are_tool_errors_that_say_what_to_change(client):
    bad_dir = await client.call_tool("diagnose", {"target": {"project_dir": "/no/such/dir", "model": "x.py"}})
    assert bad_dir.is_error and "not a directory" in bad_dir.content[0].text
    missing_file = await client.call_tool("diagnose", {"target": {"project_dir": str(EXAMPLES), "model": "nope.py"}})
    assert missing_file.is_error and "nope.py" in missing_file.content[0].text
    missing_callable = await client.call_tool("diagnose", example("gp101_temperature_tensor.py:no_such_fn"))
    assert missing_callable.is_error and "no_such_fn" in missing_callable.content[0].text
    bad_ref = await client.call_tool("diagnose", {"target": {"project_dir": str(EXAMPLES), "model": "a.py:"}})
    assert bad_ref.is_error
    no_inputs = await client.call_tool("trace_grad_path", example("gp101_temperature_tensor.py:build_model"))
    assert no_inputs.is_error and "inputs" in no_inputs.content[0].text


@pytest.mark.anyio
async def test_inline_setup_target(client):
    setup = ("import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
             "        self.w = torch.zeros(3, requires_grad=True)\n        self.fc = nn.Linear(3, 1)\n"
             "    def forward(self, x):\n        return self.fc(x * self.w)\nmodel = Net()\ninputs = torch.randn(2, 3)\n")
    result = await client.call_tool("diagnose", {"target": {"project_dir": str(EXAMPLES), "setup": setup}})
    f = result.structured_content["findings"][0]
    assert f["code"] == "GP101" and f["parameters"] == ["w"] and f["location"]["line"] == 5


@pytest.mark.anyio
async def test_a_failure_inside_a_check_is_gp000_never_the_users_error(client):
    # the target's setup breaks one of gradprobe's own checks in the child (as a gradprobe bug would)
    setup = ("import torch.nn as nn\nimport gradprobe.checks.registration.engine as reg\n"
             "def broken(*a, **k):\n    raise KeyError('bug inside gradprobe')\n"
             "reg.check_registration = broken\nmodel = nn.Linear(2, 2)\n")
    result = await client.call_tool("inspect_parameters", {"target": {"project_dir": str(EXAMPLES), "setup": setup}})
    assert not result.is_error
    findings = result.structured_content["findings"]
    assert [f["code"] for f in findings] == ["GP000"]
    f = findings[0]
    assert f["name"] == "internal-error" and f["severity"] == "error" and f["location"] is None
    assert "bug inside gradprobe" in f["message"] and "check_registration" not in f["message"]
    assert "KeyError" in f["evidence"]["traceback"] and "registration/engine.py" in f["evidence"]["traceback"]


@pytest.mark.anyio
async def test_findings_catalogue_resources_and_prompt(client):
    res = await client.read_resource("gradprobe://findings")
    codes = {r["code"] for r in json.loads(res.contents[0].text)}
    assert {"GP000", "GP100", "GP112", "GP113", "GP201", "GP209", "GP309", "GP404", "GP511"} <= codes
    assert codes == set(catalogue())
    one = await client.read_resource("gradprobe://findings/GP302")
    assert "detach-in-forward" in one.contents[0].text and "## Fix" in one.contents[0].text
    prompt = await client.get_prompt("investigate_gradients", {"project_dir": "/p"})
    assert "diagnose" in prompt.messages[0].content.text


@pytest.mark.anyio
async def test_diagnose_returns_a_picture(client):
    result = await client.call_tool("diagnose", example("gp302_detach_in_attention.py"))
    images = [c for c in result.content if getattr(c, "type", "") == "image"]
    assert images and images[0].mime_type == "image/svg+xml"
    mermaid = result.structured_content["facts"]["mermaid"]
    assert "GP302" in mermaid and ".-x" in mermaid


def test_server_process_never_imports_torch():
    script = (
        "import anyio, sys\n"
        "from mcp import Client\n"
        "from gradprobe.server.app import build_server\n"
        "async def main():\n"
        "    async with Client(build_server()) as c:\n"
        f"        target = {{'project_dir': {str(EXAMPLES)!r}, 'model': 'gp101_temperature_tensor.py'}}\n"
        "        r = await c.call_tool('inspect_parameters', {'target': target})\n"
        "        assert r.structured_content['findings'][0]['code'] == 'GP101'\n"
        "    print('torch' in sys.modules, 'transformers' in sys.modules)\n"
        "anyio.run(main)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False False"


@pytest.mark.anyio
async def test_a_fresh_server_answers_tools_list():
    t0 = time.perf_counter()
    async with Client(server_params()) as c:
        tools = (await c.list_tools()).tools
    assert {t.name for t in tools} == TOOLS
    print(f"server start -> tools/list: {time.perf_counter() - t0:.2f}s (benchmarks/ reports this as a ratio)")


@pytest.mark.anyio
async def test_meta_device_inspects_a_llama_7b_sized_model_without_weights(client):
    setup = ("from transformers import LlamaConfig, LlamaForCausalLM\n"
             "cfg = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,\n"
             "                  num_key_value_heads=32, vocab_size=32000)\n"
             "model = LlamaForCausalLM(cfg)\n")
    r = await client.call_tool("inspect_parameters", {"target": {"project_dir": str(EXAMPLES), "setup": setup, "device": "meta"}})
    sc = r.structured_content
    assert sc["ok"] and sc["facts"]["counts"]["numel"] == 6_738_415_616
    assert sc["facts"]["parameters"][0]["device"] == "meta"
    assert sc["facts"]["child_peak_rss_mb"] < 1536


@pytest.mark.anyio
async def test_explicit_function_is_checked_on_the_targets_inputs(client):
    setup = "model = nn.Identity()\ninputs = torch.randn(3, 4)\n"
    r = await client.call_tool("run_gradcheck", {"target": {"project_dir": str(EXAMPLES), "setup": setup},
                                                 "function": "gp401_cube_wrong_derivative.py:CubicAct"})
    f = r.structured_content["findings"][0]
    assert f["code"] == "GP401" and "CubicAct" in f["message"]


@pytest.mark.anyio
async def test_children_of_the_warm_worker_run_multithreaded_ops(client, tmp_path):
    """The warm worker only imports: had it run one multi-threaded op, this matmul would deadlock the child."""
    (tmp_path / "case.py").write_text(
        "import torch, torch.nn as nn\n"
        "def build_model():\n"
        "    assert torch.get_num_threads() >= 1\n"
        "    (torch.randn(1024, 1024) @ torch.randn(1024, 1024)).sum()\n"
        "    return nn.Linear(2, 2)\n")
    target = {"project_dir": str(tmp_path), "model": "case.py", "timeout_s": 60}
    r = await client.call_tool("inspect_parameters", {"target": target})
    sc = r.structured_content
    assert sc["ok"], sc["findings"]
    assert sc["facts"]["sandbox"]["child"] == "forked from the warm worker"


@pytest.mark.anyio
async def test_an_interpreter_without_torch_is_a_clear_tool_error(client, tmp_path):
    bare = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    py = bare / "bin" / "python"
    r = await client.call_tool("inspect_parameters", example("gp101_temperature_tensor.py", python=str(py)))
    assert r.is_error
    text = r.content[0].text
    assert str(py) in text and "torch" in text, text


@pytest.mark.anyio
async def test_the_projects_own_interpreter_runs_the_checks(client):
    r = await client.call_tool("trace_grad_path", example("gp303_no_grad_block.py", python=sys.executable))
    sc = r.structured_content
    assert sc["findings"][0]["code"] == "GP303" and sc["facts"]["sandbox"]["child"] == "cold interpreter"


@pytest.mark.anyio
async def test_model_given_as_an_absolute_path_alone(client):
    """What people type: {"model": "/abs/path/model.py"}; project_dir is the file's directory."""
    r = await client.call_tool("diagnose", {"target": {"model": str(EXAMPLES / "gp303_no_grad_block.py")}})
    assert not r.is_error, r.content
    assert r.structured_content["findings"][0]["code"] == "GP303"
    r = await client.call_tool("inspect_parameters",
                               {"target": {"model": str(EXAMPLES / "gp101_temperature_tensor.py:build_model")}})
    assert not r.is_error and r.structured_content["findings"][0]["code"] == "GP101"


@pytest.mark.anyio
@pytest.mark.parametrize("args, field", [
    ({"target": {"model": "train.py"}}, "target.project_dir"),
    ({}, "target"),
    ({"target": "train.py"}, "target"),
    ({"target": {"project_dir": "/tmp", "model": "x.py", "modle": "y.py"}}, "target.modle"),
    ({"target": {"project_dir": "/tmp", "model": "x.py", "seed": "zero"}}, "target.seed"),
    ({"target": {"project_dir": "/tmp", "model": "x.py", "device": "gpu"}}, "target.device"),
    ({"target": {"project_dir": "/tmp", "model": "x.py", "timeout_s": -5}}, "target.timeout_s"),
    ({"target": {"project_dir": "/tmp"}}, "model"),
])
async def test_argument_errors_name_the_field_and_what_to_write(client, args, field):
    r = await client.call_tool("diagnose", args)
    assert r.is_error
    text = r.content[0].text
    assert "pydantic" not in text and "validation error for" not in text and "input_value" not in text, text
    assert field in text, text
    assert any(w in text for w in ("write", "give", "pass", "the fields are", "must be")), text
    body = text.removeprefix("Error executing tool diagnose: ")
    assert body.count(". ") <= 2 and len(body) < 400, text


@pytest.mark.anyio
async def test_an_unknown_finding_code_is_a_clear_error(client):
    from mcp.shared.exceptions import MCPError

    with pytest.raises(MCPError) as info:
        await client.read_resource("gradprobe://findings/GP999")
    assert info.value.error.code == -32602 and "unknown code GP999" in info.value.error.message
    ok = await client.read_resource("gradprobe://findings/gp302")
    assert "GP302" in ok.contents[0].text
