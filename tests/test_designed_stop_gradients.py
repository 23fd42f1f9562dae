"""Designed stop-gradients are not errors (issue 36, item 7), through the real server: a VQ-VAE whose codebook indices
come from a detached encoding, and a NeRF whose fine samples are drawn from the coarse weights and detached, get
GP317 (info) with what the cut value was used as; the buggy twins (a decoder that reads a detached latent) stay GP316
errors at the detach's line."""

from __future__ import annotations

import pytest

from conftest import EXAMPLES, line_of

NERF = "healthy_nerf_hierarchical_sampling.py"
VQVAE = "healthy_vqvae_indices_from_detached.py"


async def _report(client, project: str, name: str, tool: str = "trace_grad_path") -> dict:
    result = await client.call_tool(tool, {"target": {"project_dir": project, "model": name}})
    assert not result.is_error, result.content
    return result.structured_content


def _codes(report: dict, severity: str | None = None) -> list[str]:
    return [f["code"] for f in report["findings"] if severity is None or f["severity"] == severity]


@pytest.mark.anyio
async def test_vqvae_indices_from_a_detached_encoding_are_not_a_cut_term(client):
    report = await _report(client, str(EXAMPLES), VQVAE)
    assert not _codes(report, "error") and not _codes(report, "warning"), report["findings"]
    assert "GP316" not in _codes(report)
    [f] = [f for f in report["findings"] if f["code"] == "GP317" and "cut_value_used_as" in f["evidence"]]
    assert f["location"]["line"] == line_of(EXAMPLES / VQVAE, "flat = z.reshape(-1, z.shape[-1]).detach()")
    used = f["evidence"]["cut_value_used_as"]
    assert used["how"] == "index" and used["op"] == "argmin"
    assert used["location"]["line"] == line_of(EXAMPLES / VQVAE, "idx = dist.argmin(1)")
    assert "only as indices (`argmin` at line" in f["message"] and "enc.0" in f["message"]
    assert f["evidence"]["term_location"]["code"] == "codebook = F.mse_loss(z_q, z.detach())"
    # the codebook and commitment terms mirror each other: each one's cut is trained through by the other
    split = [g for g in report["findings"] if g["code"] == "GP317" and g is not f]
    assert {g["location"]["code"] for g in split} == {"codebook = F.mse_loss(z_q, z.detach())",
                                                       "commitment = F.mse_loss(z, z_q.detach())"}


@pytest.mark.anyio
async def test_decoder_reading_a_detached_vq_latent_stays_an_error_at_the_detach(client):
    name = "gp316_vqvae_decoder_reads_detached_latent.py"
    report = await _report(client, str(EXAMPLES), name)
    [f] = [f for f in report["findings"] if f["code"] == "GP316"]  # not a second one at the straight-through line
    assert f["severity"] == "error"
    assert f["location"]["line"] == line_of(EXAMPLES / name, "return self.dec(z_q.detach()), vq_loss")
    assert "enc.0.weight" in f["parameters"] and "fed on through dec.0, dec.2" in f["message"]
    assert "cut_value_used_as" not in f["evidence"]


@pytest.mark.anyio
@pytest.mark.parametrize("form", ["samples_detached", "weights_detached"])
async def test_nerf_fine_samples_drawn_from_detached_coarse_weights_are_design(client, tmp_path, form):
    source = (EXAMPLES / NERF).read_text()
    if form == "weights_detached":  # the cut on the coarse weights before sampling, as the issue describes it
        source = source.replace("z_samples = sample_pdf(mids, weights[..., 1:-1], N_FINE)",
                                "z_samples = sample_pdf(mids, weights[..., 1:-1].detach(), N_FINE)")
        source = source.replace("        z_samples = z_samples.detach()\n", "")
    (tmp_path / "nerf.py").write_text(source)
    report = await _report(client, str(tmp_path), "nerf.py")
    assert not _codes(report, "error") and not _codes(report, "warning"), report["findings"]
    [f] = [f for f in report["findings"] if f["code"] == "GP317"]
    assert f["evidence"]["cut_value_used_as"]["how"] == "sample"
    assert f["evidence"]["cut_value_used_as"]["op"] == "searchsorted"
    assert f["evidence"]["term_location"]["code"] == "img_loss = F.mse_loss(rgb_fine, target)"
    cut_line = "z_samples = z_samples.detach()" if form == "samples_detached" else "weights[..., 1:-1].detach()"
    assert cut_line in f["location"]["code"]
    assert {p.split(".")[0] for p in f["parameters"]} == {"coarse"}
    assert "sampled from it" in f["message"]
    # every parameter got its gradient: the coarse network from its own term
    assert all(row["grad"] == "ok" for row in report["facts"]["per_parameter"])


@pytest.mark.anyio
async def test_nerf_under_diagnose_is_clean(client):
    report = await _report(client, str(EXAMPLES), NERF, tool="diagnose")
    assert not _codes(report, "error") and not _codes(report, "warning"), report["findings"]


@pytest.mark.anyio
async def test_vae_detached_latent_is_still_an_error(client):
    report = await _report(client, str(EXAMPLES), "gp316_vae_detached_latent.py")
    [f] = [f for f in report["findings"] if f["code"] == "GP316"]
    assert f["severity"] == "error" and "cut_value_used_as" not in f["evidence"]
