"""The typed parent/child protocol (sandbox/protocol.py) and the codes the parent decides (GP112 blocked, GP114-GP117)."""

from __future__ import annotations

import json

import pytest

from gradprobe.phases import PROGRESS_STEPS, Phase
from gradprobe.sandbox.failures import ChildFate, child_failure_finding
from gradprobe.sandbox.protocol import CHILD_MESSAGE, Control, Job, Layer, Policy, Progress, Result, StartFailed, ToolError


def test_a_layer_is_typed_and_the_report_shows_it_as_before():
    assert Layer.of(True, "seccomp filter active").shown() == "seccomp filter active"
    missing = Layer.of(False, "no seccomp filter")
    assert missing.missing and missing.shown() == "MISSING: no seccomp filter"
    off = Layer(enforced=None, text="off (--no-isolation)")
    assert not off.missing and off.shown() == "off (--no-isolation)"
    sent = Control(pid=7, layers={"syscalls": missing}).model_dump_json()
    assert Control.model_validate_json(sent).layers == {"syscalls": missing}


def test_result_lines_read_as_a_tool_error_or_a_report():
    err = CHILD_MESSAGE.validate_json(Result(report=ToolError(tool_error="bad", tool_error_kind="interpreter")).model_dump_json())
    assert isinstance(err, Result) and isinstance(err.report, ToolError) and err.report.tool_error_kind == "interpreter"
    # a report is read as the dict it is (the parent never trusts its shape: a forged one stays a forged report)
    rep = CHILD_MESSAGE.validate_json(json.dumps({"type": "result", "report": {"tool": "x", "ok": "not a bool"}}))
    assert isinstance(rep, Result) and rep.report == {"tool": "x", "ok": "not a bool"}
    prog = CHILD_MESSAGE.validate_json(Progress(phase=Phase.BUILDING).model_dump_json())
    assert isinstance(prog, Progress) and prog.phase is Phase.BUILDING
    with pytest.raises(ValueError):
        CHILD_MESSAGE.validate_json(json.dumps({"type": "progress", "phase": "not a phase"}))
    start = CHILD_MESSAGE.validate_json(StartFailed(python="/x", error="Exec format error").model_dump_json())
    assert isinstance(start, StartFailed)


def test_job_and_policy_round_trip():
    job = Job(tool="diagnose", target={"project_dir": "/p", "model": "m.py"}, options={"k": 1})
    assert Job.model_validate_json(job.model_dump_json()) == job
    policy = Policy(scratch="/tmp/x", package_root="/r")
    assert Policy.model_validate_json(policy.model_dump_json()) == policy
    assert policy.cgroup_state.shown() == "off"


def test_the_server_counts_progress_by_the_one_enum():
    assert all(isinstance(p, Phase) for p in PROGRESS_STEPS) and PROGRESS_STEPS[0] is Phase.QUEUED
    assert f"{Phase.RUNNING_SCRIPT}" == "running the script"


def _fate(**kw: object) -> ChildFate:
    base: dict = dict(phase="building", timed_out=False, returncode=-11, timeout_s=4.0, script=False,
                      evidence={"phase": "building"})
    base.update(kw)
    return ChildFate(**base)


@pytest.mark.parametrize("kw, code, text", [
    ({"timed_out": True, "returncode": None}, "GP114", "did not finish within 4 s (it was in phase 'building')"),
    ({"timed_out": True, "script": True, "phase": "running the script"}, "GP112", "blocked where gradprobe's timer"),
    ({}, "GP115", "was killed by SIGSEGV in phase 'building' without a result"),
    ({"returncode": 0}, "GP115", "exited with code 0"),
    ({"remote_note": "the Ray worker running this check failed (RayError)"}, "GP116", "Ray worker"),
    ({"start_error": "Exec format error", "python": "/venv/bin/python"}, "GP117", "/venv/bin/python could not be started"),
])
def test_each_way_a_child_ends_without_a_report_has_its_own_code(kw, code, text):
    f = child_failure_finding(_fate(**kw), "first line\nsecond")
    assert f["code"] == code and text in f["message"], f


@pytest.mark.anyio
async def test_an_interpreter_that_cannot_be_executed_is_gp117(tmp_path):
    from gradprobe.sandbox.call import execute
    from gradprobe.target import Target

    (tmp_path / "case.py").write_text("import torch.nn as nn\ndef build_model():\n    return nn.Linear(2, 2)\n")
    bogus = tmp_path / "python"
    bogus.write_bytes(b"\x00\x01 not a program")
    bogus.chmod(0o755)
    target = Target(project_dir=str(tmp_path), model="case.py", python=str(bogus), timeout_s=60)
    report = await execute("inspect_parameters", target)
    f = report["findings"][0]
    assert f["code"] == "GP117" and str(bogus) in f["message"], f
    assert "cannot start" in f["evidence"]["stderr_tail"]


def _torch_only_site(dest):
    """A site directory that holds torch and what torch itself requires, and nothing else (no pydantic, no mcp)."""
    import importlib.metadata as md
    import re

    todo, seen = ["torch"], set()
    while todo:
        name = todo.pop()
        if name.lower() in seen:
            continue
        seen.add(name.lower())
        dist = md.distribution(name)
        for f in dist.files or []:
            top = str(f).split("/", 1)[0]
            src = dist.locate_file(top)
            if top.endswith((".dist-info", ".pth")) or top == ".." or not src.exists() or (dest / top).exists():
                continue
            (dest / top).symlink_to(src)
        todo += [re.split(r"[ ;<>=!~\[]", r, maxsplit=1)[0] for r in dist.requires or [] if "extra ==" not in r]
    return dest


def test_the_child_side_needs_only_the_standard_library_and_torch(tmp_path):
    """The child runs in the target's interpreter: a real check runs there with no pydantic or mcp importable."""
    import subprocess
    import sys

    from conftest import EXAMPLES, ROOT

    site = _torch_only_site(tmp_path)
    assert not (site / "pydantic").exists() and (site / "torch").exists()
    code = (
        "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
        "from gradprobe.sandbox.protocol import Job\n"
        "from gradprobe.sandbox.run_check import run_job\n"
        "target = {'project_dir': sys.argv[3], 'model': 'gp101_temperature_tensor.py'}\n"
        "rep = run_job(Job(tool='diagnose', target=target), lambda p: None)\n"
        "print(sorted({f['code'] for f in rep['findings']}), 'pydantic' in sys.modules, 'mcp' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(site), str(ROOT), str(EXAMPLES)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    codes, pydantic, mcp = out.stdout.strip().rsplit(" ", 2)
    assert "GP101" in codes and pydantic == "False" and mcp == "False", out.stdout
