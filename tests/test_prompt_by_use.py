"""A soft prompt is recognised by what the step does with it, never by its name (issue 27, item 6), and
zero-initialised adapters and gates get at most an info at the first step. Through the real server."""

from __future__ import annotations

import pytest

from conftest import EXAMPLES


async def _call(client, tool: str, model: str) -> dict:
    result = await client.call_tool(tool, {"target": {"project_dir": str(EXAMPLES), "model": model, "device": "cpu"}})
    assert not result.is_error, result.content
    return result.structured_content


ZERO_INIT = [("healthy_peft_lora_gpt2.py", "lora_A"), ("healthy_zero_gated_prompt.py", "ctx"),
             ("healthy_peft_adaption_prompt_llama.py", "adaption_prompt")]


@pytest.mark.anyio
@pytest.mark.parametrize("model,zero", ZERO_INIT, ids=[m for m, _ in ZERO_INIT])
async def test_zero_initialised_partners_get_at_most_info_at_the_first_step(client, model, zero):
    """LoRA's B = 0 and zero-initialised gates leave their partner an exactly-zero gradient at the first step: by design."""
    for tool in ("diagnose", "verify_prompt_tuning"):
        report = await _call(client, tool, model)
        louder = [(f["code"], f["severity"], f["parameters"][:3]) for f in report["findings"] if f["severity"] != "info"]
        assert not louder, (model, tool, louder)
        if tool == "diagnose":  # really exercised: the zero gradient was measured and explained
            hits = [f for f in report["findings"] if f["code"] == "GP306" and any(zero in p for p in f["parameters"])]
            assert hits and hits[0]["evidence"], (model, [(f["code"], f["parameters"][:3]) for f in report["findings"]])


@pytest.mark.anyio
async def test_a_prompt_not_named_like_one_is_found_by_what_the_code_does(client):
    report = await _call(client, "verify_prompt_tuning", "gp501_context_vectors_detached.py")
    assert [r["name"] for r in report["facts"]["prompt"]] == ["ctx"]
    assert "placed into the token sequence" in report["facts"]["prompt_rule"]
    assert any(f["code"] == "GP501" and f["parameters"] == ["ctx"] for f in report["findings"])


@pytest.mark.anyio
async def test_a_projector_norm_named_soft_emb_is_no_prompt(client):
    """Gemma-3's multimodal projector norm `mm_soft_emb_norm`, idle on a text-only batch: no prompt, no GP5xx."""
    for tool in ("diagnose", "verify_prompt_tuning"):
        report = await _call(client, tool, "healthy_gemma3_projector_norm.py")
        gp5 = [(f["code"], f["parameters"][:2]) for f in report["findings"] if f["code"].startswith("GP5")]
        assert not gp5, (tool, gp5)
        assert not [f for f in report["findings"] if f["severity"] == "error"], tool
    assert "No soft prompt found" in str(report["summary"])


@pytest.mark.anyio
async def test_learned_keys_handed_to_the_base_as_its_cache_are_a_prefix(client):
    """Prefix tuning by hand: learned keys/values passed as past_key_values are the prompt, and the cache is no GP509."""
    report = await _call(client, "verify_prompt_tuning", "healthy_prefix_cache_gpt2.py")
    assert [r["name"] for r in report["facts"]["prompt"]] == ["memory"]
    assert report["facts"]["alignment"]["note"].startswith("prefix tuning")
    assert not [f for f in report["findings"] if f["severity"] != "info"], report["findings"]
