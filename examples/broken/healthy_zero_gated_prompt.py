"""Healthy: learned context vectors prepended to GPT-2's token embeddings through a gate initialised at zero.

The zero-init gating of LLaMA-Adapter (https://github.com/huggingface/peft/issues/462, paper arXiv 2303.16199):
"Initialized by zero vectors, the gating can firstly preserve the original knowledge ... and progressively
incorporate instructional signals". At the first step the context vectors get an exactly-zero gradient (the
gate multiplies them) while the gate gets one: by design, at most an info, never GP501.
"""
import torch
import torch.nn as nn
from transformers import GPT2Config, GPT2LMHeadModel

EXPECT = {"tool": "verify_prompt_tuning", "codes": [], "culprits": [], "healthy": True, "absent": ["GP501"]}


class GatedContext(nn.Module):
    def __init__(self, n_ctx=4):
        super().__init__()
        # GPT2LMHeadModel.from_pretrained("gpt2") in a real run; random weights here
        self.lm = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=96, n_positions=64))
        self.lm.requires_grad_(False)
        self.ctx = nn.Parameter(torch.randn(n_ctx, 32) * 0.02)
        self.gate = nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, labels):
        b, n = input_ids.size(0), self.ctx.size(0)
        embeds = torch.cat([(self.gate * self.ctx).expand(b, -1, -1), self.lm.get_input_embeddings()(input_ids)], dim=1)
        labels = torch.cat([labels.new_full((b, n), -100), labels], dim=1)
        return self.lm(inputs_embeds=embeds, labels=labels)


def build_model():
    return GatedContext()


def make_inputs():
    ids = torch.randint(4, 96, (2, 10))
    return {"input_ids": ids, "labels": ids.clone()}


def make_optimizer(model):
    return torch.optim.AdamW([model.ctx, model.gate], lr=1e-2)


def train_step(model, batch, optimizer):
    out = model(**batch)
    optimizer.zero_grad()
    out.loss.backward()
    optimizer.step()
    return out.loss.item()
