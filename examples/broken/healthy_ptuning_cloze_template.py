"""Healthy: THUDM-style P-tuning of a masked LM. An LSTM prompt encoder's vectors replace pseudo tokens at template
slots around the subject ([CLS] p p p subject p p p [MASK] p p p [SEP]); only the [MASK] position is labelled."""
import torch
import torch.nn as nn
from transformers import BertConfig, BertForMaskedLM

EXPECT = {"tool": "verify_prompt_tuning", "codes": [], "culprits": [], "healthy": True}
CLS, SEP, MASK, PSEUDO = 1, 2, 3, 4
TEMPLATE = (3, 3, 3)


class PromptEncoder(nn.Module):
    def __init__(self, n, hidden):
        super().__init__()
        self.embedding = nn.Embedding(n, hidden)
        self.lstm = nn.LSTM(hidden, hidden // 2, batch_first=True, bidirectional=True)
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden))

    def forward(self):
        seq = self.embedding.weight.unsqueeze(0)
        return self.mlp(self.lstm(seq)[0]).squeeze(0)


class PTuneMLM(nn.Module):
    def __init__(self):
        super().__init__()
        # BertForMaskedLM.from_pretrained("bert-base-cased") in a real run; random weights here
        self.mlm = BertForMaskedLM(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                              intermediate_size=64, vocab_size=100, max_position_embeddings=64))
        self.mlm.requires_grad_(False)
        self.prompt_encoder = PromptEncoder(sum(TEMPLATE), 32)

    def forward(self, input_ids, attention_mask, labels):
        raw_embeds = self.mlm.get_input_embeddings()(input_ids)
        replace = self.prompt_encoder()
        slots = (input_ids == PSEUDO).nonzero().reshape(input_ids.size(0), sum(TEMPLATE), 2)[:, :, 1]
        for b in range(input_ids.size(0)):
            for i in range(sum(TEMPLATE)):
                raw_embeds[b, slots[b, i], :] = replace[i, :]
        return self.mlm(inputs_embeds=raw_embeds, attention_mask=attention_mask, labels=labels)


def cloze(subject, answer):
    a, b, c = TEMPLATE
    ids = [CLS] + [PSEUDO] * a + [subject] + [PSEUDO] * b + [MASK] + [PSEUDO] * c + [SEP]
    labels = [-100] * len(ids)
    labels[ids.index(MASK)] = answer
    return ids, labels


def build_model():
    return PTuneMLM()


def make_inputs():
    pairs = [cloze(s, a) for s, a in [(17, 40), (23, 51)]]
    input_ids = torch.tensor([p[0] for p in pairs])
    labels = torch.tensor([p[1] for p in pairs])
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}


def make_optimizer(model):
    return torch.optim.Adam(model.prompt_encoder.parameters(), lr=1e-3)


def train_step(model, batch, optimizer):
    out = model(**batch)
    optimizer.zero_grad()
    out.loss.backward()
    optimizer.step()
    return out.loss.item()
