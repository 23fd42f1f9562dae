"""GP1xx: is every tensor that should learn registered, a leaf, and trainable?

Walks every module's `__dict__` for what `named_parameters()` cannot see:
plain tensors that require grad, parameters and modules in Python containers,
non-leaf "parameters", `module.requires_grad = ...` attributes, learnable
buffers, and grad mode switched off; and lists tied and frozen parameters.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn as nn

from gradprobe.report import make_report
from gradprobe.checks.torchcompat import is_grad_mode_decorator_frame
from gradprobe.userframes import location
from gradprobe.findings import Finding, make_finding

RULES = {
    "GP101": {
        "name": "unregistered-tensor", "severity": "error", "rank": 5,
        "summary": "A module attribute is a plain float tensor that the forward reads on the path to the loss and that is neither a Parameter nor a buffer (with or without requires_grad=True; also when created lazily in forward).",
        "why": "Plain tensors are not in parameters(), so optimizers built from model.parameters() never update them, .to() does not move them and state_dict() does not save them. Error when made by a random initialiser or used as a weight/bias/scale; a warning (suggesting register_buffer) when it looks like a constant table.",
        "example": "self.logit_scale = torch.tensor(2.6, requires_grad=True)",
        "fix": "Wrap it: self.logit_scale = nn.Parameter(torch.tensor(2.6))",
    },
    "GP102": {
        "name": "parameter-in-plain-container", "severity": "error", "rank": 6,
        "summary": "nn.Parameters held in a Python list, tuple or dict attribute.",
        "why": "nn.Module registers only attributes that are Parameters or Modules themselves; a list of Parameters is invisible to parameters() and the optimizer.",
        "example": "self.weights = [nn.Parameter(torch.ones(1)) for _ in range(3)]",
        "fix": "Use nn.ParameterList (or nn.ParameterDict): self.weights = nn.ParameterList(nn.Parameter(torch.ones(1)) for _ in range(3))",
    },
    "GP103": {
        "name": "module-in-plain-container", "severity": "error", "rank": 7,
        "summary": "nn.Modules held in a Python list, tuple or dict attribute.",
        "why": "Submodules in a plain container are not registered: their parameters are missing from parameters(), the optimizer and state_dict(), and .to()/.train() do not reach them.",
        "example": "self.blocks = [Block(d) for _ in range(4)]",
        "fix": "Use nn.ModuleList (or nn.ModuleDict): self.blocks = nn.ModuleList(Block(d) for _ in range(4))",
    },
    "GP104": {
        "name": "learnable-buffer", "severity": "warning", "rank": 99,
        "summary": "A buffer requires grad, or a weight-like tensor was registered as a buffer: named like a weight, or made by a random initialiser in the user's code and used by the step as a layer's weight or applied to the input path (an error when diagnose measures that it got a gradient: it is on the loss's path and never optimized).",
        "why": "Buffers are state, not parameters: no optimizer built from parameters() updates them.",
        "example": "self.register_buffer('scale', torch.ones(d, requires_grad=True))",
        "fix": "Make it a parameter: self.scale = nn.Parameter(torch.ones(d))",
    },
    "GP105": {
        "name": "frozen-parameters", "severity": "info", "rank": 99,
        "summary": "Parameters with requires_grad=False.",
        "why": "Frozen parameters get no gradient; fine when meant (a frozen backbone), a bug when not.",
        "example": "model.backbone.requires_grad_(False)",
        "fix": "If they should learn: module.requires_grad_(True), and rebuild the optimizer.",
    },
    "GP107": {
        "name": "requires-grad-attribute", "severity": "error", "rank": 8,
        "summary": "module.requires_grad = ... set as a plain attribute.",
        "why": "nn.Module has no requires_grad property: the assignment creates an unrelated attribute and the parameters keep their flag.",
        "example": "block.requires_grad = True",
        "fix": "Call the method: block.requires_grad_(True)",
    },
    "GP108": {
        "name": "tied-parameters", "severity": "info", "rank": 99,
        "summary": "One Parameter reachable under several names (weight tying).",
        "why": "Tied weights are trained once and get the sum of both gradients; freezing one name freezes both.",
        "example": "self.decoder.weight = self.encoder.weight",
        "fix": "Nothing to fix if the tie is meant.",
    },
    "GP109": {
        "name": "non-leaf-parameter", "severity": "error", "rank": 9,
        "summary": "A tensor meant to be learned is not a leaf.",
        "why": "nn.Parameter(x).to(...) / .cuda() / .half() return a new non-leaf tensor: it is not registered, and its .grad stays None; the real leaf is lost.",
        "example": "self.w = nn.Parameter(torch.zeros(3)).to(torch.float64)",
        "fix": "Convert first, wrap last: self.w = nn.Parameter(torch.zeros(3, dtype=torch.float64))",
    },
    "GP110": {
        "name": "no-trainable-parameters", "severity": "error", "rank": 3,
        "summary": "The model has no parameter with requires_grad=True.",
        "why": "Nothing can learn; backward raises 'element 0 of tensors does not require grad'.",
        "example": "model.requires_grad_(False) before building the optimizer",
        "fix": "Unfreeze what should learn: module.requires_grad_(True)",
    },
    "GP111": {
        "name": "grad-mode-disabled", "severity": "error", "rank": 4,
        "summary": "Gradient recording is off when the forward runs.",
        "why": "Under no_grad / inference_mode no graph is recorded, so nothing reaches the parameters.",
        "example": "torch.set_grad_enabled(False) at import, or @torch.no_grad() on forward",
        "fix": "Remove the global switch or the decorator from the training path; keep no_grad for evaluation only.",
    },
}

_MODULE_INTERNALS = set(vars(nn.Module()).keys())
_WEIGHT_WORDS = {"weight", "bias", "scale", "logit_scale", "temperature", "gamma", "beta", "alpha", "embedding", "prompt"}


def _mask_like(buf) -> bool:
    """A constant, not a weight: a scalar (a fixed activation beta), or a matrix of only 0/1 (a GPT causal
    `bias = tril(ones)`) or holding -inf (an additive mask)."""
    if buf.dim() == 0:
        return True
    if buf.dim() < 2 or buf.numel() == 0:
        return False
    with torch.no_grad():
        return bool(((buf == 0) | (buf == 1)).all()) or bool(torch.isinf(buf).any())


def _grad_mode_decorator(fn) -> str | None:
    """If fn is wrapped by torch's no_grad/inference_mode decorator, the context's name."""
    code = getattr(fn, "__code__", None)
    if not is_grad_mode_decorator_frame(code):
        return None
    for cell in fn.__closure__ or ():
        try:
            val = cell.cell_contents
        except ValueError:
            continue
        ctx = getattr(val, "__self__", val)
        if isinstance(ctx, (torch.no_grad, torch.inference_mode)):
            return type(ctx).__name__
        if isinstance(ctx, torch.set_grad_enabled) and not getattr(ctx, "mode", True):
            return "set_grad_enabled(False)"
    return None


def _rhs(loc: dict | None, attr: str) -> str | None:
    """The right-hand side of the user's `self.<attr> = <rhs>` line, to write the fix in their own words."""
    import re

    m = re.match(rf"^\s*[\w.]*\b{re.escape(attr)}\s*=\s*(.+?)\s*(#.*)?$", (loc or {}).get("code", ""))
    return m.group(1) if m else None


def _container_items(value, depth: int = 0):
    """(dotted key, item) of a list/tuple/dict attribute, one level of nesting included ([[p, q], [r]])."""
    if isinstance(value, (list, tuple)):
        pairs = [(str(i), v) for i, v in enumerate(value)]
    elif isinstance(value, dict):
        pairs = [(str(k), v) for k, v in value.items()]
    else:
        return None
    if depth == 0:
        flat = []
        for k, v in pairs:
            inner = _container_items(v, 1) if isinstance(v, (list, tuple, dict)) else None
            flat += [(f"{k}.{k2}", v2) for k2, v2 in inner] if inner is not None else [(k, v)]
        return flat
    return pairs


def parameter_table(model: nn.Module) -> tuple[list[dict], list[dict]]:
    aliases: dict[int, list[str]] = {}
    by_name: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
        by_name[name] = p
    rows = []
    for name, p in model.named_parameters():
        rows.append({
            "name": name, "shape": list(p.shape), "dtype": str(p.dtype).replace("torch.", ""),
            "device": str(p.device), "requires_grad": p.requires_grad, "is_leaf": p.is_leaf,
            "numel": p.numel(), "tied_aliases": [a for a in aliases[id(p)] if a != name],
        })
    buffers = [
        {"name": n, "shape": list(b.shape), "dtype": str(b.dtype).replace("torch.", ""),
         "device": str(b.device), "requires_grad": b.requires_grad}
        for n, b in model.named_buffers()
    ]
    return rows, buffers


def check_registration(model: nn.Module, build_record=None, info: dict | None = None, user=None) -> list[Finding]:
    """All GP1xx findings (but GP100/GP106, which arise while loading) on a live model."""
    info = info or {}
    site = (lambda m, a: build_record.site_of(m, a)) if build_record is not None else (lambda m, a: None)
    findings: list[Finding] = []
    registered = {id(p) for p in model.parameters()}

    for mod_name, module in model.named_modules():
        prefix = f"{mod_name}." if mod_name else ""
        for attr, value in vars(module).items():
            if attr in _MODULE_INTERNALS:
                continue
            path = prefix + attr
            if isinstance(value, torch.Tensor):
                if not value.requires_grad:
                    continue
                if value.is_leaf:
                    findings.append(make_finding(
                        "GP101",
                        f"`{path}` is a plain tensor with requires_grad=True stored on {type(module).__name__}, "
                        "not an nn.Parameter: parameters(), the optimizer and state_dict() never see it.",
                        parameters=[path], location=site(module, attr),
                        evidence={"attribute": path, "shape": list(value.shape), "dtype": str(value.dtype), "is_leaf": True},
                        fix=_gp101_fix(attr, _rhs(site(module, attr), attr)),
                    ))
                else:
                    op = type(value.grad_fn).__name__ if value.grad_fn is not None else None
                    findings.append(make_finding(
                        "GP109",
                        f"`{path}` is a non-leaf tensor (made by {op}) stored on {type(module).__name__}: "
                        "it is not registered and its .grad stays None; the leaf Parameter it came from is lost.",
                        parameters=[path], location=site(module, attr),
                        evidence={"attribute": path, "grad_fn": op, "shape": list(value.shape), "dtype": str(value.dtype)},
                        fix=f"Create the tensor with the final dtype/device, then wrap it: self.{attr} = nn.Parameter(torch.full(..., dtype=..., device=...))",
                    ))
                continue
            if _container_items(value) is not None:
                _check_container(module, attr, path, value, registered, site, findings)
                continue
            if attr == "requires_grad" and isinstance(value, bool):
                names = [prefix + n for n, _ in module.named_parameters()]
                flags = sorted({p.requires_grad for p in module.parameters()})
                findings.append(make_finding(
                    "GP107",
                    f"`{path} = {value}` sets a plain attribute on {type(module).__name__}; its "
                    f"{len(names)} parameters keep requires_grad={flags[0] if len(flags) == 1 else flags}.",
                    parameters=names, location=site(module, attr),
                    evidence={"module": mod_name or "(root)", "attribute_value": value, "parameter_requires_grad": flags},
                    fix=f"{mod_name.rpartition('.')[2] or 'module'}.requires_grad_({value})  # the method, not an attribute",
                ))
        for bname, buf in module._buffers.items():
            if buf is None:
                continue
            path = prefix + bname
            if buf.requires_grad or (bname in _WEIGHT_WORDS and buf.is_floating_point() and "running" not in bname
                                     and not _mask_like(buf)):
                findings.append(make_finding(
                    "GP104",
                    f"buffer `{path}` " + ("requires grad" if buf.requires_grad else "is named like a learned weight")
                    + ": buffers are never optimized.",
                    parameters=[path], location=site(module, bname),
                    evidence={"buffer": path, "requires_grad": buf.requires_grad, "shape": list(buf.shape)},
                ))
        kind = _grad_mode_decorator(type(module).forward)
        names = [prefix + n for n, p in module.named_parameters() if p.requires_grad] if kind else []
        if names:  # a parameterless no_grad module (sinusoidal positions) takes no gradient from anyone
            fwd = type(module).forward
            wrapped = getattr(fwd, "__wrapped__", fwd)
            code = getattr(wrapped, "__code__", None)
            loc = location(code.co_filename, code.co_firstlineno, code.co_name) if code is not None else None
            library = code is not None and user is not None and not user.is_user_file(code.co_filename)
            findings.append(make_finding(
                "GP111",
                f"{type(module).__name__}.forward is decorated with {kind}: its {len(names)} parameters never get a gradient"
                + (" through it. It is library code, decorated by design (e.g. an index computation)." if library else "."),
                parameters=names, location=loc, evidence={"module": mod_name or "(root)", "decorator": kind, "library_code": library},
                severity="warning" if library else None,
                fix="Nothing to fix if the library means it; train these parameters with the objective the library provides for them."
                if library else None,
            ))

    if info.get("grad_enabled_after_build") is False:
        off = list(getattr(build_record, "grad_off_sites", None) or [])
        findings.append(make_finding(
            "GP111",
            "Gradient recording is globally off after importing and building the target "
            + (f"(torch.set_grad_enabled(False) at line {off[-1][1]['line']} of {off[-1][1]['file'].rsplit('/', 1)[-1]})."
               if off else "(torch.set_grad_enabled(False) or a no_grad context left open)."),
            parameters=[n for n, p in model.named_parameters() if p.requires_grad],
            location=off[-1][1] if off else None,
            evidence={"torch.is_grad_enabled()": False},
        ))

    params = list(model.named_parameters())
    frozen = [n for n, p in params if not p.requires_grad]
    freeze_at = _freeze_site(build_record, [p for _, p in params if not p.requires_grad])
    if params and len(frozen) == len(params):
        findings.append(make_finding(
            "GP110",
            f"None of the model's {len(params)} parameters requires grad: nothing can learn"
            + (f" (frozen at line {freeze_at['line']} of {freeze_at['file'].rsplit('/', 1)[-1]})." if freeze_at else "."),
            parameters=frozen[:50], location=freeze_at, evidence={"parameters": len(params), "frozen": len(frozen)},
        ))
    elif frozen:
        findings.append(make_finding(
            "GP105",
            f"{len(frozen)} of {len(params)} parameters are frozen (requires_grad=False).",
            parameters=frozen, location=freeze_at,
            evidence={"frozen": len(frozen), "total": len(params),
                      "frozen_numel": sum(p.numel() for n, p in params if not p.requires_grad)},
        ))
    aliases: dict[int, list[str]] = {}
    by_name: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
        by_name[name] = p
    for names in aliases.values():
        if len(names) > 1:
            findings.append(make_finding(
                "GP108", f"One Parameter is reachable as {', '.join(names)} (tied): "
                + ("trained once, with both gradients summed." if by_name[names[0]].requires_grad else
                   "frozen (requires_grad=False) under every name; unfreezing one name unfreezes all."),
                parameters=names, evidence={"names": names},
            ))
    if not params and not any(f["code"] in ("GP101", "GP102", "GP103", "GP109") for f in findings):
        findings.append(make_finding("GP110", "The model has no parameters at all.", evidence={"parameters": 0}))
    return _one_per_line(findings)


_PER_ATTRIBUTE = ("GP101", "GP102", "GP103", "GP104", "GP109")


def _one_per_line(findings: list[Finding]) -> list[Finding]:
    """One finding per cause: a class whose __init__ line registers wrongly is instantiated many times
    (every block's norm), and each instance would repeat the same finding; merge them, naming every instance."""
    out: list[Finding] = []
    by_line: dict[tuple, Finding] = {}
    for f in findings:
        loc = dict(f.get("location") or {})
        key = (f["code"], f["severity"], loc.get("file"), loc.get("line"))
        if f["code"] not in _PER_ATTRIBUTE or loc.get("line") is None:
            out.append(f)
            continue
        first = by_line.get(key)
        if first is None:
            by_line[key] = f
            out.append(f)
            continue
        first["parameters"] = list(first["parameters"]) + [p for p in f["parameters"] if p not in first["parameters"]]
        first["evidence"].setdefault("instances", 1)
        first["evidence"]["instances"] += 1
    for f in by_line.values():
        n = f["evidence"].get("instances")
        if n:
            f["message"] += f" The same line made {n} such attributes: {', '.join(f['parameters'][:6])}{'...' if len(f['parameters']) > 6 else ''}."
    return out


def _freeze_site(build_record, tensors: list) -> dict | None:
    """The user line that froze most of `tensors` (requires_grad_(False) / requires_grad = False), if recorded."""
    table = getattr(build_record, "frozen_sites", None) or {}
    hits = [table[id(t)][1] for t in tensors if id(t) in table]
    if not hits:
        return None
    counts = Counter((h["file"], h["line"]) for h in hits)
    top = counts.most_common(1)[0][0]
    return next(h for h in hits if (h["file"], h["line"]) == top)


# ops in which a tensor acts as a layer's weight: the other operand is the input path
_WEIGHT_OPS = {"matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "addmm", "baddbmm", "addmv", "mv", "einsum", "linear",
               "bilinear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
               "tensordot", "embedding"}
_SCALE_OPS = {"mul", "__mul__", "__rmul__", "div", "__truediv__", "__rtruediv__", "add", "__add__", "__radd__",
              "sub", "__sub__", "__rsub__", "addcmul", "layer_norm", "group_norm", "batch_norm"}
_RANDOM_INIT = re.compile(r"\b(randn|rand|randn_like|rand_like|normal_?|uniform_?|trunc_normal_|kaiming_\w+|xavier_\w+|"
                          r"orthogonal_|sparse_|empty)\s*\(")


def _as_weight(use: dict) -> bool:
    """The attribute is the weight operand of the op (not the input a layer's own weight is applied to)."""
    op, pos = use["op"], use.get("position")
    if op in ("linear", "bilinear", "embedding") or op.startswith("conv"):
        return pos == ({"bilinear": 2}.get(op, 1) if op != "embedding" else 1)
    return op in _WEIGHT_OPS


def plain_tensor_attributes(model: nn.Module) -> dict[str, torch.Tensor]:
    """Float tensors held as plain module attributes (not Parameters, not buffers) that do not require grad."""
    found: dict[str, torch.Tensor] = {}
    for mod_name, module in model.named_modules():
        prefix = f"{mod_name}." if mod_name else ""
        for attr, value in vars(module).items():
            if attr in _MODULE_INTERNALS or not isinstance(value, torch.Tensor) or isinstance(value, nn.Parameter):
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
    site: dict | None  # the user's line that set it, if recorded
    seen: list[dict]  # the ops that combined it with other data (tracer.plain_uses)
    as_weight: bool  # the weight operand of a layer op
    random_made: bool  # set by a random initialiser

    @property
    def ops(self) -> list[str]:
        return [u["op"] for u in self.seen]

    @property
    def weight_op(self) -> str:
        return next(u["op"] for u in self.seen if _as_weight(u))

    def applied(self, also: tuple[str, ...] = ()) -> bool:
        """Applied to the input path: scaled, shifted, a layer op's operand, handed to a custom Function (or `also`)."""
        return any(op in _SCALE_OPS or op in _WEIGHT_OPS or op.endswith(".apply") or op in also for op in self.ops)


def _attribute_use(model: nn.Module, path: str, seen: list[dict], build_record) -> _AttributeUse | None:
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


def buffer_use_findings(model: nn.Module, watched: dict[str, tuple[torch.Tensor, int]], uses: dict[str, list[dict]],
                        build_record=None) -> list[Finding]:
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
        why = (f"used as a weight (`{use.weight_op}` with the input path)" if use.as_weight
               else f"made by a random initialiser and applied to the input path (`{use.ops[0]}`)")
        out.append(make_finding(
            "GP104",
            f"buffer `{path}` of {type(use.owner).__name__} is {why}: buffers are never optimized, so it keeps its initial value.",
            parameters=[path], location=use.site or seen[0].get("location"),
            evidence={"buffer": path, "requires_grad": False, "shape": list(buf.shape), "read_by": seen,
                      "used_as_weight": use.as_weight, "random_initialiser": use.random_made},
            fix=f"self.{use.attr} = nn.Parameter({_rhs(use.site, use.attr) or '<the same initial value>'})  # if it should learn",
        ))
    return _one_per_line(out)


def plain_tensor_findings(model: nn.Module, uses: dict[str, list[dict]], build_record=None) -> list[Finding]:
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
        owner, attr, site, ops, as_weight = use.owner, use.attr, use.site, use.ops, use.as_weight
        rhs = _rhs(site, attr)
        evidence = {"attribute": path, "shape": list(value.shape), "dtype": str(value.dtype), "requires_grad": False,
                    "read_by": seen, "used_as_weight": as_weight, "random_initialiser": use.random_made}
        if as_weight or (use.random_made and use.applied()):
            why = f"used as a weight (`{use.weight_op}` with the input path)" if as_weight \
                else "made by a random initialiser and applied to the input path"
            out.append(make_finding(
                "GP101",
                f"`{path}` is a plain tensor attribute of {type(owner).__name__} (no requires_grad, not an nn.Parameter), "
                f"{why}: it is never trained, .to() does not move it and state_dict() does not save it.",
                parameters=[path], location=site or (seen[0]["location"] if seen else None), evidence=evidence,
                fix=_gp101_fix(attr, rhs),
            ))
        else:
            f = make_finding(
                "GP101",
                f"`{path}` is a plain tensor attribute of {type(owner).__name__} read on the path to the loss "
                f"(by `{ops[0]}`): it is not trained (fine for a constant table), but .to() does not move it and "
                "state_dict() does not save it.",
                parameters=[path], location=site or (seen[0]["location"] if seen else None), evidence=evidence,
                fix=f"self.register_buffer({attr!r}, {rhs or '<the tensor>'}, persistent=False)  # a constant: moved by .to()"
                    "; or nn.Parameter(...) if it should learn",
            )
            f["severity"] = "warning"
            out.append(f)
    return _one_per_line(out)


def settle_buffers(findings: list[Finding], model: nn.Module, got_grad: set[int]) -> None:
    """After a measured step: a learnable buffer (GP104) that got a gradient is on the loss's path and never
    optimized, an error; one that got none stays the warning."""
    ids = {n: id(b) for n, b in model.named_buffers()}
    for f in findings:
        if f["code"] == "GP104" and f["parameters"] and ids.get(f["parameters"][0]) in got_grad:
            f["severity"] = "error"
            f["message"] = (f"buffer `{f['parameters'][0]}` requires grad and got a gradient in this step: it is on the "
                            "path to the loss, but buffers are never optimized, so it never learns.")
            f["evidence"]["got_gradient"] = True


def _gp101_fix(attr: str, rhs: str | None) -> str:
    import re

    if rhs:
        inner = re.sub(r",?\s*requires_grad\s*=\s*True", "", rhs)
        return f"self.{attr} = nn.Parameter({inner})  # registered: in parameters(), the optimizer and state_dict()"
    return f"self.{attr} = nn.Parameter(<the same initial value>)  # registers it"


def _check_container(module, attr, path, value, registered, site, findings):
    items = _container_items(value)
    rhs = _rhs(site(module, attr), attr)
    stray_params, stray_modules, stray_tensors = [], [], []
    for key, v in items:
        if isinstance(v, nn.Parameter):
            if id(v) not in registered:
                stray_params.append(f"{path}.{key}")
        elif isinstance(v, nn.Module):
            inner = [(f"{path}.{key}.{n}", p) for n, p in v.named_parameters()]
            if any(id(p) not in registered for _, p in inner):
                stray_modules.append((f"{path}.{key}", type(v).__name__, [n for n, p in inner if id(p) not in registered]))
        elif isinstance(v, torch.Tensor) and v.requires_grad:
            stray_tensors.append(f"{path}.{key}")
    kind = type(value).__name__
    if stray_params:
        repl = "nn.ParameterDict" if kind == "dict" else "nn.ParameterList"
        findings.append(make_finding(
            "GP102",
            f"`{path}` is a Python {kind} holding {len(stray_params)} nn.Parameter(s) that {type(module).__name__} "
            "does not register: the optimizer never updates them.",
            parameters=stray_params, location=site(module, attr),
            evidence={"attribute": path, "container": kind, "count": len(stray_params)},
            fix=f"self.{attr} = {repl}({rhs if rhs else '...'})  # instead of a plain {kind}",
        ))
    if stray_modules:
        repl = "nn.ModuleDict" if kind == "dict" else "nn.ModuleList"
        names = [n for _, _, ps in stray_modules for n in ps]
        findings.append(make_finding(
            "GP103",
            f"`{path}` is a Python {kind} holding {len(stray_modules)} module(s) "
            f"({', '.join(sorted({t for _, t, _ in stray_modules}))}) whose {len(names)} parameters are not registered.",
            parameters=names, location=site(module, attr),
            evidence={"attribute": path, "container": kind, "modules": [m for m, _, _ in stray_modules],
                      "unregistered_parameters": len(names)},
            fix=f"self.{attr} = {repl}({rhs if rhs else '...'})  # instead of a plain {kind}",
        ))
    if stray_tensors:
        findings.append(make_finding(
            "GP101",
            f"`{path}` is a Python {kind} holding {len(stray_tensors)} plain tensor(s) with requires_grad=True: not registered.",
            parameters=stray_tensors, location=site(module, attr),
            evidence={"attribute": path, "container": kind},
            fix=f"self.{attr} = nn.ParameterList(nn.Parameter(t) for t in ...)",
        ))


def inspect_parameters(model: nn.Module, build_record=None, info: dict | None = None) -> dict:
    """The registration report: findings GP101-GP111 plus the parameter and buffer tables."""
    findings = check_registration(model, build_record, info)
    rows, buffers = parameter_table(model)
    trainable = {id(p): p for p in model.parameters() if p.requires_grad}
    total = {id(p): p for p in model.parameters()}
    summary = [
        f"{len(rows)} parameters ({sum(p.numel() for p in total.values()):,} values), "
        f"{len(trainable)} trainable ({sum(p.numel() for p in trainable.values()):,} values), {len(buffers)} buffers."
    ]
    return make_report(
        "inspect_parameters", findings, summary,
        parameters=rows, buffers=buffers,
        counts={"parameters": len(rows), "trainable": len(trainable),
                "numel": sum(p.numel() for p in total.values()),
                "trainable_numel": sum(p.numel() for p in trainable.values())},
    )


def inspect_report(loaded) -> dict:
    """The inspect_parameters tool on a loaded target."""
    return inspect_parameters(loaded.model, loaded.record, loaded.info)
