"""The check library as a public Python API on live objects (a notebook's model), no server, no sandbox."""

from __future__ import annotations

import torch
import torch.nn as nn

from gradprobe.checks import (
    check_optimizer_coverage,
    diagnose,
    inspect_parameters,
    run_gradcheck,
    trace_grad_path,
    verify_prompt_tuning,
)


class Cut(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)).detach())


class Doubler(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, g):
        return 3 * g  # wrong on purpose


class UsesDoubler(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return Doubler.apply(self.fc(x))


def test_trace_grad_path_names_the_cut_and_this_files_line():
    # seeded: about 1 draw in 5,000 of a 4-unit ReLU on 5 rows is dead on every row, and then b.weight's gradient is
    # exactly zero too (it reads only the detached zeros), which the finding rightly lists beside a.weight and a.bias
    torch.manual_seed(0)
    report = trace_grad_path(Cut(), torch.randn(5, 4))
    f = report["findings"][0]
    assert f["code"] == "GP302" and set(f["parameters"]) == {"a.weight", "a.bias"}
    assert f["location"]["file"] == __file__ and "detach" in f["location"]["code"]
    rows = {r["name"]: r for r in report["facts"]["per_parameter"]}
    assert rows["a.weight"]["grad"] == "none" and rows["b.weight"]["grad"] == "ok"


def test_check_optimizer_coverage_by_identity():
    model = Cut()
    opt = torch.optim.SGD(model.a.parameters(), lr=0.1)
    report = check_optimizer_coverage(model, opt, batch=torch.randn(5, 4))
    f = next(f for f in report["findings"] if f["code"] == "GP201")
    assert set(f["parameters"]) == {"b.weight", "b.bias"}


def test_run_gradcheck_and_diagnose_on_a_wrong_backward():
    model = UsesDoubler()
    report = run_gradcheck(model, torch.randn(2, 3))
    assert report["findings"][0]["code"] == "GP401" and "Doubler" in report["findings"][0]["message"]
    d = diagnose(model, torch.randn(2, 3))
    assert d["findings"][0]["code"] == "GP401" and d["facts"]["mermaid"].startswith("flowchart")


def test_inspect_parameters_and_a_healthy_model():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
    assert inspect_parameters(model)["ok"]
    assert diagnose(model, torch.randn(2, 3))["ok"]


def test_verify_prompt_tuning_on_a_live_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    class SoftPrompt(nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32))
            self.lm.requires_grad_(False)
            self.prompt = nn.Parameter(torch.randn(3, 16) * 0.02)

        def forward(self, input_ids, labels):
            b = input_ids.size(0)
            emb = torch.cat([self.prompt.expand(b, -1, -1), self.lm.get_input_embeddings()(input_ids)], 1)
            labels = torch.cat([labels.new_full((b, 3), -100), labels], 1)
            return self.lm(inputs_embeds=emb, labels=labels)

    ids = torch.randint(0, 64, (2, 6))
    report = verify_prompt_tuning(SoftPrompt(), {"input_ids": ids, "labels": ids})
    assert report["ok"], report["findings"]
    assert report["facts"]["prompt"][0]["grad"] == "ok" and report["facts"]["alignment"]["embedded_length"] == 9


def test_prompt_appended_after_the_tokens_is_located_by_value():
    import torch.nn.functional as F
    from transformers import GPT2Config, GPT2LMHeadModel

    class SuffixPrompt(nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32))
            self.lm.requires_grad_(False)
            self.prompt = nn.Parameter(torch.randn(3, 16) * 0.02)

        def forward(self, input_ids, attention_mask, labels):
            b = input_ids.size(0)
            emb = torch.cat([self.lm.get_input_embeddings()(input_ids), self.prompt.expand(b, -1, -1)], 1)
            mask = F.pad(attention_mask, (0, 3))  # zeros over the appended prompt
            return self.lm(inputs_embeds=emb, attention_mask=mask, labels=F.pad(labels, (0, 3), value=-100))

    ids = torch.randint(0, 64, (2, 6))
    report = verify_prompt_tuning(SuffixPrompt(), {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    assert report["findings"][0]["code"] == "GP506"
    assert report["facts"]["alignment"]["prompt_positions"] == [6, 9]
