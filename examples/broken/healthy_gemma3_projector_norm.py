"""Healthy: a Gemma-3 vision-language model trained on a text-only batch; the multimodal projector's norm
`mm_soft_emb_norm` gets no gradient because no image was in the batch, and it is no soft prompt.

From the ecosystem sweep (gradprobe issue 27, item 6): four healthy Gemma-3 models got a GP501 error
("the prompt gets no gradient") on `multi_modal_projector.mm_soft_emb_norm.weight`, only because its name
holds `soft_emb`. The projector norms image features computed from `pixel_values` and the library writes
them into the embeddings (Gemma3MultiModalProjector, quoted in https://github.com/tenstorrent/tt-metal/issues/22821):
values made from the batch, placed by library code, are no prompt; a prompt is found by what the code does with it.
"""
import torch
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig, SiglipVisionConfig

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True, "absent": ["GP501", "GP503", "GP508"]}


def build_model():
    # Gemma3ForConditionalGeneration.from_pretrained("google/gemma-3-4b-it") in the real run; a tiny random config here
    text = Gemma3TextConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=16, max_position_embeddings=64, sliding_window=16)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=32, patch_size=8)
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=90,
                       boi_token_index=91, eoi_token_index=92)
    return Gemma3ForConditionalGeneration(cfg)


def make_inputs():
    ids = torch.randint(3, 80, (2, 12))  # a text-only batch: no image token, no pixel_values
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-4)


def train_step(model, batch, optimizer):
    out = model(**batch)
    optimizer.zero_grad()
    out.loss.backward()
    optimizer.step()
    return out.loss.item()
