"""Issue 16 (accA): folding only what shares a cause, the summary that counts what is missing, and no false
GP101 on real transformers models that keep constant tables as attributes."""

from __future__ import annotations

import pytest
import torch

from factories import catalogued_finding as make_finding


def _f(code: str, params: list[str], line: int | None = None) -> dict:
    loc = {"file": "/p/model.py", "line": line, "function": "forward", "code": "x"} if line else None
    return dict(make_finding(code, f"{code} on {params}", parameters=params, location=loc))


def test_fold_keeps_a_cut_apart_from_an_unrelated_error_on_the_same_parameters():
    from gradprobe.checks.diagnosis import fold

    prompt = ["encoder.0.weight", "encoder.0.bias"]
    kept = fold([_f("GP303", prompt, 17), _f("GP507", prompt, 40)])
    assert sorted(k["code"] for k in kept) == ["GP303", "GP507"]
    assert all("related" not in k["evidence"] for k in kept)


def test_fold_keeps_a_failed_backward_apart_from_an_unrelated_function_finding():
    from gradprobe.checks.diagnosis import fold

    kept = fold([_f("GP308", [], 12), _f("GP406", ["fc.weight"], 30)])
    assert sorted(k["code"] for k in kept) == ["GP308", "GP406"]


def test_fold_joins_findings_of_one_line_or_one_causal_link():
    from gradprobe.checks.diagnosis import fold

    same_line = fold([_f("GP302", ["w"], 9), _f("GP501", ["w"], 9)])
    assert [k["code"] for k in same_line] == ["GP302"]
    causal = fold([_f("GP202", ["a", "b"], 21), _f("GP201", ["a"])])
    assert [k["code"] for k in causal] == ["GP202"]
    assert [r["code"] for r in causal[0]["evidence"]["related"]] == ["GP201"]


def test_fold_never_hides_a_parameter_the_host_does_not_name():
    from gradprobe.checks.diagnosis import fold

    kept = fold([_f("GP302", ["a"], 9), _f("GP301", ["a", "b"], 9)])
    assert sorted(k["code"] for k in kept) == ["GP301", "GP302"]


def test_summary_counts_unregistered_parameters():
    from conftest import EXAMPLES
    from gradprobe.sandbox.run_check import run_job

    report = run_job({"tool": "diagnose", "target": {"project_dir": str(EXAMPLES), "model": "gp103_heads_in_dict.py"},
                      "options": {}}, lambda phase: None)
    assert "4 more tensor(s) meant to learn are not registered (GP103)" in report["summary"], report["summary"]


def _tiny(kind: str):
    transformers = pytest.importorskip("transformers")
    t = transformers
    if kind == "gpt2":
        return t.GPT2LMHeadModel(t.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                                              bos_token_id=0, eos_token_id=0))
    if kind == "llama":
        return t.LlamaForCausalLM(t.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                                num_key_value_heads=2, vocab_size=100))
    if kind == "t5":
        return t.T5ForConditionalGeneration(t.T5Config(num_layers=2, d_model=32, d_ff=64, num_heads=2, d_kv=16, vocab_size=100))
    return t.BertForMaskedLM(t.BertConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                          vocab_size=100))


@pytest.mark.parametrize("kind", ["gpt2", "llama", "t5", "bert"])
def test_real_transformers_models_get_no_error(kind):
    """Their constant tables and caches (causal masks, rotary frequencies, position ids) are no GP101 errors."""
    from gradprobe.checks import diagnose

    torch.manual_seed(0)
    model = _tiny(kind)
    ids = torch.randint(0, 100, (2, 8))
    batch = {"input_ids": ids, "labels": ids}
    if kind == "t5":
        batch["decoder_input_ids"] = ids
    report = diagnose(model, batch)
    errors = [(f["code"], f["message"]) for f in report["findings"] if f["severity"] == "error"]
    assert not errors, errors


class _ScaledSet(torch.utils.data.Dataset):
    """Returns each sample with the model's own scale: the workers send back copies (leaves), silently."""

    def __init__(self, data, scale):
        self.data, self.scale = data, scale

    def __getitem__(self, i):
        return self.data[i], self.scale

    def __len__(self):
        return len(self.data)


def test_dataloader_workers_returning_leaves_silently_are_gp309_naming_the_parameter():
    from gradprobe.checks import trace_grad_path

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(3))
            self.fc = torch.nn.Linear(3, 1)

        def forward(self, x, scale):
            return self.fc(x * scale)

    def train_step(model, data, optimizer):
        loader = torch.utils.data.DataLoader(_ScaledSet(data, model.scale), batch_size=2, num_workers=1,
                                             collate_fn=lambda items: (torch.stack([x for x, _ in items]), items[0][1]))
        for x, scale in loader:
            model(x, scale).pow(2).mean().backward()
            break

    report = trace_grad_path(Net(), torch.randn(4, 3), train_step=train_step)
    hits = [f for f in report["findings"] if f["code"] == "GP309" and f["parameters"] == ["scale"]]
    assert hits and hits[0]["severity"] == "error", report["findings"]
    assert hits[0]["location"]["function"] == "__getitem__"
    assert hits[0]["evidence"]["worker_error"] is None  # no error in the worker: the copies came back as leaves


def _run(tool: str, example: str) -> dict:
    from conftest import EXAMPLES
    from gradprobe.sandbox.run_check import run_job

    return run_job({"tool": tool, "target": {"project_dir": str(EXAMPLES), "model": example}, "options": {}}, lambda phase: None)


@pytest.mark.parametrize("tool", ["diagnose", "trace_grad_path", "check_optimizer_coverage"])
def test_failing_make_optimizer_is_the_one_root_and_train_step_is_not_run(tool):
    report = _run(tool, "gp100_make_optimizer_fails.py")
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert [f["code"] for f in errors] == ["GP100"], errors
    assert errors[0]["location"]["line"] == 24 and "weight_decy" in errors[0]["message"]


@pytest.mark.parametrize("tool", ["trace_grad_path", "check_optimizer_coverage"])
def test_parameters_replaced_in_the_first_forward_do_not_crash_the_other_tools(tool):
    report = _run(tool, "gp202_actnorm_first_call_init.py")
    assert not [f for f in report["findings"] if f["code"] in ("GP000", "GP100")], report["findings"]
    if tool == "check_optimizer_coverage":
        hit = next(f for f in report["findings"] if f["code"] == "GP202")
        assert hit["parameters"] == ["norm.log_scale", "norm.shift"] and hit["location"]["line"] == 21
