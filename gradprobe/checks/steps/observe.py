"""Watching the user's own steps as they run: hooks and light patches, no replay.

`StepObserver` is entered once around the N observed calls of the step. It records, in the order
they happen, `backward` calls (and the loss's scaling), `zero_grad`, `scheduler.step`,
`optimizer.step` (global pre/post hooks: LR as applied, gradient norms at step time, update norms),
`torch.autograd.grad` calls, optimizers built during the steps and module attributes set during
them. Between the end of a backward and the optimizer step a small TorchFunctionMode notes which
user line wrote a gradient (clipping, a hook, a callback). Everything measured is a norm per
tensor (`torch._foreach_norm`); the only copy is of the parameters being updated, for one update
norm, freed in the post-hook.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack
from types import TracebackType
from typing import Any

import torch
import torch.nn as nn
import torch.optim.lr_scheduler as lr_scheduler
import torch.optim.optimizer as optimizer_mod
from torch.overrides import TorchFunctionMode

from gradprobe.checks.core.mode_stack import enter_beneath, leave

from gradprobe.checks.steps.accumulation import divided_twice, loss_scaling
from gradprobe.checks.steps.facts import (
    AttachSite, BackwardCall, Event, GradCall, GradChange, GroupStep, LossScaling, ModeCall, OptimizerBuilt, OptStep, ParamStep,
    ScalerStep, at,
)
from gradprobe.userframes import UserCode

_SCALING = {"DivBackward0", "DivBackward1", "MulBackward0", "MulBackward1"}


def norms(tensors: Sequence[torch.Tensor]) -> list[float]:
    """One float norm per tensor, one device sync per (device, dtype) group."""
    out: list[float] = [0.0] * len(tensors)
    groups: dict[tuple[Any, Any], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    for idx in groups.values():
        ts = [tensors[i].detach() for i in idx]
        try:
            values = torch.stack(torch._foreach_norm(ts)).float().tolist()
        except (RuntimeError, NotImplementedError, TypeError):  # sparse or odd layouts: one at a time
            values = [float(t.coalesce().values().norm() if t.is_sparse else t.float().norm()) for t in ts]
        for i, v in zip(idx, values, strict=True):
            out[i] = v
    return out


def grad_norms(params: Iterable[torch.Tensor]) -> dict[int, float | None]:
    """id(param) -> norm of its .grad (None when it has none)."""
    ps = list(params)
    pairs = [(p, g) for p, g in ((p, p.grad) for p in ps) if g is not None]  # .grad read once per parameter
    values = norms([g for _, g in pairs])
    out: dict[int, float | None] = {id(p): None for p in ps}
    out.update({id(p): v for (p, _), v in zip(pairs, values, strict=True)})
    return out


class _GradWrites(TorchFunctionMode):
    """Open between a backward and the optimizer step: which user line wrote which parameter's gradient."""

    def __init__(self, observer: StepObserver, ptrs: dict[int, int]):
        super().__init__()
        self.observer, self.ptrs = observer, ptrs  # grad data_ptr -> id(param)

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = getattr(func, "__name__", "")
        if name == "__set__" and getattr(getattr(func, "__self__", None), "__name__", "") == "grad" and args:
            self.observer.note_write(id(args[0]), "p.grad = ...")
        elif name.endswith("_") and not name.startswith("__") and args:
            first = args[0]
            targets = first if isinstance(first, (list, tuple)) else (first,)
            for t in targets:
                if isinstance(t, torch.Tensor) and not t.is_meta:
                    try:
                        pid = self.ptrs.get(t.data_ptr())
                    except RuntimeError:
                        pid = None
                    if pid is not None:
                        self.observer.note_write(pid, name)
        return func(*args, **(kwargs or {}))


class StepObserver:
    """Context manager recording what the user's steps do (see the module docstring)."""

    def __init__(self, model: nn.Module | None, user: UserCode, optimizer: Any):
        self.model, self.user = model, user
        self.call = -1
        self.events: list[Event] = []
        self.opt_steps: list[OptStep] = []
        self.grad_calls: list[GradCall] = []
        self.built: list[OptimizerBuilt] = []
        self.attached: list[AttachSite] = []
        self.scaler_steps: list[ScalerStep] = []
        self.mode_calls: list[ModeCall] = []
        self.snapshot = True  # False: measure no update (no copy of the parameters; diagnose's first step)
        self.probe_grads = True  # False: leave what autograd.grad returns untouched (the gradient-penalty check is then blind)
        self._in_train = False
        self.schedulers: dict[int, Any] = {}  # id(optimizer) -> a scheduler seen stepping it
        self.backwards: list[BackwardCall] = []  # since the last optimizer step
        self.zero_grads_between: list[tuple[dict | None, int]] = []
        self.after_backward: dict[int, float | None] = {}
        self.writes: dict[int, list[tuple[dict | None, str]]] = {}
        self.window: _GradWrites | None = None
        self.last_step_location: dict | None = None
        self._snap: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        # True: the first step fed by several backward() calls keeps its pre-step copy (the one the update norm took)
        # here for the full-batch comparison (fullbatch.py), which frees it
        self.keep_accumulating = False
        self.pre_step: tuple[OptStep, list[torch.Tensor], list[torch.Tensor]] | None = None
        # a step whose losses look divided by k twice: the next forward runs in anomaly mode (its tracebacks only, no
        # nan checks), and the next backward's loss gives the lines of its scaling operations to these
        self._trace_for: list[LossScaling] | None = None
        self._anomaly_prev: tuple[bool, bool] | None = None
        self._depth = 0
        self._stack = ExitStack()
        self.optimizers_seen: dict[int, Any] = {} if optimizer is None else {id(optimizer): optimizer}

    # ---- helpers --------------------------------------------------------------------------------------------------

    def where(self) -> dict | None:
        return self.user.innermost(sys._getframe(2))

    def tracked(self) -> list[torch.Tensor]:
        seen: dict[int, torch.Tensor] = {id(p): p for p in self.model.parameters()} if self.model is not None else {}
        for opt in self.optimizers_seen.values():
            for g in getattr(opt, "param_groups", ()):
                for p in g["params"]:
                    if isinstance(p, torch.Tensor):
                        seen.setdefault(id(p), p)
        return list(seen.values())

    def _optimizer_params(self) -> list[torch.Tensor]:
        seen: dict[int, torch.Tensor] = {}
        for opt in self.optimizers_seen.values():
            for g in getattr(opt, "param_groups", ()):
                for p in g["params"]:
                    if isinstance(p, torch.Tensor):
                        seen.setdefault(id(p), p)
        return list(seen.values())

    def note_write(self, pid: int, op: str) -> None:
        self.writes.setdefault(pid, []).append((self.user.innermost(sys._getframe(2)), op))

    def _open_window(self, tracked: list[torch.Tensor]) -> None:
        if self.window is not None:
            return
        ptrs = {}
        for p in tracked:
            g = p.grad
            if g is not None and not g.is_sparse and not g.is_meta:
                ptrs[g.data_ptr()] = id(p)
        self.window = _GradWrites(self, ptrs)
        enter_beneath(self.window)  # beneath the user's modes: their `with torch.device(...)` exits stay balanced

    def close_window(self) -> None:
        window, self.window = self.window, None
        if window is not None:
            leave(window)

    # ---- patches --------------------------------------------------------------------------------------------------

    def _before_backward(self, loss: Any) -> None:
        self.close_window()
        stale, before = False, {}
        if self.opt_steps and not self.backwards:  # the first backward after a step: gradients the optimizer uses left?
            before = grad_norms(self._optimizer_params())
            stale = any(v for v in before.values())
        scale = getattr(getattr(loss, "grad_fn", None), "name", lambda: None)()
        stale_norm = math.sqrt(sum(v * v for v in before.values() if v))
        self.backwards.append(BackwardCall(call=self.call, location=self.where_outer(), scaled=scale in _SCALING,
                                           top=scale, stale=stale, stale_norm=stale_norm, scaling=self._scaling(loss),
                                           value=_value(loss)))
        self.events.append(Event(self.call, "backward", self.backwards[-1].location))

    def _scaling(self, loss: Any) -> LossScaling | None:
        """The loss's constant scaling and reduction (accumulation.py); when traced, the lines go to the armed step."""
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or loss.grad_fn is None:
            return None
        traced = self._anomaly_prev is not None
        try:
            found = loss_scaling(loss, self.user if traced else None)
        except Exception:  # reading the graph must never break the user's step
            self.disarm()
            return None
        if traced:
            self.disarm()
            for armed in self._trace_for or ():
                if len(armed.ops) == len(found.ops):
                    armed.lines, armed.in_library = list(found.lines), list(found.in_library)
        return found

    def _arm(self, step: OptStep) -> None:
        """The first step whose losses look divided by k twice (a GradScaler's scale, not known here, may be among the
        multipliers): record the next forward's tracebacks, for the lines of the scaling operations."""
        if self._trace_for is not None or len(step.backwards) < 2:
            return
        ups = [v for b in step.backwards[:1] if b.scaling is not None for v in b.scaling.ops if v > 1]
        if divided_twice(step.backwards) or (ups and divided_twice(step.backwards, max(ups))):
            self._trace_for = [b.scaling for b in step.backwards if b.scaling is not None]
            self._anomaly_prev = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
            torch.set_anomaly_enabled(True, False)

    def disarm(self) -> None:
        prev, self._anomaly_prev = self._anomaly_prev, None
        if prev is not None:
            torch.set_anomaly_enabled(*prev)

    def where_outer(self) -> dict | None:
        return self.user.innermost(sys._getframe(3))

    def _after_backward(self) -> None:
        tracked = self.tracked()  # once per backward: the norms and the window's pointers
        self.after_backward = grad_norms(tracked)
        if self.backwards:
            self.backwards[-1].after_norm = math.sqrt(sum(v * v for v in self.after_backward.values() if v))
        self.writes = {}
        self._open_window(tracked)

    def _wrap_backward(self, orig: Callable[..., Any], first_is_loss: bool) -> Callable[..., Any]:
        observer = self

        def backward(*args: Any, **kwargs: Any) -> Any:
            loss = args[0] if args else kwargs.get("tensors" if not first_is_loss else "self")
            if isinstance(loss, (list, tuple)):
                loss = loss[0] if loss else None
            if observer._depth or (isinstance(loss, torch.Tensor) and loss.is_meta):
                # a backward on the meta device (a flop count on a meta model, as litgpt's measure_flops does) has no
                # data: no training step, nothing to measure
                return orig(*args, **kwargs)
            observer._depth += 1
            try:
                observer._before_backward(loss)
                result = orig(*args, **kwargs)
                observer._after_backward()
                return result
            finally:
                observer._depth -= 1

        return backward

    def _wrap_zero_grad(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        observer = self

        def zero_grad(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if not observer._depth:
                loc = observer.where()
                observer.events.append(Event(observer.call, "zero_grad", loc))
                if observer.backwards:
                    observer.zero_grads_between.append((loc, len(observer.backwards)))
            observer._depth += 1
            try:
                return orig(obj, *args, **kwargs)
            finally:
                observer._depth -= 1

        return zero_grad

    def _wrap_sched(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        observer = self

        def step(sched: Any, *args: Any, **kwargs: Any) -> Any:
            if sys._getframe(1).f_code.co_name != "_initial_step":
                observer.schedulers[id(getattr(sched, "optimizer", None))] = sched
                observer.events.append(Event(observer.call, "scheduler_step", observer.where(),
                                             optimizer=id(getattr(sched, "optimizer", None))))
            return orig(sched, *args, **kwargs)

        return step

    def _wrap_grad(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        observer = self

        def grad(outputs: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            create_graph = bool(kwargs.get("create_graph", args[3] if len(args) > 3 else False))
            ins = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
            params = {id(p) for p in observer.tracked()}
            on_params = any(id(t) in params for t in ins if isinstance(t, torch.Tensor))
            result = orig(outputs, inputs, *args, **kwargs)
            call = GradCall(call=observer.call, location=observer.where(), create_graph=create_graph,
                            inputs_are_parameters=on_params)
            direct = observer.user.is_user_file(sys._getframe(1).f_code.co_filename)
            if not create_graph and not on_params and direct and observer.probe_grads:
                # a probe: if what this returned feeds a loss that is backpropagated, its .grad fills in. Only for the
                # user's own direct call (never inside a library); the returned tensor then requires grad
                for g in result if isinstance(result, tuple) else (result,):
                    if isinstance(g, torch.Tensor) and g.is_floating_point() and not g.requires_grad and g.grad_fn is None:
                        g.requires_grad_(True)
                        call.probes.append(g)
            observer.grad_calls.append(call)
            return result

        return grad

    def _wrap_opt_init(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        observer = self

        def init(opt: Any, *args: Any, **kwargs: Any) -> None:
            orig(opt, *args, **kwargs)
            observer.optimizers_seen.setdefault(id(opt), opt)  # its parameters' gradients are watched from now on
            if observer.call < 0:
                return
            ids = {id(p) for g in opt.param_groups for p in g["params"]}
            model_ids = {id(p) for p in observer.model.parameters()} if observer.model is not None else ids
            observer.built.append(OptimizerBuilt(call=observer.call, location=observer.where(), optimizer=id(opt),
                                                 overlaps_model=bool(ids & model_ids)))
            observer.optimizers_seen[id(opt)] = opt

        return init

    def _wrap_setattr(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        observer = self

        def setattr_(module: nn.Module, name: str, value: Any) -> None:
            orig(module, name, value)
            if observer.call >= 0 and isinstance(value, (nn.Module, nn.Parameter)):  # only what is attached during steps
                ids = {id(value)} if isinstance(value, nn.Parameter) else {id(p) for p in value.parameters()}
                if ids:
                    observer.attached.append(AttachSite(call=observer.call, location=observer.where(), params=ids))

        return setattr_

    def _wrap_scaler_step(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        observer = self

        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            before = len(observer.opt_steps)
            scale = float(scaler.get_scale()) if scaler.is_enabled() else None
            result = orig(scaler, optimizer, *args, **kwargs)
            skipped = len(observer.opt_steps) == before
            observer.scaler_steps.append(ScalerStep(call=observer.call, location=observer.where(), scale=scale,
                                                    skipped=skipped))
            if skipped:  # a skipped step ends the iteration as a step does: its backward calls feed no later step
                observer.backwards, observer.zero_grads_between = [], []
            return result

        return step

    def _wrap_train(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        observer = self

        def train(module: nn.Module, mode: bool = True) -> Any:
            if observer._in_train:  # the calls train() makes on the children
                return orig(module, mode)
            observer._in_train = True
            try:
                out = orig(module, mode)
            finally:
                observer._in_train = False
            covers = {id(m) for m in module.modules() if _is_dropout(m)}
            if covers:
                observer.mode_calls.append(ModeCall(call=observer.call, location=observer.where(), training=bool(mode),
                                                    module=id(module), covers=covers))
            return out

        return train

    def _dropout_modes(self, step: OptStep) -> None:
        """The model's dropout modules (p > 0) when the step ran, and which of them were in eval mode."""
        if self.model is None:
            return
        drops = [(name, m) for name, m in self.model.named_modules() if _is_dropout(m)]
        step.dropout = len(drops)
        step.dropout_in_eval = [name for name, m in drops if not m.training]

    # ---- optimizer step hooks --------------------------------------------------------------------------------------

    def _pre_step(self, opt: Any, args: Any, kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """A global optimizer step pre-hook (it may return new (args, kwargs); this one never does)."""
        self.close_window()
        self.optimizers_seen.setdefault(id(opt), opt)
        loc = self.user.innermost(sys._getframe(1))
        self.last_step_location = loc
        params = [p for g in opt.param_groups for p in g["params"] if isinstance(p, torch.Tensor)]
        at_step = grad_norms(params)
        changes = []
        for p in params:
            before, after = self.after_backward.get(id(p)), at_step.get(id(p))
            if before is not None and before != after:
                writers = self.writes.get(id(p)) or [(None, "")]
                site, op = writers[-1]
                changes.append(GradChange(param=id(p), before=before, after=after, location=site, op=op,
                                          writers=[f"{at(loc)} {name}" for loc, name in writers if name]))
        moving = [p for p in params if p.grad is not None]
        if self.snapshot:  # the one copy: for the update norm, freed in the post-hook
            self._snap = (moving, [p.detach().clone() for p in moving])
        step = OptStep(call=self.call, optimizer=id(opt), location=loc, backwards=self.backwards,
                       zero_grads_between=self.zero_grads_between, changes=changes)
        for i, g in enumerate(opt.param_groups):
            lr = g.get("lr", 0.0)
            ids = [id(p) for p in g["params"] if isinstance(p, torch.Tensor)]
            step.groups.append(GroupStep(index=i, lr=float(lr), params=ids))
            for pid in ids:
                step.params[pid] = ParamStep(grad_after_backward=self.after_backward.get(pid), grad_at_step=at_step.get(pid))
        step.others = {pid: v for pid, v in self.after_backward.items() if pid not in step.params}
        self._dropout_modes(step)
        self.events.append(Event(self.call, "optimizer_step", loc, optimizer=id(opt)))
        self.opt_steps.append(step)
        try:
            self._arm(step)
        except Exception:  # ours: the lines are then not known
            self.disarm()
        self.backwards, self.zero_grads_between = [], []
        return None

    def _post_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self._snap is None or not self.opt_steps:
            return
        step = self.opt_steps[-1]
        moving, copies = self._snap
        self._snap = None
        keep = self.keep_accumulating and len(step.backwards) > 1 and self.pre_step is None
        if keep:  # the copy stays the pre-step weights (fullbatch.py): the update in a new tensor
            updates = norms(torch._foreach_sub([p.detach() for p in moving], copies)) if moving else []
            self.pre_step, self.keep_accumulating = (step, moving, copies), False
        elif moving:  # the update written into the copy itself: no second parameter-size allocation
            torch._foreach_sub_(copies, [p.detach() for p in moving])
            updates = norms(copies)
        else:
            updates = []
        del copies
        upd = {id(p): u for p, u in zip(moving, updates, strict=True)}
        weights = dict(zip((id(p) for p in moving), norms(list(moving)), strict=True)) if moving else {}
        for pid, ps in step.params.items():
            ps.update = upd.get(pid)
            ps.weight = weights.get(pid)
            ps.moved = bool(upd.get(pid))
        for g in step.groups:
            g.grad_after_backward = _total(step.params[p].grad_after_backward for p in g.params)
            g.grad_at_step = _total(step.params[p].grad_at_step for p in g.params)
            g.update = _total(step.params[p].update for p in g.params)
            g.weight = _total(step.params[p].weight for p in g.params)
        state = getattr(opt, "state", {})
        step.state_size = len(state)
        counts = [float(s["step"]) for s in state.values() if isinstance(s, dict) and "step" in s]
        step.state_step = max(counts) if counts else None

    # ---- enter / exit ---------------------------------------------------------------------------------------------

    def _patch(self, owner: Any, name: str, new: Any) -> None:
        old = owner.__dict__[name] if name in owner.__dict__ else getattr(owner, name)
        setattr(owner, name, new)
        self._stack.callback(setattr, owner, name, old)

    def __enter__(self) -> StepObserver:
        self._patch(torch.Tensor, "backward", self._wrap_backward(torch.Tensor.backward, True))
        self._patch(torch.autograd, "backward", self._wrap_backward(torch.autograd.backward, False))
        self._patch(torch.autograd, "grad", self._wrap_grad(torch.autograd.grad))
        self._patch(torch.optim.Optimizer, "zero_grad", self._wrap_zero_grad(torch.optim.Optimizer.zero_grad))
        self._patch(nn.Module, "zero_grad", self._wrap_zero_grad(nn.Module.zero_grad))
        self._patch(lr_scheduler.LRScheduler, "step", self._wrap_sched(lr_scheduler.LRScheduler.step))
        if "step" in lr_scheduler.ReduceLROnPlateau.__dict__:
            self._patch(lr_scheduler.ReduceLROnPlateau, "step", self._wrap_sched(lr_scheduler.ReduceLROnPlateau.step))
        self._patch(torch.optim.Optimizer, "__init__", self._wrap_opt_init(torch.optim.Optimizer.__init__))
        self._patch(nn.Module, "__setattr__", self._wrap_setattr(nn.Module.__setattr__))
        self._patch(nn.Module, "train", self._wrap_train(nn.Module.train))
        scaler = getattr(torch.amp, "GradScaler", None)
        if scaler is not None and "step" in scaler.__dict__:
            self._patch(scaler, "step", self._wrap_scaler_step(scaler.step))
        self._stack.callback(optimizer_mod.register_optimizer_step_pre_hook(self._pre_step).remove)
        self._stack.callback(optimizer_mod.register_optimizer_step_post_hook(self._post_step).remove)
        # the window between a backward and the step closes at the next forward too (accumulation): no mode in a forward
        # (of any module while the model is not known yet: script mode)
        if self.model is not None:
            self._stack.callback(self.model.register_forward_pre_hook(lambda module, args: self.close_window()).remove)
        else:
            from torch.nn.modules.module import register_module_forward_pre_hook

            self._stack.callback(register_module_forward_pre_hook(lambda module, args: self.close_window()).remove)
        self._stack.callback(self.close_window)
        self._stack.callback(self.disarm)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stack.close()


def _is_dropout(m: nn.Module) -> bool:
    return isinstance(m, nn.modules.dropout._DropoutNd) and float(getattr(m, "p", 0.0)) > 0


def _total(values: Iterator[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return math.sqrt(sum(v * v for v in vs)) if vs else None


def _value(loss: Any) -> float | None:
    """A scalar loss's value (read before its backward), for telling one loss computed in parts from k losses."""
    try:
        return float(loss.detach().float()) if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None
    except RuntimeError:
        return None
