"""Issue 36, items 1-3: a verdict says what was verified (never OK over a check that did not run), the user's command
as the user runs it (working directory, sys.path, src/ layouts, editable installs, GP122), and meta-device and deferred
initialisation under gradprobe. Through the real server over stdio and the real command line, on the examples in
examples/scripts/verdict_*, examples/broken/gp121_no_inputs.py and their healthy twins."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EXAMPLES, ROOT, assert_verdict

SCRIPTS = ROOT / "examples" / "scripts"
SRC = SCRIPTS / "verdict_src_layout"
UNINSTALLED = SCRIPTS / "verdict_src_uninstalled_broken"
META = SCRIPTS / "verdict_meta_init"
PARTIAL = SCRIPTS / "verdict_partial"


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "gradprobe", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)


async def call(client, tool: str, target: dict, **options) -> dict:
    result = await client.call_tool(tool, {"target": {"timeout_s": 240, **target}, **options})
    assert not result.is_error, result.content
    report = result.structured_content
    assert_verdict(report, str(target))
    assert result.content[0].text.splitlines()[1] == report["verdict"]["line"]  # the text says it first too
    return report


def codes(report: dict) -> list[str]:
    return [f["code"] for f in report["findings"]]


def blocking(report: dict) -> list[dict]:
    return [e for e in report["verdict"]["not_run"] if e["cause"] != "not_applicable"]


# ---- item 1: a verdict says what was verified ---------------------------------------------------------------------

@pytest.mark.anyio
async def test_a_model_without_inputs_is_partly_checked_and_its_twin_is_verified(client):
    """The step checks cannot run without a batch: said first and as GP121, never OK; the twin lists what it measured."""
    part = await call(client, "diagnose", {"project_dir": str(EXAMPLES), "model": "gp121_no_inputs.py"})
    assert part["verdict"]["status"] == "partial" and part["ok"] is False, part["verdict"]
    assert part["summary"].startswith("partly checked: the step checks"), part["summary"]
    [entry] = blocking(part)
    assert entry["cause"] == "refused" and "no inputs" in entry["why"], entry
    gp121 = [f for f in part["findings"] if f["code"] == "GP121"]
    assert len(gp121) == 1 and gp121[0]["severity"] == "warning" and gp121[0]["evidence"]["cause"] == "refused", gp121
    assert any(v.startswith("registration:") for v in part["verdict"]["verified"]), part["verdict"]
    whole = await call(client, "diagnose", {"project_dir": str(EXAMPLES), "model": "healthy_gp121_inputs_given.py"})
    assert whole["verdict"]["status"] == "verified" and whole["ok"] is True and not blocking(whole), whole["verdict"]
    lines = whole["verdict"]["verified"]
    assert any("one step traced" in v and "4 of 4 trainable" in v for v in lines), lines
    assert any(v.startswith("one real optimizer step: 4 of 4") for v in lines), lines


@pytest.mark.anyio
async def test_a_replay_that_fails_is_gradprobes_and_said_first(client):
    """gradprobe's replay of a script's step fails where the script's own did not: partly checked, cause gradprobe,
    GP121, no error against the script; its twin is verified."""
    part = await call(client, "diagnose", {"project_dir": str(PARTIAL), "script": "replay_needs_loop_state.py"})
    assert part["verdict"]["status"] == "partial", part["verdict"]
    assert not [f for f in part["findings"] if f["severity"] == "error"], part["findings"]
    [entry] = blocking(part)
    assert entry["cause"] == "gradprobe" and "pad_mask" in entry["why"], entry
    assert part["summary"].startswith("partly checked: the checks that needed gradprobe's replay"), part["summary"]
    assert "one step traced" not in " ".join(part["verdict"]["verified"])  # the replay's trace is not claimed
    twin = await call(client, "diagnose", {"project_dir": str(PARTIAL), "script": "healthy_twin.py"})
    assert twin["verdict"]["status"] == "verified" and not blocking(twin), twin["verdict"]


@pytest.mark.anyio
async def test_a_script_that_raises_after_its_backward_says_the_step_was_not_checked(client):
    """The script's own KeyError after backward(): the optimizer step is named as not run, with the user's line; never
    "the checks ran on that backward's step" as if fine."""
    part = await call(client, "diagnose", {"project_dir": str(PARTIAL), "script": "raises_after_backward.py"})
    assert part["verdict"]["status"] == "partial", part["verdict"]
    [entry] = blocking(part)
    assert entry["cause"] == "user_code" and "KeyError" in entry["why"], entry
    f = next(f for f in part["findings"] if f["code"] == "GP121")
    assert f["location"]["line"] == 22 and f["location"]["file"].endswith("raises_after_backward.py"), f
    assert "the checks ran on that backward's step." not in part["summary"], part["summary"]


def test_the_command_line_says_the_verdict_and_exits_by_it():
    """VERIFIED exits 0, PARTLY CHECKED 4, and the text never says OK."""
    part = cli("diagnose", "gp121_no_inputs.py", cwd=EXAMPLES)
    assert part.returncode == 4, part.stdout + part.stderr
    head = part.stdout.splitlines()
    assert head[0] == "gradprobe diagnose: PARTLY CHECKED" and head[1].startswith("partly checked: "), head[:2]
    whole = cli("diagnose", "healthy_gp121_inputs_given.py", "--json", cwd=EXAMPLES)
    assert whole.returncode == 0, whole.stdout[-2000:] + whole.stderr[-2000:]
    report = json.loads(whole.stdout)
    assert report["verdict"]["status"] == "verified" and report["summary"].startswith("verified: registration:")


def test_a_watch_of_gradprobes_that_raises_in_the_script_is_never_the_scripts_error(monkeypatch):
    """A check of gradprobe's that raises inside the user's backward: GP000 (gradprobe's failure, not checked), never
    GP112 "the script failed" blamed on the user."""
    from gradprobe.checks.steps import observe
    from gradprobe.sandbox.run_check import run_job

    # the watch's own code raises (grad_norms of something that is no list of parameters), inside the user's backward
    monkeypatch.setattr(observe.StepObserver, "_after_backward", lambda self: observe.grad_norms(None))
    report = run_job({"tool": "diagnose", "target": {"project_dir": str(PARTIAL), "script": "healthy_twin.py"},
                      "options": {}}, lambda phase: None)
    assert_verdict(report, "a watch that raises")
    assert "GP112" not in codes(report) and "GP000" in codes(report), report["findings"]
    assert report["verdict"]["status"] == "not_checked" and report["verdict"]["not_run"][0]["cause"] == "gradprobe"


@pytest.mark.anyio
async def test_a_write_into_the_projects_existing_folder_is_gradprobes_limit_not_the_scripts_error(client, tmp_path):
    """A script that writes into an output folder the project already has (left by an earlier plain run, as minGPT's
    `out/`): plainly the write succeeds; under gradprobe the project is read-only. Not checked, cause gradprobe, with
    the path and where to point the outputs, never "fix the error in the traceback". A new folder is written fine."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "args.txt").write_text("from an earlier run\n")
    (tmp_path / "train.py").write_text(
        "import os, sys, torch\n"
        "out = sys.argv[1]\n"
        "os.makedirs(out, exist_ok=True)\n"
        "open(os.path.join(out, 'args.txt'), 'w').write(' '.join(sys.argv))\n"
        "model = torch.nn.Linear(3, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(2):\n"
        "    model(torch.randn(4, 3)).pow(2).mean().backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n")
    assert subprocess.run([sys.executable, "train.py", "out"], cwd=tmp_path).returncode == 0  # plainly it works
    report = await call(client, "diagnose", {"project_dir": str(tmp_path), "script": "train.py", "args": ["out"]})
    [f] = [f for f in report["findings"] if f["code"] == "GP112"]
    assert f["evidence"]["read_only_project"] is True and "`out/args.txt`" in f["message"], f["message"]
    assert "traceback" not in f["fix"] and "`out`" in f["fix"], f["fix"]
    assert report["verdict"]["status"] == "not_checked" and blocking(report)[0]["cause"] == "gradprobe", report["verdict"]
    fresh = await call(client, "diagnose", {"project_dir": str(tmp_path), "script": "train.py", "args": ["new_out"]})
    assert fresh["verdict"]["status"] == "verified", fresh["verdict"]


def test_settle_is_idempotent_and_reads_any_engines_entries():
    """The verdict reads facts.verified/facts.not_run generically (a new tool's too), not_applicable never blocks, a
    malformed cause is gradprobe's, and settling twice changes nothing."""
    from gradprobe.report import make_report
    from gradprobe.verdict import settle

    report = make_report("check_equivalence", [], ["body line"],
                         verified=["accumulated gradient against one batch: 1.000x"],
                         not_run=[{"check": "the second micro-batch comparison", "why": "no loss", "cause": "not_applicable"}])
    assert report["verdict"]["status"] == "verified" and report["ok"], report["verdict"]
    assert report["summary"] == "verified: accumulated gradient against one batch: 1.000x.\nbody line"
    again = settle(json.loads(json.dumps(report)))
    assert again == report
    odd = make_report("check_dependencies", [], [], verified=["x"], not_run=[{"check": "y", "why": "z", "cause": "?"}])
    assert odd["verdict"]["status"] == "partial" and odd["verdict"]["not_run"][0]["cause"] == "gradprobe"
    assert [f["code"] for f in odd["findings"]] == ["GP121"]
    nothing = make_report("diagnose", [], [])
    assert nothing["verdict"]["status"] == "not_checked" and nothing["summary"].startswith("not checked: nothing was")


# ---- item 2: the user's command as the user runs it ---------------------------------------------------------------

@pytest.mark.anyio
async def test_a_src_layout_run_from_the_root_over_mcp(client):
    """`python scripts/run.py recipes/tiny.yaml` with project_dir = the root: src/ on sys.path from __file__, the recipe
    relative to the working directory; verified."""
    report = await call(client, "diagnose", {"project_dir": str(SRC), "script": "scripts/run.py",
                                             "args": ["recipes/tiny.yaml"]})
    assert report["verdict"]["status"] == "verified", (report["verdict"], report["findings"][:2])
    assert report["facts"]["script_step"]["captured_at"] == "optimizer.step"


@pytest.mark.anyio
async def test_an_absolute_script_without_project_dir_runs_from_its_projects_root(client):
    """`"script": "/abs/repo/scripts/run.py"` alone: the project is the repository root (the nearest directory holding
    pyproject.toml), never the script's folder; the recipe resolves against the root."""
    report = await call(client, "diagnose", {"script": str(SRC / "scripts" / "run.py"), "args": ["recipes/tiny.yaml"]})
    assert report["verdict"]["status"] == "verified", (report["verdict"], report["findings"][:2])


def test_a_src_layout_run_from_the_root_on_the_command_line():
    """`gradprobe diagnose --script scripts/run.py -- recipes/tiny.yaml` from the root: the project is the working
    directory, not scripts/ (it used to be, and src/ was outside the sandbox's view: GP112 No module named)."""
    out = cli("diagnose", "--json", "--script", "scripts/run.py", "--", "recipes/tiny.yaml", cwd=SRC)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["verdict"]["status"] == "verified" and "GP112" not in codes(report), report["summary"]


@pytest.mark.anyio
async def test_project_dir_set_to_the_scripts_folder_says_what_to_set(client):
    """project_dir = scripts/ (the script's folder): src/ is outside the sandbox's view; GP122 names where the package
    is and the project_dir and script to give, and nothing is claimed about the code."""
    report = await call(client, "diagnose", {"project_dir": str(SRC / "scripts"), "script": "run.py",
                                             "args": [str(SRC / "recipes" / "tiny.yaml")]})
    assert codes(report) == ["GP122"] and report["verdict"]["status"] == "not_checked", report["findings"]
    f = report["findings"][0]
    assert f["evidence"]["replaces"] == "GP112" and f["evidence"]["package_dir"] == str(SRC / "src"), f["evidence"]
    assert f"Set project_dir to {SRC}" in f["fix"] and "'scripts/run.py'" in f["fix"], f["fix"]
    assert "Install it there" not in report["summary"]  # not a missing dependency of the interpreter


@pytest.mark.anyio
async def test_a_src_package_nothing_puts_on_sys_path_is_gp122_with_the_directory_used(client):
    """The script imports its src/ package with no install and no sys.path line (fails plainly too): GP122 says the
    command, the working directory, what sys.path began with, and the options (install the project, or src/ on sys.path)."""
    report = await call(client, "diagnose", {"project_dir": str(UNINSTALLED), "script": "scripts/run.py",
                                             "args": ["recipes/tiny.yaml"]})
    assert codes(report) == ["GP122"], report["findings"]
    f = report["findings"][0]
    assert "`python scripts/run.py`" in f["message"] and f"sys.path began with {UNINSTALLED / 'scripts'}" in f["message"]
    assert "pip install -e ." in f["fix"] and "'src'" in f["fix"], f["fix"]
    assert f["location"]["line"] == 17, f["location"]


def test_the_projects_editable_install_is_found(tmp_path):
    """The same uninstalled layout with the project installed editable in its own .venv (the `__editable__` .pth that
    `pip install -e .` writes): the project's environment runs the script from the root, and it is verified."""
    from test_interpreter import make_venv, site_packages

    proj = tmp_path / "proj"
    shutil.copytree(UNINSTALLED, proj)
    py = make_venv(proj / ".venv")
    (site_packages(proj / ".venv") / "__editable__.tinylm-0.1.pth").write_text(str(proj / "src") + "\n")
    plain = subprocess.run([str(py), "scripts/run.py", "recipes/tiny.yaml"], cwd=proj, capture_output=True, text=True,
                           timeout=300)
    assert plain.returncode == 0, plain.stderr[-2000:]
    out = cli("diagnose", "--json", "--script", "scripts/run.py", "--", "recipes/tiny.yaml", cwd=proj)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["facts"]["interpreter"]["path"] == str(py) and report["verdict"]["status"] == "verified", report["summary"]


# ---- item 3: meta-device and deferred initialisation --------------------------------------------------------------

META_SCRIPTS = ["fabric_empty_init.py", "meta_to_empty.py", "titan_init_weights.py", "hf_init_empty_weights.py"]


@pytest.mark.anyio
@pytest.mark.parametrize("script", META_SCRIPTS)
async def test_deferred_init_is_verified_under_gradprobe(client, script):
    """Each init style runs under gradprobe as it runs plainly: verified, every trainable parameter traced with a
    gradient; a flop count's meta backward is no step."""
    report = await call(client, "diagnose", {"project_dir": str(META), "script": script})
    assert report["verdict"]["status"] == "verified", (report["verdict"], report["findings"][:3])
    table = report["facts"]["per_parameter"]
    assert table and all(r["grad"] == "ok" for r in table), table
    assert report["facts"]["script_step"]["captured_at"] == "optimizer.step"


@pytest.mark.anyio
async def test_a_flop_count_on_a_meta_model_is_no_accumulation(client):
    """audit_training over Fabric's empty init with a meta flop count: one backward per optimizer step (the meta
    backward is not a micro-batch), verified."""
    report = await call(client, "audit_training", {"project_dir": str(META), "script": "fabric_empty_init.py"}, steps=2)
    assert report["verdict"]["status"] == "verified", report["verdict"]
    assert [s["backward_calls"] for s in report["facts"]["optimizer_steps"]] == [1, 1], report["facts"]["optimizer_steps"]


@pytest.mark.anyio
async def test_the_scripts_own_meta_error_is_the_scripts(client):
    """`.to("cpu")` on a meta model raises plainly too: GP112 at the script's line (problems found), not a check of
    gradprobe's that did not run."""
    report = await call(client, "diagnose", {"project_dir": str(SCRIPTS / "verdict_meta_init_broken"),
                                             "script": "meta_to_cpu.py"})
    assert codes(report)[0] == "GP112" and report["verdict"]["status"] == "problems", report["findings"]
    f = report["findings"][0]
    assert "Cannot copy out of meta tensor" in f["message"] and f["location"]["line"] == 16, f
