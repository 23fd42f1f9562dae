"""The base model was never frozen: everything trains beside the prompt."""
import torch
import torch.nn as nn
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_lm():
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, vocab_size=96, max_position_embeddings=64)
    return LlamaForCausalLM(cfg)

EXPECT = {"tool": "verify_prompt_tuning", "codes": ["GP503"], "culprits": ["lm.model.layers.0.mlp.up_proj.weight"], "severity": "warning", "line": 43}


class SoftPrompt(nn.Module):
    def __init__(self, n_prompt=4):
        super().__init__()
        self.lm = tiny_lm()
        d = self.lm.get_input_embeddings().weight.shape[1]
        self.prompt = nn.Parameter(torch.randn(n_prompt, d) * 0.02)

    def forward(self, input_ids, attention_mask, labels):
        b, n = input_ids.size(0), self.prompt.size(0)
        embeds = torch.cat([self.prompt.unsqueeze(0).expand(b, -1, -1), self.lm.get_input_embeddings()(input_ids)], dim=1)
        attention_mask = torch.cat([attention_mask.new_ones(b, n), attention_mask], dim=1)
        labels = torch.cat([labels.new_full((b, n), -100), labels], dim=1)
        return self.lm(inputs_embeds=embeds, attention_mask=attention_mask, labels=labels)


def build_model():
    return SoftPrompt()


def make_inputs():
    input_ids = torch.randint(4, 96, (2, 10))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 8:] = 0
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def make_optimizer(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)


def train_step(model, batch, optimizer):
    out = model(**batch)
    optimizer.zero_grad()
    out.loss.backward()
    optimizer.step()
    return out.loss.item()
