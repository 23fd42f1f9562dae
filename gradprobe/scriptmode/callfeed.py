"""Batches made without a DataLoader, for the paired runs (scriptmode/paired.py, pairwatch.py): what the model's forward
and the loss function received, recorded in the setup under test and fed to the reference.

A script that draws its batch itself (torch.randn per step, nanoGPT's get_batch from a memmap with torch.randint
indices, a list sliced by hand) has no DataLoader yield to replace. Its inputs are taken where they enter the
computation instead: each grad-enabled top-level module call (the model, a loss module) and each torch.nn.functional
loss called outside a module. Setup A records, per backward() (a micro-batch's calls) and per optimizer step, the
tensors among their arguments that do not require grad (the batch: ids, targets, masks); the tensors that require grad
are computed by the step itself and left alone. The reference replaces those arguments at the same calls by A's:

- the reference's step i is A's step i, each of its M micro-batches (backward() calls) fed u = (A's micro-batches of
  that step, over every rank) / M of them joined, micro-batch-major over the ranks. M is first guessed (the N ranks'
  joined per micro-batch: a script whose accumulation does not change with the world size; k joined for the
  accumulation comparison); when the reference's first step does not fit the guess (a script that scales its
  accumulation with the world size, as nanoGPT does, runs N times the micro-batches, each fed one), that step measured
  M instead: it is run again, fed, and the reference takes one step more than the setup under test. A tensor equal in
  every joined part (a mask, a table) keeps the reference's own;
- the calls must match (the same callable at each position, every part consumed); anything else is said
  (`feed_error`) and the comparison refused, never judged.

What is not fed must not reach the loss: at each backward() in A, the loss's graph outside the recorded calls (from
the loss to the calls' outputs, and from the calls' computed inputs to what made them) is walked; an operation there
that takes a tensor without gradient that is not a scalar (`out - y` with y drawn by the script, an index built from
its data) is an input gradprobe cannot feed: the comparison is refused with its line (`unfed`). A scalar there (a
Python number, or a count the script computed from its own batch: the graph does not tell them apart) is recorded per
backward() (`loss_scalars`); one whose value varies between ranks, micro-batches or steps comes from the data, and a
difference measured while it is in the loss is not attributed to the code (checks/equivalence/measured.py).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.nn as nn

from gradprobe.checks.equivalence.batches import Unjoinable, join, map_tensors, merge, nbytes, tensors_of

LOSSES = ("cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
          "binary_cross_entropy_with_logits", "kl_div", "poisson_nll_loss", "gaussian_nll_loss", "cosine_embedding_loss",
          "margin_ranking_loss", "hinge_embedding_loss", "soft_margin_loss", "multilabel_soft_margin_loss",
          "multi_margin_loss", "triplet_margin_loss", "ctc_loss")
MAX_WALK = 20000  # graph nodes outside the recorded calls
MAX_RECORDED_BYTES = 1 << 30  # recorded per process: the calls' inputs here, the batches in pairwatch.py
MAX_SCALARS = 32
_LEAF = "torch::autograd::AccumulateGrad"


def rng_digest() -> str:
    state = torch.default_generator.get_state()
    return hashlib.blake2b(bytes(state.numpy()), digest_size=8).hexdigest()


def _inputs(obj: Any) -> Any:
    """A call's arguments as recorded: each tensor without gradient copied to the CPU, None where one requires grad."""
    return map_tensors(obj, lambda t: None if t.requires_grad else t.detach().to("cpu", copy=True))  # type: ignore[arg-type,return-value]


def _nodes(obj: Any) -> list[Any]:
    return [t.grad_fn for t in tensors_of(obj) if t.grad_fn is not None]


class CallWatch:
    """The calls' side of a PairWatch (`w`): installed with it; A records, B is fed (see the module docstring)."""

    def __init__(self, w: Any, feed_calls: dict[int, list[list[dict[str, Any]]]] | None, guess: int | None = None):
        self.w = w
        self.feed = feed_calls  # B: step -> A's micro-batches (each a list of calls), over every rank
        self.recording = w.role == "A"  # A: until the first backward() shows the batches come from no DataLoader
        self.steps: dict[int, list[list[dict[str, Any]]]] = {}  # A: step -> micro-batches -> calls
        self.open: list[dict[str, Any]] = []
        self.outputs: dict[int, list[Any]] = {}  # id(grad_fn of a call's output) -> its computed inputs' grad_fns
        self._alive: list[Any] = []  # the nodes above, kept alive for the step (their ids are the keys)
        self.unfed: dict[str, Any] | None = None
        self.scalars: dict[int, list[list[float]]] = {}  # step -> per backward(): the scalar operands outside the calls
        self.random_in_call: dict[str, Any] | None = None
        self.bytes = 0
        # B
        self.group = 0  # micro-batches (backward calls) done in this step
        self.call = 0  # calls made in this micro-batch
        self.calibration: dict[str, Any] | None = None
        self.u: int | None = guess  # A's micro-batches fed per backward(): first guessed, then measured
        self.spoiled = False  # the guess was wrong at this step: it is run again, as the calibration
        self.fed = 0
        self.feed_error: str | None = None

    @property
    def mode(self) -> bool:
        """The batches come from calls, not a DataLoader (A: decided at the first backward; B: it is fed calls)."""
        return self.feed is not None if self.w.role == "B" else self.recording

    # ---- install ------------------------------------------------------------------------------------------------
    def install(self) -> None:
        import torch.nn.functional as F

        watch = self
        orig_call = nn.Module.__call__

        def module_call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            if not watch._wanted():
                return orig_call(module, *args, **kwargs)
            return watch.through(type(module).__qualname__, lambda a, k: orig_call(module, *a, **k), args, kwargs)

        nn.Module.__call__ = module_call  # type: ignore[method-assign]
        self.w._undo.append((nn.Module, "__call__", orig_call))
        for name in LOSSES:
            orig = getattr(F, name, None)
            if orig is None:
                continue

            def loss(*args: Any, _orig: Any = orig, _name: str = name, **kwargs: Any) -> Any:
                if not watch._wanted():
                    return _orig(*args, **kwargs)
                return watch.through(f"F.{_name}", lambda a, k: _orig(*a, **k), args, kwargs)

            setattr(F, name, loss)
            self.w._undo.append((F, name, orig))

    def _wanted(self) -> bool:
        return (self.recording or self.feed is not None) and self.w.depth == 0 and torch.is_grad_enabled() and \
            self.w._main()

    # ---- one call -------------------------------------------------------------------------------------------------
    def through(self, what: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.w.role == "B":
            args, kwargs = self._fed(what, args, kwargs)
        rec = None
        if self.recording:
            inputs = _inputs((args, kwargs))
            self.bytes += nbytes(inputs)
            rec = {"what": what, "args": inputs}
            if self.bytes > MAX_RECORDED_BYTES:
                self.w.record_refused = f"the inputs of the model's calls passed {MAX_RECORDED_BYTES >> 20} MiB"
                self.stop()
                rec = None
        before = rng_digest()
        out = fn(args, kwargs)
        if self.random_in_call is None and rng_digest() != before:
            self.random_in_call = {"step": self.w.step, "backward": self.w.user.innermost(skip=3)}
        if rec is not None:
            self.open.append(rec)
            computed = _nodes((args, kwargs))
            for node in _nodes(out):
                self.outputs[id(node)] = computed
                self._alive.append(node)
        self.call += 1
        return out

    def _fed(self, what: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        step = self.w.step
        if self.feed is None or self.spoiled or self.feed_error is not None or self.u is None:
            return args, kwargs
        units = self.feed.get(step) or []
        lo, j = self.group * self.u, self.call
        parts = [g[j] for g in units[lo:lo + self.u] if j < len(g)]
        if len(parts) != self.u or lo + self.u > len(units):
            if self.calibration is None:  # the guess was wrong: this step measures the reference's micro-batches
                self.spoiled = True
                return args, kwargs
            self.feed_error = (f"at step {step} the reference's call {j + 1} of micro-batch {self.group + 1} ({what}) "
                               f"has no counterpart among the {len(units)} micro-batches the setup under test ran")
            return args, kwargs
        if any(p["what"] != what for p in parts):
            self.feed_error = (f"at step {step} the reference calls {what} where the setup under test called "
                               f"{parts[0]['what']} (call {j + 1} of micro-batch {self.group + 1})")
            return args, kwargs
        try:
            fed = join([p["args"] for p in parts], where=f"{what}'s arguments", keep_equal=True)
        except Unjoinable as exc:
            self.feed_error = f"the inputs of {what} cannot be joined: {exc}"
            return args, kwargs
        self.fed += 1
        merged = merge((args, kwargs), fed)
        return tuple(merged[0]), dict(merged[1])

    # ---- backward and step ---------------------------------------------------------------------------------------------
    def on_backward(self, loss: Any) -> None:
        if self.w.role == "A" and self.recording:
            if self.w.step == 1 and not self.steps and self.w.train_loader is not None:
                self.stop()  # the batches come from a DataLoader: its yields are fed
                return
            self.steps.setdefault(self.w.step, []).append(self.open)
            self.open = []
            if isinstance(loss, torch.Tensor) and loss.grad_fn is not None:
                unfed = self._unfed(loss)
                self.unfed = self.unfed or unfed
        self.group += 1
        self.call = 0

    def on_step_end(self) -> bool:
        """End of an optimizer step; True when the reference must run this step again (the guess was wrong: this
        step measured its micro-batches instead, and is not compared)."""
        step, redo = self.w.step, False
        if self.w.role == "B" and self.feed is not None and self.feed_error is None:
            units = len(self.feed.get(step) or [])
            wrong = self.spoiled or self.u is None or self.group * self.u != units
            if wrong and self.calibration is None:
                redo = self._calibrate(units)
            elif wrong:
                self.feed_error = (f"at step {step} the reference ran {self.group} backward() call(s) of {self.u} "
                                   f"micro-batch(es) each where the setup under test ran {units}")
            else:
                self.calibration = self.calibration or {"micro_batches": self.group, "fed_per_step": units,
                                                        "guessed": True}
        self.open, self.outputs, self._alive = [], {}, []
        self.group = self.call = 0
        self.spoiled = False
        return redo

    def _calibrate(self, units: int) -> bool:
        """The reference's micro-batches per step, measured on a step its guess did not fit; True: run it again."""
        m = self.group
        self.calibration = {"micro_batches": m, "fed_per_step": units, "guessed": False}
        if m < 1 or units % m:
            self.feed_error = (f"the reference runs {m} backward() call(s) per optimizer step, where the setup under test "
                               f"ran {units} micro-batch(es) per step over its processes: they cannot be matched")
            return False
        self.u = units // m
        return True

    def stop(self) -> None:
        self.recording = False
        self.steps, self.open, self.outputs, self._alive = {}, [], {}, []

    # ---- what is not fed ---------------------------------------------------------------------------------------------
    def _unfed(self, loss: torch.Tensor) -> dict[str, Any] | None:
        """The first operation outside the recorded calls that takes a tensor without gradient (see the docstring)."""
        from gradprobe.checks.steps.accumulation import _traced_line

        stack, seen = [loss.grad_fn], set()
        numbers: list[float] = []
        self.scalars.setdefault(self.w.step, []).append(numbers)
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if len(seen) > MAX_WALK:
                return {"why": f"the loss's graph outside the model's calls has more than {MAX_WALK} operations"}
            inner = self.outputs.get(id(node))
            if inner is not None:
                stack.extend(inner)
                continue
            if node.name() == _LEAF:
                continue
            numbers += _scalars(node)[:MAX_SCALARS - len(numbers)]
            what = _takes_data(node)
            if what:
                line = _traced_line(node, self.w.user)[0] if self.w.trace else None
                return {"op": node.name(), "what": what, "location": line}
            stack.extend(nxt for nxt, _ in node.next_functions if nxt is not None)
        return None

    # ---- the end -----------------------------------------------------------------------------------------------------
    def facts(self) -> dict[str, Any]:
        if self.w.role == "B":
            return {"feed_mode": "calls" if self.feed is not None else "loader", "fed_calls": self.fed,
                    "feed_error": self.feed_error, "calibration": self.calibration, "fed_per_micro_batch": self.u}
        return {"feed_mode": "calls" if self.recording else "loader", "unfed": self.unfed,
                "loss_scalars": {str(k): v for k, v in self.scalars.items()},
                "call_groups": {str(s): [len(g) for g in groups] for s, groups in self.steps.items()},
                "random_in_call": self.random_in_call}


def _scalars(node: Any) -> list[float]:
    """The scalar tensors without gradient `node` saved (a Python number, or a count the script computed: the graph
    does not tell them apart), rounded."""
    out = []
    for attr in dir(node):
        if attr.startswith("_saved_"):
            try:
                t = getattr(node, attr)
            except RuntimeError:
                continue
            if isinstance(t, torch.Tensor) and t.numel() == 1 and not t.requires_grad:
                out.append(float(f"{float(t):.6g}"))
    return out


def _takes_data(node: Any) -> str | None:
    """What makes `node` take a tensor gradprobe did not feed: a saved tensor without gradient that is not a scalar,
    or an operand without gradient of an operation whose output is not a scalar (None: nothing)."""
    for attr in dir(node):
        if not attr.startswith("_saved_"):
            continue
        try:
            value = getattr(node, attr)
        except RuntimeError:
            continue
        for t in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(t, torch.Tensor) and not t.requires_grad and t.dim() > 0 and t.numel() > 1:
                return f"{attr[len('_saved_'):]} {tuple(t.shape)}"
    if any(nxt is None for nxt, _ in node.next_functions):
        meta = getattr(node, "_input_metadata", ())
        shape = tuple(meta[0].shape) if meta else ()
        saved = any(attr.startswith("_saved_") and attr not in ("_saved_alpha", "_saved_dim") for attr in dir(node))
        if not saved and len(shape) > 0 and int(torch.Size(shape).numel()) > 1:
            return f"an operand without gradient (output {shape})"
    return None
