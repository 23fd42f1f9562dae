"""Watching a training script until its first step: the observers installed before its imports.

`StepWatch` patches, for the length of the script's run:
- `nn.Module.__call__`: every top-level module call (no other module call on the stack) made
  with grad enabled, with its arguments, its output and the user function that made it;
- `Tensor.backward` / `torch.autograd.backward`: the tensors the script backpropagates from;
- a global optimizer step pre-hook: the first `optimizer.step()` is the step that is captured.
  A step given a closure (Lightning runs forward and backward inside `step(closure)`) is
  captured after its closure returned, when the gradients exist;
- `DataLoader.__iter__`, to say how far a script got that never reached a step.

At the capture `StopScript`, a BaseException, unwinds the script: its own `except Exception`
cannot swallow it, and any later observed event raises it again.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from types import FrameType
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from gradprobe.checks.precision.autocast_underflow import autocast_state
from gradprobe.userframes import UserCode
from gradprobe.wrappers import unwrap_library

PHASES = ("imports and setup (no module built yet)", "a module built", "an optimizer created",
          "a DataLoader iterated", "a forward pass with grad", "a backward pass", "an optimizer step")
STOPS_BEFORE_ESCAPE = 3  # stops swallowed (a bare `except:`) before the job finishes from inside the script



def undo(items: list) -> None:
    """Take back what a watch installed, newest first: (owner, name, original) patches and hook handles."""
    for item in reversed(items):
        if isinstance(item, tuple):
            setattr(*item)
        else:
            item.remove()
    items.clear()

class StopScript(BaseException):
    """Raised into the script to stop it; not an Exception, so `except Exception` lets it pass."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


@dataclass
class ModuleCall:
    """One top-level, grad-enabled call of a module by the script."""

    module: nn.Module
    args: tuple
    kwargs: dict
    seq: int
    location: dict | None
    output: Any = None
    method: Any = None  # the user's bound method that made the call (e.g. a training_step), if any
    method_args: tuple = ()
    method_kwargs: dict = field(default_factory=dict)
    autocast: tuple[str, str] | None = None  # (device, dtype) of the autocast the call ran under (amp watch only)
    out_grads: dict[tuple, torch.Tensor] = field(default_factory=dict)  # output path -> the gradient backward sent it
    redirected: Any = None  # the forward set on the module's instance (inside its wrappers) for this call only


@dataclass
class Backward:
    root: torch.Tensor | None
    location: dict | None
    seq: int


@dataclass
class Capture:
    """What the first training step used, taken when the step began (before parameters moved)."""

    optimizer: torch.optim.Optimizer | None
    step_location: dict | None
    closure: bool
    lrs: list[float]
    grads: dict[int, bool]  # id(parameter) -> had a gradient at the step
    how: str  # "optimizer.step" or "backward"


class StepWatch:
    """The observers of one script run (see the module docstring)."""

    def __init__(self, user: UserCode):
        self.user = user
        self.main = threading.get_ident()
        self.seq = 0
        self.depth = 0
        self.calls: dict[int, ModuleCall] = {}  # id(module) -> its last top-level grad-enabled call
        self.backwards: list[Backward] = []
        self.capture: Capture | None = None
        self.stopping = False
        self.phase = 0
        self.data_iterated = False
        self.optimizers_made = 0
        self.optimizers: list[torch.optim.Optimizer] = []
        self._in_backward = False
        self._undo: list = []
        self.stops_swallowed = 0
        self.on_stuck: Callable[[], None] | None = None  # finishes the job from inside the script
        self.on_capture: Callable[[], None] | None = None  # runs the checks at the captured step
        self.forward_error: tuple[BaseException, dict | None] | None = None
        self.lr_zero_step: tuple[list[float], dict | None] | None = None  # a first step at lr 0, let through
        self.passive = False  # True: capture no step here (audit_training's watch counts the steps and stops the script)
        self.amp = False  # True: note the autocast each top-level call ran under, and its output's gradients (GP708)
        self._amp_call: ModuleCall | None = None  # the top-level call running now (amp watch only)
        # several models (scriptmode/members.py): top-level calls made with grad disabled (id(module) -> seq), the
        # seq at each completed optimizer step, the optimizers that stepped, the names the script holds objects by
        self.quiet_calls: dict[int, int] = {}
        self.step_seqs: list[int] = []
        self.stepped: set[int] = set()
        self.labels: dict[int, str] = {}

    # ---- how far the script got ---------------------------------------------------------
    def reached(self, phase: int) -> None:
        self.phase = max(self.phase, phase)

    def phase_name(self) -> str:
        return PHASES[self.phase]

    def _stop_again(self) -> None:
        if self.stopping and threading.get_ident() == self.main:
            self.stop_swallowed()

    def stop_swallowed(self) -> None:
        """The script went on after a stop: stop it again, or finish from here when it keeps swallowing."""
        self.stops_swallowed += 1
        if self.stops_swallowed >= STOPS_BEFORE_ESCAPE and self.on_stuck is not None:
            self.on_stuck()  # does not return
        raise StopScript("the script caught gradprobe's stop and went on")

    # ---- the patches ----------------------------------------------------------------------
    def install(self) -> None:
        """Patch the module call, backward, the constructors and the optimizer step (undone by `uninstall`)."""
        self._patch_module_call()
        self._patch_backward()
        self._patch_constructors()
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        handle = register_optimizer_step_pre_hook(self._pre_step)
        self._undo.append(handle)
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._undo.append(register_optimizer_step_post_hook(self._post_step))
        if self.amp:
            self._undo.append(nn.modules.module.register_module_forward_pre_hook(self._amp_pre))

    def _amp_pre(self, module: nn.Module, args: Any) -> None:
        """The autocast a module of the current top-level call runs under (a `with` around the call, or one its
        forward entered)."""
        rec = self._amp_call
        if rec is not None and rec.autocast is None and self.depth > 0 and threading.get_ident() == self.main:
            rec.autocast = autocast_state()

    def _patch_module_call(self) -> None:
        watch = self
        orig_call = nn.Module.__call__

        def call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != watch.main:
                return orig_call(module, *args, **kwargs)
            watch._stop_again()
            top = watch.depth == 0
            rec = None
            if top and not torch.is_grad_enabled():
                watch.seq += 1
                watch.quiet_calls[id(module)] = watch.seq
            elif top and not _on_meta(module):  # a call on the meta device (a flop count) is no step of the script's
                watch.reached(4)
                watch.seq += 1
                rec = ModuleCall(module, args, kwargs, watch.seq, watch.user.innermost(skip=2))
                # Lightning's DDP strategy runs training_step through the wrapper by setting it as the instance's forward
                rec.redirected = vars(unwrap_library(module)[0]).get("forward")
                watch._note_method(rec, sys._getframe(1))
                watch._amp_call = rec if watch.amp else None
            watch.depth += 1
            try:
                out = orig_call(module, *args, **kwargs)
            except Exception as exc:
                if top:
                    watch.forward_error = (exc, watch.user.innermost_of_traceback(exc) or (rec.location if rec else None))
                raise
            finally:
                watch.depth -= 1
                if top:
                    watch._amp_call = None
            if rec is not None:
                rec.output = out
                watch.calls[id(module)] = rec
                if rec.autocast is not None:
                    _keep_output_grads(rec)
            return out

        nn.Module.__call__ = call  # type: ignore[method-assign]
        self._undo.append((nn.Module, "__call__", orig_call))

    def _patch_backward(self) -> None:
        watch = self
        orig_tensor_backward = torch.Tensor.backward
        orig_autograd_backward = torch.autograd.backward

        def run_backward(fn: Callable[..., Any], root: Any, *args: Any, **kwargs: Any) -> Any:
            if watch._in_backward or threading.get_ident() != watch.main or (isinstance(root, torch.Tensor) and root.is_meta):
                # a backward on the meta device (a flop count on a meta model) has no data: it is no training step
                return fn(*args, **kwargs)
            watch._stop_again()
            watch.reached(5)
            watch.seq += 1
            rec = Backward(root if isinstance(root, torch.Tensor) else None, watch.user.innermost(skip=3), watch.seq)
            watch._in_backward = True
            try:
                out = fn(*args, **kwargs)
            finally:
                watch._in_backward = False
            watch.backwards.append(rec)
            if watch.optimizers_made == 0 and watch.capture is None:
                # no optimizer exists, so none will step: this backward is the step
                watch.take(None, rec.location, closure=False, how="backward")
                raise StopScript("captured the first backward (no optimizer exists)")
            return out

        def tensor_backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            return run_backward(orig_tensor_backward, self, self, *args, **kwargs)

        def autograd_backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            root = (tensors if isinstance(tensors, torch.Tensor)
                    else (tensors[0] if isinstance(tensors, (list, tuple)) and tensors else None))
            return run_backward(orig_autograd_backward, root, tensors, *args, **kwargs)

        torch.Tensor.backward = tensor_backward  # type: ignore[method-assign]
        torch.autograd.backward = autograd_backward
        self._undo += [(torch.Tensor, "backward", orig_tensor_backward), (torch.autograd, "backward", orig_autograd_backward)]

    def _patch_constructors(self) -> None:
        watch = self
        orig_opt_init = torch.optim.Optimizer.__init__

        def opt_init(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            watch.reached(2)
            watch.optimizers_made += 1
            watch.optimizers.append(opt)
            return orig_opt_init(opt, *args, **kwargs)

        torch.optim.Optimizer.__init__ = opt_init  # type: ignore[method-assign,assignment]
        self._undo.append((torch.optim.Optimizer, "__init__", orig_opt_init))

        orig_module_init = nn.Module.__init__

        def module_init(module: nn.Module, *args: Any, **kwargs: Any) -> None:
            watch.reached(1)
            return orig_module_init(module, *args, **kwargs)

        nn.Module.__init__ = module_init  # type: ignore[method-assign,assignment]
        self._undo.append((nn.Module, "__init__", orig_module_init))

        from torch.utils.data import DataLoader

        orig_iter = DataLoader.__iter__

        def loader_iter(loader: Any) -> Any:
            watch.reached(3)
            return orig_iter(loader)

        DataLoader.__iter__ = loader_iter  # type: ignore[method-assign]
        self._undo.append((DataLoader, "__iter__", orig_iter))

    def uninstall(self) -> None:
        undo(self._undo)

    def _note_method(self, rec: ModuleCall, frame: FrameType | None) -> None:
        """The user's method (of a module) that made this call, with its arguments, for a replay."""
        f = frame
        while f is not None and not self.user.is_user_file(f.f_code.co_filename):
            f = f.f_back
        if f is None or f.f_code.co_name == "<module>":
            return
        code = f.f_code
        owner = f.f_locals.get(code.co_varnames[0]) if code.co_argcount else None
        if not isinstance(owner, nn.Module):
            return
        fn = getattr(type(owner), code.co_name, None)
        if getattr(fn, "__code__", None) is not code:
            return
        names = code.co_varnames[1:code.co_argcount + code.co_kwonlyargcount]
        loc = f.f_locals
        rec.method = getattr(owner, code.co_name)
        rec.method_args = tuple(loc[n] for n in names[:code.co_argcount - 1] if n in loc)
        rec.method_kwargs = {n: loc[n] for n in names[code.co_argcount - 1:] if n in loc}

    def _post_step(self, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if threading.get_ident() == self.main:
            self.step_seqs.append(self.seq)
            self.stepped.add(id(opt))

    def _pre_step(self, opt: torch.optim.Optimizer, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if self.capture is not None or threading.get_ident() != self.main:
            self._stop_again()
            return None
        self.reached(6)
        if self.passive:
            return None
        lrs = _lrs(opt)
        if lrs and all(lr == 0 for lr in lrs) and self.lr_zero_step is None:
            # a warm-up from 0 moves nothing on its first step: let it run, judge a later step
            self.lr_zero_step = (lrs, self.user.innermost(skip=3))
            return None
        # args includes the optimizer itself: step(closure) has the closure at args[1]
        closure = kwargs.get("closure") if "closure" in kwargs else (args[1] if len(args) > 1 and callable(args[1]) else None)
        loc = self.user.innermost(skip=3)
        if closure is None:
            self.take(opt, loc, closure=False, how="optimizer.step")
            raise StopScript("captured the first optimizer step")
        watch = self

        def observed_closure() -> None:
            closure()
            watch.take(opt, loc, closure=True, how="optimizer.step")
            raise StopScript("captured the first optimizer step (after its closure)")

        if "closure" in kwargs:
            return args, dict(kwargs, closure=observed_closure)
        return (args[0], observed_closure, *args[2:]), kwargs

    def take(self, opt: torch.optim.Optimizer | None, loc: dict[str, Any] | None, *, closure: bool, how: str,
             in_script: bool = True) -> None:
        """Record the step now (which parameters have a gradient, the learning rates), then run
        `on_capture` (the checks, in place, while the script's state is live)."""
        grads: dict[int, bool] = {}
        lrs = _lrs(opt)
        if opt is not None:
            for g in opt.param_groups:
                for p in g["params"]:
                    grads[id(p)] = p.grad is not None
        self.capture = Capture(opt, loc, closure, lrs, grads, how)
        self.stopping = True
        if in_script and self.on_capture is not None:
            self.on_capture()


def _keep_output_grads(rec: ModuleCall) -> None:
    """Keep the gradient the script's own backward sends to each floating output of this call (a copy in float32):
    the replay backpropagates the same vector through the model, so its gradients have the script's magnitude."""

    def walk(o: Any, path: tuple, depth: int) -> None:
        if isinstance(o, torch.Tensor):
            if o.requires_grad and o.is_floating_point():
                o.register_hook(lambda g, _p=path: rec.out_grads.__setitem__(_p, g.detach().float().clone()))
        elif isinstance(o, dict) and depth < 6:
            for k, v in o.items():
                walk(v, path + (k,), depth + 1)
        elif isinstance(o, (tuple, list)) and depth < 6:
            for i, v in enumerate(o):
                walk(v, path + (i,), depth + 1)

    walk(rec.output, (), 0)


def _on_meta(module: nn.Module) -> bool:
    """A module whose first parameter is on the meta device (built under `torch.device("meta")`, not yet `to_empty`):
    its calls compute no data and are no step's."""
    p = next(module.parameters(), None) if isinstance(module, nn.Module) else None
    return p is not None and p.is_meta


def _lrs(opt: torch.optim.Optimizer | None) -> list[float]:
    out: list[float] = []
    for g in getattr(opt, "param_groups", None) or []:
        lr = g.get("lr")
        out.append(float(lr) if isinstance(lr, (int, float, torch.Tensor)) else float("nan"))
    return out
