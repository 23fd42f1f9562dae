"""Packed vs padded (GP803): a padding-free batch against the same examples padded, one per row, same weights.

The packed batch's rows are split where its examples part (segments told by the batch's own values:
checks/dependencies/segments.py), each example becomes one row of a padded batch (per-token entries sliced and padded:
the token ids with a valid id, other integer entries with -100, position ids counted again from 0, a 0/1 mask that
keeps the real tokens; entries that describe the packing, cumulative lengths, segment ids or a block mask, left out),
and the model runs both batches with dropout off: loss and every trainable parameter's gradient are compared (relative
error, cosine) with tolerances from the parameters' dtype. Where they part is measured too: the first repeated module
whose output differs on the real tokens, else the loss itself (a target across the boundary of two examples).

Contract (shared with the equivalence engine): `run(loaded, options) -> {"applies", "why_not", "findings", "verified",
"not_run", "facts"}`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from gradprobe.checks.core.step import backward_grads, call_model, compute_loss, param_names
from gradprobe.checks.dependencies.claims import ce_targets
from gradprobe.checks.dependencies.explain import _kwargs, accepts, blocks_of
from gradprobe.checks.core.torchcompat import checkpoints_run_plainly
from gradprobe.checks.dependencies.harness import ProbeMode, outputs_of, untouched
from gradprobe.checks.dependencies.segments import Segments, restarting_positions
from gradprobe.findings import Rule

NO_PACKED_ROWS = "the batch has no packed rows"
# (loss relative error, gradient relative error, cosine at least) by the dtype the parameters compute in
TOLERANCES = {torch.float64: (1e-9, 1e-7, 1 - 1e-10), torch.float32: (1e-4, 2e-3, 0.9999),
              torch.bfloat16: (3e-2, 8e-2, 0.99), torch.float16: (1e-2, 3e-2, 0.995)}


@dataclass
class Side:
    loss: float
    grads: dict[str, torch.Tensor]
    logits: torch.Tensor | None
    blocks: dict[str, torch.Tensor]
    loss_grad: torch.Tensor | None = None


@dataclass
class PackedFacts:
    examples: int
    rows: int
    how: str
    loss_packed: float
    loss_padded: float
    loss_rel: float
    worst: str | None  # the parameter whose gradient differs most
    worst_rel: float
    worst_cos: float
    compared: int
    tolerance: tuple[float, float, float]
    parted_at: str | None = None  # the first module whose output differs on the real tokens
    boundary_targets: int = 0  # positions trained to predict the first token of the next packed example
    location: dict | None = None

    @property
    def differs(self) -> bool:
        loss_tol, grad_tol, cos_tol = self.tolerance
        return self.loss_rel > loss_tol or self.worst_rel > grad_tol or self.worst_cos < cos_tol


GP803: Rule[PackedFacts] = Rule(
    code="GP803", name="packed-differs-from-padded", severity="error", rank=20,
    summary="The packed (padding-free) batch gives another loss or other gradients than the same examples padded, one "
            "per row, at the same weights.",
    why="Packing several examples into one row is only an optimisation: the loss and the gradients must be those of "
        "the same examples padded. When the attention lets packed examples see each other (the position ids or "
        "cu_seqlens ignored, an all-ones mask), or the labels train the last token of one example to predict the first "
        "token of the next, packing changes what is learned, silently.",
    example="collator = DataCollatorWithFlattening()      # position_ids restart, labels separated\n"
            "model(**batch)                              # config.use_cache=True: the packed rows are one sequence",
    message="The packed batch ({examples} examples in {rows} row(s), {how}) and the same examples padded one per row "
            "differ at the same weights: loss {lp:.6g} vs {lq:.6g} (relative error {lrel:.2e}); the gradient of `{worst}` "
            "has relative error {grel:.2e}, cosine {cos:.6f} ({compared} gradients compared, tolerance for {dtype}: "
            "{gtol:.0e}){where}.",
    fix="Make the packed path equal to the padded one: keep the packed examples apart in attention (position ids that "
        "restart and no all-ones 2-D attention_mask, use_cache=False, or an attention that reads cu_seqlens) and "
        "separate their labels (the first label of each example -100, as DataCollatorWithFlattening does).",
)


@GP803.detector
def detect_packed_differs(f: PackedFacts) -> Any:
    if not f.differs:
        return
    where = ""
    if f.parted_at:
        where = f"; they part at `{f.parted_at}`, the first module whose output differs on the real tokens"
    elif f.boundary_targets:
        where = (f"; the model's outputs agree, the loss does not: {f.boundary_targets} position(s) at the end of a packed "
                 "example are trained to predict the first token of the next one (labels with no separator)")
    dtype = {v: k for k, v in TOLERANCES.items()}.get(f.tolerance, "float32")
    yield GP803.finding(location=f.location,
                        evidence={"loss_packed": f.loss_packed, "loss_padded": f.loss_padded, "loss_relative_error": f.loss_rel,
                                  "worst_parameter": f.worst, "gradient_relative_error": f.worst_rel,
                                  "gradient_cosine": f.worst_cos, "first_module_differing": f.parted_at,
                                  "targets_across_examples": f.boundary_targets},
                        examples=f.examples, rows=f.rows, how=f.how,
                        lp=f.loss_packed, lq=f.loss_padded, lrel=f.loss_rel, worst=f.worst or "-", grel=f.worst_rel,
                        cos=f.worst_cos, compared=f.compared, dtype=str(dtype).replace("torch.", ""), gtol=f.tolerance[1],
                        where=where)


def _per_token(t: torch.Tensor, B: int, T: int) -> bool:
    return t.dim() >= 2 and t.shape[1] == T and t.shape[0] in (1, B)


def _pad_rows(t: torch.Tensor, seg: Segments, L: int, fill: float | int) -> torch.Tensor:
    B = seg.ids.shape[0]
    t = t.expand(B, *t.shape[1:])
    rows = []
    for b, spans in enumerate(seg.spans):
        for s, e in spans:
            piece = t[b, s:e]
            pad = piece.new_full((L - (e - s), *piece.shape[1:]), fill)
            rows.append(torch.cat([piece, pad]))
    return torch.stack(rows)


def _describes_packing(t: torch.Tensor, seg: Segments, B: int, T: int) -> bool:
    """Cumulative lengths, segment ids, a block mask: what tells the packing apart (left out of the padded batch)."""
    if t.dim() == 1 and not t.is_floating_point() and t.numel() >= 2 and int(t[0]) == 0 and int(t[-1]) == B * T:
        return True
    return t.dim() in (3, 4) and t.shape[-1] == T and t.shape[-2] == T


def _padded_entry(t: torch.Tensor, seg: Segments, tokens: torch.Tensor | None, keep: torch.Tensor) -> torch.Tensor:
    B, T = seg.ids.shape
    L = keep.shape[1]
    if tokens is not None and (t is tokens or (t.shape == tokens.shape and torch.equal(t, tokens))):
        return _pad_rows(t, seg, L, int(t.reshape(-1)[0]))
    if not t.is_floating_point() and t.dim() == 2:
        if restarting_positions(t.expand(B, T), None) is not None:
            return torch.arange(L).expand(keep.shape[0], L).clone().to(t.device)
        if bool((t == 1).all()):
            return keep.to(device=t.device, dtype=t.dtype)
    return _pad_rows(t, seg, L, -100 if not t.is_floating_point() else 0.0)


def padded_batch(batch: Any, seg: Segments, tokens: torch.Tensor | None, model: nn.Module, causal: bool = False) -> Any:
    """The same examples padded, one per row (see the module's docstring); None when the batch's per-token tensors are
    positional, or the model takes no mask to pad with and is not known to be causal (a causal model never reads the
    padding after a row's last token, so it needs no mask)."""
    kw = _kwargs(batch)
    B, T = seg.ids.shape
    if kw is None or (isinstance(batch, tuple) and any(isinstance(a, torch.Tensor) and _per_token(a, B, T)
                                                       for a in batch[0])):
        return None
    lengths = [e - s for spans in seg.spans for s, e in spans]
    keep = torch.stack([torch.arange(max(lengths)) < n for n in lengths]).long()
    out: dict[str, Any] = {}
    has_mask = False
    for key, v in kw.items():
        if not isinstance(v, torch.Tensor):
            out[key] = v
        elif _describes_packing(v, seg, B, T):
            continue
        elif _per_token(v, B, T):
            out[key] = _padded_entry(v, seg, tokens, keep)
            has_mask = has_mask or (not v.is_floating_point() and v.dim() == 2 and bool((v == 1).all()))
        else:
            out[key] = v
    if not has_mask:
        if not accepts(model, "attention_mask"):
            return out if causal and isinstance(batch, dict) else (batch[0], out) if causal else None
        out["attention_mask"] = keep.to(next((v.device for v in kw.values() if isinstance(v, torch.Tensor)),
                                             torch.device("cpu")))
    return out if isinstance(batch, dict) else (batch[0], out)


def _side(model: nn.Module, batch: Any, loss_fn: Any, user: Any, params: list[tuple[str, nn.Parameter]]) -> Side:
    blocks = blocks_of(model)
    outputs: dict[str, torch.Tensor] = {}
    handles = [model.get_submodule(n).register_forward_hook(
        lambda m, a, o, _n=n: outputs.setdefault(_n, (o[0] if isinstance(o, (tuple, list)) else o)))
        for n in blocks]
    try:
        with torch.enable_grad(), untouched(model):
            with ProbeMode(user, leaves=False), checkpoints_run_plainly():  # the changed forward is the one read
                out = call_model(model, batch)
                loss = compute_loss(loss_fn, out, batch)
            if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad):
                raise ValueError("no scalar loss that requires grad")
            outs = outputs_of(out)
            logits = max(outs, key=lambda o: o.dim()) if outs else None
            lg = torch.autograd.grad(loss, logits, retain_graph=True, allow_unused=True)[0] if logits is not None else None
            grads = backward_grads(loss, [p for _, p in params])
    finally:
        for h in handles:
            h.remove()
    return Side(float(loss.detach()), {n: g.detach() for (n, _), g in zip(params, grads, strict=True) if g is not None},
                logits.detach() if logits is not None else None, {k: v.detach() for k, v in outputs.items()},
                lg.detach() if lg is not None else None)


def _where_they_part(packed: Side, padded: Side, seg: Segments, tol: float) -> tuple[str | None, int]:
    """(the first repeated module whose output differs on the real tokens, positions trained across two examples)."""
    index = [(b, s, e) for b, spans in enumerate(seg.spans) for s, e in spans]
    for name, hp in packed.blocks.items():
        hq = padded.blocks.get(name)
        if hq is None or hp.dim() < 2 or hq.dim() < 2:
            continue
        try:
            a = torch.cat([hp[b, s:e] for b, s, e in index])
            c = torch.cat([hq[k, : e - s] for k, (b, s, e) in enumerate(index)])
        except (IndexError, RuntimeError):
            continue
        if float((a - c).abs().max()) > tol * max(1.0, float(c.abs().max())):
            return name, 0
    crossing = 0
    if packed.loss_grad is not None and packed.loss_grad.dim() == 3:
        _, read = ce_targets(packed.loss_grad)
        for b, _, e in index:
            if e < seg.ids.shape[1] and bool(read[b, e - 1]):
                crossing += 1
    return None, crossing


def _compare(packed: Side, padded: Side) -> tuple[str | None, float, float, int]:
    worst, worst_rel, worst_cos = None, 0.0, 1.0
    for name, gq in padded.grads.items():
        gp = packed.grads.get(name)
        if gp is None:
            gp = torch.zeros_like(gq)
        a, c = gp.double().flatten(), gq.double().flatten()
        nc = float(c.norm())
        rel = float((a - c).norm()) / max(nc, 1e-30) if nc > 0 or float(a.norm()) > 0 else 0.0
        denom = float(a.norm()) * nc
        cos = float(a @ c) / denom if denom > 0 else (1.0 if nc == 0 and float(a.norm()) == 0 else 0.0)
        if rel > worst_rel:
            worst, worst_rel, worst_cos = name, rel, cos
    return worst, worst_rel, worst_cos, len(padded.grads)


def _dtype(model: nn.Module) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def run(loaded: Any, options: dict[str, Any]) -> dict:
    """Packed vs padded on the target's batch (see the module's docstring). `options["segments"]` (with "tokens" and
    "causal"): the packed rows as the dependencies engine measured them (check_equivalence reaches this through that
    engine too: checks/equivalence/packing.py)."""
    result: dict[str, Any] = {"applies": False, "why_not": "", "findings": [], "verified": [], "not_run": [], "facts": {}}
    seg, tokens = options["segments"], options.get("tokens")
    if seg is None:
        result["why_not"] = NO_PACKED_ROWS
        return result
    result["applies"] = True
    padded = padded_batch(loaded.batch, seg, tokens, loaded.model, causal=bool(options.get("causal")))
    if padded is None:
        result["not_run"].append({"check": "packed_vs_padded", "cause": "not_applicable",
                                  "why": "the model's forward takes no attention_mask to pad the examples with, and it "
                                         "was not measured causal (right padding is safe only for a causal model)"})
        return result
    names = param_names(loaded.model)
    params = [(names[id(p)][0], p) for p in loaded.model.parameters() if p.requires_grad and id(p) in names]
    try:
        a = _side(loaded.model, loaded.batch, loaded.loss_fn, loaded.user, params)
        b = _side(loaded.model, padded, loaded.loss_fn, loaded.user, params)
    except Exception as exc:
        result["not_run"].append({"check": "packed_vs_padded", "cause": "gradprobe",
                                  "why": f"running the padded batch failed ({type(exc).__name__}: {exc})"[:400]})
        return result
    tol = TOLERANCES.get(_dtype(loaded.model), TOLERANCES[torch.float32])
    worst, grel, cos, n = _compare(a, b)
    lrel = abs(a.loss - b.loss) / max(abs(b.loss), 1e-30) if math.isfinite(a.loss) and math.isfinite(b.loss) else math.inf
    facts = PackedFacts(seg.count(), len(seg.packed_rows) or seg.ids.shape[0], seg.describe(), a.loss, b.loss, lrel, worst,
                        grel, cos, n, tol)
    if facts.differs:
        facts.parted_at, facts.boundary_targets = _where_they_part(a, b, seg, tol[1])
        step = (loaded.info or {}).get("script_step") or {}
        facts.location = step.get("call_location") if isinstance(step.get("call_location"), dict) else None
    result["findings"] = list(GP803.detect(facts)) if GP803.detect else []
    result["facts"] = {"examples": facts.examples, "packed_rows": facts.rows, "how": facts.how, "loss_packed": a.loss,
                       "loss_padded": b.loss, "loss_relative_error": lrel, "worst_parameter": worst,
                       "gradient_relative_error": grel, "gradient_cosine": cos, "gradients_compared": n,
                       "tolerance": {"loss": tol[0], "gradient": tol[1], "cosine": tol[2]},
                       "first_module_differing": facts.parted_at, "targets_across_examples": facts.boundary_targets}
    if not facts.differs:
        result["verified"].append(f"packed vs padded: {facts.examples} examples, loss relative error {lrel:.1e}, largest "
                                  f"gradient relative error {grel:.1e} (cosine {cos:.6f}) over {n} gradients")
    return result


__all__ = ["GP803", "PackedFacts", "padded_batch", "run"]
