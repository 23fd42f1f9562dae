"""Compiled against eager (GP701): for a model wrapped by `torch.compile` (an OptimizedModule), the gradient of
every parameter from the compiled module and from the eager module it wraps, on the same batch and seed.

A compiled graph is traced once and replayed: what dynamo did not guard on is baked in (a forward hook
registered after the first compiled call, pytorch/pytorch#117758; a backward hook, #115750), and a backend
can compute a different derivative (#183602). Eager is the reference: a parameter whose compiled gradient
is missing, or differs beyond a tolerance, is named. The compiled module runs as the user built it (its own
backend); nothing is recompiled, so what it traced earlier is what is compared.

When parameters are named, `compiled_why.explain` says why where dynamo's output can, from a fresh trace with the
module's own backend: it agrees with eager (the user's graph is stale: the hook it lacks is named, at the hook's
line); or eager uses a parameter at a line that no captured graph reads (with the fresh trace's graph breaks); or
the first op the backend computes differently from the same graph run op by op in eager (compiled_ops.py).

Three stages: `measure` runs both steps (RNG and buffers restored around each) and the explanation,
`run_rules((GP701,), facts)`, and the caller ranks.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn as nn

from gradprobe.checks.core.step import backward_grads, call_model, scalar_loss
from gradprobe.checks.compiled.compiled_why import Why, explain, user_backend
from gradprobe.findings import Finding, Rule, Situation, run_rules
from gradprobe.userframes import UserCode
from gradprobe.wrappers import compiled_wrapper

RTOL = 1e-3  # relative L2 difference of a gradient beyond which compiled and eager disagree (fp32, aot_eager: ~1e-7)
# a gradient that is zero by the maths (a key's bias under softmax, a norm's bias before another norm) comes out as
# rounding noise in both runs: its difference is measured against this fraction of the largest eager gradient norm,
# not against its own noise (healthy MobileViTV2 under aot_eager: such biases of norm 1e-8..1e-5 differ by 0.2-5%,
# i.e. by 1e-10..1e-7 absolute, 1e-6 of the largest gradient norm: below 1e-5 of it a difference is noise)
FLOOR = 1e-2
_SEED = 1234


@dataclass
class GradDiff:
    name: str
    status: str  # "missing" (compiled gave none, eager did), "differs", "extra" (compiled gave one, eager none)
    eager_norm: float | None
    compiled_norm: float | None
    rel_diff: float | None


@dataclass
class CompiledFacts:
    wrapper: str
    compared: int = 0
    diffs: list[GradDiff] = field(default_factory=list)
    skipped: str | None = None
    skip_cause: str = "refused"  # whose the skip is (a gradprobe/verdict.py cause): "gradprobe" when our comparison raised
    largest: float = 0.0  # the largest relative difference of a parameter's gradient measured
    why: Why | None = None  # why they differ, where dynamo's output says (compiled_why.py); None when nothing differs
    why_failed: str | None = None

    def of(self, status: str) -> list[GradDiff]:
        return [d for d in self.diffs if d.status == status]

    def as_dict(self) -> dict[str, Any]:
        return {"wrapper": self.wrapper, "compared": self.compared, "skipped": self.skipped, "skip_cause": self.skip_cause,
                "largest_rel_diff": self.largest, "tolerance": RTOL,
                "differing": [vars(d) for d in self.diffs[:20]],
                "why": self.why.as_dict() if self.why is not None else self.why_failed}


GP701: Rule[CompiledFacts] = Rule(
    code="GP701", name="compiled-grad-differs", severity="error", rank=38,
    summary="A compiled module (torch.compile) gives a parameter a gradient that is missing or differs from eager.",
    why="A compiled graph is traced once and replayed: Python-side state it did not guard on (a hook registered after "
        "the first compiled call, a module attribute changed later) is baked in, and a backend can compute a different "
        "derivative. Training then follows gradients that the eager model, the one you read and test, would not give.",
    example="model = torch.compile(net); model(x)  # traced here\n"
            "net.encoder.register_forward_hook(lambda m, i, o: o * m.gate)  # never runs in the compiled graph",
    message="The compiled module ({wrapper}) gives {count} parameter(s) a gradient that differs from eager on the same "
            "batch and seed ({names}; largest relative difference {worst:.3g}, tolerance {tol:g}).",
    fix="Register hooks and set module state before the first compiled call (or call torch._dynamo.reset() after "
        "changing them); if the difference remains, compare backends (backend=\"aot_eager\" vs \"inductor\") and report "
        "the op to PyTorch.",
    situations={
        "missing": Situation(
            when="the compiled module gives no gradient at all to parameters that get one in eager",
            message="The compiled module ({wrapper}) gives {count} parameter(s) no gradient that eager gives one on the "
                    "same batch and seed: {names}. The compiled graph does not use them the way the eager code does.",
            fix="Something the eager forward does with these parameters was not captured when the graph was traced: a "
                "hook registered or an attribute changed after the first compiled call (register it before compiling, or "
                "call torch._dynamo.reset() after the change), or a graph break that detaches."),
        "stale-hook": Situation(
            when="a fresh trace of the same module gives eager's gradients, and it runs a hook the module has now",
            message="The compiled module ({wrapper}) gives {count} parameter(s) a gradient that is missing or differs "
                    "from eager on the same batch and seed ({names}), while a fresh trace of the same module gives "
                    "eager's gradients: its graph was traced before the {kind} `{hook}` on {module} was registered. "
                    "Dynamo does not guard on hooks, so this hook's code (this line) never runs in the compiled graph.",
            fix="Register the hook before the first call of the compiled module, or call torch._dynamo.reset() after "
                "registering it so that the next call traces the model again."),
        "stale": Situation(
            when="a fresh trace of the same module gives eager's gradients, and no hook explains it",
            message="The compiled module ({wrapper}) gives {count} parameter(s) a gradient that is missing or differs "
                    "from eager on the same batch and seed ({names}), while a fresh trace of the same module gives "
                    "eager's gradients: the graph it runs was traced before a change to the model that dynamo does not "
                    "guard on.",
            fix="Make every change to the model (hooks, attributes set behind nn.Module's back, swapped tensors) before "
                "the first call of the compiled module, or call torch._dynamo.reset() after the change."),
        "op": Situation(
            when="a fresh trace with the same backend differs too, and one op of its graphs is the first the backend "
                 "computes differently from the same graph run in eager",
            message="The compiled module ({wrapper}) gives {count} parameter(s) a gradient that is missing or differs "
                    "from eager on the same batch and seed ({names}; largest relative difference {worst:.3g}, "
                    "tolerance {tol:g}), and a fresh trace with the same backend does the same. Run op by op, graph "
                    "{graph} of {graphs} first differs from the backend's compiled version at `{op}`, this line.",
            fix="The backend computes this op differently from eager: compare it with backend=\"aot_eager\", keep the "
                "op out of the compiled region (torch.compiler.disable on a function around it), or report the op "
                "to PyTorch (or to the backend's author) with this line."),
        "unread": Situation(
            when="eager uses the parameters at a line of the user's code, and no graph dynamo captures reads them",
            message="The compiled module ({wrapper}) gives {count} parameter(s) a gradient that is missing or differs "
                    "from eager on the same batch and seed ({names}), and a fresh trace does the same: eager uses "
                    "{param} at this line, but no graph dynamo captures reads it ({graphs} graph(s), {breaks} graph "
                    "break(s)). The compiled forward takes another path here.",
            fix="Look for code that runs differently under compilation at this line: a branch on "
                "torch.compiler.is_compiling() (or torch._dynamo.is_compiling()), a value computed once when the graph "
                "was traced; make the compiled path use the parameter as eager does."),
    },
)


def _names(diffs: list[GradDiff], mark: bool = False) -> str:
    shown = ", ".join(d.name + (" (no gradient)" if mark and d.status == "missing" else "") for d in diffs[:6])
    return shown + (f" and {len(diffs) - 6} more" if len(diffs) > 6 else "")


def _explained(facts: CompiledFacts, why: Why, diffs: list[GradDiff], ev: dict[str, Any]) -> Iterator[Finding]:
    """The findings an explanation accounts for: a stale graph (all of `diffs`), or parameters no graph reads."""
    if why.fresh_agrees:
        params, names = [d.name for d in diffs], _names(diffs, mark=True)
        if why.hook is not None:
            yield GP701.finding("stale-hook", parameters=params, location=why.hook["location"], evidence=ev,
                                wrapper=facts.wrapper, count=len(diffs), names=names, kind=why.hook["kind"],
                                hook=why.hook["function"], module=why.hook["module"])
        else:
            yield GP701.finding("stale", parameters=params, evidence=ev, wrapper=facts.wrapper, count=len(diffs),
                                names=names)
        return
    unread = [d for d in diffs if d.name in why.unread]
    if unread:
        yield GP701.finding("unread", parameters=[d.name for d in unread], location=why.unread[unread[0].name],
                            evidence=ev, wrapper=facts.wrapper, count=len(unread), names=_names(unread, mark=True),
                            param=unread[0].name, graphs=why.graphs, breaks=len(why.breaks))
    if why.op is not None and why.op["location"] is not None and not unread:
        worst = max(d.rel_diff if d.rel_diff is not None else 1.0 for d in diffs)
        yield GP701.finding("op", parameters=[d.name for d in diffs], location=why.op["location"], evidence=ev,
                            wrapper=facts.wrapper, count=len(diffs), names=_names(diffs, mark=True), worst=worst,
                            tol=RTOL, graph=why.op["graph"], graphs=why.graphs, op=why.op["op"])


@GP701.detector
def detect_compiled_differs(facts: CompiledFacts) -> Iterator[Finding]:
    missing, differs = facts.of("missing"), facts.of("differs")
    ev = facts.as_dict()
    if facts.why is not None and (missing or differs):
        done = list(_explained(facts, facts.why, missing + differs, ev))
        yield from done
        named = {n for f in done for n in f["parameters"]}
        missing, differs = [d for d in missing if d.name not in named], [d for d in differs if d.name not in named]
    if missing:
        yield GP701.finding("missing", parameters=[d.name for d in missing], evidence=ev, wrapper=facts.wrapper,
                            count=len(missing), names=_names(missing))
    if differs:
        worst = max(d.rel_diff or 0.0 for d in differs)
        yield GP701.finding(parameters=[d.name for d in differs], evidence=ev, wrapper=facts.wrapper, count=len(differs),
                            names=_names(differs), worst=worst, tol=RTOL)


def _inputs_for(eager: nn.Module, batch: Any) -> Any:
    """A dict batch reduced to what the eager forward takes (the compiled wrapper's forward takes **kwargs)."""
    if not isinstance(batch, dict):
        return batch
    try:
        params = inspect.signature(eager.forward).parameters.values()
    except (TypeError, ValueError):
        return batch
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return batch
    names = {p.name for p in params}
    return {k: v for k, v in batch.items() if k in names}


def _grads(module: nn.Module, eager: nn.Module, params: list[nn.Parameter], batch: Any,
           loss_fn: Any) -> list[torch.Tensor | None]:
    """Each parameter's gradient of one forward and loss, on a fixed seed; RNG and buffers left as they were."""
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        try:
            with torch.enable_grad():
                out = call_model(module, _inputs_for(eager, batch))
                got = backward_grads(scalar_loss(loss_fn, out, batch), params)
        finally:
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)
    return [None if g is None else g.detach().float() for g in got]


def _norm(g: torch.Tensor | None) -> float | None:
    return None if g is None else float(g.norm())


def _compare(name: str, ge: torch.Tensor | None, gc: torch.Tensor | None, floor: float = 0.0) -> GradDiff | None:
    ne, nc = _norm(ge), _norm(gc)
    if ge is None and gc is None:
        return None
    if gc is None:
        return GradDiff(name, "missing", ne, None, None) if ne else None
    if ge is None:
        return GradDiff(name, "extra", None, nc, None) if nc else None
    rel = float((gc - ge).norm()) / max(ne or 0.0, floor, 1e-12)
    if (ne or 0.0) < 1e-12 and (nc or 0.0) < 1e-12:
        return None
    if not math.isfinite(rel) or rel > RTOL:
        return GradDiff(name, "missing" if (nc or 0.0) == 0.0 and (ne or 0.0) > 0 else "differs", ne, nc, rel)
    return None


def _floor(ge: list[torch.Tensor | None]) -> float:
    return FLOOR * max((float(g.norm()) for g in ge if g is not None), default=0.0)


def measure(loaded: Any) -> CompiledFacts | None:
    """None when the target has no compiled module; else the per-parameter comparison (or why it was skipped)."""
    wrapper = compiled_wrapper(getattr(loaded, "wrapper", None), loaded.model)
    if wrapper is None:
        return None
    eager = cast(nn.Module, wrapper._orig_mod)
    facts = CompiledFacts(wrapper=f"{type(wrapper).__name__} of {type(eager).__name__}")
    if loaded.batch is None or loaded.train_step is not None:
        facts.skipped = "needs a batch and the default step (a train_step is not replayed twice)"
        return facts
    named = [(n, p) for n, p in eager.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    try:
        ge = _grads(eager, eager, params, loaded.batch, loaded.loss_fn)
        gc = _grads(wrapper, eager, params, loaded.batch, loaded.loss_fn)
    except Exception as exc:  # the eager step's own failure is the trace's finding; here it only skips the comparison
        facts.skipped, facts.skip_cause = f"{type(exc).__name__}: {str(exc)[:300]}", "gradprobe"
        return facts
    facts.compared = len(named)
    floor = _floor(ge)
    rels = [float((c - e).norm()) / max(float(e.norm()), floor, 1e-12) for e, c in zip(ge, gc, strict=True)
            if e is not None and c is not None]
    facts.largest = max((r for r in rels if math.isfinite(r)), default=0.0)
    facts.diffs = [d for (n, _), e, c in zip(named, ge, gc, strict=True) if (d := _compare(n, e, c, floor)) is not None]
    if facts.of("missing") or facts.of("differs"):
        _explain(facts, loaded, wrapper, named, ge)
    return facts


def _explain(facts: CompiledFacts, loaded: Any, wrapper: nn.Module, named: list[tuple[str, nn.Parameter]],
             ge: list[torch.Tensor | None]) -> None:
    """facts.why: a fresh trace of `eager` compared with eager on the parameters named (compiled_why.py)."""
    eager = cast(nn.Module, wrapper._orig_mod)
    params = [p for _, p in named]
    at = {n: i for i, (n, _) in enumerate(named)}
    names = [d.name for d in facts.diffs if d.status in ("missing", "differs")]

    def agrees(gf: list[torch.Tensor | None]) -> bool:
        return all(_compare(n, ge[at[n]], gf[at[n]], _floor(ge)) is None for n in names)

    user = getattr(loaded, "user", None) or UserCode(None)
    try:
        facts.why = explain(eager, {n: p for n, p in named if n in names},
                            lambda m: _grads(m, eager, params, loaded.batch, loaded.loss_fn),
                            lambda: _grads(eager, eager, params, loaded.batch, loaded.loss_fn), agrees, user,
                            user_backend(wrapper))
    except Exception as exc:  # the comparison stands without its explanation
        facts.why_failed = f"not explained: {type(exc).__name__}: {str(exc)[:300]}"


def compiled_findings(loaded: Any) -> tuple[list[Finding], dict[str, Any] | None]:
    """GP701 findings and the facts; ([], None) when the target has no compiled module."""
    facts = measure(loaded)
    if facts is None:
        return [], None
    return run_rules((GP701,), facts), facts.as_dict()
