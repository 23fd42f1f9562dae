"""What the model claims not to see, read from what the code does.

- **Next element.** The loss compares output position t with input position t+1. Read two ways, by values:
  from the loss's gradient with respect to the per-position output (a cross-entropy's gradient at a position sums
  to zero and is most negative at the target class, so the target of every position in the loss can be read), and
  from the batch (a target tensor whose row equals an input row moved by one). Where at least 90 % of the positions
  the loss reads have the next input as their target, the claim holds on those positions (a prefix the loss does not
  read, as in a prefix-LM, carries no claim). A target equal to the input at the same position (a masked LM, an
  autoencoder) is no next-element claim.
- **Examples.** A batch of several rows: each output row from its own input row; on an output that pairs the
  examples (B, B, ...), each entry (i, j) from examples i and j (jacobian.pair_leaks).
- **Packed rows.** Segments told by the batch's values (segments.py): each packed example from itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gradprobe.checks.dependencies.harness import Leaf, Probe, outputs_of
from gradprobe.checks.dependencies.segments import batch_entries

CLAIM_SHARE = 0.9


@dataclass
class Layout:
    """The per-position output and the leaves laid out like it: (B, T) positions, B examples."""

    output: torch.Tensor  # (B, T, ...) or (B, ...)
    positions: bool  # the output and the token leaves share (B, T)
    token_leaves: list[Leaf]  # leaves of shape (B, T, ...) (positions) or (B, ...) (examples)
    B: int
    T: int


@dataclass
class NextClaim:
    """The next-element claim: where it holds (b, t) and how it was read."""

    positions: list[tuple[int, int]]  # output positions whose target is the next input
    how: str
    matched: int
    read: int
    ids: torch.Tensor | None = None  # the token ids the claim is about
    leaf: Leaf | None = None
    notes: list[str] = field(default_factory=list)


def layout(probe: Probe) -> Layout | None:
    """The output to probe: one laid out per position like an input leaf (logits (B, T, V) for tokens (B, T)), else one
    laid out per example (a classifier's (B, C))."""
    outs = outputs_of(probe.out)
    leaves = [lf for lf in probe.leaves if lf.tensor.dim() >= 2]
    for o in sorted(outs, key=lambda o: -o.dim()):
        if o.dim() < 3:  # (B, T, features): a (B, F) output has no position axis
            continue
        tok = [lf for lf in leaves if lf.tensor.dim() >= 3 and tuple(lf.tensor.shape[:2]) == tuple(o.shape[:2])]
        if tok:
            return Layout(o, True, tok, o.shape[0], o.shape[1])
    for o in outs:
        ex = [lf for lf in probe.leaves if lf.tensor.dim() >= 1 and lf.tensor.shape[0] == o.shape[0]]
        if ex and o.shape[0] >= 1:
            return Layout(o, False, ex, o.shape[0], 1)
    return None


def ce_targets(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(targets, read) per position from a loss's gradient with respect to logits (B, T, V): a cross-entropy's gradient
    sums to zero over the classes and puts most of its negative mass on the target."""
    g = grad.detach().float()
    mass = g.abs().sum(-1)
    neg = g.clamp(max=0)
    target = neg.argmin(-1)
    top = -neg.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    read = (mass > 0) & (g.sum(-1).abs() <= 1e-3 * mass) & (top >= 0.5 * (-neg.sum(-1)))
    return target, read


def _shift_match(a: torch.Tensor, b: torch.Tensor, read: torch.Tensor, shift: int) -> tuple[int, int]:
    """(positions t in `read` where a[t] == b[t + shift], positions t in `read` with t + shift inside the row)."""
    T = a.shape[1]
    if shift >= T:
        return 0, 0
    r = read[:, : T - shift]
    hits = (a[:, : T - shift] == b[:, shift:]) & r
    return int(hits.sum()), int(r.sum())


def _from_loss(probe: Probe, lay: Layout, grad: torch.Tensor) -> NextClaim | None:
    target, read = ce_targets(grad)
    candidates = [lf for lf in lay.token_leaves if lf.ids is not None and tuple(lf.ids.shape[:2]) == (lay.B, lay.T)]
    for lf in candidates:
        ids = lf.ids.to(target.device)  # type: ignore[union-attr]
        hit1, n1 = _shift_match(target, ids, read, 1)
        hit0, n0 = _shift_match(target, ids, read, 0)
        if n1 >= 1 and hit1 >= CLAIM_SHARE * n1 and hit1 > hit0:
            T = lay.T
            ok = (read[:, : T - 1] & (target[:, : T - 1] == ids[:, 1:])).nonzero().tolist()
            return NextClaim([(b, t) for b, t in ok], "the loss's target at each position is the next input token (read "
                             "from the loss's gradient)", hit1, n1, ids, lf)
    return None


def _from_batch(probe: Probe, lay: Layout, batch: object) -> NextClaim | None:
    """A float input whose next position is another batch tensor's current one (a regression on the next step)."""
    for lf in lay.token_leaves:
        if lf.ids is not None or not lf.source.startswith("batch entry"):
            continue
        x = lf.tensor.detach()
        for where, y in batch_entries(batch):
            if y.shape != x.shape or not y.is_floating_point() or lay.T < 2:
                continue
            same = (y[:, :-1] == x[:, 1:]).reshape(lay.B, lay.T - 1, -1).all(-1)
            if float(same.float().mean()) >= CLAIM_SHARE:
                ok = same.nonzero().tolist()
                return NextClaim([(b, t) for b, t in ok], f"`{where}` is the input moved by one position", len(ok),
                                 same.numel(), None, lf)
    return None


def loss_grad(probe: Probe, lay: Layout) -> torch.Tensor | None:
    """The loss's gradient with respect to the per-position output (None without a loss, or when it does not reach it)."""
    if probe.loss is None or not lay.positions:
        return None
    try:
        return torch.autograd.grad(probe.loss, lay.output, retain_graph=True, allow_unused=True)[0]
    except RuntimeError:
        return None


def next_element(probe: Probe, lay: Layout, batch: object, grad: torch.Tensor | None) -> tuple[NextClaim | None, str]:
    """The next-element claim and, when there is none, why (for not_run)."""
    if not lay.positions or lay.T < 2:
        return None, "the model's output has no position axis laid out like its input (no per-position claim)"
    if grad is not None and lay.output.dim() == 3:
        claim = _from_loss(probe, lay, grad)
        if claim is not None:
            return claim, ""
    claim = _from_batch(probe, lay, batch)
    if claim is not None:
        return claim, ""
    if probe.loss is None:
        why = "no loss to read the targets from" + (f" ({probe.loss_error})" if probe.loss_error else "")
    else:
        why = "the loss's targets are not the inputs moved by one position (no next-element claim)"
    return None, why
