"""How a value behind a cut is used on its way into a loss term: as a value, or only as an index or a sample.

A cut (a detach, a no_grad block) whose value a term feeds through modules it trains is GP316's situation when the
value flows on *as a value* (a VAE whose decoder reads a detached latent). The same cut is the design when the value
reaches the term only as indices (a VQ-VAE that computes its codebook indices from a detached encoding: argmin has no
derivative, so the cut changes nothing for that term) or only through positions drawn from it (NeRF's hierarchical
sampling: the coarse weights place the fine samples through searchsorted, and the fine term is meant to be blind to
the sampler). Which of the two happened is measured while the step runs, per op that carries cut tags
(checks/trace/recording.py calls `note`):

- a tag becomes *sampled* in a tensor when the tensor is an integer or bool result of tagged values (an index, a
  mask), or the output of a sampling op (searchsorted, multinomial, bernoulli ...); it stays sampled in every value
  computed from that tensor (an inverse-CDF sample gathered from the CDF with those indices);
- a cut made on a value that already carries a tag that went through a sampling op is sampled at birth (NeRF's
  `sample_pdf(...).detach()`);
- where an op combines tagged values with a parameter, its autograd node is noted with the tags that came in as
  values and those that came in sampled.

Before backward() runs, `mark_terms` walks each term's graph for those nodes: a cut reaches the term by value when a
node of the term's graph took it as a value, and only as an index or a sample when every such node took it sampled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gradprobe.checks.core.step import tensors_in
from gradprobe.checks.trace.candidates import Location, outputs
from gradprobe.userframes import UserCode

Tags = frozenset[int]
# ops that draw positions or categories from the values they are given (a CDF, probabilities)
SAMPLING_OPS = frozenset({"searchsorted", "bucketize", "multinomial", "bernoulli", "poisson", "binomial"})
MAX_NODES = 20000  # nodes one term's walk visits at most; beyond it the use is not judged
_EMPTY: Tags = frozenset()


class CutUses:
    """Per tensor, the cut tags it carries only as an index or a sample; per autograd node that read a parameter, the
    tags that came in as values and as indices or samples."""

    def __init__(self, tags: Mapping[int, Tags], params: Mapping[int, Any], user: UserCode) -> None:
        self.tags = tags  # the tracer's own: id(tensor) -> every cut tag it carries
        self.params = params
        self.user = user
        self.sampled: dict[int, Tags] = {}  # id(tensor) -> the tags it carries only as an index or a sample
        self.sampling: set[int] = set()  # tags that went through a sampling op
        self.sites: dict[int, dict[str, Any]] = {}  # tag -> the op (and line) where it first became an index or sample
        self.nodes: dict[int, tuple[Tags, Tags]] = {}  # id(grad_fn) that read a parameter -> (value tags, sampled tags)
        self._keep: list[Any] = []

    def note(self, name: str, args: Any, kwargs: dict[str, Any], out: Any, tags: Tags) -> None:
        """An op whose inputs (or output, a new cut) carry the cut tags `tags`."""
        given: set[int] = set()
        sampled_in: set[int] = set()
        values_in: set[int] = set()
        reads_param = False
        for t in tensors_in(args, kwargs):
            tid = id(t)
            reads_param = reads_param or tid in self.params
            tg = self.tags.get(tid)
            if not tg:
                continue
            s = self.sampled.get(tid, _EMPTY)
            given |= tg
            sampled_in |= s
            if t.is_floating_point() or t.is_complex():
                values_in |= tg - s
        outs = outputs(out)
        if not outs:
            return
        new = tags - given  # a cut this op made
        if name in SAMPLING_OPS or not (outs[0].is_floating_point() or outs[0].is_complex()):
            s_out = tags
            self._site(name, tags - sampled_in, name in SAMPLING_OPS)
        elif new and sampled_in & self.sampling:  # a cut on a sample (NeRF's sample_pdf(...).detach()): sampled at birth
            s_out = frozenset(sampled_in | new)
            self.sampling |= new
            origin = self.sites.get(min(sampled_in & self.sampling))
            for tag in new:
                if origin is not None:
                    self.sites.setdefault(tag, origin)
        else:
            s_out = frozenset(sampled_in)
        if s_out:
            for o in outs:
                self.sampled[id(o)] = s_out
            self._keep.append(out)
        if reads_param:
            for o in outs:
                if o.grad_fn is not None:
                    self.nodes[id(o.grad_fn)] = (frozenset(values_in), frozenset(sampled_in))

    def _site(self, name: str, tags: Tags, sampling: bool) -> None:
        if sampling:
            self.sampling |= tags
        if tags:
            loc: Location | None = self.user.innermost(skip=4)
            for t in tags:
                self.sites.setdefault(t, {"op": name, "location": loc, "sampling": sampling})

    def mark_terms(self, terms: list[Any], edges: list[tuple[Any, int]]) -> None:
        """For each term with cuts, the cuts a node of its graph took as a value (`value_fed`) and those it took only
        as an index or a sample (`sample_fed`); left unmeasured (None) where the walk was cut short."""
        if not self.nodes:
            for t in terms:
                if t.cuts:
                    t.value_fed, t.sample_fed = _EMPTY, _EMPTY
            return
        for t in terms:
            node = edges[t.index][0] if t.index < len(edges) else None
            if not t.cuts or node is None:
                continue
            found = _walk(node, {n for n, (v, s) in self.nodes.items() if (v | s) & t.cuts})
            if found is None:
                continue
            value = frozenset().union(*(self.nodes[n][0] for n in found)) & t.cuts
            t.value_fed = value
            t.sample_fed = frozenset().union(*(self.nodes[n][1] for n in found)) & t.cuts - value

    def site(self, tag: int) -> dict[str, Any] | None:
        return self.sites.get(tag)


def _walk(root: Any, targets: set[int]) -> set[int] | None:
    """Which of the node ids `targets` the graph behind `root` contains; None when the walk hit its bound first."""
    found: set[int] = set()
    if not targets:
        return found
    seen: set[int] = set()
    stack = [root]
    while stack:
        if len(seen) >= MAX_NODES:
            return None
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if id(n) in targets:
            found.add(id(n))
            if found == targets:
                return found
        stack.extend(c for c, _ in n.next_functions if c is not None)
    return found
