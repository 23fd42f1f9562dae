"""The replayed step of a script that trains several models (scriptmode/members.py found them).

The models of the step (those holding parameters of the stepping optimizer or of the loss's graph) are held by a
ModelSet under the script's names for them. Its forward replays the top-level calls the script made into them since the
last optimizer step, in the script's order, each with the arguments the script passed; an argument that was, by
identity, the output of an earlier of these calls (`encoder_hidden_states = text_encoder(ids)[0]`, then
`unet(noisy, t, encoder_hidden_states)`) is that call's new output, so the gradient flows from one model into the next
as it did in the script. A tensor computed with grad outside the models is detached (said in the facts). The loss is
taken from the calls whose outputs the script's loss was computed from (the sinks), as for one model
(step.loss_from_output), summed over the sinks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from gradprobe.modelset import FromCall, ModelSet, PlannedCall, sink_key
from gradprobe.scriptmode.members import Member, Members, find_members, model_of, window_start
from gradprobe.scriptmode.observe import ModuleCall, StepWatch
from gradprobe.scriptmode.step import Replay, _paths, graph_leaves, loss_from_output
from gradprobe.userframes import UserCode


def _where(members: list[Member]) -> dict[int, str]:
    """id(module) -> its path inside the ModelSet, for each module of the step's models (a wrapper: the model's)."""
    out: dict[int, str] = {}
    for m in members:
        for path, sub in m.module.named_modules():
            out.setdefault(id(sub), f"{m.label}.{path}" if path else m.label)
        for sub in m.root.modules():
            out.setdefault(id(sub), m.label)
    return out


def _subst(value: Any, produced: dict[int, tuple[int, tuple]], notes: list[str], depth: int = 0) -> Any:
    if isinstance(value, torch.Tensor):
        hit = produced.get(id(value))
        if hit is not None:
            return FromCall(*hit)
        if value.requires_grad and value.grad_fn is not None:
            notes.append(f"an input of shape {list(value.shape)} computed with grad outside the models")
            return value.detach()
        return value
    if depth > 6:
        return value
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_subst(v, produced, notes, depth + 1) for v in value)
    if isinstance(value, list):
        return [_subst(v, produced, notes, depth + 1) for v in value]
    if type(value) is dict:
        return {k: _subst(v, produced, notes, depth + 1) for k, v in value.items()}
    return value


def _uses(value: Any) -> set[tuple[int, tuple]]:
    """The earlier calls' outputs (call, path) an argument takes its value from."""
    if isinstance(value, FromCall):
        return {(value.index, value.path)}
    if isinstance(value, (tuple, list)):
        return set().union(*(_uses(v) for v in value)) if value else set()
    if isinstance(value, dict):
        return set().union(*(_uses(v) for v in value.values())) if value else set()
    return set()


def _without(out: Any, paths: set[tuple], prefix: tuple = (), depth: int = 0) -> Any:
    """The output with the tensors at `paths` (those a later call took) left out, the others at the same paths."""
    if prefix in paths:
        return None
    if depth > 6:
        return out
    if isinstance(out, dict):
        return {k: _without(v, paths, prefix + (k,), depth + 1) for k, v in out.items()}
    if isinstance(out, (tuple, list)):
        return tuple(_without(v, paths, prefix + (i,), depth + 1) for i, v in enumerate(out))
    return out


def _direct(rec: ModuleCall, consumed: set[tuple]) -> ModuleCall:
    """The call as the loss sees it directly: its outputs that no later call took."""
    if not consumed:
        return rec
    return ModuleCall(rec.module, rec.args, rec.kwargs, rec.seq, rec.location, output=_without(rec.output, consumed))


def _feeds_loss(call: ModuleCall, roots: list[torch.Tensor], nodes: set[int]) -> bool:
    root_ids = {id(r) for r in roots}
    return any(id(t) in root_ids or (t.grad_fn is not None and id(t.grad_fn) in nodes) for _, t in _paths(call.output))


def plan(watch: StepWatch, step_members: list[Member], roots: list[torch.Tensor]) -> tuple[list[PlannedCall], list[int],
                                                                                              list[ModuleCall], list[str]]:
    """The calls to replay, the sinks among them, the script's records of them, and what was detached."""
    start = window_start(watch)
    where = _where(step_members)
    recs = sorted((c for mid, c in watch.calls.items() if c.seq > start and mid in where), key=lambda c: c.seq)
    produced: dict[int, tuple[int, tuple]] = {}
    calls: list[PlannedCall] = []
    notes: list[str] = []
    for i, rec in enumerate(recs):
        path = where[id(rec.module)]
        args = _subst(tuple(rec.args), produced, notes)
        kwargs = _subst(dict(rec.kwargs), produced, notes)
        calls.append(PlannedCall(path, args, kwargs, path.split(".", 1)[0], rec.location))
        for p, t in _paths(rec.output):
            produced.setdefault(id(t), (i, p))
    used = set().union(*(_uses(c.args) | _uses(c.kwargs) for c in calls)) if calls else set()
    # what the loss took from each call directly (an output a later call took reaches the loss through that call)
    direct = [_direct(rec, {p for i2, p in used if i2 == i}) for i, rec in enumerate(recs)]
    nodes, _, _ = graph_leaves(roots)
    sinks = [i for i, rec in enumerate(direct) if _feeds_loss(rec, roots, nodes)]
    if not sinks and recs:
        sinks = [len(recs) - 1]
    return calls, sinks, direct, notes


def _loss(recs: list[ModuleCall], calls: list[PlannedCall], sinks: list[int],
          roots: list[torch.Tensor]) -> tuple[Callable | None, str]:
    """The replay's loss: from each sink's output, as the script's loss took it (step.loss_from_output), summed."""
    if len(sinks) == 1:
        return loss_from_output(recs[sinks[0]], roots)
    parts = [(sink_key(calls[i], i), *loss_from_output(recs[i], roots)) for i in sinks]
    parts = [p for p in parts if p[1] is not None]
    if not parts:
        return None, "no output of the models' calls was traced to the script's loss"

    def total(out: Any, batch: Any, _parts: list = parts) -> torch.Tensor | None:
        acc = None
        for key, fn, _ in _parts:
            term = fn(out[key], batch)
            if term is not None:
                acc = term if acc is None else acc + term
        return acc

    return total, "the sum, over the calls the script's loss was computed from, of " + \
        "; ".join(f"{key}: {how}" for key, _, how in parts)


def several_replay(watch: StepWatch, captured: Any, roots: list[torch.Tensor], user: UserCode,
                   members: Members | None = None, outer: list[nn.Module] | None = None) -> Replay | None:
    """The replayed step over several models (None when the script trains one: step.replay_one's path)."""
    _, leaf_ids, _ = graph_leaves(roots)
    start = window_start(watch)
    step_roots = [b.root for b in watch.backwards if b.root is not None and b.seq > start] or roots
    _, step_ids, _ = graph_leaves(step_roots)
    found = members if members is not None else find_members(watch, captured, leaf_ids, user, step_ids, outer=outer)
    if not found.several:
        return None
    in_step = found.step() or found.trained
    models = model_of(in_step)
    calls, sinks, recs, notes = plan(watch, in_step, step_roots)
    models.set_plan(calls, sinks)
    facts: dict[str, Any] = {"models": found.facts(), "wrapper": None}
    if not calls:
        return Replay(models, None, None, None, dict(facts, replay=None))
    loss_fn, how = _loss(recs, calls, sinks, step_roots)
    facts.update(replay="the calls the script made into " + ", ".join(m.label for m in in_step) + " since its last "
                        "optimizer step, in its order, each output that fed a later call given to it again",
                 replayed_calls=[{"call": c.module_path, "at": c.location} for c in calls], loss=how,
                 call_location=calls[sinks[0]].location if sinks else None)
    if notes:
        facts["detached_inputs"] = sorted(set(notes))
    return Replay(models, ((), {}), loss_fn, None, facts)


def several_model(watch: StepWatch, captured: Any, roots: list[torch.Tensor], user: UserCode,
                  outer: list[nn.Module] | None = None) -> tuple[nn.Module | None, Members]:
    """The models the audit watches: a ModelSet of every trained model when there are several, else None."""
    _, leaf_ids, _ = graph_leaves(roots)
    found = find_members(watch, captured, leaf_ids, user, outer=outer)
    return (model_of(found.trained) if found.several else None), found


__all__ = ["several_replay", "several_model", "ModelSet"]
