"""Issue 27, items 2, 3 and 7, through the real server: the op that zeroed a gradient (GP318) and whether its zero
stays (a mask selecting nothing) or is a weight ramping up from 0 (info only); the `.item()` line of a value that left
torch (GP304); the layer-decay helper's `return` that gave a group lr 0 (GP205); a freezing rule that matched more than
it names, with its line, its pattern and the counts (GP319).
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from gradprobe.findings import catalogue
from conftest import one_finding as _one, line_of as _line

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "broken"


async def _run(client, tmp_path: Path, tool: str, example: str | None = None, source: str | None = None) -> list[dict]:
    if example is not None:
        shutil.copy(EXAMPLES / example, tmp_path / "case.py")
    else:
        (tmp_path / "case.py").write_text(textwrap.dedent(source or ""))
    result = await client.call_tool(tool, {"target": {"project_dir": str(tmp_path), "model": "case.py"}})
    assert not result.is_error, result.content
    return result.structured_content["findings"]


@pytest.mark.anyio
async def test_a_mask_that_selects_nothing_is_named_with_its_op_and_the_line_that_made_it(client, tmp_path):
    findings = await _run(client, tmp_path, "trace_grad_path", "gp318_padding_mask_selects_nothing.py")
    f = _one(findings, "GP318")
    case = tmp_path / "case.py"
    assert f["severity"] == "warning" and f["parameters"] == ["tok.weight", "tok.bias"]
    assert f["location"]["line"] == _line(case, "mask = (tags == PAD)")  # the cause: the mask's own line
    assert f["evidence"]["op_location"]["line"] == _line(case, "tok = (tok * (1 - mask")
    assert "`1 - mask.reshape(-1)`, which is zero everywhere" in f["message"]
    assert f["evidence"]["kind"] == "mask" and f["evidence"]["shape"] == [28]
    assert not [g for g in findings if g["code"] == "GP306"], findings  # the generic zero-gradient warning is replaced


@pytest.mark.anyio
@pytest.mark.parametrize("tool", ["trace_grad_path", "diagnose"])
async def test_a_loss_weight_ramping_up_from_zero_is_info_only(client, tmp_path, tool):
    findings = await _run(client, tmp_path, tool, "healthy_loss_weight_ramp.py")
    assert not [f for f in findings if f["severity"] in ("error", "warning")], findings
    f = _one(findings, "GP318")
    assert f["severity"] == "info" and f["parameters"] == ["aux.weight", "aux.bias"]
    assert f["evidence"]["raised"][0] == [1, 0.01] and "ramping up from 0" in f["message"]


WEIGHTED = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    CFG = {{"aux_weight": 0.0}}


    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(6, 16)
            self.cls = nn.Linear(16, 3)
            self.aux = nn.Linear(16, 6)

        def forward(self, x):
            h = torch.relu(self.body(x))
            return self.cls(h), self.aux(h)


    def build_model():
        return TwoHeads()


    def make_inputs():
        return torch.randn(8, 6), torch.randint(0, 3, (8,))


    def make_optimizer(model):
        return torch.optim.Adam(model.parameters(), lr=1e-3)


    def train_step(model, batch, optimizer, step=0):
        x, y = batch
        logits, recon = model(x)
        w = {weight}
        loss = F.cross_entropy(logits, y) + w * F.mse_loss(recon, x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss
"""


@pytest.mark.anyio
@pytest.mark.parametrize(("weight", "situation"), [
    ('CFG["aux_weight"] * min(1.0, (step + 1) / 10)', "stays"),  # a schedule over a config weight of 0
    ('CFG["aux_weight"]', "constant"),
])
async def test_a_weight_that_stays_zero_is_a_warning_with_its_own_fix(client, tmp_path, weight, situation):
    f = _one(await _run(client, tmp_path, "trace_grad_path", source=WEIGHTED.format(weight=weight)), "GP318")
    assert f["severity"] == "warning" and f["parameters"] == ["aux.weight", "aux.bias"]
    assert f["location"]["code"].startswith("w = CFG")  # the line that made the zero weight
    doc = catalogue()["GP318"]["situations"]
    other = "scale_constant" if situation == "stays" else "scale_stays"
    assert f["fix"] != doc["scale_ramp"]["fix"] and f["fix"].split("`")[0] != doc[other]["fix"].split("`")[0]


@pytest.mark.anyio
async def test_a_where_whose_condition_selects_nothing(client, tmp_path):
    source = """
        import torch
        import torch.nn as nn


        class Gate(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(4, 4)
                self.b = nn.Linear(4, 4)

            def forward(self, x):
                use_a = x.abs() > 100.0
                return torch.where(use_a, self.a(x), self.b(x)).sum(1)


        def build_model():
            return Gate()


        def make_inputs():
            return torch.randn(8, 4)


        def loss_fn(out, batch):
            return out.pow(2).mean()
    """
    f = _one(await _run(client, tmp_path, "trace_grad_path", source=source), "GP318")
    assert f["parameters"] == ["a.weight", "a.bias"] and f["evidence"]["kind"] == "where"
    assert f["location"]["code"] == "use_a = x.abs() > 100.0" and "`use_a` selects nothing" in f["message"]


@pytest.mark.anyio
async def test_a_value_that_left_torch_is_located_at_the_item_call(client, tmp_path):
    source = """
        import torch
        import torch.nn as nn


        def build_model():
            return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


        def make_inputs():
            return torch.randn(8, 4), torch.randn(8, 1)


        def make_optimizer(model):
            return torch.optim.SGD(model.parameters(), lr=0.1)


        def train_step(model, batch, optimizer):
            x, y = batch
            optimizer.zero_grad()
            err = ((model(x) - y) ** 2).mean().item()
            loss = torch.tensor(err, requires_grad=True)
            loss.backward()
            optimizer.step()
            return loss
    """
    for tool in ("trace_grad_path", "diagnose"):
        f = _one(await _run(client, tmp_path, tool, source=source), "GP304")
        case = tmp_path / "case.py"
        assert f["location"]["line"] == _line(case, ".item()"), (tool, f)
        assert f["evidence"]["came_back_at"]["line"] == _line(case, "torch.tensor(err")
        assert "`.item()` at line" in f["message"] and "zero_grad" not in f["fix"]


@pytest.mark.anyio
async def test_a_layer_decay_helper_that_returns_zero_is_named_at_its_return(client, tmp_path):
    findings = await _run(client, tmp_path, "check_optimizer_coverage", "gp205_decay_function_returns_zero.py")
    f = _one(findings, "GP205")
    case = tmp_path / "case.py"
    assert f["location"]["line"] == _line(case, "        return 0.0") and f["location"]["function"] == "layer_scale"
    assert f["evidence"]["called_at"]["line"] == _line(case, "torch.optim.AdamW(")
    assert "layer_scale()" in f["fix"] and "zero_grad" not in f["fix"]
    stuck = _one(findings, "GP207")
    assert stuck["location"]["line"] == f["location"]["line"] and "zero_grad() before backward" not in stuck["fix"]


@pytest.mark.anyio
async def test_an_overbroad_freezing_rule_is_a_warning_at_its_line_with_counts(client, tmp_path):
    f = _one(await _run(client, tmp_path, "inspect_parameters", "gp319_freeze_pattern_overmatch.py"), "GP319")
    assert f["location"]["line"] == _line(tmp_path / "case.py", '        if "layer" in name')
    assert len(f["evidence"]["whole"]) == 6 and f["evidence"]["partial_modules"] == ["LayerNorm", "Linear"]
    assert "froze 10 tensors: 6 have it as a whole name component" in f["message"]
    assert 'name.startswith("encoder.layer.")' in f["fix"]


@pytest.mark.anyio
async def test_a_freezing_pattern_from_a_config_value_is_read_from_the_frame(client, tmp_path):
    source = (EXAMPLES / "gp319_freeze_pattern_overmatch.py").read_text()
    source = source.replace('if "layer" in name:', "if any(k in name for k in FREEZE):").replace(
        "\nclass Encoder", '\nFREEZE = ["layer"]  # the config\'s freeze patterns\n\n\nclass Encoder')
    f = _one(await _run(client, tmp_path, "inspect_parameters", source=source), "GP319")
    assert f["evidence"]["source"] == "FREEZE" and f["evidence"]["patterns"] == ["layer"]
    assert f["fix"].startswith("Narrow the value of `FREEZE`")


@pytest.mark.anyio
async def test_an_exact_freezing_rule_stays_an_info(client, tmp_path):
    findings = await _run(client, tmp_path, "inspect_parameters", "healthy_freeze_pattern_exact.py")
    assert not [f for f in findings if f["severity"] in ("error", "warning")], findings
    assert _one(findings, "GP105")["severity"] == "info"


@pytest.mark.anyio
async def test_an_overbroad_optimizer_filter_is_named_with_its_line(client, tmp_path):
    source = (EXAMPLES / "healthy_freeze_pattern_exact.py").read_text()
    make_optimizer = ('\ndef make_optimizer(model):\n    params = [p for n, p in model.named_parameters() if "layer" not in n]'
                      "\n    return torch.optim.AdamW(params, lr=1e-3)\n\n")
    source = source.replace('if name.startswith("encoder.layer."):', "if False:").replace(
        "\ndef make_inputs", make_optimizer + "\ndef make_inputs")
    findings = await _run(client, tmp_path, "check_optimizer_coverage", source=source)
    f = _one(findings, "GP319")
    assert f["location"]["line"] == _line(tmp_path / "case.py", '"layer" not in n')
    assert f["parameters"] == ["encoder.layernorm.weight", "encoder.layernorm.bias", "out_layer.weight", "out_layer.bias"]
    assert "left 10 trainable tensors out of the optimizer: 6 have it as a whole name component" in f["message"]
    assert 'not n.startswith("encoder.layer.")' in f["fix"]
    assert _one(findings, "GP201")["severity"] == "error"  # the missing parameters themselves stay GP201's


STOCHASTIC_DEPTH = """
    import torch
    import torch.nn as nn


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(4, 4)
            self.branch = nn.Linear(4, 4)

        def forward(self, x):
            keep = 0.5  # stochastic depth (SegFormer's DropPath): floor(keep + rand) per sample; the seed drops both
            mask = (keep + torch.rand(x.shape[0], 1, generator=torch.Generator().manual_seed(3))).floor_()
            return self.body(x) + self.branch(x).div(keep) * mask


    def build_model():
        return Block()


    def make_inputs():
        return torch.randn(2, 4)


    def loss_fn(out, batch):
        return out.pow(2).mean()
"""


@pytest.mark.anyio
async def test_a_random_drop_mask_that_dropped_every_sample_is_gp318_info(client, tmp_path):
    """Found by the ecosystem sweep (segmentation/segformer): stochastic depth dropped one block for both samples of the
    batch at that step, so its parameters got an exactly-zero gradient. A mask drawn at random is by design: at most
    info (and no GP306 warning either)."""
    findings = await _run(client, tmp_path, "trace_grad_path", source=STOCHASTIC_DEPTH)
    assert not [f for f in findings if f["severity"] != "info"], findings
    gp318 = [f for f in findings if f["code"] == "GP318"]
    assert gp318 and "random draw" in gp318[0]["message"], findings
