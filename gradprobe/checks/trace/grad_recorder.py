"""The gradients one step brought: post-accumulate hooks on every trainable parameter (and learnable buffer) record
whether it got a gradient, its norm and whether it is finite; the recording mode's companion (checks/trace/recording.py)."""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn as nn

from gradprobe.checks.core.torchcompat import untraced


def _sharded(t: torch.Tensor) -> bool:
    """A DTensor sharded across ranks (not every placement Replicate)."""
    placements = getattr(t, "placements", None)
    return placements is not None and any(type(p).__name__ != "Replicate" for p in placements)


class GradRecorder:
    """Post-accumulate hooks: which parameters got a gradient in this step, its norm, finiteness."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.got: dict[int, dict[str, Any]] = {}
        self._hooks: list[Any] = []
        self.zero_at_start: set[int] = set()

    def record(self, p: torch.Tensor) -> None:
        """Read a gradient that no hook saw (a parameter created during the step)."""
        self._hook(p)

    def _hook(self, p: torch.Tensor) -> None:
        g = p.grad
        if g is None:
            return
        rec = self.got.setdefault(id(p), {"norm": 0.0, "finite": True, "zero": True})
        with torch.no_grad(), untraced():
            # one pass over the gradient: its norm says finite and zero too (a second pass only if it overflowed)
            norm = float(torch.linalg.vector_norm(g.detach(), dtype=torch.float32))
            finite = math.isfinite(norm) or bool(torch.isfinite(g).all())
            rec["finite"] = rec["finite"] and finite
            rec["norm"] = norm if finite else float("nan")
            # a DTensor's norm here is its local shard's (FSDP2): a shard of zeros (embedding rows no token of the
            # batch used) says nothing of the whole gradient, which only all the ranks together hold
            rec["zero"] = rec["zero"] and norm == 0.0 and not _sharded(g)

    def __enter__(self) -> GradRecorder:
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        with torch.no_grad(), untraced():
            # exactly-zero trainable tensors before the step: zero-initialised partners (LoRA B, gates)
            self.zero_at_start = {id(p) for p in trainable if p.numel() and not bool(p.any())}
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook) for p in trainable]
        # buffers that require grad (learnable buffers, GP104): whether they got a gradient decides how bad they are
        self._hooks += [b.register_post_accumulate_grad_hook(self._hook) for b in self.model.buffers()
                        if b.requires_grad and b.is_leaf]
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        for h in self._hooks:
            h.remove()
        return False
