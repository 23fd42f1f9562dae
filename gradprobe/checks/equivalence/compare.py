"""Two gradients that must agree, compared per parameter tensor: relative error, cosine, norm ratio, named ratios.

`a` is the setup under test (N processes, k micro-batches), `b` the reference (one process, one batch), both at the
same weights on the same examples. A tensor departs when ||a - b|| / ||b|| exceeds the tolerance of the dtype the
gradient was computed in (float32 sums in another order differ by ~1e-6; bf16 and fp16 by ~1e-2). When a departing
gradient points the same way (cosine within the tolerance of 1), its norm ratio is compared with the ratios a
setup of this kind produces by mistake: 1/N, N, 1/k, k, 1/2, 2, 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

# relative tolerance per dtype the gradient was computed in
TOLERANCE = {"float64": 1e-7, "float32": 1e-3, "bfloat16": 3e-2, "float16": 1e-2}
RATIO_MATCH = 0.02  # a norm ratio within 2% of a named value is that value


def tolerance(dtypes: set[str], autocast: str | None = None) -> float:
    """The largest tolerance among the dtypes the gradients (or the autocast region) were computed in."""
    names = set(dtypes) | ({autocast} if autocast else set())
    return max((TOLERANCE.get(n, 1e-3) for n in names), default=1e-3)


@dataclass
class TensorDiff:
    name: str
    shape: list[int]
    norm_a: float
    norm_b: float
    rel: float  # ||a - b|| / ||b|| (inf where b is zero and a is not)
    cosine: float | None  # None where either is zero
    departs: bool
    named: str | None = None  # the named ratio the norm ratio matches ("1/N", "k", "0", ...)

    @property
    def ratio(self) -> float | None:
        return self.norm_a / self.norm_b if self.norm_b > 0 else None

    def row(self) -> dict[str, object]:
        return {"name": self.name, "shape": self.shape, "rel_error": _r(self.rel), "cosine": _r(self.cosine, 6),
                "norm_ratio": _r(self.ratio, 6), "norm": _r(self.norm_b), "departs": self.departs,
                **({"ratio_is": self.named} if self.named else {})}


def _r(x: float | None, digits: int = 4) -> float | None:
    if x is None or not math.isfinite(x):
        return None if x is None else (float("inf") if x > 0 else float("-inf"))
    return float(f"{x:.{digits}g}")


def named_ratios(n: int | None = None, k: int | None = None) -> dict[str, float]:
    """The ratios a setup of this kind gives by mistake, by name ("1/N" with N the world size, "k" the micro-batches)."""
    out: dict[str, float] = {}
    if n and n > 1:
        out.update({"1/N": 1 / n, "N": float(n)})
    if k and k > 1:
        out.update({"1/k": 1 / k, "k": float(k)})
    out.setdefault("1/2", 0.5)
    out.setdefault("2", 2.0)
    return out


def name_ratio(ratio: float | None, names: Mapping[str, float]) -> str | None:
    if ratio is None:
        return None
    if ratio == 0:
        return "0"
    for label, value in names.items():
        if abs(ratio / value - 1) <= RATIO_MATCH:
            return label
    return None


def diff(name: str, a: torch.Tensor | None, b: torch.Tensor | None, tol: float,
         names: Mapping[str, float] | None = None) -> TensorDiff:
    """One tensor's comparison (a missing gradient counts as zeros)."""
    ref = b if b is not None else a
    shape = list(ref.shape) if ref is not None else []
    a64 = a.detach().double().reshape(-1) if a is not None else None
    b64 = b.detach().double().reshape(-1) if b is not None else None
    na = float(a64.norm()) if a64 is not None else 0.0
    nb = float(b64.norm()) if b64 is not None else 0.0
    if a64 is not None and b64 is not None and a64.shape == b64.shape:
        delta = float((a64 - b64).norm())
        cos = float(torch.dot(a64, b64) / (na * nb)) if na > 0 and nb > 0 else None
    else:
        delta, cos = abs(na - nb) if (a64 is None or b64 is None) else math.inf, None
    rel = delta / nb if nb > 0 else (0.0 if delta == 0 else math.inf)
    departs = rel > tol
    named = None
    if departs and names is not None:
        same_way = cos is not None and cos >= 1 - tol
        named = name_ratio(na / nb if nb > 0 else None, names) if (same_way or na == 0) else None
    return TensorDiff(name=name, shape=shape, norm_a=na, norm_b=nb, rel=rel, cosine=cos, departs=departs, named=named)


@dataclass
class StepDiff:
    """One optimizer step's gradients, compared tensor by tensor (rows in forward order where it is known)."""

    step: int
    rows: list[TensorDiff]
    only_a: list[str] = field(default_factory=list)  # a gradient in the setup under test only
    only_b: list[str] = field(default_factory=list)
    tol: float = 1e-3

    @property
    def departing(self) -> list[TensorDiff]:
        return [r for r in self.rows if r.departs]

    @property
    def worst(self) -> TensorDiff | None:
        return max(self.rows, key=lambda r: r.rel, default=None)

    def uniform_ratio(self) -> float | None:
        """The one norm ratio every compared tensor shows with its direction kept (a scale on the whole gradient)."""
        rows = [r for r in self.rows if r.norm_b > 0]
        if not rows or any(r.cosine is None or r.cosine < 1 - self.tol for r in rows if r.norm_a > 0):
            return None
        ratios = [r.norm_a / r.norm_b for r in rows]
        lo, hi = min(ratios), max(ratios)
        return (lo + hi) / 2 if hi - lo <= max(self.tol, RATIO_MATCH / 4) * max(hi, 1e-30) else None

    def scale_groups(self) -> list[tuple[str | None, float, list[TensorDiff]]]:
        """The departing tensors whose direction is kept, grouped by their named ratio (named first)."""
        groups: dict[str | None, list[TensorDiff]] = {}
        for r in self.departing:
            if r.named is not None and r.named != "0":
                groups.setdefault(r.named, []).append(r)
        return [(label, sum(x.ratio or 0.0 for x in rs) / len(rs), rs) for label, rs in groups.items()]

    def turned(self) -> list[TensorDiff]:
        """The departing tensors whose direction changed (cosine below 1 - tol, a gradient on one side only, or none
        where the reference has one: a zero gradient is never a scale)."""
        return [r for r in self.departing if r.named is None or r.named == "0"]

    def summary(self) -> dict[str, object]:
        w = self.worst
        return {"step": self.step, "compared": len(self.rows), "departing": len(self.departing),
                "largest_rel_error": _r(w.rel) if w else None, "at": w.name if w else None,
                "tolerance": self.tol, **({"only_in_test": self.only_a[:10]} if self.only_a else {}),
                **({"only_in_reference": self.only_b[:10]} if self.only_b else {})}


def compare_step(step: int, a: Mapping[str, torch.Tensor | None], b: Mapping[str, torch.Tensor | None], tol: float,
                 names: Mapping[str, float], order: list[str] | None = None) -> StepDiff:
    """Every tensor with a gradient in either setup, compared; `order` puts the rows in forward order."""
    keys = [k for k in a if k in b]
    rank = {n: i for i, n in enumerate(order or [])}
    keys.sort(key=lambda k: rank.get(k, len(rank)))
    rows = [diff(k, a[k], b[k], tol, names) for k in keys if a[k] is not None or b[k] is not None]
    only_a = [k for k in a if k not in b and a[k] is not None]
    only_b = [k for k in b if k not in a and b[k] is not None]
    return StepDiff(step=step, rows=rows, only_a=only_a, only_b=only_b, tol=tol)
