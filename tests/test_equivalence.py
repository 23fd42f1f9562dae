"""check_equivalence through the real server over stdio: the setup under test against its reference on the same
weights and examples, measured tensor by tensor (GP801 N processes against one, GP802 k micro-batches against one
batch, GP806 a per-tensor scale by design), each buggy example at its line with the ratio it names, each healthy twin
verified with its largest difference, a comparison that cannot run said in facts.not_run; and diagnose with
`compare: true`. The build_model() examples (examples/broken/gp802_*, healthy_equivalence_*) run in test_examples.py.

Two-rank runs are the slow ones (gloo on loopback, the script run at 2 ranks then as one process): one call per
example, no more.
"""

from __future__ import annotations

import importlib.util

import pytest

from conftest import ROOT, assert_expected, example_expect

SCRIPTS = ROOT / "examples" / "scripts"
RANKS = sorted((SCRIPTS / "equiv_ranks").glob("*.py")) + sorted((SCRIPTS / "equiv_ranks_broken").glob("*.py"))
ACCUM = sorted((SCRIPTS / "equiv_accum").glob("*.py")) + sorted((SCRIPTS / "equiv_accum_broken").glob("*.py"))
NEEDS = {"transformers": "transformers", "accelerate": "accelerate", "lightning": "lightning"}
# build_model() targets at world size 2 against one process (each rank runs the target as modelranks.py does)
MODEL_RANKS = sorted((ROOT / "examples" / "ranks_equivalence").glob("*.py"))
# batches made without a DataLoader that cannot be fed: refused, never judged
REFUSED = sorted((SCRIPTS / "equiv_refused").glob("*.py"))
# custom_ops, storage and packing on a script's first step, under the Trainer, accelerate and a 2-rank DDP script
OPS = sorted((SCRIPTS / "equiv_ops").glob("*.py")) + sorted((SCRIPTS / "equiv_ops_broken").glob("*.py"))
# launchers as users run them (a launcher script that starts torchrun, mp.spawn): the entry scripts, those with an EXPECT
LAUNCH = [p for d in ("equiv_launch", "equiv_launch_broken") for p in sorted((SCRIPTS / d).glob("*.py"))
          if "\nEXPECT = " in p.read_text()]

# existing script projects of other codes, compared here with expectations of this tool: (project, args, expect)
OTHERS = [
    ("lightning_accum_broken", ["--max_steps=8"],
     {"codes": ["GP802"], "culprits": ["body.0.weight"], "line": 38, "ratio_is": "1/k"}),  # the division, traced
    ("lightning_accum", ["--max_steps=8"], {"codes": [], "healthy": True, "absent": ["GP802"]}),
    ("hf_trainer_accum_broken", ["--max_steps=8"],
     {"codes": ["GP802"], "culprits": ["head.weight"], "line": 51, "ratio_is": "1/k", "severity": "warning"}),
    ("accelerate_accum_twice_broken", ["--epochs=1"], {"codes": ["GP802"], "culprits": [], "line": 37}),
]


def _needs(path) -> str | None:
    text = path.read_text()
    return next((pkg for word, pkg in NEEDS.items() if f"import {word}" in text or f"from {word}" in text), None)


async def _call(client, project, script, args, world_size=1, **options) -> dict:
    target = {"project_dir": str(project), "script": script, "args": args, "timeout_s": 300, "world_size": world_size}
    result = await client.call_tool("check_equivalence", {"target": target, **options})
    assert not result.is_error, result.content
    report = result.structured_content
    assert not [f for f in report["findings"] if f["code"] in ("GP000", "GP112")], report["findings"]
    return report


def _judge(report: dict, expect: dict, name: str) -> None:
    assert_expected(report, expect, name)
    facts = report["facts"]
    if expect["codes"]:
        hit = next(f for f in report["findings"] if f["code"] in expect["codes"])
        if expect.get("ratio_is"):
            assert f"({expect['ratio_is']})" in hit["message"], hit["message"]
        if expect.get("step"):
            assert f"at step {expect['step']}" in hit["message"] and "Step 1 agreed" in hit["message"], hit["message"]
        assert hit["evidence"].get("steps"), hit["evidence"]
    else:
        assert report["ok"], report["findings"]
        assert facts["verified"], report["summary"]  # an all-clear says what was compared, with the largest difference
        assert "largest relative difference" in facts["verified"][0], facts["verified"]
        assert not [e for e in facts["not_run"] if e["cause"] != "not_applicable"], facts["not_run"]
    for code in expect.get("info") or []:
        assert any(f["code"] == code and f["severity"] == "info" for f in report["findings"]), report["findings"]


@pytest.mark.anyio
@pytest.mark.parametrize("path", RANKS, ids=[f"{p.parent.name}/{p.stem}" for p in RANKS])
async def test_ranks_against_one_process(client, path):
    needs = _needs(path)
    if needs and importlib.util.find_spec(needs) is None:
        pytest.skip(f"needs {needs}")
    expect = example_expect(path)
    report = await _call(client, path.parent, path.name, expect.get("args", []), world_size=expect["world_size"],
                         **expect.get("options", {}))
    _judge(report, expect, path.name)
    ranks = report["facts"]["comparisons"]["ranks"]
    assert ranks["applies"] and ranks["facts"]["world_size"] == 2, ranks
    if "batchnorm" in path.stem:  # per-rank batch statistics differ by design: compared on the running statistics
        assert "BatchNorm layer(s) on their running statistics" in report["facts"]["verified"][0]


@pytest.mark.anyio
@pytest.mark.parametrize("path", REFUSED, ids=[p.stem for p in REFUSED])
async def test_what_cannot_be_fed_is_refused_not_judged(client, path):
    """Batches made without a DataLoader are fed at the model's and the loss function's calls; a target that enters the
    loss through neither (refused at its line), or a count the script computes from its own unfed batch (a scalar that
    varies with the data), cannot be fed: the comparison says so, never reports the difference as the code's."""
    expect = example_expect(path)
    report = await _call(client, path.parent, path.name, expect["args"], world_size=expect.get("world_size", 1),
                         **expect["options"])
    entry = next(e for e in report["facts"]["not_run"] if expect["refused"] in e["check"])
    assert entry["cause"] == "refused" and "no DataLoader" in entry["why"], entry
    if expect.get("line"):
        assert entry["location"]["line"] == expect["line"], entry
    # what was refused is said first (GP121, docs/verdicts.md), nothing is judged, and the verdict is no OK
    assert {f["code"] for f in report["findings"]} == {"GP121"} and not report["facts"]["verified"], report
    assert report["verdict"]["status"] != "verified", report["verdict"]


@pytest.mark.anyio
@pytest.mark.parametrize("path", OPS, ids=[f"{p.parent.name}/{p.stem}" for p in OPS])
async def test_first_step_comparisons_on_a_script(client, path):
    """custom_ops, storage and packing run on the script's first step (as one process, also for a 2-rank script):
    they apply under the Trainer, accelerate and DDP, say what they verified, and find the broken twin at its line."""
    needs = _needs(path)
    if needs and importlib.util.find_spec(needs) is None:
        pytest.skip(f"needs {needs}")
    expect = example_expect(path)
    report = await _call(client, path.parent, path.name, expect["args"], world_size=expect["world_size"],
                         **expect["options"])
    assert_expected(report, expect, path.name)
    for word in expect["verified"]:
        assert any(word in v for v in report["facts"]["verified"]), (word, report["facts"]["verified"])
    assert not [e for e in report["facts"]["not_run"] if e["cause"] != "not_applicable"], report["facts"]["not_run"]


@pytest.mark.anyio
@pytest.mark.parametrize("path", MODEL_RANKS, ids=[p.stem for p in MODEL_RANKS])
async def test_build_model_form_at_two_ranks_against_one_process(client, path):
    """A build_model() target at world size 2: its ranks (DDP by gradprobe, a batch each) against the same target as
    one process fed their inputs joined, from the same weights; its other comparisons on the target loaded as one."""
    expect = example_expect(path)
    target = {"project_dir": str(path.parent), "model": path.name, "world_size": expect["world_size"], "timeout_s": 300}
    result = await client.call_tool("check_equivalence", {"target": target})
    assert not result.is_error, result.content
    report = result.structured_content
    _judge(report, expect, path.name)
    ranks = report["facts"]["comparisons"]["ranks"]
    assert ranks["applies"] and ranks["facts"]["world_size"] == 2, ranks
    assert "build_model() target as one process" in ranks["facts"]["reference"], ranks["facts"]


@pytest.mark.anyio
async def test_a_spawned_world_without_a_one_process_reference_is_refused_with_why(client):
    """mp.spawn scripts pass their world size to their workers themselves: without the script's own arguments for one
    process, the reference would spawn N workers again; the comparison says so rather than guessing."""
    path = SCRIPTS / "equiv_launch" / "spawn_ddp.py"
    report = await _call(client, path.parent, path.name, ["--steps=2"], compare=["ranks"])
    entry = next(e for e in report["facts"]["not_run"] if "ranks" in e["check"])
    assert entry["cause"] == "refused" and "reference" in entry["why"] and "spawn" in entry["why"], entry
    # what was refused is said first (GP121, docs/verdicts.md), nothing is judged, and the verdict is no OK
    assert {f["code"] for f in report["findings"]} == {"GP121"} and not report["facts"]["verified"], report
    assert report["verdict"]["status"] != "verified", report["verdict"]


@pytest.mark.anyio
async def test_hand_written_average_is_the_twin_of_the_sum(client):
    path = SCRIPTS / "equiv_ranks_broken" / "grad_sum_not_divided.py"
    report = await _call(client, path.parent, path.name, ["--steps=4", "--average"], world_size=2)
    _judge(report, {"codes": [], "healthy": True, "absent": ["GP801"]}, "grad_sum_not_divided.py --average")


@pytest.mark.anyio
@pytest.mark.parametrize("path", ACCUM, ids=[f"{p.parent.name}/{p.stem}" for p in ACCUM])
async def test_micro_batches_against_one_batch(client, path):
    needs = _needs(path)
    if needs and importlib.util.find_spec(needs) is None:
        pytest.skip(f"needs {needs}")
    expect = example_expect(path)
    report = await _call(client, path.parent, path.name, expect.get("args", []), world_size=expect.get("world_size", 1),
                         **expect.get("options", {}))
    _judge(report, expect, path.name)
    assert report["facts"]["comparisons"]["accumulation"]["applies"]


@pytest.mark.anyio
@pytest.mark.parametrize("case", OTHERS, ids=[c[0] for c in OTHERS])
async def test_framework_accumulation_set_to_one(client, case):
    """The framework's own accumulation setting, set to 1 for the reference (Lightning, the Trainer, accelerate)."""
    project, args, expect = case
    report = await _call(client, SCRIPTS / project, "train.py", args, compare=["accumulation"])
    _judge(report, expect, project)
    facts = report["facts"]["comparisons"]["accumulation"]["facts"]
    assert "set to 1 by gradprobe" in facts["reference"], facts


@pytest.mark.anyio
async def test_a_plain_loop_without_a_reference_is_refused_not_passed(client):
    """A plain loop sets its accumulation itself: without `reference.args` the comparison is not run, and says so."""
    path = SCRIPTS / "equiv_accum_broken" / "loop_not_divided.py"
    report = await _call(client, path.parent, path.name, ["--steps=4"], compare=["accumulation"])
    entry = next(e for e in report["facts"]["not_run"] if "accumulation" in e["check"])
    assert entry["cause"] == "refused" and "reference" in entry["why"], entry
    assert not report["facts"]["verified"] and report["verdict"]["status"] != "verified", report
    # the only finding says the check did not run (GP121), never a verdict about the code
    assert [(f["code"], f["evidence"]["cause"]) for f in report["findings"]] == [("GP121", "refused")], report["findings"]


@pytest.mark.anyio
async def test_a_script_that_groups_batches_itself_is_refused_under_the_framework_setting(client):
    """accelerate's setting at 1 does not change a loop that groups its micro-batches itself: the reference then
    consumes other than one batch per step, and the comparison is refused rather than judged."""
    path = SCRIPTS / "equiv_accum" / "accelerate_token_mean_accumulated.py"
    report = await _call(client, path.parent, path.name, ["--steps=4"], compare=["accumulation"])
    entry = next(e for e in report["facts"]["not_run"] if "accumulation" in e["check"])
    assert entry["cause"] == "refused" and "groups its batches" in entry["why"], entry
    assert not [f for f in report["findings"] if f["severity"] == "error"], report["findings"]


@pytest.mark.anyio
async def test_diagnose_runs_the_comparisons_when_asked(client):
    path = SCRIPTS / "equiv_accum_broken" / "accelerate_token_mean_per_micro.py"
    target = {"project_dir": str(path.parent), "script": path.name, "args": ["--steps=4"], "timeout_s": 300}
    result = await client.call_tool("diagnose", {"target": target, "compare": True})
    report = result.structured_content
    hit = next(f for f in report["findings"] if f["code"] == "GP802")
    assert hit["location"]["line"] == example_expect(path)["line"], hit
    assert report["facts"]["equivalence"]["accumulation"]["applies"], report["facts"]["equivalence"]
    # the comparisons that take a loaded target are diagnose's own checks: not asked again, not said "did not load"
    assert set(report["facts"]["equivalence"]) == {"ranks", "accumulation"}, report["facts"]["equivalence"]
    assert "did not load" not in report["summary"], report["summary"]
    result = await client.call_tool("diagnose", {"target": target})
    report = result.structured_content
    assert not [f for f in report["findings"] if f["code"].startswith("GP8")], report["findings"]
    entry = next(e for e in report["facts"]["not_run"] if e["check"] == "the equivalence comparisons")
    assert "compare: true" in entry["why"], entry


@pytest.mark.anyio
async def test_diagnose_compares_a_build_model_target(client):
    examples = ROOT / "examples" / "broken"
    target = {"project_dir": str(examples), "model": "gp802_accumulation_not_divided_loss_fn.py"}
    result = await client.call_tool("diagnose", {"target": target, "compare": True})
    report = result.structured_content
    hit = next(f for f in report["findings"] if f["code"] == "GP802")
    assert "4x (k)" in hit["message"] and hit["location"]["line"] == 45, hit
    # without compare, a target whose train_step may accumulate is told the comparison did not run
    report = (await client.call_tool("diagnose", {"target": target})).structured_content
    assert not [f for f in report["findings"] if f["code"].startswith("GP8")], report["findings"]
    entry = next(e for e in report["facts"]["not_run"] if e["check"] == "the equivalence comparisons")
    assert "compare: true" in entry["why"], entry


@pytest.mark.anyio
async def test_diagnose_compare_at_ranks_of_a_build_model_target_says_it_did_not_compare(client):
    """A build_model() target at world_size 2 is diagnosed rank by rank, where the comparisons do not run: with
    compare: true the report says so (the same target at one process gets GP802), never a bare all-clear."""
    target = {"project_dir": str(ROOT / "examples" / "broken"), "model": "gp802_accumulation_not_divided_loss_fn.py",
              "world_size": 2}
    report = (await client.call_tool("diagnose", {"target": target, "compare": True})).structured_content
    entry = next(e for e in report["facts"]["not_run"] if e["check"] == "the equivalence comparisons")
    assert entry["cause"] == "refused" and "check_equivalence" in entry["why"], entry
    assert "Not run: the equivalence comparisons" in report["summary"], report["summary"]


@pytest.mark.anyio
async def test_diagnose_compare_does_not_repeat_its_own_checks(client):
    """compare: true adds the paired comparisons only: custom Functions, shared storage and packed vs padded are
    diagnose's own checks (gradcheck, GP805, check_dependencies), so each finding and verified line comes once."""
    path = ROOT / "examples" / "broken" / "gp401_rmsnorm_backward_drops_weight.py"
    target = {"project_dir": str(path.parent), "model": path.name}
    report = (await client.call_tool("diagnose", {"target": target, "compare": True})).structured_content
    codes = [f["code"] for f in report["findings"]]
    assert codes.count("GP401") == 1 and codes.count("GP405") == 1, codes
    verified = report["facts"]["verified"]
    assert verified and len(verified) == len(set(verified)), verified
    assert set(report["facts"]["equivalence"]) == {"ranks", "accumulation"}, report["facts"]["equivalence"]


def test_batches_join_as_one_batch_or_refuse_with_why():
    """The reference's batch: the parts joined along the batch dimension, per-example lists joined, a token batch padded
    on the right under its attention mask (labels -100), anything else that differs refused with where."""
    import torch

    from gradprobe.checks.equivalence.batches import Unjoinable, join

    a = {"x": torch.ones(2, 3), "y": torch.tensor([0, 1]), "ids": ["a", "b"], "tag": "train"}
    b = {"x": torch.zeros(1, 3), "y": torch.tensor([2]), "ids": ["c"], "tag": "train"}
    joined = join([a, b])
    assert joined["x"].shape == (3, 3) and joined["y"].tolist() == [0, 1, 2] and joined["ids"] == ["a", "b", "c"]
    assert joined["tag"] == "train"
    short = {"input_ids": torch.ones(1, 2, dtype=torch.long), "attention_mask": torch.ones(1, 2, dtype=torch.long),
             "labels": torch.ones(1, 2, dtype=torch.long)}
    long = {k: torch.ones(1, 4, dtype=torch.long) for k in short}
    padded = join([short, long])
    assert padded["labels"][0].tolist() == [1, 1, -100, -100] and padded["attention_mask"][0].tolist() == [1, 1, 0, 0]
    (x1, y1), (x2, y2) = (torch.ones(2, 3), torch.ones(2)), (torch.ones(2, 5), torch.ones(2))
    with pytest.raises(Unjoinable, match=r"batch\[0\].*differ beyond the batch dimension"):
        join([(x1, y1), (x2, y2)])
    with pytest.raises(Unjoinable, match="scalar that differs"):
        join([{"n": torch.tensor(3)}, {"n": torch.tensor(4)}])


def test_a_zero_gradient_is_never_a_scale():
    """A tensor with no gradient where the reference has one is a change of direction (never GP806's by-design
    scale); one factor on every tensor is a named ratio."""
    import torch

    from gradprobe.checks.equivalence.compare import compare_step, named_ratios

    ref = {"tower": torch.ones(3), "scale": torch.ones(1)}
    step = compare_step(1, {"tower": torch.zeros(3), "scale": torch.ones(1)}, ref, 1e-3, named_ratios(2, None))
    assert [r.name for r in step.turned()] == ["tower"] and not step.scale_groups()
    half = compare_step(1, {k: v / 2 for k, v in ref.items()}, ref, 1e-3, named_ratios(2, None))
    assert half.uniform_ratio() == pytest.approx(0.5) and {r.named for r in half.rows} == {"1/N"}
