"""The dtype a custom Function computes in, and the gradcheck tolerances that follow from it.

gradcheck runs a Function on float64 copies of its inputs. A Function that casts inside (`x.float()`, `.to(torch.bfloat16)`,
an output buffer made in float32) still computes in that lower precision, and a float64 check with a step of 1e-6 and
rtol 1e-3 then fails on a correct backward: central differences divide float32 rounding (about 1e-7 of the output) by
the step. The dtype is measured, not guessed: the forward runs once on the float64 copies under a TorchFunctionMode that
records every op which turns floating inputs into a floating output; the least precise such output dtype is the one the
Function computes in (a boolean mask cast to float32 does not count: it has no floating input).

Below float64, with eps = torch.finfo(dtype).eps and n the longest last dimension of the inputs (the reduction size of
a norm, a softmax or a matmul):

- step h = eps^(1/3), the central-difference step that balances rounding (eps / h) against truncation (h^2);
- rtol = max(rtol asked, C * eps^(2/3) * sqrt(n)), C = 4: rounding of n-term sums grows like sqrt(n) * eps, divided
  by h; atol = max(atol asked, rtol' * max(1, max |output|)) where rtol' is that measured term.

float32 with n = 16 gives h = 4.9e-3 and rtol 3.9e-4; a correct float32-internal norm passes, a backward that drops a
factor (a weight, a coefficient) is off by far more. bf16 (eps 7.8e-3) gives h = 0.2 and rtol 0.6 x sqrt(n)/4: a
bf16-internal Function is checked coarsely, and the tolerance in the facts says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import CodeType
from typing import Any

import torch
from torch.autograd.function import Function
from torch.overrides import TorchFunctionMode

from gradprobe.checks.gradcheck.backward_lines import _code_of, _tensors, frame_line
from gradprobe.userframes import location

C = 4.0
DEFAULT_STEP = 1e-6


@dataclass
class Precision:
    """The dtype a Function computes in on float64 inputs and the tolerances of its check."""

    dtype: torch.dtype
    atol: float
    rtol: float
    step: float
    n: int  # the reduction size used
    where: dict[str, Any] | None = None  # the forward's line whose op first produced `dtype`

    @property
    def lowered(self) -> bool:
        return self.dtype != torch.float64

    def facts(self) -> dict[str, Any]:
        return {"compute_dtype": str(self.dtype).replace("torch.", ""), "step": self.step, "rtol": self.rtol,
                "atol": self.atol, "reduction_size": self.n, "at": self.where,
                "formula": "step = eps^(1/3); rtol = max(rtol, 4 eps^(2/3) sqrt(n)); atol = max(atol, that x "
                           "max(1, max|output|)); eps = torch.finfo(compute dtype).eps, n = longest last dimension"}


class _Dtypes(TorchFunctionMode):
    """Records, for the ops run while the Function's forward is on the stack, the least precise floating output made
    from floating inputs, and the forward's line that made it first."""

    def __init__(self, code: CodeType | None) -> None:
        super().__init__()
        self.code = code
        self.lowest: torch.dtype = torch.float64
        self.line: int | None = None

    def _forward_line(self) -> int | None:
        return frame_line(self.code, 2)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        ins = [a for a in _tensors(args) + _tensors(list((kwargs or {}).values())) if a.is_floating_point()]
        if ins:
            for o in outs:
                if isinstance(o, torch.Tensor) and o.is_floating_point() and _eps(o.dtype) > _eps(self.lowest):
                    self.lowest, self.line = o.dtype, self._forward_line()
        return out


def _eps(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps)


def measure(cls: type[Function], inputs64: tuple, atol: float, rtol: float) -> Precision:
    """Run the forward once on the float64 copies and derive the check's tolerances from the dtype it computes in."""
    code = _code_of(cls, "forward")
    filename = code.co_filename if code is not None else None
    rec = _Dtypes(code)
    try:
        with torch.no_grad(), rec:
            out = cls.apply(*inputs64)
    except Exception:  # the check itself reports a forward that fails on float64 copies
        return Precision(torch.float64, atol, rtol, DEFAULT_STEP, 1)
    if rec.lowest == torch.float64:
        return Precision(torch.float64, atol, rtol, DEFAULT_STEP, 1)
    eps = _eps(rec.lowest)
    n = max([int(a.shape[-1]) for a in inputs64 if isinstance(a, torch.Tensor) and a.dim() > 0] or [1])
    tol = C * eps ** (2 / 3) * math.sqrt(n)
    outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
            if isinstance(o, torch.Tensor) and o.is_floating_point() and o.numel()]
    scale = max([1.0] + [float(o.detach().abs().max()) for o in outs])
    where = location(filename, rec.line, f"{cls.__name__}.forward") if filename and rec.line else None
    return Precision(rec.lowest, max(atol, tol * scale), max(rtol, tol), eps ** (1 / 3), n, where)
