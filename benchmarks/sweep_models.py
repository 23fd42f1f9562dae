"""Healthy models for the ecosystem sweep, built from tiny configs (no weights are downloaded).

One spec (a JSON-ready dict) names a model; `build(spec)` returns what a gradprobe target's `setup`
defines: `model, inputs, loss_fn, make_optimizer`. The same function serves the ground truth
(`plain_step`, plain PyTorch, no gradprobe) and the gradprobe target (`benchmarks/sweep.py` puts
`from sweep_models import build` in the target's setup code), so both see the same model.

Shrinking is generic: every config of the transformers auto mappings is rebuilt with the keys it
has mapped to tiny values by what they mean (layer counts, widths, heads, vocabulary, positions,
image size), nested sub-configs included; nothing here names a model.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Collection
from typing import Any

import torch

SEQ = 16
BATCH = 2
VOCAB = 128
WIDTH = 32
HEADS = 2
FFN = 64
POSITIONS = 64
IMAGE = 32

# transformers tasks: mapping name, default input kind
HF_TASKS = {
    "causal_lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "masked_lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "seq_cls": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "token_cls": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "qa": "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
    "seq2seq": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "image_cls": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "segmentation": "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",
    "ctc": "MODEL_FOR_CTC_MAPPING_NAMES",
    "speech_seq2seq": "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
}

LAYERS = {"num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers", "num_decoder_layers",
          "num_encoder_layers", "num_hidden_groups_layers", "text_layers", "vision_layers", "num_blocks"}
WIDTHS = {"hidden_size", "d_model", "n_embd", "dim", "embed_dim", "embedding_size", "word_embed_proj_dim", "d_embed",
          "hidden_dim", "model_dim", "embedding_dim", "projection_dim", "encoder_hidden_size", "decoder_hidden_size"}
HEAD_KEYS = {"num_attention_heads", "n_head", "n_heads", "encoder_attention_heads", "decoder_attention_heads",
             "num_heads", "attention_heads", "num_attention_heads_per_layer"}
KV_HEADS = {"num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num", "num_key_value_groups"}
HEAD_DIMS = {"head_dim", "d_kv", "kv_channels", "attention_head_dim", "qk_rope_head_dim", "qk_nope_head_dim",
             "v_head_dim", "qk_head_dim"}
FFNS = {"intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner", "ffn_hidden_size",
        "moe_intermediate_size", "shared_expert_intermediate_size", "d_inner", "decoder_intermediate_size"}
EXPERTS = {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"}
POSITION_KEYS = {"max_position_embeddings", "n_positions", "max_source_positions", "max_target_positions", "n_ctx",
                 "max_seq_len", "max_sequence_length"}
WIDTH_LISTS = {"hidden_sizes", "conv_dim", "embed_dims", "embed_dim", "neck_hidden_sizes", "dims", "channels",
               "widths", "hidden_dims"}
DEPTH_LISTS = {"depths", "num_layers", "layers", "block_repeats", "num_blocks"}
HEAD_LISTS = {"num_heads", "num_attention_heads", "heads"}

_INT_CAPS: tuple[tuple[Collection[str], int, int], ...] = (
    (LAYERS, 2, 2), (WIDTHS, 64, WIDTH), (HEAD_KEYS, HEADS, HEADS), (KV_HEADS, HEADS, HEADS), (HEAD_DIMS, 16, 16),
    (FFNS, FFN, FFN), (EXPERTS, 4, 4), (("num_experts_per_tok", "moe_topk", "top_k"), 2, 2), (("vocab_size",), VOCAB, VOCAB),
    (POSITION_KEYS, POSITIONS, POSITIONS), (("image_size",), IMAGE, IMAGE),
)


def _shrink_value(key: str, value: Any, default_layers: int | None) -> Any:
    """The tiny value for one config key, or the sentinel NO_CHANGE."""
    if isinstance(value, bool) or value is None:
        return NO_CHANGE
    if isinstance(value, int):
        # the first (keys, above, tiny) that matches: a value over `above` becomes `tiny`
        for keys, above, tiny in _INT_CAPS:
            if key in keys and value > above:
                return tiny
        return NO_CHANGE  # token ids over the vocabulary are mapped afterwards, once all ids are known
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        if key == "image_size" and max(value) > IMAGE:
            return [IMAGE] * len(value)
        if key in DEPTH_LISTS:
            return [min(v, 1) for v in value]
        if key in WIDTH_LISTS:
            return [min(v, 16 * 2 ** min(i, 2)) for i, v in enumerate(value)]
        if key in HEAD_LISTS:
            return [min(v, HEADS) for v in value]
        if default_layers and len(value) == default_layers and key.endswith(("layers", "_ids", "indices")):
            return NO_CHANGE
    return NO_CHANGE


NO_CHANGE = object()


def shrink_overrides(defaults: dict, depth: int = 0) -> dict:
    """Overrides that make a config tiny: every key with a meaning in the tables above, nested configs too."""
    layers = next((v for k, v in defaults.items() if k in LAYERS and isinstance(v, int)), None)
    out: dict = {}
    for key, value in defaults.items():
        if isinstance(value, dict) and depth < 3 and ("model_type" in value or key.endswith("config")):
            sub = shrink_overrides(value, depth + 1)
            if sub:
                out[key] = {**value, **sub}
            continue
        new = _shrink_value(key, value, layers)
        if new is not NO_CHANGE:
            out[key] = new
    vocab = out.get("vocab_size", defaults.get("vocab_size"))
    if isinstance(vocab, int):
        free = iter(range(vocab - 1, 0, -1))
        for key, value in defaults.items():
            if key.endswith("_token_id") and isinstance(value, int) and value >= vocab:
                out[key] = next(free)
            elif key.endswith(("suppress_tokens", "_token_ids")) and isinstance(value, list) and value:
                out[key] = None
    return out


def tiny_config(config_class):
    defaults = config_class().to_dict()
    overrides = shrink_overrides(defaults)
    try:
        config = config_class(**overrides)
    except Exception:
        config = config_class()
        for k, v in overrides.items():
            if not isinstance(v, dict):
                setattr(config, k, v)
    config.num_labels = 3
    for sub in _sub_configs(config):
        if getattr(sub, "pad_token_id", None) is None and hasattr(sub, "vocab_size"):
            try:
                sub.pad_token_id = 0
            except Exception:
                pass
    if getattr(config, "pad_token_id", None) is None:
        try:
            config.pad_token_id = 0
        except Exception:
            pass
    if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", None) is None:
        try:
            config.decoder_start_token_id = config.pad_token_id
        except Exception:
            pass
    for name in ("use_cache",):
        try:
            setattr(config, name, False)
        except Exception:
            pass
    return config


def _sub_configs(config) -> list:
    from transformers import PretrainedConfig

    return [v for v in vars(config).values() if isinstance(v, PretrainedConfig)]


def _vocab(model) -> int:
    emb = None
    try:
        emb = model.get_input_embeddings()
    except Exception:
        pass
    n = getattr(emb, "num_embeddings", None)
    if isinstance(n, int):
        return n
    cfg = model.config
    try:
        cfg = cfg.get_text_config()
    except Exception:
        pass
    return int(getattr(cfg, "vocab_size", VOCAB) or VOCAB)


def _config_get(config, *names, default=None):
    for cfg in [config, *_sub_configs(config)]:
        for n in names:
            v = getattr(cfg, n, None)
            if v is not None:
                return v
    return default


def hf_inputs(task: str, model, variant: int) -> dict:
    """One batch for `task`; `variant` picks among the shapes a model family may need (the ground truth
    tries them in order and the sweep uses the first the model accepts)."""
    g = torch.Generator().manual_seed(1)
    config = model.config
    n_labels = int(getattr(config, "num_labels", 3) or 3)
    main = getattr(model, "main_input_name", "input_ids")
    seq = (SEQ, 32, 64, 8)[variant % 4] if main == "input_ids" else SEQ
    batch: dict = {}
    if main == "input_ids":
        vocab = _vocab(model)
        ids = torch.randint(3, max(vocab - 1, 4), (BATCH, seq), generator=g)
        batch["input_ids"] = ids
        batch["attention_mask"] = torch.ones_like(ids)
    elif main == "pixel_values":
        size = _config_get(config, "image_size", default=IMAGE)
        size = size[0] if isinstance(size, (list, tuple)) else size
        size = int(size) if variant % 2 == 0 else 64
        ch = int(_config_get(config, "num_channels", default=3))
        batch["pixel_values"] = torch.randn(BATCH, ch, size, size, generator=g)
    elif main == "input_values":
        batch["input_values"] = torch.randn(BATCH, (8000, 16000)[variant % 2], generator=g)
    elif main == "input_features":
        mels = _config_get(config, "num_mel_bins", "feature_size", default=80)
        src = _config_get(config, "max_source_positions", default=POSITIONS)
        feat = _config_get(config, "input_feat_per_channel", default=None)
        chans = _config_get(config, "input_channels", default=1)
        shapes = [(BATCH, int(mels), 2 * int(src))]
        if feat is not None:
            shapes.insert(0, (BATCH, 64, int(feat) * int(chans)))
        shapes.append((BATCH, 64, int(mels)))
        batch["input_features"] = torch.randn(*shapes[variant % len(shapes)], generator=g)
    else:
        raise ValueError(f"main input {main!r} has no generic batch")
    text_vocab = _vocab(model) if main == "input_ids" else int(_config_get(config, "vocab_size", default=VOCAB))
    if task in ("causal_lm", "masked_lm"):
        batch["labels"] = batch["input_ids"].clone()
    elif task in ("seq_cls", "image_cls"):
        batch["labels"] = torch.randint(0, n_labels, (BATCH,), generator=g)
    elif task == "token_cls":
        batch["labels"] = torch.randint(0, n_labels, (BATCH, seq), generator=g)
    elif task == "qa":
        batch["start_positions"] = torch.randint(0, seq, (BATCH,), generator=g)
        batch["end_positions"] = torch.randint(0, seq, (BATCH,), generator=g)
    elif task in ("seq2seq", "speech_seq2seq"):
        batch["labels"] = torch.randint(3, max(text_vocab - 1, 4), (BATCH, 8), generator=g)
    elif task == "segmentation":
        px = batch["pixel_values"]
        batch["labels"] = torch.randint(0, n_labels, (BATCH, px.shape[-2], px.shape[-1]), generator=g)
    elif task == "ctc":
        batch["labels"] = torch.randint(1, max(text_vocab - 1, 2), (BATCH, 4), generator=g)
    return batch


def out_loss(output, batch):
    return output.loss if hasattr(output, "loss") else output["loss"]


def adamw(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)


def build_hf(spec: dict):
    import transformers

    config_class = transformers.CONFIG_MAPPING[spec["model_type"]]
    model_class = getattr(transformers, spec["cls"])
    config = tiny_config(config_class)
    model = model_class(config)
    model.train()
    return model, hf_inputs(spec["task"], model, int(spec.get("variant", 0))), out_loss, adamw


# ---- PEFT ----------------------------------------------------------------------------------------

PEFT_BASES = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", "CAUSAL_LM", ["c_attn"], ["mlp.c_proj"]),
    "llama": ("LlamaConfig", "LlamaForCausalLM", "CAUSAL_LM", ["q_proj", "v_proj"], ["down_proj"]),
    "t5": ("T5Config", "T5ForConditionalGeneration", "SEQ_2_SEQ_LM", ["q", "v"], ["wo"]),
    "bart": ("BartConfig", "BartForConditionalGeneration", "SEQ_2_SEQ_LM", ["q_proj", "v_proj"], ["fc2"]),
}
LORA_VARIANTS = {
    "dora": {"use_dora": True},
    "rslora": {"use_rslora": True},
    "checkpointing": {},
}


def peft_config(method: str, base: str, model):
    import dataclasses

    import peft

    _, _, task, targets, ff = PEFT_BASES[base]
    kind = method.split("+")[0]
    config_class = peft.PEFT_TYPE_TO_CONFIG_MAPPING[peft.PeftType[kind]]
    fields = {f.name for f in dataclasses.fields(config_class)}
    kwargs: dict = {"task_type": task}
    if "num_virtual_tokens" in fields:
        kwargs["num_virtual_tokens"] = 4
    if "target_modules" in fields:
        kwargs["target_modules"] = targets
    if "feedforward_modules" in fields:
        kwargs["feedforward_modules"] = ff
    if "r" in fields:
        kwargs["r"] = 4
    if "total_step" in fields:
        kwargs["total_step"] = 10
    if "num_tasks" in fields:
        kwargs["num_tasks"] = 2
    if "encoder_hidden_size" in fields:
        kwargs["encoder_hidden_size"] = 32
    if "adapter_len" in fields:
        kwargs["adapter_len"] = 4
    if "adapter_layers" in fields:
        kwargs["adapter_layers"] = 1
    if kind == "CPT":
        kwargs.pop("num_virtual_tokens", None)
        kwargs["cpt_token_ids"] = [5, 6, 7, 8]
        kwargs["cpt_mask"] = [1, 1, 1, 1]
        kwargs["cpt_tokens_type_mask"] = [1, 2, 3, 4]  # template, input, output template, output (the label)
    if kind == "TRAINABLE_TOKENS":
        kwargs.pop("target_modules", None)
        kwargs["token_indices"] = [3, 4, 5]
    if "+" in method:
        kwargs.update(LORA_VARIANTS[method.split("+")[1]])
    kwargs = {k: v for k, v in kwargs.items() if k in fields}
    return config_class(**kwargs)


def build_peft(spec: dict):
    import peft
    import transformers

    cfg_name, cls_name, task, _, _ = PEFT_BASES[spec["base"]]
    config_class = getattr(transformers, cfg_name)
    config = tiny_config(config_class)
    base = getattr(transformers, cls_name)(config)
    if spec["method"].endswith("+checkpointing"):
        base.gradient_checkpointing_enable()
    model = peft.get_peft_model(base, peft_config(spec["method"], spec["base"], base))
    model.train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(10, VOCAB - 1, (BATCH, SEQ), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if task == "CAUSAL_LM":
        batch["labels"] = ids.clone()
    else:
        batch["labels"] = torch.randint(10, VOCAB - 1, (BATCH, 8), generator=g)
    if spec["method"].split("+")[0] in ("MULTITASK_PROMPT_TUNING", "POLY"):
        batch["task_ids"] = torch.tensor([0, 1])
    return model, batch, out_loss, adamw


# ---- diffusers -----------------------------------------------------------------------------------

class DenoisingLoss:
    """MSE between the predicted and the added noise (the standard diffusion training objective)."""

    def __call__(self, output, batch):
        pred = output.sample if hasattr(output, "sample") else output[0]
        return torch.nn.functional.mse_loss(pred, batch["__target__"])


def build_diffusers(spec: dict):
    import diffusers

    g = torch.Generator().manual_seed(1)
    name = spec["cls"]
    if name == "UNet2DModel":
        model = diffusers.UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
                                      block_out_channels=(32, 64), norm_num_groups=8,
                                      down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                                      up_block_types=("AttnUpBlock2D", "UpBlock2D"))
        x = torch.randn(BATCH, 3, 16, 16, generator=g)
        batch = {"sample": x, "timestep": torch.tensor([10, 500])}
    elif name == "UNet2DConditionModel":
        model = diffusers.UNet2DConditionModel(sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
                                               block_out_channels=(32, 64), norm_num_groups=8, cross_attention_dim=32,
                                               attention_head_dim=8,
                                               down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                               up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))
        x = torch.randn(BATCH, 4, 16, 16, generator=g)
        batch = {"sample": x, "timestep": torch.tensor([10, 500]),
                 "encoder_hidden_states": torch.randn(BATCH, 8, 32, generator=g)}
    elif name == "AutoencoderKL":
        model = diffusers.AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(32, 64), latent_channels=4,
                                        norm_num_groups=8, layers_per_block=1,
                                        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
                                        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"))
        x = torch.randn(BATCH, 3, 16, 16, generator=g)
        batch = {"sample": x}
    else:
        raise ValueError(name)
    model.train()
    target = torch.randn(x.shape, generator=g) if name != "AutoencoderKL" else x.clone()
    return model, DiffusersBatch(batch, target), DenoisingLoss(), adamw


class DiffusersBatch(dict):
    """The model's keyword arguments; the denoising target rides along under a key the forward never sees."""

    def __init__(self, kwargs: dict, target: torch.Tensor):
        super().__init__(kwargs)
        self.target = target

    def __getitem__(self, key):
        if key == "__target__":
            return self.target
        return super().__getitem__(key)


def build(spec: dict):
    """model, inputs, loss_fn, make_optimizer for one spec; with `warm`, one full training step has already run
    (a model diagnosed mid-training)."""
    torch.manual_seed(0)
    family = spec["family"]
    if family in ("transformers", "midtrain"):
        model, batch, loss_fn, make_opt = build_hf(spec)
    elif family == "peft":
        model, batch, loss_fn, make_opt = build_peft(spec)
    elif family == "diffusers":
        model, batch, loss_fn, make_opt = build_diffusers(spec)
    else:
        raise ValueError(family)
    if spec.get("packed"):
        batch = pack_batch(batch)
    if spec.get("warm"):
        opt = make_opt(model)
        loss = loss_fn(model(**batch), batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model, batch, loss_fn, make_opt


def micro_batch(batch, i: int, k: int):
    """The i-th of k micro-batches of a batch: every tensor that leads with the batch's size cut along dim 0 (a
    diffusion batch keeps its target alongside)."""
    sizes = [v.shape[0] for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() >= 1]
    n = max(sizes) if sizes else 1

    def cut(v):
        return v[i * n // k:(i + 1) * n // k] if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == n else v

    part = {key: cut(v) for key, v in batch.items()}
    return DiffusersBatch(part, cut(batch.target)) if isinstance(batch, DiffusersBatch) else part


def accumulation_step(loss_fn, k: int = 2):
    """A train_step that accumulates k micro-batches, each loss divided by k, one optimizer step: healthy by design
    (the mean of k equal parts' means is the whole batch's mean), what check_equivalence's accumulation comparison
    measures against one batch (sweep.py --wrap accum2)."""

    def train_step(model, batch, optimizer):
        optimizer.zero_grad()
        for i in range(k):
            micro = micro_batch(batch, i, k)
            loss = loss_fn(model(**micro), micro) / k
            loss.backward()
        optimizer.step()
        return loss

    return train_step


def pack_batch(batch: dict) -> dict:
    """The batch's rows as one packed row, as transformers' DataCollatorWithFlattening returns them: the tokens of all
    rows in one row cut into three examples of different lengths, `position_ids` restarting at 0 for each, labels -100
    at each example's first token, no attention_mask (the packed-sequence mask comes from the position ids)."""
    ids = batch["input_ids"].reshape(-1)
    n = ids.numel()
    lengths = [n * 13 // 32, n * 11 // 32]
    lengths.append(n - sum(lengths))
    labels = ids.clone()
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    labels[starts] = -100
    positions = torch.cat([torch.arange(k) for k in lengths])
    return {"input_ids": ids[None], "position_ids": positions[None], "labels": labels[None]}


# ---- ground truth (plain PyTorch, no gradprobe) -----------------------------------------------------

def plain_step(spec: dict, build_timeout_s: float = 15.0) -> dict:
    """Build and train one step in plain PyTorch: does the model train, and which gradients are None/zero."""
    import signal

    def _late(signum, frame):
        raise TimeoutError(f"building took more than {build_timeout_s:g} s")

    t0 = time.perf_counter()
    old = signal.signal(signal.SIGALRM, _late)
    signal.alarm(int(build_timeout_s))
    try:
        model, batch, loss_fn, make_opt = build(spec)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    built_s = time.perf_counter() - t0
    seen_before = _plain_dependencies(model, batch, spec)  # what the outputs see, as built and after the step
    opt = make_opt(model)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    before = {n: p.detach().clone() for n, p in named}
    t1 = time.perf_counter()
    out = model(**batch)
    loss = loss_fn(out, batch)
    loss.backward()
    opt.step()
    step_s = time.perf_counter() - t1
    none = [n for n, p in named if p.grad is None]
    zero = [n for n, p in named if p.grad is not None and not bool(p.grad.any())]
    nonfinite = [n for n, p in named if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
    moved = [n for n, p in named if not torch.equal(before[n], p.detach())]
    stuck = [n for n, p in named if p.grad is not None and bool(p.grad.any()) and n not in set(moved)]
    finite = bool(torch.isfinite(loss.detach()).all()) and loss.numel() == 1
    trains = finite and not nonfinite and bool(moved) and not stuck
    why = "" if trains else ("loss not finite" if not finite else "non-finite gradients" if nonfinite
                             else "no parameter moved" if not moved
                             else f"{len(stuck)} parameter(s) with a gradient did not move")
    return {"trains": trains, "why": why, "loss": float(loss.detach()) if finite else None, "build_s": built_s,
            "step_s": step_s, "trainable": len(named), "grad_none": none, "grad_zero": zero, "moved": len(moved),
            "params": sum(p.numel() for _, p in named),
            "sees": {"built": seen_before, "after_step": _plain_dependencies(model, batch, spec)}}


def _plain_dependencies(model, batch, spec: dict) -> dict:
    """sweep_leaks.plain_dependencies, its own failure said (never the model's verdict)."""
    from sweep_leaks import plain_dependencies

    try:
        return plain_dependencies(model, batch, spec)
    except Exception as exc:
        return {"future": None, "examples": None, "why": f"{type(exc).__name__}: {str(exc)[:200]}"}


def import_family(family: str) -> str | None:
    """None when the family's library imports, else the reason to skip it."""
    mods = {"transformers": ["transformers"], "peft": ["transformers", "peft"], "diffusers": ["diffusers"],
            "timm": ["timm"], "torchvision": ["torchvision"]}[family]
    for m in mods:
        try:
            importlib.import_module(m)
        except Exception as exc:
            return f"import {m} failed: {type(exc).__name__}: {str(exc)[:200]}"
    return None

