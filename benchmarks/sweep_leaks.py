"""The sweep's plain-PyTorch ground truth of what a model's outputs see (benchmarks/sweep.py, --tools
check_dependencies, and diagnose, which runs the same check after its step), measured without gradprobe by changing
inputs and comparing outputs, as one would by hand:

  * future: for a model whose loss predicts the next token (a causal LM whose own loss is the next-token cross-entropy
    of its input ids; an encoder-decoder: its decoder's inputs, made from the labels as the model makes them), the
    tokens of the second half of every row are changed and the outputs of the first half compared;
  * examples: every input entry of row 1 is changed (other token ids, noise on floating inputs) and row 0's outputs
    compared;
  * packed: for a packed row (`position_ids` restarting, sweep.py --packed), each packed example is run alone (its
    tokens, its positions) and its outputs compared with those of its span of the packed row (here the shapes differ,
    so rounding does too: a change above 1e-4 of the largest magnitude; a model that keeps the examples apart differs
    by about 1e-7, one that does not by 1e-2 and more).

Both with the model in eval mode (dropout off, BatchNorm on its running statistics: BatchNorm's batch statistics
couple the examples by design, which gradprobe says as GP904, an info) and without gradient. A change above 1e-6 of
the output's largest magnitude is a dependency (unchanged rows compute bit for bit alike here: same shapes, same
kernels). The sweep measures it on the weights each tool measures: as built (check_dependencies) and after the plain
training step (diagnose's check runs after its observed step). On such a model a GP901/GP902 error is a true finding,
not a false one; a tool that ran its dependency check and said nothing missed it.
"""

from __future__ import annotations

from typing import Any

import torch

REL = 1e-6  # of the output's largest magnitude
TOKEN_KEYS = ("input_ids", "decoder_input_ids", "labels")  # the integer entries changed for another example


def _main_output(out: Any) -> torch.Tensor | None:
    """The per-position or per-example output: an HF output's logits, else its first floating tensor."""
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, torch.Tensor):
        return out
    values = list(out.values()) if isinstance(out, dict) else list(out) if isinstance(out, (tuple, list)) else []
    return next((v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() >= 2), None)


def _changed_ids(ids: torch.Tensor, low: int, high: int) -> torch.Tensor:
    """Other token ids in [low, high): each one moved by 7 within that range."""
    span = max(high - low, 2)
    return low + (ids - low + 7) % span


def _future_key(spec: dict, batch: dict) -> str | None:
    """The entry whose later positions are the future of the outputs: input_ids for a causal LM (labels = the ids),
    labels for an encoder-decoder (the decoder's inputs are the labels shifted right)."""
    labels = batch.get("labels")
    ids = batch.get("input_ids")
    if not isinstance(labels, torch.Tensor) or labels.dim() != 2 or labels.is_floating_point():
        return None
    same = isinstance(ids, torch.Tensor) and labels.shape == ids.shape and \
        bool(((labels == ids) | (labels == -100)).all()) and bool((labels != -100).any())
    if same and spec.get("task", "causal_lm") == "causal_lm":
        return "input_ids"
    if spec.get("task") in ("seq2seq", "speech_seq2seq") or (spec.get("family") == "peft" and spec.get("base") in ("t5", "bart")):
        return "labels"
    return None


def _shifted_loss(out: Any, logits: torch.Tensor, labels: torch.Tensor) -> bool:
    """Whether the model's own loss is the next-token cross-entropy of its logits (output t against label t+1), as a
    causal LM's is; a model whose loss reads label t at output t (XLNet's, XLM's LM heads) claims no causality. The
    labels sit at the last positions (a soft prompt's positions come first, labelled -100, as PEFT pads them)."""
    loss = getattr(out, "loss", None)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or logits.dim() != 3 or logits.shape[1] < labels.shape[1]:
        return False
    import torch.nn.functional as F

    full = torch.cat([labels.new_full((labels.shape[0], logits.shape[1] - labels.shape[1]), -100), labels], dim=1)
    shifted = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), full[:, 1:].reshape(-1),
                              ignore_index=-100)
    return abs(float(shifted) - float(loss)) <= 1e-3 * max(abs(float(loss)), 1e-6)


def _leak(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, float]:
    diff = float((a.float() - b.float()).abs().max()) if a.numel() else 0.0
    scale = max(float(a.float().abs().max()) if a.numel() else 0.0, 1e-12)
    return diff > REL * scale, diff / scale


def plain_dependencies(model: torch.nn.Module, batch: Any, spec: dict) -> dict:
    """{"future": bool | None, "examples": bool | None, and the relative differences}: None where not measured."""
    if not isinstance(batch, dict):
        return {"future": None, "examples": None, "why": "the batch is not a dict of the model's keyword arguments"}
    was = model.training
    model.eval()
    res: dict = {"future": None, "examples": None}
    try:
        with torch.no_grad():
            out = model(**batch)
            base = _main_output(out)
            if base is None:
                return {**res, "why": "no floating output"}
            key = _future_key(spec, batch)
            if key == "input_ids" and not _shifted_loss(out, base, batch["labels"]):
                key, res["why_no_future"] = None, "the model's loss is not the next-token cross-entropy (labels unshifted)"
            if key is not None and base.dim() >= 3:
                res.update(_future(model, batch, key, base))
            if base.shape[0] >= 2 and all(v.shape[:1] == base.shape[:1] for v in batch.values()
                                          if isinstance(v, torch.Tensor) and v.dim() >= 1):
                res.update(_examples(model, batch, base))
            if isinstance(batch.get("position_ids"), torch.Tensor) and base.dim() >= 3:
                res.update(_packed(model, batch, base))
    finally:
        model.train(was)
    return res


def _future(model: torch.nn.Module, batch: dict, key: str, base: torch.Tensor) -> dict:
    if key == "labels":  # an encoder-decoder: its decoder's inputs, made from the labels as the model makes them
        return _decoder_future(model, batch)
    t = batch[key].shape[1]
    half = t // 2
    changed = batch[key].clone()
    changed[:, half:] = _changed_ids(changed[:, half:], int(batch[key].min()), int(batch[key].max()) + 1)
    other = _main_output(model(**{**batch, key: changed}))
    if other is None or other.shape != base.shape:
        return {}
    leak, rel = _leak(base[:, :half], other[:, :half])  # output t reads inputs <= t
    return {"future": leak, "future_rel": rel}


def _decoder_future(model: torch.nn.Module, batch: dict) -> dict:
    """The decoder's output t against its inputs after t: the decoder inputs the model makes from the labels
    (`prepare_decoder_input_ids_from_labels`: shifted right; mBART's wraps the last token to the front, by design;
    without it, shifted right after the config's decoder start token as transformers' seq2seq forwards do), passed
    explicitly, their second half changed."""
    prepare = getattr(model, "prepare_decoder_input_ids_from_labels", None)
    dec = prepare(labels=batch["labels"]) if prepare is not None else _shift_right(model, batch["labels"])
    if not isinstance(dec, torch.Tensor) or dec.dim() != 2:
        return {}
    base = _main_output(model(**{**batch, "decoder_input_ids": dec}))
    half = dec.shape[1] // 2
    changed = dec.clone()
    changed[:, half:] = _changed_ids(changed[:, half:], int(batch["labels"].min()), int(batch["labels"].max()) + 1)
    other = _main_output(model(**{**batch, "decoder_input_ids": changed}))
    if base is None or other is None or other.shape != base.shape or base.dim() < 3:
        return {}
    leak, rel = _leak(base[:, :half], other[:, :half])
    return {"future": leak, "future_rel": rel}


def _shift_right(model: torch.nn.Module, labels: torch.Tensor) -> torch.Tensor:
    config = getattr(model, "config", None)
    start = getattr(config, "decoder_start_token_id", None)
    pad = getattr(config, "pad_token_id", None) or 0
    start = pad if start is None else start
    dec = torch.cat([labels.new_full((labels.shape[0], 1), int(start)), labels[:, :-1]], dim=1)
    return dec.masked_fill(dec == -100, int(pad))


def _examples(model: torch.nn.Module, batch: dict, base: torch.Tensor) -> dict:
    changed: dict = {k: batch[k] for k in batch}
    g = torch.Generator().manual_seed(3)
    for k, v in batch.items():
        if not isinstance(v, torch.Tensor) or v.dim() == 0:
            changed[k] = v
        elif v.is_floating_point():
            w = v.clone()
            w[1] = w[1] + torch.randn(w[1].shape, generator=g, dtype=w.dtype)
            changed[k] = w
        elif k in TOKEN_KEYS and v.dim() >= 2:
            w = v.clone()
            valid = v[1] >= 0  # labels' ignored positions stay ignored
            w[1][valid] = _changed_ids(v[1][valid], max(int(v[v >= 0].min()), 0) if bool((v >= 0).any()) else 0,
                                       int(v.max()) + 1)
            changed[k] = w
        else:
            changed[k] = v
    other = _main_output(model(**changed))
    if other is None or other.shape != base.shape:
        return {}
    leak, rel = _leak(base[0], other[0])
    return {"examples": leak, "examples_rel": rel}


PACKED_REL = 1e-4


def _packed(model: torch.nn.Module, batch: dict, base: torch.Tensor) -> dict:
    """Each packed example alone (its ids, its positions from 0) against its span of the packed row."""
    pos = batch["position_ids"]
    if pos.shape[0] != 1 or not bool((pos[0, 1:] == 0).any()):
        return {}
    starts = [0] + [int(i) + 1 for i in (pos[0, 1:] == 0).nonzero().flatten()] + [pos.shape[1]]
    worst = 0.0
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        alone = _main_output(model(input_ids=batch["input_ids"][:, a:b], position_ids=torch.arange(b - a)[None]))
        if alone is None or alone.shape[1] != b - a:
            return {}
        scale = max(float(alone.float().abs().max()), 1e-12)
        worst = max(worst, float((base[:, a:b].float() - alone.float()).abs().max()) / scale)
    return {"packed": worst > PACKED_REL, "packed_rel": worst}
