"""Mixed precision (GP702): parameters held in fp16/bf16, and the gradient they lose to underflow.

For a model with trainable low-precision parameters: one step as the model is (its own autocast, if its forward
uses one), and one fp32 reference step on an fp32 copy of the model and batch, on the same seed. For each
low-precision parameter, the fraction of gradient entries that are nonzero in the reference and zero here is the
underflow; a parameter the optimizer updates in low precision has no fp32 master copy (an update below the dtype's
resolution is lost too). Parameters in fp32 under `torch.autocast` (the recommended setup) are not measured.

Three stages: `measure` (both steps, RNG and the model's buffers untouched), `run_rules((GP702,), facts)`, rank.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from gradprobe.checks.core.step import backward_grads, call_model, scalar_loss
from gradprobe.findings import Finding, Rule, Situation, run_rules

UNDERFLOW = 0.5  # a parameter losing at least this fraction of its reference gradient entries to zero is an error
LOW = (torch.float16, torch.bfloat16)
_SEED = 1234
_MAX_COPY = 200_000_000  # parameters: above this, no fp32 reference copy is made


@dataclass
class LowParam:
    name: str
    dtype: str
    in_optimizer: bool
    underflow: float | None = None  # fraction of the reference's nonzero gradient entries that are zero here
    ref_nonzero: int = 0


@dataclass
class PrecisionFacts:
    params: list[LowParam] = field(default_factory=list)
    skipped: str | None = None
    skip_cause: str = "refused"  # whose the skip is (a gradprobe/verdict.py cause): "gradprobe" when our measure raised

    def as_dict(self) -> dict[str, Any]:
        return {"low_precision": [vars(p) for p in self.params[:30]], "skipped": self.skipped, "skip_cause": self.skip_cause,
                "underflow_error": UNDERFLOW}


GP702: Rule[PrecisionFacts] = Rule(
    code="GP702", name="low-precision-params", severity="warning", rank=24,
    summary="Trainable parameters are held in fp16/bf16: their gradients underflow to zero, and the optimizer updates "
            "them without an fp32 master copy.",
    why="fp16 flushes values below about 6e-8 to zero and bf16 keeps 8 bits of mantissa: a small gradient vanishes, and "
        "an update smaller than a weight's resolution leaves it unchanged. Mixed precision keeps the parameters (and the "
        "optimizer's state) in fp32 and runs only the forward in low precision (torch.autocast); fp16 also needs a "
        "GradScaler.",
    example="model = Net().half(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)  # fp16 weights, no master copy",
    message="{count} trainable parameter(s) are held in {dtype} and updated by the optimizer directly ({names}): there is "
            "no fp32 master copy, so updates smaller than a weight's resolution are lost.",
    fix="Keep the parameters in fp32 and run the forward under torch.autocast(device_type, dtype=torch.bfloat16) (or "
        "float16 with torch.amp.GradScaler); the optimizer then updates fp32 weights.",
    situations={
        "underflow": Situation(
            when="the measured gradient of some low-precision parameters is mostly flushed to zero",
            severity="error",
            message="{count} parameter(s) held in {dtype} lose most of their gradient to underflow ({names}): up to "
                    "{worst:.0%} of the gradient entries that are nonzero in an fp32 reference step are zero here.",
            fix="Keep the parameters in fp32 and run the forward under torch.autocast; with float16, scale the loss "
                "with torch.amp.GradScaler so that small gradients stay representable."),
    },
)


def _names(params: list[LowParam]) -> str:
    return ", ".join(p.name for p in params[:6]) + (f" and {len(params) - 6} more" if len(params) > 6 else "")


@GP702.detector
def detect_low_precision(facts: PrecisionFacts) -> Iterator[Finding]:
    lost = [p for p in facts.params if p.underflow is not None and p.underflow >= UNDERFLOW]
    ev = facts.as_dict()
    if lost:
        yield GP702.finding("underflow", parameters=[p.name for p in lost], evidence=ev, count=len(lost),
                            dtype="/".join(sorted({p.dtype for p in lost})), names=_names(lost),
                            worst=max(p.underflow or 0.0 for p in lost))
    named = {p.name for p in lost}
    held = [p for p in facts.params if p.in_optimizer and p.name not in named]
    if held:
        yield GP702.finding(parameters=[p.name for p in held], evidence=ev, count=len(held),
                            dtype="/".join(sorted({p.dtype for p in held})), names=_names(held))


def _to_fp32(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.float() if batch.dtype in LOW else batch
    if isinstance(batch, dict):
        return {k: _to_fp32(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to_fp32(v) for v in batch)
    return batch


def _grads(model: nn.Module, names: list[str], batch: Any, loss_fn: Any) -> list[torch.Tensor | None]:
    params = dict(model.named_parameters())
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        torch.manual_seed(_SEED)
        out = call_model(model, batch)
        got = backward_grads(scalar_loss(loss_fn, out, batch), [params[n] for n in names])
    return [None if g is None else g.detach() for g in got]


def measure(loaded: Any) -> PrecisionFacts | None:
    """None when no trainable parameter is in fp16/bf16; else each one's dtype, optimizer and underflow."""
    model: nn.Module = loaded.model
    low = [(n, p) for n, p in model.named_parameters() if p.requires_grad and p.dtype in LOW]
    if not low:
        return None
    opt = loaded.optimizer if isinstance(loaded.optimizer, torch.optim.Optimizer) else None
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]} if opt is not None else set()
    facts = PrecisionFacts([LowParam(n, str(p.dtype).replace("torch.", ""), id(p) in in_opt) for n, p in low])
    if loaded.batch is None or loaded.train_step is not None:
        facts.skipped = "the underflow needs a batch and the default step"
        return facts
    if sum(p.numel() for p in model.parameters()) > _MAX_COPY:
        facts.skipped = "the model is too large for an fp32 reference copy"
        return facts
    names = [n for n, _ in low]
    try:
        here = _grads(model, names, loaded.batch, loaded.loss_fn)
        reference = copy.deepcopy(model).float()
        ref = _grads(reference, names, _to_fp32(loaded.batch), loaded.loss_fn)
    except Exception as exc:  # the step's own failure is the trace's finding; here it only skips the measure
        facts.skipped, facts.skip_cause = f"{type(exc).__name__}: {str(exc)[:300]}", "gradprobe"
        return facts
    for row, g, r in zip(facts.params, here, ref, strict=True):
        if r is None:
            continue
        nonzero = r != 0
        row.ref_nonzero = int(nonzero.sum())
        if row.ref_nonzero:
            zero_here = nonzero if g is None else nonzero & (g == 0)
            row.underflow = round(float(zero_here.sum()) / row.ref_nonzero, 4)
    return facts


def precision_findings(loaded: Any) -> tuple[list[Finding], dict[str, Any] | None]:
    """GP702 findings and the facts; ([], None) when no trainable parameter is held in low precision."""
    facts = measure(loaded)
    if facts is None:
        return [], None
    return run_rules((GP702,), facts), facts.as_dict()
