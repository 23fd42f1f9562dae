"""GP101 unregistered-tensor and GP104 learnable-buffer: a tensor that should learn is held where no optimizer sees it.

Both are found twice: statically, on the module walk (a plain tensor with requires_grad=True, a buffer that requires
grad or is named like a weight), and after the measured step, from how the step used a plain attribute or a buffer
(as a layer's weight, or made by a random initialiser and applied to the input path).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from gradprobe.checks.registration.module_walk import MODULE_INTERNALS, AttrFacts, Loc, ModuleFacts, one_per_line, rhs_of
from gradprobe.findings import Finding, Rule, Situation

if TYPE_CHECKING:  # loading imports the checks package: no import cycle at run time
    from gradprobe.loading import BuildRecord

GP101: Rule[AttrFacts] = Rule(
    code="GP101", name="unregistered-tensor", severity="error", rank=5,
    summary="A module attribute is a plain float tensor that the forward reads on the path to the loss and that is neither "
            "a Parameter nor a buffer (with or without requires_grad=True; also when created lazily in forward).",
    why="Plain tensors are not in parameters(), so optimizers built from model.parameters() never update them, .to() does "
        "not move them and state_dict() does not save them. Error when made by a random initialiser or used as a "
        "weight/bias/scale; a warning (suggesting register_buffer) when it looks like a constant table.",
    example="self.logit_scale = torch.tensor(2.6, requires_grad=True)",
    message="`{path}` is a plain tensor with requires_grad=True stored on {owner}, not an nn.Parameter: parameters(), the "
            "optimizer and state_dict() never see it.",
    fix="Wrap it: self.logit_scale = nn.Parameter(torch.tensor(2.6))",
    situations={
        "requires_grad": Situation(
            when="a plain tensor with requires_grad=True, set by a line the fix can reuse",
            fix="self.{attr} = nn.Parameter({value})  # registered: in parameters(), the optimizer and state_dict()"),
        "requires_grad_unseen": Situation(
            when="a plain tensor with requires_grad=True, set by no line that was recorded",
            fix="self.{attr} = nn.Parameter(<the same initial value>)  # registers it"),
        "container": Situation(
            when="plain tensors with requires_grad=True in a Python list, tuple or dict",
            message="`{path}` is a Python {kind} holding {count} plain tensor(s) with requires_grad=True: not registered.",
            fix="self.{attr} = nn.ParameterList(nn.Parameter(t) for t in ...)"),
        "weight": Situation(
            when="the step used it as the weight operand of a layer op (matmul, linear, conv, ...) with the input path",
            message="`{path}` is a plain tensor attribute of {owner} (no requires_grad, not an nn.Parameter), used as a "
                    "weight (`{op}` with the input path): it is never trained, .to() does not move it and state_dict() "
                    "does not save it.",
            fix="self.{attr} = nn.Parameter({value})  # registered: in parameters(), the optimizer and state_dict()"),
        "weight_unseen": Situation(
            when="... and the line that set it was not recorded",
            message="`{path}` is a plain tensor attribute of {owner} (no requires_grad, not an nn.Parameter), used as a "
                    "weight (`{op}` with the input path): it is never trained, .to() does not move it and state_dict() "
                    "does not save it.",
            fix="self.{attr} = nn.Parameter(<the same initial value>)  # registers it"),
        "random": Situation(
            when="made by a random initialiser in the user's code and applied to the input path (scaled, shifted)",
            message="`{path}` is a plain tensor attribute of {owner} (no requires_grad, not an nn.Parameter), made by a "
                    "random initialiser and applied to the input path: it is never trained, .to() does not move it and "
                    "state_dict() does not save it.",
            fix="self.{attr} = nn.Parameter({value})  # registered: in parameters(), the optimizer and state_dict()"),
        "random_unseen": Situation(
            when="... and the line that set it was not recorded",
            message="`{path}` is a plain tensor attribute of {owner} (no requires_grad, not an nn.Parameter), made by a "
                    "random initialiser and applied to the input path: it is never trained, .to() does not move it and "
                    "state_dict() does not save it.",
            fix="self.{attr} = nn.Parameter(<the same initial value>)  # registers it"),
        "constant": Situation(
            when="read on the path to the loss like a constant table (positions, masks, rotary caches)",
            severity="warning",
            message="`{path}` is a plain tensor attribute of {owner} read on the path to the loss (by `{op}`): it is not "
                    "trained (fine for a constant table), but .to() does not move it and state_dict() does not save it.",
            fix="self.register_buffer({name!r}, {value}, persistent=False)  # a constant: moved by .to(); or "
                "nn.Parameter(...) if it should learn"),
    },
)

GP104: Rule[ModuleFacts] = Rule(
    code="GP104", name="learnable-buffer", severity="warning", rank=99,
    summary="A buffer requires grad, or a weight-like tensor was registered as a buffer: named like a weight, or made by a "
            "random initialiser in the user's code and used by the step as a layer's weight or applied to the input path "
            "(an error when diagnose measures that it got a gradient: it is on the loss's path and never optimized).",
    why="Buffers are state, not parameters: no optimizer built from parameters() updates them.",
    example="self.register_buffer('scale', torch.ones(d, requires_grad=True))",
    message="buffer `{path}` requires grad: buffers are never optimized.",
    fix="Make it a parameter: self.scale = nn.Parameter(torch.ones(d))",
    situations={
        "weight_name": Situation(
            when="a float buffer named like a learned weight (weight, bias, scale, ...) that is no constant table",
            message="buffer `{path}` is named like a learned weight: buffers are never optimized."),
        "used_as_weight": Situation(
            when="made by a random initialiser and used by the step as a layer's weight",
            message="buffer `{path}` of {owner} is used as a weight (`{op}` with the input path): buffers are never "
                    "optimized, so it keeps its initial value.",
            fix="self.{attr} = nn.Parameter({value})  # if it should learn"),
        "random_applied": Situation(
            when="made by a random initialiser and applied to the input path (scaled, shifted, concatenated)",
            message="buffer `{path}` of {owner} is made by a random initialiser and applied to the input path (`{op}`): "
                    "buffers are never optimized, so it keeps its initial value.",
            fix="self.{attr} = nn.Parameter({value})  # if it should learn"),
        "got_gradient": Situation(
            when="diagnose measured that it got a gradient: it is on the loss's path and never optimized",
            severity="error",
            message="buffer `{path}` requires grad and got a gradient in this step: it is on the path to the loss, but "
                    "buffers are never optimized, so it never learns."),
    },
)

PER_ATTRIBUTE = {GP101.code, GP104.code}  # one finding per user line (see module_walk.one_per_line)
PLAIN_TENSOR_RULES = (GP101,)  # run on each attribute of the module walk
BUFFER_RULES = (GP104,)  # run on each module of the walk

_WEIGHT_WORDS = {"weight", "bias", "scale", "logit_scale", "temperature", "gamma", "beta", "alpha", "embedding", "prompt"}
# ops in which a tensor acts as a layer's weight: the other operand is the input path
_WEIGHT_OPS = {"matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "addmm", "baddbmm", "addmv", "mv", "einsum", "linear",
               "bilinear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
               "tensordot", "embedding"}
_SCALE_OPS = {"mul", "__mul__", "__rmul__", "div", "__truediv__", "__rtruediv__", "add", "__add__", "__radd__",
              "sub", "__sub__", "__rsub__", "addcmul", "layer_norm", "group_norm", "batch_norm"}
_RANDOM_INIT = re.compile(r"\b(randn|rand|randn_like|rand_like|normal_?|uniform_?|trunc_normal_|kaiming_\w+|xavier_\w+|"
                          r"orthogonal_|sparse_|empty)\s*\(")


def _mask_like(buf: torch.Tensor) -> bool:
    """A constant, not a weight: a scalar (a fixed activation beta), or a matrix of only 0/1 (a GPT causal
    `bias = tril(ones)`) or holding -inf (an additive mask)."""
    if buf.dim() == 0:
        return True
    if buf.dim() < 2 or buf.numel() == 0:
        return False
    with torch.no_grad():
        return bool(((buf == 0) | (buf == 1)).all()) or bool(torch.isinf(buf).any())


def _without_requires_grad(rhs: str) -> str:
    return re.sub(r",?\s*requires_grad\s*=\s*True", "", rhs)


@GP101.detector
def detect_plain_tensor(a: AttrFacts) -> Iterator[Finding]:
    """Static: a plain leaf tensor with requires_grad=True, or such tensors in a Python container."""
    if a.stray_tensors:
        yield GP101.finding("container", path=a.path, kind=a.container, count=len(a.stray_tensors), attr=a.attr,
                            parameters=a.stray_tensors, location=a.site, evidence={"attribute": a.path, "container": a.container})
    if not isinstance(a.value, torch.Tensor) or not a.value.is_leaf:
        return
    rhs = a.rhs
    yield GP101.finding("requires_grad" if rhs else "requires_grad_unseen", path=a.path, owner=a.owner_class, attr=a.attr,
                        value=_without_requires_grad(rhs) if rhs else None, parameters=[a.path], location=a.site,
                        evidence={"attribute": a.path, "shape": list(a.value.shape), "dtype": str(a.value.dtype),
                                  "is_leaf": True})


def _weight_named(b: Any) -> bool:
    return bool(b.name in _WEIGHT_WORDS and b.buf.is_floating_point() and "running" not in b.name and not _mask_like(b.buf))


@GP104.detector
def detect_learnable_buffer(m: ModuleFacts) -> Iterator[Finding]:
    """Static: a buffer that requires grad, or a float buffer named like a weight that is no constant table."""
    for b in m.buffers:
        if b.buf.requires_grad or _weight_named(b):
            yield GP104.finding(None if b.buf.requires_grad else "weight_name", path=b.path, parameters=[b.path],
                                location=b.site, evidence={"buffer": b.path, "requires_grad": b.buf.requires_grad,
                                                           "shape": list(b.buf.shape)})


# ---- after the measured step: how the step used plain attributes and buffers -------------------------------------

def _as_weight(use: dict[str, Any]) -> bool:
    """The attribute is the weight operand of the op (not the input a layer's own weight is applied to)."""
    op, pos = use["op"], use.get("position")
    if op in ("linear", "bilinear", "embedding") or op.startswith("conv"):
        return bool(pos == ({"bilinear": 2}.get(op, 1) if op != "embedding" else 1))
    return op in _WEIGHT_OPS


def plain_tensor_attributes(model: nn.Module) -> dict[str, torch.Tensor]:
    """Float tensors held as plain module attributes (not Parameters, not buffers) that do not require grad."""
    found: dict[str, torch.Tensor] = {}
    for mod_name, module in model.named_modules():
        prefix = f"{mod_name}." if mod_name else ""
        for attr, value in vars(module).items():
            if attr in MODULE_INTERNALS or not isinstance(value, torch.Tensor) or isinstance(value, nn.Parameter):
                continue
            if value.requires_grad or not value.is_floating_point() or value.device.type == "meta":
                continue
            found.setdefault(prefix + attr, value)
    return found


@dataclass
class _AttributeUse:
    """How the step used a module attribute (a plain tensor or a buffer) on its way to the loss."""
    owner: nn.Module
    attr: str
    site: Loc | None  # the user's line that set it, if recorded
    seen: list[dict[str, Any]]  # the ops that combined it with other data (tracer.plain_uses)
    as_weight: bool  # the weight operand of a layer op
    random_made: bool  # set by a random initialiser

    @property
    def ops(self) -> list[str]:
        return [u["op"] for u in self.seen]

    @property
    def weight_op(self) -> str:
        return str(next(u["op"] for u in self.seen if _as_weight(u)))

    @property
    def location(self) -> Loc | None:
        return self.site or (self.seen[0].get("location") if self.seen else None)

    def applied(self, also: tuple[str, ...] = ()) -> bool:
        """Applied to the input path: scaled, shifted, a layer op's operand, handed to a custom Function (or `also`)."""
        return any(op in _SCALE_OPS or op in _WEIGHT_OPS or op.endswith(".apply") or op in also for op in self.ops)


def _attribute_use(model: nn.Module, path: str, seen: list[dict[str, Any]],
                   build_record: BuildRecord | None) -> _AttributeUse | None:
    owner_path, _, attr = path.rpartition(".")
    try:
        owner = model.get_submodule(owner_path) if owner_path else model
    except AttributeError:
        return None
    site = build_record.site_of(owner, attr) if build_record is not None else None
    return _AttributeUse(owner, attr, site, seen, any(_as_weight(u) for u in seen),
                         bool(site and _RANDOM_INIT.search(site.get("code", ""))))


def float_buffers(model: nn.Module) -> dict[str, tuple[torch.Tensor, int]]:
    """Float buffers that do not require grad, with their version counter before the step."""
    return {n: (b, b._version) for n, b in model.named_buffers()
            if b.is_floating_point() and not b.requires_grad and b.device.type != "meta"}


def buffer_use_findings(model: nn.Module, watched: dict[str, tuple[torch.Tensor, int]], uses: dict[str, list[dict[str, Any]]],
                        build_record: BuildRecord | None = None) -> list[Finding]:
    """GP104 for a buffer the user's line made by a random initialiser and that the step used the way a learned
    tensor is used: as the weight operand of a layer op, or applied to the input path (scaled, shifted,
    concatenated, handed to a custom Function). Deterministic tables are constants by design; buffers the step
    updated in place (running statistics, EMA codebooks) or replaced are state."""
    out: list[Finding] = []
    current = dict(model.named_buffers())
    for path, (buf, version) in watched.items():
        seen = uses.get(path)
        if not seen or current.get(path) is not buf or buf._version != version:
            continue
        use = _attribute_use(model, path, seen, build_record)
        if use is None or not (use.random_made and (use.as_weight or use.applied(also=("cat",)))):
            continue  # a deterministic table (sinusoids, rotary frequencies, masks) is a constant by design
        out.append(GP104.finding(
            "used_as_weight" if use.as_weight else "random_applied", path=path, owner=type(use.owner).__name__,
            op=use.weight_op if use.as_weight else use.ops[0], attr=use.attr,
            value=rhs_of(use.site, use.attr) or "<the same initial value>",
            parameters=[path], location=use.site or seen[0].get("location"),
            evidence={"buffer": path, "requires_grad": False, "shape": list(buf.shape), "read_by": seen,
                      "used_as_weight": use.as_weight, "random_initialiser": use.random_made}))
    return one_per_line(out, PER_ATTRIBUTE)


def _plain_situation(use: _AttributeUse, rhs: str | None) -> str:
    if use.as_weight:
        return "weight" if rhs else "weight_unseen"
    if use.random_made and use.applied():
        return "random" if rhs else "random_unseen"
    return "constant"


def plain_tensor_findings(model: nn.Module, uses: dict[str, list[dict[str, Any]]],
                          build_record: BuildRecord | None = None) -> list[Finding]:
    """GP101 for plain float attributes that the step read together with the gradient path.

    An error when the attribute acts as a weight (an operand of matmul/linear/conv with the input path) or was made
    by a random initialiser and scales/shifts the path; otherwise (positions, masks, rotary caches) a warning that
    suggests register_buffer.
    """
    out: list[Finding] = []
    for path, seen in uses.items():
        use = _attribute_use(model, path, seen, build_record)
        value = vars(use.owner).get(use.attr) if use is not None else None
        if use is None or not isinstance(value, torch.Tensor):
            continue  # gone, or a buffer (watched too, for GP104): not a plain attribute
        rhs = rhs_of(use.site, use.attr)
        situation = _plain_situation(use, rhs)
        evidence = {"attribute": path, "shape": list(value.shape), "dtype": str(value.dtype), "requires_grad": False,
                    "read_by": seen, "used_as_weight": use.as_weight, "random_initialiser": use.random_made}
        op = use.weight_op if use.as_weight else (use.ops[0] if use.ops else "")
        fill = (rhs or "<the tensor>") if situation == "constant" else (_without_requires_grad(rhs) if rhs else None)
        out.append(GP101.finding(situation, path=path, owner=type(use.owner).__name__, op=op, attr=use.attr,
                                 name=use.attr, value=fill, parameters=[path], location=use.location, evidence=evidence))
    return one_per_line(out, PER_ATTRIBUTE)


def settle_buffers(findings: list[Finding], model: nn.Module, got_grad: set[int]) -> None:
    """After a measured step: a learnable buffer (GP104) that got a gradient is on the loss's path and never
    optimized, an error; one that got none stays the warning. Replaces those findings in place."""
    ids = {n: id(b) for n, b in model.named_buffers()}
    for i, f in enumerate(findings):
        if f["code"] == GP104.code and f["parameters"] and ids.get(f["parameters"][0]) in got_grad:
            settled = GP104.finding("got_gradient", path=f["parameters"][0], parameters=f["parameters"],
                                    location=f["location"], evidence={**f["evidence"], "got_gradient": True})
            settled["fix"] = f["fix"]  # the fix already written for this buffer stays
            findings[i] = settled
