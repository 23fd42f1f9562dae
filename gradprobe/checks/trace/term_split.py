"""The terms of a loss that is a sum: which parameters each term reaches, and its share of their gradient.

When backward() runs on a scalar loss made at a user line, the autograd graph is walked from its
root through the nodes that only combine values linearly (additions, subtractions, negations,
products and quotients by a constant, sums, means, stacks): the first node that does anything else
is a *term*. Each term's reach is a walk of its graph to the parameters' AccumulateGrad nodes
(identity of the variables). Values behind a cut that were added to the loss (the recording mode
notes them at the linear op that took them, checks/trace/recording.py) are terms that reach nothing.
Each term's gradient is taken with autograd.grad on its graph edge, weighted by what the root sends
it, for every term but the last; the last one's is what the real backward brought minus the others.
The GP315-GP317 rules (checks/trace/loss_terms.py) read the result.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import GradientEdge, get_gradient_edge

from gradprobe.checks.trace.candidates import Location
from gradprobe.checks.core.loss_parts import LossParts
from gradprobe.checks.core.torchcompat import tensor_hooks, untraced
from gradprobe.flowchart import module_of

MAX_TERMS = 8  # a sum of more terms (a per-sample sum) is not split
MAX_SHARE_TERMS = 4  # beyond this, the terms' reach is measured but not their share of the gradient
MAX_DEPTH = 8  # linear nodes between the root and a term
MAX_NODES = 20000  # nodes one graph walk visits at most
# nodes that combine scalar terms linearly; a product or a quotient only while one side is a constant; a sum or a
# mean only of stacked (or concatenated) terms: below any other sum or mean lie the elements of one term
_LINEAR = {"AddBackward0", "AddBackward1", "SubBackward0", "SubBackward1", "RsubBackward0", "RsubBackward1",
           "NegBackward0"}
_BY_CONSTANT = {"MulBackward0", "MulBackward1", "DivBackward0", "DivBackward1"}
_REDUCE = {"SumBackward0", "SumBackward1", "MeanBackward0", "MeanBackward1"}
_GATHER = {"StackBackward0", "CatBackward0"}
Edge = tuple[Any, int]


@dataclass
class CutTerm:
    """A value behind a cut that a linear op added to the loss: the term carries no gradient."""

    cuts: frozenset[int]  # the break candidates its value came through
    location: Location | None  # the user line that computed it (where known), else where it was added
    added_at: Location | None  # the user line of the op that added it to the loss


@dataclass
class Term:
    """One term of the loss: the parameters it reaches and, when measured, its gradient norm on each."""

    index: int
    location: Location | None
    reached: frozenset[int] = frozenset()  # parameter ids
    cuts: frozenset[int] = frozenset()  # break candidates whose values enter the term
    norms: dict[int, float] = field(default_factory=dict)  # parameter id -> norm of this term's gradient on it
    shared_cuts: frozenset[int] = frozenset()  # cuts whose input value another term trains through
    cut: CutTerm | None = None  # set for a term that carries no gradient
    name: str | int | None = None  # the dict key or tuple index of a term a loss_fn returned (checks/core/loss_parts.py)
    # cuts that reach this term's graph as a value, and those that reach it only as an index or a sample
    # (checks/cut_uses.py); None: not measured
    value_fed: frozenset[int] | None = None
    sample_fed: frozenset[int] = frozenset()


@dataclass
class TermSplit:
    """The terms of one backward() call's loss."""

    terms: list[Term]
    location: Location | None  # the user line that made the loss
    measured_shares: bool = False
    named: str | None = None  # "dict", "tuple" or "list": the terms are the entries a loss_fn returned
    logged: list[dict[str, Any]] = field(default_factory=list)  # entries cut from the graph that are logged values


def _children(node: Any) -> list[Any]:
    return [n for n, _ in node.next_functions if n is not None]


def _is_linear(node: Any) -> bool:
    name = type(node).__name__
    if name in _LINEAR or name in _GATHER:
        return True
    kids = _children(node)
    if name in _BY_CONSTANT:
        return len(kids) == 1
    return name in _REDUCE and len(kids) == 1 and type(kids[0]).__name__ in _GATHER


def split_edges(root: Any) -> tuple[list[Edge], list[Any]] | None:
    """The term edges under the linear nodes at the root (in source order), and those linear nodes; None when the
    loss is not a sum of at least two terms or of too many."""
    if root is None or not _is_linear(root):
        return None
    terms: list[Edge] = []
    linear: list[Any] = []
    seen: set[tuple[int, int]] = set()
    stack: list[tuple[Any, int, int]] = [(root, 0, 0)]
    while stack:
        node, nr, depth = stack.pop()
        if (id(node), nr) in seen:
            continue
        seen.add((id(node), nr))
        if depth < MAX_DEPTH and _is_linear(node):
            linear.append(node)
            stack.extend((n, k, depth + 1) for n, k in reversed(node.next_functions) if n is not None)
        else:
            terms.append((node, nr))
        if len(terms) > MAX_TERMS:
            return None
    return terms, linear


class Reach:
    """Which parameters the graph behind a node reaches (iterative, memoised per node)."""

    def __init__(self, params: set[int]) -> None:
        self.params = params
        self.memo: dict[int, frozenset[int]] = {}

    def node(self, node: Any) -> frozenset[int]:
        var = getattr(node, "variable", None)
        if var is not None:
            return frozenset({id(var)} & self.params)
        if id(node) in self.memo:
            return self.memo[id(node)]
        order: list[Any] = []
        stack = [node]
        while stack and len(order) < MAX_NODES:  # post-order: children first
            n = stack.pop()
            if id(n) in self.memo:
                continue
            self.memo[id(n)] = frozenset()
            order.append(n)
            stack.extend(c for c, _ in n.next_functions if c is not None and getattr(c, "variable", None) is None)
        for n in reversed(order):
            acc: set[int] = set()
            for c, _ in n.next_functions:
                if c is None:
                    continue
                v = getattr(c, "variable", None)
                if v is not None:
                    if id(v) in self.params:
                        acc.add(id(v))
                else:
                    acc |= self.memo.get(id(c), frozenset())
            self.memo[id(n)] = frozenset(acc)
        return self.memo[id(node)]


def graph_contains(node: Any, targets: set[int]) -> set[int]:
    """Which of the node ids `targets` the graph behind `node` contains (a bounded walk that stops when all are found)."""
    found: set[int] = set()
    seen: set[int] = set()
    stack = [node]
    while stack and len(seen) < MAX_NODES and found != targets:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if id(n) in targets:
            found.add(id(n))
        stack.extend(c for c, _ in n.next_functions if c is not None)
    return found


def behind(reach: Reach, inputs: list[torch.Tensor]) -> frozenset[int]:
    """The parameters (of `reach`) that a cut's input tensors depend on."""
    out: set[int] = set()
    for t in inputs:
        if t.is_leaf:
            out |= {id(t)} & reach.params
        elif t.grad_fn is not None:
            out |= reach.node(t.grad_fn)
    return frozenset(out)


def behind_cut_terms(splits: list[TermSplit], inputs_of: Callable[[int], list[torch.Tensor]],
                     params: Mapping[int, torch.Tensor]) -> frozenset[int]:
    """The parameters behind the cuts of terms that reach nothing: a cut explains why they miss that term."""
    reach = Reach({i for i, p in params.items() if p.requires_grad})
    out: set[int] = set()
    for split in splits:
        for t in split.terms:
            if t.cut is not None and t.cuts:
                out |= behind(reach, inputs_of(max(t.cuts)))
    return frozenset(out)


def _norm(g: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(g.detach(), dtype=torch.float32))


class TermProbe:
    """Measures the terms of one backward() call: `start` before it runs, `finish` after."""

    def __init__(self, split: TermSplit, edges: list[Edge], params: Mapping[int, torch.Tensor]) -> None:
        self.split = split
        self.edges = edges
        self.params = params
        self._hooks: list[Any] = []
        self._total: dict[int, torch.Tensor] = {}  # parameter id -> the gradient the real backward brought it
        self._parts: dict[int, torch.Tensor] = {}  # parameter id -> the sum of the measured terms' gradients
        self._last: Term | None = None

    @classmethod
    def start(cls, root: torch.Tensor, gradient: Any, location: Location | None, params: Mapping[int, torch.Tensor],
              node_info: Callable[[int], tuple[frozenset[int], Location | None]],
              cuts_at: Callable[[int], list[CutTerm]],
              candidate_inputs: Callable[[int], list[torch.Tensor]]) -> TermProbe | None:
        """The probe of a loss that is a sum of terms (None otherwise); computes every term's gradient but the last."""
        found = split_edges(root.grad_fn)
        if found is None:
            return None
        edges, linear = found
        reach = Reach({i for i, p in params.items() if p.requires_grad})
        terms: list[Term] = []
        for i, (node, _) in enumerate(edges):
            cuts, loc = node_info(id(node))
            terms.append(Term(i, loc, reach.node(node), cuts))
        for c in (c for n in linear for c in cuts_at(id(n))):
            terms.append(Term(len(terms), c.location, frozenset(), c.cuts, cut=c))
        if len(terms) < 2:
            return None
        return cls._measured(root, gradient, TermSplit(terms, location), edges, params, candidate_inputs)

    @classmethod
    def start_named(cls, root: torch.Tensor, gradient: Any, parts: LossParts, location: Location | None,
                    params: Mapping[int, torch.Tensor], node_info: Callable[[int], tuple[frozenset[int], Location | None]],
                    cut_of: Callable[[object], tuple[frozenset[int], Location | None, str] | None],
                    candidate_inputs: Callable[[int], list[torch.Tensor]]) -> TermProbe | None:
        """The probe of a total that gradprobe summed from the entries a loss_fn returned: each entry is a term, named
        by its key or index. An entry with no graph behind it is a term that reaches nothing when a detach, an .item()
        or NumPy cut it from a value that is no other entry; it is a logged value when it is such a copy of another
        entry, or when it was computed under no_grad or through an op with no derivative (an accuracy); a constant is
        left out."""
        reach = Reach({i for i, p in params.items() if p.requires_grad})
        terms: list[Term] = []
        edges: list[Edge] = []
        logged: list[dict[str, Any]] = []
        live = [v for _, v in parts.entries if isinstance(v, torch.Tensor) and v.requires_grad]
        for key, value in parts.entries:
            if isinstance(value, torch.Tensor) and value.requires_grad:
                edge = get_gradient_edge(value)
                cuts, loc = node_info(id(edge.node))
                terms.append(Term(len(terms), loc, reach.node(edge.node), cuts, name=key))
                edges.append((edge.node, edge.output_nr))
            elif (cut := cut_of(value)) is not None:
                tags, at, family = cut
                why = _logged_why(family, candidate_inputs(max(tags)), live)
                if why:
                    logged.append({"entry": key, "why": why, "location": at})
                    continue
                terms.append(Term(len(terms), at, frozenset(), tags, cut=CutTerm(tags, at, location), name=key))
                edges.append((None, 0))
        if len(terms) < 2:
            return None
        split = TermSplit(terms, location, named=parts.form, logged=logged)
        return cls._measured(root, gradient, split, edges, params, candidate_inputs)

    @classmethod
    def _measured(cls, root: torch.Tensor, gradient: Any, split: TermSplit, edges: list[Edge],
                  params: Mapping[int, torch.Tensor], candidate_inputs: Callable[[int], list[torch.Tensor]]) -> TermProbe:
        terms = split.terms
        _shared_cuts(terms, edges, candidate_inputs)
        probe = cls(split, edges, params)
        live = [t for t in terms if t.cut is None and t.reached]
        if 2 <= len(live) <= MAX_SHARE_TERMS and root.numel() == 1 and not any(
                tensor_hooks(params[i]) for t in live for i in t.reached):
            probe._term_gradients(root, gradient, live)
        return probe

    def _term_gradients(self, root: torch.Tensor, gradient: Any, live: list[Term]) -> None:
        """Each live term's gradient but the last's, weighted by what the root sends it; hooks catch the total."""
        edges = [GradientEdge(*self.edges[t.index]) for t in live]
        with untraced():
            weights = torch.autograd.grad(root, edges, grad_outputs=gradient, retain_graph=True, allow_unused=True)
            for t, edge, w in zip(live[:-1], edges, weights, strict=False):
                ids = sorted(t.reached)
                if w is None:
                    continue
                grads = torch.autograd.grad([edge], [self.params[i] for i in ids], grad_outputs=[w], retain_graph=True,
                                            allow_unused=True)
                t.norms = {i: _norm(g) for i, g in zip(ids, grads, strict=True) if g is not None}
                for i, g in zip(ids, grads, strict=True):
                    if g is not None:
                        self._parts[i] = g if i not in self._parts else self._parts[i] + g
        last = live[-1]
        for i in last.reached:
            self._hooks.append(self.params[i].register_hook(self._catch(i)))
        self._last = last
        self.split.measured_shares = True

    def _catch(self, i: int) -> Callable[[torch.Tensor], None]:
        def hook(g: torch.Tensor) -> None:
            self._total[i] = g
        return hook

    def finish(self) -> TermSplit:
        """After the real backward: the last term's gradient is the total minus the others'."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._last is not None:
            parts = self._parts
            with untraced(), torch.no_grad():
                self._last.norms = {i: _norm(g - parts[i] if i in parts else g) for i, g in self._total.items()}
        self._total = {}
        self._parts = {}
        return self.split


_TERM_CUTS = ("detach", "left", "process")  # cuts that make a loss term a constant; no_grad or argmax make metrics


def _logged_why(family: str, inputs: list[torch.Tensor], live: list[torch.Tensor]) -> str | None:
    """Why an entry cut from the graph is a logged value rather than a term (None: it is a term that reaches nothing)."""
    if family not in _TERM_CUTS:
        return f"a value computed {'under no_grad' if family == 'no_grad' else 'through an op with no derivative'}: a metric"
    nodes = {id(v.grad_fn) for v in live if v.grad_fn is not None}
    if any(any(x is v for v in live) or (x.grad_fn is not None and id(x.grad_fn) in nodes) for x in inputs):
        return "a detached copy of another entry: a logged value"
    return None


def _shared_cuts(terms: list[Term], edges: list[Edge], candidate_inputs: Callable[[int], list[torch.Tensor]]) -> None:
    """For each term, the cuts whose input value another term trains through (a stop-gradient split by design:
    SimSiam, the VQ-VAE codebook and commitment terms, a GAN's detached fakes beside the generator's term)."""
    for t in terms:
        inputs = {c: [x.grad_fn for x in candidate_inputs(c) if not x.is_leaf and x.grad_fn is not None] for c in t.cuts}
        targets = {id(n) for ns in inputs.values() for n in ns}
        if not targets:
            continue
        found: set[int] = set()
        for o in terms:
            if o is not t and o.cut is None:
                found |= graph_contains(edges[o.index][0], targets - found)
        t.shared_cuts = frozenset(c for c, ns in inputs.items() if any(id(n) in found for n in ns))


def shares(split: TermSplit, module_of: Callable[[int], str]) -> Iterator[tuple[Term, dict[str, float]]]:
    """Each term and its share of each module's gradient norm (this term's norm over the sum of the terms' norms)."""
    per: list[dict[str, float]] = []
    for t in split.terms:
        sq: dict[str, float] = {}
        for i, n in t.norms.items():
            m = module_of(i)
            sq[m] = sq.get(m, 0.0) + n * n
        per.append({m: math.sqrt(v) for m, v in sq.items()})
    totals: dict[str, float] = {}
    for d in per:
        for m, v in d.items():
            totals[m] = totals.get(m, 0.0) + v
    for t, d in zip(split.terms, per, strict=True):
        yield t, {m: round(v / totals[m], 3) for m, v in sorted(d.items()) if totals[m] > 0}


def term_table(split: TermSplit, names: dict[int, list[str]], candidates: list[Any]) -> list[dict[str, Any]]:
    """The per-term table of one split: each term's line, the modules it reaches, its share of their gradient norm
    (when measured), and the cuts its value came through."""
    def module(i: int) -> str:
        return module_of(names[i][0]) if i in names else "?"

    rows: list[dict[str, Any]] = []
    for t, share in shares(split, module):
        row: dict[str, Any] = {"term": t.index, "location": t.location,
                               "reaches": sorted({module(i) for i in t.reached})[:40]}
        if t.name is not None:
            row["name"] = t.name
        if split.measured_shares and t.norms:
            row["share_of_grad_norm"] = dict(list(share.items())[:40])
        cuts = [candidates[c] for c in sorted(t.cuts)[-3:]]
        if cuts:
            row["through_cuts"] = [{"op": c.op, "kind": c.kind, "location": c.where()} for c in cuts]
        if t.cut is not None:
            row["reaches_nothing"] = True
            row["added_at"] = t.cut.added_at
        rows.append(row)
    return rows
