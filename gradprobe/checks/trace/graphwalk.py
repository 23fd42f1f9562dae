"""Walks of the autograd graph behind a break candidate: which parameters it reaches, and the user lines on the way."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from gradprobe.checks.trace.candidates import Candidate
from gradprobe.checks.trace.recording import GradTracer


class _Reach:
    """Which target parameters the autograd graph behind a node reaches (an iterative DFS, memoised per node)."""

    def __init__(self, targets: set[int]) -> None:
        self.targets = targets
        self.memo: dict[int, frozenset[int]] = {}

    def _descend(self, it: Iterator[Any], acc: set[int]) -> Any:
        """The next child of a node still to walk (None when its children are done); leaves and known nodes go to acc."""
        for child, _ in it:
            if child is None:
                continue
            var = getattr(child, "variable", None)
            if var is not None:
                if id(var) in self.targets:
                    acc.add(id(var))
                continue
            ck = id(child)
            if ck in self.memo:
                acc |= self.memo[ck]
                continue
            self.memo[ck] = frozenset()
            return child
        return None

    def node(self, node: Any) -> frozenset[int]:
        if node is None:
            return frozenset()
        key = id(node)
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = frozenset()
        stack: list[tuple[Any, Iterator[Any], set[int]]] = [(node, iter(node.next_functions), set())]
        while stack:
            n, it, acc = stack[-1]
            child = self._descend(it, acc)
            if child is not None:
                stack.append((child, iter(child.next_functions), set()))
                continue
            stack.pop()
            self.memo[id(n)] = frozenset(acc)
            if stack:
                stack[-1][2].update(acc)
        return self.memo[key]


def reach(cands: list[Candidate], targets: set[int]) -> dict[int, set[int]]:
    """candidate index -> the target parameter ids its inputs' autograd graph reaches (memoised DFS)."""
    walk = _Reach(targets)
    out = {}
    for c in cands:
        hit: set[int] = set()
        for t in c.inputs:
            if t.is_leaf:
                if id(t) in targets:
                    hit.add(id(t))
            else:
                hit |= walk.node(t.grad_fn)
        out[c.index] = hit
    return out


def chain(cand: Candidate, target_id: int, tracer: GradTracer, limit: int = 400) -> list[dict[str, Any]]:
    """User lines on one autograd path from the break's input back to the parameter."""
    for t in cand.inputs:
        if t.is_leaf:
            if id(t) == target_id:
                return []
            continue
        start: Any = t.grad_fn
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
        path: list[dict[str, Any]] = []
        k = parents[found]
        while k is not None and len(path) < limit:
            loc = tracer.grad_fn_loc.get(k)
            if loc and (not path or (path[-1]["line"], path[-1]["file"]) != (loc["line"], loc["file"])):
                path.append(loc)
            k = parents.get(k)
        seen: set[tuple[str, int]] = set()
        out: list[dict[str, Any]] = []
        for loc in path:  # parameter side first
            key = (loc["file"], loc["line"])
            if key not in seen:
                seen.add(key)
                out.append(loc)
        return out
    return []
