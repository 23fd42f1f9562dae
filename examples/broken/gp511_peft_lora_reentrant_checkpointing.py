"""PEFT LoRA on a tiny Llama with reentrant gradient checkpointing and the input-grad hook removed:
the adapters inside the checkpointed layers get no gradient."""
import torch
from peft import LoraConfig, TaskType, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

EXPECT = {"tool": "verify_prompt_tuning", "codes": ["GP511"], "culprits": ["base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"]}


def build_model():
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, vocab_size=96, max_position_embeddings=64)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(task_type=TaskType.CAUSAL_LM, r=4, target_modules=["q_proj", "v_proj"]))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.base_model.model.disable_input_require_grads()  # "we don't train the embeddings, so no input grads"
    return model


def make_inputs():
    input_ids = torch.randint(4, 96, (2, 10))
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": input_ids.clone()}


def make_optimizer(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)


def train_step(model, batch, optimizer):
    model.train()
    out = model(**batch)
    optimizer.zero_grad()
    out.loss.backward()
    optimizer.step()
    return out.loss.item()
