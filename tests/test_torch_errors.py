"""torch's own errors in the user's step (GP118, GP119), through the real server: the finding states what torch does not
(the parameter, the reused tensor, the lines), measured by identity in the traced step."""

from __future__ import annotations

import pytest

from conftest import EXAMPLES


async def _trace(client, name: str) -> list[dict]:
    result = await client.call_tool("trace_grad_path", {"target": {"project_dir": str(EXAMPLES), "model": name}})
    assert not result.is_error, result.content
    return result.structured_content["findings"]


@pytest.mark.anyio
async def test_leaf_clamped_after_backward_names_the_parameter_and_the_no_grad_form(client):
    findings = await _trace(client, "gp118_wgan_clip_outside_no_grad.py")
    [f] = [f for f in findings if f["code"] == "GP118"]
    assert f["parameters"] == ["0.weight"] and f["evidence"]["shape"] == [8, 4] and f["evidence"]["after_backward"]
    assert f["location"]["line"] == 36 and "p.clamp_(-0.01, 0.01)" in f["message"]
    assert "with torch.no_grad(): p.clamp_(-0.01, 0.01)" in f["fix"]
    assert not [g for g in findings if g["code"] in ("GP100", "GP308")]


@pytest.mark.anyio
async def test_hidden_state_carried_across_chunks_is_named_with_its_line(client):
    findings = await _trace(client, "gp119_hidden_state_not_detached.py")
    [f] = [f for f in findings if f["code"] == "GP119"]
    assert f["location"]["line"] == 25 and "`tanh`" in f["message"] and "carried into the next iteration" in f["message"]
    [reused] = [r for r in f["evidence"]["reused"] if r["carried"]]
    assert reused["shape"] == [4, 8] and reused["made_at"]["line"] == 25
    assert "h.detach()" in f["fix"] and not [g for g in findings if g["code"] == "GP308"]


@pytest.mark.anyio
async def test_gan_fakes_not_detached_point_at_the_discriminator_loss(client):
    findings = await _trace(client, "gp119_gan_fake_not_detached.py")
    [f] = [f for f in findings if f["code"] == "GP119"]
    reused = f["evidence"]["reused"][0]
    assert (reused["made_at"]["line"], reused["earlier_use_at"]["line"], reused["used_at"]["line"]) == (38, 41, 46)
    assert f["evidence"]["earlier_backward_at"]["line"] == 43 and f["evidence"]["backward_called_at"]["line"] == 47
    assert "carried" not in f["message"] and "fake.detach()" in f["fix"]


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["healthy_wgan_clip_no_grad.py", "healthy_rnn_hidden_detached.py",
                                  "healthy_fusion_weights_relu.py", "healthy_custom_backward_shapes.py"])
async def test_healthy_twins_get_no_torch_error_finding(client, name):
    findings = await _trace(client, name)
    assert not [f for f in findings if f["code"] in ("GP100", "GP118", "GP119", "GP308") or f["severity"] == "error"]


@pytest.mark.anyio
async def test_inplace_relu_on_a_parameter_in_forward_names_it_and_the_op(client):
    findings = await _trace(client, "gp118_inplace_relu_on_fusion_weights.py")
    [f] = [f for f in findings if f["code"] == "GP118"]
    assert f["parameters"] == ["fuse.weight"] and f["location"]["line"] == 23 and not f["evidence"]["after_backward"]
    assert "`relu`" in f["message"] and "before backward()" in f["message"] and "out-of-place" in f["fix"]


@pytest.mark.anyio
async def test_custom_backward_bad_shape_names_the_argument_the_parameter_and_the_lines(client):
    findings = await _trace(client, "gp120_custom_backward_wrong_width.py")
    [f] = [f for f in findings if f["code"] == "GP120"]
    ev = f["evidence"]
    assert f["location"]["line"] == 28 and f["parameters"] == ["Render", "scales"]
    assert (ev["arg"], ev["index"], ev["got"], ev["expected"], ev["apply_at"]["line"]) == ("scales", 1, "[5, 2]", "[5, 3]", 38)
    assert not [g for g in findings if g["code"] == "GP308"]


@pytest.mark.anyio
async def test_hidden_state_kept_on_the_module_is_found_after_one_step_and_confirmed_by_a_second(client):
    target = {"project_dir": str(EXAMPLES), "model": "gp119_hidden_kept_on_module.py"}
    result = await client.call_tool("diagnose", {"target": target})
    [f] = [f for f in result.structured_content["findings"] if f["code"] == "GP119"]
    assert f["location"]["line"] == 27 and f["evidence"]["held_by_model"] == ["hidden"]
    assert "keeps a tensor of the step's graph in hidden" in f["message"] and ".detach()" in f["fix"]
    target = {"project_dir": str(EXAMPLES), "model": "healthy_hidden_kept_detached.py"}
    healthy = await client.call_tool("diagnose", {"target": target})
    assert not [f for f in healthy.structured_content["findings"] if f["severity"] == "error"]
