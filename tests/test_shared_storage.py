"""Distinct Parameters over one storage (GP805, issue 37 item 5), through the real server: found by storage identity at
the line that made the second Parameter, the step measured against one tied Parameter; a real tie, views that do not
overlap and a frozen copy are not errors. The examples (gp805_tie_with_data.py and its twins) run in test_examples.py."""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn as nn

from conftest import EXAMPLES, ROOT, line_of, one_finding

TIE = EXAMPLES / "gp805_tie_with_data.py"


async def _call(client, tool: str, target: dict, **options) -> dict:
    result = await client.call_tool(tool, {"target": target, **options})
    assert not result.is_error, result.content
    return result.structured_content


def _model(tmp_path, body: str, optimizer: str = "torch.optim.Adam(model.parameters(), lr=1e-2)") -> dict:
    (tmp_path / "model.py").write_text(textwrap.dedent('''\
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        ''') + textwrap.dedent(body) + textwrap.dedent(f'''

        def make_optimizer(model):
            return {optimizer}
        '''))
    return {"project_dir": str(tmp_path), "model": "model.py"}


@pytest.mark.anyio
async def test_a_data_tie_is_found_by_every_tool_at_its_line(client):
    """inspect_parameters (no step), check_optimizer_coverage and diagnose (one step, measured): GP805 at the `.data`
    line, naming both Parameters; with Adam the storage moves about twice what one tied Parameter moves."""
    target = {"project_dir": str(EXAMPLES), "model": TIE.name}
    line = line_of(TIE, "self.decoder.weight.data = self.encoder.weight.data.t()")
    static = one_finding((await _call(client, "inspect_parameters", target))["findings"], "GP805")
    assert static["severity"] == "error" and static["location"]["line"] == line
    assert set(static["parameters"]) == {"encoder.weight", "decoder.weight"}
    assert "updates the storage twice" in static["message"] and "transpose" in static["message"]
    for tool in ("check_optimizer_coverage", "diagnose"):
        report = await _call(client, tool, target)
        f = one_finding(report["findings"], "GP805")
        assert f["severity"] == "error" and f["location"]["line"] == line, (tool, f)
        step = f["evidence"]["step"]
        assert 1.5 < step["ratio"] < 2.1 and step["tie_moved"] > 0, (tool, step)  # Adam: sign-like steps, one per leaf
        assert set(step["parts"]) == {"encoder.weight", "decoder.weight"} and all(v > 0 for v in step["parts"].values())
        assert f"{step['ratio']:.3g}x" in f["message"]
        ptrs = {(p["storage_offset"], tuple(p["stride"])) for p in f["evidence"]["parameters"]}
        assert ptrs == {(0, (12, 1)), (0, (1, 12))}, ptrs  # the transpose of the same elements


@pytest.mark.anyio
async def test_a_parameter_over_data_with_sgd_is_a_warning_with_the_equal_step_measured(client, tmp_path):
    """`head.weight = nn.Parameter(embed.weight.data)` under plain SGD with momentum: the step equals one tied
    Parameter's (SGD is linear in the gradient), measured (ratio 1, cosine 1): a warning, not an error."""
    target = _model(tmp_path, '''
        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(20, 8)
                self.head = nn.Linear(8, 20, bias=False)
                self.head.weight = nn.Parameter(self.embed.weight.data)

            def forward(self, ids):
                return self.head(torch.tanh(self.embed(ids)))

        def build_model():
            return LM()

        def make_inputs():
            return torch.randint(0, 20, (3, 5))
        ''', "torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)")
    f = one_finding((await _call(client, "check_optimizer_coverage", target))["findings"], "GP805")
    assert f["severity"] == "warning", f
    assert abs(f["evidence"]["step"]["ratio"] - 1) < 1e-6 and f["evidence"]["step"]["cosine"] > 0.999999
    assert f["location"]["line"] == line_of(tmp_path / "model.py", "nn.Parameter(self.embed.weight.data)")


@pytest.mark.anyio
async def test_views_that_do_not_overlap_and_a_real_tie_are_clean(client, tmp_path):
    """One flat buffer carved into two Parameters (as FSDP's flat parameter with use_orig_params) shares a storage but
    no element; interleaved column views share none either; a tie of one Parameter is GP108 only."""
    target = _model(tmp_path, '''
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                flat = torch.randn(8 * 4 + 4)
                self.w = nn.Parameter(flat[:32].view(8, 4))
                self.b = nn.Parameter(flat[32:])
                grid = torch.randn(4, 6)
                self.even = nn.Parameter(grid[:, ::2])
                self.odd = nn.Parameter(grid[:, 1::2])
                self.out = nn.Linear(4, 2)
                self.out2 = nn.Linear(4, 2)
                self.out2.weight = self.out.weight

            def forward(self, x):
                side = (x[:, :4] @ self.even).sum(-1, keepdim=True) + (x[:, :4] @ self.odd).sum(-1, keepdim=True)
                h = x @ self.w + self.b + side
                return self.out(h) + self.out2(h)

        def build_model():
            return M()

        def make_inputs():
            return torch.randn(5, 8)
        ''')
    for tool in ("inspect_parameters", "check_optimizer_coverage", "diagnose"):
        report = await _call(client, tool, target)
        assert not [f for f in report["findings"] if f["code"] == "GP805"], (tool, report["findings"])
        assert any("no two overlap" in v for v in report["facts"]["verified"]), (tool, report["facts"].get("verified"))
    assert one_finding((await _call(client, "inspect_parameters", target))["findings"], "GP108")


@pytest.mark.anyio
async def test_overlapping_strided_views_are_counted_by_element(client, tmp_path):
    """Two strided views of one matrix that share some columns: found, with the shared elements counted."""
    target = _model(tmp_path, '''
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                grid = torch.randn(4, 6)
                self.every_other = nn.Parameter(grid[:, ::2])
                self.third_col = nn.Parameter(grid[:, 2:3])

            def forward(self, x):
                return (x @ self.every_other).sum(-1) + (x @ self.third_col).sum(-1)

        def build_model():
            return M()

        def make_inputs():
            return torch.randn(5, 4)
        ''')
    f = one_finding((await _call(client, "inspect_parameters", target))["findings"], "GP805")
    assert f["evidence"]["shared_elements"] == 4 and "4 shared elements" in f["message"]


@pytest.mark.anyio
async def test_meta_device_inspection_skips_storage(client):
    """device="meta": no storage to compare; inspected without an error, the parameters counted as skipped."""
    report = await _call(client, "inspect_parameters", {"project_dir": str(EXAMPLES), "model": TIE.name, "device": "meta"})
    assert not [f for f in report["findings"] if f["code"] == "GP805"]
    assert report["facts"]["shared_storage"]["checked"] == 0 and report["facts"]["shared_storage"]["skipped"]


@pytest.mark.anyio
@pytest.mark.parametrize("project, expect", [("shared_storage_broken", "error"), ("shared_storage", None),
                                             ("shared_storage_lightning_broken", "error")])
async def test_script_mode(client, project, expect):
    """The user's own training script (a plain loop; a Lightning Trainer), stopped at its first optimizer step."""
    if "lightning" in project:
        pytest.importorskip("lightning")
    folder = ROOT / "examples" / "scripts" / project
    report = await _call(client, "diagnose", {"project_dir": str(folder), "script": "train.py", "timeout_s": 240})
    hits = [f for f in report["findings"] if f["code"] == "GP805"]
    if expect is None:
        assert not hits and report["ok"], report["findings"]
        return
    assert len(hits) == 1 and hits[0]["severity"] == expect, report["findings"]
    assert hits[0]["location"]["file"].endswith("train.py")
    assert ".data" in hits[0]["location"]["code"]
    assert hits[0]["evidence"]["step"]["ratio"] > 1.2, hits[0]["evidence"]["step"]


def test_storage_run_contract():
    """The comparison module's `run` (what check_equivalence calls): applies, findings, verified, not_run, facts."""
    from gradprobe.checks.registration import shared_storage as storage
    from gradprobe.loading import load_target

    loaded = load_target({"project_dir": str(EXAMPLES), "model": TIE.name})
    out = storage.run(loaded, {})
    assert set(out) == {"applies", "why_not", "findings", "verified", "not_run", "facts"}
    assert out["applies"] and [f["code"] for f in out["findings"]] == ["GP805"]
    assert out["findings"][0]["evidence"]["step"]["ratio"] > 1.5 and out["not_run"] == []
    assert "1 group(s) overlap" in out["verified"][0]

    plain = nn.Sequential(nn.Linear(3, 3))
    facts = storage.measure_storage(plain, torch.optim.SGD(plain.parameters(), lr=0.1))
    assert facts.groups == [] and facts.checked == 2
