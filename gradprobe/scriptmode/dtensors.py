"""DTensors (FSDP2's sharded parameters and gradients) in the paired runs (pairwatch.py), compared whole.

- `whole(t)`: a DTensor gathered into the full tensor (`full_tensor()`: an all-gather every rank makes at the same point,
  the optimizer's step, a clip, the model's first call of a step, in the same order on every rank, as FSDP2's own
  collectives are); any other tensor as it is.
- `load_into(t, src)`: the full tensor `src` put into `t`; into a DTensor's local shard when `t` is one
  (`distribute_tensor` over its mesh and placements, a collective the reference's ranks make together).
"""

from __future__ import annotations

from typing import Any

import torch


def is_dtensor(t: Any) -> bool:
    return callable(getattr(t, "full_tensor", None)) and hasattr(t, "placements")


def whole(t: torch.Tensor) -> torch.Tensor:
    full: torch.Tensor = t.full_tensor() if is_dtensor(t) else t  # type: ignore[attr-defined]
    return full


def load_into(t: torch.Tensor, src: torch.Tensor) -> None:
    if is_dtensor(t):
        from torch.distributed.tensor import distribute_tensor

        shard = distribute_tensor(src.to(t.device, t.dtype), t.device_mesh, t.placements)  # type: ignore[attr-defined]
        t.to_local().copy_(shard.to_local())  # type: ignore[attr-defined]
    else:
        t.copy_(src.to(t.device, t.dtype))
