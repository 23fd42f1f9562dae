"""What a loss is made of, read from its graph at backward(): its constant scaling and reduction with their lines
(when anomaly mode recorded the forward's tracebacks), and the targets of its cross-entropy nodes. Read in both setups
of a comparison, so the located cause (located.py) is a measured difference between them."""

from __future__ import annotations

from typing import Any

import torch

from gradprobe.checks.steps.accumulation import _traced_line, scaling_walk
from gradprobe.checks.steps.facts import LossScaling
from gradprobe.userframes import UserCode

_NLL = ("NllLossBackward0", "NllLoss2DBackward0", "NllLossNdBackward0")
# nodes a loss passes through unchanged on its way out of a wrapped model's forward (DDP's output sink)
_PASSTHROUGH = ("_DDPSinkBackward",)


def scaling_of(loss: torch.Tensor, user: UserCode | None) -> tuple[LossScaling, Any]:
    """As checks/steps/accumulation.py loss_scaling (the constant multiplications and divisions at the top of the loss's
    graph, the reduction under them), walking through the nodes a wrapped model's output passes unchanged; and the
    node under the scaling."""
    return scaling_walk(loss, user, _PASSTHROUGH)


def read_loss(loss: torch.Tensor, user: UserCode | None) -> tuple[dict[str, Any], list[tuple[dict | None, torch.Tensor]]]:
    """The loss's scaling record (ops, their lines, the reduction and its line) and its cross-entropy targets."""
    s, node = scaling_of(loss, user)
    scaling = {"ops": s.ops, "lines": s.lines, "in_library": s.in_library, "reduction": s.reduction, "count": s.count,
               "stopped_at": s.stopped_at, "own_count": _total_weight(node),
               "line": _traced_line(node, user)[0] if user is not None and node is not None else None}
    return scaling, (loss_targets(loss, user) if user is not None else [])


def _total_weight(node: Any) -> float | None:
    """The number of targets (the total weight) a cross-entropy node averaged or summed over, when it is one."""
    total = getattr(node, "_saved_total_weight", None) if node is not None and node.name() in _NLL else None
    try:
        return float(total) if isinstance(total, torch.Tensor) and total.numel() == 1 else None
    except RuntimeError:
        return None


def loss_targets(loss: torch.Tensor, user: UserCode, limit: int = 2000) -> list[tuple[dict | None, torch.Tensor]]:
    """The targets of the cross-entropy (NLL) nodes in the loss's graph, with the user line that computed each, in a
    fixed walk order (the same graph gives the same order in both setups)."""
    out: list[tuple[dict | None, torch.Tensor]] = []
    seen: set[int] = set()
    stack = [loss.grad_fn]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if node.name() in _NLL:
            target = getattr(node, "_saved_target", None)
            if isinstance(target, torch.Tensor):
                out.append((_traced_line(node, user)[0], target.detach().to("cpu", copy=True)))
        stack.extend(nxt for nxt, _ in node.next_functions if nxt is not None)
    return out
