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


def _refused(check: str, why: str) -> dict[str, Any]:
    return {"not_run": {"check": check, "why": why, "cause": "refused"}}


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


def _reference_args(target: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    ref = options.get("reference") or {}
    extra = [str(x) for x in (ref.get("args") or [])]
    return dict(target, args=[*(target.get("args") or []), *extra]) if extra else dict(target)


def _save_feed(path: str, loader: int, batches: list[Any], weights: dict[Any, Any]) -> str:
    import torch

    from gradprobe.scriptmode.pairwatch import Feed

    torch.save(Feed(loader=loader, batches=batches, weights=weights), path)
    return path


def _examples(joined: list[Any]) -> int | None:
    from gradprobe.checks.equivalence.batches import tensors_of

    found = [t for t in tensors_of(joined[0]) if t.dim() > 0] if joined else []
    return int(found[0].shape[0]) if found else None


def rate_of(info: dict[str, Any]) -> int:
    """Batches of the training loader consumed per optimizer step: the yields between the ends of steps 1 and 2 (a
    loader that runs ahead, as Lightning's and accelerate's do, yields more before step 1 and the same per step)."""
    per = info.get("per_step") or []
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
    loader, refused = _loader(a, check)
    if refused is not None:
        return refused
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
            "rate": rate_of(a.infos[0] or {}), "reference": "the same script as one process (WORLD_SIZE=1)"}


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
    loader, refused = _loader(a, check)
    if refused is not None:
        return refused
    rate = rate_of(info)
    if rate < 1:
        return _refused(check, "the script consumed no batch of its DataLoader per optimizer step after the first")
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
