"""Where a gradient became exactly zero: the multiply by an all-zero mask or scale, the `where` whose condition
selects nothing, the activation whose every input was in its dead region, the index op that selected nothing,
measured during one traced step (GP318 reads it; checks/trace/zeroing_rules.py; the last two: checks/trace/dead_ops.py).

Two measurements, both cheap on a healthy step. While the forward runs, `ZeroOpWatch.note` looks only at the
multiplies and `where`s that combine a value requiring grad with something else, and keeps those whose other operand
is zero everywhere (a scalar 0, an all-zero mask) or whose condition leaves the differentiable branch nothing, with
the user line, the node autograd made for it, and what its expression is (read back at once by `read`, from the user
frame's current names: checks/trace/zero_expr.py). Only when such
an op was seen, `arm` (called just before backward) puts a hook on that node alone: it records whether a nonzero
gradient reached the node and whether the node passed zero on to its inputs, and which parameters lie behind it.
A parameter whose gradient ended exactly zero and lies behind a node that received a nonzero gradient and passed on
zero was zeroed there. An empty selection passes on an empty gradient: there, the node being reached at all is
enough. A parameter that reads the output of a dead activation directly (the next layer's weight: its input was all
zeros) is named with it; a dead activation that got the same gradient everywhere is a term summed straight into the
loss (a hinge whose every margin is met). Nothing else in the graph is hooked.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar


import torch

from gradprobe.checks.trace.dead_ops import DEAD_OPS, INDEX_OPS, DeadRegion, dead_activation, empty_selection
from gradprobe.userframes import UserCode

Loc = dict[str, Any]
P = TypeVar("P", bound=torch.Tensor)

MUL_OPS = frozenset({"mul", "__mul__", "__rmul__", "multiply"})
WHERE_OPS = frozenset({"where"})
ZERO_WATCHED = MUL_OPS | WHERE_OPS | DEAD_OPS | INDEX_OPS
# ops that draw random numbers: a mask made from a draw (stochastic depth's floor(keep + rand), a dropout mask) that
# came out all zero dropped every sample at this step by chance, by design: GP318 says so as information
RANDOM_OPS = frozenset({"rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "bernoulli", "bernoulli_",
                        "uniform_", "normal_", "normal", "exponential_", "geometric_", "random_", "multinomial", "randperm"})
MAX_RECORDS = 32  # zeroing ops kept per step
MAX_NODES = 200_000  # graph nodes walked to find the parameters behind one op


@dataclass
class ZeroOp:
    """One op that multiplied a differentiable value by zero (or selected none of it)."""

    kind: str  # "scale" (a scalar 0), "mask" (an all-zero tensor), "where" (a condition that selects nothing),
    # "random" (an all-zero mask computed from a random draw: chance at this step, by design), "dead" (an activation
    # whose every input was in its dead region) or "index" (an index op that selected nothing)
    op: str
    location: Loc | None
    zero: Any  # the zero operand (kept alive: compared by identity when the expression is read back)
    shape: list[int]
    env: tuple[dict[str, Any], dict[str, Any]] | None  # (locals, globals) of the user frame that ran the op
    node: Any = None  # the autograd node the op made
    source: Any = None  # what `read` made of it while the frame's values were current (zero_expr.ZeroSource)
    reached: bool = False  # a nonzero gradient reached the node
    zero_slots: tuple[bool, ...] = ()  # ... and, per input of the node, whether it passed only zeros there
    behind: list[set[int]] = field(default_factory=list)  # per input of the node: id() of the parameters behind it
    dead: DeadRegion | None = None  # kind "dead": the region and what was measured of the inputs
    selectable: int = 0  # kind "index": how many positions the index could select (it selected none)
    readers: set[int] = field(default_factory=set)  # kind "dead": parameters an op combined with its (all-zero) output
    module: torch.nn.Module | None = None  # the innermost module whose forward ran the op

    def zeroed(self, p: torch.Tensor) -> bool:
        """A nonzero gradient reached the node, and every input of it that leads to `p` got only zeros."""
        if self.reached and id(p) in self.readers:
            return True
        slots = [i for i, ids in enumerate(self.behind) if id(p) in ids]
        return self.reached and bool(slots) and all(i < len(self.zero_slots) and self.zero_slots[i] for i in slots)


def _is_zero_scalar(v: Any) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float, torch.Tensor)):
        return False
    if isinstance(v, torch.Tensor):
        return v.dim() == 0 and not v.requires_grad and not bool(v.any())
    return v == 0


def _all_zero(t: Any) -> bool:
    return (isinstance(t, torch.Tensor) and not t.requires_grad and t.numel() > 0 and t.dim() > 0
            and not bool(t.any()))


def _user_frame(user: UserCode) -> Any:
    f: Any = sys._getframe(1)
    while f is not None and not user.is_user_file(f.f_code.co_filename):
        f = f.f_back
    return f


def _running_module() -> torch.nn.Module | None:
    """The innermost module whose forward is on the stack (names an op run inside a library module: nn.ReLU)."""
    f: Any = sys._getframe(1)
    while f is not None:
        owner = f.f_locals.get("self") if f.f_code.co_name == "forward" else None
        if isinstance(owner, torch.nn.Module):
            return owner
        f = f.f_back
    return None


def _uniform(g: Any) -> bool:
    """Whether a gradient is the same nonzero value everywhere: its value was summed (or averaged) into the loss."""
    if not isinstance(g, torch.Tensor) or g.numel() == 0:
        return False
    first = g.flatten()[0]
    return bool(first != 0) and bool((g == first).all())


def _behind(node: Any, params: Mapping[int, torch.Tensor], seen: set[int]) -> set[int]:
    """The parameters whose AccumulateGrad lies under `node` in the graph."""
    out: set[int] = set()
    stack = [node]
    while stack and len(seen) < MAX_NODES:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        var = getattr(n, "variable", None)
        if var is not None and id(var) in params:
            out.add(id(var))
        stack.extend(nf for nf, _ in getattr(n, "next_functions", ()))
    return out


class ZeroOpWatch:
    """Called by the tracer for multiplies and `where`s on values that require grad, and before each backward."""

    def __init__(self, user: UserCode, params: Mapping[int, torch.Tensor], read: Callable[[ZeroOp], Any]) -> None:
        self.user, self.params, self.read = user, params, read
        self.ops: list[ZeroOp] = []
        self._handles: list[Any] = []
        self._drawn: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self._dead_outs: dict[int, tuple[torch.Tensor, ZeroOp]] = {}  # outputs of dead activations, until disarm

    def _is_drawn(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and self._drawn.get(id(t)) is t

    def drawn(self, name: str, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        """An op on values that do not require grad ran: its outputs are random if it draws or reads a random value."""
        if name not in RANDOM_OPS and not (self._drawn and any(self._is_drawn(a) for a in (*args, *kwargs.values()))):
            return
        for o in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(o, torch.Tensor):
                self._drawn[id(o)] = o

    def note(self, name: str, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        """An op on values that require grad ran: kept if it multiplied them by zero (or selected none of them)."""
        if self._dead_outs:
            self._read_dead(args, kwargs, out)
        if name not in ZERO_WATCHED or len(self.ops) >= MAX_RECORDS or not isinstance(out, torch.Tensor) or out.grad_fn is None:
            return
        found = self._zero_operand(name, args, kwargs)
        dead = dead_activation(name, args, kwargs, out, self.params) if found is None else None
        selected = empty_selection(name, args, kwargs, out) if found is None and dead is None else None
        if dead is not None:
            found = ("dead", None)
        elif selected is not None:
            found = ("index", selected[0])
        if found is None:
            return
        kind, zero = found
        if self._is_drawn(zero):  # a mask drawn at random (dropout, stochastic depth) that dropped everything this time
            kind = "random"
        frame = _user_frame(self.user)
        loc = (self.user.location_of(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
               if frame is not None else None)
        env = (dict(frame.f_locals), frame.f_globals) if frame is not None else None
        shape = list(zero.shape) if isinstance(zero, torch.Tensor) else list(out.shape) if dead is not None else []
        rec = ZeroOp(kind, name, loc, zero, shape, env, node=out.grad_fn, dead=dead,
                     selectable=selected[1] if selected is not None else 0, module=_running_module())
        if dead is not None:
            self._dead_outs[id(out)] = (out, rec)
        try:  # now: a step counter the step advances later would read differently after it
            rec.source = self.read(rec)
        except Exception:  # reading the user's expression back must never break their step: left unread
            rec.source = None
        rec.env = None
        self.ops.append(rec)

    def _read_dead(self, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        """An op that reads the (all-zero) output of a dead activation: the parameters it combines with it; an output
        that is still all zero (a view, a flatten, a dropout of it) is followed as the activation's output."""
        tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
        recs = [hit[1] for t in tensors if (hit := self._dead_outs.get(id(t))) is not None and hit[0] is t]
        if not recs:
            return
        read = {id(t) for t in tensors if id(t) in self.params and self.params[id(t)] is t}
        for rec in recs:
            rec.readers.update(read)
        if not read and isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel() \
                and len(self._dead_outs) < MAX_RECORDS * 8 and not bool(out.any()):
            self._dead_outs[id(out)] = (out, recs[0])

    @staticmethod
    def _zero_operand(name: str, args: Any, kwargs: dict[str, Any]) -> tuple[str, Any] | None:
        if name in MUL_OPS and len(args) + len(kwargs) >= 2:
            a, b = args[0], (args[1] if len(args) > 1 else kwargs.get("other"))
            for x, y in ((a, b), (b, a)):
                if isinstance(y, torch.Tensor) and y.requires_grad:
                    if _is_zero_scalar(x):
                        return "scale", x
                    if _all_zero(x):
                        return "mask", x
            return None
        if name in WHERE_OPS and len(args) >= 3 and isinstance(args[0], torch.Tensor) and args[0].dtype == torch.bool:
            cond, x, y = args[0], args[1], args[2]
            if isinstance(x, torch.Tensor) and x.requires_grad and cond.numel() and not bool(cond.any()):
                return "where", cond
            if isinstance(y, torch.Tensor) and y.requires_grad and cond.numel() and bool(cond.all()):
                return "where", cond
        return None

    def arm(self) -> None:
        """Before a backward: hook the nodes of the zeroing ops seen so far (not yet hooked)."""
        for rec in self.ops:
            if rec.node is None or rec.behind:
                continue
            rec.behind = [_behind(nf, self.params, set()) for nf, _ in rec.node.next_functions]
            if any(rec.behind):
                self._handles.append(rec.node.register_hook(self._hook(rec)))

    @staticmethod
    def _hook(rec: ZeroOp) -> Any:
        def hook(grad_inputs: tuple[Any, ...], grad_outputs: tuple[Any, ...]) -> None:
            # an empty selection gets an empty gradient: reaching it is enough
            if rec.selectable or any(isinstance(g, torch.Tensor) and bool(g.any()) for g in grad_outputs):
                rec.reached = True
                rec.zero_slots = tuple(not (isinstance(g, torch.Tensor) and bool(g.any())) for g in grad_inputs)
                if rec.dead is not None:
                    rec.dead.summed = _uniform(grad_outputs[0])
        return hook

    def disarm(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for rec in self.ops:
            rec.node = None  # the graph is the step's own; keep nothing of it
        self._dead_outs.clear()

    def zeroed(self, params: Sequence[P]) -> list[tuple[ZeroOp, list[P]]]:
        """For each zeroing op, the given (zero-gradient) parameters it zeroed."""
        out = []
        for rec in self.ops:
            hit = [p for p in params if rec.zeroed(p)]
            if hit:
                out.append((rec, hit))
        return out
