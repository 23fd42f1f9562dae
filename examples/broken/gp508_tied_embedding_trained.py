"""The prompt is trained together with GPT-2's input embedding, which is tied to the head."""
import torch
import torch.nn as nn
from transformers import GPT2Config, GPT2LMHeadModel


def tiny_lm():
    # GPT2LMHeadModel.from_pretrained("gpt2") in a real run; random weights here
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=96, n_positions=64))

EXPECT = {"tool": "verify_prompt_tuning", "codes": ["GP508"], "culprits": ["lm.transformer.wte.weight"], "severity": "warning"}


class SoftPrompt(nn.Module):
    def __init__(self, n_prompt=4):
        super().__init__()
        self.lm = tiny_lm()
        self.lm.requires_grad_(False)
        self.lm.get_input_embeddings().requires_grad_(True)
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
