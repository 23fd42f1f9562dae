"""Overfit one batch per loss term, through the real server: each term's trend in the facts, a term that does not go
down while the tensors it reaches never move (GP616 term_stuck, its line and those tensors), a term that stays exactly
the same while everything it reaches moves (info), and a healthy two-term setup left clean."""

from __future__ import annotations

import pytest

from conftest import EXAMPLES


async def audit(client, project_dir, name: str, overfit: int = 12) -> dict:
    result = await client.call_tool("audit_training", {"target": {"project_dir": str(project_dir), "model": name},
                                                       "steps": 2, "overfit_steps": overfit})
    assert not result.is_error, result.content
    return result.structured_content


@pytest.mark.anyio
async def test_a_term_whose_head_never_moves_is_named_and_the_healthy_twin_is_clean(client):
    report = await audit(client, EXAMPLES, "gp616_aux_term_head_not_in_optimizer.py")
    (f,) = [f for f in report["findings"] if f["code"] == "GP616"]
    assert f["severity"] == "error" and sorted(f["parameters"]) == ["aux.bias", "aux.weight"]
    assert f["location"]["line"] == 43 and "the loss went down" in f["message"] and "2 did not move" in f["message"]
    assert "put aux.bias, aux.weight in the optimizer" in f["fix"] and len(f["evidence"]["term_per_step"]) == 12
    terms = report["facts"]["overfit_one_batch"]["terms"]
    side = next(v for k, v in terms.items() if k.startswith("term 1"))
    assert side["reaches"] == 2 and side["reached_not_moved"] == ["aux.bias", "aux.weight"]
    assert terms["loss"]["trend"] == "down" and set(side) >= {"first", "last", "slope_t", "trend", "location"}
    healthy = await audit(client, EXAMPLES, "healthy_steps_overfit_aux_term.py")
    assert healthy["ok"] and not healthy["findings"], healthy["findings"]
    trends = {k: v["trend"] for k, v in healthy["facts"]["overfit_one_batch"]["terms"].items()}
    assert len(trends) == 3 and set(trends.values()) == {"down"}, trends
    rows = healthy["facts"]["overfit_one_batch"]["terms"]  # each term with its weight: the terms add up to the loss
    assert abs(sum(v["first"] for k, v in rows.items() if k != "loss") - rows["loss"]["first"]) < 1e-4


@pytest.mark.anyio
async def test_loss_fn_entries_a_self_target_term_is_info_and_a_rising_trained_term_is_not_flagged(client, tmp_path):
    (tmp_path / "model.py").write_text(
        "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
        "def build_model():\n    torch.manual_seed(0)\n    return nn.Linear(4, 2)\n\n"
        "def make_inputs():\n    g = torch.Generator().manual_seed(1)\n"
        "    return {'input': torch.randn(8, 4, generator=g), 'y': torch.randn(8, 2, generator=g)}\n\n"
        "def make_optimizer(model):\n    return torch.optim.SGD(model.parameters(), lr=0.1)\n\n"
        "def loss_fn(out, batch):\n"
        "    fit = F.mse_loss(out, batch['y'])\n"
        "    grow = 1e-3 * out.square().mean()\n"  # trained, rises as the fit moves the outputs
        "    same = F.mse_loss(out, out.detach())\n"  # compared with itself: always 0
        "    return {'fit': fit, 'grow': grow, 'same': same}\n")
    report = await audit(client, tmp_path, "model.py")
    table = report["facts"]["overfit_one_batch"]["terms"]
    assert set(table) == {"loss", "fit", "grow", "same"} and table["same"]["trend"] == "flat"
    assert table["grow"]["trend"] == "up" and table["grow"]["reached_not_moved"] == []
    (f,) = [f for f in report["findings"] if f["code"] == "GP616"]
    assert f["severity"] == "info" and "same" in f["message"] and "no gradient" in f["message"]
    assert f["location"]["line"] == 19 and "out.detach()" in f["fix"]


def test_the_cli_table_has_one_row_per_term():
    from gradprobe.stepchart import overfit_table

    text = overfit_table({"loss": {"first": 1.5, "last": 1.0, "slope_t": -9.1, "trend": "down"},
                          "term 1 (m.py:4)": {"first": 0.2, "last": 0.2, "slope_t": 0.0, "trend": "flat", "reaches": 2,
                                              "reached_not_moved": ["aux.bias", "aux.weight"]}})
    head, total, term = text.splitlines()
    assert head.split() == ["term", "first", "last", "slope", "t", "trend", "not", "moved"]
    assert total.split() == ["loss", "1.5", "1", "-9.1", "down", "-"]
    assert term.split()[-4:] == ["flat", "2", "of", "2"] and term.strip().startswith("term 1 (m.py:4)")
