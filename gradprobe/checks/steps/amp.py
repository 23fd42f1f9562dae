"""GP6xx rules about mixed-precision loss scaling over several steps: clipping gradients the GradScaler has not
unscaled yet (GP615), and a GradScaler that skips every optimizer step (GP617).

`ScalerWatch` is entered around the observed steps beside the step observer. It patches GradScaler.scale /
unscale_ / update (to know, per scaler, whether the gradients it produced are still multiplied by its scale) and
the one function every `clip_grad_norm_` goes through (`torch.nn.utils.clip_grad._clip_grads_with_norm_`, looked up
at call time, so `from torch.nn.utils import clip_grad_norm_` is seen too), and records each clip with the user's
line, the total norm it measured, its max_norm and the scale still on the gradients.
"""

from __future__ import annotations

import math
import sys
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import torch

from gradprobe.checks.steps.facts import ScalerStep, at
from gradprobe.findings import Finding, Rule, Situation


@dataclass
class ClipCall:
    call: int
    location: dict | None
    total_norm: float
    max_norm: float
    scale: float | None  # the scale still on the gradients (a scaler scaled a loss and has not unscaled since)


@dataclass
class ScaledLoss:
    call: int
    location: dict | None
    value: float | None  # the loss before scaling (None: not a single number)
    scale: float | None = None  # the scaler's scale that multiplied it


@dataclass
class AmpFacts:
    clips: list[ClipCall] = field(default_factory=list)
    scaled: list[ScaledLoss] = field(default_factory=list)
    scaler_steps: list[ScalerStep] = field(default_factory=list)


GP615: Rule[AmpFacts] = Rule(
    code="GP615", name="clip-before-unscale", severity="error", rank=49,
    summary="Gradients are clipped while still multiplied by the GradScaler's scale (clip_grad_norm_ before "
            "scaler.unscale_): the clipping threshold is compared with scaled gradients.",
    why="scaler.scale(loss).backward() leaves every gradient multiplied by the scale (65536 by default). Clipping before "
        "scaler.unscale_(optimizer) measures that scaled norm against max_norm, so it cuts almost every step to a "
        "gradient about `scale` times smaller than meant (or, with a large max_norm, clips nothing that matters); the "
        "step still runs and nothing raises.",
    example="scaler.scale(loss).backward()\nclip_grad_norm_(model.parameters(), 1.0)   # before scaler.unscale_(opt)\n"
            "scaler.step(opt); scaler.update()",
    message="clip_grad_norm_ at {line} ran on gradients still multiplied by the GradScaler's scale ({scale:.6g}): it "
            "measured a total norm of {total:.4g} (unscaled: {true:.4g}) against max_norm {max_norm:g}, so it {effect} "
            "({calls} of the {steps} observed step(s)).",
    fix="Call scaler.unscale_(optimizer) right before clip_grad_norm_ at {line} (after backward, before "
        "scaler.step(optimizer)), so that max_norm applies to the real gradients.",
)

GP617: Rule[AmpFacts] = Rule(
    code="GP617", name="scaler-skips-every-step", severity="warning", rank=50,
    summary="The GradScaler skipped the optimizer step at every observed step (inf or nan gradients): nothing trains.",
    why="GradScaler.step() skips optimizer.step() whenever the unscaled gradients hold inf or nan, and halves the scale. "
        "A few skipped steps at the start of fp16 training are normal; every step skipped means the gradients are not "
        "finite at any scale (a nan or inf loss, a log of 0, fp16 weights overflowing), and the parameters never move "
        "while the loop runs on.",
    example="scaler.scale(loss).backward(); scaler.step(opt)   # loss is nan every step: every step is skipped",
    message="The GradScaler skipped the optimizer step at all {steps} observed steps ({line}); its scale went from "
            "{first:.6g} to {last:.6g}, and the parameters did not move.",
    fix="Find why the gradients overflow at every scale: check the loss and the model's outputs for inf/nan, keep the "
        "weights in float32 under autocast, and start with a smaller init_scale if a large one overflows.",
    situations={
        "nonfinite_loss": Situation(
            when="the loss handed to scaler.scale() was itself inf or nan",
            severity="error",
            message="The GradScaler skipped the optimizer step at all {steps} observed steps ({line}): the loss handed to "
                    "scaler.scale() at {loss_line} was {loss} before any scaling, so every gradient is nan and no scale "
                    "can help (its scale went from {first:.6g} to {last:.6g}).",
            fix="Make the loss at {loss_line} finite (a log or division of 0, an overflow in half precision, nan inputs): "
                "the GradScaler cannot recover from a loss that is nan before scaling."),
        "backing_off": Situation(
            when="the loss was finite at every step and the scale is still above 1: the scaler may still be backing off "
                 "from its initial scale (it halves at each skip), as it does at the start of healthy fp16 training",
            severity="info",
            message="The GradScaler skipped the optimizer step at all {steps} observed steps ({line}) while the loss was "
                    "finite; its scale went from {first:.6g} to {last:.6g}. The gradients overflow float16 only at these "
                    "scales so far: a healthy GradScaler skips steps like this until its scale fits.",
            fix="Nothing to change yet: audit more steps (steps >= {settle}) to see whether the scale settles; if every step "
                "is still skipped at a scale of 1 or less, the gradients overflow float16 on their own."),
    },
)


def _effect(c: ClipCall) -> str:
    if c.total_norm > c.max_norm:
        return (f"scaled the gradients by {c.max_norm / c.total_norm:.3g}: the step got a gradient of norm "
                f"{c.max_norm / (c.scale or 1):.3g} where clipping the real one gives "
                f"{min(c.total_norm / (c.scale or 1), c.max_norm):.3g}")
    return "clipped nothing, whatever the real norm"


@GP615.detector
def detect_clip_before_unscale(facts: AmpFacts) -> Iterator[Finding]:
    by_line: dict[str, list[ClipCall]] = {}
    for c in facts.clips:
        if c.scale is not None and c.scale != 1.0 and math.isfinite(c.total_norm):
            by_line.setdefault(at(c.location), []).append(c)
    steps = len({c.call for c in facts.clips})
    for line, calls in by_line.items():
        c = calls[0]
        yield GP615.finding(location=c.location, evidence={"scale": c.scale, "total_norm_measured": c.total_norm,
                                                            "max_norm": c.max_norm, "calls": len(calls)},
                            line=line, scale=c.scale, total=c.total_norm, true=c.total_norm / (c.scale or 1.0),
                            max_norm=c.max_norm, effect=_effect(c), calls=len(calls), steps=steps)


@GP617.detector
def detect_scaler_skips(facts: AmpFacts) -> Iterator[Finding]:
    steps = facts.scaler_steps
    scales = [s.scale for s in steps if s.scale is not None]
    if len(steps) < 2 or not all(s.skipped for s in steps) or len(scales) < 2:
        return
    bad = next((s for s in facts.scaled if s.value is not None and not math.isfinite(s.value)), None)
    ev = {"skipped": [s.skipped for s in steps], "scale": scales}
    if bad is not None:
        yield GP617.finding("nonfinite_loss", location=bad.location, evidence={**ev, "loss_before_scaling": str(bad.value)},
                            steps=len(steps), line=at(steps[0].location), first=scales[0], last=scales[-1],
                            loss_line=at(bad.location), loss=str(bad.value))
        return
    finite = bool(facts.scaled) and all(s.value is not None and math.isfinite(s.value) for s in facts.scaled)
    situation = "backing_off" if finite and scales[-1] > 1.0 else None  # at a scale <= 1 the overflow is the model's
    yield GP617.finding(situation, location=steps[0].location, evidence=ev, steps=len(steps), line=at(steps[0].location),
                        first=scales[0], last=scales[-1], settle=len(steps) + max(1, math.ceil(math.log2(scales[-1]))) + 1)


AMP_RULES: tuple[Rule[AmpFacts], ...] = (GP615, GP617)


class ScalerWatch:
    """Which gradients are still scaled when a clip runs, and the losses handed to GradScaler.scale()."""

    def __init__(self, user: Any, observer: Any):
        self.user, self.observer = user, observer
        self.facts = AmpFacts()
        self.pending: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()  # scaled since update, not unscaled
        self._stack = ExitStack()

    def _where(self, depth: int) -> dict | None:
        loc: dict | None = self.user.innermost(sys._getframe(depth))
        return loc

    def _scale(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        def scale(scaler: Any, outputs: Any) -> Any:
            if scaler.is_enabled():
                watch.pending[scaler] = True
                value = None
                if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
                    value = float(outputs.detach().float().item())
                out = orig(scaler, outputs)  # the scale is made lazily by the first scale() call
                scale_t = getattr(scaler, "_scale", None)
                factor = float(scale_t.item()) if isinstance(scale_t, torch.Tensor) and scale_t.numel() == 1 else None
                watch.facts.scaled.append(ScaledLoss(call=watch.observer.call, location=watch._where(2), value=value,
                                                     scale=factor))
                return out
            return orig(scaler, outputs)

        return scale

    def _clear(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        def clear(scaler: Any, *args: Any, **kwargs: Any) -> Any:
            watch.pending.pop(scaler, None)
            return orig(scaler, *args, **kwargs)

        return clear

    def _clip(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        def clip(parameters: Any, max_norm: float, total_norm: Any, *args: Any, **kwargs: Any) -> Any:
            scales = [float(s.get_scale()) for s, on in list(watch.pending.items()) if on]
            if isinstance(total_norm, torch.Tensor) and total_norm.numel() == 1:
                watch.facts.clips.append(ClipCall(call=watch.observer.call, location=watch._where(3),
                                                  total_norm=float(total_norm.item()), max_norm=float(max_norm),
                                                  scale=scales[0] if scales else None))
            return orig(parameters, max_norm, total_norm, *args, **kwargs)

        return clip

    def _patch(self, owner: Any, name: str, new: Any) -> None:
        old = owner.__dict__[name]
        setattr(owner, name, new)
        self._stack.callback(setattr, owner, name, old)

    def __enter__(self) -> ScalerWatch:
        scaler = getattr(torch.amp, "GradScaler", None)
        if scaler is not None and all(n in scaler.__dict__ for n in ("scale", "unscale_", "update")):
            self._patch(scaler, "scale", self._scale(scaler.__dict__["scale"]))
            self._patch(scaler, "unscale_", self._clear(scaler.__dict__["unscale_"]))
            self._patch(scaler, "update", self._clear(scaler.__dict__["update"]))
        clip_mod = sys.modules.get("torch.nn.utils.clip_grad")
        if clip_mod is not None and "_clip_grads_with_norm_" in clip_mod.__dict__:
            self._patch(clip_mod, "_clip_grads_with_norm_", self._clip(clip_mod.__dict__["_clip_grads_with_norm_"]))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stack.close()

    def amp_facts(self, scaler_steps: list[ScalerStep]) -> AmpFacts:
        self.facts.scaler_steps = scaler_steps
        return self.facts
