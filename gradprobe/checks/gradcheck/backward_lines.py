"""Which line of a custom Function's backward computes the wrong gradient (where the wrong-derivative finding points).

The backward is run once (grad_output = ones, on the float64 inputs the check used)
under a TorchFunctionMode that records every op with the backward's line that ran it,
its input tensors and its output value. The forward is recorded the same way, on the
inputs and on the inputs nudged by +-eps, which gives every forward value and, for
any two forward values A and B of one shape, the elementwise derivative dA/dB.

A value the backward computes is *verified* when it equals a forward value (a
recomputation such as tanh(inner)) or one of those derivatives (d inner/dz); the
gradient of grad_output = ones is a derivative too. Grouped by line, the culprit is
the line whose values are not verified although every value it reads (from other
lines, the saved tensors and grad_output) is: the first place the computation leaves
what the forward supports. Among several such lines on the path to the wrong
gradient the first in execution order is named; with none (the backward computes
nothing traceable, e.g. `return grad * 2`), the line that produced the returned
gradient, else the caller's fallback (the return statement).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import CodeType
from typing import Any

import torch
from torch.autograd.function import Function
from torch.overrides import TorchFunctionMode

from gradprobe.checks.core.torchcompat import function_class_of_node

EPS = 1e-6
MAX_RECORDED = 2000  # ops recorded per pass
MAX_DERIVATIVE_VALUES = 80  # forward values whose pairwise derivatives are compared (quadratic)


@dataclass
class _Op:
    line: int
    inputs: list[int]
    out: torch.Tensor


def frame_line(code: CodeType | None, depth: int) -> int | None:
    """The line that `code`'s frame is at, looking outwards from the caller's frame `depth` levels up (a torch-function
    mode's hook asks for the user's line in the function it watches, through helpers that function calls)."""
    f = sys._getframe(depth + 1)
    while f is not None:
        if f.f_code is code:
            return f.f_lineno
        f = f.f_back  # type: ignore[assignment]
    return None


class _Recorder(TorchFunctionMode):
    """Records the float ops run by one function's own frame (or helpers it calls), with that frame's line."""

    def __init__(self, code: CodeType) -> None:
        super().__init__()
        self.code = code
        self.ops: list[_Op] = []
        self.by_id: dict[int, _Op] = {}

    def _line(self) -> int | None:
        return frame_line(self.code, 2)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if len(self.ops) < MAX_RECORDED and isinstance(out, torch.Tensor) and out.is_floating_point():
            line = self._line()
            if line is not None:
                ins = [id(a) for a in _tensors(args) + _tensors(list((kwargs or {}).values()))]
                op = _Op(line, ins, out)
                self.ops.append(op)
                self.by_id[id(out)] = op
        return out


def _tensors(xs: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for x in xs:
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            out += _tensors(x)
    return out


def _code_of(cls: type, name: str) -> CodeType | None:
    fn = cls.__dict__.get(name)
    fn = getattr(fn, "__func__", fn)
    return getattr(fn, "__code__", None)


def _forward_values(cls: type[Function], code: CodeType, inputs: tuple) -> list[torch.Tensor] | None:
    rec = _Recorder(code)
    with torch.no_grad(), rec:
        cls.apply(*inputs)
    return [op.out.detach() for op in rec.ops]


def _nudged(inputs: tuple, j: int, delta: float) -> tuple:
    return tuple(a.detach() + delta if i == j else a for i, a in enumerate(inputs))


def _reference_values(cls: type[Function], inputs: tuple, req: list[int], eps: float = EPS) -> list[torch.Tensor]:
    """Forward values and elementwise derivatives between forward values (inputs included)."""
    code = _code_of(cls, "forward")
    if code is None:
        return []
    base = _forward_values(cls, code, inputs)
    if base is None:
        return []
    refs = [*base, *(inputs[j].detach() for j in req)]
    for j in req:
        plus, minus = _forward_values(cls, code, _nudged(inputs, j, eps)), _forward_values(cls, code, _nudged(inputs, j, -eps))
        if plus is None or minus is None or len(plus) != len(base) or len(minus) != len(base):
            continue
        deltas = [(p - m) / (2 * eps) for p, m in zip(plus, minus, strict=True)] + [
            torch.ones_like(inputs[k].detach()) if k == j else torch.zeros_like(inputs[k].detach()) for k in req]
        if len(deltas) > MAX_DERIVATIVE_VALUES:
            continue
        for a in deltas:
            for b in deltas:
                if a is not b and a.shape == b.shape and bool((b.abs() > 1e-9).all()):
                    refs.append(a / b)
    return refs


def _verified(value: torch.Tensor, refs: list[torch.Tensor], rtol: float = 1e-5, atol: float = 1e-7) -> bool:
    v = value.detach()
    return any(r.shape == v.shape and torch.allclose(v, r.to(v.dtype), rtol=rtol, atol=atol) for r in refs)


def wrong_gradient_line(cls: type[Function], inputs: tuple, req: list[int], worst: int, eps: float = EPS,
                        rtol: float = 1e-5, atol: float = 1e-7) -> int | None:
    """The backward's line that computes input `worst`'s wrong gradient, or None when it cannot be told. A Function
    computing below float64 gives its own step and tolerances (equivalence/op_precision.py)."""
    code = _code_of(cls, "backward")
    if code is None:
        return None
    try:
        with torch.enable_grad():
            outs = cls.apply(*inputs)
        outs_t = [o for o in (outs if isinstance(outs, (tuple, list)) else (outs,)) if isinstance(o, torch.Tensor)]
        node = next((o.grad_fn for o in outs_t if o.grad_fn is not None), None)
        fn_cls = function_class_of_node(node)
        if node is None or fn_cls is None:
            return None
        grads_out = [torch.ones_like(o) for o in outs_t]
        rec = _Recorder(code)
        with torch.no_grad(), rec:
            returned = fn_cls.backward(node, *grads_out)  # the graph node is the ctx backward receives
        returned = returned if isinstance(returned, tuple) else (returned,)
        target = returned[worst] if worst < len(returned) else None
        if not isinstance(target, torch.Tensor) or id(target) not in rec.by_id:
            return None
        refs = _reference_values(cls, inputs, req, eps) + grads_out
    except Exception:  # localisation is best effort: the finding keeps the return line
        return None
    return _culprit_line(rec, rec.by_id[id(target)], refs, rtol, atol)


def _culprit_line(rec: _Recorder, target: _Op, refs: list[torch.Tensor], rtol: float = 1e-5, atol: float = 1e-7) -> int:
    # the ops on the path to the target, and per line what it produces for other lines and reads from them
    path: dict[int, _Op] = {}
    stack = [target]
    while stack:
        op = stack.pop()
        if id(op.out) in path:
            continue
        path[id(op.out)] = op
        stack += [rec.by_id[i] for i in op.inputs if i in rec.by_id]
    order = [op for op in rec.ops if id(op.out) in path]
    produced_by_line: dict[int, list[_Op]] = {}
    reads: dict[int, set[int]] = {}
    for op in order:
        for i in op.inputs:
            src = rec.by_id.get(i)
            if src is not None and src.line != op.line and id(src.out) in path:
                produced_by_line.setdefault(src.line, []).append(src)
                reads.setdefault(op.line, set()).add(src.line)
    produced_by_line.setdefault(target.line, []).append(target)
    ok = {line: all(_verified(op.out, refs, rtol, atol) for op in ops) for line, ops in produced_by_line.items()}
    for op in order:
        line = op.line
        if ok.get(line, True):
            continue
        if all(ok.get(src, True) for src in reads.get(line, set())):
            return line
    return target.line
