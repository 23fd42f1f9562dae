"""Gradients lost to fp16 underflow under torch.autocast (GP708), for parameters held in fp32.

`AutocastWatch` is entered around diagnose's one observed step. It records each `torch.autocast` the step enters
(device, dtype, the user's line) and, through a global forward pre-hook, whether autocast was enabled while a module
of the model ran (what the forward ran under, however it was entered: a `with`, a decorator, a framework's
precision plugin). Whether a GradScaler scaled the loss is the several-steps tool's own observation
(`checks/steps/amp.ScalerWatch`), entered here as well rather than patched twice.

After the real step (whatever happens here is never the user's failure), when the forward ran under autocast and
no GradScaler scaled the loss: the same step (the user's train_step, or forward + loss + backward) runs twice on
copies of the model's current weights, on the same batch and seed, once as the user wrote it and once with every
autocast forced off (fp32). For each parameter: the fraction of the entries whose gradient is nonzero in fp32 and
exactly zero under autocast, and the ratio of the two gradient norms. fp16 flushes magnitudes below about 6e-8 to
zero in the backward's half-precision ops; bf16 has fp32's exponent range and does not. A parameter losing at least
UNDERFLOW of its entries (among parameters with at least MIN_ENTRIES nonzero fp32 entries), in fp16 with no
GradScaler, is reported. The threshold, measured (`benchmarks/autocast_underflow.py`, tiny random-init models, CPU):
the largest fraction over parameters is 0.36 (ViT), 0.31 (BERT), 0.14 (UNet2D), 0.10 (GPT-2), 0.06 (a small CNN),
0.0 (Llama) in fp16 with no scaler, and at most 0.06 in bf16, where the buggy example loses 1.0 (its encoder's
weight; the next parameter 0.45). A loss scale the user applies by hand scales both reruns alike and lowers the
measured underflow by itself. The reruns call the user's train_step again (with an lr=0 optimizer over the copy):
only where no GradScaler ran, so no scaler's state is touched.

Written from engichang1467/Open-Rig3R#35 (https://github.com/engichang1467/Open-Rig3R/issues/35: "autocast defaults
to fp16 with no GradScaler: gradients can silently underflow to zero"), the AMP notes of pytorch/pytorch#32140 (fp16
gradients of small magnitude flush to zero, so the update for those parameters is lost; gradient scaling prevents
it) and decoderesearch/SAELens#723 (bfloat16 has fp32's exponent range: nothing underflows, nothing to scale).

On a script target the step diagnose replays runs outside the script's loop, where its autocast and GradScaler are:
the script's watch (scriptmode/amp.py) records them as the script runs, and `script_underflow` judges from that.

Three stages: `measure` (both reruns, RNG and the model untouched), `run_rules((GP708,), facts)`, rank.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import Any

import torch
import torch.nn as nn
from torch.amp import autocast_mode

from gradprobe.checks.core.step import call_model, scalar_loss
from gradprobe.checks.steps.amp import ScalerWatch
from gradprobe.checks.steps.facts import at
from gradprobe.findings import Finding, Rule, run_rules

UNDERFLOW = 0.5  # fraction of a parameter's fp32-nonzero gradient entries that are zero under fp16 autocast
MIN_ENTRIES = 16  # parameters with fewer fp32-nonzero gradient entries are not judged (a bias of 3 proves little)
_SEED = 1234
_MAX_COPY = 50_000_000  # parameters: above this, no copies are made for the reruns
_DEVICES = ("cpu", "cuda")


@dataclass
class Entered:
    device: str
    dtype: str
    enabled: bool
    location: dict | None


@dataclass
class ParamUnderflow:
    name: str
    ref_nonzero: int
    underflow: float  # fraction of the fp32 step's nonzero gradient entries that are exactly zero under autocast
    norm_ratio: float | None  # |grad under autocast| / |grad in fp32|


@dataclass
class UnderflowFacts:
    device: str
    dtype: str
    location: dict | None  # where the step entered autocast
    scaled: bool = False  # a GradScaler scaled the loss during the step
    params: list[ParamUnderflow] = field(default_factory=list)
    skipped: str | None = None
    skip_cause: str = "refused"  # whose the skip is (a gradprobe/verdict.py cause)

    def lost(self) -> list[ParamUnderflow]:
        return [p for p in self.params if p.underflow >= UNDERFLOW and p.ref_nonzero >= MIN_ENTRIES]

    def as_dict(self) -> dict[str, Any]:
        worst = sorted(self.params, key=lambda p: -p.underflow)[:20]
        return {"device": self.device, "dtype": self.dtype, "autocast_line": self.location, "grad_scaler": self.scaled,
                "skipped": self.skipped, "skip_cause": self.skip_cause, "underflow_threshold": UNDERFLOW,
                "measured": len(self.params),
                "worst": [vars(p) for p in worst]}


GP708: Rule[UnderflowFacts] = Rule(
    code="GP708", name="grad-underflow-under-autocast", severity="error", rank=24,
    summary="Under fp16 torch.autocast with no GradScaler, most of a parameter's gradient underflows to zero: entries "
            "that are nonzero in an fp32 step on the same batch and seed are exactly zero.",
    why="Autocast runs the backward's matmuls and convolutions in float16, whose smallest subnormal is about 6e-8: a "
        "gradient below it is flushed to zero before it reaches the fp32 parameter. A loss averaged over many elements, "
        "or a small output layer, makes most of the gradient that small, and those weights stop training with no "
        "error. GradScaler multiplies the loss before backward (and divides the gradients before the step) for exactly "
        "this; bfloat16 has float32's exponent range and does not underflow.",
    example="with torch.autocast(\"cpu\", dtype=torch.float16):\n    loss = F.mse_loss(model(x), y)\n"
            "loss.backward()   # no GradScaler: small gradients are flushed to zero\noptimizer.step()",
    message="Under torch.autocast({dtype}) entered at {line}, {count} parameter(s) lose most of their gradient to "
            "underflow ({names}): up to {worst:.0%} of the gradient entries that are nonzero in an fp32 step on the same "
            "batch and seed are exactly zero, and the gradient's norm is {ratio:.3g}x fp32's. No GradScaler scaled the "
            "loss.",
    fix="Scale the loss with a GradScaler for the autocast at {line} (scaler = torch.amp.GradScaler(device); "
        "scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()), or autocast to torch.bfloat16, "
        "which has float32's exponent range.",
)


def _names(params: list[ParamUnderflow]) -> str:
    return ", ".join(p.name for p in params[:6]) + (f" and {len(params) - 6} more" if len(params) > 6 else "")


@GP708.detector
def detect_underflow(facts: UnderflowFacts) -> Iterator[Finding]:
    lost = facts.lost()
    if facts.dtype != "float16" or facts.scaled or not lost:
        return
    worst = max(lost, key=lambda p: p.underflow)
    yield GP708.finding(parameters=[p.name for p in lost], location=facts.location, evidence=facts.as_dict(),
                        dtype=facts.dtype, line=at(facts.location), count=len(lost), names=_names(lost),
                        worst=worst.underflow, ratio=worst.norm_ratio if worst.norm_ratio is not None else 0.0)


def autocast_state() -> tuple[str, str] | None:
    """(device, dtype) of the autocast enabled here and now, if any."""
    for dev in _DEVICES:
        if torch.is_autocast_enabled(dev):
            return dev, str(torch.get_autocast_dtype(dev)).replace("torch.", "")
    return None


class AutocastWatch:
    """The autocasts the step enters, whether a module of the model ran under one, and the GradScaler's scale()."""

    def __init__(self, model: nn.Module | None, user: Any):
        """`model` None: a script's watch (scriptmode/amp.py), where the forward's autocast is read at the model's call."""
        self.user = user
        self.modules = {id(m) for m in model.modules()} if model is not None else set()
        self.entered: list[Entered] = []
        self.forward: tuple[str, str] | None = None  # (device, dtype) autocast was enabled for in a module's forward
        self.call = 0  # ScalerWatch reads its observer's step number
        self.scaler = ScalerWatch(user, self)
        self._stack = ExitStack()

    def _enter(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        def __enter__(ac: Any) -> Any:
            frame: FrameType | None = sys._getframe(1)
            dtype = str(getattr(ac, "fast_dtype", "")).replace("torch.", "")
            watch.entered.append(Entered(str(getattr(ac, "device", "")), dtype, bool(getattr(ac, "_enabled", False)),
                                         watch.user.innermost(frame)))
            return orig(ac)

        return __enter__

    def _pre_hook(self, module: nn.Module, args: Any) -> None:
        if self.forward is None and id(module) in self.modules:
            self.forward = autocast_state()

    def __enter__(self) -> AutocastWatch:
        cls = autocast_mode.autocast
        old = cls.__dict__["__enter__"]
        cls.__enter__ = self._enter(old)  # type: ignore[method-assign]
        self._stack.callback(setattr, cls, "__enter__", old)
        if self.modules:
            self._stack.callback(torch.nn.modules.module.register_module_forward_pre_hook(self._pre_hook).remove)
        self._stack.enter_context(self.scaler)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stack.close()

    def site(self) -> dict | None:
        """The user's line that entered the autocast the forward ran under (its device and dtype), if one was seen."""
        if self.forward is None:
            return None
        dev, dtype = self.forward
        hit = next((e for e in self.entered if e.enabled and e.device == dev and e.dtype == dtype), None)
        return hit.location if hit is not None else None


class _ForcedOff:
    """Every torch.autocast entered inside is entered disabled: the fp32 reference of the same code."""

    def __enter__(self) -> None:
        cls = autocast_mode.autocast
        self._old = cls.__dict__["__enter__"]
        old = self._old

        def __enter__(ac: Any) -> Any:
            ac._enabled = False
            return old(ac)

        cls.__enter__ = __enter__  # type: ignore[method-assign]

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        autocast_mode.autocast.__enter__ = self._old  # type: ignore[method-assign]


def _loaded_step(loaded: Any) -> Callable[[nn.Module], None]:
    """The user's step on a copy of the model: their train_step (with an lr=0 optimizer), or forward + loss + backward."""

    def step(model: nn.Module) -> None:
        if loaded.train_step is not None:
            loaded.train_step(model, loaded.batch, torch.optim.SGD(model.parameters(), lr=0.0))
            return
        scalar_loss(loaded.loss_fn, call_model(model, loaded.batch), loaded.batch).backward()

    return step


def _grads(model: nn.Module, step: Callable[[nn.Module], None], fp32: bool,
           under: tuple[str, str] | None = None) -> list[torch.Tensor | None]:
    """Each trainable parameter's gradient from `step` run on a copy of `model`, on a fixed seed; what the backward
    accumulated, read before any zero_grad. fp32: every autocast forced off; else under `under` (device, dtype) when
    given (a script's step, replayed outside the script's own `with torch.autocast`)."""
    model = copy.deepcopy(model)
    params = [p for p in model.parameters() if p.requires_grad]
    got: dict[int, torch.Tensor] = {}
    hooks = [p.register_post_accumulate_grad_hook(lambda q: got.__setitem__(id(q), q.grad.detach().float().clone()))
             for p in params]
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad(), ExitStack() as stack:
            torch.manual_seed(_SEED)
            if fp32:
                stack.enter_context(_ForcedOff())
                stack.enter_context(torch.autocast("cpu", enabled=False))  # one the caller entered around the step
                if torch.cuda.is_available():
                    stack.enter_context(torch.autocast("cuda", enabled=False))
            elif under is not None:
                stack.enter_context(torch.autocast(under[0], dtype=getattr(torch, under[1])))
            step(model)
    finally:
        for h in hooks:
            h.remove()
    return [got.get(id(p)) for p in params]


def _compare(name: str, amp: torch.Tensor | None, ref: torch.Tensor | None) -> ParamUnderflow | None:
    if ref is None:
        return None
    nonzero = ref != 0
    count = int(nonzero.sum())
    if not count:
        return None
    lost = nonzero if amp is None else nonzero & (amp == 0)
    ref_norm = float(ref.norm())
    ratio = None if ref_norm == 0 else (0.0 if amp is None else float(amp.norm()) / ref_norm)
    return ParamUnderflow(name, count, round(float(lost.sum()) / count, 4), None if ratio is None else round(ratio, 4))


def measure(loaded: Any, watch: AutocastWatch, step_failed: bool) -> UnderflowFacts | None:
    """None when no module of the model ran under autocast in the step; else the per-parameter underflow."""
    if watch.forward is None:
        return None
    facts = UnderflowFacts(device=watch.forward[0], dtype=watch.forward[1], location=watch.site(),
                           scaled=bool(watch.scaler.facts.scaled))
    if facts.scaled:
        facts.skipped = "a GradScaler scaled the loss: its gradients are not measured against fp32"
        facts.skip_cause = "not_applicable"  # a GradScaler is what keeps fp16 gradients from underflowing
    elif not any(e.enabled for e in watch.entered):
        # entered before the step (a caller's `with torch.autocast` around it): whether a GradScaler scales that loss
        # was not seen, so nothing is judged (a script's own step is judged from its run instead: `script_underflow`)
        facts.skipped = "autocast was entered outside the observed step: its loss scaling was not seen"
    elif step_failed or loaded.batch is None:
        facts.skipped = "the step did not finish, or there is no batch to rerun"
    elif sum(p.numel() for p in loaded.model.parameters()) > _MAX_COPY:
        facts.skipped = "the model is too large for copies"
    if facts.skipped is not None:
        return facts
    _rerun(facts, loaded.model, _loaded_step(loaded), None)
    return facts


def _rerun(facts: UnderflowFacts, model: nn.Module, step: Callable[[nn.Module], None], under: tuple[str, str] | None) -> None:
    """The step under autocast and in fp32 on copies; each parameter's underflow into facts (a failure: skipped)."""
    named = [n for n, p in model.named_parameters() if p.requires_grad]
    try:
        amp, ref = _grads(model, step, fp32=False, under=under), _grads(model, step, fp32=True)
    except Exception as exc:  # the real step already ran: a failing rerun only skips the measure
        facts.skipped, facts.skip_cause = f"{type(exc).__name__}: {str(exc)[:300]}", "gradprobe"
        return
    facts.params = [r for n, a, f in zip(named, amp, ref, strict=True) if (r := _compare(n, a, f)) is not None]


def script_underflow(model: nn.Module, step: Callable[[nn.Module], None] | None, watch: AutocastWatch,
                     forward: tuple[str, str], why_not: str | None = None) -> tuple[list[Finding], dict[str, Any]]:
    """GP708 on a script's own first step: `forward` is the (device, dtype) of the autocast the script's call of the
    model ran under, `watch` saw the script's autocasts and GradScaler up to that step; `step` runs the replayed step
    on a copy of the model (None: it cannot be rerun, `why_not` says why)."""
    watch.forward = forward
    facts = UnderflowFacts(device=forward[0], dtype=forward[1], location=watch.site(),
                           scaled=bool(watch.scaler.facts.scaled))
    if facts.scaled:
        facts.skipped = "a GradScaler scaled the loss: its gradients are not measured against fp32"
        facts.skip_cause = "not_applicable"  # a GradScaler is what keeps fp16 gradients from underflowing
    elif step is None:
        facts.skipped = why_not or "the script's step cannot be rerun on a copy of the model"
    elif sum(p.numel() for p in model.parameters()) > _MAX_COPY:
        facts.skipped = "the model is too large for copies"
    else:
        _rerun(facts, model, step, forward)
    return run_rules((GP708,), facts), facts.as_dict()


def underflow_findings(loaded: Any, watch: AutocastWatch, step_failed: bool) -> tuple[list[Finding], dict[str, Any] | None]:
    """GP708 findings and the facts; ([], None) when the step's forward did not run under autocast."""
    facts = measure(loaded, watch, step_failed)
    if facts is None:
        return [], None
    return run_rules((GP708,), facts), facts.as_dict()
