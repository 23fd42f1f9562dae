"""The recording mode: one step under GradTracer records what locating a gradient break needs.

`GradTracer` is a TorchFunctionMode that records only which parameters each op
read, and every op whose input required grad but whose output does not (a *break
candidate*, checks/trace/candidates.py), with the user's line, grad mode, and the inputs (kept so
that the autograd graph behind them can be walked later). Non-grad values produced by
candidates carry a tag forward through later ops, so the analysis can tell which
cuts fed the loss. While it is active it also enters the watches (checks/core/watches.py):
pickling for another process, torch.from_numpy, inference_mode, custom Function
calls and warnings. `GradRecorder` records which parameters got a gradient.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from gradprobe.checks.core.function_calls import ApplyWatch, inside_custom_function
from gradprobe.checks.core.step import param_names, tensors_in
from gradprobe.checks.trace.candidates import (
    LEFT_OPS,
    REWRAP_OPS,
    SHAPE_ONLY_OPS,
    ZERO_DERIVATIVE_OPS,
    Candidate,
    Location,
    bias_operand,
    family_of,
    is_cut,
    is_inplace,
    kind_of,
    leaf_inplace_target,
    outputs,
    storage_ptr,
)
from gradprobe.checks.core.loss_parts import LossParts, declared
from gradprobe.checks.trace.term_split import CutTerm, TermProbe
from gradprobe.checks.trace.cut_uses import CutUses
from gradprobe.checks.core.torchcompat import (
    CHECKPOINT_NO_INPUT_GRAD_WARNING,
    GRAD_ENABLE,
    NONLEAF_GRAD_WARNING,
    decorated_function,
    is_grad_mode_decorator_frame,
    tensor_version,
    untraced,
)
from gradprobe.checks.trace.zero_expr import read_zero
from gradprobe.checks.trace.zero_ops import ZeroOpWatch
from gradprobe.checks.core.watches import (
    dataloader_watch,
    from_numpy_watch,
    inference_mode_watch,
    load_watch,
    pickle_watch,
    warning_watch,
)
from gradprobe.userframes import UserCode, is_gradprobe_file

MAX_INPLACE_EVENTS = 20000
MAX_ROOTS_KEPT = 64  # backward() roots kept for checks/trace/torch_errors.py (a graph reused by a later backward)
# frames between a no_grad switch and the code that asked for it: torch's grad-mode machinery, Module.__call__
_GRAD_MODE_FILES = ("grad_mode.py", "_contextlib.py")
_MODULE_CALL_FILES = ("nn/modules/module.py",)
# torch's Python functions that hand an op to the mode (handle_torch_function): the caller above them called the op
_DISPATCH_WRAPPERS = ("torch/overrides.py", "torch/nn/functional.py", "torch/functional.py", "torch/_tensor.py",
                      "torch/_jit_internal.py")
Tags = frozenset[int]
# ops that add a value into a sum (a loss made of terms): a value behind a cut taken by one is a term that reaches
# nothing (a product or a quotient takes a weight, not a term)
_TERM_OPS = {"add", "__add__", "__radd__", "__iadd__", "add_", "sub", "__sub__", "__rsub__", "__isub__", "sub_", "rsub",
             "stack", "cat"}


def _all_zero(outs: tuple[torch.Tensor, ...]) -> bool:
    """Every value of the op's numeric output is zero (a cast that truncated everything). A bool output (a comparison,
    a mask) that is all False hides values rather than truncating them: the zero gradients behind it are a dead mask
    on this batch (GP306), so only numeric outputs count."""
    o = outs[0] if outs else None
    if o is None or not o.numel() or o.dtype is torch.bool or o.device.type == "meta" or o.layout is not torch.strided:
        return False
    with untraced():
        return not bool(o.detach().any())


class GradTracer(TorchFunctionMode):
    """Records reads of parameters, break candidates, backward calls and process crossings."""

    def __init__(self, model: nn.Module, user: UserCode, provenance: bool = False) -> None:
        super().__init__()
        # id(out) -> (out, user line, whether a user line called the op)
        self.provenance: dict[int, tuple[torch.Tensor, Location | None, bool]] | None = {} if provenance else None
        self.user = user
        self.names = param_names(model)
        self.params = {id(p): p for p in model.parameters()}
        self.read: set[int] = set()
        # id(parameter) -> the candidates whose (tagged) values an op combined with the parameter
        self.param_tags: dict[int, Tags] = {}
        self.as_bias: set[int] = set()  # parameters that an op read as its additive bias operand
        self.candidates: list[Candidate] = []
        self.tags: dict[int, Tags] = {}
        self._tag_keep: list[torch.Tensor] = []
        self.detached: dict[int, int] = {}  # storage ptr of a detached output -> candidate index
        self.left_events: list[tuple[int, Location | None]] = []  # (candidate index or -1, location)
        self.backward_calls: list[dict[str, Any]] = []
        self.backward_error: BaseException | None = None
        self.grad_fn_loc: dict[int, Location | None] = {}
        # in-place ops on tensors that take part in autograd: (shape, version after the op, user line)
        self.inplace_ops: list[tuple[list[int], int, Location | None]] = []
        # an in-place op on a leaf that requires grad (or a view of one) that raised: (the leaf, user line); the
        # grad_fn of each backward() root, kept alive (checks/trace/torch_errors.py reads both when torch raised)
        self.leaf_inplace: tuple[torch.Tensor, str, Location | None] | None = None
        self.backward_roots: list[Any] = []
        self.disable_site: Location | None = None
        self.disable_by_library = False
        self.library_no_grad: set[int] = set()  # candidate indices cut by a no_grad the library entered itself
        self.crossings: list[dict[str, Any]] = []
        self.loaders: list[tuple[Any, Location | None]] = []  # (DataLoader, user line that iterated it)
        self.nonleaf_grad_reads: list[Location | None] = []
        self.thread = threading.get_ident()
        self.checkpoint_warnings: list[Location | None] = []
        self.apply_watch = ApplyWatch(user, {i: n[0] for i, n in self.names.items()}, capture=False,
                                      on_return=self._after_apply)
        # plain float tensor attributes of modules (neither Parameter nor buffer): id -> (attribute path, tensor, use).
        # Values made from them follow under the same path: `use` is None while they come from the attribute alone
        # (views, slices, .t()), else the op that first combined the attribute with other data, pending until a
        # value carrying it meets the gradient path (then it is recorded in plain_uses)
        self.plain: dict[int, tuple[str, torch.Tensor, dict[str, Any] | None]] = {}
        self.plain_uses: dict[str, list[dict[str, Any]]] = {}
        self._stack: contextlib.ExitStack | None = None
        # the loss's terms (checks/trace/term_split.py): the cuts whose values reached each autograd node, values behind a
        # cut taken by a linear op (id of its output's node -> those terms), numbers that .item() returned
        self.node_tags: dict[int, Tags] = {}
        self.cut_terms: dict[int, list[CutTerm]] = {}
        self.left_values: dict[int, tuple[object, int]] = {}
        self.zero_ops = ZeroOpWatch(user, self.params, read_zero)  # multiplies by zero on the grad path (GP318)
        self.cut_uses = CutUses(self.tags, self.params, user)  # a cut's value used as a value, or as an index or sample

    def watch_plain(self, attrs: dict[str, torch.Tensor]) -> None:
        """Record how the step uses these module attributes on the way to the loss (GP101 without requires_grad)."""
        for path, t in attrs.items():
            self.plain[id(t)] = (path, t, None)

    # ---- the mode -------------------------------------------------------------------------
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func is GRAD_ENABLE:
            self._grad_switch(bool(args[0]) if args else True)
            return func(*args, **kwargs)
        if self.disable_site is not None and torch.is_grad_enabled():
            self.disable_site = None  # an inference_mode block ended
        name = getattr(func, "__name__", "")
        if name == "__get__":
            attr = getattr(getattr(func, "__self__", None), "__name__", "")
            if attr != "data":
                return self._attribute_get(func, attr, args, kwargs)
            name = ".data"
        if name == "backward":
            return self._backward(func, args, kwargs)
        req, tags, plain_hits = self._inputs(name, args, kwargs)
        out = self._call(name, func, args, kwargs) if req else func(*args, **kwargs)
        if tags is not None:  # values behind cuts met this op (rare in a healthy step): which parameters they met
            self._params_met(args, kwargs, tags)
            if name not in SHAPE_ONLY_OPS:
                self._index_use(name, args, kwargs)
        if plain_hits is not None:
            self._plain_read(name, plain_hits, req, out, args, kwargs)
        if req and is_inplace(name, kwargs) and args and isinstance(args[0], torch.Tensor) \
                and len(self.inplace_ops) < MAX_INPLACE_EVENTS:
            target = args[0]
            self.inplace_ops.append((list(target.shape), tensor_version(target), self.user.innermost(skip=2)))
        if name in REWRAP_OPS and self.left_events and not req:
            self._came_back(out)
            return out
        if req and not inside_custom_function() and name not in SHAPE_ONLY_OPS:
            tags = self._after_grad_op(name, req, out, tags)
            self._loss_term_op(name, args, kwargs, out, tags)
            self.zero_ops.note(name, args, kwargs, out)
        elif name in LEFT_OPS and not req and args and isinstance(args[0], torch.Tensor):
            self._left_detached(name, args[0])
        if tags is not None:
            self.cut_uses.note(name, args, kwargs, out, tags)
            self._tag(out, tags)
        if not req:
            self._plain_op(name, args, kwargs, out)
        return out

    def _call(self, name: str, func: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> Any:
        """An op whose inputs require grad; an in-place op on a leaf that requires grad that raised is kept (GP118)."""
        leaf = leaf_inplace_target(name, args, kwargs)
        if leaf is None:
            return func(*args, **kwargs)
        try:
            return func(*args, **kwargs)
        except RuntimeError:
            self.leaf_inplace = (leaf, name, self.user.innermost(skip=3))
            raise

    def _attribute_get(self, func: Callable[..., Any], attr: str, args: Any, kwargs: dict[str, Any]) -> Any:
        """A tensor property other than .data (.T, .mT, .real): followed only for a module's plain tensor attribute."""
        out = func(*args, **kwargs)
        if self.plain and args and id(args[0]) in self.plain and self.plain[id(args[0])][1] is args[0]:
            self._plain_read(attr, [args[0]], [], out, args, {})
        return out

    def _inputs(self, name: str, args: Any, kwargs: dict[str, Any]) -> tuple[list[torch.Tensor], Tags | None,
                                                                              list[torch.Tensor] | None]:
        """One pass over an op's tensors: the parameters it reads, those that require grad, the tags they carry."""
        req: list[torch.Tensor] = []
        tags: Tags | None = None
        plain_hits: list[torch.Tensor] | None = None
        params = self.params
        for t in tensors_in(args, kwargs):
            tid = id(t)
            if tid in params:
                if tid not in self.read and bias_operand(name, t, args, kwargs):
                    self.as_bias.add(tid)
                self.read.add(tid)
            if self.plain and tid in self.plain and self.plain[tid][1] is t:
                plain_hits = [t] if plain_hits is None else plain_hits + [t]
            if t.requires_grad:
                req.append(t)
            if self.tags:
                tg = self.tags.get(tid)
                if tg is not None:
                    tags = tg if tags is None else tags | tg
        return req, tags, plain_hits

    def _params_met(self, args: Any, kwargs: dict[str, Any], tags: Tags) -> None:
        for t in tensors_in(args, kwargs):
            if id(t) in self.params:
                self.param_tags[id(t)] = self.param_tags.get(id(t), frozenset()) | tags

    def _after_grad_op(self, name: str, req: list[torch.Tensor], out: Any, tags: Tags | None) -> Tags | None:
        """An op on values that require grad: a break candidate when it cut them off, else where its grad_fn was made."""
        outs = outputs(out)
        if outs and all(is_cut(o, req) for o in outs) or name in LEFT_OPS or name in ZERO_DERIVATIVE_OPS:
            cand = self._candidate(name, req, outs, out, frame=sys._getframe(2))
            tags = frozenset({cand.index}) if tags is None else tags | {cand.index}
        else:
            for o in outs:
                gf = o.grad_fn
                if gf is not None and id(gf) not in self.grad_fn_loc:
                    self.grad_fn_loc[id(gf)] = self.user.innermost(skip=3)
        return tags

    def _left_detached(self, name: str, arg: torch.Tensor) -> None:
        """`.numpy()`/`.item()` of a detached output: the detach becomes a value that left torch."""
        ptr = storage_ptr(arg)
        if ptr in self.detached:
            cand = self.candidates[self.detached[ptr]]
            if cand.kind == "detach":
                cand.kind = "left"
                cand.op = f"{cand.op}().{name}"
                cand.left_at = self.user.innermost(skip=3)
            self.left_events.append((cand.index, cand.left_at))

    def _plain_op(self, name: str, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        """An op on values that do not require grad: its provenance (when kept) and whether it is a random draw."""
        if self.provenance is not None:
            self._note_provenance(out, skip=3)
        self.zero_ops.drawn(name, args, kwargs, out)  # random masks (GP318: a chance all-zero draw is info)

    def _note_provenance(self, out: Any, skip: int = 2) -> None:
        assert self.provenance is not None
        caller = sys._getframe(skip)
        by_user = caller is not None and self.user.is_user_file(caller.f_code.co_filename)
        for o in outputs(out):
            self.provenance[id(o)] = (o, self.user.innermost(skip=skip + 1), by_user)

    def _tag(self, out: Any, tags: Tags) -> None:
        """Values `out` carries the cuts `tags` forward (kept alive so their ids stay theirs)."""
        for o in outputs(out):
            self.tags[id(o)] = tags
            self._tag_keep.append(o)
            if o.grad_fn is not None:
                self.node_tags[id(o.grad_fn)] = tags

    def _loss_term_op(self, name: str, args: Any, kwargs: dict[str, Any], out: Any, tags: Tags | None) -> None:
        """A number .item() returned from a value that requires grad; a linear op that took a value behind a cut."""
        if name in LEFT_OPS and isinstance(out, float) and self.candidates:
            self.left_values[id(out)] = (out, self.candidates[-1].index)
        elif name in _TERM_OPS and (tags is not None or self.left_values):
            self._cut_terms(args, kwargs, out)

    def _cut_terms(self, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        """A linear op took a value behind a cut (a tensor that no longer requires grad, or a number .item() returned)
        into a value that does: that value is a term of the sum that reaches no parameter."""
        outs = outputs(out)
        node = outs[0].grad_fn if outs else None
        if node is None:
            return
        found: list[Tags] = [self.tags[id(t)] for t in tensors_in(args, kwargs)
                             if not t.requires_grad and id(t) in self.tags]
        for a in args:
            hit = self.left_values.get(id(a)) if isinstance(a, float) else None
            if hit is not None and hit[0] is a:
                found.append(frozenset({hit[1]}))
        if found:
            at = self.user.innermost(skip=3)
            self.cut_terms.setdefault(id(node), []).extend(
                CutTerm(tg, self.candidates[max(tg)].location, at) for tg in found)

    def _index_use(self, name: str, args: Any, kwargs: dict[str, Any]) -> None:
        """A tagged integer/bool value meets a float tensor in one op (an index, a gather, an embedding lookup, a
        mask): the candidates behind it selected values rather than fed a number onward."""
        ints: list[torch.Tensor] = []
        floats: list[torch.Tensor] = []
        for t in tensors_in(args, kwargs):
            if t.is_floating_point() or t.is_complex():
                floats.append(t)
            elif id(t) in self.tags:
                ints.append(t)
        if not ints or not floats:
            return
        into_grad = any(f.requires_grad for f in floats)
        for t in ints:
            for ci in self.tags[id(t)]:
                c = self.candidates[ci]
                if c.indexes is None or (into_grad and not c.indexes["into_grad"]):
                    c.indexes = {"op": name, "location": self.user.innermost(skip=3), "into_grad": into_grad}

    def _plain_read(self, name: str, hits: list[torch.Tensor], req: list[torch.Tensor], out: Any, args: Any,
                    kwargs: dict[str, Any]) -> None:
        outs = outputs(out)
        others = [t for t in tensors_in(args, kwargs) if not any(t is h for h in hits)]
        reaches = bool(req) and any(o.requires_grad for o in outs)
        for h in hits:
            path, _, use = self.plain[id(h)]
            if use is None and others:  # first combined with other data: this op is how the attribute is used
                position = next((i for i, a in enumerate(args) if a is h), None)
                use = {"op": name, "position": position, "location": self.user.innermost(skip=3)}
            if use is not None and reaches:
                uses = self.plain_uses.setdefault(path, [])
                if len(uses) < 5 and not any(u is use for u in uses):
                    uses.append(use)
            elif not reaches:
                for o in outs:  # carried on: a view of it, or data it was combined with, not yet on the grad path
                    self.plain[id(o)] = (path, o, use)

    def made_at(self, t: Any) -> Location | None:
        """The user line whose op produced tensor t (only with provenance=True)."""
        hit = (self.provenance or {}).get(id(t))
        return hit[1] if hit is not None and hit[0] is t else None

    def made_by_library(self, t: Any) -> bool:
        """Whether library code (not a user line) ran the op that produced tensor t (only with provenance=True)."""
        hit = (self.provenance or {}).get(id(t))
        return hit is not None and hit[0] is t and not hit[2]

    def _after_apply(self, cls: type, args: Any, out: Any) -> None:
        """A custom Function called under no_grad: its output has no history (the mode does not see apply itself)."""
        if inside_custom_function():
            return
        req = [t for t in tensors_in(args, None) if t.requires_grad]
        outs = outputs(out)
        if self.plain:  # a module's plain tensor handed to a custom Function (the mode does not see apply)
            hits = [t for t in tensors_in(args, None) if id(t) in self.plain and self.plain[id(t)][1] is t]
            if hits:
                self._plain_read(f"{cls.__name__}.apply", hits, req, out, args, {})
        if torch.is_grad_enabled():
            return
        if req and outs and all(is_cut(o, req) for o in outs):
            cand = self._candidate(f"{cls.__name__}.apply", req, outs, out, frame=sys._getframe(3))
            self._tag(out, frozenset({cand.index}))

    def _candidate(self, name: str, req: list[torch.Tensor], outs: tuple[torch.Tensor, ...], out: Any,
                   frame: FrameType) -> Candidate:
        grad_on = torch.is_grad_enabled()
        kind = kind_of(name, grad_on, outs)
        loc = self.user.innermost(frame)
        caller: FrameType | None = frame
        while caller is not None and caller.f_code.co_filename.endswith(_DISPATCH_WRAPPERS):
            caller = caller.f_back  # F.mse_loss(...) reaches the mode through torch's Python wrapper
        direct = caller is not None and self.user.is_user_file(caller.f_code.co_filename)
        cand = Candidate(len(self.candidates), kind, name, loc, grad_on, list(req[:4]), direct,
                         self.disable_site if not grad_on else None)
        cand.backwards_before = len(self.backward_calls)
        cand.all_zero = _all_zero(outs)
        if kind == "no_grad" and self.disable_by_library:
            self.library_no_grad.add(cand.index)
        self.candidates.append(cand)
        if kind == "detach":
            for o in outs:
                ptr = storage_ptr(o)
                if ptr is not None:
                    self.detached[ptr] = cand.index
        if kind == "left":
            cand.left_at = loc
            self.left_events.append((cand.index, loc))
        return cand

    def _came_back(self, out: Any) -> None:
        idx = self.left_events[-1][0]
        loc = self.user.innermost(skip=3)
        if idx >= 0:
            cand = self.candidates[idx]
            if cand.came_back_at is None:
                cand.came_back_at = loc
            self._tag(out, frozenset({idx}))

    def _grad_switch(self, enable: bool) -> None:
        if enable:
            self.disable_site = None
        elif torch.is_grad_enabled():
            self.disable_site = self._disable_site(sys._getframe(2))
            self.disable_by_library = self._entered_by_library(sys._getframe(2))

    def _entered_by_library(self, frame: FrameType | None) -> bool:
        """Whether library code (not the user's, not gradprobe's) turned gradients off on its own: a `with
        no_grad()` in a library function, or a no_grad-decorated library function that library code called
        (transformers' index computations). A decorated library function the user calls (generate()) is the user's."""
        f = frame
        # torch's grad-mode frames, and gradprobe's own wrappers around them (the build recorder's set_grad_enabled)
        while f is not None and (f.f_code.co_filename.endswith(_GRAD_MODE_FILES)
                                 or is_gradprobe_file(f.f_code.co_filename)) and not is_grad_mode_decorator_frame(f.f_code):
            f = f.f_back
        if f is not None and is_grad_mode_decorator_frame(f.f_code):
            fcode = getattr(decorated_function(f), "__code__", None)
            if fcode is not None and self.user.is_user_file(fcode.co_filename):
                return False
            f = f.f_back
            while f is not None and f.f_code.co_filename.endswith(_MODULE_CALL_FILES):
                f = f.f_back
        if f is None:
            return False
        name = f.f_code.co_filename
        return not self.user.is_user_file(name) and not is_gradprobe_file(name)

    def _disable_site(self, frame: FrameType | None) -> Location | None:
        f = frame
        while f is not None:
            code = f.f_code
            if self.user.is_user_file(code.co_filename):
                return self.user.location_of(code.co_filename, f.f_lineno, code.co_name)
            if is_grad_mode_decorator_frame(code):
                fn = decorated_function(f)
                fcode = getattr(fn, "__code__", None)
                if fcode is not None and self.user.is_user_file(fcode.co_filename):
                    loc = self.user.location_of(fcode.co_filename, fcode.co_firstlineno, fcode.co_name)
                    loc["decorated"] = True
                    return loc
            f = f.f_back
        return None

    def _backward(self, func: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> Any:
        root = args[0] if args and isinstance(args[0], torch.Tensor) else None
        rec: dict[str, Any] = {"location": self.user.innermost(skip=3),
                               "tags": self.tags.get(id(root), frozenset()) if root is not None else frozenset()}
        if root is not None:
            rec.update(shape=list(root.shape), requires_grad=root.requires_grad,
                       grad_fn=type(root.grad_fn).__name__ if root.grad_fn is not None else None)
            if root.grad_fn is not None:
                rec["made_at"] = self.grad_fn_loc.get(id(root.grad_fn))  # the user line that computed the loss
        parts = declared(root)  # the entries loss_fn returned, which gradprobe summed: made at loss_fn's return line
        returned_at = self.user.location_of(*parts.source) if parts is not None and parts.source is not None \
            and self.user.is_user_file(parts.source[0]) else None
        summed = parts is not None and not any(v is root for _, v in parts.entries)  # gradprobe's own sum
        if summed:
            rec["made_at"] = returned_at
        self.backward_calls.append(rec)
        probe = self._term_probe(root, args, kwargs, rec, parts, returned_at, summed)
        if probe is not None:
            self.cut_uses.mark_terms(probe.split.terms, probe.edges)
        self.zero_ops.arm()
        if len(self.backward_roots) < MAX_ROOTS_KEPT:
            self.backward_roots.append(root.grad_fn if root is not None else None)
        try:
            return func(*args, **kwargs)
        except BaseException as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"
            if self.backward_error is None:
                self.backward_error = exc
            raise
        finally:
            if probe is not None:
                rec["terms"] = probe.finish()

    def _term_probe(self, root: torch.Tensor | None, args: Any, kwargs: dict[str, Any], rec: dict[str, Any],
                    parts: LossParts | None, returned_at: Location | None, summed: bool) -> TermProbe | None:
        """The terms of the entries loss_fn returned, or of a loss made at a user line that is a sum
        (checks/trace/term_split.py), before backward() runs."""
        if root is None or root.grad_fn is None or (rec.get("made_at") is None and parts is None) \
                or len(self.backward_calls) > 4 or kwargs.get("inputs") is not None or kwargs.get("create_graph"):
            return None
        gradient = args[1] if len(args) > 1 else kwargs.get("gradient")
        node_info = lambda i: (self.node_tags.get(i, frozenset()), self.grad_fn_loc.get(i))  # noqa: E731
        try:
            named = None if parts is None else TermProbe.start_named(
                root, gradient, parts, returned_at or rec.get("made_at"), self.params, node_info, self._cut_of,
                lambda c: self.candidates[c].inputs)
            if named is not None or summed or rec.get("made_at") is None:  # gradprobe's own sum is never split
                return named
            return TermProbe.start(root, gradient, rec["made_at"], self.params, node_info,
                                   lambda i: self.cut_terms.get(i, []), lambda c: self.candidates[c].inputs)
        except Exception:  # a graph autograd.grad cannot take apart (a custom backward, freed buffers): no split, and
            return None  # the user's own backward() still runs as it would

    def _cut_of(self, value: object) -> tuple[Tags, Location | None, str] | None:
        """The cuts behind a value with no graph (a detached tensor, a number .item() returned), the line and family of
        the last one; None when no cut made it (a constant)."""
        hit = self.left_values.get(id(value)) if isinstance(value, float) else None
        tags = self.tags.get(id(value)) if isinstance(value, torch.Tensor) else (
            frozenset({hit[1]}) if hit is not None and hit[0] is value else None)
        last = self.candidates[max(tags)] if tags else None
        return (tags, last.location, family_of(last.kind)) if tags and last is not None else None

    # ---- process boundaries -----------------------------------------------------------------
    def _pickled(self, tensor: Any) -> None:
        if not isinstance(tensor, torch.Tensor):
            return
        tid = id(tensor)
        info: dict[str, Any] = {"shape": list(tensor.shape), "requires_grad": tensor.requires_grad, "is_leaf": tensor.is_leaf}
        if tid in self.params:
            info["parameter"] = self.names[tid][0]
        ptr = storage_ptr(tensor)
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
        elif "parameter" not in info and tensor.grad_fn is not None and threading.get_ident() == self.thread:
            # a value of the graph itself serialised (torch.save, pickle.dumps, a queue): what is loaded back is a
            # new leaf, so everything behind it loses its gradient
            cand = Candidate(len(self.candidates), "process", "pickle", loc, torch.is_grad_enabled(), [tensor], True,
                             None)
            cand.backwards_before = len(self.backward_calls)
            cand.process_at = loc
            self.candidates.append(cand)
            info["candidate"] = cand.index
            ptr = storage_ptr(tensor)
            if ptr is not None:
                self.detached[ptr] = cand.index

    def _on_load(self, out: Any) -> None:
        """torch.load returned: the latest serialised graph value without a return site came back here."""
        cand = next((c for c in reversed(self.candidates)
                     if c.kind == "process" and c.op == "pickle" and c.came_back_at is None), None)
        if cand is not None:
            cand.came_back_at = self.user.innermost(skip=3)
            self._tag(out, frozenset({cand.index}))

    def _on_loader(self, loader: Any) -> None:
        if threading.get_ident() == self.thread and len(self.loaders) < 8:
            self.loaders.append((loader, self.user.innermost(skip=3)))

    def _on_from_numpy(self, out: torch.Tensor) -> None:
        if self.left_events:
            self._came_back(out)

    def _on_inference_mode(self, frame: FrameType) -> None:
        self.disable_site = self._disable_site(frame)

    def _on_warning(self, text: str, filename: str, lineno: int) -> None:
        if NONLEAF_GRAD_WARNING in text:
            self.nonleaf_grad_reads.append(self.user.innermost(skip=2) or self.user.location_of(filename, lineno, "?"))
        elif CHECKPOINT_NO_INPUT_GRAD_WARNING in text:
            self.checkpoint_warnings.append(self.user.innermost(skip=2))

    def __enter__(self) -> GradTracer:
        with contextlib.ExitStack() as stack:  # a watch that fails to enter undoes the ones before it
            stack.enter_context(pickle_watch(self._pickled))
            stack.enter_context(from_numpy_watch(self._on_from_numpy))
            stack.enter_context(inference_mode_watch(self._on_inference_mode))
            stack.enter_context(self.apply_watch)
            stack.enter_context(warning_watch(self._on_warning))
            stack.enter_context(load_watch(self._on_load))
            stack.enter_context(dataloader_watch(self._on_loader))
            entered = super().__enter__()
            self._stack = stack.pop_all()
        return entered

    def __exit__(self, *exc: Any) -> Any:
        try:
            return super().__exit__(*exc)
        finally:
            self.zero_ops.disarm()
            if self._stack is not None:
                self._stack.close()
