"""DistributedDataParallel's gradient sync per micro-batch, for the paired runs (pairwatch.py): DDP reads
`require_backward_grad_sync` in its forward (it prepares the reducer there), so a backward all-reduces the accumulated
gradient only after a forward that ran with it True; `no_sync()` and scripts that switch it by hand set it. Recorded
per backward() of a DDP model: the flag its forward read, and the user line that last set it. checks/equivalence/
located.py names the step whose last micro-batch's forward ran with it False (its gradient stayed local)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn


class SyncWatch:
    def __init__(self, w: Any):
        self.w = w  # the PairWatch
        self.at_forward: bool | None = None
        self.set_at: dict[str, Any] | None = None
        self.events: list[dict[str, Any]] = []

    def install(self) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        watch = self
        orig = DDP.__setattr__

        def set_attr(module: nn.Module, name: str, value: Any) -> None:
            if name == "require_backward_grad_sync" and watch.w._main():
                watch.set_at = watch.w.user.innermost(skip=2)
            orig(module, name, value)

        DDP.__setattr__ = set_attr  # type: ignore[method-assign,assignment]
        self.w._undo.append((DDP, "__setattr__", orig))

    def on_top_call(self, module: nn.Module) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        if isinstance(module, DDP) and torch.is_grad_enabled():
            self.at_forward = bool(module.require_backward_grad_sync)

    def on_backward(self) -> None:
        if self.at_forward is not None and len(self.events) < 200:
            self.events.append({"step": self.w.step, "forward_sync": self.at_forward, "set_at": self.set_at})
        self.at_forward = None
