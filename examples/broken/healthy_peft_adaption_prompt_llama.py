"""Healthy: PEFT's adaption prompt (LLaMA-Adapter, https://github.com/huggingface/peft/pull/268) on a tiny Llama.

The adaption prompts are attended to through a gate initialised at zero, so at the first step they get an
exactly-zero gradient while the gate gets one: by design, at most an info.
"""
import torch
from peft import AdaptionPromptConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

EXPECT = {"tool": "diagnose", "codes": ["GP306"], "culprits": ["adaption_prompt"], "severity": "info", "healthy": True,
          "absent": ["GP501"]}


def build_model():
    # LlamaForCausalLM.from_pretrained(...) in a real run; a tiny random config here
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, vocab_size=96, max_position_embeddings=64)
    return get_peft_model(LlamaForCausalLM(cfg), AdaptionPromptConfig(adapter_len=4, adapter_layers=1, task_type="CAUSAL_LM"))


def make_inputs():
    ids = torch.randint(4, 96, (2, 10))
    return {"input_ids": ids, "labels": ids.clone()}


def make_optimizer(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)


def train_step(model, batch, optimizer):
    out = model(**batch)
    optimizer.zero_grad()
    out.loss.backward()
    optimizer.step()
    return out.loss.item()
