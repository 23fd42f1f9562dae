"""A memory limit is neither the user's bug nor gradprobe's: through the real server, an allocation the
sandbox's limit refuses (RLIMIT_AS on CPU runs) is GP113 resource-limit, a warning, wherever it happens
(import, build, the step's backward, gradcheck), and no other rule blames the code for what did not finish."""

from __future__ import annotations

import textwrap

import pytest

TIB4 = 2**40 * 4  # torch.empty(2**40) of float32: refused under any address-space limit the sandbox sets

HUNGRY_BACKWARD = """
import torch
import torch.nn as nn


class Hungry(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        scratch = torch.empty(2**40)  # 4 TiB: the sandbox's address-space limit refuses it at once
        return g * 2 + scratch[:0].sum()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(Hungry.apply(self.fc(x)))


def build_model():
    return Net()


def make_inputs():
    return torch.randn(2, 3)


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)
"""
ALLOC_LINE = HUNGRY_BACKWARD.lstrip("\n").splitlines().index(
    "        scratch = torch.empty(2**40)  # 4 TiB: the sandbox's address-space limit refuses it at once") + 1


def write(tmp_path, text: str) -> str:
    (tmp_path / "case.py").write_text(textwrap.dedent(text).lstrip("\n"))
    return str(tmp_path)


async def call(client, project_dir: str, tool: str) -> dict:
    result = await client.call_tool(tool, {"target": {"project_dir": project_dir, "model": "case.py", "timeout_s": 120}})
    assert not result.is_error, result.content
    return result.structured_content


def only_the_limit(report: dict) -> dict:
    """The report holds GP113 and no error: nothing is said against the code."""
    errors = [(f["code"], f["message"]) for f in report["findings"] if f["severity"] == "error"]
    assert not errors, errors
    limits = [f for f in report["findings"] if f["code"] == "GP113"]
    assert len(limits) == 1, [(f["code"], f["message"]) for f in report["findings"]]
    f = limits[0]
    assert f["severity"] == "warning" and f["name"] == "resource-limit"
    assert "nothing is claimed about the code" in f["message"]
    # a check the limit stopped did not run: said first, never OK (docs/verdicts.md)
    assert report["ok"] is False and report["verdict"]["status"] in ("partial", "not_checked"), report["verdict"]
    assert "GP113" in report["summary"].splitlines()[0]
    return f


@pytest.mark.anyio
@pytest.mark.parametrize("tool", ["diagnose", "trace_grad_path"])
async def test_a_backward_the_memory_limit_stops_is_gp113_and_no_error(client, tmp_path, tool):
    report = await call(client, write(tmp_path, HUNGRY_BACKWARD), tool)
    f = only_the_limit(report)
    assert report["findings"][0] is not None and report["findings"][0]["code"] == "GP113"  # it leads the report
    assert f["evidence"]["phase"] == "running backward()" and "while running backward()" in f["message"]
    assert f["evidence"]["limit"]["device"] == "cpu" and f["evidence"]["limit"]["requested_bytes"] == TIB4
    assert "an allocation of 4.0 TiB (4398046511104 bytes) was refused by the CPU allocator" in f["message"]
    assert "DefaultCPUAllocator" in f["evidence"]["limit"]["error"]
    assert f["evidence"]["address_space_limit_bytes"] > 0 and "address space is capped" in f["message"]
    assert f["location"]["file"].endswith("case.py") and f["location"]["line"] == ALLOC_LINE
    assert "--memory-gb" in f["fix"]
    # the parameters whose gradient never came are not blamed on a cut, a hook or an unused output
    assert not [x for x in report["findings"] if x["code"] in ("GP301", "GP306", "GP308", "GP310", "GP312", "GP313")]
    if tool == "diagnose":
        assert report["facts"]["gradcheck"] == {"skipped": "the step was stopped by a memory limit (GP113)"}


@pytest.mark.anyio
async def test_gradcheck_of_a_custom_backward_the_memory_limit_stops_is_gp113(client, tmp_path):
    report = await call(client, write(tmp_path, HUNGRY_BACKWARD), "run_gradcheck")
    f = only_the_limit(report)
    assert "Hungry.backward" in f["evidence"]["phase"] and f["evidence"]["function"] == "Hungry"
    assert f["location"]["line"] == ALLOC_LINE


@pytest.mark.anyio
async def test_the_optimizer_step_check_stopped_by_the_memory_limit_is_gp113(client, tmp_path):
    report = await call(client, write(tmp_path, HUNGRY_BACKWARD), "check_optimizer_coverage")
    f = only_the_limit(report)
    assert "one real step" in f["evidence"]["phase"]


@pytest.mark.anyio
@pytest.mark.parametrize("tool", ["inspect_parameters", "diagnose"])
async def test_a_build_that_raises_memory_error_is_gp113_not_gp100(client, tmp_path, tool):
    project = write(tmp_path, """
        import torch
        import torch.nn as nn


        def build_model():
            table = bytearray(2**40)  # 1 TiB: MemoryError under the sandbox's limit
            return nn.Linear(3, 1)


        def make_inputs():
            return torch.randn(2, 3)
    """)
    report = await call(client, project, tool)
    f = only_the_limit(report)
    assert [x["code"] for x in report["findings"]] == ["GP113"]
    assert f["evidence"]["phase"] == "building the model" and f["evidence"]["limit"]["exception"] == "MemoryError"
    assert f["location"]["line"] == 6 and "MemoryError" in f["evidence"]["traceback"]


@pytest.mark.anyio
async def test_an_import_the_memory_limit_stops_is_gp113(client, tmp_path):
    project = write(tmp_path, """
        import torch
        import torch.nn as nn

        TABLE = torch.zeros(2**40)  # at import: the CPU allocator refuses it


        def build_model():
            return nn.Linear(3, 1)
    """)
    report = await call(client, project, "inspect_parameters")
    f = only_the_limit(report)
    assert f["evidence"]["phase"] == "importing" and f["evidence"]["limit"]["requested_bytes"] == TIB4
    assert f["location"]["line"] == 4


@pytest.mark.anyio
async def test_a_child_the_cgroup_killed_for_memory_is_gp113_not_gp100(tmp_path):
    """The parent's side (call.py): a child the per-call cgroup's OOM killer ended. On CPU the address-space
    limit refuses first, so the kill is what the cgroup reports (outcome.oom), played here by an executor."""
    from gradprobe.sandbox.call import execute
    from gradprobe.sandbox.runner import ChildOutcome, Limits
    from gradprobe.target import Target

    class Killed:
        limits = Limits(memory_bytes=3 * 1024**3)

        async def run(self, job, **kw):
            return ChildOutcome(report=None, tool_error=None, phase="checking", returncode=-9, timed_out=False,
                                stdout="", stderr="", seconds=1.0, oom=True)

    target = Target.model_validate({"project_dir": write(tmp_path, HUNGRY_BACKWARD), "model": "case.py"})
    report = await execute("diagnose", target, executor=Killed())
    assert [f["code"] for f in report["findings"]] == ["GP113"] and report["verdict"]["status"] == "not_checked"
    f = report["findings"][0]
    assert "killed by the sandbox's cgroup memory limit (3.0 GiB)" in f["message"] and "while checking" in f["message"]
    assert f["evidence"]["limit"] == {"device": "cgroup", "memory_bytes": 3 * 1024**3} and "--memory-gb" in f["fix"]


@pytest.mark.anyio
async def test_a_script_the_memory_limit_stops_before_its_first_step_is_gp113_not_gp112(client, tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch
        import torch.nn as nn

        model = nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cache = torch.empty(2**40)  # 4 TiB of activations: refused under the sandbox's limit
        for _ in range(2):
            loss = model(torch.randn(2, 3)).sum()
            loss.backward()
            opt.step()
    """).lstrip("\n"))
    target = {"project_dir": str(tmp_path), "script": "train.py", "timeout_s": 120}
    result = await client.call_tool("diagnose", {"target": target})
    report = result.structured_content
    f = only_the_limit(report)
    assert [x["code"] for x in report["findings"]] == ["GP113"] and f["location"]["line"] == 6
    assert "train.py before its first training step" in f["evidence"]["phase"]
