"""check_dependencies (GP901-GP904) and packed vs padded (GP803): through the real server on the examples and scripts,
and through the library for the finer cases (how claims and packed rows are read, healthy designs that must stay
clean, what the probe leaves behind)."""

from __future__ import annotations

import json
import textwrap
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import EXAMPLES, ROOT, line_of, one_finding, server_params  # noqa: F401

SCRIPTS = ROOT / "examples" / "scripts"


async def _call(client, model: str, **options) -> dict:
    result = await client.call_tool("check_dependencies", {"target": {"project_dir": str(EXAMPLES), "model": model},
                                                           **options})
    assert not result.is_error, result.content
    return result.structured_content


def _errors(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["severity"] == "error"]


# ---- through the real server ---------------------------------------------------------------------------------------

@pytest.mark.anyio
async def test_sliding_window_off_by_one_names_the_block_the_mask_line_and_the_flag(client):
    report = await _call(client, "gp901_sliding_window_off_by_one.py")
    f = one_finding(report["findings"], "GP901")
    ev = f["evidence"]
    path = EXAMPLES / "gp901_sliding_window_off_by_one.py"
    assert f["location"]["line"] == line_of(path, "torch.triu(ones, diagonal=2)")
    assert ev["first_module"] == "blocks.0" and ev["attention"].startswith("scaled_dot_product_attention")
    assert ev["config_key"] == "cfg.sliding_window" and ev["config_fix"] == "False"
    assert ev["depends_on"] and all(t > ev["position"] for _, t in ev["depends_on"])
    assert report["facts"]["verified"] == [] or not any(v.startswith("causality") for v in report["facts"]["verified"])
    twin = await _call(client, "healthy_deps_sliding_window_causal.py")
    assert twin["ok"] and not twin["findings"], twin["findings"]
    causal = [v for v in twin["facts"]["verified"] if v.startswith("causality")]
    assert causal and "60/60 targets are the next input" in causal[0], twin["facts"]["verified"]
    assert 1 <= twin["facts"]["backward_passes"] <= 3 and len(twin["facts"]["sampled"]) == 5


@pytest.mark.anyio
async def test_decoder_whose_config_turns_the_causal_mask_off(client):
    report = await _call(client, "gp901_decoder_is_causal_false.py")
    f = one_finding(report["findings"], "GP901")
    assert f["evidence"]["config_key"] == "config.is_causal" and f["evidence"]["config_value"] == "False"
    assert "is_causal" in f["fix"] and "True" in f["fix"]
    path = EXAMPLES / "gp901_decoder_is_causal_false.py"
    assert f["location"]["line"] == line_of(path, "return LlamaForCausalLM(config)")
    twin = await _call(client, "healthy_deps_llama_causal.py")
    assert twin["ok"] and not twin["findings"], twin["findings"]
    assert [v.split(":")[0] for v in twin["facts"]["verified"]] == ["causality", "example independence"]
    assert {n["check"] for n in twin["facts"]["not_run"]} == {"packed", "packed_vs_padded"}
    assert all(n["cause"] == "not_applicable" for n in twin["facts"]["not_run"])


@pytest.mark.anyio
async def test_examples_mixed_by_a_view_where_a_transpose_was_meant(client):
    report = await _call(client, "gp902_view_instead_of_transpose.py")
    f = one_finding(report["findings"], "GP902")
    path = EXAMPLES / "gp902_view_instead_of_transpose.py"
    assert f["location"]["line"] == line_of(path, "x = x.view(T, B, D)")
    assert {b for b, _ in f["evidence"]["depends_on"]} == {1, 2, 3}
    twin = await _call(client, "healthy_deps_transpose_for_attention.py")
    assert twin["ok"] and not twin["findings"]
    assert any(v.startswith("example independence") for v in twin["facts"]["verified"])


@pytest.mark.anyio
async def test_packed_rows_with_an_all_ones_mask_see_each_other(client):
    report = await _call(client, "gp903_packing_all_ones_mask.py")
    f = one_finding(report["findings"], "GP903")
    assert f["severity"] == "error" and f["evidence"]["call_change"] == "drop `attention_mask`"
    path = EXAMPLES / "gp903_packing_all_ones_mask.py"
    assert f["location"]["line"] == line_of(path, "return self.lm(")
    assert f["evidence"]["first_module"] == "lm.model.layers.0"
    gp803 = one_finding(report["findings"], "GP803")
    assert gp803["severity"] == "error" and gp803["evidence"]["first_module_differing"] == "lm.model.layers.0"
    assert gp803["evidence"]["gradient_relative_error"] > 0.01
    twin = await _call(client, "healthy_deps_packed_position_ids.py")
    assert twin["ok"] and not _errors(twin), twin["findings"]
    kinds = [v.split(":")[0] for v in twin["facts"]["verified"]]
    assert "packed rows" in kinds and "packed vs padded" in kinds, kinds
    pvp = twin["facts"]["packed_vs_padded"]
    assert pvp["examples"] == 3 and pvp["loss_relative_error"] < 1e-4 and pvp["gradient_relative_error"] < 2e-3


@pytest.mark.anyio
async def test_check_equivalence_compares_packed_and_padded_as_check_dependencies_does(client):
    """check_equivalence's packing comparison measures the packed rows and the model's causality as check_dependencies
    does: the model that takes no attention_mask is padded as a causal model, so GP803 is found (not left out as not
    applicable) at the line of the packed leak; its twin is verified."""
    async def equivalence(model: str) -> dict:
        target = {"project_dir": str(EXAMPLES), "model": model}
        result = await client.call_tool("check_equivalence", {"target": target, "compare": ["packing"]})
        assert not result.is_error, result.content
        return result.structured_content

    path = EXAMPLES / "gp903_packing_all_ones_mask.py"
    report = await equivalence(path.name)
    gp803 = one_finding(report["findings"], "GP803")
    assert gp803["location"]["line"] == line_of(path, "return self.lm("), gp803
    assert report["facts"]["comparisons"]["packing"]["applies"] and not report["facts"]["not_run"], report["facts"]
    twin = await equivalence("healthy_deps_packed_position_ids.py")
    assert twin["ok"] and [v.split(":")[0] for v in twin["facts"]["verified"]] == ["packed vs padded"], twin["facts"]


@pytest.mark.anyio
async def test_healthy_designs_claim_nothing_they_do_not_do(client):
    bert = await _call(client, "healthy_deps_bert_mlm.py")
    assert bert["ok"] and not bert["findings"]
    causality = [n for n in bert["facts"]["not_run"] if n["check"] == "causality"]
    assert causality and causality[0]["cause"] == "not_applicable" and "moved by one" in causality[0]["why"]
    assert bert["facts"]["next_element_claim"] is None
    cnn = await _call(client, "healthy_deps_batchnorm_cnn.py")
    assert cnn["ok"] and [f["code"] for f in cnn["findings"]] == ["GP904"] and cnn["findings"][0]["severity"] == "info"
    assert "bn" in cnn["findings"][0]["message"]
    gpt2 = await _call(client, "healthy_deps_gpt2_causal.py")
    assert gpt2["ok"] and not gpt2["findings"], gpt2["findings"]


@pytest.mark.anyio
async def test_options_positions_and_checks(client):
    report = await _call(client, "healthy_deps_llama_causal.py", positions=9, checks=["causality"])
    assert report["ok"]
    assert len(report["facts"]["sampled"]) == 9 and report["facts"]["backward_passes"] > 3
    assert [v.split(":")[0] for v in report["facts"]["verified"]] == ["causality"]
    assert not report["facts"]["not_run"]


@pytest.mark.anyio
async def test_diagnose_runs_the_dependency_check_where_a_claim_is_measured(client):
    target = {"project_dir": str(EXAMPLES), "model": "healthy_deps_llama_causal.py"}
    result = await client.call_tool("diagnose", {"target": target})
    report = result.structured_content
    assert report["ok"] and "dependencies" in report["facts"]["checks"]
    deps = report["facts"]["dependencies"]
    assert deps["ran"] is True and deps["seconds"] >= 0 and deps["verified"][0].startswith("causality")
    assert "Dependencies verified: causality" in report["summary"]
    result = await client.call_tool("diagnose", {"target": {"project_dir": str(EXAMPLES),
                                                            "model": "gp903_packing_all_ones_mask.py"}})
    report = result.structured_content
    f = one_finding(report["findings"], "GP903")
    assert "GP803" in {r["code"] for r in f["evidence"].get("related", [])} or any(
        g["code"] == "GP803" for g in report["findings"])


SCRIPT_CASES = [
    ("deps_packed_loop_broken", ["--steps=2"], ["GP903", "GP803"]),
    ("deps_packed_loop", ["--steps=2"], []),
    ("deps_packed_trainer", ["--max_steps=1"], []),
]


@pytest.mark.anyio
@pytest.mark.parametrize("case", SCRIPT_CASES, ids=[c[0] for c in SCRIPT_CASES])
async def test_scripts_probe_the_model_at_its_first_step_in_the_training_path(client, case):
    project, args, codes = case
    result = await client.call_tool("check_dependencies", {"target": {"project_dir": str(SCRIPTS / project),
                                                                      "script": "train.py", "args": args,
                                                                      "timeout_s": 240}})
    assert not result.is_error, result.content
    report = result.structured_content
    assert sorted(f["code"] for f in _errors(report)) == sorted(codes), report["findings"]
    if codes:
        f = one_finding(report["findings"], "GP903")
        assert f["evidence"]["call_change"] == "use_cache=False"
        assert f["location"]["line"] == line_of(SCRIPTS / project / "train.py", "out = model(**batch)")
    else:
        assert any(v.startswith("packed rows") for v in report["facts"]["verified"]), report["facts"]
        outside = [f for f in report["findings"] if f["code"] == "GP903"]
        assert outside and outside[0]["severity"] == "info" and "use_cache=True" in outside[0]["message"]


def test_cli_check_dependencies_json():
    proc = subprocess.run([sys.executable, "-m", "gradprobe", "check_dependencies",
                           str(EXAMPLES / "gp901_sliding_window_off_by_one.py"), "--positions", "3", "--checks",
                           "causality", "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["tool"] == "check_dependencies" and [f["code"] for f in report["findings"]] == ["GP901"]
    assert len(report["facts"]["sampled"]) == 3


# ---- the library: how claims and packed rows are read ---------------------------------------------------------------

def test_packed_rows_are_told_by_values_not_names():
    from gradprobe.checks.dependencies.segments import find_segments

    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2]])
    seg = find_segments({"p": pos}, 1, 8)
    assert seg is not None and seg.how == "position ids that restart" and seg.spans == [[(0, 3), (3, 5), (5, 8)]]
    cu = find_segments({"x": torch.tensor([0, 3, 5, 8], dtype=torch.int32)}, 1, 8)
    assert cu is not None and cu.how == "cumulative sequence lengths" and cu.spans == seg.spans
    ids = find_segments({"s": torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2]])}, 1, 8)
    assert ids is not None and ids.spans == seg.spans
    block = torch.zeros(8, 8, dtype=torch.bool)
    for s, e in [(0, 3), (3, 5), (5, 8)]:
        block[s:e, s:e] = torch.ones(e - s, e - s, dtype=torch.bool).tril()
    mask = find_segments({"m": block[None, None]}, 1, 8)
    assert mask is not None and mask.how == "a block-diagonal mask" and mask.spans == seg.spans
    # not packed: plain positions, a padded row's positions with its mask, BERT's token types, a causal mask
    assert find_segments({"p": torch.arange(8)[None]}, 1, 8) is None
    padded = {"p": torch.tensor([[0, 1, 2, 3, 4, 1, 1, 1]]), "a": torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0]])}
    assert find_segments(padded, 1, 8) is None
    assert find_segments({"t": torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1]])}, 1, 8) is None
    assert find_segments({"m": torch.ones(8, 8, dtype=torch.bool).tril()[None, None]}, 1, 8) is None


def test_cross_entropy_targets_are_read_from_the_gradient_even_with_label_smoothing():
    from gradprobe.checks.dependencies.claims import ce_targets

    logits = torch.randn(2, 5, 11, requires_grad=True)
    target = torch.randint(0, 11, (2, 5))
    target[1, 4] = -100
    loss = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), label_smoothing=0.1, ignore_index=-100)
    got, read = ce_targets(torch.autograd.grad(loss, logits)[0])
    assert not bool(read[1, 4]) and bool(read.reshape(-1)[:9].all())
    assert torch.equal(got[read], target[read])


class _Conv(nn.Module):
    """A temporal convolution over (B, T, F) predicting the next value: causal when padded on the left only."""

    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal
        self.conv = nn.Conv1d(2, 2, 3)

    def forward(self, x):
        h = x.transpose(1, 2)
        h = F.pad(h, (2, 0)) if self.causal else F.pad(h, (1, 1))
        return self.conv(h).transpose(1, 2)


def _series() -> dict:
    data = torch.randn(3, 11, 2)
    return {"x": data[:, :-1], "y": data[:, 1:]}


def _mse(out, batch):
    return F.mse_loss(out, batch["y"])


def test_a_regression_on_the_next_value_claims_causality_from_the_batch():
    from gradprobe.checks import check_dependencies  # the public library API

    torch.manual_seed(0)
    batch = _series()
    ok = check_dependencies(_Conv(causal=True), batch, _mse)
    assert ok["ok"] and any("`y` is the input moved by one position" in v for v in ok["facts"]["verified"]), ok["facts"]
    bad = check_dependencies(_Conv(causal=False), batch, _mse)
    f = one_finding(bad["findings"], "GP901")
    assert f["evidence"]["depends_on"] == [[f["evidence"]["row"], f["evidence"]["position"] + 1]]
    assert f["evidence"]["config_key"].endswith("causal")  # the module's own flag switches the padding


class _PrefixLM(nn.Module):
    """A decoder with a prefix-LM mask: the first P positions see each other, the rest is causal."""

    def __init__(self, prefix: int, vocab: int = 40, dim: int = 16):
        super().__init__()
        self.prefix = prefix
        self.emb = nn.Embedding(vocab, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        x = self.emb(ids)
        T = ids.shape[1]
        q, k, v = self.qkv(x).chunk(3, -1)
        keep = torch.ones(T, T, dtype=torch.bool).tril()
        keep[: self.prefix, : self.prefix] = True
        return self.head(x + F.scaled_dot_product_attention(q, k, v, attn_mask=keep))


def test_a_prefix_lm_is_measured_only_where_its_loss_predicts():
    from gradprobe.checks.dependencies import check_dependencies

    torch.manual_seed(0)
    ids = torch.randint(0, 40, (2, 10))
    labels = ids.clone()
    labels[:, :4] = -100

    def loss_fn(logits, batch):
        return F.cross_entropy(logits[:, :-1].reshape(-1, 40), batch["labels"][:, 1:].reshape(-1))

    report = check_dependencies(_PrefixLM(prefix=4), {"ids": ids, "labels": labels}, loss_fn)
    assert report["ok"] and not report["findings"], report["findings"]
    assert all(s["position"] >= 3 for s in report["facts"]["sampled"] if s["causal"])
    # a prefix spanning the positions the loss reads is a leak
    leaky = check_dependencies(_PrefixLM(prefix=8), {"ids": ids, "labels": labels}, loss_fn)
    assert "GP901" in {f["code"] for f in leaky["findings"]}


@pytest.mark.anyio
async def test_a_similarity_matrix_is_judged_per_entry_not_per_row(client):
    """A contrastive model's (B, B) output: row i reads every example by design, entry (i, j) reads examples i and j
    only. The healthy two-tower model is verified per entry (it was a false GP902, per row, in the sweep); its twin
    whose towers scramble the batch with a view is GP902 at that view's line."""
    healthy = await _call(client, "healthy_deps_contrastive_pairs.py")
    assert not healthy["findings"] and healthy["verdict"]["status"] == "verified", healthy["findings"]
    (line,) = [v for v in healthy["facts"]["verified"] if v.startswith("example independence")]
    assert "pairs the examples (4 x 4" in line and "entries (i, j) depend on examples i and j only" in line, line
    broken = await _call(client, "gp902_contrastive_tower_view_mixes_batch.py")
    (f,) = _errors(broken)
    assert f["code"] == "GP902" and f["location"]["line"] == line_of(EXAMPLES / "gp902_contrastive_tower_view_mixes_batch.py",
                                                                     "h.view(h.shape[1], h.shape[0], DIM)"), f


def test_a_square_output_whose_rows_are_their_own_keeps_the_row_claim():
    """A classifier with as many classes as the batch has examples: where its rows are their own, the row claim (the
    stronger one) is what is verified; where a row reads another example, the entries are measured too, and one that
    reads a third example is GP902."""
    from gradprobe.checks.dependencies import check_dependencies

    torch.manual_seed(0)
    clean = check_dependencies(nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 4)), torch.randn(4, 5))
    (line,) = [v for v in clean["facts"]["verified"] if v.startswith("example independence")]
    assert "depend on their own example only" in line and "pairs" not in line, line

    class Neighbour(nn.Module):  # row i also reads example i + 1 (a roll where a per-example op was meant)
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(5, 4)

        def forward(self, x):
            return self.fc(x + x.roll(1, dims=0))

    report = check_dependencies(Neighbour(), torch.randn(4, 5))
    assert [f["code"] for f in _errors(report)] == ["GP902"], report["findings"]


def test_cross_attention_to_an_encoder_and_a_pooled_classifier_stay_clean():
    from transformers import BertConfig, BertForSequenceClassification, T5Config, T5ForConditionalGeneration

    from gradprobe.checks.dependencies import check_dependencies

    torch.manual_seed(0)
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                                             decoder_start_token_id=0, pad_token_id=0))
    src, labels = torch.randint(1, 64, (2, 6)), torch.randint(1, 64, (2, 6))  # as long: the encoder's are no future
    report = check_dependencies(t5, {"input_ids": src, "labels": labels})
    assert report["ok"] and not report["findings"], report["findings"]
    assert any(v.startswith("causality") for v in report["facts"]["verified"]), report["facts"]
    bert = BertForSequenceClassification(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                                    num_attention_heads=2, intermediate_size=32, num_labels=3))
    report = check_dependencies(bert, {"input_ids": torch.randint(0, 64, (3, 8)), "labels": torch.tensor([0, 1, 2])})
    assert report["ok"] and not report["findings"]
    assert [v.split(":")[0] for v in report["facts"]["verified"]] == ["example independence"]


def test_a_prompt_looked_up_from_the_models_own_ids_is_no_input_of_any_example():
    """P-tuning: prompt vectors looked up at a registered buffer of ids (as many prompts as the batch has examples),
    encoded and expanded over the batch. That lookup is the model's, the same for every example: no example sees
    another's input through it (the mutation bench's unmutated P-tuning source was a false GP902 when an embedding
    looked up at the model's own ids counted as an input)."""
    from gradprobe.checks.dependencies import check_dependencies

    class Prompted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.words, self.prompts = nn.Embedding(16, 8), nn.Embedding(4, 8)
            self.encode, self.head = nn.Linear(8, 8), nn.Linear(8, 5)
            self.register_buffer("prompt_ids", torch.arange(4), persistent=False)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            prompt = self.encode(self.prompts(self.prompt_ids)).unsqueeze(0).expand(ids.size(0), -1, -1)
            return self.head(torch.cat([prompt, self.words(ids)], dim=1).mean(1))

    torch.manual_seed(0)
    report = check_dependencies(Prompted(), torch.randint(0, 16, (4, 6)))
    assert not [f for f in report["findings"] if f["code"] == "GP902"], report["findings"]
    assert any(v.startswith("example independence") for v in report["facts"]["verified"]), report["facts"]


def _llama(**kw):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, **kw))


def _flattened(**kw) -> dict:
    from transformers import DataCollatorWithFlattening

    torch.manual_seed(1)
    rows = [{"input_ids": torch.randint(0, 64, (n,)).tolist()} for n in (5, 6, 4)]
    return DataCollatorWithFlattening(return_tensors="pt", **kw)(rows)


def test_flash_attention_kwargs_on_an_attention_that_ignores_them():
    from gradprobe.checks.dependencies import check_dependencies

    batch = _flattened(return_flash_attn_kwargs=True, return_position_ids=False)
    batch["use_cache"] = False
    report = check_dependencies(_llama(), batch)
    f = one_finding(report["findings"], "GP903")
    assert f["evidence"]["call_change"] == "position_ids restarting" and "cumulative sequence lengths" in f["message"]


def test_labels_that_cross_packed_examples_differ_from_padded():
    from gradprobe.checks.dependencies import check_dependencies

    batch = _flattened()
    batch["labels"] = batch["input_ids"].clone()  # no -100 separator at the start of each example
    batch["use_cache"] = False
    report = check_dependencies(_llama(), batch)
    assert "GP903" not in {f["code"] for f in _errors(report)}, report["findings"]
    f = one_finding(report["findings"], "GP803")
    assert f["evidence"]["first_module_differing"] is None and f["evidence"]["targets_across_examples"] == 2


def test_the_probe_leaves_weights_buffers_and_grads_untouched():
    from gradprobe.checks.dependencies import check_dependencies

    sys.path.insert(0, str(EXAMPLES))
    try:
        import healthy_deps_batchnorm_cnn as cnn
    finally:
        sys.path.remove(str(EXAMPLES))
    torch.manual_seed(0)
    model = cnn.build_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = check_dependencies(model, cnn.make_inputs(), cnn.loss_fn)
    assert [f["code"] for f in report["findings"]] == ["GP904"]
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "the probe changed a weight or a buffer"
    assert all(p.grad is None for p in model.parameters()) and model.training and model.bn.training


def test_a_train_step_target_is_probed_on_its_own_model_call_without_stepping():
    from transformers import GPT2Config, GPT2LMHeadModel

    from gradprobe.checks.dependencies.engine import dependencies_report
    from gradprobe.loading import live_target

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0))
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)

    def train_step(m, batch, opt):
        opt.zero_grad()
        loss = m(input_ids=batch[0], labels=batch[0]).loss
        loss.backward()
        opt.step()
        return loss

    before = [p.detach().clone() for p in model.parameters()]
    report = dependencies_report(live_target(model, (torch.randint(0, 64, (2, 9)),), None, optimizer, train_step))
    assert report["ok"] and any(v.startswith("causality") for v in report["facts"]["verified"]), report["facts"]
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


@pytest.mark.anyio
async def test_a_train_step_that_calls_a_part_of_the_model_is_probed_at_that_call(client):
    """The DPO-style example's train_step calls `model.policy(x)` (and a frozen `model.ema_model` under no_grad), never
    `model(...)`: the probe takes the first grad-enabled call of a module holding trainable parameters, so example
    independence is measured there (before: every check was not_run with cause gradprobe)."""
    report = await _call(client, "healthy_steps_frozen_reference_named_ema.py")
    assert report["ok"] and not report["findings"], report["findings"]
    assert not [n for n in report["facts"]["not_run"] if n["cause"] == "gradprobe"], report["facts"]["not_run"]
    assert report["facts"]["probed_module"] == "policy"
    assert any(v.startswith("example independence") and "`policy`" in v for v in report["facts"]["verified"])


def test_a_part_of_the_model_that_mixes_examples_is_found_at_the_train_steps_call():
    from gradprobe.checks.dependencies.engine import dependencies_report
    from gradprobe.loading import live_target

    class Mixer(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            h = self.lin(x)
            return h + h.flip(0)  # row i reads row B-1-i

    class Distill(nn.Module):
        def __init__(self):
            super().__init__()
            self.teacher = nn.Linear(4, 4).requires_grad_(False)
            self.student = Mixer()

    torch.manual_seed(0)
    model = Distill()
    optimizer = torch.optim.SGD(model.student.parameters(), lr=0.1)

    def train_step(m, batch, opt):
        opt.zero_grad()
        with torch.no_grad():
            target = m.teacher(batch)
        loss = F.mse_loss(m.student(batch), target)
        loss.backward()
        opt.step()
        return loss

    before = [p.detach().clone() for p in model.parameters()]
    report = dependencies_report(live_target(model, torch.randn(4, 4), None, optimizer, train_step))
    assert [f["code"] for f in _errors(report)] == ["GP902"], report["findings"]
    assert report["facts"]["probed_module"] == "student"
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


@pytest.mark.anyio
async def test_a_leak_computed_outside_the_attention_names_the_module_and_line_not_the_attention(client):
    """Sequence-level routing (Shwai-He/MEO#2): the router's scores averaged over the positions. The attention is
    causal; the routed MLP's input has no leak and its output does: it is named, at the mean's line, and the fix is not
    the attention's (before: the block's attention call was blamed, with the attention's fix)."""
    report = await _call(client, "gp901_router_mean_over_sequence.py")
    f = one_finding(report["findings"], "GP901")
    path = EXAMPLES / "gp901_router_mean_over_sequence.py"
    assert f["location"]["line"] == line_of(path, "softmax(-1).mean(dim=1, keepdim=True)")
    assert f["evidence"]["first_module"] == "blocks.0" and f["evidence"]["computed_by"] == "blocks.0.moe"
    assert f["evidence"]["attention"] is None and "attention is not the cause" in f["message"]
    assert "blocks.0.moe" in f["fix"] and "is_causal" not in f["fix"]
    twin = await _call(client, "healthy_deps_router_per_token.py")
    assert twin["ok"] and not twin["findings"], twin["findings"]
    assert any(v.startswith("causality") for v in twin["facts"]["verified"])
    # a mask leak is still the attention's: the sliding-window example names its attention call
    window = await _call(client, "gp901_sliding_window_off_by_one.py")
    g = one_finding(window["findings"], "GP901")
    assert g["evidence"]["attention"].startswith("scaled_dot_product_attention") and "not the cause" not in g["message"]


@pytest.mark.anyio
@pytest.mark.parametrize("causal", [True, False])
async def test_a_checkpointed_model_with_dropout_is_measured(client, tmp_path, causal):
    """Gradient checkpointing (transformers' default, non-reentrant) with dropout in train mode: the probe turns dropout
    off for its forward, and the backward's recomputation would run the forward unchanged (CheckpointError: different
    metadata: every check not run, cause gradprobe). Checkpoints run as plain calls inside the probe, so the model is
    measured: the healthy causal GPT-2 verified, the same model with its causal mask off (a bidirectional flag) GP901."""
    (tmp_path / "case.py").write_text(textwrap.dedent(f'''
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel

        def build_model():
            torch.manual_seed(0)
            model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=2, n_head=2, n_positions=32))
            model.gradient_checkpointing_enable()
            for block in model.transformer.h:
                block.attn.is_causal = {causal}
            return model.train()

        def make_inputs():
            ids = torch.randint(1, 64, (2, 8))
            return {{"input_ids": ids, "labels": ids.clone()}}
    '''))
    result = await client.call_tool("check_dependencies", {"target": {"project_dir": str(tmp_path), "model": "case.py"}})
    report = result.structured_content
    gaps = [e for e in report["facts"]["not_run"] if e["cause"] != "not_applicable"]
    assert not gaps, gaps
    codes = [f["code"] for f in _errors(report)]
    assert codes == ([] if causal else ["GP901"]), report["findings"]
