"""Break candidates: ops whose output left the autograd graph, what kind of cut each is, and the op tables behind it.

A candidate is recorded by the recording mode (checks/trace/recording.py) for every op whose input
required grad but whose output does not (or that leaves torch, or whose derivative is zero).
Its `kind` says what cut the path; `CUT_FAMILY` groups kinds that one finding code reports
(the attribution merges the causes of one family at one user line into one finding).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

Location = dict[str, Any]

LEFT_OPS = {"item", "tolist", "numpy", "__array__", "__float__", "__int__", "__index__", "__complex__"}
REWRAP_OPS = {"tensor", "as_tensor", "asarray", "from_numpy", "frombuffer"}
DETACH_OPS = {"detach", "detach_"}
INPLACE_DUNDERS = {"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__ipow__", "__setitem__",
                   "__iand__", "__ior__", "__ixor__"}
# new tensors that take only the shape, dtype and device of their input, never its values: not a cut
SHAPE_ONLY_OPS = {"zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like", "randint_like",
                  "new_zeros", "new_ones", "new_empty", "new_full", "size", "dim", "numel", "__len__"}
ZERO_DERIVATIVE_OPS = {"round", "floor", "ceil", "trunc", "sign", "frac_", "round_", "floor_", "ceil_", "sign_",
                       "heaviside"}

# kinds that one finding reports together (same code): a value that left torch and one rebuilt from data are one
# family, so are an op with no gradient and one whose derivative is zero
CUT_FAMILY = {"detach": "detach", "no_grad": "no_grad", "left": "left", "rewrap": "left", "nondiff": "nondiff",
              "zero_derivative": "nondiff", "process": "process"}


def family_of(kind: str) -> str:
    """The family of a candidate's kind ("other" for a cut none of the precise codes describes)."""
    return CUT_FAMILY.get(kind, "other")


def is_inplace(name: str, kwargs: Mapping[str, Any]) -> bool:
    """`x.add_(y)`, `x += y`, `x[i] = v`, `F.relu(x, inplace=True)`."""
    return (name.endswith("_") and not name.startswith("_")) or name in INPLACE_DUNDERS or kwargs.get("inplace") is True


def leaf_inplace_target(name: str, args: Any, kwargs: Any) -> torch.Tensor | None:
    """The leaf an in-place op under grad mode modifies (the tensor itself or the base of its view) when it requires
    grad: the op torch will refuse. Called by the tracer only for ops whose inputs require grad."""
    if not args or not isinstance(args[0], torch.Tensor) or not torch.is_grad_enabled() or not is_inplace(name, kwargs):
        return None
    t = args[0]
    if not t.is_leaf and t._is_view() and t._base is not None:
        t = t._base
    return t if t.is_leaf and t.requires_grad else None


def kind_of(name: str, grad_on: bool, outs: tuple[torch.Tensor, ...]) -> str:
    """What cut the path at op `name`: the order decides (a detach under no_grad is a detach)."""
    if name in DETACH_OPS or name == ".data":
        return "detach"
    if not grad_on:
        return "no_grad"
    if name in LEFT_OPS:
        return "left"
    if name in REWRAP_OPS:
        return "rewrap"
    if name in ZERO_DERIVATIVE_OPS:
        return "zero_derivative"
    if outs and not (outs[0].is_floating_point() or outs[0].is_complex()):
        return "nondiff"
    return "other"


class Candidate:
    """One op that cut (or may have cut) the path from the loss to the parameters behind its inputs."""

    __slots__ = ("index", "kind", "op", "location", "grad_enabled", "inputs", "direct", "disable_site",
                 "left_at", "came_back_at", "process_at", "backwards_before", "indexes", "all_zero")

    def __init__(self, index: int, kind: str, op: str, location: Location | None, grad_enabled: bool,
                 inputs: list[torch.Tensor], direct: bool, disable_site: Location | None) -> None:
        self.index, self.kind, self.op, self.location = index, kind, op, location
        self.grad_enabled, self.inputs, self.direct, self.disable_site = grad_enabled, inputs, direct, disable_site
        self.left_at: Location | None = None
        self.came_back_at: Location | None = None
        self.process_at: Location | None = None
        self.backwards_before = 0
        # its integer/bool output (or a value carrying it) selected from a float tensor: {"op", "location",
        # "into_grad": whether what it selected from requires grad} (argmin -> codebook[idx], ids -> embedding)
        self.indexes: dict[str, Any] | None = None
        self.all_zero = False  # every value of its numeric (not bool) output is zero (a cast that truncated everything)

    @property
    def selects_for_grad(self) -> bool:
        """A selection by design: the gradient reaches what it selects from through the indexing op itself."""
        return bool(self.indexes and self.indexes["into_grad"])

    def can_explain(self, n_backward: int) -> bool:
        """A cut explains a missing gradient only if a backward ran after it, and a value that left
        torch only if it came back (a loss.item() for logging cuts nothing)."""
        if n_backward and self.backwards_before >= n_backward:
            return False
        return not (self.kind == "left" and self.came_back_at is None)

    def where(self) -> Location | None:
        """The user line a finding about this cut points at: where no_grad was entered, where the value left torch
        (the `.item()` / `.numpy()` that came back later), where it was pickled, else the op itself."""
        if self.kind == "no_grad" and self.disable_site:
            return self.disable_site
        if self.kind == "left" and self.left_at and self.came_back_at:
            return self.left_at  # the `.item()` / `.numpy()` is the cause; where the value comes back is where it shows
        if self.kind in ("left", "process") and self.came_back_at:
            return self.came_back_at
        if self.kind == "process" and self.process_at:
            return self.process_at
        return self.location


def outputs(out: Any) -> tuple[torch.Tensor, ...]:
    """The tensors an op returned."""
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, (list, tuple)):
        return tuple(o for o in out if isinstance(o, torch.Tensor))
    return ()


def is_cut(o: torch.Tensor, inputs: list[torch.Tensor]) -> bool:
    """An output is cut off the graph when it does not require grad, or is a history-less view
    (views made under no_grad keep requires_grad=True but have no grad_fn)."""
    if not o.requires_grad:
        return True
    return o.grad_fn is None and o.is_leaf and not any(o is i for i in inputs)


# where ops take an additive bias: positional index, and the keyword
_BIAS_AT = {"linear": 2, "conv1d": 2, "conv2d": 2, "conv3d": 2, "conv_transpose1d": 2, "conv_transpose2d": 2,
            "conv_transpose3d": 2, "layer_norm": 3, "group_norm": 3, "batch_norm": 4, "instance_norm": 4,
            "addmm": 0, "addmv": 0, "addbmm": 0, "baddbmm": 0}


def bias_operand(name: str, t: torch.Tensor, args: Any, kwargs: Mapping[str, Any]) -> bool:
    """Whether t is the op's additive bias (a zero bias gates nothing: it cannot explain a zero gradient)."""
    at = _BIAS_AT.get(name)
    if at is None:
        return False
    return (len(args) > at and args[at] is t) or kwargs.get("bias") is t or (at == 0 and kwargs.get("input") is t)


def storage_ptr(t: torch.Tensor) -> int | None:
    try:
        return int(t.untyped_storage().data_ptr())
    except Exception:
        return None
