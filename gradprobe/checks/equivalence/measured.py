"""The paired comparisons judged from what the runs wrote (scriptmode/paired.py): each step's gradients of the setup
under test (rank 0's, what its optimizer saw) against the reference's, the first step and module that depart, the
located cause, and the finding or the verified line with its largest difference."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from gradprobe.checks.equivalence import located
from gradprobe.checks.equivalence.compare import StepDiff, compare_step, name_ratio, named_ratios, tolerance
from gradprobe.checks.equivalence.rules import GP801, GP802, GP806
from gradprobe.findings import Finding

# optimizers that divide each tensor's gradient by its own running scale: a constant factor on a tensor's gradient does
# not change their update (up to eps)
ADAPTIVE = frozenset({"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "RMSprop", "Adadelta", "SparseAdam",
                      "Adafactor", "LAMB", "Lion"})
MAX_ROWS = 40
WHAT = {"ranks": ("N processes against one", "rank", "one process"),
        "accumulation": ("k micro-batches against one batch", "micro-batch", "one batch")}


@dataclass
class Pair:
    kind: str
    entry: dict[str, Any]
    a_infos: list[dict[str, Any] | None]
    b_infos: list[dict[str, Any] | None]
    a: dict[str, Any]  # rank 0's tensors (grads, targets)
    b: dict[str, Any]
    a_targets: list[dict[int, list[torch.Tensor]]] = field(default_factory=list)
    n: int = 1
    k: int = 1
    steps: list[StepDiff] = field(default_factory=list)
    a_seconds: float | None = None  # the setup under test's run (the reference's is in entry["b"])
    started: str = ""  # how its processes were started, when a launcher or mp.spawn started them

    @property
    def optimizer(self) -> str:
        return str((self.a_infos[0] or {}).get("optimizer") or "the optimizer")

    @property
    def adaptive(self) -> bool:
        return self.optimizer in ADAPTIVE


def result(applies: bool, why_not: str = "", findings: list[Finding] | None = None, verified: list[str] | None = None,
           not_run: list[dict[str, Any]] | None = None, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"applies": applies, "why_not": why_not, "findings": findings or [], "verified": verified or [],
            "not_run": not_run or [], "facts": facts or {}}


def _load(path: str) -> dict[str, Any]:
    data: dict[str, Any] = torch.load(path, weights_only=False)
    return data


def _setup_text(pair: Pair) -> str:
    if pair.kind == "ranks":
        return f"{pair.n} processes{pair.started} against one"
    return f"{pair.k} micro-batches against one batch" + (f" (at {pair.n} processes{pair.started})" if pair.n > 1 else "")


def _started(paired: dict[str, Any]) -> str:
    """How the setup under test's processes were started, when not torchrun-style by gradprobe (launchers.py)."""
    launched = paired.get("launched")
    if launched:
        return f" started by the launcher's `{str(launched.get('command'))[:160]}` at {located.at(launched.get('by'))}"
    spawned = ((paired.get("a_infos") or [None])[0] or {}).get("spawned")
    return f" started by torch.multiprocessing.spawn at {located.at(spawned)}" if spawned else ""


def load(kind: str, paired: dict[str, Any]) -> Pair | dict[str, Any]:
    """The pair's tensors, or a result saying why it was not compared."""
    entry = paired.get(kind)
    if not isinstance(entry, dict):
        return result(False, "not asked" if paired else "the comparison runs a script twice (a `script` or `module` "
                                                          "target)")
    if "why_not" in entry:
        return result(False, str(entry["why_not"]))
    if "not_run" in entry:
        return result(True, not_run=[entry["not_run"]])
    if "reference_failed" in entry:
        bad = entry["reference_failed"]
        return result(True, not_run=[{"check": f"the {kind} comparison", "why": f"the reference setup ({entry.get('reference')}) "
                                      f"did not run its steps: {bad['why']}", "cause": bad["cause"]}])
    a_dir, b_dir = paired["a"]["dir"], entry["b"]["dir"]
    a_infos, b_infos = paired.get("a_infos") or [], entry.get("b_infos") or []
    pair = Pair(kind=kind, entry=entry, a_infos=a_infos, b_infos=b_infos, a=_load(os.path.join(a_dir, "rank0.pt")),
                b=_load(os.path.join(b_dir, "rank0.pt")), n=int(paired.get("world_size") or 1),
                k=int(entry.get("k") or 1), a_seconds=paired["a"].get("seconds"), started=_started(paired))
    pair.a_targets = [_load(os.path.join(a_dir, f"rank{i}.pt")).get("targets") or {} for i in range(len(a_infos))] \
        if kind == "ranks" else [pair.a.get("targets") or {}]
    b0 = b_infos[0] if b_infos else None
    b_ks = [int(s.get("backward_calls") or 0) for s in (b0 or {}).get("per_step") or []]
    want = 1 if kind == "accumulation" else int(entry.get("rate") or 1)
    got = _rate(b0) if entry.get("feed_mode") != "calls" else None
    fed_wrong = next((i.get("feed_error") for i in b_infos if i and i.get("feed_error")), None)
    if fed_wrong:
        return result(True, not_run=[{"check": f"the {kind} comparison", "cause": "refused",
                                      "why": f"the reference ({entry.get('reference')}) was fed the inputs the setup under "
                                             f"test's model and loss received, and {fed_wrong}"}])
    if got is not None and got != want:
        return result(True, not_run=[{"check": f"the {kind} comparison", "cause": "refused",
                                      "why": f"the reference ({entry.get('reference')}) consumed {got} batch(es) of its "
                                             f"DataLoader per optimizer step where it is fed {want}: the script groups its "
                                             "batches by a setting of its own; name the reference with "
                                             "`reference: {\"args\": [...]}`"}])
    if kind == "accumulation" and b_ks and max(b_ks) > 1:
        return result(True, not_run=[{"check": "the accumulation comparison", "cause": "refused",
                                      "why": f"the reference ({entry.get('reference')}) still runs {max(b_ks)} backward() "
                                             "calls per optimizer step: the script accumulates by a setting of its own; "
                                             "name the reference with `reference: {\"args\": [...]}`"}])
    if not b0 or not b0.get("fed") or not b0.get("loaded"):
        return result(True, not_run=[{"check": f"the {kind} comparison", "cause": "gradprobe",
                                      "why": "the reference setup ran but was not fed the recorded batches and weights "
                                             f"(batches fed {b0.get('fed') if b0 else 0}, weights loaded "
                                             f"{(b0 or {}).get('loaded')})"}])
    return pair


def _rate(info: dict[str, Any] | None) -> int | None:
    """Batches consumed per optimizer step (the yields between the ends of steps 1 and 2), as scriptmode/feeds.py."""
    per = (info or {}).get("per_step") or []
    return int(per[1]["yields"]) - int(per[0]["yields"]) if len(per) > 1 else None


def compare(pair: Pair, steps: int) -> None:
    a0, b0 = pair.a_infos[0] or {}, pair.b_infos[0] or {}
    dtypes = set(a0.get("grad_dtypes") or []) | set(b0.get("grad_dtypes") or [])
    tol = tolerance(dtypes, a0.get("autocast") or b0.get("autocast"))
    names = named_ratios(pair.n if pair.kind == "ranks" else None, pair.k if pair.kind == "accumulation" else None)
    order = _param_order(a0.get("module_order") or [], list((pair.a["grads"].get(1) or {}).keys()))
    for s in range(1, steps + 1):
        ga, gb = pair.a["grads"].get(s), pair.b["grads"].get(s)
        if ga is None or gb is None:
            break
        pair.steps.append(compare_step(s, ga, gb, tol, names, order))


def _param_order(modules: list[str], params: list[str]) -> list[str]:
    """Parameter names in the forward order of their modules (the module a parameter's name begins with)."""
    rank = {m: i for i, m in enumerate(m for m in modules if m)}  # the root's own parameters (a logit scale): last

    def key(p: str) -> int:
        owner = p.rsplit(".", 1)[0] if "." in p else ""
        return rank.get(owner, len(rank))

    return sorted(params, key=key)


def judge(kind: str, paired: dict[str, Any]) -> dict[str, Any]:
    loaded = load(kind, paired)
    if not isinstance(loaded, Pair):
        return loaded
    return evaluate(loaded, int(paired.get("steps") or 2))


def evaluate(pair: Pair, steps: int) -> dict[str, Any]:
    """Compare the pair's recorded steps and judge them: the finding, or the verified line."""
    kind = pair.kind
    compare(pair, steps)
    facts = _facts(pair)
    if not pair.steps or not pair.steps[0].rows:
        return result(True, not_run=[{"check": f"the {kind} comparison", "cause": "gradprobe",
                                      "why": "no parameter's gradient was recorded under the same name in both setups "
                                             f"(the test setup's: {', '.join(list(pair.a['grads'].get(1) or {})[:5])})"}],
                      facts=facts)
    bad = next((s for s in pair.steps if s.departing), None)
    drawn = next((i["random_in_step"] for i in [*pair.a_infos, *pair.b_infos] if i and i.get("random_in_step")), None)
    if bad is not None and drawn is not None:  # the setups drew different random numbers: a difference means nothing
        w = bad.worst
        return result(True, facts=facts, not_run=[{
            "check": f"the {kind} comparison", "cause": "refused", "location": drawn.get("backward"),
            "why": (f"the step draws random numbers between its batch and backward() (besides dropout, which both "
                    f"setups run off), so the two setups cannot draw the same ones: step {bad.step} differs (largest "
                    f"relative difference {w.rel if w else 0:.2g} on {w.name if w else '-'}) and that difference is not "
                    "attributed to the code")}])
    varying = _data_scalars(pair) if bad is not None and pair.entry.get("feed_mode") == "calls" else None
    if varying is not None:  # a number computed from the script's own, unfed, batch scales the loss: not attributable
        w = bad.worst if bad is not None else None
        return result(True, facts=facts, not_run=[{
            "check": f"the {kind} comparison", "cause": "refused",
            "why": (f"the script's batches come from no DataLoader and its loss is scaled, outside the model's calls, by "
                    f"numbers that vary with its data ({varying}): a count the reference computes from its own batch, "
                    f"which gradprobe does not feed. Step {bad.step if bad else '?'} differs (largest relative difference "
                    f"{w.rel if w else 0:.2g} on {w.name if w else '-'}) and that difference is not attributed to the "
                    "code: compute such counts inside the model's forward or the loss function, or use a DataLoader")}])
    if bad is None and pair.kind == "accumulation":
        twice = located.divided_twice_graph(pair.a_infos, 1)
        if twice is not None:
            return result(True, findings=[_both_divide(pair, twice)], facts=facts)
    if bad is None:
        return result(True, verified=[_verified_line(pair)], facts=facts)
    finding = _finding(pair, bad)
    verified = [_verified_line(pair, finding)] if finding["severity"] == "info" else []
    return result(True, findings=[finding], verified=verified, facts=facts)


def _data_scalars(pair: Pair) -> str | None:
    """The scalars of the setup under test's losses outside the model's calls (scriptmode/callfeed.py) when they vary
    between its ranks, micro-batches or steps (a count of the data, not a constant): a few of them, as text."""
    seen = [tuple(b) for info in pair.a_infos for per in ((info or {}).get("loss_scalars") or {}).values() for b in per]
    if len(set(seen)) < 2:
        return None
    values = sorted({v for b in seen for v in b})
    return ", ".join(f"{v:g}" for v in values[:6]) + (" ..." if len(values) > 6 else "")


def _examples(pair: Pair) -> str:
    n = pair.entry.get("examples")
    how = pair.entry.get("examples_text") or ("the ranks' batches joined" if pair.kind == "ranks"
                                              else "the micro-batches joined")
    if pair.entry.get("feed_mode") == "calls":
        return (f"{n} examples a step" if n else "examples") + f" ({how})"
    if pair.kind == "ranks" and int(pair.entry.get("rate") or 1) > 1:  # the script accumulates: several batches a step
        return f"batches ({n} examples each, the ranks' batches joined; {pair.entry.get('rate')} per step)"
    return (f"{n} examples" if n else "examples") + f" ({how})"


def _verified_line(pair: Pair, apart: Finding | None = None) -> str:
    """What agreed, with the largest difference; `apart`: a GP806 finding whose tensors are said separately."""
    left = set(apart["parameters"]) if apart is not None else set()
    worst = max((r for s in pair.steps for r in s.rows if r.name not in left), key=lambda r: r.rel, default=None)
    n_rows = len([r for r in pair.steps[0].rows if r.name not in left])
    where = f" on {worst.name}" if worst is not None else ""
    ratio = f"{worst.rel:.2g}" if worst is not None else "0"
    extra = _by_design(pair)
    if apart is not None:
        extra += (f"; {', '.join(sorted(left))}: {apart['evidence'].get('ratio_text', 'a constant multiple')} of the "
                  "reference's, by design (GP806)")
    what = _when(pair) if apart is None else f"the gradient of the other {n_rows} tensors"
    return (f"{_setup_text(pair)}: {what} at steps 1-{len(pair.steps)} equals the reference's "
            f"({pair.entry.get('reference')}) on the same {_examples(pair)} from the same weights: {n_rows} tensors, "
            f"largest relative difference {ratio}{where} (tolerance {pair.steps[0].tol:.0e}){extra}")


def _when(pair: Pair) -> str:
    """Which gradient was compared: at optimizer.step(), or before the script's clip_grad_norm_ (both setups clip)."""
    a0 = pair.a_infos[0] or {}
    clips = a0.get("clips") or []
    if a0.get("pre_clip") and clips:
        c = clips[0]
        return (f"the gradient before clip_grad_norm_ (max norm {c['max_norm']:g} at {located.at(c['location'])}, which "
                "both setups call)")
    return "the gradient the optimizer sees"


def _by_design(pair: Pair) -> str:
    a0 = pair.a_infos[0] or {}
    parts = []
    if a0.get("dropout_calls"):
        parts.append("dropout off in both")
    if a0.get("sharded"):
        parts.append("FSDP2's gradient and weight shards gathered whole on every rank")
    if a0.get("batchnorm_eval"):
        parts.append(f"{a0['batchnorm_eval']} BatchNorm layer(s) on their running statistics in both (per-part batch "
                     "statistics differ by design)")
    return "; " + ", ".join(parts) if parts else ""


def _history(pair: Pair, bad: StepDiff) -> str:
    if bad.step == 1:
        return ""
    first = pair.steps[0]
    w = first.worst
    return (f" Step 1 agreed (largest relative difference {w.rel if w else 0:.2g}) and both setups started step "
            f"{bad.step} from the same weights: the difference is step {bad.step}'s own.")


def _cause(pair: Pair, bad: StepDiff, named: str | None, turned: bool) -> located.Cause | None:
    _, part, reference = WHAT[pair.kind]
    a, b = pair.a_infos, pair.b_infos
    if turned:
        b_targets = (pair.b.get("targets") or {}).get(bad.step) or []
        a_targets = [t.get(bad.step) or [] for t in pair.a_targets]
        lines = ((a[0] or {}).get("target_lines") or {}).get(str(bad.step)) or []
        per_part = a_targets if pair.kind == "ranks" else _split_micro(a_targets[0], pair.k)
        for probe in (lambda: located.sync_cause(a, bad.step),
                      lambda: located.targets_cause(bad.step, per_part, b_targets, lines, part),
                      lambda: located.gather_cause(a, bad.step) if pair.kind == "ranks" else None,
                      lambda: located.count_cause(a if pair.kind == "ranks" else a[:1], b, bad.step, part, reference)):
            found = probe()
            if found is not None:
                return found
        return None
    for probe2 in (lambda: located.sum_all_reduce_cause(a, named),
                   lambda: located.divided_twice_cause(a, bad.step, pair.k, named),
                   lambda: located.reduction_cause(a, bad.step, named, pair.kind),
                   lambda: located.count_cause(a if pair.kind == "ranks" else a[:1], b, bad.step, part, reference)):
        found = probe2()
        if found is not None:
            return found
    return None


def _split_micro(targets: list[torch.Tensor], k: int) -> list[list[torch.Tensor]]:
    """A micro-batched run's per-node targets at a step (k backward calls, each with the same nodes) as k parts."""
    if k < 2 or not targets or len(targets) % k:
        return []
    per = len(targets) // k
    return [targets[i * per:(i + 1) * per] for i in range(k)]


def _finding(pair: Pair, bad: StepDiff) -> Finding:
    turned = bool(bad.turned())
    uniform = bad.uniform_ratio() if not turned and len(bad.departing) == len(bad.rows) else None
    names = named_ratios(pair.n if pair.kind == "ranks" else None, pair.k if pair.kind == "accumulation" else None)
    named = name_ratio(uniform, names) if uniform is not None else None
    cause = _cause(pair, bad, named, turned)
    fields = _fields(pair, bad, cause)
    evidence = {"steps": [s.summary() for s in pair.steps], "departing": [r.row() for r in bad.departing[:MAX_ROWS]],
                "losses": _losses(pair, bad.step), **(cause.evidence if cause else {})}
    location = cause.location if cause and cause.location else located.backward_line(pair.a_infos, bad.step)
    params = [r.name for r in bad.departing]
    if turned:
        return _departure(pair, None, parameters=params, location=location, evidence=evidence, **fields)
    if uniform is not None:
        situation = "scale_adaptive" if pair.adaptive else "scale"
        return _departure(pair, situation, parameters=params, location=location, evidence=evidence, ratio=uniform,
                            named=named or f"{uniform:.3g}", **fields)
    label, ratio, rows = max(bad.scale_groups(), key=lambda g: len(g[2]))
    rest = [r for r in bad.rows if r not in rows]
    scaled = ", ".join(r.name for r in rows[:6]) + (f" and {len(rows) - 6} more" if len(rows) > 6 else "")
    rest_worst = max((r.rel for r in rest), default=0.0)
    kw: dict[str, Any] = dict(scaled=scaled, ratio=ratio, named=label or f"{ratio:.3g}", rest=len(rest),
                              rest_worst=rest_worst)
    if pair.adaptive and all(not r.departs for r in rest) and _same_every_step(pair, {r.name for r in rows}):
        evidence["ratio_text"] = f"{ratio:.4g}x ({kw['named']})"
        return GP806.finding(parameters=[r.name for r in rows], location=location, evidence=evidence,
                             setup=fields["setup"], optimizer=pair.optimizer, **kw)
    return _departure(pair, "tensor_scale", parameters=params, location=location, evidence=evidence, **fields, **kw)


def _departure(pair: Pair, situation: str | None, **kw: Any) -> Finding:
    """GP801 (N processes against one) or GP802 (k micro-batches against one batch), with the same fields."""
    if pair.kind == "ranks":
        return GP801.finding(situation, **kw)
    return GP802.finding(situation, **kw)


def _both_divide(pair: Pair, twice: dict[str, Any]) -> Finding:
    worst = max((r.rel for s in pair.steps for r in s.rows), default=0.0)
    framework = {"transformers": "the Trainer", "lightning": "Lightning", "fabric": "Fabric", "accelerate": "accelerate"}.get(
        str((pair.a_infos[0] or {}).get("framework")), "the framework")
    return GP802.finding("both_divide", parameters=[r.name for r in pair.steps[0].rows], location=twice["location"],
                         evidence={"steps": [s.summary() for s in pair.steps], "graph": twice},
                         setup=_setup_text(pair), steps=len(pair.steps), reference=pair.entry.get("reference"),
                         worst=worst, k=twice["k"], mass=twice["mass"], ops=twice["ops"], framework=framework,
                         line=located.at(twice["location"]) if twice["location"] else "where the loss is divided")


def _same_every_step(pair: Pair, names: set[str]) -> bool:
    return all({r.name for r in s.departing} == names and not s.turned() for s in pair.steps)


def _fields(pair: Pair, bad: StepDiff, cause: located.Cause | None) -> dict[str, Any]:
    dep = bad.departing
    w = max(bad.turned(), key=lambda r: r.rel, default=None) or bad.worst  # the direction's worst, where it turned
    cos = f"{w.cosine:.4f}" if w is not None and w.cosine is not None else "undefined: one side is zero"
    remedy = cause.remedy if cause else (
        "Make each rank's loss its share of the global batch's loss: average over the local batch (DDP averages the "
        "ranks), normalise by counts taken over all ranks, gather the other ranks' tensors with their gradient, and "
        "build per-rank targets at every step." if pair.kind == "ranks" else
        "Make the micro-batch losses add up to the one-batch loss: divide each by the number of micro-batches (or by "
        "the token count of all micro-batches of the step), and recompute nothing that the one batch computes once.")
    return {"setup": _setup_text(pair), "step": bad.step, "count": len(dep), "total": len(bad.rows),
            "examples": _examples(pair), "worst": w.rel if w else 0.0, "worst_name": w.name if w else "-",
            "cosine": cos, "tol": bad.tol, "first": dep[0].name if dep else "-", "last": dep[-1].name if dep else "-",
            "history": _history(pair, bad), "cause": cause.text if cause else "", "remedy": remedy,
            "optimizer": pair.optimizer}


def _losses(pair: Pair, step: int) -> dict[str, Any]:
    return {"test": located.loss_values(pair.a_infos, step), "reference": located.loss_values(pair.b_infos, step)}


def _facts(pair: Pair) -> dict[str, Any]:
    a0 = pair.a_infos[0] or {}
    return {"setup": _setup_text(pair), "reference": pair.entry.get("reference"),
            "world_size": pair.n, "micro_batches": pair.k if pair.kind == "accumulation" else None,
            "optimizer": pair.optimizer, "framework": a0.get("framework"),
            "batches_per_step": pair.entry.get("rate"), "padded": pair.entry.get("padded"),
            "dropout_off_calls": a0.get("dropout_calls"), "batchnorm_on_running_stats": a0.get("batchnorm_eval"),
            "random_in_step": a0.get("random_in_step"), "compared": _when(pair),
            "sharded": "FSDP2's DTensor shards gathered whole (full_tensor) on every rank" if a0.get("sharded") else None,
            "clipped": {"test": a0.get("clips"), "reference": (pair.b_infos[0] or {}).get("clips")},
            "seconds": {"test": pair.a_seconds, "reference": (pair.entry.get("b") or {}).get("seconds")},
            "steps": [dict(s.summary(), rows=[r.row() for r in (s.departing or s.rows)[:MAX_ROWS]]) for s in pair.steps]}
