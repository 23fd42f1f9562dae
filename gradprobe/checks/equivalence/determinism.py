"""The same computation in both setups of a comparison: dropout off (p=0: torch.nn.functional's dropout family and
scaled_dot_product_attention's dropout_p) and BatchNorm layers normalising with their running statistics (per-process
or per-micro-batch batch statistics differ by design; SyncBatchNorm, whose statistics are the global batch's, is left
as it is). Patched for the length of the comparison only, in both setups alike, and counted for the report."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Undo = list[tuple[Any, str, Any]]


class SameComputation:
    def __init__(self) -> None:
        self.dropout_calls = 0
        self.batchnorm: set[int] = set()
        self._undo: Undo = []

    def __enter__(self) -> SameComputation:
        self.install()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    def remove(self) -> None:  # as a hook handle: scriptmode's undo() takes it back with the watch's other patches
        self.uninstall()

    def uninstall(self) -> None:
        for owner, name, value in reversed(self._undo):
            setattr(owner, name, value)
        self._undo.clear()

    def install(self) -> None:
        import torch.nn.functional as F
        from torch.nn.modules.batchnorm import _BatchNorm

        watch = self
        for name in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"):
            orig = getattr(F, name, None)
            if orig is None:
                continue

            def off(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False,
                    _orig: Callable[..., Any] = orig) -> torch.Tensor:
                if training and p > 0:
                    watch.dropout_calls += 1
                return _orig(input, p, False, inplace)

            setattr(F, name, off)
            self._undo.append((F, name, orig))
        sdpa = F.scaled_dot_product_attention

        def attention(*args: Any, **kwargs: Any) -> torch.Tensor:
            if len(args) > 4 and args[4]:
                args = (*args[:4], 0.0, *args[5:])
                watch.dropout_calls += 1
            elif kwargs.get("dropout_p"):
                kwargs["dropout_p"] = 0.0
                watch.dropout_calls += 1
            return sdpa(*args, **kwargs)

        F.scaled_dot_product_attention = attention
        self._undo.append((F, "scaled_dot_product_attention", sdpa))
        bn_forward = _BatchNorm.forward

        def batchnorm(module: _BatchNorm, input: torch.Tensor) -> torch.Tensor:
            if not (module.training and module.track_running_stats and module.running_mean is not None):
                return bn_forward(module, input)
            watch.batchnorm.add(id(module))
            module.training = False
            try:
                return bn_forward(module, input)
            finally:
                module.training = True

        _BatchNorm.forward = batchnorm  # type: ignore[method-assign,assignment]
        self._undo.append((_BatchNorm, "forward", bn_forward))
