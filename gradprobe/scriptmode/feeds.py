"""What each reference setup is fed (scriptmode/paired.py): setup A's batches joined, A's weights, and how the
reference is set up. A plan is a dict: `target`, `processes`, `distributed`, `feeds` (one file per process), `to_one`
(set the framework's accumulation to 1), and facts for the report; or `why_not` (the comparison does not apply) or
`not_run` (it applies and cannot be run, with why)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

FRAMEWORK_KNOBS = {"transformers": "the Trainer's gradient_accumulation_steps",
                   "lightning": "Lightning's accumulate_grad_batches",
                   "accelerate": "accelerate's gradient_accumulation_steps"}


# one setup's run (scriptmode/paired.py starts it), as the plans read it
@dataclass
class SetupRun:
    role: str
    out_dir: str
    processes: int
    infos: list[dict[str, Any] | None] = field(default_factory=list)
    exits: dict[int, int] = field(default_factory=dict)
    killed: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def public(self) -> dict[str, Any]:
        return {"dir": self.out_dir, "processes": self.processes, "exits": self.exits, "killed": self.killed,
                "seconds": round(self.seconds, 3)}


def _refused(check: str, why: str, location: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"not_run": {"check": check, "why": why, "cause": "refused", **({"location": location} if location else {})}}


def _recorded(a: SetupRun) -> list[list[Any]]:
    import torch

    return [torch.load(os.path.join(a.out_dir, f"rank{i}.pt"), weights_only=False)["batches"] for i in range(a.processes)]


def _weights(a: SetupRun) -> dict[Any, Any]:
    import torch

    data: dict[Any, Any] = torch.load(os.path.join(a.out_dir, "rank0.pt"), weights_only=False)["weights"]
    return data


def _loader(a: SetupRun, check: str) -> tuple[int | None, dict[str, Any] | None]:
    infos = [i for i in a.infos if i is not None]
    loaders = {i.get("train_loader") for i in infos}
    if None in loaders or len(loaders) != 1:
        return None, _refused(check, "the script's batches do not come from a torch DataLoader (no batch was yielded before "
                                     "its first backward()), so the reference cannot be fed the same examples")
    refused = next((i.get("record_refused") for i in infos if i.get("record_refused")), None)
    if refused:
        return None, _refused(check, f"recording the batches stopped: {refused}")
    return int(loaders.pop() or 0), None


def _calls(a: SetupRun, check: str) -> tuple[list[dict[int, Any]] | None, dict[str, Any] | None]:
    """The inputs of the model's calls each process recorded, when its batches come from no DataLoader (callfeed.py):
    (per process, step -> micro-batches -> calls) or why they cannot be fed."""
    import torch

    from gradprobe.checks.steps.facts import at

    infos = [i for i in a.infos if i is not None]
    if not infos or any(i.get("feed_mode") != "calls" for i in infos):
        return None, _refused(check, "the script's batches come from no torch DataLoader and no grad-enabled call of a "
                                     "module received them, so the reference cannot be fed the same examples")
    refused = next((i.get("record_refused") for i in infos if i.get("record_refused")), None)
    if refused:
        return None, _refused(check, f"recording the batches stopped: {refused}")
    unfed = next((i["unfed"] for i in infos if i.get("unfed")), None)
    if unfed:
        where = f" at {at(unfed['location'])}" if unfed.get("location") else ""
        return None, _refused(check, unfed.get("why") or (
            "the script's batches come from no DataLoader, so the reference is fed what its model's forward and its loss "
            f"function received; its loss also takes a tensor neither received ({unfed['op']}, {unfed['what']}{where}), "
            "which gradprobe cannot feed: pass it through the model's forward or the loss function's target"),
            unfed.get("location"))
    calls = [torch.load(os.path.join(a.out_dir, f"rank{i}.pt"), weights_only=False).get("calls") or {}
             for i in range(a.processes)]
    if not all(any(g for groups in c.values() for g in groups) for c in calls):
        return None, _refused(check, "the script's batches come from no DataLoader and no grad-enabled module call or "
                                     "torch loss function received one before a backward()")
    return calls, None


def _source(a: SetupRun, check: str) -> tuple[str, Any]:
    """Where the batches come from: ("loader", its index), ("calls", what callfeed.py recorded) or ("refused", why)."""
    loader, refused = _loader(a, check)
    if refused is None:
        return "loader", loader
    if any((i or {}).get("train_loader") is not None for i in a.infos):
        return "refused", refused
    calls, why = _calls(a, check)
    return ("calls", calls) if why is None else ("refused", why)


def _call_examples(groups: list[list[dict[str, Any]]]) -> int | None:
    """The examples of one step fed by calls: the rows of the first call's first recorded tensor, over the parts."""
    from gradprobe.checks.equivalence.batches import tensors_of

    rows = [next((int(t.shape[0]) for t in tensors_of(g[0]["args"]) if t.dim() > 0), 0) for g in groups if g]
    return sum(rows) or None


def _one_process(target: dict[str, Any], options: dict[str, Any]) -> str:
    extra = (options.get("reference") or {}).get("args")
    what = "script" if target.get("script") or target.get("module") else "build_model() target"
    return f"the same {what} as one process (WORLD_SIZE=1" + (f", with the reference's arguments {extra})" if extra else ")")


def _reference_args(target: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    ref = options.get("reference") or {}
    extra = [str(x) for x in (ref.get("args") or [])]
    return dict(target, args=[*(target.get("args") or []), *extra]) if extra else dict(target)


def _save_feed(path: str, loader: int | None, batches: list[Any], weights: dict[Any, Any],
               calls: dict[int, Any] | None = None, guess: int | None = None) -> str:
    import torch

    from gradprobe.scriptmode.pairwatch import Feed

    torch.save(Feed(loader=loader, batches=batches, weights=weights, calls=calls, guess=guess), path)
    return path


def _ranks_calls_plan(a: SetupRun, target: dict[str, Any], options: dict[str, Any],
                      calls: list[dict[int, Any]]) -> dict[str, Any]:
    """N processes against one, for batches made without a DataLoader: the reference's step i is fed the N ranks'
    micro-batches of step i (micro-batch-major), as many per backward() as its calibration step measures."""
    steps = sorted(set.intersection(*(set(c) for c in calls)))
    feed: dict[int, Any] = {}
    for s in steps:
        per_rank = [c[s] for c in calls]
        counts = sorted({len(g) for g in per_rank})
        if len(counts) != 1:
            return _refused("the N-processes comparison", f"at step {s} the processes ran {counts} backward() calls: "
                                                          "their micro-batches cannot be matched")
        feed[s] = [per_rank[i][m] for m in range(counts[0]) for i in range(len(per_rank))]
    path = _save_feed(os.path.join(os.path.dirname(a.out_dir), "feed-ranks.pt"), None, [], _weights(a), feed,
                      guess=len(calls))  # the N ranks' micro-batches joined: accumulation that ignores the world size
    return {"target": dict(_reference_args(target, options), world_size=1), "processes": 1, "distributed": True,
            "feeds": [path], "to_one": False, "joined_batches": len(steps), "padded": False,
            "examples": _call_examples(feed.get(1) or []), "rate": rate_of(a.infos[0] or {}), "feed_mode": "calls",
            "examples_text": "the inputs of the ranks' calls to the model and the loss, joined",
            "reference": _one_process(target, options)}


def _examples(joined: list[Any]) -> int | None:
    from gradprobe.checks.equivalence.batches import tensors_of

    found = [t for t in tensors_of(joined[0]) if t.dim() > 0] if joined else []
    return int(found[0].shape[0]) if found else None


def rate_of(info: dict[str, Any]) -> int:
    """Batches of the training loader consumed per optimizer step: the yields between the ends of steps 1 and 2 (a
    loader that runs ahead, as Lightning's and accelerate's do, yields more before step 1 and the same per step); for
    batches made without a DataLoader, the micro-batches (backward calls) of a step."""
    per = info.get("per_step") or []
    if info.get("feed_mode") == "calls":
        return int(per[0]["backward_calls"]) if per else 0
    return int(per[1]["yields"]) - int(per[0]["yields"]) if len(per) > 1 else int(per[0]["backward_calls"]) if per else 0


def ranks_plan(a: SetupRun, target: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    from gradprobe.checks.equivalence.batches import Unjoinable, join, padded

    check = "the N-processes comparison"
    if a.processes < 2:
        return {"why_not": "the target runs as one process (world_size 1): give world_size 2-4 to compare N processes "
                           "with one on the same global batch"}
    worlds = {(i or {}).get("world_size") for i in a.infos}
    if worlds != {a.processes}:
        return {"why_not": f"the script ran as {a.processes} processes but did not join them into one process group "
                           f"(torch.distributed's world size seen: {sorted(str(w) for w in worlds)}): its processes train "
                           "apart, there is no N-process gradient to compare"}
    source, found = _source(a, check)
    if source == "refused":
        return dict(found)
    if source == "calls":
        return _ranks_calls_plan(a, target, options, found)
    loader = found
    batches = _recorded(a)
    m = min(len(b) for b in batches)
    joined, pads = [], False
    try:
        for i in range(m):
            parts = [b[i] for b in batches]
            pads = pads or padded(parts)
            joined.append(join(parts, where=f"batch {i + 1}"))
    except Unjoinable as exc:
        return _refused(check, f"the ranks' batches cannot be joined into one: {exc}")
    path = _save_feed(os.path.join(os.path.dirname(a.out_dir), "feed-ranks.pt"), int(loader or 0), joined, _weights(a))
    return {"target": dict(_reference_args(target, options), world_size=1), "processes": 1, "distributed": True,
            "feeds": [path], "to_one": False, "joined_batches": m, "padded": pads, "examples": _examples(joined),
            "rate": rate_of(a.infos[0] or {}), "reference": _one_process(target, options)}


def accumulation_plan(a: SetupRun, target: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    from gradprobe.checks.equivalence.batches import Unjoinable, join, padded

    check = "the accumulation comparison"
    info = a.infos[0] or {}
    ks = [int(s.get("backward_calls") or 0) for s in info.get("per_step") or []]
    if not ks or max(ks) < 2:
        return {"why_not": f"each optimizer step is fed by one backward() call ({ks or 'none seen'}): no accumulation"}
    framework = str(info.get("framework") or "")
    knob = (info.get("knobs") or {}).get(framework)
    given = bool((options.get("reference") or {}).get("args"))
    to_one = isinstance(knob, int) and knob > 1 and not given
    if not to_one and not given:
        return _refused(check, f"{max(ks)} backward() calls feed each optimizer step and no framework setting gradprobe "
                               "knows sets that number (a plain loop sets it itself): name the reference setup with "
                               "`reference: {\"args\": [...]}` (the script's arguments for accumulation 1, e.g. "
                               "[\"--grad-accum\", \"1\"]); it is fed the same micro-batches joined into one batch")
    source, found = _source(a, check)
    if source == "refused":
        return dict(found)
    loader = found if source == "loader" else None
    rate = rate_of(info)
    if rate < 1:
        return _refused(check, "the script consumed no batch of its DataLoader per optimizer step after the first")
    if source == "calls":
        feeds = [_save_feed(os.path.join(os.path.dirname(a.out_dir), f"feed-accumulation{r}.pt"), None, [], _weights(a),
                            calls, guess=max(ks)) for r, calls in enumerate(found)]
        how = f"the script with the reference's arguments {(options.get('reference') or {}).get('args')}" if given else \
            f"{FRAMEWORK_KNOBS[framework]} set to 1 by gradprobe (the script asks for {knob})"
        return {"target": _reference_args(target, options), "processes": a.processes, "distributed": a.processes > 1,
                "feeds": feeds, "to_one": to_one, "k": max(ks), "rate": rate, "padded": False, "reference": how,
                "examples": _call_examples(found[0].get(1) or []), "framework": framework, "feed_mode": "calls",
                "examples_text": "the inputs of the micro-batches' calls joined"}
    feeds = []
    pads = False
    try:
        for r, batches in enumerate(_recorded(a)):
            joined = []
            for i in range(len(batches) // rate):
                parts = batches[i * rate:(i + 1) * rate]
                pads = pads or padded(parts)
                joined.append(join(parts, where=f"step {i + 1}'s micro-batches"))
            feeds.append(_save_feed(os.path.join(os.path.dirname(a.out_dir), f"feed-accumulation{r}.pt"), int(loader or 0),
                                    joined, _weights(a)))
    except Unjoinable as exc:
        return _refused(check, f"the micro-batches cannot be joined into one batch: {exc}")
    how = (f"{FRAMEWORK_KNOBS[framework]} set to 1 by gradprobe (the script asks for {knob})" if to_one else
           f"the script with the reference's arguments {(options.get('reference') or {}).get('args')}")
    return {"target": _reference_args(target, options), "processes": a.processes, "distributed": a.processes > 1,
            "feeds": feeds, "to_one": to_one, "k": max(ks), "rate": rate, "padded": pads, "reference": how,
            "examples": _examples(joined),
            "framework": framework}
