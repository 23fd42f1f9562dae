"""The learned context vectors are detached before they join the token embeddings: they never learn.

Prompt learners often name their vectors `ctx` or `textual_context`, not "prompt" (the CoOp family:
https://github.com/muzairkhattak/multimodal-prompt-learning/issues/88 joins `textual_context` between the token
embeddings with torch.cat). Such a prompt is found by what the code does with it (learned values joined to the
token sequence), not by its name, and its missing gradient is reported.
"""
import torch
import torch.nn as nn
from transformers import GPT2Config, GPT2LMHeadModel

EXPECT = {"tool": "verify_prompt_tuning", "codes": ["GP501", "GP302"], "culprits": ["ctx"], "line": 29}


def tiny_lm():
    # GPT2LMHeadModel.from_pretrained("gpt2") in a real run; random weights here
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=96, n_positions=64))


class ContextLearner(nn.Module):
    def __init__(self, n_ctx=4):
        super().__init__()
        self.lm = tiny_lm()
        self.lm.requires_grad_(False)
        self.ctx = nn.Parameter(torch.randn(n_ctx, self.lm.config.n_embd) * 0.02)

    def forward(self, input_ids, attention_mask, labels):
        b, n = input_ids.size(0), self.ctx.size(0)
        embeds = torch.cat([self.ctx.detach().expand(b, -1, -1), self.lm.get_input_embeddings()(input_ids)], dim=1)
        attention_mask = torch.cat([attention_mask.new_ones(b, n), attention_mask], dim=1)
        labels = torch.cat([labels.new_full((b, n), -100), labels], dim=1)
        return self.lm(inputs_embeds=embeds, attention_mask=attention_mask, labels=labels)


def build_model():
    return ContextLearner()


def make_inputs():
    input_ids = torch.randint(4, 96, (2, 10))
    attention_mask = torch.ones_like(input_ids)
    labels = input_ids.clone()
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def make_optimizer(model):
    return torch.optim.AdamW([model.ctx], lr=1e-2)


def train_step(model, batch, optimizer):
    out = model(**batch)
    optimizer.zero_grad()
    out.loss.backward()
    optimizer.step()
    return out.loss.item()
