"""audit_training's engine: run the step N times under the observer, measure, run the GP6xx rules, rank.

The three stages of every engine: `measure` (the observed calls and what is measured between them:
parameters changed outside the optimizer, EMA copies and how much of their gap to the student they
kept, and what wrote them: copies.py) -> `run_rules(RULES, facts)` -> rank (by each rule's rank) and summarise.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any

import torch
import torch.nn as nn

from gradprobe.checks.core.step import param_names, run_step
from gradprobe.checks.steps.accumulation import LossFactors, accumulation_lines, factors_of_step
from gradprobe.checks.steps.amp import AMP_RULES, ScalerWatch
from gradprobe.checks.steps.copies import AfterStep, UpdateWatch, kept_share, twins, versions
from gradprobe.modelset import ModelSet
from gradprobe.checks.steps.facts import AuditFacts, EmaCopy, FullBatch, derive
from gradprobe.checks.steps.fullbatch import FULL_BATCH_RULES, full_batch_facts, full_batch_line
from gradprobe.checks.steps.fullbatch import measure as measure_full_batch
from gradprobe.checks.steps.gradients import GRADIENT_RULES
from gradprobe.checks.steps.modes import MODE_RULES
from gradprobe.checks.steps.observe import StepObserver, norms
from gradprobe.checks.steps.overfit import OVERFIT_RULES, overfit_one_batch, overfit_summary
from gradprobe.checks.steps.ratio import RATIO_RULES
from gradprobe.checks.steps.schedule import SCHEDULE_RULES
from gradprobe.checks.steps.gradients import GP602
from gradprobe.checks.steps.optimizer_owners import GP212, GP213, OwnersWatch
from gradprobe.checks.steps.summary import facts_table, summary_lines
from gradprobe.checks.steps.updates import GP606, UPDATE_RULES
from gradprobe.findings import Finding, run_rules
from gradprobe.outcomes import resource_limit_finding
from gradprobe.report import make_report
from gradprobe.verdict import Cause, add_not_run, settle

RULES = GRADIENT_RULES + UPDATE_RULES + RATIO_RULES + MODE_RULES + FULL_BATCH_RULES + SCHEDULE_RULES
_RANK = {r.code: r.rank for r in RULES + AMP_RULES + OVERFIT_RULES}
MAX_STEPS = 32


def _schedulers_of(optimizer: Any) -> list[Any]:
    """The LR schedulers built on this optimizer (make_optimizer may return one beside it; the default step steps it)."""
    from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

    return [o for o in gc.get_objects() if issubclass(type(o), LRScheduler) and not issubclass(type(o), ReduceLROnPlateau)
            and getattr(o, "optimizer", None) is optimizer]


def _schedule_site(sched: Any, user: Any) -> dict | None:
    """The user's line that defines a scheduler's schedule (LambdaLR/MultiplicativeLR's lambda), when it is theirs."""
    for fn in getattr(sched, "lr_lambdas", None) or ():
        code = getattr(fn, "__code__", None)
        if code is not None and user.is_user_file(code.co_filename):
            return user.location_of(code.co_filename, code.co_firstlineno, code.co_name)
    return None


def _weights(params: dict[int, torch.Tensor]) -> dict[int, float]:
    ids = list(params)
    return dict(zip(ids, norms([params[i] for i in ids]), strict=True))


def _pair_ema(model: nn.Module, in_opt: set[int], names: dict[int, str], record: Any) -> list[EmaCopy]:
    """Parameters in no optimizer group whose relative name and shape match exactly one trainable one."""
    by_id = {id(p): p for p in model.parameters()}
    opt = {names[i]: by_id[i] for i in in_opt if i in by_id and i in names}
    groups: dict[tuple[str, str], EmaCopy] = {}
    for pid, name in names.items():
        if pid in in_opt or pid not in by_id:
            continue
        parts = name.split(".")
        for k in range(1, len(parts)):
            suffix = ".".join(parts[k:])
            hits = [o for o, p in opt.items() if (o == suffix or o.endswith("." + suffix)) and p.shape == by_id[pid].shape]
            if len(hits) == 1:
                teacher, student = ".".join(parts[:k]), hits[0][: -len(suffix)].rstrip(".")
                if teacher == student:
                    break
                copy = groups.setdefault((teacher, student), EmaCopy(prefix=teacher, student=student, params=[],
                                                                     students=[]))
                copy.params.append(pid)
                copy.students.append(id(opt[hits[0]]))
                break
    for copy in groups.values():
        parent, _, attr = copy.prefix.rpartition(".")
        try:
            copy.site = record.site_of(model.get_submodule(parent), attr)
        except AttributeError:
            copy.site = None
    return [c for c in groups.values() if len(c.params) >= 1]


class _Run:
    """The N observed calls, and what is measured between them."""

    def __init__(self, loaded: Any, steps: int):
        self.loaded, self.steps = loaded, steps
        self.model: nn.Module = loaded.model
        self.observer = StepObserver(self.model, loaded.user, loaded.optimizer)
        self.owners = OwnersWatch(self.model, loaded.optimizer, loaded.record, loaded.user, loaded.train_step is not None)
        self.names: dict[int, str] = {}
        self.requires_grad: dict[int, bool] = {}
        self.outside: dict[int, list[bool]] = {}
        self.ema: list[EmaCopy] = []
        self.writes: list[dict[int, int]] = []  # per call: in-place writes per parameter (version counters)
        self.combined: list[set[tuple[int, int]]] = []  # per call: pairs of parameters an op combined
        self.trained: list[EmaCopy] = []
        self.after_step = AfterStep(self.model, {})
        self.error: str | None = None
        self.error_call = -1
        self.ran = 0
        self.error_location: dict | None = None
        self.limit: dict[str, Any] | None = None
        self.schedulers = _schedulers_of(loaded.optimizer) if loaded.train_step is None and loaded.optimizer else []
        self.last_weights: dict[int, float] = {}  # each parameter's weight norm after the last call
        self.full_batch: FullBatch | None = None
        self.full_batch_left_out: str | None = None
        self.observer.keep_accumulating = loaded.train_step is not None

    def _params(self) -> dict[int, torch.Tensor]:
        out: dict[int, torch.Tensor] = {}
        params = list(self.model.parameters())
        if any(id(p) not in self.names for p in params):  # names once, again only when a parameter appears
            for pid, ns in param_names(self.model).items():
                self.names.setdefault(pid, ns[0])
        for p in params:
            out[id(p)] = p
            self.requires_grad[id(p)] = p.requires_grad
        return out

    def _ema_copies(self, moved_last: set[int]) -> list[tuple[EmaCopy, list[torch.Tensor]]]:
        by_id = {id(p): p for p in self.model.parameters()}
        out = []
        for copy in self.ema:
            if any(pid in moved_last for pid in copy.params):  # copy only what moves: a fixed twin costs nothing
                out.append((copy, [by_id[pid].detach().clone() for pid in copy.params if pid in by_id]))
        return out

    def _kept(self, copy: EmaCopy, before: list[torch.Tensor]) -> None:
        kept = kept_share(copy, before, {id(p): p for p in self.model.parameters()})
        if kept is not None:
            copy.kept.append(kept)

    def _call(self, k: int, moved_last: set[int]) -> set[int]:
        params = self._params()
        self.ran = k + 1
        # the weights as the previous call left them (nothing runs between two calls but gradprobe's reads): only a
        # parameter that appeared since is measured again
        before = {pid: w for pid, w in self.last_weights.items() if pid in params}
        before.update(_weights({pid: p for pid, p in params.items() if pid not in before}))
        copies = self._ema_copies(moved_last)
        n_steps = len(self.observer.opt_steps)
        self.observer.call = self.owners.call = k
        # the update watch intercepts every torch call of the step: after the first call, only while an EMA copy was
        # paired (its pairs are all it is read for, _measured_updates)
        watch = UpdateWatch(params.values()) if k == 0 or self.ema else None
        v0 = versions(params.values())
        with self.after_step, watch if watch is not None else contextlib.nullcontext():
            result = run_step(self.loaded, optimizer_step=True)
            self.observer.close_window()  # the grad-write window a step leaves open (a skipped step): inside the watch
        v1 = versions(params.values())
        self.writes.append({pid: v1[pid] - v for pid, v in v0.items()})
        self.combined.append(watch.combined if watch is not None else set())
        kept = self.after_step.kept()
        for copy in self.trained:
            copy.kept += [kept[pid] for pid in copy.params if pid in kept]
        self.observer.close_window()
        if self.observer.pre_step is not None:
            self._full_batch()
        if not result.failed:
            for sched in self.schedulers:
                sched.step()
        self.observer.call = -1
        after = self.last_weights = _weights({pid: p for pid, p in self._params().items() if pid in before})
        last_weight = {pid: ps.weight for s in self.observer.opt_steps[n_steps:] for pid, ps in s.params.items()
                       if ps.weight is not None}
        moved = set()
        for pid, w in after.items():
            ref = last_weight.get(pid, before.get(pid))
            changed = ref is not None and w != ref
            self.outside.setdefault(pid, []).append(changed)
            if changed:
                moved.add(pid)
        for copy, saved in copies:
            self._kept(copy, saved)
        for copy in self.ema:
            copy.moved.append(any(pid in moved for pid in copy.params))
        if result.failed:
            self.error = (result.error_traceback or result.loss_problem or "the step failed")[-2000:]
            self.error_call, self.limit = k, result.resource_limit
            self.error_location = result.error_location
        return moved

    def _full_batch(self) -> None:
        """After the call: the same batch as one batch, from the weights before the first accumulated step (fullbatch.py);
        gradprobe's own measurement, so a failure is a left-out note, never the user's error."""
        assert self.observer.pre_step is not None
        step, moving, copies = self.observer.pre_step
        self.observer.pre_step = None
        scales = [s.scale for s in self.observer.scaler_steps if s.call == step.call and s.scale]
        grad_calls = len(self.observer.grad_calls)
        try:
            self.full_batch, self.full_batch_left_out = measure_full_batch(
                self.loaded, self.observer.opt_steps, step, moving, copies, scales[-1] if scales else 1.0)
        except Exception as exc:  # ours, never the user's
            self.full_batch_left_out = f"the full-batch gradient could not be computed ({type(exc).__name__}: {exc})"[:300]
        del self.observer.grad_calls[grad_calls:], copies  # our autograd.grad call is not the user's

    def run(self) -> None:
        moved: set[int] = set()
        with self.observer, self.owners:
            for k in range(self.steps):
                moved = self._call(k, moved)
                if k == 0:
                    in_opt = {pid for s in self.observer.opt_steps for g in s.groups for pid in g.params}
                    self.ema = _pair_ema(self.model, in_opt, self.names, self.loaded.record)
                    for copy in self.ema:
                        copy.moved.append(any(pid in moved for pid in copy.params))
                    self._pair_trained(in_opt, moved)
                if self.error:
                    break

    def _pair_trained(self, in_opt: set[int], moved: set[int]) -> None:
        """Parameters in the optimizer also changed outside it, each with the one twin (relative path and shape) in the
        optimizer: the next calls measure whether the outside write moves them toward it by a constant share."""
        pairs = twins(self.model, self.names, moved & in_opt, in_opt - moved)
        self.after_step = AfterStep(self.model, pairs)
        groups: dict[tuple[str, str], EmaCopy] = {}
        for pid, sid in pairs.items():
            name, twin = self.names[pid].split("."), self.names[sid].split(".")
            n = 0
            while n < min(len(name), len(twin)) - 1 and name[-1 - n] == twin[-1 - n]:
                n += 1
            prefix, student = ".".join(name[: len(name) - n]), ".".join(twin[: len(twin) - n])
            copy = groups.setdefault((prefix, student), EmaCopy(prefix=prefix, student=student, params=[], students=[]))
            copy.params.append(pid)
            copy.students.append(sid)
        self.trained = list(groups.values())

    def _measured_updates(self) -> None:
        for copy in self.ema:
            copy.writes = [sum(w.get(pid, 0) for pid in copy.params) for w in self.writes]
            copy.computed = [sum((pid, sid) in c for pid, sid in zip(copy.params, copy.students, strict=True))
                             for c in self.combined]

    def facts(self) -> AuditFacts:
        self._measured_updates()
        obs, opt = self.observer, self.loaded.optimizer
        for call in obs.grad_calls:
            call.used_in_backward = any(getattr(t, "grad", None) is not None for t in call.probes)
            call.probes = []
        site = self.loaded.record.optimizer_sites.get(id(opt)) if opt is not None else None
        scheduled = {e.optimizer for e in obs.events if e.kind == "scheduler_step" and e.optimizer is not None}
        scheduled |= {id(s.optimizer) for s in self.schedulers}
        sites = {id(s.optimizer): _schedule_site(s, self.loaded.user) for s in [*self.schedulers, *obs.schedulers.values()]}
        facts = AuditFacts(calls=self.ran, mode="train_step" if self.loaded.train_step is not None else "default",
                           names=self.names, requires_grad=self.requires_grad, opt_steps=obs.opt_steps, events=obs.events,
                           grad_calls=obs.grad_calls, built=obs.built, attached=obs.attached,
                           initial_optimizer=id(opt) if opt is not None else None, optimizer_site=site[1] if site else None,
                           scheduled=scheduled, schedule_sites={k: v for k, v in sites.items() if v},
                           outside_moves=self.outside, ema=self.ema, trained_copies=self.trained, step_error=self.error,
                           scaler_steps=obs.scaler_steps, mode_calls=obs.mode_calls, full_batch=self.full_batch,
                           full_batch_left_out=self.full_batch_left_out,
                           members=getattr(self.loaded.model, "labels", []) if isinstance(self.loaded.model, ModelSet) else [])
        derive(facts)
        return facts


def _no_optimizer_report() -> dict:
    return make_report("audit_training", [], ["audit_training needs an optimizer: give `optimizer` (make_optimizer(model)) "
                                              "or a `train_step` that steps one."], note="no optimizer",
                       not_run=[{"check": "the audit of the training steps", "cause": "not_applicable",
                                 "why": "the target has no optimizer and no train_step"}])


def with_owners(watch: OwnersWatch, findings: list[Finding]) -> list[Finding]:
    """Several optimizers: GP212/GP213 first; GP602 only where an optimizer's step() was measured using an earlier
    step's gradient and no GP212 explains it; no GP606 for the parameters of an optimizer never stepped (GP213)."""
    owners = watch.findings()
    accumulated = watch.measured_accumulation()
    explained = accumulated is False or any(f["code"] == GP212.code for f in owners)
    never = {n for f in owners if f["code"] == GP213.code for n in f["parameters"]}
    return owners + [f for f in findings if not (explained and f["code"] == GP602.code)
                     and not (f["code"] == GP606.code and never and set(f["parameters"]) <= never)]


def facts_report(facts: AuditFacts, extra: list[Finding] | None = None, owners: OwnersWatch | None = None,
                 measured: list[str] | None = None) -> dict:
    """The GP6xx rules on measured facts (observed in a train_step's calls, or in a script's own loop), ranked, reported
    (with `owners`, the several optimizers' GP212/GP213 as in with_owners; `measured`: more all-clear lines)."""
    findings: list[Finding] = sorted(run_rules(RULES, facts), key=lambda f: _RANK.get(f["code"], 99)) + list(extra or ())
    if owners is not None:
        findings = with_owners(owners, findings)
    return make_report("audit_training", findings, summary_lines(facts, findings, measured),
                       **facts_table(facts, findings, measured))


def audit_report(loaded: Any, steps: int = 4, overfit_steps: int = 0) -> dict:
    """audit_training: run the user's step `steps` times, observed; GP6xx findings and a measured all-clear; then,
    when `overfit_steps` > 0, that many more steps on the same batch to see the loss go down (overfit.py)."""
    return audit_run(loaded, steps, overfit_steps)[0]


def audit_run(loaded: Any, steps: int = 4, overfit_steps: int = 0) -> tuple[dict, AuditFacts | None]:
    """audit_report, and the measured facts it was made from (None when nothing could be audited)."""
    steps = max(1, min(int(steps), MAX_STEPS))
    if loaded.train_step is None and loaded.optimizer is None:
        return _no_optimizer_report(), None
    run = _Run(loaded, steps)
    torch.set_grad_enabled(True)
    with ScalerWatch(loaded.user, run.observer) as amp, LossFactors() as factors:
        run.run()
    facts = run.facts()
    if facts.full_batch is not None:
        facts.full_batch.factors = factors_of_step(factors.factors, facts, facts.full_batch.step_index)
    findings: list[Finding] = run_rules(RULES, facts) + run_rules(AMP_RULES, amp.amp_facts(facts.scaler_steps))
    extra: dict[str, Any] = {}
    if overfit_steps > 0 and not run.error:
        ofacts = overfit_one_batch(loaded, overfit_steps)
        findings += run_rules(OVERFIT_RULES, ofacts)
        line, extra["overfit_one_batch"] = overfit_summary(ofacts)
    findings.sort(key=lambda f: _RANK.get(f["code"], 99))
    findings = with_owners(run.owners, findings)
    if run.limit is not None:  # a memory limit stopped the step: a resource limit, not the code
        findings.append(resource_limit_finding(f"running step {run.error_call + 1}", run.limit,
                                               location=run.error_location))
    measured = accumulation_lines(factors.factors, facts) + full_batch_line(facts.full_batch)
    lines = summary_lines(facts, findings, measured) + ([line] if extra else [])
    fb = full_batch_facts(facts.full_batch, facts.full_batch_left_out)
    if facts.full_batch_left_out:
        left = facts.full_batch_left_out
        cause: Cause = ("not_applicable" if left.startswith("the default step") else
                        "gradprobe" if left.startswith("the full-batch gradient could not") else "refused")
        add_not_run(extra, "the comparison of the accumulated gradient with one full batch", left, cause)
    report = make_report("audit_training", findings, lines, **facts_table(facts, findings, measured), **extra,
                         **({"full_batch": fb} if fb else {}))
    if run.error and run.limit is None:
        last = run.error.strip().splitlines()[-1]
        report["facts"]["step_error_location"] = run.error_location
        span = f"step {steps}" if run.error_call + 1 >= steps else f"steps {run.error_call + 1} to {steps}"
        add_not_run(report["facts"], f"the audit of {span}", f"step {run.error_call + 1} of {steps} raised ({last})"
                    + ("; the steps before it were audited" if run.error_call else "; nothing was audited"), "user_code",
                    run.error_location)
        if overfit_steps > 0:
            add_not_run(report["facts"], "overfit one batch", "a watched step raised first", "user_code")
        report = settle(report)
    return report, facts
