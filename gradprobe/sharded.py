"""FSDP2 (`torch.distributed.fsdp.fully_shard`) parameters as autograd sees them.

A module under fully_shard holds sharded DTensor parameters; its forward swaps in unsharded parameters (new tensor
objects, all-gathered from the shards), and those are the leaves of the loss's graph. Code that matches graph leaves
to a model's parameters by identity maps the unsharded ones back to their sharded parameter here. Read from FSDP2's
per-module state (`FSDPParam.sharded_param` / `_unsharded_param`); nothing on a model without FSDP2.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn


def _param_groups(m: nn.Module) -> list[Any]:
    get_state = getattr(m, "_get_fsdp_state", None)
    if not callable(get_state):
        return []
    try:
        state = get_state()
    except Exception:  # a module FSDP2 did not finish setting up
        return []
    groups = list(getattr(state, "_fsdp_param_groups", None) or [])
    one = getattr(state, "_fsdp_param_group", None)
    if one is not None and one not in groups:
        groups.append(one)
    return groups


def unsharded_to_sharded(model: nn.Module) -> dict[int, nn.Parameter]:
    """id(an unsharded parameter FSDP2 swaps in for the forward) -> the sharded parameter it stands for."""
    out: dict[int, nn.Parameter] = {}
    for m in model.modules():
        for group in _param_groups(m):
            for fp in getattr(group, "fsdp_params", None) or []:
                unsharded = getattr(fp, "_unsharded_param", None)
                sharded = getattr(fp, "sharded_param", None)
                if unsharded is not None and sharded is not None:
                    out[id(unsharded)] = sharded
    return out


__all__ = ["unsharded_to_sharded"]
