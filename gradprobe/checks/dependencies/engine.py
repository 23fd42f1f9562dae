"""check_dependencies' engine: read the claims, sample, measure the Jacobian's structure, explain the leaks, report.

measure (harness.py, claims.py, segments.py, jacobian.py; explain.py once a leak is found) -> DepFacts ->
`run_rules(RULES, facts)` -> report, with `facts.verified` (what was measured, with its numbers) and `facts.not_run`
(what was not, and why). Packed rows are also compared with the same examples padded (checks/dependencies/packed_vs_padded.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from gradprobe.checks.dependencies.claims import Layout, NextClaim, layout, loss_grad, next_element
from gradprobe.checks.dependencies.explain import Context, explain, outside_training
from gradprobe.checks.dependencies.harness import probed, untouched
from gradprobe.checks.dependencies.jacobian import (
    Leak,
    Sample,
    alone,
    choose,
    dependency_maps,
    judge,
    pair_leaks,
    plan,
)
from gradprobe.checks.dependencies.rules import RULES, DepFacts, LeakFact
from gradprobe.checks.dependencies.segments import Segments, find_padding, find_segments
from gradprobe.checks.core.watches import patched
from gradprobe.findings import Finding, run_rules
from gradprobe.report import make_report

CHECKS = ("causality", "examples", "packed", "packed_outside", "packed_vs_padded")
DEFAULT_POSITIONS = 5
DEFAULT_PASSES = 3  # backward passes of a default check: the samples that do not fit are left out (cost <= 1.5x a step)
PACKED_PASSES = 2  # packed rows: the first tokens of the packed examples share one pass, and test causality there too
MAX_POSITIONS = 32
SNAPSHOT_LIMIT = 50_000_000  # parameters kept aside while a train_step runs up to its model call (a bigger model: none)


@dataclass
class Run:
    """One measurement of the structure (in the mode the training runs, or with BatchNorm in eval mode)."""

    lay: Layout
    claim: NextClaim | None
    why_no_claim: str
    seg: Segments | None
    samples: list[Sample]
    leaks: list[Leak]
    passes: int
    keep: torch.Tensor | None = None
    pairs: int = 0  # entries (i, j) of an output pairing the examples, measured to read examples i and j only


@dataclass
class Outcome:
    findings: list[Finding] = field(default_factory=list)
    verified: list[str] = field(default_factory=list)
    not_run: list[dict[str, str]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    packing: dict[str, Any] | None = None  # packed vs padded's own result (checks/dependencies/packed_vs_padded.py), when it ran

    def skip(self, check: str, why: str, cause: str = "not_applicable") -> None:
        self.not_run.append({"check": check, "why": why[:400], "cause": cause})


class _Captured(BaseException):
    """Raised by the pre-hook at the model's first call inside the user's train_step (a BaseException: the user's
    `except Exception` does not swallow it)."""


def _loss_in_output(out: Any, batch: Any) -> torch.Tensor | None:
    """The loss a model returns itself (HF `.loss`, nanoGPT's `(logits, loss)`): its 0-d output that requires grad."""
    from gradprobe.checks.core.step import default_loss, floating_outputs

    found = [o for o in floating_outputs(out) if o.dim() == 0 and o.requires_grad]
    return found[0] if found else default_loss(out)


def captured_call(loaded: Any) -> tuple[str, nn.Module, Any] | None:
    """The model's own call inside the user's train_step, as (module name, module, (args, kwargs)): the train_step runs
    up to its first grad-enabled call of the model, or of a module inside it that holds trainable parameters (a step
    that calls `model.policy(x)`: the outermost module called, "" for the model itself), and is stopped there, or at
    its first backward (then no backward ran, no optimizer step); None when it made no such call."""
    got: list[Any] = []

    def hook_for(name: str) -> Callable[..., None]:
        def hook(m: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
            if torch.is_grad_enabled() and (m is loaded.model or any(p.requires_grad for p in m.parameters())):
                got.append((name, m, (tuple(args), dict(kwargs))))
                raise _Captured()
        return hook

    def no_backward(*args: Any, **kwargs: Any) -> None:
        raise _Captured()

    handles = [m.register_forward_pre_hook(hook_for(name), with_kwargs=True) for name, m in loaded.model.named_modules()]
    params = list(loaded.model.parameters())
    versions = [p._version for p in params]
    small = sum(p.numel() for p in params) <= SNAPSHOT_LIMIT
    saved = [p.detach().clone() for p in params] if small else []
    try:
        with untouched(loaded.model), torch.enable_grad(), patched(torch.Tensor, "backward", no_backward), \
                patched(torch.autograd, "backward", no_backward):
            loaded.train_step(loaded.model, loaded.batch, loaded.optimizer)
    except _Captured:
        pass
    except Exception:
        return None
    finally:
        for handle in handles:
            handle.remove()
        with torch.no_grad():  # what the train_step wrote into the weights before its model call, put back
            for i, p in enumerate(params):
                if p._version != versions[i] and saved:
                    p.copy_(saved[i])
    return got[0] if got else None


def _measure(loaded: Any, checks: tuple[str, ...], n: int | None, seed: int) -> Run | str:
    with untouched(loaded.model):
        return _measure_untouched(loaded, checks, n, seed)


def _measure_untouched(loaded: Any, checks: tuple[str, ...], n: int | None, seed: int) -> Run | str:
    probe = probed(loaded.model, loaded.batch, loaded.loss_fn, loaded.user)
    lay = layout(probe)
    if lay is None:
        return "the model's outputs are laid out neither per position nor per example of its inputs"
    claim, why = next_element(probe, lay, loaded.batch, loss_grad(probe, lay))
    keep = find_padding(loaded.batch, lay.B, lay.T)[0] if lay.positions else None
    tokens = claim.ids if claim is not None else next((lf.ids for lf in lay.token_leaves if lf.ids is not None), None)
    seg = find_segments(loaded.batch, lay.B, lay.T, tokens) if lay.positions else None
    samples = choose(lay, claim if "causality" in checks else None, seg if "packed" in checks else None, keep,
                     n or DEFAULT_POSITIONS, seed)
    groups = plan(samples, lay.B, seg, None if n is not None else PACKED_PASSES if seg is not None else DEFAULT_PASSES)
    samples = [samples[i] for g in groups for i in g]  # those that fit the passes, in pass order
    groups = _renumber(groups)
    if not samples:
        return Run(lay, claim, why, seg, [], [], 0, keep)
    cl = claim_leaf(lay, claim)
    leaks = judge(lay, samples, dependency_maps(lay, samples, lay.token_leaves, groups, seed), seg, groups, cl)
    if any(len(g) > 1 for g in groups) and leaks:
        leaks = alone(lay, samples, lay.token_leaves, seg, leaks, seed, cl)
    leaks, pairs = pair_leaks(lay, leaks, lay.token_leaves, seed)
    wanted = {"future": "causality", "example": "examples", "packed": "packed"}
    return Run(lay, claim, why, seg, samples, [lk for lk in leaks if wanted[lk.kind] in checks], len(groups), keep,
               pairs)


def claim_leaf(lay: Layout, claim: NextClaim | None) -> int | None:
    """The index of the leaf the next-element claim is about, among the layout's token leaves."""
    if claim is None or claim.leaf is None:
        return None
    return next((i for i, lf in enumerate(lay.token_leaves) if lf is claim.leaf), None)


def _renumber(groups: list[list[int]]) -> list[list[int]]:
    out, k = [], 0
    for g in groups:
        out.append(list(range(k, k + len(g))))
        k += len(g)
    return out


def _plain_call_works(loaded: Any) -> bool:
    """Whether the model runs on the batch without the probe (then a probe that failed is gradprobe's failure)."""
    from gradprobe.checks.core.step import call_model

    try:
        with untouched(loaded.model), torch.no_grad():
            call_model(loaded.model, loaded.batch)
    except Exception:
        return False
    return True


def batchnorm_in_train(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training]


@contextlib.contextmanager
def _batchnorm_eval(model: nn.Module, names: list[str]) -> Iterator[None]:
    mods = [model.get_submodule(n) for n in names]
    for m in mods:
        m.eval()
    try:
        yield
    finally:
        for m in mods:
            m.train()


def _leak_fact(lk: Leak, seg: Segments | None) -> LeakFact:
    segment_of: dict[int, int] = {}
    if seg is not None and lk.kind == "packed":
        for k, (s, e) in enumerate(seg.spans[lk.b]):
            for t in range(s, e):
                segment_of[t] = k
    return LeakFact(lk.kind, lk.b, lk.t, lk.seen, lk.ratio, segment_of=segment_of)


def _call_line(loaded: Any) -> dict | None:
    step = (loaded.info or {}).get("script_step") or {}
    loc = step.get("call_location")
    return loc if isinstance(loc, dict) else None


def _explained(loaded: Any, run: Run, facts: DepFacts) -> None:
    """Explain the first leak of each kind (explain.py)."""
    ctx = Context(loaded.model, loaded.batch, loaded.loss_fn, loaded.user, loaded.record, run.seg,
                  run.claim.ids if run.claim is not None else None)
    by_sample = {(s.b, s.t): s for s in run.samples}
    done: set[str] = set()
    for lk in run.leaks:
        fact = _leak_fact(lk, run.seg)
        if lk.kind not in done:
            done.add(lk.kind)
            fact.explained = explain(ctx, lk, by_sample[(lk.b, lk.t)], _call_line(loaded))
        facts.leaks.append(fact)


def _verified(run: Run, facts: DepFacts, out: Outcome, checks: tuple[str, ...]) -> None:
    kinds = {lk.kind for lk in run.leaks}
    causal = [s for s in run.samples if s.causal]
    if "causality" in checks:
        if run.claim is None:
            out.skip("causality", run.why_no_claim)
        elif "future" not in kinds and causal:
            ts = ", ".join(str(s.t) for s in sorted(causal, key=lambda s: s.t))
            rows = len({s.b for s in causal})
            out.verified.append(f"causality: at {len(causal)} sampled output positions (t = {ts}) of {rows} row(s), output "
                                f"t depends on no input after t ({run.claim.how}: {run.claim.matched}/{run.claim.read} "
                                "targets are the next input)")
    if "examples" in checks:
        if run.lay.B < 2:
            out.skip("examples", "one example per batch (a packed row is checked as packed examples)")
        elif "example" not in kinds:
            n = len(run.samples)
            how = " (through BatchNorm in train mode, by design: GP904)" if facts.batchnorm_leaks else ""
            if run.pairs:  # a (B, B) output: its rows read every example by design, each entry its own two
                out.verified.append(f"example independence: the output pairs the examples ({run.lay.B} x {run.lay.B}, a "
                                    f"similarity matrix); {run.pairs} sampled entries (i, j) depend on examples i and j "
                                    f"only{how}")
            else:
                out.verified.append(f"example independence: {n} sampled output(s) depend on their own example only{how} "
                                    f"(batch of {run.lay.B})")
    if "packed" in checks:
        packed = [s for s in run.samples if s.packed]
        if run.seg is None:
            out.skip("packed", "no packed rows in the batch (no position ids restarting, cumulative sequence lengths, "
                                    "segment ids or block-diagonal mask)")
        elif "packed" not in kinds and packed:
            out.verified.append(f"packed rows: {len(packed)} sampled token(s) of {run.seg.count()} packed examples depend "
                                f"on their own example only ({run.seg.describe()})")


def _run_info(run: Run) -> dict[str, Any]:
    return {"batch_size": run.lay.B, "positions": run.lay.T if run.lay.positions else None,
            "output_shape": list(run.lay.output.shape), "inputs": [lf.source for lf in run.lay.token_leaves][:8],
            "sampled": [{"row": s.b, "position": s.t, "causal": s.causal, "packed": s.packed} for s in run.samples],
            "backward_passes": run.passes,
            "next_element_claim": ({"how": run.claim.how, "targets_next_input": run.claim.matched,
                                    "targets_read": run.claim.read} if run.claim else None),
            "packed": ({"how": run.seg.how, "entry": run.seg.where, "examples": run.seg.count(),
                        "rows": len(run.seg.packed_rows)} if run.seg else None)}


def _batchnorm(loaded: Any, run: Run, facts: DepFacts, checks: tuple[str, ...], n: int | None, seed: int) -> Run:
    """Leaks in train mode measured again with BatchNorm in eval mode: those that vanish are BatchNorm's, by design."""
    names = batchnorm_in_train(loaded.model)
    if not names or not run.leaks:
        return run
    with _batchnorm_eval(loaded.model, names):
        again = _measure(loaded, checks, n, seed)
    if isinstance(again, str):
        return run
    gone = {lk.kind for lk in run.leaks} - {lk.kind for lk in again.leaks}
    if gone:
        facts.batchnorm = names
        facts.batchnorm_leaks = [_leak_fact(lk, run.seg) for lk in run.leaks if lk.kind in gone]
        run.leaks = [lk for lk in run.leaks if lk.kind not in gone]
    return run


def measure(loaded: Any, checks: tuple[str, ...] = CHECKS, positions: int | None = None,
            seed: int = 0, uncaptured: tuple[str, str] = ("gradprobe", "")) -> Outcome:
    """Every dependency claim of the target's model on its batch, measured (see the module's docstring). `positions`:
    that many sampled outputs, however many backward passes they take (None: 5, in at most 3 passes). `uncaptured`:
    the cause and the rest of the reason when a train_step's model call cannot be captured (check_dependencies was
    asked for this check: gradprobe's limitation; diagnose reads no claim there: not applicable)."""
    out = Outcome()
    n = None if positions is None else max(1, min(int(positions), MAX_POSITIONS))
    if loaded.batch is None:
        for check in checks:
            out.skip(check, "the target has no batch to call the model with (a train_step without inputs)")
        return out
    t0 = time.perf_counter()
    script = bool((loaded.info or {}).get("script_step"))
    if loaded.train_step is not None:  # the train_step decides how the model is called: its own call is probed
        captured = captured_call(loaded)
        if captured is None:  # no claim can be read: diagnose (which runs the check where a claim is) passes `uncaptured`
            for check in checks:
                out.skip(check, "the target's train_step made no model call that could be captured before its backward"
                         + uncaptured[1], uncaptured[0])
            return out
        name, module, call = captured
        loaded = dataclasses.replace(loaded, model=module, batch=call, loss_fn=_loss_in_output, train_step=None)
        if name:  # the step calls a part of the model: that part is what is measured, and the lines say so
            measured = measure(loaded, checks, positions, seed)
            measured.verified = [f"{line} (at the train_step's call of `{name}`)" for line in measured.verified]
            measured.facts["probed_module"] = name
            return measured
    try:
        run = _measure(loaded, checks, n, seed)
    except Exception as exc:
        cause = "gradprobe" if script or _plain_call_works(loaded) else "user_code"
        for check in checks:
            out.skip(check, f"calling the model on the batch for the probe failed ({type(exc).__name__}: {exc})", cause)
        return out
    if isinstance(run, str):
        for check in checks:
            out.skip(check, run)
        return out
    facts = DepFacts(claim=run.claim.how if run.claim else "", segments=run.seg.describe() if run.seg else "",
                     batch_size=run.lay.B)
    run = _batchnorm(loaded, run, facts, checks, n, seed)
    probe_s = time.perf_counter() - t0
    _explained(loaded, run, facts)
    if run.seg is not None and "packed_outside" in checks and not any(lk.kind == "packed" for lk in run.leaks):
        ctx = Context(loaded.model, loaded.batch, loaded.loss_fn, loaded.user, loaded.record, run.seg)
        found = outside_training(ctx, run.samples)
        if found is not None:
            facts.outside = _leak_fact(found, run.seg)
            facts.outside_how = "with use_cache=True (the default of the model's configuration outside a Trainer)"
    out.findings = run_rules(RULES, facts)
    _verified(run, facts, out, checks)
    out.facts = {**_run_info(run), "seconds": {"probe": round(probe_s, 4), "total": round(time.perf_counter() - t0, 4)}}
    if "packed_vs_padded" in checks:
        _packed_vs_padded(loaded, run, out)
    return out


def _packed_vs_padded(loaded: Any, run: Run, out: Outcome) -> None:
    """GP803 from checks/dependencies/packed_vs_padded.py; when a packed leak was measured, it is the same cause (its line)."""
    from gradprobe.checks.dependencies import packed_vs_padded as packing

    if run.seg is None:  # measured above: the comparison's own search would call the model again to find none
        out.facts["packed_vs_padded"] = {}
        out.skip("packed_vs_padded", packing.NO_PACKED_ROWS)
        return
    causal = run.claim is not None and any(s.causal for s in run.samples) and not any(lk.kind == "future" for lk in run.leaks)
    result = packing.run(loaded, {"segments": run.seg, "tokens": run.claim.ids if run.claim else None, "causal": causal})
    out.packing = result
    out.facts["packed_vs_padded"] = result.get("facts", {})
    if not result.get("applies"):
        out.skip("packed_vs_padded", result.get("why_not") or "no packed rows", "not_applicable")
        return
    leak = next((f for f in out.findings if f["code"] == "GP903" and f["severity"] == "error"), None)
    for f in result.get("findings", []):
        if leak is not None and f.get("location") is None:
            f["location"] = leak["location"]
        out.findings.append(f)
    out.verified += result.get("verified", [])
    out.not_run += result.get("not_run", [])


def dependency_findings(loaded: Any) -> tuple[list[Finding], dict[str, Any]]:
    """For diagnose: every dependency claim the target's model makes, measured; facts say whether a claim was found (the
    check then ran), what was verified or not run, and what it cost."""
    t0 = time.perf_counter()
    out = measure(loaded, uncaptured=("not_applicable", ": no claim to read (check_dependencies says what it can measure "
                                                         "of this target)"))
    facts: dict[str, Any] = {"ran": bool(out.verified or out.findings), "seconds": round(time.perf_counter() - t0, 4),
                             "verified": out.verified, "not_run": out.not_run}
    facts.update({k: out.facts[k] for k in ("sampled", "next_element_claim", "packed", "batch_size", "backward_passes",
                                            "packed_vs_padded") if k in out.facts})
    return out.findings, facts


def _summary(out: Outcome) -> list[str]:
    lines = []
    if out.not_run:
        lines.append("Not measured: " + "; ".join(f"{n['check']} ({n['why']})" for n in out.not_run))
    if not any(f["severity"] in ("error", "warning") for f in out.findings):
        lines += ["Verified: " + v for v in out.verified]
    return lines


def dependencies_report(loaded: Any, positions: int | None = None, checks: list[str] | None = None,
                        seed: int = 0) -> dict[str, Any]:
    """check_dependencies: what each output may not see (causality, other examples, other packed examples), measured by
    autograd on sampled outputs; the packed batch against the same examples padded."""
    chosen = tuple(c for c in CHECKS if checks is None or c in checks)
    out = measure(loaded, chosen, positions, seed)
    return make_report("check_dependencies", out.findings, _summary(out), **out.facts, verified=out.verified,
                       not_run=out.not_run)


def check_dependencies(model: nn.Module, batch: Any, loss_fn: Any = None, project_dir: str | None = None,
                       positions: int | None = None, checks: list[str] | None = None) -> dict[str, Any]:
    """Library entry: check_dependencies on live objects."""
    from gradprobe.loading import live_target

    return dependencies_report(live_target(model, batch, loss_fn, None, None, project_dir), positions, checks)
