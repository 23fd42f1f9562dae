"""The sampled Jacobian structure: which input positions each sampled output depends on, by autograd.

A sample is one output position (b, t) (or one example b of a per-example output). Its row of the Jacobian, projected
on a random vector, is one backward pass to the input leaves; all samples go in one batched backward
(`is_grads_batched`, vmap over the cotangents), or one by one where vmap cannot run an op. Exact zeros are expected
where there is no dependency: a masked attention weight is exactly 0, so is its gradient.

Each sample serves the claims that hold at it: causality (no input after t in the same example), example independence
(no input of another row), packed independence (no input of another example packed in the same row).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from gradprobe.checks.dependencies.claims import Layout, NextClaim
from gradprobe.checks.dependencies.harness import Leaf
from gradprobe.checks.dependencies.segments import Segments


@dataclass
class Sample:
    b: int
    t: int  # 0 for a per-example output
    causal: bool = False  # the next-element claim holds here
    packed: bool = False  # a packed example of a row with several


@dataclass
class Leak:
    """A sampled output that depends on an input it must not see."""

    kind: str  # "future" | "example" | "packed"
    b: int
    t: int
    seen: list[tuple[int, int]]  # (row, position) of the inputs it depends on and must not
    ratio: float  # the largest such dependency over the largest allowed one


@dataclass
class Structure:
    samples: list[Sample]
    leaks: list[Leak] = field(default_factory=list)
    batched: bool = True  # one vmapped backward (else one backward per sample)


def _spread(values: list[int], n: int, rng: random.Random) -> list[int]:
    """First, middle, last, then random ones, up to n distinct values."""
    if not values:
        return []
    vs = sorted(set(values))
    picked = [vs[0], vs[len(vs) // 2], vs[-1]]
    rest = [v for v in vs if v not in picked]
    rng.shuffle(rest)
    out: list[int] = []
    for v in picked + rest:
        if v not in out:
            out.append(v)
        if len(out) >= n:
            break
    return out


def choose(lay: Layout, claim: NextClaim | None, seg: Segments | None, keep: torch.Tensor | None, n: int,
           seed: int = 0) -> list[Sample]:
    """The sampled outputs: positions where the claim holds (first, middle, last, random, cycling over the rows), the
    first token of later packed examples, and otherwise a few positions or examples for example independence."""
    rng = random.Random(seed)
    out: list[Sample] = []
    if claim is not None:
        by_t: dict[int, list[int]] = {}
        for b, t in claim.positions:
            if t < lay.T - 1:
                by_t.setdefault(t, []).append(b)
        for i, t in enumerate(_spread(list(by_t), n, rng)):
            rows = by_t[t]
            out.append(Sample(rows[i % len(rows)], t, causal=True))
    if seg is not None:
        for b in seg.packed_rows[:2]:
            spans = seg.spans[b]
            later = _spread(list(range(1, len(spans))), 3, rng)
            out += [Sample(b, spans[k][0], packed=True) for k in later]
            out.append(Sample(b, spans[-1][1] - 1, packed=True))
    if not out and lay.B >= 2:
        for i in range(min(n, lay.B)):
            if lay.positions:
                ts = [t for t in range(lay.T) if keep is None or bool(keep[i, t])]
                out += [Sample(i, ts[len(ts) // 2])] if ts else []
            else:
                out.append(Sample(i, 0))
    claimed = set(claim.positions) if claim is not None else set()
    unique: dict[tuple[int, int], Sample] = {}
    for s in out:
        kept = unique.setdefault((s.b, s.t), s)
        kept.causal = kept.causal or s.causal or (s.b, s.t) in claimed
        kept.packed = kept.packed or s.packed
    return list(unique.values())


def _rows_of(lay: Layout, samples: list[Sample]) -> torch.Tensor:
    out = lay.output
    if lay.positions:
        return torch.stack([out[s.b, s.t] for s in samples])
    return torch.stack([out[s.b] for s in samples])


def dependency_maps(lay: Layout, samples: list[Sample], leaves: list[Leaf], seed: int = 0) -> tuple[torch.Tensor, bool]:
    """(k, B, T) float: for sample i, how much its output depends on each input position (summed over the leaves and
    the features, absolute), and whether one batched backward did it."""
    rows = _rows_of(lay, samples)
    gen = torch.Generator().manual_seed(seed)
    k = len(samples)
    r = torch.randn((k, *rows.shape[1:]), generator=gen).to(device=rows.device, dtype=rows.dtype)
    cot = torch.zeros((k, *rows.shape), dtype=rows.dtype, device=rows.device)
    for i in range(k):
        cot[i, i] = r[i]
    tensors = [lf.tensor for lf in leaves]
    batched = True
    try:
        grads = torch.autograd.grad(rows, tensors, cot, retain_graph=True, allow_unused=True, is_grads_batched=True)
    except Exception:  # an op vmap cannot batch: one backward per sample
        batched = False
        per = [torch.autograd.grad(rows, tensors, cot[i], retain_graph=True, allow_unused=True) for i in range(k)]
        grads = tuple(torch.stack([p[j] if p[j] is not None else torch.zeros_like(tensors[j]) for p in per])
                      if any(p[j] is not None for p in per) else None for j in range(len(tensors)))
    T = lay.T if lay.positions else 1
    total = torch.zeros(k, lay.B, T)
    for g in grads:
        if g is None:
            continue
        g = g.detach().abs().float()
        g = g.reshape(k, lay.B, T, -1).sum(-1) if lay.positions else g.reshape(k, lay.B, -1).sum(-1).unsqueeze(-1)
        total += g.cpu()
    return total, batched


def _leak(kind: str, s: Sample, dep: torch.Tensor, bad: torch.Tensor, allowed: torch.Tensor) -> Leak | None:
    hit = (dep > 0) & bad
    if not bool(hit.any()):
        return None
    ok = float((dep * allowed).max()) if bool(allowed.any()) else 0.0
    worst = float((dep * bad).max())
    seen = [(int(b), int(t)) for b, t in hit.nonzero().tolist()]
    return Leak(kind, s.b, s.t, seen, worst / ok if ok > 0 else float("inf"))


def judge(lay: Layout, samples: list[Sample], deps: torch.Tensor, seg: Segments | None) -> list[Leak]:
    """The leaks of each sample: inputs after t in its own example (causal samples), inputs of another row, inputs of
    another example packed in its row."""
    B, T = deps.shape[1], deps.shape[2]
    pos = torch.arange(T)
    leaks: list[Leak] = []
    for i, s in enumerate(samples):
        dep = deps[i]
        other_row = torch.ones(B, T, dtype=torch.bool)
        other_row[s.b] = False
        same_ex = ~other_row
        if seg is not None and lay.positions:
            ids = seg.ids[s.b]
            same_seg = ids == ids[s.t]
            other_seg = torch.zeros(B, T, dtype=torch.bool)
            other_seg[s.b] = (~same_seg) & (ids >= 0)
            same_ex = torch.zeros(B, T, dtype=torch.bool)
            same_ex[s.b] = same_seg
            if seg.ids[s.b, s.t] >= 0 and len(seg.spans[s.b]) >= 2:
                found = _leak("packed", s, dep, other_seg, same_ex)
                leaks += [found] if found is not None else []
        if s.causal and lay.positions:
            future = same_ex & (pos > s.t).unsqueeze(0)
            found = _leak("future", s, dep, future, same_ex & ~future)
            leaks += [found] if found is not None else []
        if B >= 2:
            found = _leak("example", s, dep, other_row, same_ex)
            leaks += [found] if found is not None else []
    return leaks
