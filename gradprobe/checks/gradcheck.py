"""GP4xx: check every custom autograd.Function the model really calls, on the inputs it really gets.

Discovery runs one forward with `Function.apply` watched, keeping a float64
copy of the first inputs each Function received and which parameters fed each
input position. Each distinct Function is then checked once: the backward's
structure (count, shapes, missing gradients) through autograd itself, and the
analytical Jacobian against central differences, element by element, so the
finding can name the input, the output and the worst element in words.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import sys
import textwrap
from typing import Any, cast

import torch
from torch.autograd.function import Function

from gradprobe.checks import backward_lines, rewrites
from gradprobe.checks._apply import ApplyWatch, inside_custom_function
from gradprobe.checks._step import call_model, param_names
from gradprobe.checks.torchcompat import (
    INVALID_GRADIENT,
    WRONG_GRADIENT_COUNT,
    WRONG_GRADIENT_SHAPE,
    GradcheckError,
    allocation_failure,
)
from gradprobe.checks.watches import patched
from gradprobe.findings import Finding, make_finding
from gradprobe.report import make_report
from gradprobe.outcomes import resource_limit_finding
from gradprobe.userframes import location

RULES = {
    "GP401": {
        "name": "gradcheck-mismatch", "severity": "error", "rank": 18,
        "summary": "Analytical and numerical Jacobians differ.",
        "why": "The hand-written backward computes a wrong derivative: training follows wrong gradients, silently. "
               "Intentional rewrites (a gradient reversal or scaling layer, a straight-through surrogate) are GP409, not this.",
        "example": "d/dz (0.044715 z^3) written as 0.044715 z^2",
        "fix": "Re-derive the backward for the reported input; compare against torch.autograd.gradcheck on float64 inputs.",
    },
    "GP402": {
        "name": "wrong-gradient-count", "severity": "error", "rank": 15,
        "summary": "backward returns a different number of gradients than forward took inputs.",
        "why": "backward must return one value per forward input (None for non-tensor or non-differentiable ones); autograd raises otherwise.",
        "example": "forward(ctx, x, weight, eps) ... return grad_x, grad_weight",
        "fix": "Return one value per forward input, None for non-differentiable ones: return grad_x, grad_weight, None",
    },
    "GP403": {
        "name": "wrong-gradient-shape", "severity": "error", "rank": 16,
        "summary": "A returned gradient's shape does not match its input.",
        "why": "Each gradient must have its input's shape (reduce broadcast dimensions with sum).",
        "example": "return grad_out  # for a bias of shape [d] broadcast over a batch",
        "fix": "Reduce over the broadcast dimensions: grad_bias = grad_out.reshape(-1, d).sum(0)",
    },
    "GP404": {
        "name": "missing-gradient", "severity": "error", "rank": 17,
        "summary": "backward returns None (or zeros) for an input that requires grad.",
        "why": "The parameters fed to that input never learn, and autograd raises nothing.",
        "example": "grad_bias = None ... return grad_x, grad_weight, grad_bias",
        "fix": "Compute the gradient when ctx.needs_input_grad[i]: e.g. grad_bias = grad_out.sum(0)",
    },
    "GP405": {
        "name": "low-precision-check", "severity": "info", "rank": 99,
        "summary": "Inputs were not float64; the check ran on float64 copies.",
        "why": "Finite differences need double precision to be meaningful.",
        "example": "float32 activations",
        "fix": "Nothing to fix: informational.",
    },
    "GP406": {
        "name": "forward-called-directly", "severity": "error", "rank": 19,
        "summary": "Function.forward was called instead of Function.apply.",
        "why": "Calling forward directly records no graph node: the custom backward never runs and inputs get no gradient.",
        "example": "y = MyFn.forward(None, x, w)",
        "fix": "Call MyFn.apply(x, w)",
    },
    "GP407": {
        "name": "gradgradcheck-mismatch", "severity": "warning", "rank": 99,
        "summary": "Second derivatives are wrong (checked only when asked for).",
        "why": "Double backward (gradient penalties, MAML, Hessian-vector products) gets wrong values.",
        "example": "a backward written with non-differentiable ops or saved .data",
        "fix": "Write backward with differentiable torch ops, or mark it once_differentiable.",
    },
    "GP409": {
        "name": "intentional-gradient-rewrite", "severity": "info", "rank": 99,
        "summary": "backward deliberately differs from the true gradient: a uniform reversal or scaling, or a surrogate through a piecewise-constant forward.",
        "why": "Gradient-reversal layers (domain adaptation), gradient scaling and straight-through estimators rewrite the gradient on purpose; "
               "the check measures that the rewrite is a single factor for every element (and names the scalar the call received), or that "
               "the forward is piecewise constant, so it is not reported as a wrong derivative.",
        "example": "class RevGrad(Function): backward returns -alpha * grad_out",
        "fix": "Nothing to fix if the rewrite is intended.",
    },
    "GP408": {
        "name": "nondeterministic-backward", "severity": "warning", "rank": 99,
        "summary": "Two backward passes on the same input differ.",
        "why": "Gradients that change run to run make training irreproducible and gradcheck meaningless.",
        "example": "backward uses torch.rand or index_add_ with atomics",
        "fix": "Make backward deterministic (torch.use_deterministic_algorithms(True) to find the op).",
    },
}

MAX_INPUT_ELEMS = 600
MAX_OUTPUT_ELEMS = 2048


def _backward_lines(cls) -> tuple[dict | None, dict | None]:
    """(def line, last return line) of cls.backward as locations."""
    fn = cls.__dict__.get("backward")
    fn = getattr(fn, "__func__", fn)
    if fn is None:
        return None, None
    try:
        lines, start = inspect.getsourcelines(fn)  # start is the first decorator's line
        filename = inspect.getsourcefile(fn)
    except (OSError, TypeError):
        return None, None
    filename = cast(str, filename)  # getsourcelines found the source, so it has a file
    name = f"{cls.__name__}.backward"
    def_offset = next((i for i, line in enumerate(lines) if line.lstrip().startswith("def ")), 0)
    def_loc = location(filename, start + def_offset, name)
    try:
        rets = [n.lineno for n in ast.walk(ast.parse(textwrap.dedent("".join(lines)))) if isinstance(n, ast.Return)]
    except SyntaxError:
        rets = []
    return def_loc, (location(filename, start + max(rets) - 1, name) if rets else None)


def _as_double(inputs: tuple) -> tuple[tuple, bool]:
    out, converted = [], False
    for a in inputs:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            if a.dtype != torch.float64:
                converted = True
            d = a.detach().to(torch.float64).clone()
            d.requires_grad_(a.requires_grad)
            out.append(d)
        else:
            out.append(a)
    return tuple(out), converted


def _shrink(inputs: tuple) -> tuple[tuple, str | None]:
    """Slice a shared leading (batch) dimension so a full Jacobian fits; keeps the shape contract."""
    tensors = [a for a in inputs if isinstance(a, torch.Tensor)]
    total = sum(a.numel() for a in tensors if a.requires_grad)
    if total <= MAX_INPUT_ELEMS:
        return inputs, None
    big = max(tensors, key=lambda t: t.numel())
    if big.dim() < 2:
        return inputs, None
    b = big.shape[0]
    keep = max(1, min(b, 2))
    shrunk = []
    for a in inputs:
        if isinstance(a, torch.Tensor) and a.dim() >= 2 and a.shape[0] == b:
            s = a.detach()[:keep].clone()
            s.requires_grad_(a.requires_grad)
            shrunk.append(s)
        else:
            shrunk.append(a)
    return tuple(shrunk), f"sliced the leading dimension {b} -> {keep} on inputs that share it"


def _flat_out(out) -> list[torch.Tensor]:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [o for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point()]


def _numerical_jacobian(fn, inputs, j: int, eps: float = 1e-6) -> torch.Tensor:
    x = inputs[j]
    base = [o.detach().reshape(-1) for o in _flat_out(fn(*inputs))]
    n_out = sum(b.numel() for b in base)
    jac = torch.zeros(n_out, x.numel(), dtype=torch.float64)
    flat = x.detach().reshape(-1)
    with torch.no_grad():
        for i in range(x.numel()):
            orig = flat[i].item()
            flat[i] = orig + eps
            plus = torch.cat([o.detach().reshape(-1) for o in _flat_out(fn(*inputs))])
            flat[i] = orig - eps
            minus = torch.cat([o.detach().reshape(-1) for o in _flat_out(fn(*inputs))])
            flat[i] = orig
            jac[:, i] = (plus - minus) / (2 * eps)
    return jac


def _analytical_jacobians(fn, inputs, req: list[int]) -> list[torch.Tensor | None]:
    outs = _flat_out(fn(*inputs))
    flat = torch.cat([o.reshape(-1) for o in outs])
    n_out = flat.numel()
    jacs = [torch.zeros(n_out, inputs[j].numel(), dtype=torch.float64) for j in req]
    got_any = [False] * len(req)
    for k in range(n_out):
        go = torch.zeros(n_out, dtype=flat.dtype)
        go[k] = 1.0
        gos, off = [], 0
        for o in outs:
            gos.append(go[off:off + o.numel()].reshape(o.shape))
            off += o.numel()
        grads = torch.autograd.grad(outs, [inputs[j] for j in req], gos, retain_graph=True, allow_unused=True)
        for i, g in enumerate(grads):
            if g is not None:
                got_any[i] = True
                jacs[i][k] = g.detach().reshape(-1).to(torch.float64)
    return [jac if got else None for jac, got in zip(jacs, got_any, strict=True)]


def _parse_structure_error(text: str) -> tuple[str, dict] | None:
    m = WRONG_GRADIENT_COUNT.search(text)
    if m:
        return "GP402", {"expected": int(m.group(1)), "returned": int(m.group(2))}
    m = WRONG_GRADIENT_SHAPE.search(text)
    if m:
        return "GP403", {"input_index": int(m.group(1)), "returned_shape": m.group(2), "input_shape": m.group(3)}
    m = INVALID_GRADIENT.search(text)
    if m:
        return "GP403", {"input_index": int(m.group(1)), "problem": m.group(2)[:200]}
    return None


def check_function(cls, inputs: tuple, params_at: dict, user=None, atol: float = 1e-5, rtol: float = 1e-3,
                   check_second_order: bool = False, fast_mode: bool | None = None,
                   starved: frozenset[str] = frozenset()) -> tuple[list[Finding], dict]:
    """All GP40x findings for one Function on one set of inputs. `starved`: the parameters that got no gradient
    in the observed step (diagnose), so that a None for a piecewise-constant input is judged by its effect."""
    name = cls.__name__
    def_loc, ret_loc = _backward_lines(cls)
    findings: list[Finding] = []
    inputs64, converted = _as_double(inputs)
    facts: dict[str, Any] = {"function": name, "inputs": [
        {"index": i, "shape": list(a.shape), "dtype": str(a.dtype), "requires_grad": a.requires_grad, "parameters": params_at.get(i, [])}
        if isinstance(a, torch.Tensor) else {"index": i, "value": repr(a)[:80]} for i, a in enumerate(inputs)]}
    if converted:
        findings.append(make_finding("GP405", f"{name}: the captured inputs were not float64; checked on float64 copies.",
                                     parameters=[name], evidence={"function": name}))
    inputs64, how = _shrink(inputs64) if fast_mode is not True else (inputs64, None)
    if how:
        facts["shrunk"] = how
    req = [i for i, a in enumerate(inputs64) if isinstance(a, torch.Tensor) and a.requires_grad]
    if not req:
        facts["skipped"] = "no input requires grad"
        return findings, facts

    def fn(*xs):
        return cls.apply(*xs)

    def label(j: int) -> str:
        ps = params_at.get(j, [])
        return f"input {j}" + (f" ({', '.join(ps[:4])})" if ps else "")

    try:
        outs = _flat_out(fn(*inputs64))
    except Exception as exc:
        facts["skipped"] = f"forward failed on float64 inputs: {type(exc).__name__}: {exc}"
        return findings, facts
    outs_req = [o for o in outs if o.requires_grad]
    if not outs_req:
        facts["skipped"] = "no output requires grad"
        return findings, facts
    gos = [torch.randn_like(o) for o in outs_req]
    try:
        # autograd validates the backward's count and shapes here: its errors are the findings
        torch.autograd.grad(outs_req, [inputs64[j] for j in req], gos, allow_unused=True)
    except Exception as exc:
        text = str(exc)
        parsed = _parse_structure_error(text)
        if parsed:
            code, ev = parsed
            n_in = len(inputs)
            if code == "GP402":
                msg = (f"{name}.backward returns {ev['returned']} gradient(s) but forward takes {ev['expected']} input(s); "
                       f"positions {', '.join(str(i) for i in range(ev['returned'], ev['expected'])) or '?'} are missing.")
                fix: str | None = f"Return one value per forward input, None for non-differentiable ones (forward takes {n_in})."
            else:
                idx = ev.get("input_index", 0)
                msg = f"{name}.backward returns a gradient for {label(idx)} of shape {ev.get('returned_shape', '?')}, but that input has shape {ev.get('input_shape', '?')}."
                fix = None
            ps = sorted({p for ns in params_at.values() for p in ns}) if code == "GP402" else params_at.get(ev.get("input_index", -1), [])
            findings.append(make_finding(code, msg, parameters=[name] + ps, location=ret_loc or def_loc,
                                         evidence={"function": name, **ev, "error": text[:500]}, fix=fix))
        elif (limit := allocation_failure(exc)) is not None:  # a memory limit, not the custom backward's error
            findings.append(resource_limit_finding(
                f"running {name}.backward on float64 copies of its captured inputs (gradcheck)", limit,
                location=(user.innermost_of_traceback(exc) if user else None) or def_loc,
                evidence={"function": name, "traceback": user.trimmed_traceback(exc) if user else text}))
        else:
            tb = user.trimmed_traceback(exc) if user else text
            findings.append(make_finding(
                "GP308", f"{name}.backward raised: {type(exc).__name__}: {text[:300]}", parameters=[name],
                location=(user.innermost_of_traceback(exc) if user else None) or def_loc,
                evidence={"function": name, "traceback": tb}, fix="Fix the error in the traceback of the custom backward.",
            ))
        return findings, facts

    # structure is fine; compare Jacobians
    n_out = sum(o.numel() for o in outs)
    use_fast = fast_mode if fast_mode is not None else (n_out > MAX_OUTPUT_ELEMS or sum(inputs64[j].numel() for j in req) > 4 * MAX_INPUT_ELEMS)
    facts["mode"] = "fast (random projections)" if use_fast else "full Jacobian"
    if use_fast:
        try:  # raise_exception=False would return False on exactly this error and drop PyTorch's explanation
            torch.autograd.gradcheck(fn, inputs64, atol=atol, rtol=rtol, fast_mode=True, raise_exception=True)
            gradcheck_error = None
        except GradcheckError as exc:
            gradcheck_error = str(exc)
        # torch's fast mode misses small elementwise errors (a dropped factor in one term): our own projections too
        projected, through = rewrites.projected_jacobians(fn, inputs64, req, _flat_out)
        wrong = [j for j, (a, n) in projected.items() if bool(((a - n).abs() > atol + rtol * n.abs()).any())]
        if gradcheck_error is not None or wrong:
            wrong = wrong or req
            rewrite = rewrites.classify(fn, inputs64, projected, _flat_out, atol, rtol, through)
            rewrite.full = False
            pseudo = [{"input_index": j, "parameters": params_at.get(j, [])} for j in wrong]
            findings += _rewrite_findings(name, rewrite, pseudo, label, def_loc)
            explained = set(rewrite.surrogate) | (set(rewrite.scaled) if rewrite.recognised else set())
            wrong = [j for j in wrong if j not in explained]
            if wrong:
                line = backward_lines.wrong_gradient_line(cls, inputs64, req, wrong[0])
                where = location(def_loc["file"], line, def_loc["function"]) if def_loc and line else None
                findings.append(make_finding(
                    "GP401", f"{name}.backward disagrees with finite differences for {', '.join(label(j) for j in wrong)} "
                    "(fast mode: v^T J u differs).",
                    parameters=[name] + [p for j in wrong for p in params_at.get(j, [])], location=where or ret_loc or def_loc,
                    evidence={"function": name, "mode": "fast", "gradcheck_error": (gradcheck_error or "")[-2000:],
                              "projections": {j: {"analytical": projected[j][0].flatten().tolist(),
                                                  "numerical": projected[j][1].flatten().tolist()} for j in wrong}}))
        return findings, facts
    analytical = _analytical_jacobians(fn, inputs64, req)
    mismatches = []
    jacobians: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for pos, j in enumerate(req):
        numerical = _numerical_jacobian(fn, inputs64, j)
        ana = analytical[pos]
        if ana is not None:
            jacobians[j] = (ana, numerical)
        num_nonzero = bool((numerical.abs() > atol).any())
        ps = params_at.get(j, [])
        if ana is None and not num_nonzero and ps and set(ps) <= starved:
            # exact for a piecewise-constant forward (round, sign), yet the step measured that nothing else
            # trains what feeds this input: a straight-through surrogate was meant, or the input should not need grad
            findings.append(make_finding(
                "GP404", f"{name}.backward returns None for {label(j)}, which requires grad: the forward is piecewise "
                f"constant there (numerical gradient zero), and in the step {', '.join(ps[:4])} got no gradient from "
                "anywhere else, so they never learn.",
                parameters=[name] + ps, location=ret_loc or def_loc,
                evidence={"function": name, "input_index": j, "returned": "None", "numerical_max_abs": 0.0,
                          "no_gradient_in_step": ps},
                fix="Return a surrogate gradient for this input (straight-through: return grad_out), or detach what feeds "
                    "it if those parameters are not meant to learn through it.",
            ))
            continue
        if ana is None or (not bool((ana != 0).any()) and num_nonzero):
            if num_nonzero:
                what = "None" if ana is None else "an all-zero gradient"
                findings.append(make_finding(
                    "GP404", f"{name}.backward returns {what} for {label(j)}, which requires grad and does change the output "
                    f"(numerical gradient max |{numerical.abs().max().item():.3g}|)" + (f": {', '.join(ps)} never learn." if ps else "."),
                    parameters=[name] + ps, location=ret_loc or def_loc,
                    evidence={"function": name, "input_index": j, "returned": what, "numerical_max_abs": numerical.abs().max().item()},
                ))
            continue
        diff = (ana - numerical).abs()
        excess = diff - (atol + rtol * numerical.abs())
        if bool((excess > 0).any()):
            k, i = divmod(int(torch.argmax(excess)), numerical.shape[1])
            shape = tuple(inputs64[j].shape)
            elem = [int(e) for e in torch.unravel_index(torch.tensor(i), shape)] if shape else []
            mismatches.append({"input_index": j, "input": label(j), "parameters": ps, "output_index": k, "element": elem,
                               "analytical": ana[k, i].item(), "numerical": numerical[k, i].item(),
                               "max_abs_error": diff.max().item(),
                               "max_rel_error": (diff / numerical.abs().clamp_min(1e-12)).max().item()})
    rewrite = rewrites.Rewrite()
    if mismatches:
        through = {j: rewrites.is_identity(num) for j, (_, num) in jacobians.items()}
        rewrite = rewrites.classify(fn, inputs64, jacobians, _flat_out, atol, rtol, through)
        findings += _rewrite_findings(name, rewrite, mismatches, label, def_loc)
        explained = set(rewrite.surrogate) | (set(rewrite.scaled) if rewrite.recognised else set())
        mismatches = [m for m in mismatches if m["input_index"] not in explained]
    if mismatches:
        mismatches.sort(key=lambda m: -m["max_abs_error"])
        w = mismatches[0]
        uniform = rewrite.factor if rewrite.scaled and not rewrite.recognised else None
        line = backward_lines.wrong_gradient_line(cls, inputs64, req, w["input_index"])
        where = location(def_loc["file"], line, def_loc["function"]) if def_loc and line else None
        findings.append(make_finding(
            "GP401", f"{name}.backward is wrong for {', '.join(m['input'] for m in mismatches)}: worst at "
            f"d(output[{w['output_index']}])/d(input{w['input_index']}{w['element']}) = {w['analytical']:.6g} analytically "
            f"but {w['numerical']:.6g} numerically (max abs error {w['max_abs_error']:.3g})"
            + (f"; it is {uniform:.6g} x the true gradient for every element: a constant factor is wrong." if uniform else "."),
            parameters=[name] + [p for m in mismatches for p in m["parameters"]], location=where or ret_loc or def_loc,
            evidence={"function": name, "mismatches": mismatches, "atol": atol, "rtol": rtol,
                      **({"uniform_factor": uniform} if uniform else {})},
        ))
    # determinism: the same backward twice
    again = _analytical_jacobians(fn, inputs64, req)
    for pos, j in enumerate(req):
        a1, a2 = analytical[pos], again[pos]
        if a1 is not None and a2 is not None and not torch.equal(a1, a2):
            findings.append(make_finding(
                "GP408", f"{name}.backward gave different gradients for {label(j)} on two identical passes (max diff {(a1 - a2).abs().max().item():.3g}).",
                parameters=[name], location=def_loc, evidence={"function": name, "input_index": j}))
    if check_second_order:
        try:
            ok = torch.autograd.gradgradcheck(fn, inputs64, atol=atol, rtol=rtol, raise_exception=False)
        except Exception as exc:
            ok, facts["second_order_error"] = False, f"{type(exc).__name__}: {exc}"[:300]
        if not ok:
            findings.append(make_finding(
                "GP407", f"{name}: second derivatives disagree with finite differences (gradgradcheck).",
                parameters=[name], location=def_loc, evidence={"function": name, "error": facts.get("second_order_error")}))
    return findings, facts


def _rewrite_findings(name: str, rw: rewrites.Rewrite, mismatches: list[dict], label, def_loc) -> list[Finding]:
    """Info findings for the intentional rewrites among the mismatches (see checks/rewrites.py for the rule)."""
    out = []
    by_input = {m["input_index"]: m for m in mismatches}
    for j in rw.surrogate:
        m = by_input.get(j)
        f = make_finding(
            "GP409", f"{name}.backward passes a surrogate gradient for {label(j)} through a piecewise-constant forward "
            "(its true gradient is zero almost everywhere): a straight-through estimator, by design.",
            parameters=[name] + (m["parameters"] if m else []), location=def_loc,
            evidence={"function": name, "rewrite": "surrogate", "input_index": j},
            fix="Nothing to fix if the surrogate is intended (straight-through estimator).")
        out.append(f)
    if rw.scaled and rw.recognised and rw.factor is not None:
        c = rw.factor
        kind = "a gradient reversal" if c < 0 else "a gradient scaling"
        ps = [p for j in rw.scaled if j in by_input for p in by_input[j]["parameters"]]
        f = make_finding(
            "GP409", f"{name}.backward is {c:.6g} x the true gradient {'for every element' if rw.full else 'in every random projection'} of "
            f"{', '.join(label(j) for j in rw.scaled)}: {kind}, by design.",
            parameters=[name] + ps, location=def_loc,
            evidence={"function": name, "rewrite": "reversal" if c < 0 else "scaling", "factor": c, "inputs": rw.scaled},
            fix=f"Nothing to fix if {kind} is intended.")
        out.append(f)
    return out


def _is_user_class(cls, user) -> bool:
    try:
        f = inspect.getsourcefile(cls)
    except (TypeError, OSError):
        return False
    return bool(f) and user is not None and user.is_user_file(f)


def _user_functions(user) -> list[type]:
    out, stack = [], list(Function.__subclasses__())
    seen = set()
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
    """Flags user Functions whose forward is called outside apply (GP406)."""

    def __init__(self, user):
        self.user = user
        self.hits: dict[type, dict] = {}

    def __enter__(self):
        self._stack = contextlib.ExitStack()
        for cls in _user_functions(self.user):
            orig = cls.__dict__.get("forward")
            if not isinstance(orig, staticmethod):
                continue
            func = orig.__func__

            def watched(*a, _cls=cls, _f=func, **k):
                # "called directly" only when the user's own code is the caller: apply's C core
                # calls forward with our apply watch (or torch's functorch path) as the Python caller
                caller = sys._getframe(1)
                if (_cls not in self.hits and not inside_custom_function()
                        and self.user.is_user_file(caller.f_code.co_filename)):
                    self.hits[_cls] = {"location": self.user.innermost(caller)}
                return _f(*a, **k)

            self._stack.enter_context(patched(cls, "forward", staticmethod(watched)))
        return self

    def __exit__(self, *exc):
        self._stack.close()
        return False


def discover(loaded) -> tuple[ApplyWatch, DirectForwardWatch, str | None, Finding | None]:
    """One forward (the user's train_step when there is one) with custom Functions watched; the last item is
    GP113 when a memory limit stopped it (the Functions it did not reach are not checked)."""
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


def gradcheck_findings(loaded, watch: ApplyWatch, direct: DirectForwardWatch, function=None, check_second_order=False,
                       fast_mode=None, atol=None, rtol=None, starved: frozenset[str] = frozenset()) -> tuple[list[Finding], dict]:
    atol, rtol = atol or 1e-5, rtol or 1e-3
    findings: list[Finding] = []
    checked = []
    for cls, hit in direct.hits.items():
        findings.append(make_finding(
            "GP406", f"{cls.__name__}.forward was called directly instead of {cls.__name__}.apply: no graph node is recorded and its backward never runs.",
            parameters=[cls.__name__], location=hit["location"], evidence={"function": cls.__name__},
            fix=f"y = {cls.__name__}.apply(...)  # not {cls.__name__}.forward(ctx, ...)"))
    for cls, entry in watch.calls.items():
        if function and cls.__name__ != function.rpartition(":")[2]:
            continue
        if not function and not _is_user_class(cls, loaded.user):
            continue  # a library's own Functions (transformers, peft, ...) are not the user's to fix
        more, facts = check_function(cls, entry["inputs"], entry["params_at"], loaded.user, atol, rtol, check_second_order,
                                     fast_mode, starved)
        facts["calls"] = entry["count"]
        facts["called_at"] = entry["location"]
        findings += more
        checked.append(facts)
    return findings, {"functions": checked}


def gradcheck_report(loaded, function=None, check_second_order=False, fast_mode=None, atol=None, rtol=None) -> dict:
    watch, direct, error, limited = discover(loaded)
    if function and not any(cls.__name__ == function.rpartition(":")[2] for cls in watch.calls):
        watch = _explicit(loaded, function, watch)
    findings, facts = gradcheck_findings(loaded, watch, direct, function, check_second_order, fast_mode, atol, rtol)
    if limited is not None and not any(f["code"] == "GP113" for f in findings):
        findings.insert(0, limited)
    if error:
        facts["forward_error"] = error
    n = len(facts["functions"])
    summary = [f"{n} custom autograd.Function(s) checked: " + ", ".join(f["function"] for f in facts["functions"])
               if n else "No user-defined autograd.Function was called by the forward."]
    return make_report("run_gradcheck", findings, summary, **facts)


def _explicit(loaded, ref: str, watch: ApplyWatch) -> ApplyWatch:
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


def run_gradcheck(model, batch, function=None, check_second_order=False, atol=None, rtol=None, project_dir=None) -> dict:
    """Library entry: discover and check the custom Functions a live model uses on `batch`."""
    from gradprobe.loading import live_target

    return gradcheck_report(live_target(model, batch, project_dir=project_dir), function, check_second_order, None, atol, rtol)
