"""A loss_fn that returns its terms as a dict, a tuple or a list, through the real server: gradprobe takes the total as
the trainer would (the `loss` entry; else the entries whose key contains `loss`; else every entry), each entry is a
named term of facts.loss_terms, and GP315/GP316 name the entry's key or index and its line."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from conftest import EXAMPLES

BUGGY = "gp316_vae_loss_dict_detached_latent.py"


async def _run(client, tool: str, project: Path, model: str) -> dict:
    result = await client.call_tool(tool, {"target": {"project_dir": str(project), "model": model}})
    assert not result.is_error, result.content
    return result.structured_content


def _named(report: dict) -> list[dict]:
    [split] = report["facts"]["loss_terms"]
    return split["terms"]


@pytest.mark.anyio
@pytest.mark.parametrize("tool", ["trace_grad_path", "diagnose"])
async def test_dict_entry_cut_from_the_encoder_is_named_by_its_key(client, tool):
    report = await _run(client, tool, EXAMPLES, BUGGY)
    [f] = [f for f in report["findings"] if f["code"] == "GP316"]
    assert f["severity"] == "error" and f["location"]["code"] == "return self.decoder(z.detach()), mu, logvar"
    assert f["evidence"]["term_name"] == "recon" and f["evidence"]["term_location"]["code"] == "recon = F.mse_loss(x_hat, x)"
    assert "entry `recon`" in f["message"] and "other entry `kl`" in f["message"]
    assert "encoder.0.weight" in f["parameters"] and not any(p.startswith("decoder") for p in f["parameters"])
    recon, kl = _named(report)
    assert (recon["name"], kl["name"]) == ("recon", "kl")
    assert set(recon["reaches"]) == {"decoder.0", "decoder.2"} and "encoder.0" in kl["reaches"]
    assert report["facts"]["loss_returned"]["summed"] == ["recon", "kl"]


@pytest.mark.anyio
async def test_healthy_dict_twin_is_clean_and_shares_the_encoder(client):  # diagnose: tests/test_examples.py
    report = await _run(client, "trace_grad_path", EXAMPLES, "healthy_vae_loss_dict.py")
    assert report["ok"] is True, report["findings"]
    recon, kl = _named(report)
    assert (recon["name"], kl["name"]) == ("recon", "kl") and kl["location"]["code"].startswith("return {")
    shares = recon["share_of_grad_norm"]["encoder.0"], kl["share_of_grad_norm"]["encoder.0"]
    assert all(0 < s < 1 for s in shares) and abs(sum(shares) - 1) < 0.01, shares


CUT_ENTRIES = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Linear(6, 8)
            self.head = nn.Linear(8, 3)
            self.decoder = nn.Linear(8, 6)

        def forward(self, x):
            h = torch.tanh(self.encoder(x))
            return self.head(h), self.decoder(h)


    def build_model():
        return Net()


    def make_inputs():
        return torch.randn(8, 6)


    def loss_fn(out, x):
        logits, x_hat = out
        ce = F.cross_entropy(logits, torch.zeros(8, dtype=torch.long))
        recon = F.mse_loss(x_hat, x).item()
        return {RETURNED}
"""


def _write(tmp_path: Path, returned: str) -> Path:
    (tmp_path / "case.py").write_text(textwrap.dedent(CUT_ENTRIES).replace("{RETURNED}", returned))
    return tmp_path


@pytest.mark.anyio
async def test_dict_entry_cut_by_item_is_gp315_with_its_key_and_odd_entries_are_noted(client, tmp_path):
    project = _write(tmp_path, '{"ce": ce, "recon": recon, "per_sample": logits.sum(1), "note": None}')
    report = await _run(client, "trace_grad_path", project, "case.py")
    [f] = [f for f in report["findings"] if f["code"] == "GP315"]
    assert f["severity"] == "error" and f["location"]["code"] == "recon = F.mse_loss(x_hat, x).item()"
    assert f["evidence"]["term_name"] == "recon" and "entry `recon`" in f["message"]
    assert "decoder.weight" in f["parameters"]
    assert [t.get("name") for t in _named(report)] == ["ce", "recon"]
    returned = report["facts"]["loss_returned"]
    assert returned["summed"] == ["ce"]
    why = {e["entry"]: e["why"] for e in returned["left_out"]}
    assert set(why) == {"recon", "per_sample", "note"} and "shape [8]" in why["per_sample"], why
    assert not [g for g in report["findings"] if g["code"] == "GP100"], report["findings"]  # never the user's error


@pytest.mark.anyio
@pytest.mark.parametrize("returned, rule", [
    ('{"loss": ce, "recon": recon, "ce": ce.detach()}', "the `loss` entry is the total"),  # Lightning: the rest is logged
    ('{"loss_ce": ce, "acc": ce.detach(), "recon_err": recon}', "whose key contains `loss`"),  # mmengine's parse_losses
    ("ce, (logits.argmax(1) == 0).float().mean(), ce.item()", "sum of the scalar tensor entries"),  # a metric, a copy
])
async def test_logged_entries_beside_the_total_are_no_terms(client, tmp_path, returned, rule):
    report = await _run(client, "trace_grad_path", _write(tmp_path, returned), "case.py")
    assert not [f for f in report["findings"] if f["code"] in ("GP315", "GP316")], report["findings"]
    assert rule in report["facts"]["loss_returned"]["rule"]


@pytest.mark.anyio
async def test_tuple_entries_are_named_by_index(client, tmp_path):
    shutil.copy(EXAMPLES / BUGGY, tmp_path / "case.py")
    case = tmp_path / "case.py"
    case.write_text(case.read_text().replace('return {"recon": recon, "kl": 0.1 * kl}', "return recon, 0.1 * kl"))
    report = await _run(client, "trace_grad_path", tmp_path, "case.py")
    [f] = [f for f in report["findings"] if f["code"] == "GP316"]
    assert f["evidence"]["term_name"] == 0 and "entry 0" in f["message"] and "other entry 1" in f["message"]
    assert [t["name"] for t in _named(report)] == [0, 1]
    assert report["facts"]["loss_returned"]["form"] == "tuple"
