"""The Ray executor on a local Ray instance (CPU only): same results as the local executor,
cancellation kills the child, and a dead worker becomes a clear finding."""

from __future__ import annotations

import os
import time

import anyio
import pytest

from conftest import EXAMPLES
from gradprobe.sandbox.call import execute
from gradprobe.sandbox.runner import Limits
from gradprobe.target import Target

ray = pytest.importorskip("ray", reason="the Ray executor is an optional extra: pip install 'gradprobe[ray]'")

CASES = ["gp302_detach_in_attention.py", "gp201_optimizer_misses_head.py", "gp404_gate_weight_none.py", "gp103_heads_in_dict.py"]
TOOLS = {"gp302_detach_in_attention.py": "trace_grad_path", "gp201_optimizer_misses_head.py": "check_optimizer_coverage",
         "gp404_gate_weight_none.py": "run_gradcheck", "gp103_heads_in_dict.py": "inspect_parameters"}


@pytest.fixture(scope="module")
def executor():
    from gradprobe.sandbox.ray_executor import RayExecutor

    ex = RayExecutor("local", num_cpus=2)
    yield ex
    ex.shutdown()


def shape(report: dict) -> list:
    return [(f["code"], f["parameters"], (f["location"] or {}).get("line")) for f in report["findings"]]


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES)
async def test_same_results_as_the_local_executor(executor, case):
    target = Target(project_dir=str(EXAMPLES), model=case)
    local = await execute(TOOLS[case], target)
    remote = await execute(TOOLS[case], target, executor=executor)
    assert shape(remote) == shape(local)
    assert remote["facts"]["sandbox"]["child"].startswith("a Ray task")


def _children() -> list[int]:
    """The sandbox children (`gradprobe/sandbox/child.py`) that this test process started through its private Ray
    instance (whose processes descend from it), and any that lost their parent. Children of other test processes
    (pytest-xdist's other worker, another checkout's run) are not ours to count."""
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
                procs[int(d)] = (ppid, b"gradprobe/sandbox/child.py" in open(f"/proc/{d}/cmdline", "rb").read())
            except (OSError, ValueError, IndexError):
                pass

    def ours(pid: int) -> bool:
        if procs[pid][0] not in procs or procs[pid][0] == 1:
            return True  # an orphan: whoever started it, it outlived its parent
        seen = set()
        while pid in procs and pid not in seen:
            seen.add(pid)
            if pid == os.getpid():
                return True
            pid = procs[pid][0]
        return False

    return [pid for pid, (_, child) in procs.items() if child and ours(pid)]


@pytest.mark.anyio
async def test_cancellation_cancels_the_task_and_kills_the_child(executor, tmp_path):
    (tmp_path / "case.py").write_text("import time, torch.nn as nn\n"
                                      "def build_model():\n    time.sleep(600)\n    return nn.Linear(2, 2)\n")
    target = Target(project_dir=str(tmp_path), model="case.py", timeout_s=600)
    with anyio.move_on_after(8):
        await execute("inspect_parameters", target, executor=executor)
    deadline = time.monotonic() + 15
    while _children() and time.monotonic() < deadline:
        await anyio.sleep(0.3)
    assert not _children()


@pytest.mark.anyio
async def test_a_dead_worker_is_a_clear_finding(executor, tmp_path):
    # without isolation the child may signal its parent: here it kills the Ray worker running it
    (tmp_path / "case.py").write_text("import os, signal, torch.nn as nn\ndef build_model():\n"
                                      "    os.kill(os.getppid(), signal.SIGKILL)\n    return nn.Linear(2, 2)\n")
    target = Target(project_dir=str(tmp_path), model="case.py", timeout_s=60)
    report = await execute("inspect_parameters", target, executor=executor, limits=Limits(isolate=False))
    f = report["findings"][0]
    assert f["code"] == "GP116" and "Ray worker" in f["message"], f["message"]


def test_a_result_that_is_not_capped_json_bytes_is_refused():
    from gradprobe.sandbox.ray_executor import WIRE_CAP, parse_outcome

    for bad in ({"report": {}}, b"\x80\x04K\x01.", b"[1]", b"{" + b" " * WIRE_CAP + b"}"):
        with pytest.raises(ValueError):
            parse_outcome(bad)
    ok = parse_outcome(b'{"report": {"findings": []}, "phase": "done", "returncode": 0, "stdout": 3, "mode": "x"}')
    assert ok.report == {"findings": []} and ok.stdout == "" and ok.mode == "ray"


@pytest.mark.anyio
async def test_local_mode_ignores_a_planted_cluster_address_and_file(tmp_path):
    """`--ray-address local` through the real server: RAY_ADDRESS and a cluster file in Ray's temp directory name a
    cluster that is not ours; the server starts its own private instance (0700 temp dir, loopback) and jobs run."""
    from mcp import Client

    from conftest import server_params

    planted = tmp_path / "raytmp" / "ray"
    planted.mkdir(parents=True)
    (planted / "ray_current_cluster").write_text("127.0.0.1:9\n")
    env = {"RAY_ADDRESS": "127.0.0.1:9", "RAY_TMPDIR": str(tmp_path / "raytmp")}
    target = {"project_dir": str(EXAMPLES), "model": "gp103_heads_in_dict.py", "timeout_s": 60}
    with anyio.fail_after(120):
        async with Client(server_params(env, ("--executor", "ray", "--ray-address", "local")), read_timeout_seconds=120) as c:
            result = await c.call_tool("inspect_parameters", {"target": target})
    sc = result.structured_content
    assert sc["facts"]["sandbox"]["child"].startswith("a Ray task"), sc
    assert any(f["code"] == "GP103" for f in sc["findings"]), sc["findings"]
    assert not any(p.name.startswith("session") for p in planted.iterdir())  # nothing of ours went to the planted dir
