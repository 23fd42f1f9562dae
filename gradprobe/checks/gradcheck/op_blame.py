"""Which line of a custom module's forward makes it differ from its reference (where GP804 points).

Both forwards run once on the same float64 inputs and weights under a TorchFunctionMode that logs every op: the
custom module's ops with the user line that ran them, the tensors they read (resolved to the op that produced each, so
in-place ops chain correctly) and a copy of what they made; the reference's ops only by value. An op of the custom
module is *verified* when the reference computed the same value somewhere (same shape and dtype; floating values within
the comparison's tolerance, others exactly).

On the path from the differing output back to the inputs, the culprit is the first op (in execution order) that is not
verified although everything it reads is, and after which nothing on the way to the output is verified again: where the
computation leaves what the reference computes for good. A fused op's own novel intermediates (verified again further
down) are not blamed. With no such op, the op that produced the output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from gradprobe.userframes import UserCode

MAX_OPS = 4000


@dataclass(eq=False)
class _Op:
    loc: dict[str, Any] | None
    reads: list[_Op]
    out: torch.Tensor
    index: int
    consumers: list[_Op] = field(default_factory=list)


def _tensors(xs: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for x in xs:
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            out += _tensors(x)
        elif isinstance(x, dict):
            out += _tensors(list(x.values()))
    return out


class OpLog(TorchFunctionMode):
    """Logs ops run under it: with their user line and producers (`user` given), or only their values."""

    def __init__(self, user: UserCode | None) -> None:
        super().__init__()
        self.user = user
        self.ops: list[_Op] = []
        self.by_id: dict[int, _Op] = {}
        self.values: list[torch.Tensor] = []
        self._live: list[torch.Tensor] = []  # keeps logged tensors alive so their ids stay unique

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        ins = _tensors(args) + _tensors(list((kwargs or {}).values()))
        reads = [self.by_id[id(t)] for t in ins if id(t) in self.by_id]
        out = func(*args, **(kwargs or {}))
        if len(self.ops) + len(self.values) >= MAX_OPS:
            return out
        for o in (out if isinstance(out, (tuple, list)) else (out,)):
            if not isinstance(o, torch.Tensor):
                continue
            value = o.detach().clone()  # the mode is off inside its own handler: these ops are not logged
            if self.user is None:
                self.values.append(value)
                continue
            op = _Op(self.user.innermost(skip=2), reads, value, len(self.ops))
            for r in reads:
                r.consumers.append(op)
            self.ops.append(op)
            self.by_id[id(o)] = op
            self._live.append(o)
        return out


def _same(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        scale = float(b.abs().max()) if b.numel() else 0.0
        return bool(torch.allclose(a, b, rtol=tol, atol=tol * max(scale, 1e-12), equal_nan=True))
    return bool(torch.equal(a, b))


def culprit(custom: OpLog, reference: OpLog, output: torch.Tensor, tol: float) -> dict[str, Any] | None:
    """The user line where the custom forward leaves what the reference computes, for the op that made `output`."""
    last = custom.by_id.get(id(output))
    if last is None:
        return None
    path: dict[int, _Op] = {}
    stack = [last]
    while stack:
        op = stack.pop()
        if op.index in path:
            continue
        path[op.index] = op
        stack += op.reads
    by_shape: dict[tuple, list[torch.Tensor]] = {}
    for v in reference.values:
        by_shape.setdefault((tuple(v.shape), v.dtype), []).append(v)
    ok = {i: any(_same(op.out, r, tol) for r in by_shape.get((tuple(op.out.shape), op.out.dtype), []))
          for i, op in path.items()}
    down_ok: dict[int, bool] = {}
    for i in sorted(path, reverse=True):  # consumers run later: their answers are known first
        down_ok[i] = any(c.index in path and (ok[c.index] or down_ok.get(c.index, False)) for c in path[i].consumers)
    for i in sorted(path):
        op = path[i]
        if not ok[i] and not down_ok[i] and all(ok.get(r.index, True) for r in op.reads) and op.loc is not None:
            return op.loc
    return last.loc
