"""Several ranks in one sandboxed call, through the real server over stdio: torchrun-style scripts run with
`world_size: 2` (DDP, FSDP2's fully_shard, DDP under no_sync) and scripts that start their own ranks with
torch.multiprocessing.spawn, healthy and with one distributed bug each (gloo on CPU, the call's private loopback), and
build_model() targets at world size 2 (examples/ranks). Findings are merged across ranks and say which ranks they hold
on."""

from __future__ import annotations

import pytest

from conftest import ROOT, assert_expected, example_expect

SCRIPTS = ROOT / "examples" / "scripts"

# (project, script and its extra arguments, world_size, expect, timeout_s): expect as in examples/broken's EXPECT,
# plus `ranks` (the ranks the first hit holds on). The timeouts leave room for a loaded machine; a hang is found as
# soon as the other ranks stop.
CASES = [
    ("ddp", "train.py", 2, {"codes": [], "healthy": True}, 90),
    ("fsdp2", "train.py", 2, {"codes": [], "healthy": True, "absent": ["GP301", "GP201", "GP311"]}, 90),
    ("fsdp2_broken", "optimizer_before_shard.py", 2,
     {"codes": ["GP202"], "culprits": ["0.weight", "2.bias"], "line": 30, "ranks": [0, 1]}, 90),
    ("fsdp2_broken", "unused_on_one_rank.py", 2,
     {"codes": ["GP703"], "culprits": ["aux.weight", "aux.bias"], "line": 40, "ranks": [1], "absent": ["GP112", "GP707"]},
     90),
    ("fsdp2_broken", "root_not_sharded.py", 2, {"codes": ["GP704"], "culprits": ["embed.weight", "head.bias"], "line": 56}, 90),
    ("fsdp2_broken", "seed_per_rank.py", 2,
     {"codes": ["GP704"], "culprits": ["embed.weight", "ff.0.weight", "head.bias"], "line": 35, "ranks": [0, 1]}, 90),
    ("fsdp2", "tensor_parallel.py", 2, {"codes": [], "healthy": True, "absent": ["GP201", "GP202", "GP704"]}, 90),
    ("fsdp2_broken", "tp_optimizer_before.py", 2,
     {"codes": ["GP202"], "culprits": ["up.weight", "down.bias"], "line": 39, "ranks": [0, 1]}, 90),
    ("spawn", "train.py", 1, {"codes": [], "healthy": True}, 90),
    ("spawn", "manual_average.py", 1, {"codes": [], "healthy": True, "absent": ["GP703", "GP704", "GP705", "GP706"]}, 90),
    ("spawn", "manual_average.py --scale_loss", 1, {"codes": [], "healthy": True, "absent": ["GP705"]}, 90),
    ("ddp_broken", "local_update.py", 2,
     {"codes": ["GP704"], "culprits": ["lateral.weight"], "line": 53, "ranks": [0, 1], "absent": ["GP705"]}, 90),
    ("ddp_broken", "local_update.py --sync", 2, {"codes": [], "healthy": True, "absent": ["GP704", "GP705"]}, 90),
    ("ddp_nosync", "train.py", 2, {"codes": ["GP704"], "culprits": ["0.weight"], "ranks": [0, 1], "line": 31}, 90),
    ("spawn_broken", "sum_not_divided.py", 1, {"codes": ["GP705"], "culprits": ["0.weight", "2.weight"], "line": 33}, 90),
    ("spawn_broken", "not_broadcast.py", 1, {"codes": ["GP704"], "culprits": ["0.weight", "2.bias"], "line": 24}, 90),
    ("spawn_broken", "load_after_wrap.py", 1, {"codes": ["GP704"], "culprits": ["0.weight", "2.bias"], "line": 26}, 90),
    ("spawn_broken", "averages_some.py", 1,
     {"codes": ["GP704"], "culprits": ["head.weight", "head.bias"], "absent": ["GP705"], "line": 42}, 90),
    ("spawn_broken", "collective_on_one_rank.py", 1, {"codes": ["GP706"], "culprits": [], "line": 34, "ranks": [0]}, 90),
    ("spawn_broken", "unused_on_one_rank.py", 1,
     {"codes": ["GP703"], "culprits": ["aux.weight", "aux.bias"], "line": 32, "ranks": [1]}, 90),
    ("spawn_broken", "unused_on_one_rank.py --find_unused", 1,
     {"codes": ["GP703"], "culprits": ["aux.weight"], "severity": "info", "healthy": True, "absent": ["GP706"]}, 90),
]


def _id(case) -> str:
    return f"{case[0]}/{case[1]}@{case[2]}"


# Lightning (strategy ddp, devices 2) and accelerate (its own DDP on CPU, gloo) under world_size 2, with their own
# arguments; each rank runs the framework's own setup (the torchrun-style environment is what both read)
FRAMEWORKS = [
    ("accelerate", "train.py --epochs=1", 2, {"codes": [], "healthy": True}, 120),
    ("accelerate_broken", "train.py --epochs=1", 2, {"codes": ["GP303"], "culprits": ["prompt_emb"], "line": 18}, 120),
    ("lightning_broken", "train.py --fast_dev_run=1 --devices 2 --strategy ddp", 2,
     {"codes": ["GP201"], "culprits": ["head.weight", "head.bias"], "line": 24, "ranks": [0, 1], "absent": ["GP707"]},
     240),
]


async def _run(client, case, args: list[str]) -> dict:
    project, command, world_size, expect, timeout_s = case
    script, *extra = command.split()
    target = {"project_dir": str(SCRIPTS / project), "script": script, "args": [*args, *extra],
              "timeout_s": timeout_s, "world_size": world_size}
    result = await client.call_tool("diagnose", {"target": target})
    assert not result.is_error, result.content
    report = result.structured_content
    assert_expected(report, expect, _id(case))
    ranks = report["facts"]["ranks"]
    assert ranks["world_size"] == 2, ranks
    assert ranks["how"] == ("torchrun-style" if world_size > 1 else "mp.spawn"), ranks
    if expect.get("healthy") or expect["codes"] == ["GP202"]:
        assert all(r["stepped"] and r["reported"] for r in ranks["ranks"]), ranks
    if expect.get("ranks"):
        hit = next(f for f in report["findings"] if f["code"] in expect["codes"])
        assert hit["evidence"]["ranks"] == expect["ranks"], hit["evidence"]
    return report


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
async def test_ranks_through_mcp(client, case):
    report = await _run(client, case, ["--steps", "2"])
    if case[1] == "seed_per_rank.py":  # measured whole on each rank just before fully_shard sharded it
        hit = next(f for f in report["findings"] if f["code"] == "GP704")
        assert "when fully_shard sharded it at line 47" in hit["message"], hit["message"]
    if case[1] == "local_update.py":  # equal at the first forward, written on each rank before the step: `changed`
        hit = next(f for f in report["findings"] if f["code"] == "GP704")
        assert "equal on every rank when the model was first called" in hit["message"], hit["message"]


@pytest.mark.anyio
@pytest.mark.parametrize("case", FRAMEWORKS, ids=[_id(c) for c in FRAMEWORKS])
async def test_frameworks_at_two_ranks(client, case):
    report = await _run(client, case, [])
    if case[0] == "accelerate_broken":  # DDP's reduction stalls on the parameters that got no gradient
        hit = next(f for f in report["findings"] if f["code"] == "GP704")
        assert hit["evidence"]["no_gradient"][:1] == ["prompt_emb"], hit["evidence"]


# build_model() targets at world size 2 (examples/ranks: each file's EXPECT, with the ranks the first hit holds on):
# gradprobe initialises the process group, wraps a plain model in DDP and gives each rank its own batch
MODEL_RANKS = sorted((ROOT / "examples" / "ranks").glob("*.py"))


@pytest.mark.anyio
@pytest.mark.parametrize("path", MODEL_RANKS, ids=[p.stem for p in MODEL_RANKS])
async def test_build_model_form_at_two_ranks(client, path):
    expect = example_expect(path)
    target = {"project_dir": str(path.parent), "model": path.name, "world_size": expect["world_size"], "timeout_s": 90}
    result = await client.call_tool(expect["tool"], {"target": target})
    assert not result.is_error, result.content
    report = result.structured_content
    assert_expected(report, expect, path.name)
    ranks = report["facts"]["ranks"]
    assert ranks["how"] == "build_model() form" and ranks["world_size"] == 2, ranks
    form = report["facts"]["model_form"]
    assert form["batch_seeds"] == {"0": 0, "1": 1}, form
    wrapped = expect.get("wrapped") or ("as build_model() returned it" if expect.get("healthy") else "by gradprobe")
    assert form["wrapped"].startswith(wrapped), form
    if expect.get("ranks"):
        hit = next(f for f in report["findings"] if f["code"] in expect["codes"])
        assert hit["evidence"]["ranks"] == expect["ranks"], hit["evidence"]
        # rank 0, left waiting in DDP's all-reduce for the bucket rank 1 never filled, is a consequence
        assert [c["code"] for c in hit["evidence"].get("consequences", [])] in ([], ["GP706"]), hit["evidence"]
        # the box head ran on both ranks: its output was left out of rank 1's loss (the image tower did not run there)
        assert ("ran on every rank" in hit["message"]) == ("box" in path.stem), hit["message"]


@pytest.mark.anyio
async def test_world_size_needs_real_weights(client):
    target = {"project_dir": str(ROOT / "examples" / "ranks"), "model": MODEL_RANKS[0].name, "world_size": 2,
              "device": "meta"}
    result = await client.call_tool("inspect_parameters", {"target": target})
    text = str(result.content)
    assert result.is_error and "world_size" in text and "meta" in text, text
