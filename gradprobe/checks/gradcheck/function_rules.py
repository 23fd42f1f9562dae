"""GP4xx as rule units: what a check of a custom autograd.Function measured, and the rules that read it.

engine.py measures (one forward with Function.apply watched, then per Function: autograd's own check of the
backward's count and shapes, the Jacobians both ways, an intentional rewrite told apart, the backward twice, the
second derivatives when asked) and runs these rules over what it measured.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gradprobe.checks.gradcheck.rewrites import Rewrite
from gradprobe.findings import Finding, Rule, Situation

Loc = dict[str, Any]


@dataclass
class StructureError:
    """autograd refused the backward's result: the wrong number of gradients, or one of the wrong shape."""

    kind: Literal["count", "shape"]
    evidence: dict[str, Any]  # what autograd's message says (expected/returned, input_index/shapes)
    text: str  # autograd's message


@dataclass
class MissingGradient:
    """An input that requires grad for which the backward returns None or zeros."""

    index: int
    returned: Literal["None", "an all-zero gradient"]
    numerical_max_abs: float
    starved: bool = False  # piecewise-constant forward, and the step measured that nothing else trains what feeds it


@dataclass
class WrongGradient:
    """Inputs whose gradient disagrees with finite differences, no intentional rewrite explaining it."""

    inputs: list[int]
    line: Loc | None  # the backward's line that computes the worst one, when it could be told
    mismatches: list[dict[str, Any]] | None = None  # full Jacobians: per input, worst element first (None: fast mode)
    uniform: float | None = None  # one factor for every element that no argument or pass-through explains
    gradcheck_error: str | None = None  # fast mode: torch.autograd.gradcheck's own explanation
    projections: dict[int, dict[str, list[float]]] = field(default_factory=dict)  # fast mode: v^T J u both ways


@dataclass
class FunctionFacts:
    """What the check of one custom Function on its captured inputs measured (GP401-GP409 read it)."""

    name: str
    params_at: Mapping[int, list[str]]  # input position -> the parameters that fed it
    def_loc: Loc | None
    ret_loc: Loc | None
    n_inputs: int
    atol: float
    rtol: float
    converted: bool = False  # the captured inputs were not float64
    structure: StructureError | None = None
    missing: list[MissingGradient] = field(default_factory=list)
    rewrite: Rewrite | None = None
    rewrite_params: dict[int, list[str]] = field(default_factory=dict)  # the parameters of each input judged for a rewrite
    wrong: WrongGradient | None = None
    nondeterministic: list[tuple[int, float]] = field(default_factory=list)  # (input, max diff between two passes)
    second_order_failed: bool = False
    second_order_error: str | None = None
    step: float = 1e-6  # the central-difference step (larger when the Function computes below float64)
    precision: dict[str, Any] | None = None  # the dtype it computes in and the tolerances that follow, when below float64
    perturbed: list[dict[str, Any]] | None = None  # `wrong` was measured at these inputs moved from the recorded call
    largest: float = 0.0  # the largest |analytical - numerical| seen over the full Jacobians compared
    largest_error: float | None = None  # the largest |analytical - numerical| entry measured (full or projected)

    def label(self, j: int) -> str:
        ps = self.params_at.get(j, [])
        return f"input {j}" + (f" ({', '.join(ps[:4])})" if ps else "")

    @property
    def backward_loc(self) -> Loc | None:
        return self.ret_loc or self.def_loc


@dataclass
class DirectCall:
    """A user Function whose forward the user's code called outside apply."""

    function: str
    location: Loc | None


GP401: Rule[FunctionFacts] = Rule(
    code="GP401", name="gradcheck-mismatch", severity="error", rank=18,
    summary="Analytical and numerical Jacobians differ.",
    why="The hand-written backward computes a wrong derivative: training follows wrong gradients, silently. "
        "Intentional rewrites (a gradient reversal or scaling layer, a straight-through surrogate) are GP409, not this.",
    example="d/dz (0.044715 z^3) written as 0.044715 z^2",
    message="{name}.backward is wrong for {inputs}: worst at d(output[{output_index}])/d(input{input_index}{element}) = "
            "{analytical:.6g} analytically but {numerical:.6g} numerically (max abs error {max_abs_error:.3g}).",
    fix="Re-derive the backward for the reported input; compare against torch.autograd.gradcheck on float64 inputs.",
    situations={
        "uniform": Situation(
            when="the backward is one constant factor times the true gradient for every element, and no argument of the "
                 "call nor a pass-through forward explains that factor",
            message="{name}.backward is wrong for {inputs}: worst at d(output[{output_index}])/d(input{input_index}{element}) = "
                    "{analytical:.6g} analytically but {numerical:.6g} numerically (max abs error {max_abs_error:.3g}); "
                    "it is {factor:.6g} x the true gradient for every element: a constant factor is wrong."),
        "fast": Situation(
            when="the Function was too large for full Jacobians: random projections v^T J u were compared",
            message="{name}.backward disagrees with finite differences for {inputs} (fast mode: v^T J u differs)."),
        "perturbed": Situation(
            when="exact at the recorded call, wrong once its weight-like inputs (parameters, or casts/views of one) are "
                 "moved by seeded noise: a backward right only at a special state such as a norm weight of all ones",
            message="{name}.backward is exact at the recorded weights ({recorded}) but wrong at perturbed weights "
                    "({moved}): the gradient of {inputs} is wrong, worst at d(output[{output_index}])/d(input{input_index}"
                    "{element}) = {analytical:.6g} analytically but {numerical:.6g} numerically (max abs error "
                    "{max_abs_error:.3g}).",
            fix="Re-derive the backward for the reported input with the weights general (not 1, not 0): every factor "
                "the forward multiplies by must appear in the gradient."),
        "perturbed_fast": Situation(
            when="as `perturbed`, on a Function too large for full Jacobians (random projections compared)",
            message="{name}.backward is exact at the recorded weights ({recorded}) but disagrees with finite differences "
                    "at perturbed weights ({moved}) for {inputs} (fast mode: v^T J u differs).",
            fix="Re-derive the backward for the reported input with the weights general (not 1, not 0)."),
    },
)

GP402: Rule[FunctionFacts] = Rule(
    code="GP402", name="wrong-gradient-count", severity="error", rank=15,
    summary="backward returns a different number of gradients than forward took inputs.",
    why="backward must return one value per forward input (None for non-tensor or non-differentiable ones); "
        "autograd raises otherwise.",
    example="forward(ctx, x, weight, eps) ... return grad_x, grad_weight",
    message="{name}.backward returns {returned} gradient(s) but forward takes {expected} input(s); "
            "positions {positions} are missing.",
    fix="Return one value per forward input, None for non-differentiable ones: return grad_x, grad_weight, None",
    situations={
        "counted": Situation(
            when="the inputs of the call that was checked were counted (the fix says how many)",
            fix="Return one value per forward input, None for non-differentiable ones (forward takes {n_inputs})."),
    },
)

GP403: Rule[FunctionFacts] = Rule(
    code="GP403", name="wrong-gradient-shape", severity="error", rank=16,
    summary="A returned gradient's shape does not match its input.",
    why="Each gradient must have its input's shape (reduce broadcast dimensions with sum).",
    example="return grad_out  # for a bias of shape [d] broadcast over a batch",
    message="{name}.backward returns a gradient for {input} of shape {returned_shape}, but that input has shape {input_shape}.",
    fix="Reduce over the broadcast dimensions: grad_bias = grad_out.reshape(-1, d).sum(0)",
)

GP404: Rule[FunctionFacts] = Rule(
    code="GP404", name="missing-gradient", severity="error", rank=17,
    summary="backward returns None (or zeros) for an input that requires grad.",
    why="The parameters fed to that input never learn, and autograd raises nothing.",
    example="grad_bias = None ... return grad_x, grad_weight, grad_bias",
    message="{name}.backward returns {returned} for {input}, which requires grad and does change the output "
            "(numerical gradient max |{numerical_max_abs:.3g}|){never_learn}.",
    fix="Compute the gradient when ctx.needs_input_grad[i]: e.g. grad_bias = grad_out.sum(0)",
    situations={
        "piecewise_constant": Situation(
            when="the forward is piecewise constant in that input (its true gradient is zero), yet the step measured that "
                 "the parameters feeding it get no gradient from anywhere else",
            message="{name}.backward returns None for {input}, which requires grad: the forward is piecewise constant "
                    "there (numerical gradient zero), and in the step {params} got no gradient from anywhere else, so they "
                    "never learn.",
            fix="Return a surrogate gradient for this input (straight-through: return grad_out), or detach what feeds "
                "it if those parameters are not meant to learn through it."),
    },
)

GP405: Rule[FunctionFacts] = Rule(
    code="GP405", name="low-precision-check", severity="info", rank=99,
    summary="Inputs were not float64; the check ran on float64 copies.",
    why="Finite differences need double precision to be meaningful.",
    example="float32 activations",
    message="{name}: the captured inputs were not float64; checked on float64 copies.",
    fix="Nothing to fix: informational.",
    situations={
        "computes_lower": Situation(
            when="the Function computes below float64 even on float64 copies (a cast inside): the step and tolerances "
                 "come from that dtype (docs/custom-ops.md gives the formula)",
            message="{name} computes in {dtype} inside even on float64 copies{at}: checked with a finite-difference step "
                    "of {step:.3g} and tolerances from {dtype} (rtol {rtol:.3g}, atol {atol:.3g}; reduction size {n})."),
    },
)

GP406: Rule[list[DirectCall]] = Rule(
    code="GP406", name="forward-called-directly", severity="error", rank=19,
    summary="Function.forward was called instead of Function.apply.",
    why="Calling forward directly records no graph node: the custom backward never runs and inputs get no gradient.",
    example="y = MyFn.forward(None, x, w)",
    message="{name}.forward was called directly instead of {name}.apply: no graph node is recorded and its backward never runs.",
    fix="Call MyFn.apply(x, w)",
    situations={
        "observed": Situation(
            when="the direct call was observed (the fix names the Function)",
            fix="y = {name}.apply(...)  # not {name}.forward(ctx, ...)"),
    },
)

GP407: Rule[FunctionFacts] = Rule(
    code="GP407", name="gradgradcheck-mismatch", severity="warning", rank=99,
    summary="Second derivatives are wrong (checked only when asked for).",
    why="Double backward (gradient penalties, MAML, Hessian-vector products) gets wrong values.",
    example="a backward written with non-differentiable ops or saved .data",
    message="{name}: second derivatives disagree with finite differences (gradgradcheck).",
    fix="Write backward with differentiable torch ops, or mark it once_differentiable.",
)

GP408: Rule[FunctionFacts] = Rule(
    code="GP408", name="nondeterministic-backward", severity="warning", rank=99,
    summary="Two backward passes on the same input differ.",
    why="Gradients that change run to run make training irreproducible and gradcheck meaningless.",
    example="backward uses torch.rand or index_add_ with atomics",
    message="{name}.backward gave different gradients for {input} on two identical passes (max diff {max_diff:.3g}).",
    fix="Make backward deterministic (torch.use_deterministic_algorithms(True) to find the op).",
)

GP409: Rule[FunctionFacts] = Rule(
    code="GP409", name="intentional-gradient-rewrite", severity="info", rank=99,
    summary="backward deliberately differs from the true gradient: a uniform reversal or scaling, or a surrogate through "
            "a piecewise-constant forward.",
    why="Gradient-reversal layers (domain adaptation), gradient scaling and straight-through estimators rewrite the gradient "
        "on purpose; the check measures that the rewrite is a single factor for every element (and names the scalar the call "
        "received), or that the forward is piecewise constant, so it is not reported as a wrong derivative.",
    example="class RevGrad(Function): backward returns -alpha * grad_out",
    message="{name}.backward is {factor:.6g} x the true gradient {over} of {inputs}: {kind}, by design.",
    fix="Nothing to fix if the rewrite is intended.",
    situations={
        "scaled": Situation(
            when="one factor, which an argument of the call or a pass-through forward explains: a reversal or a scaling",
            fix="Nothing to fix if {kind} is intended."),
        "surrogate": Situation(
            when="a surrogate gradient through a piecewise-constant forward (a straight-through estimator)",
            message="{name}.backward passes a surrogate gradient for {input} through a piecewise-constant forward "
                    "(its true gradient is zero almost everywhere): a straight-through estimator, by design.",
            fix="Nothing to fix if the surrogate is intended (straight-through estimator)."),
    },
)

# the order findings come in for one Function
FUNCTION_RULES: tuple[Rule[FunctionFacts], ...] = (GP405, GP402, GP403, GP404, GP409, GP401, GP408, GP407)


@GP405.detector
def low_precision(facts: FunctionFacts) -> Iterator[Finding]:
    p = facts.precision
    if p is not None:
        at = f" ({p['at']['file'].rsplit('/', 1)[-1]}:{p['at']['line']})" if p.get("at") else ""
        yield GP405.finding("computes_lower", name=facts.name, dtype=p["compute_dtype"], at=at, step=p["step"],
                            rtol=p["rtol"], atol=p["atol"], n=p["reduction_size"], parameters=[facts.name],
                            location=p.get("at"), evidence={"function": facts.name, **p})
    elif facts.converted:
        yield GP405.finding(name=facts.name, parameters=[facts.name], evidence={"function": facts.name})


@GP402.detector
def wrong_count(facts: FunctionFacts) -> Iterator[Finding]:
    s = facts.structure
    if s is None or s.kind != "count":
        return
    ev = s.evidence
    positions = ", ".join(str(i) for i in range(ev["returned"], ev["expected"])) or "?"
    ps = sorted({p for ns in facts.params_at.values() for p in ns})
    yield GP402.finding("counted", name=facts.name, returned=ev["returned"], expected=ev["expected"], positions=positions,
                        n_inputs=facts.n_inputs, parameters=[facts.name, *ps], location=facts.backward_loc,
                        evidence={"function": facts.name, **ev, "error": s.text[:500]})


@GP403.detector
def wrong_shape(facts: FunctionFacts) -> Iterator[Finding]:
    s = facts.structure
    if s is None or s.kind != "shape":
        return
    ev = s.evidence
    ps = facts.params_at.get(ev.get("input_index", -1), [])
    yield GP403.finding(name=facts.name, input=facts.label(ev.get("input_index", 0)),
                        returned_shape=ev.get("returned_shape", "?"), input_shape=ev.get("input_shape", "?"),
                        parameters=[facts.name, *ps], location=facts.backward_loc,
                        evidence={"function": facts.name, **ev, "error": s.text[:500]})


@GP404.detector
def missing_gradient(facts: FunctionFacts) -> Iterator[Finding]:
    for m in facts.missing:
        ps = facts.params_at.get(m.index, [])
        if m.starved:
            yield GP404.finding("piecewise_constant", name=facts.name, input=facts.label(m.index), params=", ".join(ps[:4]),
                                parameters=[facts.name, *ps], location=facts.backward_loc,
                                evidence={"function": facts.name, "input_index": m.index, "returned": "None",
                                          "numerical_max_abs": 0.0, "no_gradient_in_step": ps})
            continue
        yield GP404.finding(name=facts.name, returned=m.returned, input=facts.label(m.index),
                            numerical_max_abs=m.numerical_max_abs, never_learn=f": {', '.join(ps)} never learn" if ps else "",
                            parameters=[facts.name, *ps], location=facts.backward_loc,
                            evidence={"function": facts.name, "input_index": m.index, "returned": m.returned,
                                      "numerical_max_abs": m.numerical_max_abs})


@GP409.detector
def intentional_rewrite(facts: FunctionFacts) -> Iterator[Finding]:
    rw = facts.rewrite
    if rw is None:
        return
    name = facts.name
    for j in rw.surrogate:
        yield GP409.finding("surrogate", name=name, input=facts.label(j),
                            parameters=[name, *facts.rewrite_params.get(j, [])], location=facts.def_loc,
                            evidence={"function": name, "rewrite": "surrogate", "input_index": j})
    if rw.scaled and rw.recognised and rw.factor is not None:
        c = rw.factor
        kind = "a gradient reversal" if c < 0 else "a gradient scaling"
        ps = [p for j in rw.scaled for p in facts.rewrite_params.get(j, [])]
        yield GP409.finding("scaled", name=name, factor=c, over="for every element" if rw.full else "in every random projection",
                            inputs=", ".join(facts.label(j) for j in rw.scaled), kind=kind,
                            parameters=[name, *ps], location=facts.def_loc,
                            evidence={"function": name, "rewrite": "reversal" if c < 0 else "scaling", "factor": c,
                                      "inputs": rw.scaled})


@GP401.detector
def gradcheck_mismatch(facts: FunctionFacts) -> Iterator[Finding]:
    w = facts.wrong
    if w is None:
        return
    name = facts.name
    where = w.line or facts.backward_loc
    if w.mismatches is None and facts.perturbed:
        yield GP401.finding("perturbed_fast", name=name, inputs=", ".join(facts.label(j) for j in w.inputs),
                            recorded=_recorded(facts.perturbed), moved=_moved(facts.perturbed),
                            parameters=[name, *(p for j in w.inputs for p in facts.params_at.get(j, []))], location=where,
                            evidence={"function": name, "mode": "fast", "perturbed": facts.perturbed,
                                      "projections": {j: w.projections[j] for j in w.inputs}})
        return
    if w.mismatches is None:
        yield GP401.finding("fast", name=name, inputs=", ".join(facts.label(j) for j in w.inputs),
                            parameters=[name, *(p for j in w.inputs for p in facts.params_at.get(j, []))], location=where,
                            evidence={"function": name, "mode": "fast", "gradcheck_error": (w.gradcheck_error or "")[-2000:],
                                      "projections": {j: w.projections[j] for j in w.inputs}})
        return
    worst = w.mismatches[0]
    if facts.perturbed:
        yield _perturbed(facts, w, worst, where)
        return
    yield GP401.finding(
        "uniform" if w.uniform else None, name=name, inputs=", ".join(m["input"] for m in w.mismatches),
        output_index=worst["output_index"], input_index=worst["input_index"], element=worst["element"],
        analytical=worst["analytical"], numerical=worst["numerical"], max_abs_error=worst["max_abs_error"], factor=w.uniform,
        parameters=[name, *(p for m in w.mismatches for p in m["parameters"])], location=where,
        evidence={"function": name, "mismatches": w.mismatches, "atol": facts.atol, "rtol": facts.rtol,
                  **({"uniform_factor": w.uniform} if w.uniform else {})})


def _recorded(states: list[dict[str, Any]]) -> str:
    return "; ".join(f"{s['input']} {s['recorded']}" for s in states)


def _moved(states: list[dict[str, Any]]) -> str:
    return "; ".join(f"{s['input']} moved by {s['perturbed_by']}" for s in states)


def _perturbed(facts: FunctionFacts, w: WrongGradient, worst: dict[str, Any], where: Loc | None) -> Finding:
    assert facts.perturbed is not None and w.mismatches is not None
    return GP401.finding(
        "perturbed", name=facts.name, inputs=", ".join(m["input"] for m in w.mismatches),
        recorded=_recorded(facts.perturbed), moved=_moved(facts.perturbed), output_index=worst["output_index"],
        input_index=worst["input_index"], element=worst["element"], analytical=worst["analytical"],
        numerical=worst["numerical"], max_abs_error=worst["max_abs_error"],
        parameters=[facts.name, *(p for m in w.mismatches for p in m["parameters"])], location=where,
        evidence={"function": facts.name, "mismatches": w.mismatches, "atol": facts.atol, "rtol": facts.rtol,
                  "exact_at_recorded_inputs": True, "perturbed": facts.perturbed})


@GP408.detector
def nondeterministic(facts: FunctionFacts) -> Iterator[Finding]:
    for j, diff in facts.nondeterministic:
        yield GP408.finding(name=facts.name, input=facts.label(j), max_diff=diff, parameters=[facts.name],
                            location=facts.def_loc, evidence={"function": facts.name, "input_index": j})


@GP407.detector
def second_order(facts: FunctionFacts) -> Iterator[Finding]:
    if facts.second_order_failed:
        yield GP407.finding(name=facts.name, parameters=[facts.name], location=facts.def_loc,
                            evidence={"function": facts.name, "error": facts.second_order_error})


@GP406.detector
def forward_called_directly(calls: list[DirectCall]) -> Iterator[Finding]:
    for c in calls:
        yield GP406.finding("observed", name=c.function, parameters=[c.function], location=c.location,
                            evidence={"function": c.function})
