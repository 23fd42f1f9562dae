"""P-tuning of a frozen GPT-2 for answer-word prediction: prompt vectors reparameterised by an MLP."""

import copy  # noqa: F401 (used by the bench's module_replaced mutants)
import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

N_PROMPT = 4
VOCAB = 64


class PTuningLM(nn.Module):
    def __init__(self, config, n_prompt=N_PROMPT, hidden=48):
        super().__init__()
        self.lm = GPT2LMHeadModel(config)
        for p in self.lm.parameters():
            p.requires_grad = False
        self.prompt_embeddings = nn.Embedding(n_prompt, config.n_embd)
        self.prompt_encoder = nn.Sequential(
            nn.Linear(config.n_embd, hidden), nn.ReLU(), nn.Linear(hidden, config.n_embd)
        )
        self.register_buffer("prompt_ids", torch.arange(n_prompt), persistent=False)

    def forward(self, input_ids, attention_mask):
        b = input_ids.size(0)
        prompt = self.prompt_encoder(self.prompt_embeddings(self.prompt_ids))
        tokens = self.lm.get_input_embeddings()(input_ids)
        inputs_embeds = torch.cat([prompt.unsqueeze(0).expand(b, -1, -1), tokens], dim=1)
        attention_mask = torch.cat([attention_mask.new_ones(b, prompt.size(0)), attention_mask], dim=1)
        logits = self.lm(inputs_embeds=inputs_embeds, attention_mask=attention_mask).logits[:, -1]
        return logits


def build_model():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=32,
                        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = PTuningLM(config)
    return model


def make_inputs():
    input_ids = torch.randint(3, VOCAB, (4, 8))
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
            "answer": torch.randint(3, VOCAB, (4,))}


def loss_fn(logits, batch):
    loss = F.cross_entropy(logits, batch["answer"])
    return loss


def make_optimizer(model):
    optimizer = torch.optim.AdamW([
        model.prompt_embeddings.weight,
        *model.prompt_encoder.parameters(),
    ], lr=1e-3)
    return optimizer


def train_step(model, batch, optimizer):
    model.train()
    logits = model(batch["input_ids"], batch["attention_mask"])
    loss = loss_fn(logits, batch)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
