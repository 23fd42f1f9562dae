"""Tell an intentional gradient rewrite from a wrong derivative when a custom backward disagrees with finite differences.

Gradient-reversal layers (backward = -alpha x the Jacobian), gradient scaling and
straight-through estimators (piecewise-constant forward, surrogate backward) disagree
with finite differences on purpose. The rule, per Function call checked:

- **surrogate**: for an input whose numerical Jacobian is zero everywhere while the
  backward returns something nonzero, and whose forward output does change under
  large perturbations (so the forward is piecewise constant, not independent of the
  input): a surrogate gradient through a piecewise-constant forward.
- **scaled**: over every other differentiable input together, the analytical Jacobian
  is one scalar c != 1 times the numerical one, element by element (a least-squares c,
  every element within the check's tolerance), AND the rewrite is recognisably a
  rewrite: the forward passes those inputs through unchanged (numerical Jacobian = the
  identity, as in a reversal or scaling layer) or |c| (or 1/|c|) is a scalar the call
  received (alpha, lambda, a scale). c < 0 is a gradient reversal, c > 0 a gradient scaling.

Anything else stays a wrong derivative (an error): an element-dependent mismatch (2x for 3x^2), a
uniform factor on a non-trivial forward that no argument explains (a dropped 0.5),
one input scaled and another not, or a nonzero backward for an input the forward ignores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Rewrite:
    surrogate: list[int] = field(default_factory=list)  # input positions with a surrogate gradient
    scaled: list[int] = field(default_factory=list)  # input positions whose backward is factor x the true gradient
    factor: float | None = None  # c, when a uniform factor fits all scaled inputs
    recognised: bool = False  # the factor is a rewrite (pass-through forward or a scalar argument), not a bug
    full: bool = True  # measured on full Jacobians (else on random projections v^T J u)


def _changes_under_large_perturbation(fn: Callable[..., Any], inputs: tuple, j: int, flat_out: Callable[[Any], list]) -> bool:
    x = inputs[j]
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        base = [o.detach().clone() for o in flat_out(fn(*inputs))]
        scale = max(float(x.detach().abs().mean()), 1.0)
        for _ in range(4):
            noise = torch.randn(x.shape, generator=gen, dtype=x.dtype) * scale
            moved = tuple(a.detach() + noise if i == j else a for i, a in enumerate(inputs))
            outs = flat_out(fn(*moved))
            if any(not torch.allclose(o, b, atol=1e-9, rtol=0) for o, b in zip(outs, base, strict=False)):
                return True
    return False


def _scalar_args(inputs: tuple) -> list[float]:
    out = []
    for a in inputs:
        if isinstance(a, (int, float)) and not isinstance(a, bool) and a != 0:
            out.append(abs(float(a)))
        elif isinstance(a, torch.Tensor) and a.numel() == 1 and not a.requires_grad and a.is_floating_point() and float(a) != 0:
            out.append(abs(float(a)))
    return out


def is_identity(num: torch.Tensor) -> bool:
    """A full numerical Jacobian that is the identity: the forward passes this input through unchanged."""
    return num.shape[0] == num.shape[1] and torch.allclose(num, torch.eye(num.shape[0], dtype=num.dtype), atol=1e-4)


def classify(fn: Callable[..., Any], inputs: tuple, jacobians: dict[int, tuple[torch.Tensor, torch.Tensor]],
             flat_out: Callable[[Any], list], atol: float, rtol: float, pass_through: dict[int, bool]) -> Rewrite:
    """jacobians: input position -> (analytical, numerical), full Jacobians or projections v^T J u of them, for every
    differentiable input the backward answered for; pass_through: whether the forward passes that input through."""
    rw = Rewrite()
    rest: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for j, (ana, num) in jacobians.items():
        if not bool((num.abs() > atol).any()) and bool((ana.abs() > atol).any()):
            if _changes_under_large_perturbation(fn, inputs, j, flat_out):
                rw.surrogate.append(j)
                continue
        rest[j] = (ana, num)
    if not rest:
        return rw
    a = torch.cat([ana.reshape(-1) for ana, _ in rest.values()])
    n = torch.cat([num.reshape(-1) for _, num in rest.values()])
    denom = float((n * n).sum())
    if denom == 0:
        return rw
    c = float((a * n).sum()) / denom
    if abs(c - 1) <= rtol or not bool(((a - c * n).abs() <= atol + rtol * (c * n).abs()).all()):
        return rw
    rw.scaled, rw.factor = sorted(rest), c
    passes_through = all(pass_through.get(j, False) for j in rest)
    known = any(abs(abs(c) - s) <= rtol * s or abs(abs(c) * s - 1) <= rtol for s in _scalar_args(inputs))
    rw.recognised = passes_through or known
    return rw


def projected_jacobians(fn: Callable[..., Any], inputs: tuple, req: list[int], flat_out: Callable[[Any], list],
                        n: int = 6, eps: float = 1e-6) -> tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], dict[int, bool]]:
    """For Functions too large for full Jacobians: n random projections v^T J u per input, analytical (backward)
    and numerical (central differences along u), and whether J u == u (a pass-through forward)."""
    gen = torch.Generator().manual_seed(0)
    jac: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    through: dict[int, bool] = {}
    for j in req:
        x = inputs[j]
        ana, num, same = [], [], True
        for _ in range(n):
            u = torch.randn(x.shape, generator=gen, dtype=x.dtype)
            with torch.enable_grad():
                outs = [o for o in flat_out(fn(*inputs)) if o.requires_grad]
                vs = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outs]
                (g,) = torch.autograd.grad(outs, [x], vs, allow_unused=True)
            with torch.no_grad():
                plus = flat_out(fn(*(a.detach() + eps * u if i == j else a for i, a in enumerate(inputs))))
                minus = flat_out(fn(*(a.detach() - eps * u if i == j else a for i, a in enumerate(inputs))))
            ju = [(p.detach() - m.detach()) / (2 * eps) for p, m in zip(plus, minus, strict=False)]
            ju = [d for d, o in zip(ju, flat_out(fn(*inputs)), strict=False) if o.requires_grad]
            num.append(sum(float((d * v).sum()) for d, v in zip(ju, vs, strict=False)))
            ana.append(0.0 if g is None else float((g * u).sum()))
            same = same and len(ju) == 1 and ju[0].shape == u.shape and torch.allclose(ju[0], u, atol=1e-4)
        jac[j] = (torch.tensor(ana, dtype=torch.float64).unsqueeze(1), torch.tensor(num, dtype=torch.float64).unsqueeze(1))
        through[j] = same
    return jac, through
