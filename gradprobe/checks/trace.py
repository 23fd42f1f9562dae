"""GP3xx: which parameters the loss cannot reach, where the path breaks in the user's code, and why.

One real step runs under the recording mode (checks/tracer.py: GradTracer and
GradRecorder). After the step, each parameter that was read but got no gradient
is attributed to the break candidates whose input graph reaches it
(checks/graphwalk.py), preferring those whose output reached the loss, then the
earliest. `.detach().numpy()` followed by `torch.from_numpy` becomes "left torch"
(GP304); a detached tensor that is pickled for another process becomes GP309.
The rules below decide each GP3xx code from what was recorded.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from gradprobe.checks._step import StepResult, attempt_step, module_of, param_names, run_step
from gradprobe.checks.graphwalk import chain, reach
from gradprobe.checks.torchcompat import (
    ANOMALY_FRAME,
    LOSS_DOES_NOT_REQUIRE_GRAD,
    LOSS_NOT_DIFFERENTIABLE,
    LOSS_NOT_SCALAR,
    allocation_failure,
    explain_backward_error,
    inplace_detail,
    tensor_hooks,
    is_anomaly_forward_trace,
)
from gradprobe.checks.tracer import Candidate, GradRecorder, GradTracer
from gradprobe.findings import Finding, make_finding
from gradprobe.flowchart import flow_graph, flow_mermaid
from gradprobe.report import make_report
from gradprobe.outcomes import resource_limit_finding

RULES = {
    "GP301": {
        "name": "param-gets-no-grad", "severity": "error", "rank": 34,
        "summary": "A trainable parameter that the forward read has .grad None after backward (a warning when nothing cut "
                   "the path and its output is simply not used by the loss: an unused pooler, head or branch).",
        "why": "The path from it to the loss is cut somewhere; the more precise GP30x codes say where when it can be located.",
        "example": "out = MyFn.apply(x, self.w)  # whose backward returns None for w",
        "fix": "Follow evidence.chain to the op that cut the path and keep the computation inside autograd.",
    },
    "GP302": {
        "name": "detach-in-forward", "severity": "error", "rank": 27,
        "summary": "The path is cut by .detach(), .data or detach_().",
        "why": "detach() returns a tensor with no history: everything computed before it gets no gradient from what comes after.",
        "example": "x_hat = ((x - mean) / std).detach()",
        "fix": "Remove the .detach() (or .data) on the training path; detach only values that must not be trained through.",
    },
    "GP303": {
        "name": "op-under-no-grad", "severity": "error", "rank": 28,
        "summary": "The path is cut because an op ran under no_grad / inference_mode (a warning when library code entered no_grad itself).",
        "why": "No graph is recorded under no_grad, so its outputs do not depend on the parameters as far as autograd knows.",
        "example": "@torch.no_grad()\ndef encode(self, x): ...  # reused by forward",
        "fix": "Remove the no_grad decorator/block from the training path, or call an undecorated twin in forward.",
    },
    "GP304": {
        "name": "left-torch", "severity": "error", "rank": 26,
        "summary": "The value left autograd (.item(), .tolist(), .numpy(), float()) and came back as a new tensor.",
        "why": "NumPy and Python numbers carry no autograd history; torch.tensor/torch.from_numpy makes a fresh leaf.",
        "example": "h = torch.from_numpy(clip(h.detach().numpy()))",
        "fix": "Do the computation with torch ops (torch.clamp, torch.quantile, ...) so it stays in the graph.",
    },
    "GP305": {
        "name": "non-differentiable-op", "severity": "error", "rank": 29,
        "summary": "The path goes through an op with no gradient (argmax, round, comparisons, integer casts).",
        "why": "Discrete ops have zero or no derivative; an integer tensor cannot carry a gradient.",
        "example": "ids = torch.cat([prompt, input_ids], 1).long()",
        "fix": "Keep the value continuous (softmax instead of argmax, embeddings instead of ids, a straight-through estimator).",
    },
    "GP306": {
        "name": "zero-gradient", "severity": "warning", "rank": 99,
        "summary": "A parameter's gradient is exactly zero (info when a zero-initialised partner such as LoRA B or a closed gate explains it).",
        "why": "Masked out, a dead ReLU, all labels ignored, or an attention mask that hides it: the parameter cannot learn from this batch.",
        "example": "attention_mask zero on the positions that use the parameter",
        "fix": "Check masks, ignore-index labels and activations on the path of this parameter.",
    },
    "GP307": {
        "name": "nonfinite-gradient", "severity": "error", "rank": 31,
        "summary": "A gradient holds NaN or Inf.",
        "why": "One NaN poisons every parameter the optimizer updates with it.",
        "example": "torch.sqrt(x) at x == 0, log(0), division by a zero norm",
        "fix": "Guard the op at the reported line (clamp, eps, log1p, safe norms).",
    },
    "GP308": {
        "name": "backward-failed", "severity": "error", "rank": 30, "consequence": True,
        "summary": "backward() raised.",
        "why": "In-place modification of a tensor saved for backward, a second backward through a freed graph, a leaf modified in place, inference tensors saved for backward, or a custom backward returning the wrong number of gradients.",
        "example": "h = torch.sigmoid(x); h += 1  # sigmoid saved its output",
        "fix": "See the message: use out-of-place ops, retain_graph=True only when needed, clone inference tensors.",
    },
    "GP309": {
        "name": "crossed-process-boundary", "severity": "error", "rank": 25,
        "summary": "A tensor on the loss's path, or a parameter, was sent to or received from another process.",
        "why": "Autograd graphs never cross processes: what comes back is a new tensor with no history, and a parameter's gradient computed in a worker never reaches the parent.",
        "example": "parts = pool.map(f, frames.detach().chunk(2))",
        "fix": "Keep the differentiable computation in the training process (vectorise it in torch); use processes only for data loading.",
    },
    "GP310": {
        "name": "loss-not-differentiable", "severity": "error", "rank": 35, "consequence": True,
        "summary": "The loss is not a scalar, does not require grad, or has no grad_fn.",
        "why": "backward() needs a scalar that depends on parameters through recorded ops.",
        "example": "loss = torch.tensor(loss_value)",
        "fix": "Compute the loss with torch ops from the model's output; reduce it to a scalar (.mean()).",
    },
    "GP311": {
        "name": "unused-parameter", "severity": "warning", "rank": 99,
        "summary": "A trainable parameter was never read by the forward on this batch.",
        "why": "It cannot get a gradient; DDP will also complain about it.",
        "example": "self.aux_head = nn.Linear(...)  # never called in forward",
        "fix": "Use it, freeze it, or remove it (DDP: find_unused_parameters=True if it is conditional).",
    },
    "GP312": {
        "name": "vanishing-or-exploding", "severity": "warning", "rank": 99,
        "summary": "Per-layer gradient norms span more than a set ratio.",
        "why": "Layers far below their neighbours barely learn; far above, they destabilise training.",
        "example": "a 50-layer plain MLP with sigmoid activations",
        "fix": "Normalisation layers, residual connections, better init, gradient clipping.",
    },
    "GP313": {
        "name": "grad-hook-altered", "severity": "warning", "rank": 90,  # before GP306: the hook is why it is zero
        "summary": "A registered hook changed the gradient.",
        "why": "A tensor or module backward hook that returns a new value replaces the gradient the optimizer sees.",
        "example": "p.register_hook(lambda g: g * 0)",
        "fix": "Check the hook; return None from hooks that only observe.",
    },
    "GP314": {
        "name": "non-leaf-grad-read", "severity": "warning", "rank": 99,
        "summary": "The user reads .grad of a non-leaf tensor.",
        "why": "Only leaves get .grad; a non-leaf's .grad stays None without retain_grad().",
        "example": "h = self.fc(x); ...; print(h.grad)",
        "fix": "Call h.retain_grad() before backward, or read the leaf parameter's .grad.",
    },
}

_KIND_TEXT = {
    "detach": "is cut by `{op}`", "no_grad": "is cut because `{op}` ran under no_grad/inference_mode",
    "left": "leaves autograd through `{op}` and comes back as a new tensor",
    "rewrap": "is rebuilt from data by `torch.{op}`, which has no history", "nondiff": "goes through `{op}`, which has no gradient",
    "zero_derivative": "goes through `{op}`, whose derivative is zero",
    "process": "crosses a process boundary: the tensor is pickled for another process and what comes back has no history",
    "other": "stops requiring grad at `{op}`",
}


def _code_of(kind: str) -> str:
    """The code of a break candidate's kind: what cut the path decides the rule."""
    if kind == "detach":
        return "GP302"
    if kind == "no_grad":
        return "GP303"
    if kind in ("left", "rewrap"):
        return "GP304"
    if kind in ("nondiff", "zero_derivative"):
        return "GP305"
    if kind == "process":
        return "GP309"
    return "GP301"


def _location_for(cand: Candidate) -> dict | None:
    if cand.kind == "no_grad" and cand.disable_site:
        return cand.disable_site
    if cand.kind == "left" and cand.came_back_at:
        return cand.came_back_at
    if cand.kind == "process" and cand.came_back_at:
        return cand.came_back_at  # torch.load: the line where the history-less copy enters the forward
    if cand.kind == "process" and cand.process_at:
        return cand.process_at
    return cand.location


def analyze(tracer: GradTracer, grads: GradRecorder, model: nn.Module, step: StepResult, only: list[str] | None = None,
            record=None) -> tuple[list[Finding], dict]:
    # parameters swapped in during the step (a data-dependent init replacing nn.Parameter objects on the first
    # call) have names only now, and no gradient hook: their .grad says what they got
    names = {**tracer.names, **param_names(model)}
    trainable = [p for p in model.parameters() if p.requires_grad]
    read = tracer.read | tracer.apply_watch.read
    for p in trainable:
        if id(p) not in tracer.names and p.grad is not None:
            read = read | {id(p)}
            if id(p) not in grads.got:
                grads.record(p)
    table: list[dict[str, Any]] = []
    broken: list[nn.Parameter] = []
    zero: list[nn.Parameter] = []
    nonfinite: list[nn.Parameter] = []
    unused: list[nn.Parameter] = []
    for p in trainable:
        n = names[id(p)][0]
        g = grads.got.get(id(p))
        status = "none" if g is None else ("nonfinite" if not g["finite"] else ("zero" if g["zero"] else "ok"))
        table.append({"name": n, "read": id(p) in read, "grad": status, "grad_norm": None if g is None else g["norm"],
                      "numel": p.numel(), "shape": list(p.shape)})
        if g is None:
            (broken if id(p) in read else unused).append(p)
        elif status == "zero":
            zero.append(p)
        elif status == "nonfinite":
            nonfinite.append(p)

    def wanted(n: str) -> bool:
        return not only or any(n == o or n.startswith(o.rstrip(".") + ".") for o in only)

    by_init = zero_by_initialisation(zero, grads, model, names, tracer.as_bias)
    zero = [p for p in zero if id(p) not in by_init]
    zero_ids = {id(p) for p in zero}  # identity, never `p in zero` (tensor == compares values)
    findings: list[Finding] = []
    loss_tags = frozenset().union(*(b.get("tags", frozenset()) for b in tracer.backward_calls)) if tracer.backward_calls else frozenset()
    targets = {id(p) for p in broken + zero}
    by_cand: dict[int, list] = {}
    # a step that raised before any backward() explains every missing gradient by itself: no cut is blamed,
    # but a value measured crossing into another process before the failure stays a crossing; so does a step a
    # memory limit stopped (GP113), wherever it stopped: its gradients are incomplete, not cut.
    # backward() raised on a loss that is part of the graph (not a scalar, say) before any gradient arrived: that
    # failure, not a cut, is why gradients are missing
    limited = step.resource_limit is not None
    stopped_early = limited or (step.error is not None and (not tracer.backward_calls or (
        _backward_broke(tracer) and any(b.get("requires_grad") for b in tracer.backward_calls) and not grads.got)))

    def order(c: Candidate) -> tuple:
        # cuts that fed the loss first; a selection by design (argmin -> codebook[idx]: the gradient reaches the
        # codebook through the indexing) after every other cut; then cuts in the user's own code; then the earliest
        return (c.index not in loss_tags, c.selects_for_grad, not c.direct, c.index)

    if targets and tracer.candidates:
        reached = reach(tracer.candidates, targets)
        n_bw = len(tracer.backward_calls)
        for p in broken + zero:
            hits = [c for c in tracer.candidates if id(p) in reached[c.index] and c.can_explain(n_bw)]
            # a zero-derivative op explains a zero gradient, never a missing one
            hits = [c for c in hits if (c.kind == "zero_derivative") == (id(p) in zero_ids)
                    and (c.kind == "process" or not stopped_early)]
            if not hits:
                continue
            hits.sort(key=order)
            by_cand.setdefault(hits[0].index, []).append(p)
        # a zero gradient behind a cut: part of the parameter's path is cut and what is left carries zeros (a
        # cast that truncated every value), or the parameter consumed the cut's output. Explained by a cut that
        # is already blamed for missing gradients, or by one in the user's code that fed the loss nothing but zeros
        blamed = set(by_cand)
        first_pass = {id(q) for ps in by_cand.values() for q in ps}
        for p in zero:
            if id(p) in first_pass or stopped_early:
                continue
            met = tracer.param_tags.get(id(p), frozenset())
            hits = [c for c in tracer.candidates
                    if (id(p) in reached[c.index] or c.index in met) and c.can_explain(n_bw)
                    and (c.index in blamed or (c.all_zero and c.direct and c.index in loss_tags and not c.selects_for_grad))]
            if hits:
                hits.sort(key=order)
                by_cand.setdefault(hits[0].index, []).append(p)
    attributed = {id(p) for ps in by_cand.values() for p in ps}
    merged: dict[tuple, tuple[Candidate, list]] = {}  # one finding per cause: same code at the same user line
    for idx, ps in sorted(by_cand.items()):
        cand = tracer.candidates[idx]
        where = _location_for(cand)
        key = (_code_of(cand.kind), (where or {}).get("file"), (where or {}).get("line"), cand.op if where is None else None)
        if key in merged:
            merged[key][1].extend(ps)
        else:
            merged[key] = (cand, list(ps))
    for cand, ps in merged.values():
        idx = cand.index
        pnames = [names[id(p)][0] for p in ps if wanted(names[id(p)][0])]
        if not pnames:
            continue
        code = _code_of(cand.kind)
        where = _location_for(cand)
        text = _KIND_TEXT[cand.kind].format(op=cand.op)
        if cand.kind == "process" and cand.op == "pickle":
            left = cand.process_at or {}
            text = ("is serialised" + (f" at line {left['line']}" if left.get("line") else "") + " (torch.save / pickle) and "
                    + ("loaded back as a new tensor with no history" if cand.came_back_at else "what comes back has no history"))
        evidence: dict[str, Any] = {"op": cand.op, "kind": cand.kind, "grad_enabled": cand.grad_enabled,
                                    "op_location": cand.location, "fed_the_loss": idx in loss_tags,
                                    "chain": chain(cand, id(ps[0]), tracer)}
        if cand.kind == "no_grad" and where and where.get("decorated"):
            text += f" (the function `{where['function']}` is decorated with no_grad)"
        if cand.indexes:
            evidence["used_as_index"] = cand.indexes  # its integer output selected from a tensor (an id lookup)
        if cand.left_at:
            evidence["left_at"] = cand.left_at
        if cand.came_back_at:
            evidence["came_back_at"] = cand.came_back_at
        if cand.process_at:
            evidence["pickled_at"] = cand.process_at
        by_library = idx in tracer.library_no_grad
        tail = (f" at line {where['line']} of {where['file'].rsplit('/', 1)[-1]}." if where else ".")
        zeroed = [names[id(p)][0] for p in ps if id(p) in zero_ids and cand.kind != "zero_derivative"]
        if zeroed:
            evidence["zero_gradient"] = zeroed
            tail += (f" {len(zeroed)} of them got an exactly-zero gradient rather than none: what still reaches them "
                     + ("carries the all-zero output of this op." if cand.all_zero else "combines with this op's output."))
        if by_library:
            evidence["no_grad_entered_by"] = "library code"
            tail += (" The library turned gradients off there itself (by design, e.g. an index or routing computation), "
                     "so these parameters are not trained through this path.")
        findings.append(make_finding(
            code, f"The path from the loss to {len(pnames)} parameter(s) ({', '.join(pnames[:5])}{'...' if len(pnames) > 5 else ''}) {text}"
            + tail, parameters=pnames, location=where, evidence=evidence,
            fix="Nothing to fix if the library means it; train these parameters with the objective the library provides for them."
            if by_library else None, severity="warning" if by_library else None,
        ))
    # parameters sent to other processes as they are (leaf crossings are silent in PyTorch)
    crossed: dict[str, dict] = {}
    for c in tracer.crossings:
        if "parameter" in c:
            crossed.setdefault(c["parameter"], c)
    if crossed:
        pnames = [n for n in crossed if wanted(n)]
        if pnames:
            first = next(iter(crossed.values()))
            findings.append(make_finding(
                "GP309", f"{len(pnames)} parameter(s) were pickled for another process ({', '.join(pnames[:5])}): "
                "gradients computed there never reach the parent's .grad.",
                parameters=pnames, location=first.get("location"), evidence={"crossings": list(crossed.values())[:10]},
            ))
            attributed |= {id(p) for p in broken if names[id(p)][0] in crossed}
    worker = _worker_findings(tracer, model, names, step, wanted)
    for f in worker:
        for n in f["parameters"]:
            crossed.setdefault(n, {"parameter": n, "location": f["location"]})
        findings.append(f)
    attributed |= {id(p) for p in broken if names[id(p)][0] in crossed}
    backward_broke = _backward_broke(tracer)
    rest = [p for p in broken if id(p) not in attributed and wanted(names[id(p)][0])]
    if rest and not backward_broke and tracer.backward_calls and not limited:
        custom = {}
        for cls, entry in tracer.apply_watch.calls.items():
            for pos, ns in entry["params_at"].items():
                for n in ns:
                    custom[n] = f"{cls.__name__} (input {pos})"
        rnames = [names[id(p)][0] for p in rest]
        via = {n: custom[n] for n in rnames if n in custom}
        msg = f"{len(rest)} parameter(s) read by the forward got no gradient: {', '.join(rnames[:6])}{'...' if len(rnames) > 6 else ''}."
        if via:
            msg += f" They were inputs of custom autograd.Function(s) {', '.join(sorted(set(via.values())))} whose backward returned no gradient for them (see run_gradcheck)."
        else:
            # no op cut their path and no custom backward dropped them: what they computed never reached the loss
            msg += (" Nothing cut their path: what they compute (a pooler, a head, a branch) is not used by this loss. "
                    "Fine if intended (under DistributedDataParallel it needs find_unused_parameters=True); "
                    "if they should learn, add their output to the loss.")
        findings.append(make_finding(
            "GP301", msg, parameters=rnames, severity=None if via else "warning",
            evidence={"custom_function_inputs": via, "backward_called": bool(tracer.backward_calls),
                      "cause": "custom backward returned None" if via else "output not used by the loss"},
            fix=None if via else "Use their output in the loss, or drop them (or freeze them) if they are not needed for this objective.",
        ))
    zero_rest = [names[id(p)][0] for p in zero if id(p) not in attributed and wanted(names[id(p)][0])]
    if zero_rest and not limited:
        findings.append(make_finding(
            "GP306", f"{len(zero_rest)} parameter(s) got an exactly-zero gradient: {', '.join(zero_rest[:6])}"
            f"{'...' if len(zero_rest) > 6 else ''} (masked out, a dead ReLU, ignored labels, or a mask hiding them).",
            parameters=zero_rest, evidence={"zero": len(zero_rest)},
        ))
    init_names = {names[i][0]: partner for i, partner in by_init.items() if wanted(names[i][0])}
    if init_names and not limited:
        partners = sorted(set(init_names.values()))
        findings.append(make_finding(
            "GP306", f"{len(init_names)} parameter(s) got an exactly-zero gradient at this step because a zero-initialised "
            f"partner multiplies them ({', '.join(partners[:3])}{'...' if len(partners) > 3 else ''}): by design "
            "(a LoRA B, a gate that starts closed); they get gradients once the partner has moved.",
            parameters=list(init_names), severity="info",
            evidence={"zero_initialised_partners": init_names},
            fix="Nothing to fix if the partner is zero-initialised on purpose.",
        ))
    if nonfinite:
        nn_names = [names[id(p)][0] for p in nonfinite if wanted(names[id(p)][0])]
        if nn_names:
            findings.append(make_finding(
                "GP307", f"{len(nn_names)} parameter(s) got NaN/Inf gradients: {', '.join(nn_names[:6])}.",
                parameters=nn_names, location=step.nonfinite_location,
                evidence={"anomaly": step.nonfinite_anomaly},
            ))
    unused_names = [names[id(p)][0] for p in unused if wanted(names[id(p)][0]) and names[id(p)][0] not in crossed]
    if unused_names and tracer.backward_calls and not tracer.backward_error:
        findings.append(make_finding(
            "GP311", f"{len(unused_names)} trainable parameter(s) were never read by the forward on this batch: "
            f"{', '.join(unused_names[:6])}{'...' if len(unused_names) > 6 else ''}.",
            parameters=unused_names, evidence={"unused": len(unused_names)},
        ))
    findings += _loss_and_backward_findings(tracer, step, error_explained=bool(worker) and step.error is not None)
    findings += _health_findings(tracer, grads, model, names, wanted, record, gradients_complete=not limited)
    return findings, {"per_parameter": table, "candidates_seen": len(tracer.candidates), "zero_by_init": init_names,
                      "backward_calls": [{k: v for k, v in b.items() if k != "tags"} for b in tracer.backward_calls],
                      "crossings": tracer.crossings[:20]}


def zero_by_initialisation(zero: list, grads: GradRecorder, model: nn.Module, names: dict,
                           as_bias: Collection[int] = ()) -> dict[int, str]:
    """Zero gradients that initialisation explains: parameter id -> the zero-initialised partner's name.

    A partner was exactly zero before the step and got a nonzero gradient (LoRA B, a closed gate). It
    explains a zero gradient when it sits in the nearest enclosing module that holds other trainable
    parameters, and multiplies rather than adds there: it lives in another submodule (lora_B beside
    lora_A), is a matrix, or is a scalar gate; a zero bias beside its weight, or any parameter an op read as
    its additive bias operand (`as_bias`: a LayerNorm's or a Linear's bias), explains nothing.
    """
    if not zero or not grads.zero_at_start:
        return {}
    trainable = [(names[id(q)][0], q) for q in model.parameters() if q.requires_grad]
    partners = [(n, q) for n, q in trainable if id(q) in grads.zero_at_start
                and id(q) not in as_bias and (g := grads.got.get(id(q))) is not None and not g["zero"] and g["finite"]]
    if not partners:
        return {}
    out: dict[int, str] = {}
    for p in zero:
        name = names[id(p)][0]
        owner = name.rpartition(".")[0]
        parts = owner.split(".") if owner else []
        for k in range(len(parts), 0, -1):
            prefix = ".".join(parts[:k]) + "."
            if not any(n.startswith(prefix) and q is not p for n, q in trainable):
                continue  # nothing else trainable here yet: look one module further out
            hit = next((n for n, q in partners if n.startswith(prefix) and q is not p
                        and (n.rpartition(".")[0] != owner or q.dim() >= 2 or q.numel() == 1)), None)
            if hit is not None:
                out[id(p)] = hit
            break
    return out


def _backward_broke(tracer: GradTracer) -> bool:
    """backward() raised for another reason than an unconnected loss."""
    return tracer.backward_error is not None and LOSS_DOES_NOT_REQUIRE_GRAD not in str(tracer.backward_error)


def _learnable_in(obj: Any, path: str, depth: int, seen: set[int], out: list[tuple[str, torch.Tensor]]) -> None:
    """Tensors that require grad reachable from a Dataset's attributes (modules' parameters included)."""
    if id(obj) in seen or depth > 3:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.requires_grad:
            out.append((path, obj))
        return
    if isinstance(obj, nn.Module):
        out.extend((f"{path}.{n}", p) for n, p in obj.named_parameters() if p.requires_grad)
        return
    if isinstance(obj, dict):
        items = list(obj.items())[:64]
    elif isinstance(obj, (list, tuple)):
        items = list(enumerate(obj))[:64]
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        items = list(vars(obj).items())
    else:
        return
    for k, v in items:
        if isinstance(v, (torch.Tensor, nn.Module, dict, list, tuple)) or hasattr(v, "__dict__"):
            _learnable_in(v, f"{path}.{k}", depth + 1, seen, out)


def _dataset_line(dataset: Any, ids: set[int], user) -> dict | None:
    """Where the Dataset's own code reads the learnable tensors: its first sample, fetched once in this process."""
    from torch.overrides import TorchFunctionMode

    getitem = getattr(type(dataset), "__getitem__", None)
    code = getattr(getitem, "__code__", None)
    hit: list[dict | None] = []

    class FirstRead(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if not hit and any(id(a) in ids for a in list(args) + list((kwargs or {}).values())):
                f = sys._getframe(1)
                while f is not None and f.f_code is not code:
                    f = f.f_back
                hit.append(user.location_of(f.f_code.co_filename, f.f_lineno, f.f_code.co_name) if f is not None
                           else user.innermost(skip=2))
            return func(*args, **(kwargs or {}))

    def returned(frame, event, arg):  # handed out as they are: the `return` of __getitem__ is the line
        if event == "return" and frame.f_code is code and not hit:
            vals = arg if isinstance(arg, (tuple, list)) else list(arg.values()) if isinstance(arg, dict) else [arg]
            if any(id(v) in ids for v in vals):
                hit.append(user.location_of(code.co_filename, frame.f_lineno, code.co_name))

    if code is None:
        return None
    old_profile = sys.getprofile()
    try:
        sys.setprofile(returned)
        with torch.no_grad(), FirstRead():
            dataset[0]
    except Exception:
        pass
    finally:
        sys.setprofile(old_profile)
    return hit[0] if hit else None


def _worker_findings(tracer: GradTracer, model: nn.Module, names: dict, step: StepResult, wanted) -> list[Finding]:
    """GP309 for DataLoader workers (other processes) that run a Dataset holding tensors that require grad."""
    out: list[Finding] = []
    for loader, iterated_at in tracer.loaders:
        if not getattr(loader, "num_workers", 0):
            continue
        dataset = getattr(loader, "dataset", None)
        found: list[tuple[str, torch.Tensor]] = []
        _learnable_in(dataset, "dataset", 0, set(), found)
        if not found:
            continue
        pnames = [names[id(t)][0] if id(t) in names else p for p, t in found]
        pnames = [n for n in dict.fromkeys(pnames) if wanted(n)]
        if not pnames:
            continue
        where = _dataset_line(dataset, {id(t) for _, t in found}, tracer.user)
        err = step.error
        worker_error = f"{type(err).__name__}: {str(err).splitlines()[0]}" if err is not None and "DataLoader worker" in str(err) else None
        out.append(make_finding(
            "GP309",
            f"{type(dataset).__name__} uses {len(pnames)} tensor(s) that require grad ({', '.join(pnames[:5])}) and runs in "
            f"{loader.num_workers} DataLoader worker process(es)"
            + (f" (line {where['line']} of {where['file'].rsplit('/', 1)[-1]})" if where else "")
            + ": samples cross a process boundary, so no gradient reaches them"
            + (" (here the worker failed to batch samples that require grad)." if worker_error else "."),
            parameters=pnames, location=where or iterated_at,
            evidence={"dataset": type(dataset).__name__, "num_workers": loader.num_workers, "iterated_at": iterated_at,
                      "worker_error": worker_error},
            fix="Apply the learnable transform in the training process (in the model's forward, on the batch), and "
                "keep the Dataset to plain data loading.",
        ))
    return out


def _resource_limit(tracer: GradTracer, step: StepResult) -> Finding:
    """GP113 for a step a memory limit stopped: where it stopped, measured (backward, after it, or before it)."""
    limit = step.resource_limit or {}
    in_backward = allocation_failure(tracer.backward_error) is not None
    if step.not_run:
        phase = "making the optimizer (train_step was not run)"
    elif in_backward:
        phase = "running backward()"
    elif tracer.backward_calls:
        phase = "finishing the step after backward() (the optimizer step" + (" or the rest of train_step)" if step.kind == "train_step" else ")")
    else:
        phase = ("running train_step, before backward()" if step.kind == "train_step"
                 else "running the forward and the loss, before backward()")
    called_at = tracer.backward_calls[0]["location"] if tracer.backward_calls else None
    return resource_limit_finding(
        phase, limit, location=step.error_location or (called_at if in_backward else None),
        evidence={"traceback": step.error_traceback, "backward_called_at": called_at,
                  "backward_calls": len(tracer.backward_calls)})


def _loss_and_backward_findings(tracer: GradTracer, step: StepResult, error_explained: bool = False) -> list[Finding]:
    out: list[Finding] = []
    exc = tracer.backward_error
    if step.resource_limit is not None:  # a memory limit, not the code: no GP308/GP310/GP100 about the step
        out.append(_resource_limit(tracer, step))
    elif exc is not None:
        text = str(exc)
        if LOSS_NOT_DIFFERENTIABLE.search(text):
            call = tracer.backward_calls[0] if tracer.backward_calls else {}
            out.append(make_finding(
                "GP310", f"backward() raised because the loss does not depend on any parameter through recorded ops: {text.splitlines()[0]}",
                location=call.get("location"),
                evidence={"loss": {k: call.get(k) for k in ("shape", "requires_grad", "grad_fn")},
                          "cuts_found": len({c.index for c in tracer.candidates})},
                fix="See the other findings for where the path is cut; the loss must be computed from the model output with torch ops.",
            ))
        elif LOSS_NOT_SCALAR.search(text):
            call = tracer.backward_calls[-1] if tracer.backward_calls else {}
            made_at = call.get("made_at")
            out.append(make_finding(
                "GP310", f"backward() was called on a loss of shape {call.get('shape')}, not a scalar"
                + (f" (computed at line {made_at['line']} of {made_at['file'].rsplit('/', 1)[-1]})" if made_at else "")
                + ": reduce it (.mean() or .sum(), or the loss function's default reduction).",
                location=made_at or call.get("location"),
                evidence={"loss": {k: call.get(k) for k in ("shape", "requires_grad", "grad_fn")},
                          "backward_called_at": call.get("location"), "error": text.splitlines()[0]},
                fix="Reduce the loss to a scalar before backward(): loss = loss.mean() (or drop reduction='none').",
            ))
        else:
            explain = explain_backward_error(text)
            first = text.splitlines()[0].split(" Hint:")[0]
            inplace = _inplace_op_behind(tracer, text)
            where = inplace or step.anomaly_location or (tracer.backward_calls[0]["location"] if tracer.backward_calls else None)
            msg = f"backward() raised: {explain}."
            if inplace:
                msg += (f" The in-place op at line {inplace['line']} of {inplace['file'].rsplit('/', 1)[-1]}"
                        f" (`{inplace.get('code', '')}`) modified a tensor that an earlier op had saved for backward"
                        + (f" (saved at line {step.anomaly_location['line']})." if step.anomaly_location else "."))
            msg += f" PyTorch: {first}"
            out.append(make_finding(
                "GP308", msg, location=where,
                evidence={"error": text[:2000], "forward_trace": _user_trace(step.anomaly_trace, tracer.user),
                          "saved_at": step.anomaly_location, "modified_in_place_at": inplace,
                          "backward_called_at": tracer.backward_calls[0]["location"] if tracer.backward_calls else None},
                fix="Use the out-of-place form on that line (x = x + y instead of x += y, relu(x) instead of relu_(x)), "
                    "or clone the tensor before modifying it." if inplace else None,
            ))
    elif step.loss_problem:
        gf = step.loss.grad_fn if isinstance(step.loss, torch.Tensor) else None
        made_at = tracer.grad_fn_loc.get(id(gf)) if gf is not None else None  # the user line that computed the loss
        out.append(make_finding("GP310", step.loss_problem, location=made_at, evidence=step.loss_evidence))
    elif step.error is not None and not tracer.backward_calls and not error_explained:
        err = step.error
        text = f"{step.not_run}: {err}" if step.not_run else f"The step raised before backward(): {type(err).__name__}: {err}"
        out.append(make_finding(
            "GP100", text,
            location=step.error_location, evidence={"traceback": step.error_traceback},
            fix="Fix the error in the traceback; the forward must run before gradients can be traced.",
        ))
    elif not tracer.backward_calls and step.kind == "train_step" and step.error is None:
        out.append(make_finding(
            "GP310", "The user's train_step never called backward(): no gradient can reach any parameter.",
            evidence={"train_step_returned": repr(step.returned)[:200]},
            fix="Call loss.backward() in train_step (before optimizer.step()).",
        ))
    return out


def _inplace_op_behind(tracer: GradTracer, text: str) -> dict | None:
    """The user line of the in-place op that bumped the saved tensor to the version torch reports."""
    detail = inplace_detail(text)
    if detail is None:
        return None
    shape, version = detail
    hits = [loc for s, v, loc in tracer.inplace_ops if s == shape and v == version and loc is not None]
    return hits[-1] if hits else None


def _user_trace(text: str | None, user) -> list[str] | None:
    """An anomaly-mode forward traceback reduced to the user's frames ("file:line in function: code")."""
    if not text:
        return None
    out = []
    for f, line, fn in ANOMALY_FRAME.findall(text):
        if user.is_user_file(f):
            loc = user.location_of(f, int(line), fn)
            out.append(f"{f}:{line} in {fn}: {loc.get('code', '')}")
    return out


def _health_findings(tracer, grads, model, names, wanted, record=None, gradients_complete: bool = True) -> list[Finding]:
    out: list[Finding] = []
    # GP312: spread of per-module gradient norms (GP312 and GP313 judge a complete backward only)
    per_module: dict[str, float] = {}
    for p in (model.parameters() if gradients_complete else ()):
        g = grads.got.get(id(p))
        if g and g["finite"] and g["norm"] > 0:
            m = module_of(names[id(p)][0])
            per_module[m] = math.sqrt(per_module.get(m, 0.0) ** 2 + g["norm"] ** 2)
    if len(per_module) >= 3:
        hi = max(per_module, key=lambda m: per_module[m])
        lo = min(per_module, key=lambda m: per_module[m])
        ratio = per_module[hi] / per_module[lo]
        if ratio > 1e6:
            out.append(make_finding(
                "GP312", f"Per-module gradient norms span {ratio:.1e}x: {lo} has {per_module[lo]:.2e}, {hi} has {per_module[hi]:.2e}.",
                parameters=[n for n, _ in model.named_parameters() if module_of(n) in (lo, hi)],
                evidence={"ratio": ratio, "norms": dict(sorted(per_module.items(), key=lambda kv: kv[1])[:5] + sorted(per_module.items(), key=lambda kv: kv[1])[-5:])},
            ))
    # GP313: hooks on parameters whose gradient ended zero or None
    for p in (model.parameters() if gradients_complete else ()):
        hooks = tensor_hooks(p)
        if hooks and p.requires_grad:
            g = grads.got.get(id(p))
            if g is None or g["zero"]:
                n = names[id(p)][0]
                if wanted(n):
                    hook_at = (getattr(record, "hook_sites", None) or {}).get(id(p))
                    out.append(make_finding(
                        "GP313", f"`{n}` has {len(hooks)} gradient hook(s) and its gradient is {'None' if g is None else 'zero'}: a hook likely replaced it"
                        + (f" (registered at line {hook_at[1]['line']} of {hook_at[1]['file'].rsplit('/', 1)[-1]})." if hook_at else "."),
                        parameters=[n], location=hook_at[1] if hook_at else None,
                        evidence={"hooks": [getattr(h, '__qualname__', repr(h)) for h in hooks.values()]},
                    ))
    if tracer.nonleaf_grad_reads:
        loc = tracer.nonleaf_grad_reads[0]
        out.append(make_finding(
            "GP314", f"The step reads .grad of a non-leaf tensor ({len(tracer.nonleaf_grad_reads)} time(s)); it stays None without retain_grad().",
            location=loc, evidence={"reads": tracer.nonleaf_grad_reads[:5]},
        ))
    return out


def _anomaly_rerun(run, user) -> tuple[dict | None, str | None]:
    """Re-run a failing step under anomaly mode to find the forward line behind a backward error."""
    traces: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autograd.set_detect_anomaly(True, check_nan=True):
            try:
                run()
            except Exception:
                pass
        traces = [str(w.message) for w in caught if is_anomaly_forward_trace(str(w.message))]
    if not traces:
        return None, None
    text = traces[0]
    frames = ANOMALY_FRAME.findall(text)
    user_frames = [f for f in frames if user.is_user_file(f[0])]
    if not user_frames:
        return None, text[-2000:]
    f = user_frames[-1]
    return user.location_of(f[0], int(f[1]), f[2]), text[-2000:]


def observed_step(loaded, tracer: GradTracer, grads: GradRecorder, optimizer_step: bool = False) -> StepResult:
    """The one step runner with the tracer and gradient recorder active; a failing backward or a
    non-finite gradient is re-run under anomaly mode to find the forward line behind it."""
    step = run_step(loaded, optimizer_step=optimizer_step, observers=(grads, tracer))
    if step.resource_limit is None:  # a train_step that caught the allocation failure of its backward() stopped all the same
        step.resource_limit = allocation_failure(tracer.backward_error)
    bad = _backward_broke(tracer)
    nonfinite = any(not g["finite"] for g in grads.got.values())
    if (bad or nonfinite) and step.resource_limit is None:  # re-running a step that ran out of memory would again
        loc, trace = _anomaly_rerun(lambda: attempt_step(loaded, step, optimizer_step), loaded.user)
        if bad:
            step.anomaly_location, step.anomaly_trace = loc, trace
        else:
            step.nonfinite_location, step.nonfinite_anomaly = loc, trace
    return step


@dataclass
class TraceRun:
    """One traced step and what the GP3xx rules made of it (prompt_tuning and diagnose read the rest)."""

    findings: list[Finding]
    facts: dict[str, Any]
    tracer: GradTracer
    grads: GradRecorder
    step: StepResult


def trace_findings(loaded, parameters=None, optimizer_step: bool = False, provenance: bool = False) -> TraceRun:
    tracer = GradTracer(loaded.model, loaded.user, provenance=provenance)
    grads = GradRecorder(loaded.model)
    step = observed_step(loaded, tracer, grads, optimizer_step=optimizer_step)
    findings, facts = analyze(tracer, grads, loaded.model, step, parameters, record=loaded.record)
    return TraceRun(findings, facts, tracer, grads, step)


def trace_report(loaded, parameters=None) -> dict:
    run = trace_findings(loaded, parameters)
    findings, facts = run.findings, run.facts
    table = facts["per_parameter"]
    frozen = [n for n, p in loaded.model.named_parameters() if not p.requires_grad]
    facts["flow"] = flow_graph(table, findings, frozen)
    facts["mermaid"] = flow_mermaid(facts["flow"])
    counts = {s: sum(1 for r in table if r["grad"] == s) for s in ("ok", "zero", "none", "nonfinite")}
    summary = [f"{len(table)} trainable parameters: {counts['ok']} got a gradient, {counts['zero']} zero, "
               f"{counts['none']} none, {counts['nonfinite']} non-finite; {len(frozen)} frozen."]
    return make_report("trace_grad_path", findings, summary, **facts)


def trace_grad_path(model: nn.Module, batch, loss_fn=None, optimizer=None, train_step=None, project_dir: str | None = None,
                    parameters=None) -> dict:
    """Library entry: trace one step of a live model (see gradprobe.loading.live_target for project_dir)."""
    from gradprobe.loading import live_target

    return trace_report(live_target(model, batch, loss_fn, optimizer, train_step, project_dir), parameters)
