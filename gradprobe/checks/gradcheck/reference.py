"""GP804: a custom or fused module against the reference implementation it replaces, on the same weights and inputs.

The user names the pair (run_gradcheck's `reference` option, check_equivalence's too):

    {"module": "model.py:FusedAttention", "replaces": "model.py:Attention"}
    {"module": "blocks.0.attn", "replaces": "ref.py:Attention", "init": {"dim": 16}, "map": "ref.py:rename"}

`module` is a class (every instance of it in the model, by its definition: the same source file and qualified name)
or a submodule path. `replaces` is a submodule path inside the model (its class, deep-copied), a class (built with
`init`, else with its constructor's parameters read from the custom module's attributes of the same name, else their
defaults) or a function taking the custom module and returning the reference. The reference loads the custom module's
state_dict (`map`: a function from one state_dict to the other), by name: every parameter of the reference must be
filled, else the comparison is not run and says why.

Each instance's inputs are recorded in one step (a forward pre-hook). Both modules are then compared in float64, in
eval mode (dropout off), on those inputs: the outputs, and with one seeded random cotangent the gradients of the
floating inputs and of every parameter both have under one name; at the recorded weights and, when those agree, at the
weights perturbed (op_states.REL x their rms, seeded). Per tensor the relative error ||a - b|| / ||b|| against
tol = max(1e-9, 8 eps sqrt(n)), eps of the least precise dtype either forward computes in, n the longest last
dimension. Where the outputs differ, op_blame.py names the custom forward's line.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from gradprobe.checks.core.function_calls import ApplyWatch
from gradprobe.checks.core.step import floating_outputs, run_step
from gradprobe.checks.gradcheck import op_blame, op_states
from gradprobe.checks.gradcheck.op_precision import _Dtypes, _eps
from gradprobe.checks.core.function_calls import backward_lines
from gradprobe.findings import Finding, Rule, Situation, run_rules
from gradprobe.userframes import location

if TYPE_CHECKING:
    from gradprobe.loading import Loaded

Loc = dict[str, Any]
MAX_INSTANCES = 4


@dataclass
class Diff:
    tensor: str  # "the output", "the gradient of input 0", "the gradient of fc1.weight"
    rel: float
    cosine: float | None
    max_abs: float


@dataclass
class Comparison:
    path: str  # the custom module's path in the model
    cls: str
    reference: str
    state: str  # "recorded" or "perturbed"
    tol: float
    dtype: str
    compared: int  # tensors compared
    diffs: list[Diff]  # over tolerance, worst first
    largest: float  # the largest relative error seen (all tensors)
    where: Loc | None = None
    perturbed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def output_differs(self) -> bool:
        return any(not d.tensor.startswith("the gradient") for d in self.diffs)


@dataclass
class ReferenceFacts:
    comparisons: list[Comparison] = field(default_factory=list)
    not_run: list[dict[str, str]] = field(default_factory=list)


GP804: Rule[ReferenceFacts] = Rule(
    code="GP804", name="custom-op-differs", severity="error", rank=19,
    summary="A custom or fused module differs from the reference implementation it replaces, on the same weights and "
            "inputs.",
    why="A fused or hand-written replacement (a fused MLP, an attention with its own masking, a kernel) must compute what "
        "the reference computes; a masking detail or a dropped term trains a different model and nothing fails. Both "
        "run on the same weights (the reference loads the module's state_dict) and the inputs the module really got, "
        "in float64 and eval mode, with tolerances from the dtype they compute in; at perturbed weights too.",
    example="a fused causal attention whose mask is triu(diagonal=2): token t also sees t+1",
    message="{path} ({cls}) differs from its reference {reference} on the same weights and recorded inputs: {what} "
            "(tolerance {tol:.2g}, {dtype}).",
    fix="Make {cls} compute what {reference} computes, from the reported line on; compare the two with the same "
        "state_dict and inputs until output and gradients agree.",
    situations={
        "perturbed": Situation(
            when="equal at the recorded weights, different once the weights are perturbed (seeded): a difference a "
                 "special state (a weight of ones, a zero bias) hides",
            message="{path} ({cls}) matches its reference {reference} at the recorded weights but differs at perturbed "
                    "weights: {what} (tolerance {tol:.2g}, {dtype})."),
        "gradients": Situation(
            when="the outputs agree and only gradients differ: the custom backward is where they part",
            message="{path} ({cls}) gives the same output as its reference {reference}{at_state} but different "
                    "gradients: {what} (tolerance {tol:.2g}, {dtype})."),
    },
)


# ---- resolving the pair ---------------------------------------------------------------------------------------------

def _spec(option: Any) -> dict[str, Any]:
    from gradprobe.errors import TargetRefError

    if not isinstance(option, dict) or not isinstance(option.get("module"), str) or not isinstance(option.get("replaces"), str):
        raise TargetRefError('reference must be {"module": "file.py:Custom" or a submodule path, "replaces": '
                             '"file.py:Reference" or a submodule path}')
    return option


def _same_class(a: type, b: type) -> bool:
    if a is b:
        return True
    try:
        return a.__qualname__ == b.__qualname__ and inspect.getsourcefile(a) == inspect.getsourcefile(b)
    except TypeError:
        return False


def _instances(loaded: Loaded, ref: str, resolve: Callable[[str], Any]) -> list[tuple[str, nn.Module]]:
    model = loaded.model
    if ":" not in ref:
        return [(ref, model.get_submodule(ref))]
    cls = resolve(ref)
    return [(name or "(the model)", m) for name, m in model.named_modules()
            if isinstance(cls, type) and _same_class(type(m), cls)][:MAX_INSTANCES]


def _build(loaded: Loaded, spec: dict[str, Any], custom: nn.Module, resolve: Callable[[str], Any]) -> nn.Module:
    ref = spec["replaces"]
    if ":" not in ref:
        return copy.deepcopy(loaded.model.get_submodule(ref))
    obj = resolve(ref)
    if isinstance(obj, type) and issubclass(obj, nn.Module):
        kwargs = dict(spec.get("init") or {})
        if not kwargs:
            for name, p in list(inspect.signature(obj.__init__).parameters.items())[1:]:
                if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                    continue
                if hasattr(custom, name):
                    kwargs[name] = getattr(custom, name)
                elif p.default is p.empty:
                    raise ValueError(f"cannot build {obj.__name__}: its parameter `{name}` is no attribute of the custom "
                                     "module; give reference.init")
        return obj(**kwargs)
    built = obj(custom)
    if not isinstance(built, nn.Module):
        raise ValueError(f"{ref} returned {type(built).__name__}, not an nn.Module")
    return built


def _renamed(custom: nn.Module, mapfn: Callable[..., Any] | None) -> dict[str, str]:
    """What `map` calls each custom parameter, told by tensor identity (a map that renames keys keeps the tensors)."""
    if mapfn is None:
        return {}
    state = custom.state_dict(keep_vars=True)
    out = mapfn(dict(state))
    new = {id(v): k for k, v in out.items()} if isinstance(out, dict) else {}
    return {k: new[id(v)] for k, v in state.items() if id(v) in new}


def _load(ref: nn.Module, state: dict[str, torch.Tensor], mapfn: Callable[..., Any] | None) -> str | None:
    """Load the custom module's weights into the reference; why not, when they do not fill it."""
    sd = mapfn(state) if mapfn is not None else state
    try:
        result = ref.load_state_dict(sd, strict=False)
    except RuntimeError as exc:
        return f"the reference cannot load the custom module's state_dict: {str(exc)[:300]}"
    params = {n for n, _ in ref.named_parameters()}
    missing = [k for k in result.missing_keys if k in params]
    if missing:
        return f"the custom module's state_dict leaves {len(missing)} reference parameter(s) unfilled: {missing[:6]}"
    return None


# ---- recording and comparing ---------------------------------------------------------------------------------------

def _capture(loaded: Loaded, modules: list[nn.Module]) -> tuple[dict[int, tuple[tuple, dict]], str | None]:
    seen: dict[int, tuple[tuple, dict]] = {}

    def clone(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.detach().clone()
        if isinstance(x, (tuple, list)):
            return type(x)(clone(v) for v in x)
        if isinstance(x, dict):
            return {k: clone(v) for k, v in x.items()}
        return x

    def hook(m: nn.Module, args: tuple, kwargs: dict) -> None:
        seen.setdefault(id(m), (clone(args), clone(kwargs)))

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in modules]
    try:
        result = run_step(loaded, optimizer_step=False)
    finally:
        for h in handles:
            h.remove()
    error = f"{type(result.error).__name__}: {result.error}" if result.error is not None else None
    return seen, error


def _double(x: Any, leaves: list[tuple[str, torch.Tensor]], where: str = "input") -> Any:
    if isinstance(x, torch.Tensor):
        if not x.is_floating_point():
            return x
        d = x.detach().to(torch.float64).requires_grad_(True)
        leaves.append((f"{where} {len(leaves)}", d))
        return d
    if isinstance(x, (tuple, list)):
        return type(x)(_double(v, leaves, where) for v in x)
    if isinstance(x, dict):
        return {k: _double(v, leaves, where) for k, v in x.items()}
    return x


def _rel(a: torch.Tensor | None, b: torch.Tensor | None) -> tuple[float, float | None, float]:
    if a is None or b is None:
        other = b if a is None else a
        n = float(other.norm()) if other is not None else 0.0
        return (0.0, None, 0.0) if n == 0 else (math.inf, None, n)
    d = (a - b).norm()
    nb, na = float(b.norm()), float(a.norm())
    rel = float(d) / nb if nb > 0 else (0.0 if float(d) == 0 else math.inf)
    cos = float((a * b).sum()) / (na * nb) if na > 0 and nb > 0 else None
    return rel, cos, float((a - b).abs().max()) if a.numel() else 0.0


def _run(module: nn.Module, args: tuple, kwargs: dict, dtypes: _Dtypes, log: op_blame.OpLog | None,
         functions: ApplyWatch | None = None) -> Any:
    with contextlib.ExitStack() as stack:
        for ctx in (torch.random.fork_rng(devices=[]), torch.enable_grad(), dtypes, log, functions):
            if ctx is not None:
                stack.enter_context(ctx)
        torch.manual_seed(0)
        return module(*args, **kwargs)


def _backward_of(watch: ApplyWatch, user: Any) -> Loc | None:
    """The backward of the one custom Function of the user's that the custom forward called (where only gradients
    differ, that is where the two part)."""
    mine = [cls for cls in watch.calls if user.is_user_file(inspect.getsourcefile(cls) or "")]
    if len(mine) != 1:
        return None
    def_loc, _ = backward_lines(mine[0])
    return def_loc


@dataclass
class _Pair:
    path: str
    custom: nn.Module
    reference: nn.Module
    args: tuple
    kwargs: dict
    cls: str
    ref_name: str
    names: dict[str, str] = field(default_factory=dict)  # custom parameter name -> the reference's, where `map` renames


def _compare(pair: _Pair, state: str, loaded: Loaded, blame: bool) -> Comparison:
    """One comparison of float64 copies (the reference holds the custom module's weights already)."""
    leaves_c: list[tuple[str, torch.Tensor]] = []
    leaves_r: list[tuple[str, torch.Tensor]] = []
    args_c, kwargs_c = _double(pair.args, leaves_c), _double(pair.kwargs, leaves_c)
    args_r, kwargs_r = _double(pair.args, leaves_r), _double(pair.kwargs, leaves_r)
    dc, dr = _Dtypes(None), _Dtypes(None)
    log_c = op_blame.OpLog(loaded.user) if blame else None
    log_r = op_blame.OpLog(None) if blame else None
    functions = ApplyWatch(loaded.user, {}, capture=False) if blame else None
    out_c = floating_outputs(_run(pair.custom, args_c, kwargs_c, dc, log_c, functions))
    out_r = floating_outputs(_run(pair.reference, args_r, kwargs_r, dr, log_r))
    dtype = dc.lowest if _eps(dc.lowest) >= _eps(dr.lowest) else dr.lowest
    sizes = [int(t.shape[-1]) for _, t in leaves_c if t.dim()] + [int(p.shape[-1]) for p in pair.custom.parameters() if p.dim()]
    tol = max(1e-9, 8 * _eps(dtype) * math.sqrt(max(sizes or [1])))
    rows: list[Diff] = []
    for k, (a, b) in enumerate(zip(out_c, out_r, strict=False)):
        rel, cos, mx = _rel(a.detach(), b.detach()) if a.shape == b.shape else (math.inf, None, math.inf)
        rows.append(Diff(f"output {k}" if len(out_c) > 1 else "the output", rel, cos, mx))
    params_r = dict(pair.reference.named_parameters())
    named = [(n, p, pair.names.get(n, n)) for n, p in pair.custom.named_parameters()]
    shared = [(n, p, params_r[r]) for n, p, r in named if r in params_r and params_r[r].shape == p.shape and p.requires_grad]
    outs = [(a, b) for a, b in zip(out_c, out_r, strict=False) if a.requires_grad and b.requires_grad and a.shape == b.shape]
    if outs:
        gen = torch.Generator().manual_seed(op_states.SEED)
        cots = [torch.randn(a.shape, generator=gen, dtype=torch.float64) for a, _ in outs]
        wrt_c = [t for _, t in leaves_c] + [p for _, p, _ in shared]
        wrt_r = [t for _, t in leaves_r] + [q for _, _, q in shared]
        gc = torch.autograd.grad([a for a, _ in outs], wrt_c, cots, allow_unused=True)
        gr = torch.autograd.grad([b for _, b in outs], wrt_r, cots, allow_unused=True)
        names = [f"the gradient of {n}" for n, _ in leaves_c] + [f"the gradient of {n}" for n, _, _ in shared]
        for name, a, b in zip(names, gc, gr, strict=True):
            rows.append(Diff(name, *_rel(a, b)))
    diffs = sorted([d for d in rows if d.rel > tol], key=lambda d: (d.tensor.startswith("the gradient"), -d.rel))
    where = None
    if blame and diffs and log_c is not None and log_r is not None:
        worst = next((k for k, d in enumerate(rows[:len(out_c)]) if d.rel > tol), None)
        if worst is not None:
            where = op_blame.culprit(log_c, log_r, out_c[worst], tol * 10)
        elif functions is not None:
            where = _backward_of(functions, loaded.user)
    return Comparison(pair.path, pair.cls, pair.ref_name, state, tol, str(dtype).replace("torch.", ""), len(rows), diffs,
                      max([d.rel for d in rows if math.isfinite(d.rel)] or [0.0]), where)


def _forward_def(m: nn.Module) -> Loc | None:
    fn = type(m).forward
    try:
        lines, start = inspect.getsourcelines(fn)
        filename = inspect.getsourcefile(fn)
    except (OSError, TypeError):
        return None
    return location(filename, start, f"{type(m).__name__}.forward") if filename else None


def _perturb(module: nn.Module) -> list[dict[str, Any]]:
    params = [(n, p) for n, p in module.named_parameters() if p.is_floating_point()]
    moved, states = op_states.perturb(tuple(p.detach() for _, p in params), list(range(len(params))),
                                      lambda j: params[j][0])
    with torch.no_grad():
        for (_, p), m in zip(params, moved, strict=True):
            p.copy_(m)
    return states


def _compare_pair(pair: _Pair, loaded: Loaded, mapfn: Callable[..., Any] | None) -> Comparison:
    first = _compare(pair, "recorded", loaded, blame=False)
    if first.diffs:
        out = _compare(pair, "recorded", loaded, blame=True)
    else:
        states = _perturb(pair.custom)
        why = _load(pair.reference, pair.custom.state_dict(), mapfn)
        if why is not None or not states:  # compared at the recorded weights only (verified() says so)
            return first
        out = _compare(pair, "perturbed", loaded, blame=False)
        if out.diffs:
            out = _compare(pair, "perturbed", loaded, blame=True)
        out.perturbed = states
        out.largest = max(out.largest, first.largest)
    if out.diffs and out.where is None:
        out.where = _forward_def(pair.custom)
    return out


def measure(loaded: Loaded, option: Any) -> ReferenceFacts:
    """Every instance of the custom module against its reference, at the recorded and at perturbed weights."""
    from gradprobe.loading import Resolver

    spec = _spec(option)
    resolver = Resolver(loaded.user.root.rstrip("/") if loaded.user.root else ".")

    def resolve(ref: str) -> Any:
        return resolver.resolve(ref, "reference")

    facts = ReferenceFacts()
    pairs = _instances(loaded, spec["module"], resolve)
    if not pairs:
        facts.not_run.append({"check": "reference", "why": f"no module of the model is {spec['module']}",
                              "cause": "user_code"})
        return facts
    inputs, error = _capture(loaded, [m for _, m in pairs])
    mapfn = resolve(spec["map"]) if spec.get("map") else None
    for path, custom in pairs:
        if id(custom) not in inputs:
            facts.not_run.append({"check": f"reference {path}", "why": "the step never called it" +
                                  (f" (it raised {error})" if error else ""), "cause": "user_code"})
            continue
        try:
            ref = _build(loaded, spec, custom, resolve)
        except Exception as exc:
            facts.not_run.append({"check": f"reference {path}", "why": f"the reference could not be built: "
                                  f"{type(exc).__name__}: {exc}"[:400], "cause": "user_code"})
            continue
        c64, r64 = copy.deepcopy(custom).double().eval(), ref.double().eval()
        why = _load(r64, c64.state_dict(), mapfn)
        if why is not None:
            facts.not_run.append({"check": f"reference {path}", "why": why, "cause": "user_code"})
            continue
        args, kwargs = inputs[id(custom)]
        pair = _Pair(path, c64, r64, args, kwargs, type(custom).__name__, spec["replaces"].rpartition(":")[2],
                     _renamed(c64, mapfn))
        try:
            facts.comparisons.append(_compare_pair(pair, loaded, mapfn))
        except Exception as exc:  # the user's module failed on float64 copies: said, not reported as a difference
            facts.not_run.append({"check": f"reference {path}", "why": f"running the pair in float64 raised "
                                  f"{type(exc).__name__}: {exc}"[:400], "cause": "user_code"})
    return facts


def _what(c: Comparison) -> str:
    def one(d: Diff) -> str:
        cos = f", cosine {d.cosine:.4f}" if d.cosine is not None else ""
        rel = "one is None" if math.isinf(d.rel) else f"relative error {d.rel:.3g}"
        return f"{d.tensor} ({rel}{cos})"
    more = f" and {len(c.diffs) - 3} more" if len(c.diffs) > 3 else ""
    return ", ".join(one(d) for d in c.diffs[:3]) + more + f", of {c.compared} tensors compared"


@GP804.detector
def custom_op_differs(facts: ReferenceFacts) -> Iterator[Finding]:
    for c in facts.comparisons:
        if not c.diffs:
            continue
        ev = {"module": c.path, "class": c.cls, "reference": c.reference, "state": c.state, "tolerance": c.tol,
              "dtype": c.dtype, "differences": [vars(d) for d in c.diffs[:12]], "compared": c.compared,
              **({"perturbed": c.perturbed} if c.perturbed else {})}
        params = [c.path, c.cls]
        kw: dict[str, Any] = dict(path=c.path, cls=c.cls, reference=c.reference, what=_what(c), tol=c.tol, dtype=c.dtype,
                  parameters=params, location=c.where, evidence=ev)
        if not c.output_differs:
            at_state = " at perturbed weights" if c.state == "perturbed" else ""
            yield GP804.finding("gradients", at_state=at_state, **kw)
        elif c.state == "perturbed":
            yield GP804.finding("perturbed", **kw)
        else:
            yield GP804.finding(**kw)


def reference_findings(facts: ReferenceFacts) -> list[Finding]:
    return run_rules((GP804,), facts)


def verified(facts: ReferenceFacts) -> list[str]:
    return [f"reference: {c.path} ({c.cls}) vs {c.reference}: output and {c.compared - 1} gradient(s) agree at the "
            f"{'recorded and perturbed weights' if c.perturbed else 'recorded weights'} (largest relative difference "
            f"{c.largest:.2g}, tolerance {c.tol:.2g}, {c.dtype})" for c in facts.comparisons if not c.diffs]


def reference_report(loaded: Loaded, option: Any) -> tuple[list[Finding], dict[str, Any]]:
    """The custom module against its reference (GP804): findings, and facts with verified / not_run lines."""
    facts = measure(loaded, option)
    findings = reference_findings(facts)
    done = [c for c in facts.comparisons]
    worst = max((c.largest for c in done), default=0.0)
    summary = (f"Reference: {len(done)} instance(s) of {option['module']} compared with {option['replaces']} "
               f"(largest relative difference {worst:.2g})" if done else
               f"Reference: {option['module']} was not compared with {option['replaces']} (see not_run)")
    return findings, {"comparisons": [{"module": c.path, "class": c.cls, "reference": c.reference, "state": c.state,
                                       "tolerance": c.tol, "dtype": c.dtype, "compared": c.compared,
                                       "largest_relative_difference": c.largest, "differs": bool(c.diffs)}
                                      for c in done],
                      "verified": verified(facts), "not_run": facts.not_run, "summary": summary}
