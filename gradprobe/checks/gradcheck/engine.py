"""GP4xx: check every custom autograd.Function the model really calls, on the inputs it really gets.

Discovery runs one forward with `Function.apply` watched, keeping a float64
copy of the first inputs each Function received and which parameters fed each
input position. Each distinct Function is then checked once: the backward's
structure (count, shapes, missing gradients) through autograd itself, and the
analytical Jacobian against central differences, element by element, so the
finding can name the input, the output and the worst element in words.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch.autograd.function import Function

from gradprobe.checks.gradcheck import backward_lines, rewrites
from gradprobe.checks.gradcheck import op_precision, op_states
from gradprobe.checks.gradcheck.reference import reference_report
from gradprobe.checks.core.function_calls import ApplyWatch, inside_custom_function
from gradprobe.checks.core.step import call_model, param_names
from gradprobe.checks.gradcheck.function_rules import (
    FUNCTION_RULES,
    GP406,
    DirectCall,
    FunctionFacts,
    MissingGradient,
    StructureError,
    WrongGradient,
)
from gradprobe.checks.gradcheck.jacobians import (
    MAX_INPUT_ELEMS,
    MAX_OUTPUT_ELEMS,
    Loc,
    analytical_jacobians,
    as_double,
    flat_out,
    numerical_jacobian,
    parse_structure_error,
    shrink,
)
from gradprobe.checks.core.function_calls import backward_lines as backward_source
from gradprobe.checks.core.torchcompat import GradcheckError, allocation_failure
from gradprobe.checks.core.watches import patched
from gradprobe.checks.trace.backward_rules import GP308
from gradprobe.findings import Finding, run_rules
from gradprobe.outcomes import GP113, resource_limit_finding
from gradprobe.report import make_report
from gradprobe.verdict import Cause, add_not_run, add_verified, lift
from gradprobe.userframes import UserCode, location

if TYPE_CHECKING:
    from gradprobe.loading import Loaded

__all__ = ["ApplyWatch", "DirectForwardWatch", "check_function", "discover", "gradcheck_findings", "gradcheck_report",
           "run_gradcheck"]

FnLike = Callable[..., Any]


def _measure_structure(facts: FunctionFacts, exc: Exception, user: UserCode | None) -> list[Finding]:
    """autograd refused the backward (its count or shapes: a fact for the rules); anything else it raised is reported
    here: a memory limit (resource-limit) or the backward's own error."""
    text = str(exc)
    parsed = parse_structure_error(text)
    if parsed:
        kind, ev = parsed
        facts.structure = StructureError("count" if kind == "count" else "shape", ev, text)
        return []
    name = facts.name
    where = (user.innermost_of_traceback(exc) if user else None) or facts.def_loc
    if (limit := allocation_failure(exc)) is not None:  # a memory limit, not the custom backward's error
        return [resource_limit_finding(
            f"running {name}.backward on float64 copies of its captured inputs (gradcheck)", limit, location=where,
            evidence={"function": name, "traceback": user.trimmed_traceback(exc) if user else text})]
    tb = user.trimmed_traceback(exc) if user else text
    return [GP308.finding("custom_backward", parameters=[name], location=where, evidence={"function": name, "traceback": tb},
                          function=name, error=f"{type(exc).__name__}: {text[:300]}")]


def _wrong_line(cls: type[Function], facts: FunctionFacts, inputs64: tuple, req: list[int], worst: int) -> Loc | None:
    if facts.precision is None:
        line = backward_lines.wrong_gradient_line(cls, inputs64, req, worst)
    else:  # computing below float64: its step, and the check's own tolerances for what counts as the same value
        line = backward_lines.wrong_gradient_line(cls, inputs64, req, worst, facts.step, facts.rtol, facts.atol)
    d = facts.def_loc
    return location(d["file"], line, d["function"]) if d and line else None


def _explained(rewrite: rewrites.Rewrite) -> set[int]:
    return set(rewrite.surrogate) | (set(rewrite.scaled) if rewrite.recognised else set())


def _measure_fast(facts: FunctionFacts, cls: type[Function], fn: FnLike, inputs64: tuple, req: list[int],
                  explain: bool = True) -> None:
    """Random projections v^T J u, for Functions too large for full Jacobians. `explain`: also torch's own fast
    gradcheck, whose error message (it computes the full Jacobians on failure) the evidence quotes."""
    atol, rtol = facts.atol, facts.rtol
    gradcheck_error = None
    try:  # raise_exception=False would return False on exactly this error and drop PyTorch's explanation
        if explain:
            torch.autograd.gradcheck(fn, inputs64, eps=facts.step, atol=atol, rtol=rtol, fast_mode=True, raise_exception=True)
    except GradcheckError as exc:
        gradcheck_error = str(exc)
    # torch's fast mode misses small elementwise errors (a dropped factor in one term): our own projections too
    projected, through = rewrites.projected_jacobians(fn, inputs64, req, flat_out, eps=facts.step)
    facts.largest_error = max((float((a - n).abs().max()) for a, n in projected.values() if a.numel()), default=None)
    wrong = [j for j, (a, n) in projected.items() if bool(((a - n).abs() > atol + rtol * n.abs()).any())]
    if gradcheck_error is None and not wrong:
        return
    wrong = wrong or req
    rewrite = rewrites.classify(fn, inputs64, projected, flat_out, atol, rtol, through)
    rewrite.full = False
    facts.rewrite, facts.rewrite_params = rewrite, {j: facts.params_at.get(j, []) for j in wrong}
    wrong = [j for j in wrong if j not in _explained(rewrite)]
    if wrong:
        facts.wrong = WrongGradient(
            wrong, _wrong_line(cls, facts, inputs64, req, wrong[0]), gradcheck_error=gradcheck_error,
            projections={j: {"analytical": projected[j][0].flatten().tolist(), "numerical": projected[j][1].flatten().tolist()}
                         for j in wrong})


def _judge_input(facts: FunctionFacts, j: int, ana: torch.Tensor | None, numerical: torch.Tensor, shape: tuple,
                 starved: frozenset[str]) -> dict[str, Any] | None:
    """One input's analytical Jacobian against its numerical one: a missing gradient (recorded), a mismatch (returned)."""
    atol, rtol = facts.atol, facts.rtol
    num_nonzero = bool((numerical.abs() > atol).any())
    ps = facts.params_at.get(j, [])
    if ana is None and not num_nonzero and ps and set(ps) <= starved:
        # exact for a piecewise-constant forward (round, sign), yet the step measured that nothing else
        # trains what feeds this input: a straight-through surrogate was meant, or the input should not need grad
        facts.missing.append(MissingGradient(j, "None", 0.0, starved=True))
        return None
    if ana is None or (not bool((ana != 0).any()) and num_nonzero):
        if num_nonzero:
            what: Literal["None", "an all-zero gradient"] = "None" if ana is None else "an all-zero gradient"
            facts.missing.append(MissingGradient(j, what, numerical.abs().max().item()))
        return None
    diff = (ana - numerical).abs()
    facts.largest = max(facts.largest, float(diff.max()) if diff.numel() else 0.0)
    excess = diff - (atol + rtol * numerical.abs())
    if not bool((excess > 0).any()):
        return None
    k, i = divmod(int(torch.argmax(excess)), numerical.shape[1])
    elem = [int(e) for e in torch.unravel_index(torch.tensor(i), shape)] if shape else []
    return {"input_index": j, "input": facts.label(j), "parameters": ps, "output_index": k, "element": elem,
            "analytical": ana[k, i].item(), "numerical": numerical[k, i].item(),
            "max_abs_error": diff.max().item(),
            "max_rel_error": (diff / numerical.abs().clamp_min(1e-12)).max().item()}


def _measure_full(facts: FunctionFacts, cls: type[Function], fn: FnLike, inputs64: tuple, req: list[int],
                  starved: frozenset[str]) -> list[torch.Tensor | None]:
    """Full Jacobians both ways, per input; returns the analytical ones (the determinism check repeats them)."""
    analytical = analytical_jacobians(fn, inputs64, req)
    mismatches = []
    jacobians: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for pos, j in enumerate(req):
        numerical = numerical_jacobian(fn, inputs64, j, eps=facts.step)
        ana = analytical[pos]
        if ana is not None:
            jacobians[j] = (ana, numerical)
        m = _judge_input(facts, j, ana, numerical, tuple(inputs64[j].shape), starved)
        if m is not None:
            mismatches.append(m)
    facts.largest_error = max((float((a - n).abs().max()) for a, n in jacobians.values() if a.numel()), default=None)
    rewrite = rewrites.Rewrite()
    if mismatches:
        through = {j: rewrites.is_identity(num) for j, (_, num) in jacobians.items()}
        rewrite = rewrites.classify(fn, inputs64, jacobians, flat_out, facts.atol, facts.rtol, through)
        facts.rewrite, facts.rewrite_params = rewrite, {m["input_index"]: m["parameters"] for m in mismatches}
        mismatches = [m for m in mismatches if m["input_index"] not in _explained(rewrite)]
    if mismatches:
        mismatches.sort(key=lambda m: -m["max_abs_error"])
        uniform = rewrite.factor if rewrite.scaled and not rewrite.recognised else None
        facts.wrong = WrongGradient([m["input_index"] for m in mismatches],
                                    _wrong_line(cls, facts, inputs64, req, mismatches[0]["input_index"]),
                                    mismatches=mismatches, uniform=uniform)
    return analytical


def _measure_repeat(facts: FunctionFacts, fn: FnLike, inputs64: tuple, req: list[int],
                    analytical: list[torch.Tensor | None], check_second_order: bool) -> None:
    """The same backward twice (determinism), and the second derivatives when asked."""
    again = analytical_jacobians(fn, inputs64, req)
    for pos, j in enumerate(req):
        a1, a2 = analytical[pos], again[pos]
        if a1 is not None and a2 is not None and not torch.equal(a1, a2):
            facts.nondeterministic.append((j, (a1 - a2).abs().max().item()))
    if check_second_order:
        try:
            ok = torch.autograd.gradgradcheck(fn, inputs64, eps=facts.step, atol=facts.atol, rtol=facts.rtol,
                                              raise_exception=False)
        except Exception as exc:
            ok, facts.second_order_error = False, f"{type(exc).__name__}: {exc}"[:300]
        facts.second_order_failed = not ok


def _input_facts(inputs: tuple, params_at: Mapping[int, list[str]]) -> list[dict[str, Any]]:
    return [{"index": i, "shape": list(a.shape), "dtype": str(a.dtype), "requires_grad": a.requires_grad,
             "parameters": params_at.get(i, [])}
            if isinstance(a, torch.Tensor) else {"index": i, "value": repr(a)[:80]} for i, a in enumerate(inputs)]


def _differentiable_outputs(fn: FnLike, inputs64: tuple, info: dict[str, Any]) -> list[torch.Tensor] | None:
    """The outputs of the forward on the float64 copies that require grad; None (and why in `info`) when none can be checked."""
    try:
        outs = flat_out(fn(*inputs64))
    except Exception as exc:
        info["skipped"] = f"forward failed on float64 inputs: {type(exc).__name__}: {exc}"
        return None
    if not any(o.requires_grad for o in outs):
        info["skipped"] = "no output requires grad"
        return None
    return outs


def _measure(cls: type[Function], inputs64: tuple, facts: FunctionFacts, info: dict[str, Any], user: UserCode | None,
             fast_mode: bool | None, check_second_order: bool, starved: frozenset[str], repeat: bool = True) -> list[Finding]:
    """Fill `facts` for one Function on its float64 inputs; returns what other families report (a memory limit, the
    backward raising)."""
    req = [i for i, a in enumerate(inputs64) if isinstance(a, torch.Tensor) and a.requires_grad]
    if not req:
        info["skipped"] = "no input requires grad"
        return []

    def fn(*xs: Any) -> Any:
        return cls.apply(*xs)

    outs = _differentiable_outputs(fn, inputs64, info)
    if outs is None:
        return []
    outs_req = [o for o in outs if o.requires_grad]
    try:
        # autograd validates the backward's count and shapes here: its errors are the findings
        torch.autograd.grad(outs_req, [inputs64[j] for j in req], [torch.randn_like(o) for o in outs_req], allow_unused=True)
    except Exception as exc:
        return _measure_structure(facts, exc, user)
    # structure is fine; compare Jacobians
    n_out = sum(o.numel() for o in outs)
    use_fast = fast_mode if fast_mode is not None else (
        n_out > MAX_OUTPUT_ELEMS or sum(inputs64[j].numel() for j in req) > 4 * MAX_INPUT_ELEMS)
    info["mode"] = "fast (random projections)" if use_fast else "full Jacobian"
    if use_fast:  # the perturbed pass (repeat=False) compares its own projections only: torch's message costs full Jacobians
        _measure_fast(facts, cls, fn, inputs64, req, explain=repeat)
        return []
    analytical = _measure_full(facts, cls, fn, inputs64, req, starved)
    if repeat:
        _measure_repeat(facts, fn, inputs64, req, analytical, check_second_order)
    return []


def check_function(cls: type[Function], inputs: tuple, params_at: Mapping[int, list[str]], user: UserCode | None = None,
                   atol: float = 1e-5, rtol: float = 1e-3, check_second_order: bool = False, fast_mode: bool | None = None,
                   starved: frozenset[str] = frozenset(), weights_at: Sequence[int] = ()
                   ) -> tuple[list[Finding], dict[str, Any]]:
    """All GP4xx findings for one Function on one set of inputs. `starved`: the parameters that got no gradient
    in the observed step (diagnose), so that a None for a piecewise-constant input is judged by its effect.
    `weights_at`: the weight-like input positions; a Function exact at the recorded inputs is checked again with them
    perturbed (equivalence/op_states.py). Step and tolerances follow the dtype it computes in (op_precision.py)."""
    def_loc, ret_loc = backward_source(cls)
    inputs64, converted = as_double(inputs)
    info: dict[str, Any] = {"function": cls.__name__, "inputs": _input_facts(inputs, params_at)}
    inputs64, how = shrink(inputs64) if fast_mode is not True else (inputs64, None)
    if how:
        info["shrunk"] = how
    prec = op_precision.measure(cls, inputs64, atol, rtol)
    facts = FunctionFacts(cls.__name__, params_at, def_loc, ret_loc, len(inputs), prec.atol, prec.rtol, converted=converted,
                          step=prec.step, precision=prec.facts() if prec.lowered else None)
    if prec.lowered:
        info["precision"] = prec.facts()
    others = _measure(cls, inputs64, facts, info, user, fast_mode, check_second_order, starved)
    clean = not (others or facts.structure or facts.missing or facts.wrong or "skipped" in info)
    if clean and weights_at:
        _measure_perturbed(cls, inputs64, facts, info, user, fast_mode, starved, list(weights_at))
    info["largest_abs_error"] = max(facts.largest, facts.largest_error or 0.0)  # full Jacobians and projected ones
    info["atol"], info["rtol"] = facts.atol, facts.rtol
    return run_rules(FUNCTION_RULES, facts) + others, info


def _measure_perturbed(cls: type[Function], inputs64: tuple, facts: FunctionFacts, info: dict[str, Any],
                       user: UserCode | None, fast_mode: bool | None, starved: frozenset[str], weights_at: list[int]) -> None:
    """The same check with the weight-like inputs moved away from the recorded call (a backward exact only at init)."""
    moved, states = op_states.perturb(inputs64, weights_at, facts.label)
    if not states:
        return
    again = FunctionFacts(facts.name, facts.params_at, facts.def_loc, facts.ret_loc, facts.n_inputs, facts.atol,
                          facts.rtol, step=facts.step, precision=facts.precision)
    sub: dict[str, Any] = {}
    _measure(cls, moved, again, sub, user, fast_mode, False, starved, repeat=False)
    wrong = again.wrong is not None
    info["perturbed"] = {"inputs": states, "mode": sub.get("mode"), "result": "wrong" if wrong else "exact",
                         "largest_abs_error": again.largest}
    if wrong:
        facts.wrong, facts.perturbed = again.wrong, states


def _is_user_class(cls: type, user: UserCode | None) -> bool:
    try:
        f = inspect.getsourcefile(cls)
    except (TypeError, OSError):
        return False
    return f is not None and bool(f) and user is not None and user.is_user_file(f)


def _user_functions(user: UserCode | None) -> list[type[Function]]:
    out: list[type[Function]] = []
    stack = list(Function.__subclasses__())
    seen: set[type] = set()
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        stack.extend(c.__subclasses__())
        try:
            f = inspect.getsourcefile(c)
        except (TypeError, OSError):
            continue
        if f and user is not None and user.is_user_file(f):
            out.append(c)
    return out


class DirectForwardWatch:
    """Flags user Functions whose forward is called outside apply (forward-called-directly)."""

    def __init__(self, user: UserCode) -> None:
        self.user = user
        self.hits: dict[type, dict[str, Any]] = {}

    def __enter__(self) -> DirectForwardWatch:
        self._stack = contextlib.ExitStack()
        for cls in _user_functions(self.user):
            orig = cls.__dict__.get("forward")
            if not isinstance(orig, staticmethod):
                continue
            func = orig.__func__

            def watched(*a: Any, _cls: type = cls, _f: Callable[..., Any] = func, **k: Any) -> Any:
                # "called directly" only when the user's own code is the caller: apply's C core
                # calls forward with our apply watch (or torch's functorch path) as the Python caller
                caller = sys._getframe(1)
                if (_cls not in self.hits and not inside_custom_function()
                        and self.user.is_user_file(caller.f_code.co_filename)):
                    self.hits[_cls] = {"location": self.user.innermost(caller)}
                return _f(*a, **k)

            self._stack.enter_context(patched(cls, "forward", staticmethod(watched)))
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self._stack.close()
        return False


def discover(loaded: Loaded) -> tuple[ApplyWatch, DirectForwardWatch, str | None, Finding | None]:
    """One forward (the user's train_step when there is one) with custom Functions watched; the last item is
    a resource-limit finding when a memory limit stopped it (the Functions it did not reach are not checked)."""
    names = {i: n[0] for i, n in param_names(loaded.model).items()}
    watch = ApplyWatch(loaded.user, names, capture=True)
    direct = DirectForwardWatch(loaded.user)
    error = None
    limited = None
    with watch, direct, torch.enable_grad():
        try:
            if loaded.train_step is not None:
                loaded.train_step(loaded.model, loaded.batch, loaded.optimizer)
            else:
                call_model(loaded.model, loaded.batch)
        except Exception as exc:  # the step may fail because of the very Function we check
            error = f"{type(exc).__name__}: {exc}"
            limit = allocation_failure(exc)
            if limit is not None:
                limited = resource_limit_finding(
                    "running train_step" if loaded.train_step is not None else "running the forward", limit,
                    location=loaded.user.innermost_of_traceback(exc), evidence={"traceback": loaded.user.trimmed_traceback(exc)})
    return watch, direct, error, limited


def _checked_calls(loaded: Loaded, watch: ApplyWatch, function: str | None) -> Iterator[tuple[type[Function], dict[str, Any]]]:
    for cls, entry in watch.calls.items():
        if function and cls.__name__ != function.rpartition(":")[2]:
            continue
        if not function and not _is_user_class(cls, loaded.user):
            continue  # a library's own Functions (transformers, peft, ...) are not the user's to fix
        yield cls, entry


def gradcheck_findings(loaded: Loaded, watch: ApplyWatch, direct: DirectForwardWatch, function: str | None = None,
                       check_second_order: bool = False, fast_mode: bool | None = None, atol: float | None = None,
                       rtol: float | None = None, starved: frozenset[str] = frozenset()
                       ) -> tuple[list[Finding], dict[str, Any]]:
    atol, rtol = atol or 1e-5, rtol or 1e-3
    findings = run_rules((GP406,), [DirectCall(cls.__name__, hit["location"]) for cls, hit in direct.hits.items()])
    checked = []
    for cls, entry in _checked_calls(loaded, watch, function):
        more, facts = check_function(cls, entry["inputs"], entry["params_at"], loaded.user, atol, rtol, check_second_order,
                                     fast_mode, starved, entry.get("weights_at", ()))
        facts["calls"] = entry["count"]
        facts["called_at"] = entry["location"]
        findings += more
        checked.append(facts)
    out: dict[str, Any] = {"functions": checked}
    gradcheck_verdict(out, findings)
    return findings, out


def gradcheck_verdict(facts: dict[str, Any], findings: list[Finding]) -> None:
    """What gradcheck measured (facts.verified: one line per Function found right, at which weights and tolerances) and
    each Function it could not check (facts.not_run)."""
    checked = facts["functions"]
    for f in checked:
        if "skipped" in f:
            cause: Cause = "not_applicable" if f["skipped"].startswith("no ") else "gradprobe"
            add_not_run(facts, f"gradcheck of {f['function']}", f["skipped"], cause)
        elif (line := verified_line(f, findings)) is not None:
            add_verified(facts, line)
    if not checked:
        add_verified(facts, "gradcheck: no custom autograd Function of the user's was called by the step")


def gradcheck_report(loaded: Loaded, function: str | None = None, check_second_order: bool = False,
                     fast_mode: bool | None = None, atol: float | None = None, rtol: float | None = None,
                     reference: dict[str, Any] | None = None) -> dict[str, Any]:
    watch, direct, error, limited = discover(loaded)
    if function and not any(cls.__name__ == function.rpartition(":")[2] for cls in watch.calls):
        watch = _explicit(loaded, function, watch)
    findings, facts = gradcheck_findings(loaded, watch, direct, function, check_second_order, fast_mode, atol, rtol)
    if limited is not None and not any(f["code"] == GP113.code for f in findings):
        findings.insert(0, limited)
    if error:
        facts["forward_error"] = error
        add_not_run(facts, "gradcheck of the Functions after the point the forward raised", error, "user_code")
    n = len(facts["functions"])
    summary = [f"{n} custom autograd.Function(s) checked: " + ", ".join(f["function"] for f in facts["functions"])
               if n else "No user-defined autograd.Function was called by the forward."]
    if reference is not None:  # a custom module against the reference it replaces (GP804)
        rfindings, rfacts = reference_report(loaded, reference)
        findings += rfindings
        facts["reference"] = rfacts
        lift(facts, rfacts)
        summary.append(rfacts["summary"])
    return make_report("run_gradcheck", findings, summary, **facts)


def _explicit(loaded: Loaded, ref: str, watch: ApplyWatch) -> ApplyWatch:
    """`function="file.py:Name"`: an autograd.Function applied to the batch's tensors, or a module/function whose
    custom Functions are discovered by calling it on the batch."""
    from gradprobe.loading import Resolver, TargetRefError

    obj = Resolver(loaded.user.root.rstrip("/") if loaded.user.root else ".").resolve(ref if ":" in ref else f"{ref}:", "model")
    batch = loaded.batch
    args = batch if isinstance(batch, tuple) else tuple(batch.values()) if isinstance(batch, dict) else (batch,)
    args = tuple(a.detach().clone().requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a for a in args)
    if isinstance(obj, type) and issubclass(obj, Function):
        entry = {"inputs": args, "count": 1, "params_at": {}, "location": None}
        watch.calls[obj] = entry
        return watch
    target = obj() if isinstance(obj, type) else obj
    if not callable(target):
        raise TargetRefError(f"function {ref!r} is not callable")
    inner = ApplyWatch(loaded.user, {}, capture=True)
    with inner, torch.enable_grad():
        target(*args)
    watch.calls.update(inner.calls)
    return watch


def run_gradcheck(model: torch.nn.Module, batch: Any, function: str | None = None, check_second_order: bool = False,
                  atol: float | None = None, rtol: float | None = None, project_dir: str | None = None) -> dict[str, Any]:
    """Library entry: discover and check the custom Functions a live model uses on `batch`."""
    from gradprobe.loading import live_target

    return gradcheck_report(live_target(model, batch, project_dir=project_dir), function, check_second_order, None, atol, rtol)


def verified_line(info: dict[str, Any], findings: list[Finding]) -> str | None:
    """What the check of one Function measured, when it found nothing wrong with it (None otherwise)."""
    name = info["function"]
    if "skipped" in info or any(f["severity"] != "info" and f["evidence"].get("function") == name for f in findings):
        return None
    pert = info.get("perturbed")
    at = " and at its weight-like inputs perturbed" if pert and pert.get("result") == "exact" else ""
    largest = max(info.get("largest_abs_error", 0.0), (pert or {}).get("largest_abs_error", 0.0))
    prec = info.get("precision")
    dtype = f", computing in {prec['compute_dtype']}" if prec else ""
    mode = info.get("mode", "full Jacobian")
    size = f"largest |analytical - numerical| {largest:.2g}, " if mode == "full Jacobian" else ""
    return (f"{name}: backward matches finite differences at the recorded inputs{at} ({mode}, {size}"
            f"atol {info.get('atol', 0):.2g}, rtol {info.get('rtol', 0):.2g}{dtype})")
