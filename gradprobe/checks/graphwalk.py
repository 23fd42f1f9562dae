"""Walks of the autograd graph behind a break candidate: which parameters it reaches, and the user lines on the way."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from gradprobe.checks.tracer import Candidate, GradTracer


def reach(cands: list[Candidate], targets: set[int]) -> dict[int, set[int]]:
    """candidate index -> the target parameter ids its inputs' autograd graph reaches (memoised DFS)."""
    memo: dict[int, frozenset] = {}

    def reach_node(node) -> frozenset:
        if node is None:
            return frozenset()
        key = id(node)
        if key in memo:
            return memo[key]
        memo[key] = frozenset()
        stack: list[tuple[Any, Iterator[Any], set[int]]] = [(node, iter(node.next_functions), set())]
        while stack:
            n, it, acc = stack[-1]
            advanced = False
            for child, _ in it:
                if child is None:
                    continue
                var = getattr(child, "variable", None)
                if var is not None:
                    if id(var) in targets:
                        acc.add(id(var))
                    continue
                ck = id(child)
                if ck in memo:
                    acc |= memo[ck]
                    continue
                memo[ck] = frozenset()
                stack.append((child, iter(child.next_functions), set()))
                advanced = True
                break
            if not advanced:
                stack.pop()
                memo[id(n)] = frozenset(acc)
                if stack:
                    stack[-1][2].update(acc)
        return memo[key]

    out = {}
    for c in cands:
        hit: set[int] = set()
        for t in c.inputs:
            if t.is_leaf:
                if id(t) in targets:
                    hit.add(id(t))
            else:
                hit |= reach_node(t.grad_fn)
        out[c.index] = hit
    return out


def chain(cand: Candidate, target_id: int, tracer: GradTracer, limit: int = 400) -> list[dict]:
    """User lines on one autograd path from the break's input back to the parameter."""
    for t in cand.inputs:
        if t.is_leaf:
            if id(t) == target_id:
                return []
            continue
        start = t.grad_fn
        parents: dict[int, int | None] = {id(start): None}
        nodes = {id(start): start}
        q = deque([start])
        found = None
        while q and len(parents) < 20000:
            n = q.popleft()
            for child, _ in n.next_functions:
                if child is None or id(child) in parents:
                    continue
                var = getattr(child, "variable", None)
                parents[id(child)] = id(n)
                nodes[id(child)] = child
                if var is not None and id(var) == target_id:
                    found = id(child)
                    q.clear()
                    break
                q.append(child)
        if found is None:
            continue
        path: list[dict] = []
        k = parents[found]
        while k is not None and len(path) < limit:
            loc = tracer.grad_fn_loc.get(k)
            if loc and (not path or (path[-1]["line"], path[-1]["file"]) != (loc["line"], loc["file"])):
                path.append(loc)
            k = parents.get(k)
        seen, out = set(), []
        for loc in path:  # parameter side first
            key = (loc["file"], loc["line"])
            if key not in seen:
                seen.add(key)
                out.append(loc)
        return out
    return []
