"""Where a measured departure comes from, from what both setups recorded at each backward() (pairwatch.py): the
loss's constant scaling and reduction with their lines, the targets of its cross-entropy nodes, the collectives the
script called itself. Each probe states a measured difference between the setups, never a guess from names:

- targets: the setup under test's cross-entropy targets, taken in order (ranks, or micro-batches), differ from the
  reference's on the same examples (labels built for rank 0, a cached label tensor reused at a later step);
- a gather: a tensor that requires grad gathered into copies without gradient (torch.distributed.all_gather, or the
  differentiable gather of torch.distributed.nn called under no_grad, as Lightning's and Fabric's all_gather do
  without sync_grads) when the gradient's direction changed;
- a per-part count: each rank's (micro-batch's) loss divided by a number that differs between them, where the
  reference divides by one number for all (a token count of its own);
- a sum all-reduce: the script's own all_reduce of parameter gradients with SUM, when the ratio is N;
- the reduction: a loss that is a sum (not a mean) over its part of the batch, when the ratio is 1/N or k;
- DDP's sync: the forward of a step's last micro-batch ran with require_backward_grad_sync False (set after it, or
  the last micro-batch inside no_sync()), so its gradient was never all-reduced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from gradprobe.checks.steps.facts import at


@dataclass
class Cause:
    text: str  # one or two sentences, appended to the finding's message
    remedy: str  # the fix
    location: dict | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


def _steps(info: dict[str, Any] | None, step: int) -> list[dict[str, Any]]:
    return [b for b in (info or {}).get("backwards") or [] if b.get("step") == step]


def loss_values(infos: list[dict[str, Any] | None], step: int) -> list[list[float]]:
    """Per process, the values of the losses backpropagated at `step`."""
    return [[b["value"] for b in _steps(i, step) if "value" in b] for i in infos]


def targets_cause(step: int, a_targets: list[list[torch.Tensor]], b_targets: list[torch.Tensor],
                  lines: list[dict | None], part: str) -> Cause | None:
    """The test setup's targets of each cross-entropy node, parts in order, against the reference's (same node order)."""
    if not b_targets or any(len(t) != len(b_targets) for t in a_targets):
        return None
    for j, ref in enumerate(b_targets):
        parts = [t[j].reshape(-1) for t in a_targets]
        if sum(p.numel() for p in parts) != ref.numel():
            continue
        offset = 0
        for r, got in enumerate(parts):
            want = ref.reshape(-1)[offset:offset + got.numel()]
            offset += got.numel()
            if not torch.equal(got, want.to(got.dtype)):
                line = lines[j] if j < len(lines) else None
                where = f" at {at(line)}" if line else ""
                return Cause(
                    text=(f" The targets of the cross-entropy{where} differ at step {step}: {part} {r}'s are "
                          f"{_short(got)}, where the reference's for the same examples are {_short(want)}."),
                    remedy=(f"Build the targets for each {part} from what it holds at every step (e.g. the labels of a "
                            "local loss offset by rank * local batch size), not once: a target tensor cached at the "
                            "first step is reused for the wrong examples later."),
                    location=line, evidence={"targets_differ": {"part": r, "step": step, "got": got[:16].tolist(),
                                                                "reference": want[:16].tolist()}})
    return None


def _short(t: torch.Tensor) -> str:
    values = t.reshape(-1).tolist()
    return str(values[:8])[:-1] + (", ...]" if len(values) > 8 else "]")


def gather_cause(a_infos: list[dict[str, Any] | None], step: int) -> Cause | None:
    for info in a_infos:
        for c in (info or {}).get("collectives") or []:
            bare = c.get("copies_without_grad", c.get("requires_grad") and c.get("grad_enabled"))
            if not (c.get("kind", "").startswith("all_gather") and bare):
                continue
            line = c.get("location")
            how = "the differentiable all_gather under no_grad" if not c.get("grad_enabled") else \
                f"torch.distributed.{c['kind']}"
            return Cause(
                text=(f" The script gathers a tensor that requires grad at {at(line)} into copies without gradient "
                      f"({how}): what the other ranks' examples contribute through them (a contrastive loss's negatives) "
                      "is missing from this rank's gradient."),
                remedy=(f"Gather with gradient at {at(line)}: torch.distributed.nn.functional.all_gather (its backward "
                        "sums the gathered gradients back to each rank; Lightning's and Fabric's all_gather with "
                        "sync_grads=True). Putting this rank's own tensor back in place of its gathered copy keeps only "
                        "the gradient through the local rows."),
                location=line, evidence={"collective": c})
    return None


def sync_cause(a_infos: list[dict[str, Any] | None], step: int) -> Cause | None:
    """DistributedDataParallel's sync off for the forward of a step's last micro-batch (scriptmode/ddpsync.py): its
    backward did not all-reduce, so that micro-batch's gradient stayed local on each rank."""
    for info in a_infos:
        events = [e for e in (info or {}).get("ddp_sync") or [] if e.get("step") == step]
        if not events or events[-1].get("forward_sync"):
            continue
        last, line = events[-1], events[-1].get("set_at")
        synced = [i + 1 for i, e in enumerate(events) if e.get("forward_sync")]
        where = f" (the script sets it at {at(line)})" if line else ""
        also = (f"; micro-batch {', '.join(map(str, synced))} ran with it True, so the gradient accumulated up to it was "
                "averaged and the rest was not" if synced else "")
        return Cause(
            text=(f" DistributedDataParallel all-reduces in the backward of a forward that ran with "
                  f"require_backward_grad_sync True: at step {step} the forward of the last of its {len(events)} "
                  f"micro-batch(es) ran with it False{where}, so that micro-batch's gradient stayed local on each "
                  f"rank{also}."),
            remedy=(f"Set require_backward_grad_sync before the forward of each micro-batch{' at ' + at(line) if line else ''} "
                    "(True for the last one), or run the forward and backward of every micro-batch but the last inside "
                    "model.no_sync(), as nanoGPT does."),
            location=line, evidence={"ddp_sync": events, "last": last})
    return None


def count_cause(a_infos: list[dict[str, Any] | None], b_infos: list[dict[str, Any] | None], step: int, part: str,
                reference: str) -> Cause | None:
    """Each part's loss divided by a number of its own (the parts' divisors differ) where the reference divides once."""
    source = _divisors
    per_part = source(a_infos, step)
    if len({round(d, 6) for d, _ in per_part}) < 2:
        source = _own_counts
        per_part = source(a_infos, step)
    divisors = sorted({round(d, 6) for d, _ in per_part})
    if len(per_part) < 2 or len(divisors) < 2:
        return None
    ref = [d for d, _ in source((b_infos or [None])[:1], step)]
    line = next((ln for _, ln in per_part if ln), None)
    how = "is a mean over its own targets" if source is _own_counts else "is divided by a number of its own"
    ref_text = f"; {reference} {'averages over' if source is _own_counts else 'divides by'} {ref[0]:g}" if ref else ""
    remedy = ("Divide every rank's summed loss by the target (token) count of the global batch, all-reduced across "
              "ranks, and multiply by the number of ranks, which DistributedDataParallel's average divides back out "
              "(the Trainer: average_tokens_across_devices)." if part == "rank" else
              "Sum each micro-batch's loss and divide it by the target (token) count of all the micro-batches of the "
              "step together (counted before the first of them; multiply by the number of micro-batches where the "
              "framework divides by it: accelerator.backward, the Trainer without num_items_in_batch).")
    return Cause(
        text=(f" Each {part}'s loss {how}{(' at ' + at(line)) if line else ''}: "
              f"{', '.join(f'{d:g}' for d, _ in per_part[:6])}{ref_text}. The examples of different {part}es weigh "
              "differently than in one batch.".replace("rankes", "ranks")),
        remedy=remedy, location=line, evidence={"divisors": [d for d, _ in per_part], "reference_divisors": ref})


def _divisors(a_infos: list[dict[str, Any] | None], step: int) -> list[tuple[float, dict | None]]:
    """Per part (rank or micro-batch), the first division of its loss's constant scaling, and its line."""
    out: list[tuple[float, dict | None]] = []
    for info in a_infos:
        for b in _steps(info, step):
            s = b.get("scaling") or {}
            for v, line in zip(s.get("ops") or [], s.get("lines") or [None] * len(s.get("ops") or []), strict=False):
                if 0 < v < 1:
                    out.append((1 / v, line))
                    break
    return out


def _own_counts(a_infos: list[dict[str, Any] | None], step: int) -> list[tuple[float, dict | None]]:
    """Per part, the number of targets its cross-entropy averaged over (a mean with ignored targets), and its line."""
    return [(float(s["own_count"]), s.get("line")) for info in a_infos for b in _steps(info, step)
            if (s := b.get("scaling") or {}).get("reduction") == "mean" and s.get("own_count")]


def sum_all_reduce_cause(a_infos: list[dict[str, Any] | None], named: str | None) -> Cause | None:
    if named != "N":
        return None
    for info in a_infos:
        for c in (info or {}).get("collectives") or []:
            if c.get("kind") == "all_reduce" and c.get("op") == "SUM" and c.get("params"):
                line = c.get("location")
                return Cause(
                    text=(f" The script all-reduces the gradients with SUM at {at(line)} and does not divide by the "
                          "world size (GP705 names the same all-reduce at the step)."),
                    remedy=f"Divide each gradient by the world size after the SUM all-reduce at {at(line)} (or use "
                           "ReduceOp.AVG, or let DistributedDataParallel average).",
                    location=line, evidence={"collective": c})
    return None


def reduction_cause(a_infos: list[dict[str, Any] | None], step: int, named: str | None, kind: str) -> Cause | None:
    """A loss that is a sum over its part where the ratio says the parts' sum was not a mean."""
    if named not in ("1/N", "k", "N"):
        return None
    bw = next((b for b in _steps((a_infos or [None])[0], step) if b.get("scaling")), None)
    if bw is None:
        return None
    s = bw["scaling"]
    line = s.get("line") or bw.get("location")
    factor = 1.0
    for v in s.get("ops") or []:
        factor *= v
    framework = str(((a_infos or [None])[0] or {}).get("framework") or "plain loop")
    if kind == "ranks" and s.get("reduction") == "sum" and named == "1/N":
        return Cause(
            text=(f" Each rank's loss is a sum over its local batch ({s.get('stopped_at')} at {at(line)}) and "
                  "data parallelism (DistributedDataParallel, FSDP) averages the ranks' gradients: each example weighs "
                  "1/N of what it weighs in one process."),
            remedy=(f"Average the loss over the local batch at {at(line)} (reduction=\"mean\"), or multiply the summed "
                    "loss by the world size: DDP divides the sum of the ranks' gradients by N."),
            location=line, evidence={"reduction": s})
    if kind == "accumulation" and named == "k":
        ops = f", multiplied by {factor:.4g}" if abs(factor - 1) > 1e-12 else " with no division"
        by = {"plain loop": "the loop", "transformers": "the Trainer", "lightning": "Lightning",
              "fabric": "Fabric"}.get(framework, framework)
        own = framework in ("plain loop", "fabric")  # the script calls backward() itself; nothing divides for it
        where = bw.get("location") if own else line
        return Cause(
            text=(f" The micro-batch losses are added into one step{ops} by {by} (each a "
                  f"{s.get('reduction') or s.get('stopped_at')} at {at(line)}; backward() at {at(bw.get('location'))}): "
                  "k micro-batches give k times the one-batch gradient (GP601 is the same pattern, judged there from "
                  "the losses)."),
            remedy=(f"Divide each micro-batch loss by the number of micro-batches before backward() at {at(where)}"
                    if own else
                    f"Make the loss at {at(line)} its share of the accumulated batch: divide its sum by the example or "
                    f"token count of the whole accumulated batch (the Trainer passes it as num_items_in_batch to a "
                    "forward that takes **kwargs, and then no longer divides by gradient_accumulation_steps itself), or "
                    "leave the division to the framework (a forward without **kwargs)."),
            location=where, evidence={"reduction": s})
    return None


def divided_twice_cause(a_infos: list[dict[str, Any] | None], step: int, k: int, named: str | None) -> Cause | None:
    if named != "1/k" or k < 2:
        return None
    for b in _steps((a_infos or [None])[0], step):
        s = b.get("scaling") or {}
        lib = list(s.get("in_library") or [])
        hits = [(v, ln, i < len(lib) and lib[i]) for i, (v, ln) in enumerate(zip(s.get("ops") or [], s.get("lines") or [],
                                                                             strict=False)) if abs(v * k - 1) < 1e-6]
        if hits:
            own = [ln for _, ln, inside in hits if ln and not inside]
            line = (own[0] if own and len(own) < len(hits) else next((ln for _, ln, _ in hits if ln), None)) or \
                b.get("location")
            return Cause(
                text=(f" Each micro-batch loss is multiplied by 1/{k} ({len(hits)} time(s) in its graph, at {at(line)}) "
                      f"and the framework or the loop divides again: the {k} micro-batches weigh 1/{k} of one batch "
                      "(GP611 names the same division)."),
                remedy=f"Divide by the number of micro-batches once: remove the division at {at(line)} where the "
                       "framework already scales the loss.",
                location=line, evidence={"scaling": s})
    return None


def divided_twice_graph(a_infos: list[dict[str, Any] | None], step: int) -> dict[str, Any] | None:
    """GP611's measurement on the test setup's recorded losses (checks/steps/accumulation.py divided_twice): the k
    micro-batch losses of `step` each multiplied by exactly 1/k and weighing 1/k of one mean together."""
    from types import SimpleNamespace

    from gradprobe.checks.steps.accumulation import divided_twice
    from gradprobe.checks.steps.facts import LossScaling

    bws = [b for b in _steps((a_infos or [None])[0], step) if b.get("scaling")]
    calls = [SimpleNamespace(scaling=LossScaling(ops=list(s["ops"]), reduction=s.get("reduction"), count=s.get("count"),
                                                 lines=list(s.get("lines") or []),
                                                 in_library=list(s.get("in_library") or [])))
             for s in (b["scaling"] for b in bws)]
    found = divided_twice(calls)  # type: ignore[arg-type]
    if found is None:
        return None
    first = found.scalings[0]
    lib = list(first.in_library)
    own = [ln for i, (v, ln) in enumerate(zip(first.ops, first.lines, strict=False))
           if ln and abs(v * found.k - 1) < 1e-6 and not (i < len(lib) and lib[i])]
    ops = ", ".join(f"{v:.4g}" + (" (inside the library)" if i < len(lib) and lib[i] else "")
                    for i, v in enumerate(first.ops) if v != 1.0)
    return {"k": found.k, "mass": found.mass, "ops": ops, "location": own[0] if own else bws[0].get("location")}


def backward_line(a_infos: list[dict[str, Any] | None], step: int) -> dict | None:
    bw = _steps((a_infos or [None])[0], step)
    return bw[0].get("location") if bw else None
