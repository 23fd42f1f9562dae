"""The weight-like inputs of a custom Function, and the same inputs moved away from where the recorded call had them.

A backward can be exact at initialisation and wrong everywhere else: an RMSNorm whose backward forgets the weight's
factor is exact while the weight is all ones, a fused bias-GELU that drops the bias is exact while the bias is zero
(karpathy/llm.c#763: "I forgot to multiply by the weight in the backward pass. Spent days chasing it."). So gradcheck
also checks each Function at its weight-like inputs perturbed: those that are a model parameter, or a cast, view or
transpose of exactly one (what the call receives for `self.weight`, `self.weight.to(x.dtype)`, `self.weight.t()`),
moved by seeded noise: multiplicative (x exp(REL z)) for a weight whose elements share one sign, so none crosses zero,
else additive of REL x its root mean square (the other inputs' when it is all zeros). Activations stay as recorded.
"""

from __future__ import annotations

from typing import Any

import torch

REL = 0.5  # the perturbation, relative to the input's own scale
SEED = 1234


def describe(t: torch.Tensor) -> str:
    """The recorded state of one input, in words: "all 1", "all 0", "rms 0.41 (from -0.9 to 1.2)"."""
    d = t.detach()
    if d.numel() == 0:
        return "empty"
    lo, hi = float(d.min()), float(d.max())
    if lo == hi:
        return f"all {lo:g}"
    return f"rms {float(d.pow(2).mean().sqrt()):.3g} (from {lo:.3g} to {hi:.3g})"


def _rms(t: torch.Tensor) -> float:
    return float(t.detach().pow(2).mean().sqrt()) if t.numel() else 0.0


def perturb(inputs: tuple, positions: list[int], label: Any = None) -> tuple[tuple, list[dict[str, Any]]]:
    """The inputs with those at `positions` moved by seeded noise; what each was and how far it moved.

    A weight whose elements share one sign (a norm weight of ones, a scale, a temperature) is moved multiplicatively,
    w x exp(REL z), so that no element crosses zero (a division by it, its log or square root stay defined); any
    other (a bias of zeros, a weight of both signs) additively, w + REL x rms x z."""
    gen = torch.Generator().manual_seed(SEED)
    others = [a for i, a in enumerate(inputs) if i not in positions and isinstance(a, torch.Tensor) and a.is_floating_point()]
    fallback = max([_rms(a) for a in others] or [0.0]) or 1.0
    out = list(inputs)
    states = []
    for j in positions:
        a = inputs[j]
        if not isinstance(a, torch.Tensor) or not a.is_floating_point():
            continue
        z = torch.randn(a.shape, generator=gen, dtype=torch.float64).to(a.dtype)
        d = a.detach()
        if d.numel() and (bool((d > 0).all()) or bool((d < 0).all())):
            moved = d * torch.exp(REL * z)
            how = f"seeded log-normal factors exp({REL} z) (its sign kept)"
        else:
            own = _rms(d)
            scale = own or fallback
            moved = d + z * (REL * scale)
            how = (f"seeded Gaussian noise of std {REL * scale:.3g} ({REL} x "
                   + ("its rms)" if own else "the other inputs' rms: its own is 0)"))
        moved = moved.requires_grad_(a.requires_grad)
        out[j] = moved
        states.append({"index": j, "input": label(j) if label else f"input {j}", "recorded": describe(a),
                       "perturbed_by": how, "perturbed": describe(moved)})
    return tuple(out), states
