"""The first op of a captured FX graph whose value or gradient the backend computes differently from eager.

What dynamo's accuracy minifier does (pytorch/torchdynamo#1291: "takes the extracted Fx subgraph, runs that eagerly,
and then with compiler_fn ... and compares"), on the graphs a recording backend kept with the real tensors of their
first call: each graph is run as it is (its ops, one by one, in eager) and as the backend compiled it, on the same
seed, comparing the outputs and the gradients of the graph's inputs against a fixed cotangent. In a graph that
differs, graphs cut after one op each (all of its inputs, the op's value as the output) are compiled by the same
backend and compared the same way: a bisection finds the first op whose value or gradient differs, and the op's
`stack_trace` meta gives the user's line.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

RTOL = 1e-3  # as GP701's comparison (engine.py)
Backend = Callable[[torch.fx.GraphModule, list[Any]], Callable[..., Any]]


def _tensors(out: Any) -> list[torch.Tensor]:
    items = out if isinstance(out, (tuple, list)) else (out,)
    return [t for t in items if isinstance(t, torch.Tensor)]


def _run(fn: Callable[..., Any], inputs: list[Any]) -> list[torch.Tensor]:
    """The outputs and the gradients of the inputs that require grad, against a fixed cotangent per output."""
    ins = [t.detach().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
           for t in inputs]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4321)
        outs = _tensors(fn(*ins))
    gen = torch.Generator().manual_seed(99)
    diff = [o for o in outs if o.requires_grad and o.is_floating_point()]
    wrt = [t for t in ins if isinstance(t, torch.Tensor) and t.requires_grad]
    grads: list[torch.Tensor] = []
    if diff and wrt:
        loss = torch.stack([(o.float() * torch.randn(o.shape, generator=gen)).sum() for o in diff]).sum()
        got = torch.autograd.grad(loss, wrt, allow_unused=True)
        grads = [g.detach().float() if g is not None else torch.zeros(t.shape) for g, t in zip(got, wrt, strict=True)]
    return [o.detach().float() for o in outs] + grads


def _differ(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    if len(a) != len(b):
        return True
    for x, y in zip(a, b, strict=True):
        if x.shape != y.shape:
            return True
        rel = float((x - y).norm()) / max(float(x.norm()), 1e-12)
        if rel > RTOL and float((x - y).abs().max()) > 1e-6:
            return True
    return False


def _cut(gm: torch.fx.GraphModule, last: torch.fx.Node) -> torch.fx.GraphModule:
    """The graph's placeholders and ops up to `last`, returning `last`'s value."""
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in gm.graph.nodes:
        if n.op == "output":
            break
        env[n] = g.node_copy(n, lambda x: env[x])
        if n is last:
            break
    g.output((env[last],))
    return torch.fx.GraphModule(gm, g)


def _ops(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The ops whose value is a floating tensor (what can be compared)."""
    out = []
    for n in gm.graph.nodes:
        v = n.meta.get("example_value")
        if n.op in ("call_function", "call_method", "call_module") and isinstance(v, torch.Tensor) and v.is_floating_point():
            out.append(n)
    return out


def _cut_differs(gm: torch.fx.GraphModule, node: torch.fx.Node, inputs: list[Any], backend: Backend) -> bool:
    sub = _cut(gm, node)
    return _differ(_run(sub, inputs), _run(backend(_cut(gm, node), list(inputs)), inputs))


def first_differing_op(graphs: list[tuple[torch.fx.GraphModule, list[Any]]], backend: Backend,
                       ) -> tuple[int, torch.fx.Node] | None:
    """(the graph's index, its first op whose value or gradient differs under `backend`), or None."""
    for i, (gm, inputs) in enumerate(graphs):
        if not _differ(_run(gm, inputs), _run(backend(copy.deepcopy(gm), list(inputs)), inputs)):
            continue
        ops = _ops(gm)
        if not ops or not _cut_differs(gm, ops[-1], inputs, backend):
            continue
        lo, hi = 0, len(ops) - 1  # ops[hi] differs; find the first that does
        while lo < hi:
            mid = (lo + hi) // 2
            if _cut_differs(gm, ops[mid], inputs, backend):
                hi = mid
            else:
                lo = mid + 1
        return i, ops[lo]
    return None
