"""The sampled Jacobian structure: which input positions each sampled output depends on, by autograd.

A sample is one output position (b, t) (or one example b of a per-example output). Its row of the Jacobian, projected
on a random vector, is one backward pass to the input leaves (no weight gradients). Samples that cannot hide each
other's leaks (one per row, or first tokens of packed examples) share one pass (`plan`), so a batch of several rows
costs two or three passes for five positions. Exact zeros are expected where there is no dependency: a masked
attention weight is exactly 0, so is its gradient.

Each sample serves the claims that hold at it: causality (no input after t in the same example), example independence
(no input of another row), packed independence (no input of another example packed in the same row).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

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
    starts = {(b, s) for b in (seg.packed_rows if seg is not None else []) for s, _ in seg.spans[b]} if seg else set()
    unique: dict[tuple[int, int], Sample] = {}
    for s in out:
        kept = unique.setdefault((s.b, s.t), s)
        kept.causal = kept.causal or s.causal or (s.b, s.t) in claimed
        kept.packed = kept.packed or s.packed or (s.b, s.t) in starts
    return list(unique.values())


def starts_example(s: Sample, seg: Segments | None) -> bool:
    """A packed example's first token: what it may see is itself (causal or not), so several of them share a pass."""
    if seg is None or not s.packed or int(seg.ids[s.b, s.t]) < 0:
        return False
    return s.t == 0 or int(seg.ids[s.b, s.t - 1]) != int(seg.ids[s.b, s.t])


def plan(samples: list[Sample], B: int, seg: Segments | None, passes: int | None) -> list[list[int]]:
    """The backward passes: groups of samples whose outputs are summed into one cotangent. A group holds at most one
    sample per row (or only first tokens of packed examples): anything one sample may not see, the others of its group
    may not see either, so a group's map shows every leak of its samples (a sum of nonzero dependencies with random
    weights is not zero). With several rows, the first pass holds one sample alone: the rows it must not see are
    exactly the other rows (example independence). `passes`: at most that many (the samples that do not fit are left
    out; None: no limit)."""
    groups: list[list[int]] = []
    for i, s in enumerate(samples):
        for gi, g in enumerate(groups):
            if gi == 0 and B >= 2:
                continue
            if all(samples[j].b != s.b or (starts_example(samples[j], seg) and starts_example(s, seg)) for j in g):
                g.append(i)
                break
        else:
            if passes is None or len(groups) < passes:
                groups.append([i])
    return groups


def dependency_maps(lay: Layout, samples: list[Sample], leaves: list[Leaf], groups: list[list[int]] | None = None,
                    seed: int = 0) -> torch.Tensor:
    """(passes, leaves, B, T) float: for each group of samples (one backward pass each), how much the sum of their
    outputs (each projected on a random vector) depends on each input position of each leaf (absolute, summed over the
    features)."""
    groups = groups if groups is not None else [[i] for i in range(len(samples))]
    out = lay.output
    gen = torch.Generator().manual_seed(seed)
    tensors = [lf.tensor for lf in leaves]
    T = lay.T if lay.positions else 1
    maps = torch.zeros(len(groups), len(tensors), lay.B, T)
    for gi, g in enumerate(groups):
        total = None
        for i in g:
            s = samples[i]
            row = out[s.b, s.t] if lay.positions else out[s.b]
            r = torch.randn(row.shape, generator=gen).to(device=row.device, dtype=row.dtype)
            term = (row * r).sum()
            total = term if total is None else total + term
        assert total is not None
        grads = torch.autograd.grad(total, tensors, retain_graph=True, allow_unused=True)
        for li, grad in enumerate(grads):
            if grad is None:
                continue
            a = grad.detach().abs().float()
            a = a.reshape(lay.B, T, -1).sum(-1) if lay.positions else a.reshape(lay.B, -1).sum(-1).unsqueeze(-1)
            maps[gi, li] = a.cpu()
    return maps


# a dependency smaller than this share of the largest allowed one is rounding or a backward's own noise (a masked
# attention weight is exactly 0, and so is its gradient)
NOISE = 1e-6


def _regions(lay: Layout, s: Sample, seg: Segments | None, B: int, T: int) -> dict[str, torch.Tensor]:
    """What sample s may see ("allowed") and, per kind of leak, what it must not."""
    pos = torch.arange(T)
    own = torch.zeros(B, T, dtype=torch.bool)
    own[s.b] = True
    out: dict[str, torch.Tensor] = {}
    if seg is not None and lay.positions and int(seg.ids[s.b, s.t]) >= 0 and len(seg.spans[s.b]) >= 2:
        ids = seg.ids[s.b]
        own = torch.zeros(B, T, dtype=torch.bool)
        own[s.b] = ids == ids[s.t]
        other = torch.zeros(B, T, dtype=torch.bool)
        other[s.b] = (ids != ids[s.t]) & (ids >= 0)
        out["packed"] = other
    allowed = own
    if s.causal and lay.positions:
        future = own & (pos > s.t).unsqueeze(0)
        out["future"] = future
        allowed = own & ~future
    if B >= 2:
        rows = torch.ones(B, T, dtype=torch.bool)
        rows[s.b] = False
        out["example"] = rows
    out["allowed"] = allowed
    return out


def judge(lay: Layout, samples: list[Sample], maps: torch.Tensor, seg: Segments | None,
          groups: list[list[int]] | None = None, claim_leaf: int | None = None) -> list[Leak]:
    """The leaks each pass shows: for each sample of the pass, dependencies on what it must not see (inputs after t in
    its own example, inputs of another example packed in its row, and, for a sample alone in its pass, inputs of
    another row) that no other sample of the pass may see either. Causality is judged on the leaf the next-element
    claim is about (`claim_leaf`: a decoder's tokens, not the encoder's it attends to), the rest on every leaf."""
    groups = groups if groups is not None else [[i] for i in range(len(samples))]
    B, T = maps.shape[2], maps.shape[3]
    leaks: list[Leak] = []
    for gi, g in enumerate(groups):
        every = maps[gi].sum(0)
        regions = [_regions(lay, samples[i], seg, B, T) for i in g]
        allowed = torch.stack([r["allowed"] for r in regions]).any(0)
        for i, reg in zip(g, regions, strict=True):
            for kind in ("packed", "future", "example"):
                if kind not in reg or (kind == "example" and len(g) > 1):
                    continue
                dep = maps[gi, claim_leaf] if kind == "future" and claim_leaf is not None else every
                ok = float((dep * allowed).max()) if bool(allowed.any()) else 0.0
                hit = (dep > NOISE * ok) & reg[kind] & ~allowed
                if bool(hit.any()):
                    worst = float((dep * (reg[kind] & ~allowed)).max())
                    leaks.append(Leak(kind, samples[i].b, samples[i].t, [(int(b), int(t)) for b, t in hit.nonzero().tolist()],
                                      worst / ok if ok > 0 else float("inf")))
    return leaks


def alone(lay: Layout, samples: list[Sample], leaves: list[Leaf], seg: Segments | None, leaks: list[Leak],
          seed: int = 0, claim_leaf: int | None = None) -> list[Leak]:
    """The leaks of shared passes measured again, one sample per pass, so that each is its own sample's."""
    keys = {(lk.b, lk.t) for lk in leaks}
    idx = [i for i, s in enumerate(samples) if (s.b, s.t) in keys]
    if not idx:
        return leaks
    mine = [samples[i] for i in idx]
    return judge(lay, mine, dependency_maps(lay, mine, leaves, None, seed), seg, None, claim_leaf)


def pairs_examples(lay: Layout) -> bool:
    """An output that pairs the batch's examples: (B, B, ...) per example (a contrastive model's similarity matrix,
    logits[i, j] = f(image i) . g(text j)), where row i reads every example by design and each entry reads its two."""
    return not lay.positions and lay.B >= 2 and lay.output.dim() >= 2 and lay.output.shape[1] == lay.B


def pair_leaks(lay: Layout, leaks: list[Leak], leaves: list[Leaf], seed: int = 0) -> tuple[list[Leak], int]:
    """On an output that pairs examples, a row that reads other examples measured again entry by entry: entry (i, j)
    may read examples i and j only. Returns the leaks that remain (an entry reading a third example, with the rows
    it reads) and how many entries were measured. Other outputs: the leaks as they are, 0."""
    rows = sorted({lk.b for lk in leaks if lk.kind == "example"})
    if not rows or not pairs_examples(lay):
        return leaks, 0
    gen = torch.Generator().manual_seed(seed)
    tensors = [lf.tensor for lf in leaves]
    kept = [lk for lk in leaks if lk.kind != "example"]
    measured = 0
    for i in rows:
        for j in sorted({(i + 1) % lay.B, lay.B - 1 if i != lay.B - 1 else 0}):
            entry = lay.output[i, j]
            r = torch.randn(entry.shape, generator=gen).to(device=entry.device, dtype=entry.dtype)
            grads = torch.autograd.grad((entry * r).sum(), tensors, retain_graph=True, allow_unused=True)
            dep = torch.zeros(lay.B)
            for grad in grads:
                if grad is not None:
                    dep += grad.detach().abs().float().reshape(lay.B, -1).sum(-1).cpu()
            measured += 1
            allowed = torch.zeros(lay.B, dtype=torch.bool)
            allowed[[i, j]] = True
            ok = float(dep[allowed].max())
            hit = (dep > NOISE * ok) & ~allowed
            if bool(hit.any()):
                worst = float(dep[hit].max())
                kept.append(Leak("example", i, 0, [(int(b), 0) for b in hit.nonzero().flatten().tolist()],
                                 worst / ok if ok > 0 else float("inf")))
                break
    return kept, measured
