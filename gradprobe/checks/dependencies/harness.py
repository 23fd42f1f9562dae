"""One probe forward of the user's model: where the inputs enter become leaves that require grad.

Under `ProbeMode` (a TorchFunctionMode, entered only for the probe's forward):
- every embedding lookup's output (F.embedding, what nn.Embedding calls) is replaced by a leaf that requires grad
  (the ids it looked up are kept), and every floating tensor of the batch is passed as such a leaf: the Jacobian
  from an output position to these leaves is the dependency structure;
- dropout is off (F.dropout and friends return their input, scaled_dot_product_attention gets dropout_p=0): a
  dropped element can hide a dependency, and the probe must not depend on the RNG;
- with `record=True`, the attention calls (scaled_dot_product_attention, softmax, masked_fill) and the ops of the
  forward are recorded with the module they ran in and the user's line, so that the mask an attention used can be
  followed back to the line that built it (explain.py).

`probed()` runs one forward that way: no optimizer step, no .grad written. Its callers measure inside `untouched()`,
which puts back what the forward changed (buffers such as BatchNorm's running statistics, the RNG) once the backward
passes that read them are done.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from gradprobe.checks.core.torchcompat import checkpoints_run_plainly
from gradprobe.checks.core.step import call_model, compute_loss, floating_outputs, tensors_in
from gradprobe.userframes import UserCode, is_gradprobe_file

_DROPOUTS = {F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout,
             torch.dropout, torch.alpha_dropout, torch.feature_dropout, torch.feature_alpha_dropout}
_SDPA = getattr(F, "scaled_dot_product_attention", None)
_ATTENTION = {_SDPA, F.softmax, torch.softmax, torch.Tensor.softmax, torch.Tensor.masked_fill, torch.masked_fill,
              torch.Tensor.masked_fill_}
_MAX_OPS = 20_000


@dataclass
class Leaf:
    """Where an input enters the model: an embedding lookup's output or a floating tensor of the batch."""

    tensor: torch.Tensor
    source: str  # "embedding lookup at <line>" / "batch entry <path>"
    ids: torch.Tensor | None = None  # the integer ids an embedding looked up


@dataclass
class Op:
    """One recorded op of the forward (record=True)."""

    name: str
    module: str  # the innermost module running it ("" at the top)
    location: dict | None  # the user's line, when the op ran in the user's code or was called from it
    inputs: list[int]  # ids of the tensors it read
    output: int | None  # id of the tensor it made
    mask: Any = None  # an attention's mask argument (the tensor, or None)
    is_causal: bool | None = None
    library_line: str | None = None  # file:line of the call when it is not the user's
    shapes: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # a view/reshape's input and output shapes


@dataclass
class Probe:
    """What one probe forward saw."""

    out: Any
    loss: torch.Tensor | None
    leaves: list[Leaf]
    ops: list[Op] = field(default_factory=list)
    keep: list[Any] = field(default_factory=list)  # tensors the ops' ids refer to, alive while the probe is read
    blocks: dict[str, torch.Tensor] = field(default_factory=dict)  # block path -> its output (record=True)
    calls: list[Call] = field(default_factory=list)  # the module calls made with keyword arguments (record=True)
    loss_error: str | None = None


@dataclass
class Call:
    """A module called with keyword arguments during the recorded forward, and the user's line that made the call."""

    path: str
    module: nn.Module
    kwargs: dict[str, Any]
    location: dict | None


def _frame_line(user: UserCode) -> tuple[dict | None, str | None]:
    """(the innermost user line of the current call, the innermost library line outside torch before it)."""
    f: FrameType | None = sys._getframe(1)
    library = None
    while f is not None:
        code = f.f_code
        if user.is_user_file(code.co_filename):
            return user.location_of(code.co_filename, f.f_lineno, code.co_name), library
        name = code.co_filename
        if library is None and not is_gradprobe_file(name) and f"{os.sep}torch{os.sep}" not in name:
            library = f"{os.path.basename(name)}:{f.f_lineno} ({code.co_name})"
        f = f.f_back
    return None, library


class ProbeMode(TorchFunctionMode):
    """See the module's docstring."""

    def __init__(self, user: UserCode, record: bool = False, modules: list[str] | None = None, leaves: bool = True,
                 constants: tuple[torch.Tensor, ...] = ()) -> None:
        super().__init__()
        self.user, self.record, self.make_leaves = user, record, leaves
        # integer tensors that hold no input: the model's buffers and what the forward computes from them or from
        # nothing (arange, a registered table of prompt ids); an embedding looked up at such ids is part of the model,
        # the same for every example, never an input (a P-tuning prompt expanded over the batch)
        self.constant = {id(t) for t in constants}
        self._constant_refs: list[torch.Tensor] = list(constants)  # held: ids stay unique while the probe runs
        self.leaves: list[Leaf] = []
        self.ops: list[Op] = []
        self.keep: list[Any] = []
        self.modules = modules if modules is not None else []  # the module path stack (kept by hooks)

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func in _DROPOUTS:
            return args[0] if args else kwargs.get("input")
        if func is _SDPA and kwargs.get("dropout_p"):
            kwargs["dropout_p"] = 0.0
        out = func(*args, **kwargs)
        self._note_constant(args, kwargs, out)
        ids = (args[0] if args else kwargs.get("input")) if func is F.embedding else None
        if (self.make_leaves and func is F.embedding and isinstance(out, torch.Tensor) and out.is_floating_point()
                and out.dim() >= 2 and not (isinstance(ids, torch.Tensor) and id(ids) in self.constant)):
            leaf = out.detach().requires_grad_(True)
            where, _ = _frame_line(self.user)
            self.leaves.append(Leaf(leaf, "an embedding lookup" + (f" at line {where['line']}" if where else ""),
                                    ids if isinstance(ids, torch.Tensor) else None))
            out = leaf.clone()  # the model may write into its embeddings in place (a soft prompt): not into the leaf
        if self.record and len(self.ops) < _MAX_OPS:
            self._note(func, args, kwargs, out)
        return out

    def _note_constant(self, args: tuple, kwargs: dict, out: Any) -> None:
        """An integer result computed only from constants (or from no tensor at all) is a constant too."""
        if not isinstance(out, torch.Tensor) or out.is_floating_point() or out.is_complex():
            return
        if all(id(t) in self.constant for t in tensors_in(args, kwargs)):
            self.constant.add(id(out))
            self._constant_refs.append(out)

    def _note(self, func: Callable, args: tuple, kwargs: dict, out: Any) -> None:
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        made = out if isinstance(out, torch.Tensor) else None
        loc, library = _frame_line(self.user) if func in _ATTENTION or made is not None else (None, None)
        mask = None
        if func is _SDPA:
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        elif func in (torch.Tensor.masked_fill, torch.masked_fill, torch.Tensor.masked_fill_):
            mask = args[1] if len(args) > 1 else kwargs.get("mask")
        name = getattr(func, "__name__", str(func))
        shapes = None
        if name in ("view", "reshape") and args and isinstance(args[0], torch.Tensor) and made is not None:
            shapes = (tuple(args[0].shape), tuple(made.shape))
        self.ops.append(Op(name=name, module=self.modules[-1] if self.modules else "", shapes=shapes,
                           location=loc, inputs=[id(t) for t in tensors], output=id(made) if made is not None else None,
                           mask=mask, is_causal=bool(kwargs.get("is_causal", args[5] if func is _SDPA and len(args) > 5
                                                                 else False)) if func is _SDPA else None,
                           library_line=library))
        self.keep.extend(tensors)
        if made is not None:
            self.keep.append(made)


def _leaf_batch(batch: Any, leaves: list[Leaf], path: str = "batch", depth: int = 0) -> Any:
    """The batch with every floating tensor (of at least 2 dims) replaced by a leaf that requires grad."""
    if depth > 4:
        return batch
    if isinstance(batch, torch.Tensor):
        if batch.is_floating_point() and batch.dim() >= 2:
            leaf = batch.detach().clone().requires_grad_(True)
            leaves.append(Leaf(leaf, f"batch entry `{path}`"))
            return leaf.clone()
        return batch
    if isinstance(batch, dict):
        return {k: _leaf_batch(v, leaves, str(k) if path == "batch" else f"{path}.{k}", depth + 1) for k, v in batch.items()}
    if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[0], (tuple, list)) and isinstance(batch[1], dict) \
            and depth == 0:
        return (tuple(_leaf_batch(v, leaves, f"args[{i}]", depth + 1) for i, v in enumerate(batch[0])),
                _leaf_batch(batch[1], leaves, path, depth))
    if isinstance(batch, (tuple, list)):
        return type(batch)(_leaf_batch(v, leaves, f"{path}[{i}]", depth + 1) for i, v in enumerate(batch))
    return batch


@contextlib.contextmanager
def untouched(model: nn.Module) -> Iterator[None]:
    """Buffers (BatchNorm's running statistics, counters) and the RNG as they were before the block."""
    saved = [(b, b.detach().clone()) for b in model.buffers() if b.device.type != "meta"]
    rng = torch.get_rng_state()
    try:
        yield
    finally:
        with torch.no_grad():
            for b, v in saved:
                if b.shape == v.shape:
                    b.copy_(v)
        torch.set_rng_state(rng)


@contextlib.contextmanager
def _module_paths(model: nn.Module, stack: list[str], blocks: set[str], outputs: dict[str, torch.Tensor],
                  calls: list[Call] | None = None, user: UserCode | None = None) -> Iterator[None]:
    """Keep the path of the module running now on `stack`; keep the outputs of the modules in `blocks`; with `calls`,
    note every module call made with keyword arguments."""
    handles = []
    for name, m in model.named_modules():
        def pre(mod: nn.Module, args: Any, kwargs: dict[str, Any], _n: str = name) -> None:
            stack.append(_n)
            if calls is not None and kwargs and user is not None and len(calls) < 500:
                calls.append(Call(_n, mod, dict(kwargs), user.innermost()))

        def post(mod: nn.Module, args: Any, out: Any, _n: str = name) -> None:
            if stack and stack[-1] == _n:
                stack.pop()
            if _n in blocks:
                t = out[0] if isinstance(out, (tuple, list)) and out else out
                if isinstance(t, torch.Tensor) and _n not in outputs:
                    outputs[_n] = t
        handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(m.register_forward_hook(post, always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def probed(model: nn.Module, batch: Any, loss_fn: Any, user: UserCode, record: bool = False,
           blocks: set[str] | None = None, call: Callable[[nn.Module, Any], Any] = call_model) -> Probe:
    """One forward (and its loss) with the inputs as leaves; see the module's docstring. Raises what the model raises."""
    leaves: list[Leaf] = []
    stack: list[str] = []
    outputs: dict[str, torch.Tensor] = {}
    calls: list[Call] = []
    mode = ProbeMode(user, record=record, modules=stack, constants=tuple(model.buffers()))
    with torch.enable_grad(), contextlib.ExitStack() as es:
        leafed = _leaf_batch(batch, leaves)
        if record or blocks:
            es.enter_context(_module_paths(model, stack, blocks or set(), outputs, calls if record else None, user))
        with mode, checkpoints_run_plainly():  # the forward the mode changes is the one the backward reads
            out = call(model, leafed)
        loss, loss_error = None, None
        try:
            loss = compute_loss(loss_fn, out, leafed)
        except Exception as exc:  # the loss is only read for the claim; without it there is no claim, not an error
            loss_error = f"{type(exc).__name__}: {exc}"[:300]
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad):
        loss = None
    return Probe(out=out, loss=loss, leaves=mode.leaves + leaves, ops=mode.ops, keep=mode.keep, blocks=outputs, calls=calls,
                 loss_error=loss_error)


def outputs_of(out: Any) -> list[torch.Tensor]:
    """The model's floating outputs with at least one dimension (a 0-d loss is not an output position)."""
    return [o for o in floating_outputs(out) if o.dim() >= 1 and o.requires_grad]
