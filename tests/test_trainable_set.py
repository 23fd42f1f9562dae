"""The trainable set, as built vs as meant (issue 36, item 5), through the real server: a module on the path to the
loss that is frozen and still at its random initialisation is GP123 at the line (or the adapter config key) that froze
it; the report shows the trainable set by module tree, so a lock count that is off by one is visible at a glance."""

from __future__ import annotations

import textwrap

import pytest

from conftest import EXAMPLES, line_of

PEFT = "gp123_peft_lora_head_frozen_at_init.py"
FREEZE_LOOP = "gp123_new_head_frozen_by_freeze_loop.py"
LOCK = "gp105_image_tower_lock_off_by_one.py"
LOCK_OK = "healthy_image_tower_lock_last_block.py"


async def _report(client, project: str, name: str, tool: str = "diagnose") -> dict:
    result = await client.call_tool(tool, {"target": {"project_dir": project, "model": name}})
    assert not result.is_error, result.content
    return result.structured_content


def _gp123(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["code"] == "GP123"]


@pytest.mark.anyio
async def test_peft_head_frozen_at_init_names_the_config_key(client):
    report = await _report(client, str(EXAMPLES), PEFT)
    [f] = _gp123(report)
    assert f["severity"] == "error"
    assert f["location"]["line"] == line_of(EXAMPLES / PEFT, "return get_peft_model(model, config)")
    assert set(f["parameters"]) == {"base_model.model.classifier.weight", "base_model.model.classifier.bias"}
    ev = f["evidence"]
    assert ev["initialiser"]["op"] == "normal_" and ev["last_before_loss"] and ev["loaded_tensors"] > 30
    cfg = ev["adapter_config"]
    assert cfg["type"] == "LoraConfig" and cfg["modules_to_save"] is None and cfg["task_type"] is None
    assert cfg["location"]["line"] == line_of(EXAMPLES / PEFT, "config = LoraConfig(")
    assert 'modules_to_save=["classifier"]' in f["fix"] and f"line {cfg['location']['line']}" in f["fix"]
    # the trainable set shows it too: the head frozen at its initialisation, the blocks only partly trainable
    lines = report["facts"]["trainable_set"]["lines"]
    assert "base_model.model.classifier: frozen (2 tensors), at its initialisation (no load wrote it)" in lines
    assert "base_model.model.bert.encoder.layer: 0 of 2 BertLayer trainable; 2 partly (0-1)" in lines
    assert "Trainable set (8 of 49 tensors)" in report["summary"]


@pytest.mark.anyio
async def test_peft_head_kept_trainable_by_task_type_is_clean(client):
    report = await _report(client, str(EXAMPLES), "healthy_peft_lora_seq_cls_head_trained.py")
    assert not _gp123(report) and not [f for f in report["findings"] if f["severity"] == "error"]
    # the frozen original of the head is still at its initialisation, but off the loss's path
    [region] = [r for r in report["facts"]["trainable_set"]["regions"] if r["path"] == "base_model.model.classifier"]
    assert region["frozen_at_init"] == ["original_module"] and region["trainable"] == 2


@pytest.mark.anyio
async def test_freeze_loop_that_froze_the_new_head_points_at_the_loop(client):
    report = await _report(client, str(EXAMPLES), FREEZE_LOOP)
    [f] = _gp123(report)
    assert f["severity"] == "error" and f["parameters"] == ["fc.weight", "fc.bias"]
    assert f["location"]["line"] == line_of(EXAMPLES / FREEZE_LOOP, 'p.requires_grad = name.startswith("stage2")')
    assert "model.fc.requires_grad_(True)" in f["fix"] and "line" in f["fix"]
    assert f["evidence"]["adapter_config"] is None and f["evidence"]["loaded_tensors"] == 6


@pytest.mark.anyio
async def test_frozen_loaded_backbone_with_a_new_trainable_head_is_clean(client, tmp_path):
    """The brief's twin: a backbone loaded from a tiny checkpoint saved in the test's folder, frozen, a new head."""
    (tmp_path / "case.py").write_text(textwrap.dedent(f'''
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        def build_model():
            body = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
            body.load_state_dict(torch.load({str(tmp_path / "body.pt")!r}))
            body.requires_grad_(False)
            return nn.Sequential(body, nn.Linear(16, 3))

        def make_inputs():
            return torch.randn(8, 6)

        def loss_fn(out, x):
            return F.cross_entropy(out, (x[:, 0] > 0).long())
    '''))
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    torch.save(nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU()).state_dict(), tmp_path / "body.pt")
    report = await _report(client, str(tmp_path), "case.py")
    assert not _gp123(report) and not [f for f in report["findings"] if f["severity"] != "info"], report["findings"]
    assert report["facts"]["trainable_set"]["lines"] == ["0: frozen (4 tensors)", "1: trainable (2 tensors)"]

    # the same body never loaded (the load line removed): frozen at its initialisation, with a trainable head after it
    source = (tmp_path / "case.py").read_text().replace("    body.load_state_dict(", "    # body.load_state_dict(")
    (tmp_path / "case.py").write_text(source)
    report = await _report(client, str(tmp_path), "case.py")
    [f] = _gp123(report)
    assert f["severity"] == "info" and "nothing in the model was loaded" in f["message"]
    assert f["location"]["code"] == "body.requires_grad_(False)"


@pytest.mark.anyio
async def test_random_features_by_design_is_info(client):
    report = await _report(client, str(EXAMPLES), "healthy_random_features_frozen.py")
    [f] = _gp123(report)
    assert f["severity"] == "info" and f["parameters"] == ["features.weight", "features.bias"]
    assert not f["evidence"]["last_before_loss"] and f["evidence"]["loaded_tensors"] == 0


@pytest.mark.anyio
async def test_inner_module_missed_by_a_partial_load_is_a_warning(client, tmp_path):
    """A load with strict=False that misses a frozen inner layer (its keys renamed): a warning, never an error."""
    (tmp_path / "case.py").write_text(textwrap.dedent(f'''
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        def build_model():
            model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
            state = torch.load({str(tmp_path / "ckpt.pt")!r})
            model.load_state_dict({{k.replace("2.", "mid."): v for k, v in state.items()}}, strict=False)
            model[2].requires_grad_(False)
            return model

        def make_inputs():
            return torch.randn(8, 6)

        def loss_fn(out, x):
            return F.cross_entropy(out, (x[:, 0] > 0).long())
    '''))
    import torch
    import torch.nn as nn

    torch.save(nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3)).state_dict(),
               tmp_path / "ckpt.pt")
    report = await _report(client, str(tmp_path), "case.py")
    [f] = _gp123(report)
    assert f["severity"] == "warning" and f["parameters"] == ["2.weight", "2.bias"]
    assert f["location"]["code"] == "model[2].requires_grad_(False)" and "strict=True" in f["fix"]


@pytest.mark.anyio
@pytest.mark.parametrize(("name", "blocks"), [(LOCK, "visual.blocks: 0 of 4 Block trainable"),
                                               (LOCK_OK, "visual.blocks: 1 of 4 Block trainable (3)")])
async def test_lock_count_is_visible_in_the_trainable_set(client, name, blocks):
    for tool in ("inspect_parameters", "diagnose"):
        report = await _report(client, str(EXAMPLES), name, tool)
        tset = report["facts"]["trainable_set"]
        assert blocks in tset["lines"] and "text.blocks: 4 of 4 Block trainable" in tset["lines"]
        [stack] = [s for s in tset["stacks"] if s["path"] == "visual.blocks"]
        assert stack["count"] == 4 and stack["trainable"] == ([] if name == LOCK else [3])
        assert blocks in report["summary"]
        [gp105] = [f for f in report["findings"] if f["code"] == "GP105"]
        assert blocks in gp105["message"]
        assert not _gp123(report)  # the locked tower was loaded: frozen by design, not at its initialisation


@pytest.mark.anyio
async def test_script_mode_finds_the_frozen_head_at_the_freezing_line(client, tmp_path):
    """The freeze-loop example as a training script the user runs: the same GP123, with the script's line."""
    source = (EXAMPLES / FREEZE_LOOP).read_text()
    body = source[source.index('"""', 3) + 3:].split("def make_inputs")[0]
    body = body.replace(body[body.index("EXPECT = "):body.index("\n", body.index("EXPECT = ")) + 1], "")
    (tmp_path / "train.py").write_text(body + textwrap.dedent('''
        model = build_model()
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
        for step in range(3):
            x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    '''))
    result = await client.call_tool("diagnose", {"target": {"project_dir": str(tmp_path), "script": "train.py",
                                                            "timeout_s": 240}})
    assert not result.is_error, result.content
    [f] = _gp123(result.structured_content)
    assert f["severity"] == "error" and f["parameters"] == ["fc.weight", "fc.bias"]
    assert f["location"]["code"] == 'p.requires_grad = name.startswith("stage2")'


@pytest.mark.anyio
@pytest.mark.parametrize("adapter", ["HRAConfig(r=4, target_modules=['q', 'v'], task_type='SEQ_2_SEQ_LM')",
                                     "DeftConfig(r=4, target_modules=['q', 'v'], task_type='SEQ_2_SEQ_LM')"])
async def test_an_adapter_initialising_itself_is_no_load_of_the_model(client, tmp_path, adapter):
    """A T5 built from a tiny config (nothing loaded) wrapped by peft: HRA sets new Parameters made from tensors it drew
    (nn.Parameter(repeat_interleave(...))), DEFT copies a product of the base weights into its trainable tensors.
    Neither is a load of the model: the random frozen lm_head of a model built from scratch is no GP123 error (the
    sweep's hra@t5, gralora@t5 and deft@t5 were)."""
    (tmp_path / "case.py").write_text(textwrap.dedent(f'''
        import torch
        import peft
        from peft import get_peft_model
        from transformers import T5Config, T5ForConditionalGeneration

        def build_model():
            torch.manual_seed(0)
            base = T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1,
                                                       num_heads=2, decoder_start_token_id=0, pad_token_id=0))
            return get_peft_model(base, peft.{adapter})

        def make_inputs():
            ids = torch.randint(1, 64, (2, 6))
            return {{"input_ids": ids, "labels": ids.clone()}}
    '''))
    report = await _report(client, str(tmp_path), "case.py")
    loud = [f for f in _gp123(report) if f["severity"] != "info"]
    assert not loud, [(f["severity"], f["message"][:300]) for f in loud]
