"""GP805: distinct Parameters over one storage (a tie made with `.data`, `nn.Parameter(w.data)`, `nn.Parameter(w.t())`).

A real tie is one Parameter under two names: autograd sums both uses into its one `.grad` and the optimizer updates it
once. Two Parameter *objects* over one storage are two leaves: each gets its own `.grad` (its part of the matrix's
gradient), and an optimizer that holds both updates the storage twice per step (with Adam, two moment states over one
matrix). Found by storage identity, never by names: the same `untyped_storage().data_ptr()` and element ranges that
overlap (exactly for dense views; for strided views with gaps, by the elements themselves up to a size, else by span).
Views of one storage that do not overlap (FSDP's flat parameter with `use_orig_params`, a contiguous buffer carved into
parameters) share nothing.

The consequence is measured at one step when the optimizer holds the parameters (`StorageStep`): the shared storage's
move against what one tied Parameter given the summed gradient moves under the same optimizer class and
hyperparameters, from a fresh state (the ratio and the cosine), and each parameter's part of the gradient.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn as nn

from gradprobe.findings import Finding, Rule, Situation, run_rules

if TYPE_CHECKING:
    from gradprobe.loading import BuildRecord, Loaded

__all__ = ["GP805", "StorageFacts", "StorageStep", "measure_storage", "run", "storage_findings"]

MAX_EXACT_SPAN = 1 << 22  # strided views with gaps: element sets compared exactly up to this span, else by span

Loc = dict[str, Any]


@dataclass
class Member:
    """One Parameter object of a group over one storage."""

    name: str
    aliases: list[str]  # every name of this one Parameter (a real tie inside the group is one member)
    param: torch.Tensor = field(repr=False)
    trains: bool  # requires_grad
    held: bool | None  # in the optimizer (None: no optimizer to ask)
    site: Loc | None  # the user line that made it (module attribute set, or `p.data = ...`)
    seq: int  # order of that line in the build (0: not recorded)


@dataclass
class StepMeasure:
    """One real step over a group whose trainable members the optimizer holds."""

    parts: dict[str, float]  # each member's gradient norm
    grad_cosine: float | None  # between the two first members' gradients, in storage coordinates
    moved: float  # norm of the shared storage's change at the step
    tie_moved: float | None  # what one tied Parameter given the summed gradient moves (fresh state), None: not measured
    ratio: float | None
    cosine: float | None  # between the storage's change and the tied Parameter's
    why_no_tie: str | None = None


@dataclass
class Group:
    members: list[Member]
    overlap: str  # in words: "the same elements", "a transposed view of the same elements", "12 shared elements"
    shared_elements: int
    step: StepMeasure | None = None

    @property
    def trained(self) -> list[Member]:
        return [m for m in self.members if m.trains]

    @property
    def second(self) -> Member:
        """The member made last (the line that created the second Parameter over the storage)."""
        return max(self.members, key=lambda m: m.seq)


@dataclass
class StorageFacts:
    checked: int  # distinct Parameters compared
    skipped: list[str]  # why some were not (meta tensors, DTensors)
    groups: list[Group]
    has_optimizer: bool
    optimizer: str = ""  # its class name


GP805: Rule[StorageFacts] = Rule(
    code="GP805", name="parameters-share-storage", severity="error", rank=13,
    summary="Distinct Parameter objects over one storage (a tie made with .data or a view), trained as two.",
    why="A real tie is one Parameter under two names: both uses sum into its one .grad and the optimizer updates it once. "
        "Two Parameter objects over one storage (`nn.Parameter(w.data)`, `p2.data = p1.data`, `nn.Parameter(w.t())`) "
        "are two leaves: each gets only its part of the matrix's gradient, and an optimizer holding both updates the "
        "storage twice per step (with Adam, two moment states over one matrix). Found by storage identity, not names.",
    example="self.decoder.weight.data = self.encoder.weight.data.t()",
    message="{names} are distinct Parameters over one storage ({overlap}), both trained: each gets its own .grad, only "
            "its part of the matrix's gradient{held}.",
    fix="Tie with one Parameter: assign the Parameter itself (`self.decoder.weight = self.encoder.weight`), not a new "
        "Parameter over its .data; where one use is transposed, keep one Parameter and transpose it in the forward "
        "(F.linear(x, self.encoder.weight.t())).",
    situations={
        "measured": Situation(
            when="the optimizer holds both and one real step was measured: the storage's move against one tied "
                 "Parameter's with the summed gradient (same optimizer class and hyperparameters, fresh state)",
            message="{names} are distinct Parameters over one storage ({overlap}), both held by the optimizer: one step "
                    "moved the storage by {moved:.4g}, {ratio:.3g}x what one tied Parameter given the summed gradient "
                    "moves ({tie_moved:.4g}, cosine {cosine:.3f}); the gradient is split between them (norms {parts}, "
                    "cosine {grad_cosine:.3f})."),
        "measured_same": Situation(
            severity="warning",
            when="the optimizer holds both and one real step moved the storage as one tied Parameter would (an optimizer "
                 "linear in the gradient: SGD without weight decay)",
            message="{names} are distinct Parameters over one storage ({overlap}), both held by the optimizer; this step "
                    "moved the storage as one tied Parameter given the summed gradient would ({ratio:.3g}x, cosine "
                    "{cosine:.4f}), because {optimizer} is linear in the gradient, but the gradient is split between them "
                    "(norms {parts}): clipping by norm, weight decay or a switch to Adam will treat them as two."),
        "frozen": Situation(
            severity="info",
            when="only one of the Parameters over the storage trains (a frozen copy that is not a copy)",
            message="{names} share one storage ({overlap}); only {trained} trains, so {frozen} is no separate copy: "
                    "every update of {trained} changes it too.",
            fix="Nothing to fix if {frozen} is meant to follow {trained}; for a frozen snapshot, copy it: "
                "nn.Parameter(w.detach().clone(), requires_grad=False)."),
    },
)


# ---- measuring ----------------------------------------------------------------------------------------------------

def _local(p: torch.Tensor) -> torch.Tensor | None:
    """The tensor whose storage is compared; None for what has no comparable storage (meta, DTensor, sparse)."""
    if p.device.type == "meta" or p.layout != torch.strided or p.numel() == 0 or hasattr(p, "placements"):
        return None
    return p


def _span(p: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) element of the storage that p covers (its dtype's elements)."""
    last = sum((int(s) - 1) * int(st) for s, st in zip(p.shape, p.stride(), strict=True) if s > 0)
    return int(p.storage_offset()), int(p.storage_offset()) + last + 1


def _bytes(p: torch.Tensor) -> tuple[int, int]:
    lo, hi = _span(p)
    return lo * p.dtype.itemsize, hi * p.dtype.itemsize


def _key(p: torch.Tensor) -> tuple[str, int]:
    return str(p.device), p.untyped_storage().data_ptr()


def _indices(p: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    return torch.arange(lo, hi).as_strided(p.shape, p.stride(), p.storage_offset() - lo).reshape(-1)


def _shared(p: torch.Tensor, q: torch.Tensor) -> int:
    """Elements of the storage both cover (0: none)."""
    if p.dtype.itemsize != q.dtype.itemsize:  # views of one storage in two dtypes: by bytes
        a = (p.storage_offset() * p.dtype.itemsize, _span(p)[1] * p.dtype.itemsize)
        b = (q.storage_offset() * q.dtype.itemsize, _span(q)[1] * q.dtype.itemsize)
        return max(0, min(a[1], b[1]) - max(a[0], b[0])) // max(p.dtype.itemsize, q.dtype.itemsize)
    (a0, a1), (b0, b1) = _span(p), _span(q)
    lo, hi = max(a0, b0), min(a1, b1)
    if lo >= hi:
        return 0
    dense = p.numel() == a1 - a0 and q.numel() == b1 - b0
    if dense or min(a0, b0) + MAX_EXACT_SPAN < max(a1, b1):
        return hi - lo
    lo, hi = min(a0, b0), max(a1, b1)
    return int(torch.isin(_indices(p, lo, hi), _indices(q, lo, hi)).sum())


def _overlap_words(ps: list[torch.Tensor], shared: int) -> str:
    p, q = ps[0], ps[1]
    same = (p.storage_offset(), p.stride()) == (q.storage_offset(), q.stride())
    if same and p.shape == q.shape:
        return f"the same {p.numel()} elements"
    if p.storage_offset() == q.storage_offset() and tuple(p.shape) == tuple(reversed(q.shape)) \
            and tuple(p.stride()) == tuple(reversed(q.stride())) and p.dim() == 2:
        return f"one is the transpose of the other: the same {p.numel()} elements"
    return f"{shared} shared elements"


def _site(record: BuildRecord | None, model: nn.Module, p: torch.Tensor, aliases: list[str]) -> tuple[Loc | None, int]:
    if record is None:
        return None, 0
    hits = [record.data_sites.get(id(p))]
    for name in aliases:
        owner, _, attr = name.rpartition(".")
        try:
            hits.append(record.setattr_sites.get((id(model.get_submodule(owner) if owner else model), attr)))
        except AttributeError:
            continue
    found = [h for h in hits if h is not None]
    if not found:
        return None, 0
    seq, loc = max(found, key=lambda h: h[0])
    return loc, seq


def _named(model: nn.Module, optimizer: Any) -> dict[int, tuple[list[str], torch.Tensor]]:
    out: dict[int, tuple[list[str], torch.Tensor]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        out.setdefault(id(p), ([], p))[0].append(name)
    if isinstance(optimizer, torch.optim.Optimizer):  # tensors the optimizer holds outside the model
        for gi, g in enumerate(optimizer.param_groups):
            for i, p in enumerate(g["params"]):
                if id(p) not in out:
                    out[id(p)] = ([f"optimizer.param_groups[{gi}].params[{i}]"], p)
    return out


def _union(pairs: list[tuple[int, int]], n: int) -> list[list[int]]:
    root = list(range(n))

    def find(i: int) -> int:
        while root[i] != i:
            root[i] = root[root[i]]
            i = root[i]
        return i

    for a, b in pairs:
        root[find(a)] = find(b)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return [g for g in groups.values() if len(g) > 1]


def measure_storage(model: nn.Module, optimizer: Any = None, record: BuildRecord | None = None) -> StorageFacts:
    """The groups of distinct Parameters whose storages overlap."""
    named = _named(model, optimizer)
    held = ({id(p) for g in optimizer.param_groups for p in g["params"]}
            if isinstance(optimizer, torch.optim.Optimizer) else None)
    tensors: list[tuple[list[str], torch.Tensor]] = []
    skipped: list[str] = []
    for names, p in named.values():
        if _local(p) is None:
            skipped.append(names[0])
        else:
            tensors.append((names, p))
    by_storage: dict[tuple[str, int], list[int]] = {}
    with torch.no_grad():
        for i, (_, p) in enumerate(tensors):
            by_storage.setdefault(_key(p), []).append(i)
        pairs: list[tuple[int, int]] = []
        shared: dict[int, int] = {}
        for idx in by_storage.values():  # a sweep over byte spans: a flat buffer carved into n parameters costs n log n
            spans = sorted((_bytes(tensors[i][1]), i) for i in idx)
            active: list[tuple[tuple[int, int], int]] = []
            for span, i in spans:
                active = [(s, j) for s, j in active if s[1] > span[0]]
                for _, j in active:
                    k = _shared(tensors[i][1], tensors[j][1])
                    if k:
                        pairs.append((j, i))
                        shared[i] = shared.get(i, 0) + k
                        shared[j] = shared.get(j, 0) + k
                active.append((span, i))
    groups = []
    for members in _union(pairs, len(tensors)):
        ms = []
        for i in members:
            names, p = tensors[i]
            site, seq = _site(record, model, p, names)
            ms.append(Member(names[0], names, p, p.requires_grad, None if held is None else id(p) in held, site, seq))
        ms.sort(key=lambda m: m.seq)
        n_shared = max(shared.get(i, 0) for i in members)
        groups.append(Group(ms, _overlap_words([m.param for m in ms], n_shared), n_shared))
    return StorageFacts(len(tensors), skipped[:20], groups, held is not None, type(optimizer).__name__)


# ---- one step, measured -------------------------------------------------------------------------------------------

def _region(ps: list[torch.Tensor]) -> tuple[int, int]:
    spans = [_span(p) for p in ps]
    return min(s[0] for s in spans), max(s[1] for s in spans)


def _flat(p: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    return torch.empty(0, dtype=p.dtype, device=p.device).set_(p.untyped_storage(), lo, (hi - lo,), (1,))


def _scatter(p: torch.Tensor, values: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    buf = torch.zeros(hi - lo, dtype=torch.float64, device=p.device)
    buf.as_strided(p.shape, p.stride(), p.storage_offset() - lo).add_(values.to(torch.float64))
    return buf


def _cos(a: torch.Tensor, b: torch.Tensor) -> float | None:
    na, nb = float(a.norm()), float(b.norm())
    return float((a * b).sum()) / (na * nb) if na > 0 and nb > 0 else None


class StorageStep:
    """Measures the first optimizer step over each group whose trainable members the optimizer holds."""

    def __init__(self, facts: StorageFacts, optimizer: Any) -> None:
        self.facts, self.optimizer = facts, optimizer
        self._watch: list[tuple[Group, int, int, torch.Tensor, bool]] = []
        self._grads: dict[int, torch.Tensor] = {}
        self._handles: list[Any] = []

    def __enter__(self) -> StorageStep:
        opt = self.optimizer
        if not isinstance(opt, torch.optim.Optimizer):
            return self
        for g in self.facts.groups:
            ps = [m.param for m in g.trained]
            if len(ps) < 2 or not all(m.held for m in g.trained) or len({p.dtype for p in ps}) > 1:
                continue
            lo, hi = _region(ps)
            fresh = all(not opt.state.get(p) for p in ps)
            with torch.no_grad():
                self._watch.append((g, lo, hi, _flat(ps[0], lo, hi).detach().clone(), fresh))
        if self._watch:
            self._handles = [opt.register_step_pre_hook(self._pre), opt.register_step_post_hook(self._post)]
        return self

    def _pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self._grads:
            return
        for g, *_ in self._watch:
            for m in g.trained:
                if m.param.grad is not None:
                    self._grads[id(m.param)] = m.param.grad.detach().clone()

    def _post(self, opt: Any, args: Any, kwargs: Any) -> None:
        watch, self._watch = self._watch, []
        with torch.no_grad():
            for g, lo, hi, before, fresh in watch:
                g.step = self._measure(g, lo, hi, before, fresh)

    def _measure(self, g: Group, lo: int, hi: int, before: torch.Tensor, fresh: bool) -> StepMeasure:
        ms = g.trained
        p0 = ms[0].param
        grads = {m.name: _scatter(m.param, self._grads[id(m.param)], lo, hi) for m in ms if id(m.param) in self._grads}
        covered = torch.zeros(hi - lo, dtype=torch.bool, device=p0.device)
        for m in ms:
            covered.as_strided(m.param.shape, m.param.stride(), m.param.storage_offset() - lo).fill_(True)
        delta = (_flat(p0, lo, hi).to(torch.float64) - before.to(torch.float64))[covered]
        parts = {name: float(v.norm()) for name, v in grads.items()}
        gs = list(grads.values())
        gcos = _cos(gs[0], gs[1]) if len(gs) >= 2 else None
        tie, why = self._tie_update(g, before, sum(gs, torch.zeros_like(before, dtype=torch.float64)), fresh, covered)
        tie_moved = float(tie.norm()) if tie is not None else None
        ratio = float(delta.norm()) / tie_moved if tie_moved else None
        cosine = _cos(delta, tie) if tie is not None else None
        return StepMeasure(parts, gcos, float(delta.norm()), tie_moved, ratio, cosine, why)

    def _tie_update(self, g: Group, before: torch.Tensor, gsum: torch.Tensor, fresh: bool,
                    covered: torch.Tensor) -> tuple[torch.Tensor | None, str | None]:
        """What one Parameter over the storage, given the summed gradient, moves under the same optimizer (fresh state)."""
        opt = self.optimizer
        if not fresh:
            return None, "the optimizer already had state for these parameters (not its first step)"
        group = next((grp for grp in opt.param_groups if any(p is g.trained[0].param for p in grp["params"])), None)
        if group is None:
            return None, "the parameter's param group was not found"
        accepted = inspect.signature(type(opt).__init__).parameters
        hyper = {k: group[k] for k in opt.defaults if k in group and k in accepted}
        q = nn.Parameter(before.detach().clone())
        q.grad = gsum.to(q.dtype)
        try:
            with torch.enable_grad():
                type(opt)([q], **hyper).step()
        except Exception as exc:  # an optimizer class that cannot be rebuilt from its defaults
            return None, f"{type(opt).__name__} could not be rebuilt for one tied parameter: {type(exc).__name__}: {exc}"
        return (q.detach().to(torch.float64) - before.to(torch.float64))[covered], None

    def __exit__(self, *exc: object) -> Literal[False]:
        for h in self._handles:
            h.remove()
        return False


# ---- the rule -----------------------------------------------------------------------------------------------------

def _names(ms: list[Member]) -> str:
    return " and ".join(f"`{m.name}`" for m in ms)


def _held_words(g: Group) -> str:
    held = [m for m in g.trained if m.held]
    if all(m.held is None for m in g.trained):
        return ""
    if len(held) == len(g.trained):
        return "; the optimizer holds both and updates the storage twice per step"
    if not held:
        return "; the optimizer holds neither"
    unheld = [m for m in g.trained if not m.held]
    return f"; the optimizer holds only {_names(held)}: the part of the gradient that reaches {_names(unheld)} is never applied"


def _evidence(g: Group) -> dict[str, Any]:
    ev: dict[str, Any] = {"parameters": [{"name": m.name, "aliases": m.aliases, "requires_grad": m.trains, "held": m.held,
                                          "shape": list(m.param.shape), "stride": list(m.param.stride()),
                                          "storage_offset": m.param.storage_offset(), "created_at": m.site}
                                         for m in g.members],
                          "shared_elements": g.shared_elements, "storage_ptr_equal": True}
    if g.step is not None:
        ev["step"] = {k: v for k, v in vars(g.step).items()}
    return ev


@GP805.detector
def shared_storage(facts: StorageFacts) -> Iterator[Finding]:
    for g in facts.groups:
        trained = g.trained
        names = [n for m in g.members for n in m.aliases]
        where = g.second.site
        if not trained:
            continue  # nothing trains: nothing is split or updated twice
        if len(trained) == 1:
            frozen = [m for m in g.members if not m.trains]
            yield GP805.finding("frozen", names=_names(g.members), overlap=g.overlap, trained=f"`{trained[0].name}`",
                                frozen=_names(frozen), parameters=names, location=where, evidence=_evidence(g))
            continue
        s = g.step
        if s is not None and s.ratio is not None:
            parts = ", ".join(f"{n} {v:.3g}" for n, v in s.parts.items())
            same = abs(s.ratio - 1) < 1e-3 and s.cosine is not None and s.cosine > 1 - 1e-6
            yield GP805.finding("measured_same" if same else "measured",
                                optimizer=facts.optimizer, names=_names(g.members), overlap=g.overlap, moved=s.moved,
                                ratio=s.ratio,
                                tie_moved=s.tie_moved, cosine=s.cosine if s.cosine is not None else float("nan"),
                                parts=parts, grad_cosine=s.grad_cosine if s.grad_cosine is not None else float("nan"),
                                parameters=names, location=where, evidence=_evidence(g))
            continue
        yield GP805.finding(names=_names(g.members), overlap=g.overlap, held=_held_words(g), parameters=names,
                            location=where, evidence=_evidence(g))


def storage_findings(facts: StorageFacts) -> list[Finding]:
    return run_rules((GP805,), facts)


def verified_line(facts: StorageFacts) -> str:
    if not facts.groups:
        return f"storage: {facts.checked} distinct Parameters compared by storage identity: no two overlap"
    return f"storage: {facts.checked} distinct Parameters compared by storage identity: {len(facts.groups)} group(s) overlap"


def facts_dict(facts: StorageFacts) -> dict[str, Any]:
    return {"checked": facts.checked, "skipped": facts.skipped, "groups": [_evidence(g) for g in facts.groups]}


# ---- the comparison, for check_equivalence ------------------------------------------------------------------------

def run(loaded: Loaded, options: dict[str, Any]) -> dict[str, Any]:
    """Comparison 5 (one storage, two parameters): by storage identity, and the consequence at one real step."""
    from gradprobe.checks.core.step import run_step

    model = loaded.model
    if not any(True for _ in model.parameters()):
        return {"applies": False, "why_not": "the model has no parameters", "findings": [], "verified": [], "not_run": [],
                "facts": {}}
    facts = measure_storage(model, loaded.optimizer, loaded.record)
    not_run: list[dict[str, str]] = []
    if facts.skipped:
        not_run.append({"check": "storage", "why": f"{len(facts.skipped)} parameter(s) have no comparable storage "
                        f"(meta, DTensor, sparse): {', '.join(facts.skipped[:4])}", "cause": "not_applicable"})
    split = [g for g in facts.groups if len(g.trained) >= 2]
    if split and isinstance(loaded.optimizer, torch.optim.Optimizer) and (loaded.batch is not None or loaded.train_step):
        result = run_step(loaded, optimizer_step=True, observers=[StorageStep(facts, loaded.optimizer)])
        if result.failed:
            not_run.append({"check": "storage step", "why": "the step failed, so the update of the shared storage was "
                            "not measured", "cause": "user_code"})
    elif split:
        not_run.append({"check": "storage step", "why": "no optimizer step to measure (no torch optimizer, inputs or "
                        "train_step)", "cause": "not_applicable"})
    for g in split:
        if g.step is not None and g.step.why_no_tie:
            not_run.append({"check": "storage tie comparison", "why": g.step.why_no_tie, "cause": "not_applicable"})
    return {"applies": True, "why_not": "", "findings": storage_findings(facts), "verified": [verified_line(facts)],
            "not_run": not_run, "facts": facts_dict(facts)}
