"""PEFT prompt tuning on a tiny Llama whose optimizer was built before get_peft_model."""
import torch
from peft import PromptTuningConfig, TaskType, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

EXPECT = {"tool": "verify_prompt_tuning", "codes": ["GP504", "GP201", "GP202"], "culprits": ["prompt_encoder.default.embedding.weight"]}


def build_model():
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, vocab_size=96, max_position_embeddings=64)
    base = LlamaForCausalLM(cfg)
    model = get_peft_model(base, PromptTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=4))
    model.optimizer = torch.optim.AdamW(base.lm_head.parameters(), lr=1e-3)  # meant: the prompt encoder
    return model


def make_inputs():
    input_ids = torch.randint(4, 96, (2, 10))
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": input_ids.clone()}


def make_optimizer(model):
    return model.optimizer


def train_step(model, batch, optimizer):
    out = model(**batch)
    optimizer.zero_grad()
    out.loss.backward()
    optimizer.step()
    return out.loss.item()
