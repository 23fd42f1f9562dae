"""Training the prompt on generate() scores (OPT)."""
import torch
import torch.nn as nn
from transformers import OPTConfig, OPTForCausalLM


def tiny_lm():
    cfg = OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=2, vocab_size=96,
                    max_position_embeddings=64, word_embed_proj_dim=32)
    return OPTForCausalLM(cfg)

EXPECT = {"tool": "verify_prompt_tuning", "codes": ["GP505", "GP303"], "culprits": ["prompt"], "line": 27}


class SoftPrompt(nn.Module):
    def __init__(self, n_prompt=4):
        super().__init__()
        self.lm = tiny_lm()
        self.lm.requires_grad_(False)
        d = self.lm.get_input_embeddings().weight.shape[1]
        self.prompt = nn.Parameter(torch.randn(n_prompt, d) * 0.02)

    def forward(self, input_ids, attention_mask, labels):
        b, n = input_ids.size(0), self.prompt.size(0)
        embeds = torch.cat([self.prompt.unsqueeze(0).expand(b, -1, -1), self.lm.get_input_embeddings()(input_ids)], dim=1)
        mask = torch.cat([attention_mask.new_ones(b, n), attention_mask], dim=1)
        out = self.lm.generate(inputs_embeds=embeds, attention_mask=mask, max_new_tokens=2, do_sample=False,
                               output_scores=True, return_dict_in_generate=True)
        return torch.stack(out.scores, dim=1)


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


def loss_fn(scores, batch):  # noqa: F811
    return torch.nn.functional.cross_entropy(scores.flatten(0, 1), batch["input_ids"][:, :2].flatten())


def train_step(model, batch, optimizer):  # noqa: F811
    loss = loss_fn(model(**batch), batch)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
