"""GP118, GP119, GP120: torch's own errors raised by the user's step, with what torch does not say.

torch's message is only the trigger; what the finding states is measured by identity in the traced step
(checks/trace/recording.py keeps the two facts read here):

    GP118 leaf-modified-in-place   "a leaf Variable that requires grad is being used in an in-place operation": the
                                   in-place op that raised, the parameter it modified (by identity, the base of a view
                                   included) and the user's line; after backward() it was an update meant for
                                   `torch.no_grad()` (a clamp, a re-normalisation), before it an op in the forward.
    GP119 graph-used-after-free    "Trying to backward through the graph a second time": the graph nodes the failing
                                   backward() reached that an earlier backward() had already run through (and freed),
                                   where each was created and where the new graph used it; a line that ran again and fed
                                   on its own earlier output is a tensor carried across iterations.
    GP120 custom-backward-bad-shape "Function XBackward returned an invalid gradient at index i": the Function (among
                                   those the step applied), the forward argument at that index and the parameter passed
                                   there (by identity), the shapes, the backward's return line and the apply() line.

When the extra measurement finds nothing (the op was not seen, no node of an earlier backward is reached), no claim is
made: the step's error stays GP308 / GP100 (checks/trace/backward_rules.py).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any


from gradprobe.checks.core.function_calls import backward_lines
from gradprobe.checks.core.rule_text import line_of
from gradprobe.findings import Finding, Rule, Situation, run_rules

if TYPE_CHECKING:
    from gradprobe.checks.trace.recording import GradTracer

Loc = dict[str, Any]

LEAF_INPLACE = re.compile(r"a (view of a )?leaf Variable that requires grad (is being|has been) used in an in-place operation")
SECOND_BACKWARD = "Trying to backward through the graph a second time"
BAD_GRADIENT = re.compile(r"Function (\w+)Backward returned an invalid gradient at index (\d+) - got (\[[^\]]*\]) but "
                          r"expected shape compatible with (\[[^\]]*\])")
MAX_NODES = 200_000  # graph nodes walked per graph (a bound, not a sample: larger graphs are not compared)

GP118: Rule[TorchErrorFacts] = Rule(
    code="GP118", name="leaf-modified-in-place", severity="error", rank=29,
    summary="An in-place op modified a parameter (a leaf that requires grad) while autograd was recording; torch refused it.",
    why="torch raises \"a leaf Variable that requires grad is being used in an in-place operation\" without naming the "
        "tensor: the finding names the parameter (found by identity, the base of a view included) and the line. An "
        "update of the weights (a clamp, a projection, a manual SGD step) must not be recorded by autograd.",
    example="loss.backward(); optimizer.step(); for p in model.parameters(): p.clamp_(-0.01, 0.01)  # WGAN clipping",
    message="`{code}` at {line} modifies parameter {name} (shape {shape}) in place (`{op}`) while autograd records: torch "
            "refuses an in-place op on a leaf that requires grad ({first}).",
    fix="Run the in-place update without recording it: `with torch.no_grad(): {code}` (or apply it to the parameter's "
        ".data).",
    situations={
        "update": Situation(
            when="the op ran after backward(): an update of the weights (a clamp, a re-normalisation, a manual step)",
            message="`{code}` at {line} modifies parameter {name} (shape {shape}) in place (`{op}`) after backward(), outside "
                    "torch.no_grad(): torch refuses an in-place op on a leaf that requires grad ({first}).",
            fix="An update of the weights must not be recorded: wrap line {lineno} as `with torch.no_grad(): {code}` "
                "(or apply it to the parameter's .data, as older examples do)."),
        "forward": Situation(
            when="the op ran before backward(), in the forward or the loss",
            message="`{code}` at {line} modifies parameter {name} (shape {shape}) in place (`{op}`) before backward(), while the "
                    "forward is recorded: torch refuses an in-place op on a leaf that requires grad ({first}).",
            fix="Do not modify the parameter inside the forward: compute an out-of-place value from it at line {lineno} "
                "(w = p.clamp(...), then use w), or, if the weights are meant to be projected, do it once per step "
                "after optimizer.step() under `with torch.no_grad():`."),
    },
)

GP119: Rule[TorchErrorFacts] = Rule(
    code="GP119", name="graph-used-after-free", severity="error", rank=31,
    summary="backward() reached graph nodes an earlier backward() had already run through and freed.",
    why="torch raises \"Trying to backward through the graph a second time\" and suggests retain_graph=True, which is "
        "rarely the fix: a tensor made before the earlier backward() (a hidden state carried across iterations, a "
        "running total of losses, a GAN's fake batch not detached for the discriminator) feeds the new loss. The "
        "finding names that tensor's op, where it was made and where the new graph used it, measured on the graphs.",
    example="h = torch.tanh(cell(x) + h)  # h carried into the next iteration without h.detach()",
    message="backward() at {line} ran into the graph that the backward() at {first_line} had already run through and "
            "freed: the tensor made by `{op}` at {made_at}{shape} went into the earlier loss at {first_used_at}, and "
            "{used_at} uses it again.",
    fix="Keep the earlier backward() out of that tensor's graph: use its .detach() at {first_used_at} (a discriminator "
        "loss on a generator's output: D(fake.detach())); pass retain_graph=True to the backward() at {first_line} "
        "only if both losses must really reach what made the tensor.",
    situations={
        "carried": Situation(
            when="the line that made the reused tensor ran again and fed on its own earlier output: a tensor carried "
                 "across iterations (a recurrent hidden state, a running total)",
            message="backward() at {line} ran into the graph the backward() at {first_line} had already freed: the "
                    "tensor made by `{op}` at {made_at} is carried into the next iteration, where {used_at} uses it "
                    "again{shape}; its graph from the earlier iteration was freed.",
            fix="Detach the carried tensor at the start of each iteration (`h = h.detach()` before {used_at}), so each "
                "iteration's backward() runs through its own graph only (truncated backpropagation through time); "
                "retain_graph=True would instead grow the graph without bound."),
        "held": Situation(
            when="the model keeps the tensor in an attribute from one call of the step to the next (found after one "
                 "traced step, confirmed by a second call that raised)",
            message="The model keeps a tensor of the step's graph in {held} between calls: the tensor made by `{op}` at "
                    "{made_at}{shape} still belongs to the graph that backward() at {first_line} freed, and the next "
                    "call's backward() at {line} ran into it through that tensor.",
            fix="Store it detached where the model keeps it (the value assigned to {held} at {made_at}: `.detach()` it), "
                "or reset it at the start of each call; retain_graph=True would instead grow the graph without bound."),
    },
)


GP120: Rule[TorchErrorFacts] = Rule(
    code="GP120", name="custom-backward-bad-shape", severity="error", rank=32,
    summary="A custom autograd.Function's backward returned a gradient whose shape does not fit its input; torch refused it.",
    why="torch raises \"Function XBackward returned an invalid gradient at index i - got [..] but expected shape compatible "
        "with [..]\" and names neither the input nor the line: the finding names the forward argument at that index, the "
        "parameter passed there (by identity), the backward's return line and the apply() call it came from.",
    example="def backward(ctx, g): x, w = ctx.saved_tensors; return g * w, g * x  # w's gradient keeps the batch dim",
    message="{function}.backward at {back_line} returned a gradient of shape {got} for input {index} (`{arg}`{param}) of "
            "{function}.apply() at {apply_line}, whose shape is {expected}: torch refuses it ({first}).",
    fix="Return, at {back_line}, a gradient for `{arg}` of its shape {expected}: sum over the dimensions the forward "
        "broadcast it along (grad.sum(0) for a per-feature weight), or reshape it; return None for an input that needs "
        "no gradient.",
)


@dataclass
class Reused:
    """A node of an earlier backward's graph that the failing backward reached, and the new node that used it."""

    op: str
    made_at: Loc | None
    used_at: Loc | None
    shape: list[int] | None
    carried: bool  # the line that made it made a node of the new graph that fed on it
    first_used_at: Loc | None = None  # where the earlier graph used it (where a .detach() keeps that backward out)
    node: int = 0  # id() of the node (alive while the earlier graph is kept)


@dataclass
class TorchErrorFacts:
    """What the traced step measured about torch's error."""

    error: BaseException | None
    after_backward: bool = False
    leaf: tuple[str, list[int], str, Loc | None] | None = None  # (parameter name, shape, op, user line of the op)
    failing_at: Loc | None = None
    first_at: Loc | None = None
    reused: list[Reused] = field(default_factory=list)
    bad_gradient: dict[str, Any] | None = None  # GP120: the Function, the input, the shapes, the lines
    # id(grad_fn) -> the model attribute holding that tensor across calls (checks/trace/carried_state.py)
    held: dict[int, str] = field(default_factory=dict)


def _first(error: BaseException | None) -> str:
    return str(error).splitlines()[0].split(" Hint:")[0].rstrip(".") if error is not None else ""


def _walk(root: Any, seen: dict[int, Any]) -> None:
    """Every node reachable from `root`, kept alive in `seen` (ids stay valid while compared)."""
    stack = [root] if root is not None else []
    while stack and len(seen) < MAX_NODES:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        stack.extend(n for n, _ in getattr(node, "next_functions", ()) if n is not None)


def _shape(node: Any) -> list[int] | None:
    try:
        return list(node._input_metadata[0].shape)
    except (AttributeError, IndexError, RuntimeError, TypeError):
        return None


def _same_line(a: Loc | None, b: Loc | None) -> bool:
    return bool(a and b and a["file"] == b["file"] and a["line"] == b["line"])


def reused_nodes(tracer: GradTracer) -> tuple[int, list[Reused]]:
    """The failing backward call's index, and the nodes of earlier backward graphs its graph reached (by identity)."""
    calls = tracer.backward_calls
    failing = next((i for i, c in enumerate(calls) if "error" in c), None)
    if failing is None or failing >= len(tracer.backward_roots) or failing == 0:
        return -1, []
    old: dict[int, Any] = {}
    for root in tracer.backward_roots[:failing]:
        _walk(root, old)
    new: dict[int, Any] = {}
    _walk(tracer.backward_roots[failing], new)
    made = tracer.grad_fn_loc
    found: dict[int, Reused] = {}
    for nid, node in new.items():
        if nid in old:
            continue
        for child, _ in getattr(node, "next_functions", ()):
            if child is None or id(child) not in old or id(child) in found or type(child).__name__ == "AccumulateGrad":
                continue
            made_at, used_at = made.get(id(child)), made.get(nid)
            op = re.sub(r"Backward\d*$", "", type(child).__name__).lower() or type(child).__name__
            found[id(child)] = Reused(op, made_at, used_at, _shape(child), _same_line(made_at, used_at), node=id(child))
    for oid, node in old.items():  # where the earlier graph used each reused node (its consumers there)
        for child, _ in getattr(node, "next_functions", ()):
            r = found.get(id(child)) if child is not None else None
            if r is not None and r.first_used_at is None and oid in made and not _same_line(made[oid], r.made_at):
                r.first_used_at = made[oid]
    return failing, [r for r in found.values() if r.made_at is not None or r.used_at is not None]


def measure_torch_error(tracer: GradTracer, error: BaseException | None, after_backward: bool) -> TorchErrorFacts:
    """The facts GP118/GP119 read; `error` is the step's (or backward's) exception."""
    facts = TorchErrorFacts(error, after_backward=after_backward)
    text = str(error) if error is not None else ""
    if LEAF_INPLACE.search(text) and tracer.leaf_inplace is not None:
        t, op, at = tracer.leaf_inplace
        names = tracer.names.get(id(t))
        facts.leaf = (names[0] if names else f"<tensor {tuple(t.shape)}>", list(t.shape), op, at)
    elif (m := BAD_GRADIENT.search(text)) is not None:
        facts.bad_gradient = _bad_gradient(tracer, m)
    elif SECOND_BACKWARD in text:
        failing, facts.reused = reused_nodes(tracer)
        if facts.reused:
            facts.failing_at = tracer.backward_calls[failing].get("location")
            facts.first_at = tracer.backward_calls[failing - 1].get("location")
    return facts


@GP118.detector
def detect_leaf_inplace(facts: TorchErrorFacts) -> Iterator[Finding]:
    if facts.leaf is None or facts.leaf[3] is None:
        return
    name, shape, op, at = facts.leaf
    assert at is not None
    yield GP118.finding("update" if facts.after_backward else "forward", parameters=[name], location=at,
                        evidence={"parameter": name, "shape": shape, "op": op, "error": str(facts.error)[:2000],
                                  "after_backward": facts.after_backward},
                        code=at.get("code", "").split("  #")[0].strip(), line=line_of(at), lineno=at["line"], name=name,
                        shape=shape, op=op,
                        first=_first(facts.error))


def _line(loc: Loc | None, otherwise: str) -> str:
    return line_of(loc) if loc else otherwise


@GP119.detector
def detect_reused_graph(facts: TorchErrorFacts) -> Iterator[Finding]:
    if not facts.reused:
        return
    held = [r for r in facts.reused if r.node in facts.held]  # the tensor the model keeps, by identity
    carried = held or [r for r in facts.reused if r.carried]
    head = (carried or facts.reused)[0]
    where = (head.made_at if carried else head.first_used_at or head.made_at) or head.used_at or head.first_used_at
    evidence: dict[str, Any] = {"error": str(facts.error)[:2000], "backward_called_at": facts.failing_at,
                                "earlier_backward_at": facts.first_at,
                                "reused": [{"op": r.op, "made_at": r.made_at, "used_at": r.used_at,
                                            "earlier_use_at": r.first_used_at, "shape": r.shape, "carried": r.carried}
                                           for r in facts.reused[:8]]}
    paths = sorted({facts.held[r.node] for r in held})
    if held:
        evidence["held_by_model"] = paths
    situation = "held" if held else "carried" if carried else None
    yield GP119.finding(situation, location=where, evidence=evidence, held=", ".join(paths[:3]),
                        line=_line(facts.failing_at, "an unrecorded line"),
                        first_line=_line(facts.first_at, "an unrecorded line"),
                        op=head.op, first_used_at=_line(head.first_used_at, "the earlier loss"),
                        made_at=_line(head.made_at, "an unrecorded line"),
                        used_at=_line(head.used_at, "a later line"),
                        shape=f" (shape {head.shape})" if head.shape else "")


def _bad_gradient(tracer: GradTracer, m: re.Match[str]) -> dict[str, Any] | None:
    """The Function the message names, among those the step applied (by class), and what was passed at that index."""
    cls = next((c for c in tracer.apply_watch.calls if c.__name__ == m.group(1)), None)
    if cls is None:
        return None
    def_loc, ret_loc = backward_lines(cls)
    back_loc = ret_loc or def_loc
    if back_loc is None:
        return None
    index = int(m.group(2))
    try:
        forward = vars(cls)["forward"]
        args = list(inspect.signature(getattr(forward, "__func__", forward)).parameters)[1:]  # after ctx
    except (KeyError, TypeError, ValueError):  # a forward inherited or not introspectable: the index alone
        args = []
    entry = tracer.apply_watch.calls[cls]
    return {"function": cls.__name__, "index": index, "arg": args[index] if index < len(args) else f"input {index}",
            "params": list(entry.get("params_at", {}).get(index, [])), "got": m.group(3), "expected": m.group(4),
            "backward_at": back_loc, "apply_at": entry.get("location")}


@GP120.detector
def detect_bad_gradient(facts: TorchErrorFacts) -> Iterator[Finding]:
    b = facts.bad_gradient
    if b is None:
        return
    param = f", parameter {', '.join(b['params'][:4])}" if b["params"] else ""
    yield GP120.finding(parameters=[b["function"], *b["params"]], location=b["backward_at"],
                        evidence={"error": str(facts.error)[:2000], **b},
                        function=b["function"], back_line=line_of(b["backward_at"]), got=b["got"], index=b["index"],
                        arg=b["arg"], param=param, apply_line=_line(b["apply_at"], "an unrecorded line"),
                        expected=b["expected"], first=_first(facts.error))


def held_graph_findings(tracer: GradTracer, error: BaseException, held: dict[int, str]) -> list[Finding]:
    """GP119 for a second call of the step that ran into the graph a tensor the model keeps (id(grad_fn) -> attribute)
    belongs to (checks/trace/carried_state.py)."""
    facts = measure_torch_error(tracer, error, after_backward=False)
    facts.held = held
    return run_rules((GP119,), facts)


def torch_error_findings(tracer: GradTracer, error: BaseException | None, after_backward: bool) -> list[Finding]:
    """GP118/GP119/GP120 for torch's error where the measurement found what torch does not say; [] otherwise."""
    return run_rules((GP118, GP119, GP120), measure_torch_error(tracer, error, after_backward))
