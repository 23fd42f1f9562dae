"""GP708 through the real server: fp32 parameters whose gradient underflows under fp16 autocast with no GradScaler,
measured against an fp32 rerun of the same step (the train_step form, and autocast inside the model's forward);
healthy autocast setups of other families (a tiny GPT-2 in bf16, a tiny BERT in fp16 with a GradScaler) stay clean.
The examples' healthy twins (healthy_fp16_autocast_grad_scaler.py, healthy_bf16_autocast.py) run in test_examples."""

from __future__ import annotations

import pytest

from conftest import EXAMPLES, ROOT

BENCH = ROOT / "benchmarks"

_FORWARD_FP16 = '''
import torch.nn.functional as F
class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder, self.decoder = nn.Linear(1024, 64), nn.Linear(64, 1024)
    def forward(self, noisy):
        with torch.autocast("cpu", dtype=torch.float16):
            return self.decoder(torch.tanh(self.encoder(noisy))).float()
torch.manual_seed(0)
model = Denoiser()
nn.init.normal_(model.decoder.weight, std=1e-3)
clean = torch.randn(32, 1024) * 1e-2
inputs = {"noisy": clean + 1e-3 * torch.randn(32, 1024), "clean": clean}
loss_fn = lambda out, batch: F.mse_loss(out, batch["clean"])
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
'''

_HEALTHY = '''
from sweep_models import build
model, inputs, loss_fn, make_opt = build({spec!r})
optimizer = make_opt(model)
scaler = torch.amp.GradScaler("cpu", enabled={scaled})
def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.{dtype}):
        loss = loss_fn(model(**batch), batch)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss
'''


async def _diagnose(client, target: dict) -> dict:
    result = await client.call_tool("diagnose", {"target": target})
    assert not result.is_error, result.content
    return result.structured_content


@pytest.mark.anyio
async def test_fp16_autocast_without_scaler_names_the_underflow_and_the_autocast_line(client):
    name = "gp708_fp16_autocast_no_scaler.py"
    report = await _diagnose(client, {"project_dir": str(EXAMPLES), "model": name})
    found = [f for f in report["findings"] if f["code"] == "GP708"]
    assert len(found) == 1 and found[0]["parameters"] == ["encoder.weight"], report["findings"]
    line = next(i for i, s in enumerate((EXAMPLES / name).read_text().splitlines(), 1) if "torch.autocast(" in s)
    assert found[0]["location"]["line"] == line and f"{name}:{line}" in found[0]["fix"], found[0]
    facts = report["facts"]["autocast"]
    rows = {r["name"]: r for r in facts["worst"]}
    assert facts["dtype"] == "float16" and not facts["grad_scaler"], facts
    assert rows["encoder.weight"]["underflow"] == 1.0 and rows["decoder.bias"]["underflow"] < 0.5, rows


@pytest.mark.anyio
async def test_fp16_autocast_inside_the_forward_is_measured_in_the_default_step(client):
    report = await _diagnose(client, {"project_dir": str(EXAMPLES), "setup": _FORWARD_FP16})
    found = [f for f in report["findings"] if f["code"] == "GP708"]
    assert found and "encoder.weight" in found[0]["parameters"], report["findings"]
    assert found[0]["location"]["function"] == "forward", found[0]


@pytest.mark.anyio
@pytest.mark.parametrize("spec,dtype,scaled", [
    ({"family": "transformers", "task": "causal_lm", "model_type": "gpt2", "cls": "GPT2LMHeadModel"}, "bfloat16", False),
    ({"family": "transformers", "task": "seq_cls", "model_type": "bert", "cls": "BertForSequenceClassification"},
     "float16", True),
], ids=["gpt2-bf16", "bert-fp16-scaler"])
async def test_healthy_autocast_models_stay_clean(client, spec, dtype, scaled):
    setup = _HEALTHY.format(spec=spec, dtype=dtype, scaled=scaled)
    report = await _diagnose(client, {"project_dir": str(BENCH), "setup": setup})
    loud = [(f["code"], f["message"][:200]) for f in report["findings"] if f["severity"] in ("error", "warning")]
    assert not loud, loud
    facts = report["facts"]["autocast"]
    assert facts["dtype"] == dtype and facts["grad_scaler"] is scaled, facts
    if not scaled:  # bf16 has fp32's exponent range: measured, and nothing near the threshold
        assert facts["measured"] and max(r["underflow"] for r in facts["worst"]) < facts["underflow_threshold"], facts


_SCRIPT_STEP_INSIDE_AUTOCAST = '''
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 64), nn.Tanh(), nn.Linear(64, 1024))
nn.init.normal_(model[2].weight, std=1e-3)
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("cpu", enabled={scaled})
for step in range(3):
    clean = torch.randn(32, 1024) * 1e-2
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.mse_loss(model(clean + 1e-3 * torch.randn(32, 1024)).float(), clean)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
'''


@pytest.mark.anyio
@pytest.mark.parametrize("scaled", [True, False])
async def test_script_whose_step_runs_inside_its_autocast(client, tmp_path, scaled):
    """A script target's step is checked inside the script's own autocast block, after its GradScaler ran: the script's
    watch saw the autocast (its line) and the scale() call as the script ran, so the scaled script stays clean and the
    same loop with the scaler disabled is reported at its `with torch.autocast` line."""
    (tmp_path / "train.py").write_text(_SCRIPT_STEP_INSIDE_AUTOCAST.format(scaled=scaled))
    report = await _diagnose(client, {"project_dir": str(tmp_path), "script": "train.py"})
    facts = report["facts"]["autocast"]
    hits = [f for f in report["findings"] if f["code"] == "GP708"]
    assert facts["grad_scaler"] is scaled and facts["autocast_line"]["line"] == 11, facts
    if scaled:
        assert not hits and "GradScaler scaled" in facts["skipped"], (report["findings"], facts)
    else:
        assert [(f["parameters"], f["location"]["line"]) for f in hits] == [(["0.weight"], 11)], report["findings"]


_SCRIPT_FORWARD_AUTOCAST = '''
import torch, torch.nn as nn, torch.nn.functional as F
class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder, self.decoder = nn.Linear(1024, 64), nn.Linear(64, 1024)
    def forward(self, noisy):
        with torch.autocast("cpu", dtype=torch.float16):
            return self.decoder(torch.tanh(self.encoder(noisy))).float()
torch.manual_seed(0)
model = Denoiser()
nn.init.normal_(model.decoder.weight, std=1e-3)
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
for _ in range(3):
    clean = torch.randn(32, 1024) * 1e-2
    loss = F.mse_loss(model(clean + 1e-3 * torch.randn(32, 1024)), clean)
    opt.zero_grad(); loss.backward(); opt.step()
'''


@pytest.mark.anyio
async def test_script_whose_model_enters_autocast_in_its_forward(client, tmp_path):
    """The autocast is entered inside the model's forward, not around the script's call: still seen, at its line."""
    (tmp_path / "train.py").write_text(_SCRIPT_FORWARD_AUTOCAST)
    report = await _diagnose(client, {"project_dir": str(tmp_path), "script": "train.py"})
    hits = [(f["parameters"], f["location"]["line"]) for f in report["findings"] if f["code"] == "GP708"]
    assert hits == [(["encoder.weight"], 8)], report["findings"]
    assert report["facts"]["autocast"]["replayed_with"] == "the output gradients of the script's own backward"
