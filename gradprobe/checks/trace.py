"""GP3xx: which parameters the loss cannot reach, where the path breaks in the user's code, and why.

One real step runs under `GradTracer`, a TorchFunctionMode that records only
what locating a break needs: which parameters each op read, and every op whose
input required grad but whose output does not (a *break candidate*), with the
user's line, grad mode, and the inputs (kept so that the autograd graph behind
them can be walked later). Non-grad values produced by candidates carry a tag
forward through later ops, so the analysis can tell which cuts fed the loss.

After the step, each parameter that was read but got no gradient is attributed
to the candidates whose input graph reaches it, preferring those whose output
reached the loss, then the earliest. `.detach().numpy()` followed by
`torch.from_numpy` becomes "left torch" (GP304); a detached tensor that is
pickled for another process becomes GP309 (boundary detection is in this
module too: ForkingPickler reducers and Tensor.__reduce_ex__ are watched).
"""

from __future__ import annotations

import math
import re
import sys
import threading
import warnings
from collections import deque
from typing import Any

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from gradprobe.checks._apply import ApplyWatch, inside_custom_function
from gradprobe.checks._step import compute_loss, call_model, module_of, param_names
from gradprobe.findings import Finding, make_finding
from gradprobe.flowchart import flow_mermaid
from gradprobe.report import make_report

RULES = {
    "GP301": {
        "name": "param-gets-no-grad", "severity": "error",
        "summary": "A trainable parameter that the forward read has .grad None after backward (a warning when nothing cut "
                   "the path and its output is simply not used by the loss: an unused pooler, head or branch).",
        "why": "The path from it to the loss is cut somewhere; the more precise GP30x codes say where when it can be located.",
        "example": "out = MyFn.apply(x, self.w)  # whose backward returns None for w",
        "fix": "Follow evidence.chain to the op that cut the path and keep the computation inside autograd.",
    },
    "GP302": {
        "name": "detach-in-forward", "severity": "error",
        "summary": "The path is cut by .detach(), .data or detach_().",
        "why": "detach() returns a tensor with no history: everything computed before it gets no gradient from what comes after.",
        "example": "x_hat = ((x - mean) / std).detach()",
        "fix": "Remove the .detach() (or .data) on the training path; detach only values that must not be trained through.",
    },
    "GP303": {
        "name": "op-under-no-grad", "severity": "error",
        "summary": "The path is cut because an op ran under no_grad / inference_mode (a warning when library code entered no_grad itself).",
        "why": "No graph is recorded under no_grad, so its outputs do not depend on the parameters as far as autograd knows.",
        "example": "@torch.no_grad()\ndef encode(self, x): ...  # reused by forward",
        "fix": "Remove the no_grad decorator/block from the training path, or call an undecorated twin in forward.",
    },
    "GP304": {
        "name": "left-torch", "severity": "error",
        "summary": "The value left autograd (.item(), .tolist(), .numpy(), float()) and came back as a new tensor.",
        "why": "NumPy and Python numbers carry no autograd history; torch.tensor/torch.from_numpy makes a fresh leaf.",
        "example": "h = torch.from_numpy(clip(h.detach().numpy()))",
        "fix": "Do the computation with torch ops (torch.clamp, torch.quantile, ...) so it stays in the graph.",
    },
    "GP305": {
        "name": "non-differentiable-op", "severity": "error",
        "summary": "The path goes through an op with no gradient (argmax, round, comparisons, integer casts).",
        "why": "Discrete ops have zero or no derivative; an integer tensor cannot carry a gradient.",
        "example": "ids = torch.cat([prompt, input_ids], 1).long()",
        "fix": "Keep the value continuous (softmax instead of argmax, embeddings instead of ids, a straight-through estimator).",
    },
    "GP306": {
        "name": "zero-gradient", "severity": "warning",
        "summary": "A parameter's gradient is exactly zero (info when a zero-initialised partner such as LoRA B or a closed gate explains it).",
        "why": "Masked out, a dead ReLU, all labels ignored, or an attention mask that hides it: the parameter cannot learn from this batch.",
        "example": "attention_mask zero on the positions that use the parameter",
        "fix": "Check masks, ignore-index labels and activations on the path of this parameter.",
    },
    "GP307": {
        "name": "nonfinite-gradient", "severity": "error",
        "summary": "A gradient holds NaN or Inf.",
        "why": "One NaN poisons every parameter the optimizer updates with it.",
        "example": "torch.sqrt(x) at x == 0, log(0), division by a zero norm",
        "fix": "Guard the op at the reported line (clamp, eps, log1p, safe norms).",
    },
    "GP308": {
        "name": "backward-failed", "severity": "error",
        "summary": "backward() raised.",
        "why": "In-place modification of a tensor saved for backward, a second backward through a freed graph, a leaf modified in place, inference tensors saved for backward, or a custom backward returning the wrong number of gradients.",
        "example": "h = torch.sigmoid(x); h += 1  # sigmoid saved its output",
        "fix": "See the message: use out-of-place ops, retain_graph=True only when needed, clone inference tensors.",
    },
    "GP309": {
        "name": "crossed-process-boundary", "severity": "error",
        "summary": "A tensor on the loss's path, or a parameter, was sent to or received from another process.",
        "why": "Autograd graphs never cross processes: what comes back is a new tensor with no history, and a parameter's gradient computed in a worker never reaches the parent.",
        "example": "parts = pool.map(f, frames.detach().chunk(2))",
        "fix": "Keep the differentiable computation in the training process (vectorise it in torch); use processes only for data loading.",
    },
    "GP310": {
        "name": "loss-not-differentiable", "severity": "error",
        "summary": "The loss is not a scalar, does not require grad, or has no grad_fn.",
        "why": "backward() needs a scalar that depends on parameters through recorded ops.",
        "example": "loss = torch.tensor(loss_value)",
        "fix": "Compute the loss with torch ops from the model's output; reduce it to a scalar (.mean()).",
    },
    "GP311": {
        "name": "unused-parameter", "severity": "warning",
        "summary": "A trainable parameter was never read by the forward on this batch.",
        "why": "It cannot get a gradient; DDP will also complain about it.",
        "example": "self.aux_head = nn.Linear(...)  # never called in forward",
        "fix": "Use it, freeze it, or remove it (DDP: find_unused_parameters=True if it is conditional).",
    },
    "GP312": {
        "name": "vanishing-or-exploding", "severity": "warning",
        "summary": "Per-layer gradient norms span more than a set ratio.",
        "why": "Layers far below their neighbours barely learn; far above, they destabilise training.",
        "example": "a 50-layer plain MLP with sigmoid activations",
        "fix": "Normalisation layers, residual connections, better init, gradient clipping.",
    },
    "GP313": {
        "name": "grad-hook-altered", "severity": "warning",
        "summary": "A registered hook changed the gradient.",
        "why": "A tensor or module backward hook that returns a new value replaces the gradient the optimizer sees.",
        "example": "p.register_hook(lambda g: g * 0)",
        "fix": "Check the hook; return None from hooks that only observe.",
    },
    "GP314": {
        "name": "non-leaf-grad-read", "severity": "warning",
        "summary": "The user reads .grad of a non-leaf tensor.",
        "why": "Only leaves get .grad; a non-leaf's .grad stays None without retain_grad().",
        "example": "h = self.fc(x); ...; print(h.grad)",
        "fix": "Call h.retain_grad() before backward, or read the leaf parameter's .grad.",
    },
}

LEFT_OPS = {"item", "tolist", "numpy", "__array__", "__float__", "__int__", "__index__", "__complex__"}
REWRAP_OPS = {"tensor", "as_tensor", "asarray", "from_numpy", "frombuffer"}
DETACH_OPS = {"detach", "detach_"}
# new tensors that take only the shape, dtype and device of their input, never its values: not a cut
SHAPE_ONLY_OPS = {"zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like", "randint_like",
                  "new_zeros", "new_ones", "new_empty", "new_full", "size", "dim", "numel", "__len__"}
ZERO_DERIVATIVE_OPS = {"round", "floor", "ceil", "trunc", "sign", "frac_", "round_", "floor_", "ceil_", "sign_", "heaviside"}
_GRAD_ENABLE = torch._C._set_grad_enabled
CODES_BY_KIND = {"detach": "GP302", "no_grad": "GP303", "left": "GP304", "rewrap": "GP304", "nondiff": "GP305",
                 "zero_derivative": "GP305", "process": "GP309", "other": "GP301"}


class Candidate:
    __slots__ = ("index", "kind", "op", "location", "grad_enabled", "inputs", "direct", "disable_site",
                 "left_at", "came_back_at", "process_at", "backwards_before")

    def __init__(self, index, kind, op, location, grad_enabled, inputs, direct, disable_site):
        self.index, self.kind, self.op, self.location = index, kind, op, location
        self.grad_enabled, self.inputs, self.direct, self.disable_site = grad_enabled, inputs, direct, disable_site
        self.left_at = self.came_back_at = self.process_at = None
        self.backwards_before = 0

    def can_explain(self, n_backward: int) -> bool:
        """A cut explains a missing gradient only if a backward ran after it, and a value that left
        torch only if it came back (a loss.item() for logging cuts nothing)."""
        if n_backward and self.backwards_before >= n_backward:
            return False
        return not (self.kind == "left" and self.came_back_at is None)


def _tensors_in(args, kwargs):
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    yield b
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, torch.Tensor):
                yield a


def _outputs(out):
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, (list, tuple)):
        return tuple(o for o in out if isinstance(o, torch.Tensor))
    return ()


def _cut(o: torch.Tensor, inputs: list) -> bool:
    """An output is cut off the graph when it does not require grad, or is a history-less view
    (views made under no_grad keep requires_grad=True but have no grad_fn)."""
    if not o.requires_grad:
        return True
    return o.grad_fn is None and o.is_leaf and not any(o is i for i in inputs)


def _storage_ptr(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:
        return None


class GradTracer(TorchFunctionMode):
    """Records reads of parameters, break candidates, backward calls and process crossings."""

    def __init__(self, model: nn.Module, user, chain: bool = True, provenance: bool = False):
        super().__init__()
        self.provenance: dict[int, tuple] | None = {} if provenance else None  # id(out) -> (out, user line)
        self.user = user
        self.names = param_names(model)
        self.params = {id(p): p for p in model.parameters()}
        self.read: set[int] = set()
        self.candidates: list[Candidate] = []
        self.tags: dict[int, frozenset] = {}
        self._tag_keep: list = []
        self.detached: dict[int, int] = {}  # storage ptr of a detached output -> candidate index
        self.left_events: list[tuple[int, dict]] = []  # (candidate index or -1, location)
        self.backward_calls: list[dict] = []
        self.backward_error: BaseException | None = None
        self.grad_fn_loc: dict[int, dict] = {}
        self.chain = chain
        self.disable_site: dict | None = None
        self.disable_by_library = False
        self.library_no_grad: set[int] = set()  # candidate indices cut by a no_grad the library entered itself
        self.crossings: list[dict] = []
        self.nonleaf_grad_reads: list[dict] = []
        self.thread = threading.get_ident()
        self.apply_watch = ApplyWatch(user, {i: n[0] for i, n in self.names.items()}, capture=False)
        self._patches: list = []

    # ---- the mode -------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _GRAD_ENABLE:
            self._grad_switch(bool(args[0]) if args else True)
            return func(*args, **kwargs)
        if self.disable_site is not None and torch.is_grad_enabled():
            self.disable_site = None  # an inference_mode block ended
        name = getattr(func, "__name__", "")
        if name == "__get__":
            attr = getattr(getattr(func, "__self__", None), "__name__", "")
            if attr != "data":
                return func(*args, **kwargs)
            name = ".data"
        if name == "backward":
            return self._backward(func, args, kwargs)
        req, tags = [], None
        params = self.params
        for t in _tensors_in(args, kwargs):
            tid = id(t)
            if tid in params:
                self.read.add(tid)
            if t.requires_grad:
                req.append(t)
            if self.tags:
                tg = self.tags.get(tid)
                if tg is not None:
                    tags = tg if tags is None else tags | tg
        out = func(*args, **kwargs)
        if name in REWRAP_OPS and self.left_events and not req:
            self._came_back(out)
            return out
        if req and not inside_custom_function() and name not in SHAPE_ONLY_OPS:
            outs = _outputs(out)
            if outs and all(_cut(o, req) for o in outs) or name in LEFT_OPS or name in ZERO_DERIVATIVE_OPS:
                cand = self._candidate(name, req, outs, out)
                if cand is not None:
                    tags = frozenset({cand.index}) if tags is None else tags | {cand.index}
            elif self.chain:
                for o in outs:
                    gf = o.grad_fn
                    if gf is not None and id(gf) not in self.grad_fn_loc:
                        self.grad_fn_loc[id(gf)] = self.user.innermost(skip=2)
        elif name in LEFT_OPS and not req and args and isinstance(args[0], torch.Tensor):
            ptr = _storage_ptr(args[0])
            if ptr in self.detached:
                cand = self.candidates[self.detached[ptr]]
                if cand.kind == "detach":
                    cand.kind = "left"
                    cand.op = f"{cand.op}().{name}"
                    cand.left_at = self.user.innermost(skip=2)
                self.left_events.append((cand.index, cand.left_at))
        if tags is not None:
            for o in _outputs(out):
                self.tags[id(o)] = tags
                self._tag_keep.append(o)
        if self.provenance is not None and not req:
            for o in _outputs(out):
                self.provenance[id(o)] = (o, self.user.innermost(skip=2))
        return out

    def made_at(self, t) -> dict | None:
        """The user line whose op produced tensor t (only with provenance=True)."""
        hit = (self.provenance or {}).get(id(t))
        return hit[1] if hit is not None and hit[0] is t else None

    def _candidate(self, name, req, outs, out) -> Candidate | None:
        grad_on = torch.is_grad_enabled()
        if name in DETACH_OPS or name == ".data":
            kind = "detach"
        elif not grad_on:
            kind = "no_grad"
        elif name in LEFT_OPS:
            kind = "left"
        elif name in REWRAP_OPS:
            kind = "rewrap"
        elif name in ZERO_DERIVATIVE_OPS:
            kind = "zero_derivative"
        elif outs and not (outs[0].is_floating_point() or outs[0].is_complex()):
            kind = "nondiff"
        else:
            kind = "other"
        frame = sys._getframe(2)
        loc = self.user.innermost(frame)
        direct = frame is not None and self.user.is_user_file(frame.f_code.co_filename)
        cand = Candidate(len(self.candidates), kind, name, loc, grad_on, list(req[:4]), direct,
                         self.disable_site if not grad_on else None)
        cand.backwards_before = len(self.backward_calls)
        if kind == "no_grad" and self.disable_by_library:
            self.library_no_grad.add(cand.index)
        self.candidates.append(cand)
        if kind == "detach":
            for o in outs:
                ptr = _storage_ptr(o)
                if ptr is not None:
                    self.detached[ptr] = cand.index
        if kind == "left":
            cand.left_at = loc
            self.left_events.append((cand.index, loc))
        return cand

    def _came_back(self, out):
        idx, left_loc = self.left_events[-1]
        loc = self.user.innermost(skip=3)
        if idx >= 0:
            cand = self.candidates[idx]
            if cand.came_back_at is None:
                cand.came_back_at = loc
            for o in _outputs(out):
                self.tags[id(o)] = frozenset({idx})
                self._tag_keep.append(o)

    def _grad_switch(self, enable: bool):
        if enable:
            self.disable_site = None
        elif torch.is_grad_enabled():
            self.disable_site = self._disable_site(sys._getframe(2))
            self.disable_by_library = self._entered_by_library(sys._getframe(2))

    def _entered_by_library(self, frame) -> bool:
        """Whether library code (not the user's, not gradprobe's) turned gradients off on its own: a `with
        no_grad()` in a library function, or a no_grad-decorated library function that library code called
        (transformers' index computations). A decorated library function the user calls (generate()) is the user's."""
        f = frame
        while f is not None and f.f_code.co_filename.endswith(_GRAD_MODE_FILES) and f.f_code.co_name != "decorate_context":
            f = f.f_back
        if f is not None and f.f_code.co_name == "decorate_context":
            fcode = getattr(f.f_locals.get("func"), "__code__", None)
            if fcode is not None and self.user.is_user_file(fcode.co_filename):
                return False
            f = f.f_back
            while f is not None and f.f_code.co_filename.endswith(_MODULE_CALL_FILES):
                f = f.f_back
        if f is None:
            return False
        name = f.f_code.co_filename
        return not self.user.is_user_file(name) and _GRADPROBE_DIR not in name

    def _disable_site(self, frame):
        f = frame
        while f is not None:
            code = f.f_code
            if self.user.is_user_file(code.co_filename):
                return self.user.location_of(code.co_filename, f.f_lineno, code.co_name)
            if code.co_name == "decorate_context" and code.co_filename.endswith("_contextlib.py"):
                fn = f.f_locals.get("func")
                fcode = getattr(fn, "__code__", None)
                if fcode is not None and self.user.is_user_file(fcode.co_filename):
                    loc = self.user.location_of(fcode.co_filename, fcode.co_firstlineno, fcode.co_name)
                    loc["decorated"] = True
                    return loc
            f = f.f_back
        return None

    def _backward(self, func, args, kwargs):
        root = args[0] if args and isinstance(args[0], torch.Tensor) else None
        rec = {"location": self.user.innermost(skip=3), "tags": self.tags.get(id(root), frozenset()) if root is not None else frozenset()}
        if root is not None:
            rec.update(shape=list(root.shape), requires_grad=root.requires_grad,
                       grad_fn=type(root.grad_fn).__name__ if root.grad_fn is not None else None)
        self.backward_calls.append(rec)
        try:
            return func(*args, **kwargs)
        except BaseException as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"
            if self.backward_error is None:
                self.backward_error = exc
            raise

    # ---- process boundaries -----------------------------------------------------------------
    def _pickled(self, tensor):
        if not isinstance(tensor, torch.Tensor):
            return
        tid = id(tensor)
        info = {"shape": list(tensor.shape), "requires_grad": tensor.requires_grad, "is_leaf": tensor.is_leaf}
        if tid in self.params:
            info["parameter"] = self.names[tid][0]
        ptr = _storage_ptr(tensor)
        if ptr in self.detached:
            info["candidate"] = self.detached[ptr]
        if "parameter" not in info and "candidate" not in info and not tensor.requires_grad:
            return
        if threading.get_ident() == self.thread:
            loc = self.user.innermost(skip=3)
        else:
            main = sys._current_frames().get(self.thread)
            loc = self.user.innermost(main) if main is not None else None
        info["location"] = loc
        self.crossings.append(info)
        if "candidate" in info:
            cand = self.candidates[info["candidate"]]
            if cand.kind in ("detach", "left"):
                cand.kind = "process"
                cand.process_at = loc

    def _install_boundary_watch(self):
        from multiprocessing.reduction import ForkingPickler

        tracer = self
        reducers = ForkingPickler._extra_reducers
        for cls, red in list(reducers.items()):
            if isinstance(cls, type) and issubclass(cls, torch.Tensor):
                def watched(t, _red=red):
                    tracer._pickled(t)
                    return _red(t)
                self._patches.append(("reducer", cls, red))
                reducers[cls] = watched
        orig_reduce = torch.Tensor.__reduce_ex__

        def reduce_ex(t, proto):
            tracer._pickled(t)
            return orig_reduce(t, proto)

        self._patches.append(("attr", torch.Tensor, "__reduce_ex__", orig_reduce))
        torch.Tensor.__reduce_ex__ = reduce_ex
        orig_from_numpy = torch.from_numpy

        def from_numpy(arr):
            out = orig_from_numpy(arr)
            if tracer.left_events:
                tracer._came_back(out)
            return out

        self._patches.append(("attr", torch, "from_numpy", orig_from_numpy))
        torch.from_numpy = from_numpy
        # inference_mode does not go through _set_grad_enabled: note where it is entered too
        orig_enter = torch.inference_mode.__enter__

        def inference_enter(ctx):
            if getattr(ctx, "mode", True) and torch.is_grad_enabled():
                tracer.disable_site = tracer._disable_site(sys._getframe(1))
            return orig_enter(ctx)

        self._patches.append(("attr", torch.inference_mode, "__enter__", orig_enter))
        torch.inference_mode.__enter__ = inference_enter

    def _remove_boundary_watch(self):
        from multiprocessing.reduction import ForkingPickler

        for patch in reversed(self._patches):
            if patch[0] == "reducer":
                ForkingPickler._extra_reducers[patch[1]] = patch[2]
            else:
                setattr(patch[1], patch[2], patch[3])
        self._patches.clear()

    def __enter__(self):
        self._install_boundary_watch()
        self.apply_watch.__enter__()
        self._warn_ctx = warnings.catch_warnings()
        self._warn_ctx.__enter__()
        warnings.simplefilter("always")
        orig_show = warnings.showwarning
        tracer = self

        def show(message, category, filename, lineno, file=None, line=None):
            text = str(message)
            if "not a leaf Tensor is being accessed" in text:
                tracer.nonleaf_grad_reads.append(tracer.user.innermost(skip=1) or
                                                 tracer.user.location_of(filename, lineno, "?"))
            elif "None of the inputs have requires_grad=True" in text:
                tracer.checkpoint_warnings.append(tracer.user.innermost(skip=1))

        self.checkpoint_warnings: list = []
        warnings.showwarning = show
        self._orig_show = orig_show
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            warnings.showwarning = self._orig_show
            self._warn_ctx.__exit__(None, None, None)
            self.apply_watch.__exit__(None, None, None)
            self._remove_boundary_watch()


class GradRecorder:
    """Post-accumulate hooks: which parameters got a gradient in this step, its norm, finiteness."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.got: dict[int, dict] = {}
        self.zero_at_start: set[int] = set()

    def _hook(self, p):
        g = p.grad
        if g is None:
            return
        rec = self.got.setdefault(id(p), {"norm": 0.0, "finite": True, "zero": True})
        with torch.no_grad(), torch._C.DisableTorchFunction():
            # one pass over the gradient: its norm says finite and zero too (a second pass only if it overflowed)
            norm = float(torch.linalg.vector_norm(g.detach(), dtype=torch.float32))
            finite = math.isfinite(norm) or bool(torch.isfinite(g).all())
            rec["finite"] = rec["finite"] and finite
            rec["norm"] = norm if finite else float("nan")
            rec["zero"] = rec["zero"] and norm == 0.0

    def __enter__(self):
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        with torch.no_grad(), torch._C.DisableTorchFunction():
            # exactly-zero trainable tensors before the step: zero-initialised partners (LoRA B, gates)
            self.zero_at_start = {id(p) for p in trainable if p.numel() and not bool(p.any())}
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook) for p in trainable]
        return self

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()
        return False


_GRAD_MODE_FILES = ("grad_mode.py", "_contextlib.py")
_MODULE_CALL_FILES = ("nn/modules/module.py",)
_GRADPROBE_DIR = "/gradprobe/"

# ---- analysis -------------------------------------------------------------------------------

def zero_by_initialisation(zero: list, grads: GradRecorder, model: nn.Module, names: dict) -> dict[int, str]:
    """Zero gradients that initialisation explains: parameter id -> the zero-initialised partner's name.

    A partner was exactly zero before the step and got a nonzero gradient (LoRA B, a closed gate). It
    explains a zero gradient when it sits in the nearest enclosing module that holds other trainable
    parameters, and multiplies rather than adds there: it lives in another submodule (lora_B beside
    lora_A), is a matrix, or is a scalar gate; a zero bias beside its weight explains nothing.
    """
    if not zero or not grads.zero_at_start:
        return {}
    trainable = [(names[id(q)][0], q) for q in model.parameters() if q.requires_grad]
    partners = [(n, q) for n, q in trainable if id(q) in grads.zero_at_start
                and (g := grads.got.get(id(q))) is not None and not g["zero"] and g["finite"]]
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


def _reach(cands: list[Candidate], targets: set[int]) -> dict[int, set[int]]:
    """candidate index -> the target parameter ids its inputs' autograd graph reaches (memoised DFS)."""
    memo: dict[int, frozenset] = {}

    def reach_node(node) -> frozenset:
        if node is None:
            return frozenset()
        key = id(node)
        if key in memo:
            return memo[key]
        memo[key] = frozenset()
        stack = [(node, iter(node.next_functions), set())]
        while stack:
            n, it, acc = stack[-1]
            advanced = False
            for child, _ in it:
                if child is None:
                    continue
                var = getattr(child, "variable", None)
                if var is not None:
                    if id(var) in targets:
                        acc.add(id(var))
                    continue
                ck = id(child)
                if ck in memo:
                    acc |= memo[ck]
                    continue
                memo[ck] = frozenset()
                stack.append((child, iter(child.next_functions), set()))
                advanced = True
                break
            if not advanced:
                stack.pop()
                memo[id(n)] = frozenset(acc)
                if stack:
                    stack[-1][2].update(acc)
        return memo[key]

    out = {}
    for c in cands:
        hit: set[int] = set()
        for t in c.inputs:
            if t.is_leaf:
                if id(t) in targets:
                    hit.add(id(t))
            else:
                hit |= reach_node(t.grad_fn)
        out[c.index] = hit
    return out


def _chain(cand: Candidate, target_id: int, tracer: GradTracer, limit: int = 400) -> list[dict]:
    """User lines on one autograd path from the break's input back to the parameter."""
    for t in cand.inputs:
        if t.is_leaf:
            if id(t) == target_id:
                return []
            continue
        start = t.grad_fn
        parents = {id(start): None}
        nodes = {id(start): start}
        q = deque([start])
        found = None
        while q and len(parents) < 20000:
            n = q.popleft()
            for child, _ in n.next_functions:
                if child is None or id(child) in parents:
                    continue
                var = getattr(child, "variable", None)
                parents[id(child)] = id(n)
                nodes[id(child)] = child
                if var is not None and id(var) == target_id:
                    found = id(child)
                    q.clear()
                    break
                q.append(child)
        if found is None:
            continue
        path, k = [], parents[found]
        while k is not None and len(path) < limit:
            loc = tracer.grad_fn_loc.get(k)
            if loc and (not path or (path[-1]["line"], path[-1]["file"]) != (loc["line"], loc["file"])):
                path.append(loc)
            k = parents.get(k)
        seen, out = set(), []
        for loc in path:  # parameter side first
            key = (loc["file"], loc["line"])
            if key not in seen:
                seen.add(key)
                out.append(loc)
        return out
    return []


_KIND_TEXT = {
    "detach": "is cut by `{op}`", "no_grad": "is cut because `{op}` ran under no_grad/inference_mode",
    "left": "leaves autograd through `{op}` and comes back as a new tensor",
    "rewrap": "is rebuilt from data by `torch.{op}`, which has no history", "nondiff": "goes through `{op}`, which has no gradient",
    "zero_derivative": "goes through `{op}`, whose derivative is zero",
    "process": "crosses a process boundary: the tensor is pickled for another process and what comes back has no history",
    "other": "stops requiring grad at `{op}`",
}
_KIND_FIX = {
    "detach": "Remove the .detach()/.data on this line so the value stays in the graph (detach only what must not be trained).",
    "no_grad": "Remove the no_grad/inference_mode (decorator or block) from the training path, or call an undecorated version in forward.",
    "left": "Replace the NumPy/Python round trip with torch ops (torch.clamp, torch.quantile, torch.where...).",
    "rewrap": "Use the tensor itself instead of torch.tensor(...)/as_tensor(...) of its values.",
    "nondiff": "Keep the value continuous: no integer cast, argmax or comparison on the trained path (e.g. pass embeddings, use softmax).",
    "zero_derivative": "Replace the rounding/sign op by a differentiable surrogate (straight-through estimator).",
    "process": "Do this computation in the training process with torch ops; send only data (never parameters or activations to train) to workers.",
    "other": "Keep this op inside autograd, or check why its output stops requiring grad.",
}


def _location_for(cand: Candidate) -> dict | None:
    if cand.kind == "no_grad" and cand.disable_site:
        return cand.disable_site
    if cand.kind == "left" and cand.came_back_at:
        return cand.came_back_at
    if cand.kind == "process" and cand.process_at:
        return cand.process_at
    return cand.location


def analyze(tracer: GradTracer, grads: GradRecorder, model: nn.Module, step: dict, only: list[str] | None = None) -> tuple[list[Finding], dict]:
    names = tracer.names
    trainable = [p for p in model.parameters() if p.requires_grad]
    read = tracer.read | tracer.apply_watch.read
    table, broken, zero, nonfinite, unused = [], [], [], [], []
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

    by_init = zero_by_initialisation(zero, grads, model, names)
    zero = [p for p in zero if id(p) not in by_init]
    zero_ids = {id(p) for p in zero}
    findings: list[Finding] = []
    loss_tags = frozenset().union(*(b.get("tags", frozenset()) for b in tracer.backward_calls)) if tracer.backward_calls else frozenset()
    targets = {id(p) for p in broken + zero}
    by_cand: dict[int, list] = {}
    if targets and tracer.candidates:
        reach = _reach(tracer.candidates, targets)
        for p in broken + zero:
            n_bw = len(tracer.backward_calls)
            hits = [c for c in tracer.candidates if id(p) in reach[c.index] and c.can_explain(n_bw)]
            # a zero-derivative op explains a zero gradient, never a missing one
            hits = [c for c in hits if (c.kind == "zero_derivative") == (id(p) in zero_ids)]
            if not hits:
                continue
            hits.sort(key=lambda c: (c.index not in loss_tags, not c.direct, c.index))
            by_cand.setdefault(hits[0].index, []).append(p)
    attributed = {id(p) for ps in by_cand.values() for p in ps}
    merged: dict[tuple, tuple[Candidate, list]] = {}  # one finding per cause: same code at the same user line
    for idx, ps in sorted(by_cand.items()):
        cand = tracer.candidates[idx]
        where = _location_for(cand)
        key = (CODES_BY_KIND[cand.kind], (where or {}).get("file"), (where or {}).get("line"), cand.op if where is None else None)
        if key in merged:
            merged[key][1].extend(ps)
        else:
            merged[key] = (cand, list(ps))
    for cand, ps in merged.values():
        idx = cand.index
        pnames = [names[id(p)][0] for p in ps if wanted(names[id(p)][0])]
        if not pnames:
            continue
        code = CODES_BY_KIND[cand.kind]
        where = _location_for(cand)
        text = _KIND_TEXT[cand.kind].format(op=cand.op)
        evidence: dict[str, Any] = {"op": cand.op, "kind": cand.kind, "grad_enabled": cand.grad_enabled,
                                    "op_location": cand.location, "fed_the_loss": idx in loss_tags,
                                    "chain": _chain(cand, id(ps[0]), tracer)}
        if cand.kind == "no_grad" and where and where.get("decorated"):
            text += f" (the function `{where['function']}` is decorated with no_grad)"
        if cand.left_at:
            evidence["left_at"] = cand.left_at
        if cand.came_back_at:
            evidence["came_back_at"] = cand.came_back_at
        if cand.process_at:
            evidence["pickled_at"] = cand.process_at
        by_library = idx in tracer.library_no_grad
        tail = (f" at line {where['line']} of {where['file'].rsplit('/', 1)[-1]}." if where else ".")
        if by_library:
            evidence["no_grad_entered_by"] = "library code"
            tail += (" The library turned gradients off there itself (by design, e.g. an index or routing computation), "
                     "so these parameters are not trained through this path.")
        findings.append(make_finding(
            code, f"The path from the loss to {len(pnames)} parameter(s) ({', '.join(pnames[:5])}{'...' if len(pnames) > 5 else ''}) {text}"
            + tail, parameters=pnames, location=where, evidence=evidence,
            fix="Nothing to fix if the library means it; train these parameters with the objective the library provides for them."
            if by_library else _KIND_FIX[cand.kind], severity="warning" if by_library else None,
        ))
    # parameters sent to other processes as they are (leaf crossings are silent in PyTorch)
    crossed = {}
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
                fix=RULES["GP309"]["fix"],
            ))
            attributed |= {id(p) for p in broken if names[id(p)][0] in crossed}
    backward_broke = tracer.backward_error is not None and "does not require grad" not in str(tracer.backward_error)
    rest = [p for p in broken if id(p) not in attributed and wanted(names[id(p)][0])]
    if rest and not backward_broke and tracer.backward_calls:
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
    if zero_rest:
        findings.append(make_finding(
            "GP306", f"{len(zero_rest)} parameter(s) got an exactly-zero gradient: {', '.join(zero_rest[:6])}"
            f"{'...' if len(zero_rest) > 6 else ''} (masked out, a dead ReLU, ignored labels, or a mask hiding them).",
            parameters=zero_rest, evidence={"zero": len(zero_rest)},
        ))
    init_names = {names[i][0]: partner for i, partner in by_init.items() if wanted(names[i][0])}
    if init_names:
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
                parameters=nn_names, location=step.get("nonfinite_location"),
                evidence={"anomaly": step.get("nonfinite_anomaly")},
            ))
    unused_names = [names[id(p)][0] for p in unused if wanted(names[id(p)][0]) and names[id(p)][0] not in crossed]
    if unused_names and tracer.backward_calls and not tracer.backward_error:
        findings.append(make_finding(
            "GP311", f"{len(unused_names)} trainable parameter(s) were never read by the forward on this batch: "
            f"{', '.join(unused_names[:6])}{'...' if len(unused_names) > 6 else ''}.",
            parameters=unused_names, evidence={"unused": len(unused_names)},
        ))
    findings += _loss_and_backward_findings(tracer, step, broken)
    findings += _health_findings(tracer, grads, model, names, wanted)
    return findings, {"per_parameter": table, "candidates_seen": len(tracer.candidates), "zero_by_init": init_names,
                      "backward_calls": [{k: v for k, v in b.items() if k != "tags"} for b in tracer.backward_calls],
                      "crossings": tracer.crossings[:20]}


_BACKWARD_EXPLAIN = [
    (r"modified by an inplace operation", "a tensor saved for backward was modified in place after it was used (an in-place op such as +=, relu_(), x[...] = ...)"),
    (r"Trying to backward through the graph a second time", "backward ran a second time through a graph whose saved tensors were freed by the first backward"),
    (r"a leaf Variable that requires grad is being used in an in-place operation", "a leaf tensor that requires grad (a parameter) was modified in place"),
    (r"[Ii]nference tensors cannot be saved for backward", "a tensor created under inference_mode was saved for backward"),
    (r"returned an incorrect number of gradients", "a custom autograd.Function's backward returned a different number of gradients than forward took inputs"),
    (r"returned an invalid gradient", "a custom autograd.Function's backward returned a gradient of the wrong shape or type"),
]


def _loss_and_backward_findings(tracer: GradTracer, step: dict, broken: list) -> list[Finding]:
    out: list[Finding] = []
    exc = tracer.backward_error
    if exc is not None:
        text = str(exc)
        if "does not require grad" in text or "does not have a grad_fn" in text:
            call = tracer.backward_calls[0] if tracer.backward_calls else {}
            out.append(make_finding(
                "GP310", f"backward() raised because the loss does not depend on any parameter through recorded ops: {text.splitlines()[0]}",
                location=call.get("location"),
                evidence={"loss": {k: call.get(k) for k in ("shape", "requires_grad", "grad_fn")},
                          "cuts_found": len({c.index for c in tracer.candidates})},
                fix="See the other findings for where the path is cut; the loss must be computed from the model output with torch ops.",
            ))
        else:
            explain = next((e for pat, e in _BACKWARD_EXPLAIN if re.search(pat, text)), "see the error")
            out.append(make_finding(
                "GP308", f"backward() raised: {explain}. ({text.splitlines()[0][:300]})",
                location=step.get("anomaly_location") or (tracer.backward_calls[0]["location"] if tracer.backward_calls else None),
                evidence={"error": text[:2000], "forward_trace": step.get("anomaly_trace"),
                          "backward_called_at": tracer.backward_calls[0]["location"] if tracer.backward_calls else None},
            ))
    elif step.get("loss_problem"):
        out.append(make_finding("GP310", step["loss_problem"], location=step.get("loss_location"), evidence=step.get("loss_evidence", {})))
    elif step.get("error") is not None and not tracer.backward_calls:
        err = step["error"]
        out.append(make_finding(
            "GP100", f"The step raised before backward(): {type(err).__name__}: {err}",
            location=step.get("error_location"), evidence={"traceback": step.get("error_traceback")},
            fix="Fix the error in the traceback; the forward must run before gradients can be traced.",
        ))
    elif not tracer.backward_calls and step.get("kind") == "train_step":
        out.append(make_finding(
            "GP310", "The user's train_step never called backward(): no gradient can reach any parameter.",
            evidence={"train_step_returned": repr(step.get("returned"))[:200]},
            fix="Call loss.backward() in train_step (before optimizer.step()).",
        ))
    return out


def _health_findings(tracer, grads, model, names, wanted) -> list[Finding]:
    out: list[Finding] = []
    # GP312: spread of per-module gradient norms
    per_module: dict[str, float] = {}
    for p in model.parameters():
        g = grads.got.get(id(p))
        if g and g["finite"] and g["norm"] > 0:
            m = module_of(names[id(p)][0])
            per_module[m] = math.sqrt(per_module.get(m, 0.0) ** 2 + g["norm"] ** 2)
    if len(per_module) >= 3:
        hi = max(per_module, key=per_module.get)
        lo = min(per_module, key=per_module.get)
        ratio = per_module[hi] / per_module[lo]
        if ratio > 1e6:
            out.append(make_finding(
                "GP312", f"Per-module gradient norms span {ratio:.1e}x: {lo} has {per_module[lo]:.2e}, {hi} has {per_module[hi]:.2e}.",
                parameters=[n for n, _ in model.named_parameters() if module_of(n) in (lo, hi)],
                evidence={"ratio": ratio, "norms": dict(sorted(per_module.items(), key=lambda kv: kv[1])[:5] + sorted(per_module.items(), key=lambda kv: kv[1])[-5:])},
            ))
    # GP313: hooks on parameters whose gradient ended zero or None
    for p in model.parameters():
        hooks = getattr(p, "_backward_hooks", None)
        if hooks and p.requires_grad:
            g = grads.got.get(id(p))
            if g is None or g["zero"]:
                n = names[id(p)][0]
                if wanted(n):
                    out.append(make_finding(
                        "GP313", f"`{n}` has {len(hooks)} gradient hook(s) and its gradient is {'None' if g is None else 'zero'}: a hook likely replaced it.",
                        parameters=[n], evidence={"hooks": [getattr(h, '__qualname__', repr(h)) for h in hooks.values()]},
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
        traces = [str(w.message) for w in caught if "Traceback of forward call" in str(w.message) or "forward call that caused" in str(w.message)]
    if not traces:
        return None, None
    text = traces[0]
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', text)
    user_frames = [f for f in frames if user.is_user_file(f[0])]
    if not user_frames:
        return None, text[-2000:]
    f = user_frames[-1]
    return user.location_of(f[0], int(f[1]), f[2]), text[-2000:]


def observed_step(loaded, tracer: GradTracer, grads: GradRecorder, optimizer_step: bool = False) -> dict:
    """Run the user's step (or our own) with the tracer and gradient recorder active."""
    model, batch = loaded.model, loaded.batch
    step: dict[str, Any] = {"kind": "train_step" if loaded.train_step else "default", "error": None}

    def run_default():
        out = call_model(model, batch)
        loss = compute_loss(loaded.loss_fn, out, batch)
        if loss is None:
            step["loss_problem"] = "The model returned no floating-point output to build a loss from."
            return
        if loss.dim() != 0 and loss.numel() != 1:
            step["loss_problem"] = f"The loss has shape {list(loss.shape)}, not a scalar: reduce it (loss.mean())."
            step["loss_evidence"] = {"shape": list(loss.shape)}
            return
        if not loss.requires_grad:
            step["loss_problem"] = "The loss does not require grad: nothing connects it to the parameters."
            step["loss_evidence"] = {"requires_grad": False, "grad_fn": None}
        if loaded.optimizer is not None and hasattr(loaded.optimizer, "zero_grad"):
            loaded.optimizer.zero_grad()
        loss.backward()
        if optimizer_step and loaded.optimizer is not None:
            loaded.optimizer.step()

    def run():
        if loaded.train_step is not None:
            step["returned"] = loaded.train_step(model, batch, loaded.optimizer)
        else:
            run_default()

    with grads, tracer:
        try:
            run()
        except Exception as exc:
            step["error"] = exc
            step["error_location"] = loaded.user.innermost_of_traceback(exc)
            step["error_traceback"] = loaded.user.trimmed_traceback(exc)
    bad = tracer.backward_error is not None and "does not require grad" not in str(tracer.backward_error)
    nonfinite = any(not g["finite"] for g in grads.got.values())
    if bad or nonfinite:
        loc, trace = _anomaly_rerun(run, loaded.user)
        key = "anomaly" if bad else "nonfinite"
        step[f"{key}_location"], step[f"{key}_trace" if bad else "nonfinite_anomaly"] = loc, trace
    return step


def flow_graph(table: list[dict], findings: list[Finding], frozen: list[str]) -> dict:
    """Module groups of parameters with their status, for the flowchart."""
    breaks = {}
    for f in findings:
        if f["severity"] == "error" and f["code"].startswith(("GP30", "GP31", "GP4", "GP5", "GP1", "GP2")):
            for n in f["parameters"]:
                breaks.setdefault(n, {"code": f["code"], "op": (f["evidence"].get("op") or f["name"]),
                                      "line": (f.get("location") or {}).get("line")})
    groups: dict[str, dict] = {}
    for row in table:
        m = module_of(row["name"])
        g = groups.setdefault(m, {"module": m, "count": 0, "statuses": set(), "break": None})
        g["count"] += 1
        st = "broken" if row["name"] in breaks else {"ok": "ok", "zero": "zero", "none": "broken" if row["read"] else "unused", "nonfinite": "broken"}[row["grad"]]
        g["statuses"].add(st)
        if row["name"] in breaks and g["break"] is None:
            g["break"] = breaks[row["name"]]
    for n in frozen:
        m = module_of(n)
        g = groups.setdefault(m, {"module": m, "count": 0, "statuses": set(), "break": None})
        g["count"] += 1
        g["statuses"].add("frozen")
    out = []
    for g in groups.values():
        st = next((s for s in ("broken", "zero", "unused", "ok", "frozen") if s in g["statuses"]), "ok")
        out.append({"module": g["module"], "count": g["count"], "status": st, "break": g["break"]})
    out.sort(key=lambda g: ("ok", "frozen", "unused", "zero", "broken").index(g["status"]), reverse=True)
    return {"loss": "loss", "groups": out[:40]}


def trace_findings(loaded, parameters=None, optimizer_step: bool = False, provenance: bool = False):
    tracer = GradTracer(loaded.model, loaded.user, provenance=provenance)
    grads = GradRecorder(loaded.model)
    step = observed_step(loaded, tracer, grads, optimizer_step=optimizer_step)
    findings, facts = analyze(tracer, grads, loaded.model, step, parameters)
    return findings, facts, tracer, grads, step


def trace_report(loaded, parameters=None) -> dict:
    findings, facts, tracer, grads, step = trace_findings(loaded, parameters)
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
