"""audit_training on a script: watch the script's own optimizer steps as they run (no replay), then stop it.

`ScriptSteps` is audit_training's `StepObserver` (gradprobe/checks/steps/observe.py) entered around the
whole script run. The first optimizer that steps is the main one: one of its steps is one observed
"call" of the audit. At its first step the model is chosen (step.choose_model: the outermost module
holding most of its parameters and of the loss graph's leaves; library wrappers unwrapped). Between two
of its steps every model parameter's norm is compared with its norm after the previous step: a change
the optimizers did not make is a change outside the optimizer (an EMA update). When the main optimizer
is about to take step N+1, the script is stopped (`stop`, given by the job, raises StopScript): N steps
were watched, and the backward of step N+1 showed whether the gradients of step N were cleared.

A step given a closure (Lightning, LBFGS) runs its forward and backward inside `step()`: the step is
measured when the closure has returned. A wrapper's step that calls an inner optimizer's step is
measured once.

What the interval after a main step does to each EMA copy is measured as in the build_model() form
(checks/steps/copies.py): its in-place writes (version counters, over the whole interval) and, until the
next forward, backward or optimizer step (no mode in a forward), the updates computed from it and its
student (an UpdateWatch). A copy that never moves is then told apart as the build form tells it: an update
that changes nothing (written, or computed and dropped: an error), or a frozen copy nothing wrote (info).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from gradprobe.checks.core.mode_stack import enter_beneath, leave
from gradprobe.checks.core.step import param_names
from gradprobe.checks.steps.copies import UpdateWatch, kept_share, versions
from gradprobe.checks.steps.facts import EmaCopy
from gradprobe.checks.steps.outside_copies import Held, HeldCopies, HeldInterval, close_interval, kept_by_site, open_interval
from gradprobe.checks.steps.observe import StepObserver, norms
from gradprobe.checks.steps.optimizer_owners import OwnersWatch
from gradprobe.scriptmode.observe import StepWatch


class ScriptSteps(StepObserver):
    """The observer of audit_training's script mode (see the module docstring)."""

    def __init__(self, watch: StepWatch, steps: int, record: Any = None):
        super().__init__(None, watch.user, None)
        self.record = record  # the BuildRecord (where modules were attached), for the EMA copies' sites
        self.ema: list[EmaCopy] | None = None  # paired after the first main step
        self._ema_saved: list[tuple[EmaCopy, list[torch.Tensor]]] = []
        self.watch, self.steps = watch, steps
        self.main_opt: torch.optim.Optimizer | None = None
        self.done = 0  # steps of the main optimizer completed
        self.names: dict[int, str] = {}
        self.requires_grad: dict[int, bool] = {}
        self.outside: dict[int, list[bool]] = {}  # id(param) -> per completed main step: changed outside the optimizers
        self.model_note: dict[str, Any] = {}
        self.stop: Callable[[torch.optim.Optimizer, dict | None], None] | None = None
        self._stepping: torch.optim.Optimizer | None = None  # the optimizer whose step is running (a wrapper's)
        self._ref: dict[int, float] = {}  # model parameter norms after the last main step
        self._ref_index = 0  # len(opt_steps) when _ref was taken
        self.intervals = 0  # intervals between main steps measured by measure_outside
        self.failed: str | None = None  # a measurement of ours that raised: the rest is left out, the script goes on
        self.first_step_at: float | None = None  # perf_counter at the main optimizer's first step, and at its last
        self.last_step_at: float | None = None
        self.hook_seconds = 0.0  # time spent in the measurements since the first step
        self._batches = 0  # DataLoader batches fetched since the main optimizer's last step
        self._loader_len: int | None = None  # len() of the DataLoader that gave the last batch (None: no len)
        self.loader: list[tuple[int | None, int]] = []  # per main step: (that len, batches fetched since the last step)
        self.scheduler_sites: dict[int, dict | None] = {}  # id(scheduler) -> the user's line that built it
        self._guard_depth = 0  # nested measurements count once
        self._hook_seconds_in_span = 0.0  # ... up to the last watched step (the span cost() reports)
        self.copy_writes: list[dict[int, int]] = []  # per interval: in-place writes into each EMA copy's tensors
        self.copy_combined: list[set[tuple[int, int]]] = []  # per interval: pairs an op combined (an update computed)
        self._versions: dict[int, int] | None = None  # the copies' write counters after the last main step
        self._updates: UpdateWatch | None = None  # open from a main step to the next forward, backward or step
        self.owners: OwnersWatch | None = None  # several optimizers: who clears and steps what (GP212/GP213)
        self.frozen: Any = None  # several models: the frozen ones beside them, measured (checks/several/report.py)
        self._unowned: set[int] = set()  # graph leaves looked for a model already (_grow)
        self.held: dict[int, Held] = {}  # EMA copies outside the model, by what writes them (outside_copies.py)
        self.held_intervals: list[tuple[HeldInterval, dict[str, float]]] = []
        self._held_watch: HeldCopies | None = None
        self._held_open = False  # the held copies' interval started at the last main step

    def _guarded(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run a measurement; if it fails, say so and measure nothing more (the script's own step must not fail)."""
        if self.failed is not None:
            return
        t0, self._guard_depth = time.perf_counter(), self._guard_depth + 1
        try:
            fn(*args)
        except Exception as exc:  # ours, never the script's
            self.failed = f"{type(exc).__name__}: {exc}"[:500]
            self.close_window()
        finally:
            self._guard_depth -= 1
            if self.first_step_at is not None and self._guard_depth == 0:  # counted once, and inside the span only
                self.hook_seconds += max(0.0, time.perf_counter() - max(t0, self.first_step_at))

    def cost(self) -> dict[str, Any] | None:
        """The watched steps' wall time and the part of it spent in gradprobe's measurements (first step to the stop)."""
        if self.first_step_at is None or self.last_step_at is None:
            return None
        span = self.last_step_at - self.first_step_at
        plain = span - self._hook_seconds_in_span
        return {"watched_seconds": round(span, 4), "in_gradprobe_measurements_seconds": round(self._hook_seconds_in_span, 4),
                "ratio_to_unwatched_estimate": round(span / plain, 3) if plain > 0 else None,
                "spans": f"from the first optimizer step to the last one watched ({self.done} steps)"}

    # ---- the model and its parameters -----------------------------------------------------------------------------

    def _choose_model(self, opt: torch.optim.Optimizer) -> None:
        from gradprobe.scriptmode.several import several_model
        from gradprobe.scriptmode.step import choose_model, graph_leaves, outermost_modules

        roots = [b.root for b in self.watch.backwards if b.root is not None]
        in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
        _, leaf_ids, _ = graph_leaves(roots)
        outer = outermost_modules()  # one walk over the live objects, for both questions
        several, members = several_model(self.watch, opt, roots, self.user, outer)
        if several is not None:  # several models trained (scriptmode/members.py): all of them, under the script's names
            from gradprobe.checks.several.report import FrozenWatch

            self.model = several
            self.model_note = {"model": type(several).__name__, "wrapper": None, "models": members.facts()}
            self.frozen = FrozenWatch((m.label, type(m.module).__name__, m.no_grad_only, list(m.module.parameters()))
                                      for m in members.frozen)
            self.watch.backwards = self.watch.backwards[-1:]
            return
        model, note = choose_model(self.watch, in_opt, leaf_ids, self.user, outer)
        root = note.pop("_root", None)
        self.model = model
        self.model_note = {"model": type(model).__name__ if model is not None else None,
                           "wrapper": type(root).__name__ if root is not None and root is not model else None}
        self.watch.backwards = self.watch.backwards[-1:]  # the roots were only needed here

    def model_params(self) -> dict[int, torch.Tensor]:
        if self.model is None:
            return {}
        params: dict[int, torch.Tensor] = {id(p): p for p in self.model.parameters()}
        if any(pid not in self.names for pid in params):  # names once, again only when a parameter appears
            for pid, ns in param_names(self.model).items():
                self.names.setdefault(pid, ns[0])
        for pid, p in params.items():
            self.requires_grad[pid] = p.requires_grad
        return params

    def _weights(self, known: dict[int, float] | None = None) -> dict[int, float]:
        """Every model parameter's norm (those in `known` are taken from it: the post-step hook just measured them)."""
        params = self.model_params()
        known = known or {}
        ids = [pid for pid in params if pid not in known]
        out = {pid: w for pid, w in known.items() if pid in params}
        out.update(zip(ids, norms([params[i] for i in ids]), strict=True))
        return out

    def measure_outside(self) -> None:
        """After a main step and before the next one: which model parameters changed that no optimizer step changed."""
        self._guarded(self._measure_outside)

    def _measure_outside(self) -> None:
        if self.intervals >= self.done:
            return
        self.intervals += 1
        self._copies_interval()
        now = self._weights()
        stepped = {pid: ps.weight for s in self.opt_steps[self._ref_index:] for pid, ps in s.params.items()
                   if ps.weight is not None}
        for pid, w in now.items():
            ref = stepped.get(pid, self._ref.get(pid))
            self.outside.setdefault(pid, [False] * (self.intervals - 1)).append(ref is not None and w != ref)
        self._kept()

    # ---- what an interval does to the EMA copies ------------------------------------------------------------------

    def _open_copies(self) -> None:
        """After a main step: the copies' write counters, and the watch of updates computed from them."""
        by_id = self.model_params()
        copies = [c for c in self.ema or () if all(pid in by_id for pid in (*c.params, *c.students))]
        if not copies:
            return
        self._versions = versions(by_id[pid] for c in copies for pid in c.params)
        self._updates = UpdateWatch(by_id[pid] for c in copies for pid in {*c.params, *c.students})
        enter_beneath(self._updates)  # beneath the script's own modes (checks/core/mode_stack.py)

    def _close_updates(self) -> None:
        watch = self._updates
        if watch is None or getattr(watch, "closed", False):
            return
        watch.closed = True  # type: ignore[attr-defined]
        leave(watch)

    def _open_held(self, by_id: dict[int, torch.Tensor]) -> None:
        """After a main step: the held copies' starting values, and the watch of writes from the model's parameters."""
        in_opt = {pid for st in self.opt_steps for g in st.groups for pid in g.params}
        open_interval(self.held)
        self._held_open = True
        self._held_watch = HeldCopies([p for pid, p in by_id.items() if pid in in_opt], by_id.values(), self.held,
                                      lambda: self.user.innermost())
        enter_beneath(self._held_watch)

    def _close_held(self) -> None:
        watch, self._held_watch = self._held_watch, None
        if watch is not None:
            watch.pending = {}
            leave(watch)

    def close_window(self) -> None:
        self._close_held()
        self._close_updates()  # no mode in a forward, a backward or a step: the update watch closes with the window
        super().close_window()

    def _copies_interval(self) -> None:
        """The interval that ends: its writes into the copies and the updates computed from them."""
        self._close_held()
        self._close_updates()
        if self._held_open:
            self._held_open = False
            interval = close_interval(self.held)
            self.held_intervals.append((interval, kept_by_site(self.held, interval)))
        if self._versions is None:
            return
        by_id = self.model_params()
        now = versions(by_id[pid] for pid in self._versions if pid in by_id)
        self.copy_writes.append({pid: now[pid] - v for pid, v in self._versions.items() if pid in now})
        self.copy_combined.append(self._updates.combined if self._updates is not None else set())
        self._versions, self._updates = None, None

    def measured_copies(self, copies: list[EmaCopy]) -> None:
        """Each copy's writes and updates computed per interval (as the build form's), when they were measured."""
        if not self.copy_writes or len(self.copy_writes) != self.intervals:
            return
        for copy in copies:
            copy.writes = [sum(w.get(pid, 0) for pid in copy.params) for w in self.copy_writes]
            copy.computed = [sum((pid, sid) in c for pid, sid in zip(copy.params, copy.students, strict=True))
                             for c in self.copy_combined]

    # ---- optimizer step hooks ---------------------------------------------------------------------------------

    def _pre_step(self, opt: Any, args: Any, kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if (self._stepping is not None and opt is not self._stepping) or threading.get_ident() != self.watch.main \
                or self.watch.stopping:
            return None  # an inner optimizer's step inside a wrapper's, another thread, or a stop under way
        if self.main_opt is None:
            self.main_opt = opt
            self.first_step_at = time.perf_counter()
        elif opt is not self.main_opt and self._replaces_main(opt):
            self.main_opt = opt  # rebuilt over the model after a main step (per epoch, GP607): its steps are the steps
        if opt is self.main_opt and self.done >= self.steps and self.stop is not None:
            self.measure_outside()
            self.close_window()
            self.stop(opt, self.user.innermost())  # raises StopScript
        self._stepping = opt
        closure = kwargs.get("closure") if "closure" in kwargs else (args[1] if len(args) > 1 and callable(args[1]) else None)
        if closure is None:
            self._guarded(self._measure, opt, args, kwargs)
            return None
        observer = self

        def observed_closure() -> Any:
            out = closure()
            observer._guarded(observer._measure, opt, args, kwargs)
            return out

        if "closure" in kwargs:
            return args, dict(kwargs, closure=observed_closure)
        return (args[0], observed_closure, *args[2:]), kwargs

    def _replaces_main(self, opt: Any) -> bool:
        """An optimizer built after a main step, over the model's parameters, that now steps in the main one's place."""
        return any(b.optimizer == id(opt) and b.call >= 1 and b.overlaps_model for b in self.built)

    def _measure(self, opt: Any, args: Any, kwargs: Any) -> None:
        if opt is self.main_opt:
            self.loader.append((self._loader_len, self._batches))
            self._batches = 0
        if opt is self.main_opt and self.model is None and opt is not None:
            self._choose_model(opt)
            self._ref = self._weights()
            self._start_owners()
        elif opt is self.main_opt:
            self._guarded(self._grow)
        if opt is self.main_opt:
            self.measure_outside()
            if self.owners is not None:
                self.owners.call += 1  # one call runs from one main step to the next
        if self.owners is not None:
            self.owners.step_seen(opt)
        super()._pre_step(opt, args, kwargs)

    def _grow(self) -> None:
        """A model the loss reached only after the first main step (a generator whose optimizer holds other
        parameters): from now on the steps are watched over it too, every model under the script's name for it."""
        from gradprobe.checks.several.report import FrozenWatch
        from gradprobe.scriptmode.several import several_model
        from gradprobe.scriptmode.step import graph_leaves

        roots = [b.root for b in self.watch.backwards if b.root is not None]
        self.watch.backwards = self.watch.backwards[-1:]
        if self.model is None:
            return
        _, _, leaves = graph_leaves(roots)
        from gradprobe.sharded import unsharded_to_sharded

        known = {id(p) for p in self.model.parameters()} | set(unsharded_to_sharded(self.model))
        # a module's parameter the model does not hold (an input made to require grad, a penalty's, is none)
        new = {i for i, t in leaves.items() if issubclass(type(t), nn.Parameter)} - known - self._unowned
        if not new:
            return
        self._unowned |= new
        several, members = several_model(self.watch, self.main_opt, roots, self.user)
        if several is None or {id(p) for p in several.parameters()} <= known:
            return
        self.model, self.names = several, {}
        self.model_note.update(model=type(several).__name__, wrapper=None, models=members.facts())
        self.frozen = FrozenWatch((m.label, type(m.module).__name__, m.no_grad_only, list(m.module.parameters()))
                                  for m in members.frozen)
        self.model_params()
        if self.owners is not None:
            self.owners.facts.names.update(self.names)

    def _start_owners(self) -> None:
        from gradprobe.scriptmode.owners import start_owners

        self.model_params()  # the model's names
        alive = [o for o in self.optimizers_seen.values()]
        self.owners = start_owners(self.model, self.names, alive, self.record, self.user)

    def __exit__(self, *exc: Any) -> None:
        if self.owners is not None:
            self.owners.__exit__()
            self.owners.facts.calls = self.done
        super().__exit__(*exc)

    def _post_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        if opt is not self._stepping:
            return
        self._stepping = None
        self._guarded(super()._post_step, opt, args, kwargs)
        if opt is self.main_opt:
            self.done += 1
            self.call = self.done
            self._guarded(self._take_ref)
            self.last_step_at = time.perf_counter()
            self._hook_seconds_in_span = self.hook_seconds  # measurements after the last watched step are outside the span

    def _take_ref(self) -> None:
        last = self.opt_steps[-1] if self.opt_steps and self.opt_steps[-1].optimizer == id(self.main_opt) else None
        known = {pid: ps.weight for pid, ps in last.params.items() if ps.weight is not None} if last else {}
        self._ref, self._ref_index = self._weights(known), len(self.opt_steps)
        if self.ema is None and self.model is not None:
            from gradprobe.checks.steps.engine import _pair_ema

            in_opt = {pid for st in self.opt_steps for g in st.groups for pid in g.params}
            in_opt |= {id(p) for o in self.optimizers_seen.values() for g in o.param_groups for p in g["params"]}
            self.ema = _pair_ema(self.model, in_opt, self.names, self.record)  # a copy is in no optimizer
        # an EMA copy that moved in the last interval: keep its weights, to measure how much of its gap it keeps next
        by_id = self.model_params()
        self._ema_saved = [(c, [by_id[pid].detach().clone() for pid in c.params if pid in by_id])
                           for c in self.ema or () if any(self.outside.get(pid, [False])[-1] for pid in c.params)]
        self._open_copies()
        if self.model is not None:
            self._open_held(by_id)

    def _kept(self) -> None:
        """|teacher - student| after the copy's update over the same before it: an EMA of decay d keeps d of its gap."""
        saved, self._ema_saved = self._ema_saved, []
        by_id = self.model_params()
        for copy, before in saved:
            kept = kept_share(copy, before, by_id)
            if kept is not None:
                copy.kept.append(kept)

    def _before_backward(self, loss: Any) -> None:
        self._guarded(super()._before_backward, loss)

    def _after_backward(self) -> None:
        self._guarded(super()._after_backward)

    def __enter__(self) -> ScriptSteps:
        super().__enter__()
        from torch.optim.lr_scheduler import LRScheduler
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        observer = self
        orig_next, orig_init = _BaseDataLoaderIter.__next__, LRScheduler.__init__

        def next_(it: Any) -> Any:
            batch = orig_next(it)
            if threading.get_ident() == observer.watch.main:
                observer._batches += 1
                try:
                    observer._loader_len = len(it)
                except TypeError:  # an IterableDataset without __len__
                    observer._loader_len = None
            return batch

        def sched_init(sched: Any, *args: Any, **kwargs: Any) -> None:
            observer.scheduler_sites.setdefault(id(sched), observer.user.innermost())
            orig_init(sched, *args, **kwargs)

        self._patch(_BaseDataLoaderIter, "__next__", next_)
        self._patch(LRScheduler, "__init__", sched_init)
        return self

    def _wrap_scaler_step(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        base = super()._wrap_scaler_step(orig)
        observer = self

        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            result = base(scaler, optimizer, *args, **kwargs)
            # a GradScaler that skipped every optimizer step: no main step will come, stop after as many as `steps`
            if observer.done == 0 and len(observer.scaler_steps) > observer.steps and observer.stop is not None:
                observer.stop(optimizer, observer.user.innermost())  # raises StopScript
            return result

        return step

    def _wrap_opt_init(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        base = super()._wrap_opt_init(orig)
        observer = self

        def init(opt: Any, *args: Any, **kwargs: Any) -> None:
            base(opt, *args, **kwargs)
            if observer.call < 0:  # the first optimizer: from now on, a module attached to the model is attached late
                observer.call = 0
            observer.optimizers_seen.setdefault(id(opt), opt)

        return init

