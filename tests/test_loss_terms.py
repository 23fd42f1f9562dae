"""Per-loss-term attribution through the real server: the report's facts.loss_terms table says which term reaches which
module and its share of their gradient norm, also when nothing is wrong; a cut term's finding names the term's line and
the cut's line."""

from __future__ import annotations

import pytest

from conftest import EXAMPLES


async def _trace(client, name: str) -> dict:
    result = await client.call_tool("trace_grad_path", {"target": {"project_dir": str(EXAMPLES), "model": name}})
    assert not result.is_error, result.content
    return result.structured_content


@pytest.mark.anyio
async def test_healthy_vae_table_shows_both_terms_sharing_the_encoder(client):
    report = await _trace(client, "healthy_vae_both_terms.py")
    assert report["ok"] is True, report["findings"]
    [split] = report["facts"]["loss_terms"]
    assert split["loss_location"]["code"] == "return recon + 0.1 * kl"
    recon, kl = split["terms"]
    assert recon["location"]["code"].startswith("recon = ") and kl["location"]["code"].startswith("kl = ")
    assert {"decoder.0", "decoder.2", "encoder.0", "mu", "logvar"} <= set(recon["reaches"])
    assert set(kl["reaches"]) == {"encoder.0", "mu", "logvar"}
    assert recon["share_of_grad_norm"]["decoder.0"] == 1.0
    for module in ("encoder.0", "mu", "logvar"):  # both terms train these: the shares add up to one
        shares = recon["share_of_grad_norm"][module], kl["share_of_grad_norm"][module]
        assert all(0 < s < 1 for s in shares) and abs(sum(shares) - 1) < 0.01, (module, shares)


@pytest.mark.anyio
async def test_detached_latent_names_the_term_and_the_cut(client):
    report = await _trace(client, "gp316_vae_detached_latent.py")
    [f] = [f for f in report["findings"] if f["code"] == "GP316"]
    assert f["severity"] == "error" and f["location"]["line"] == 27
    assert f["evidence"]["term_location"]["code"] == "recon = F.mse_loss(x_hat, x)"
    assert "encoder.0.weight" in f["parameters"] and not any(p.startswith("decoder") for p in f["parameters"])
    recon, kl = f["evidence"]["loss_terms"]
    assert set(recon["reaches"]) == {"decoder.0", "decoder.2"} and "encoder.0" in kl["reaches"]
    # every parameter got a gradient (the KL reaches the encoder): no cut finding of the GP30x family
    assert all(row["grad"] == "ok" for row in report["facts"]["per_parameter"])


@pytest.mark.anyio
async def test_item_term_names_its_line_and_explains_the_decoder(client):
    report = await _trace(client, "gp315_item_term_in_loss.py")
    codes = [f["code"] for f in report["findings"]]
    [f] = [f for f in report["findings"] if f["code"] == "GP315"]
    assert f["location"]["code"].endswith(".item()") and f["evidence"]["added_at"]["code"] == "loss = ce + recon"
    assert "GP301" not in codes, report["findings"]  # not "nothing cut their path": the .item() did
