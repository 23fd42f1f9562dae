"""The per-tensor, per-step table (issue 36, item 6), through the real server: for several steps, each trainable
tensor's gradient norm at optimizer.step(), update norm and update/weight ratio at every step, in the facts (names
once, one array per step) and as a capped text table in the summary (audit_training, diagnose with steps, a script)."""

from __future__ import annotations

import math

import pytest

from conftest import EXAMPLES

SCRIPTS = EXAMPLES.parent / "scripts"


async def _call(client, tool: str, target: dict, **options) -> dict:
    result = await client.call_tool(tool, {"target": target, **options})
    assert not result.is_error, result.content
    return result.structured_content


def _example(name: str) -> dict:
    return {"project_dir": str(EXAMPLES), "model": name}


def _group_total(table: dict, key: str, step: int) -> float:
    return math.sqrt(sum(v * v for v in table[key][step] if isinstance(v, float)))


@pytest.mark.anyio
async def test_every_tensor_every_step_in_the_facts_and_the_table(client):
    report = await _call(client, "audit_training", _example("healthy_steps_plain_loop.py"), steps=4)
    table = report["facts"]["per_tensor_steps"]
    trainable = [r["name"] for r in report["facts"]["per_parameter"] if r["requires_grad"]]
    assert table["names"] == trainable and table["steps"] == [1, 2, 3, 4]
    for key in ("grad_norm", "update_norm", "update_ratio"):
        assert len(table[key]) == 4 and all(len(row) == len(trainable) for row in table[key])
        assert all(isinstance(v, float) and v > 0 for row in table[key] for v in row)
    # the per-group numbers are the totals of these per-tensor ones (one group here)
    [group] = report["facts"]["param_groups"]
    for k in range(4):
        assert _group_total(table, "grad_norm", k) == pytest.approx(group["grad_norm_at_step"][k], rel=1e-3)
        assert _group_total(table, "update_norm", k) == pytest.approx(group["update_norm"][k], rel=1e-3)
    lines = report["summary"].splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("Per tensor, each optimizer step"))
    assert "step 1" in lines[head + 1] and "step 4" in lines[head + 1]
    printed = lines[head + 2: head + 2 + len(trainable)]
    assert sorted(row.split()[0] for row in printed) == sorted(trainable)
    name = printed[0].split()[0]
    i = table["names"].index(name)
    assert f"{table['grad_norm'][0][i]:.2g} | {table['update_ratio'][0][i]:.2g}" in printed[0]


@pytest.mark.anyio
async def test_tensors_with_no_gradient_at_the_step_are_printed_first(client):
    report = await _call(client, "audit_training", _example("gp605_clip_callback_zeroes_head.py"), steps=4)
    table = report["facts"]["per_tensor_steps"]
    head = [table["names"].index(n) for n in ("head.weight", "head.bias")]
    assert all(table["grad_norm"][k][i] == 0 and table["update_norm"][k][i] == 0 for k in range(4) for i in head)
    lines = report["summary"].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Per tensor")) + 2
    assert {lines[start].split()[0], lines[start + 1].split()[0]} == {"head.weight", "head.bias"}
    assert lines[start].split()[1:4] == ["0", "|", "0"]


@pytest.mark.anyio
async def test_rows_are_capped_and_the_rest_is_counted(client):
    report = await _call(client, "audit_training", _example("healthy_image_tower_lock_last_block.py"), steps=2)
    table = report["facts"]["per_tensor_steps"]
    assert len(table["names"]) == 59 and table["steps"] == [1, 2]
    lines = report["summary"].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Per tensor"))
    rows = [line for line in lines[start + 2:] if line.startswith("  ") and not line.startswith("  ...")]
    assert len(rows) == 10
    assert any(line.startswith("  ... 49 more tensor(s) not printed") for line in lines[start:])


@pytest.mark.anyio
async def test_diagnose_with_steps_carries_the_table(client):
    report = await _call(client, "diagnose", _example("healthy_steps_plain_loop.py"), steps=3)
    table = report["facts"]["steps"]["per_tensor_steps"]
    assert table["steps"] == [1, 2, 3] and len(table["grad_norm"]) == 3
    assert "Per tensor, each optimizer step" in report["summary"]


@pytest.mark.anyio
async def test_a_script_own_loop_gets_the_table(client):
    target = {"project_dir": str(SCRIPTS / "steps_gan"), "script": "train.py", "args": ["--steps=8"], "timeout_s": 240}
    report = await _call(client, "audit_training", target, steps=3)
    table = report["facts"]["per_tensor_steps"]
    # two optimizers (discriminator, generator): each optimizer step is a column, its optimizer named, and each has
    # values for its own optimizer's tensors only (4 each), the same ones at every step of that optimizer
    assert len(table["optimizer"]) == len(table["steps"]) and set(table["optimizer"]) == {0, 1}
    stepped: dict[int, set[int]] = {}
    for k, opt in enumerate(table["optimizer"]):
        have = {i for i, v in enumerate(table["grad_norm"][k]) if v is not None}
        assert len(have) == 4 and stepped.setdefault(opt, have) == have
    assert not stepped[0] & stepped[1] and len(table["names"]) == 8
    assert "/opt 1" in report["summary"] and "<tensor" not in report["summary"]
