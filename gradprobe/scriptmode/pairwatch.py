"""What one process of a paired run records (the setup under test) or is fed (the reference), installed before the
script runs (scriptmode/paired.py forks the processes; checks/equivalence compares what they wrote).

Steps are counted by the first optimizer that steps (its step post-hook ends a step); the run is ended (os._exit,
nothing unwinds through the user's code) after `steps` steps, once this process's files are written.

- Batches: every `DataLoader` iterator is tagged with its loader's index (the order in which loaders were first
  iterated, the same in both setups); each collated batch it yields is recorded (setup A: a CPU copy) or replaced
  (setup B: by the batch the feed holds for that yield of the training loader). The training loader is the one whose
  batch was yielded last before the first backward().
- Weights: at the first grad-enabled top-level module call of each step, setup A's rank 0 records that module's
  parameters and buffers (names without wrapper prefixes); setup B loads them there, so both setups compute each step
  from the same weights.
- Gradients: what the optimizer sees, per parameter, at each step (after a closure returned, for a step given one).
- At each backward(): the loss value, the loss's constant scaling and reduction with their lines (anomaly mode records
  the forward's tracebacks while recording), the targets of its cross-entropy nodes, whether random numbers were drawn
  between the batch and backward(), and which framework called it; torch.distributed collectives the script calls
  itself, with their lines.
- Both setups run with dropout off (p=0: F.dropout and friends, scaled_dot_product_attention's dropout_p) and
  BatchNorm layers on their running statistics (per-process batch statistics differ by design); SyncBatchNorm untouched.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from gradprobe.checks.equivalence.batches import detached_copy, like, nbytes
from gradprobe.checks.equivalence.determinism import SameComputation
from gradprobe.checks.equivalence.graph import read_loss
from gradprobe.scriptmode.callfeed import MAX_RECORDED_BYTES, CallWatch, rng_digest
from gradprobe.scriptmode.ddpsync import SyncWatch
from gradprobe.scriptmode.dtensors import is_dtensor, load_into, whole
from gradprobe.scriptmode.observe import undo
from gradprobe.scriptmode.rankwatch import write_json
from gradprobe.userframes import UserCode

MAX_EVENTS = 200
FRAMEWORKS = (("transformers", os.sep + "transformers" + os.sep + "trainer"),
              ("fabric", os.sep + "lightning" + os.sep + "fabric" + os.sep), ("fabric", os.sep + "lightning_fabric" + os.sep),
              ("lightning", os.sep + "lightning"),
              ("lightning", os.sep + "pytorch_lightning" + os.sep), ("accelerate", os.sep + "accelerate" + os.sep))


@dataclass
class Feed:
    """What the reference setup is fed: the training loader's index, its batches in yield order, and the weights of each
    (step, top-level module) recorded by the setup under test."""

    loader: int | None
    batches: list[Any]
    weights: dict[tuple[int, int], dict[str, torch.Tensor]] = field(default_factory=dict)
    calls: dict[int, list[list[dict[str, Any]]]] | None = None  # batches made without a DataLoader (callfeed.py)
    guess: int | None = None  # how many of A's micro-batches each of the reference's is fed, until measured


def _clean(name: str) -> str:
    from gradprobe.wrappers import clean_name

    return clean_name(name)


def unwrapped(module: nn.Module) -> nn.Module:
    """The user's module inside a library wrapper (DistributedDataParallel, a compiled module)."""
    from gradprobe.wrappers import unwrap_library

    return unwrap_library(module)[0]


def named_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers by name without wrapper prefixes (the first name of a shared tensor)."""
    out: dict[str, torch.Tensor] = {}
    module = unwrapped(module)
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        out.setdefault(_clean(name), t)
    return out


class PairWatch:
    def __init__(self, role: str, out_dir: str, index: int, steps: int, user: UserCode, feed: Feed | None = None,
                 trace: bool = True):
        self.role, self.out_dir, self.index, self.steps, self.user = role, out_dir, index, steps, user
        self.feed, self.trace = feed, trace
        self.main_thread = threading.get_ident()
        self.step = 1
        self.loader_ids: dict[int, int] = {}
        self._loaders: list[Any] = []  # kept alive: their ids are the keys above
        self.counts: dict[int, int] = {}  # loader index -> batches yielded
        self.last_loader: int | None = None
        self.train_loader: int | None = None
        self.records: dict[int, list[Any]] = {}  # loader index -> recorded batches (A)
        self.recorded_bytes = 0
        self.record_refused: str | None = None
        self.fed = 0
        self.depth = 0
        self.tops: list[nn.Module] = []  # distinct top-level modules called with grad, in order
        self.handled: set[tuple[int, int]] = set()
        self.weights: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        self.loaded: dict[str, int] = {}  # B: "step:key" -> tensors loaded
        self.order: list[int] = []  # module ids in first-call order during step 1
        self._order_seen: set[int] = set()
        self.modules: dict[int, nn.Module] = {}
        self.main_opt: torch.optim.Optimizer | None = None
        self.grads: dict[int, dict[str, torch.Tensor | None]] = {}
        self.grad_dtypes: set[str] = set()
        self.bw_in_step = 0
        self.backwards: list[dict[str, Any]] = []
        self.targets: dict[int, list[tuple[dict | None, torch.Tensor]]] = {}  # step -> (line, target) per loss node
        self.per_step: list[dict[str, Any]] = []
        self.collectives: list[dict[str, Any]] = []
        self.reduced: dict[int, dict[str, Any]] = {}  # id(tensor) -> the script's all_reduce of it
        self.rng_after_yield: str | None = None
        self.random_in_step: dict[str, Any] | None = None
        self.framework: str | None = None
        self.knobs: dict[str, Any] = {}
        self.same = SameComputation()
        self.sharded = False  # the gradients the optimizer sees are DTensor shards (FSDP2), gathered whole to compare
        self.spawned: dict[str, Any] | None = None  # the script started its own workers (launchers.py)
        self.extra: dict[str, Any] = {}  # what launchers.py adds to the record (the launcher's command)
        self.clips: list[dict[str, Any]] = []  # clip_grad_norm_ calls: max_norm, the norm before, the line
        self.pre_clip: set[int] = set()  # steps whose gradients were taken before a clip_grad_norm_
        self._names: dict[int, str] | None = None
        self._roots: list[nn.Module] = []  # the modules parameter names are taken in, the outermost first
        self.autocast: str | None = None
        self.finished = False
        self._undo: list[Any] = []
        self._in_backward = False
        self._in_collective = False
        self._anomaly: tuple[bool, bool] | None = None
        self.calls = CallWatch(self, feed.calls if feed is not None else None, feed.guess if feed is not None else None)
        self.sync = SyncWatch(self)

    # ---- install -----------------------------------------------------------------------------------------------
    def install(self) -> None:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._undo.append(register_module_forward_pre_hook(self._pre_forward))
        self._undo.append(register_module_forward_hook(self._post_forward, always_call=True))
        self._undo.append(register_optimizer_step_pre_hook(self._pre_step))
        self._undo.append(register_optimizer_step_post_hook(self._post_step))
        self._patch_loaders()
        self._patch_backward()
        self._patch_collectives()
        self._patch_clipping()
        self.calls.install()
        self.sync.install()
        self.same.install()
        self._undo.append(self.same)
        if self.trace:
            self._anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
            orig_set = torch.set_anomaly_enabled
            orig_set(True, False)  # the forward's tracebacks on the graph: the lines of the loss's ops

            def keep_tracing(mode: bool, check_nan: bool = True) -> None:
                # a framework that turns anomaly mode off around its loop (Lightning's detect_anomaly=False) keeps the
                # tracebacks on; the NaN check only when the script asks for it
                orig_set(True, bool(mode and check_nan))

            torch.set_anomaly_enabled = keep_tracing  # type: ignore[assignment]
            self._undo.append((torch, "set_anomaly_enabled", orig_set))

    def uninstall(self) -> None:
        undo(self._undo)
        if self._anomaly is not None:
            torch.set_anomaly_enabled(*self._anomaly)
            self._anomaly = None

    def _main(self) -> bool:
        return threading.get_ident() == self.main_thread and not self.finished

    # ---- batches -------------------------------------------------------------------------------------------------
    def _patch_loaders(self) -> None:
        from torch.utils.data import DataLoader
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        watch = self
        orig_iter, orig_next = DataLoader.__iter__, _BaseDataLoaderIter.__next__

        def loader_iter(loader: Any) -> Any:
            it = orig_iter(loader)
            if id(loader) not in watch.loader_ids:
                watch.loader_ids[id(loader)] = len(watch.loader_ids)
                watch._loaders.append(loader)
            try:
                it._gradprobe_loader = watch.loader_ids[id(loader)]  # type: ignore[attr-defined]
            except AttributeError:
                pass
            return it

        def next_batch(it: Any) -> Any:
            batch = orig_next(it)
            index = getattr(it, "_gradprobe_loader", None)
            if index is not None and watch._main():
                batch = watch.on_yield(index, batch)
            return batch

        DataLoader.__iter__ = loader_iter  # type: ignore[method-assign]
        _BaseDataLoaderIter.__next__ = next_batch  # type: ignore[method-assign,assignment]
        self._undo += [(DataLoader, "__iter__", orig_iter), (_BaseDataLoaderIter, "__next__", orig_next)]

    def on_yield(self, index: int, batch: Any) -> Any:
        n = self.counts.get(index, 0)
        self.counts[index] = n + 1
        self.last_loader = index
        if self.role == "A" and (self.train_loader is None or index == self.train_loader) and self.record_refused is None:
            size = nbytes(batch)
            if self.recorded_bytes + size > MAX_RECORDED_BYTES:
                self.record_refused = f"the batches passed {MAX_RECORDED_BYTES >> 20} MiB before step {self.step}"
            else:
                self.recorded_bytes += size
                self.records.setdefault(index, []).append(detached_copy(batch))
        elif self.role == "B" and self.feed is not None and index == self.feed.loader and n < len(self.feed.batches):
            batch = like(self.feed.batches[n], batch)
            self.fed += 1
        self.rng_after_yield = rng_digest()
        return batch

    # ---- modules and weights ---------------------------------------------------------------------------------------
    def _pre_forward(self, module: nn.Module, args: Any) -> None:
        if not self._main():
            return
        if self.depth == 0 and torch.is_grad_enabled():
            self._top_call(module)
            self.sync.on_top_call(module)
        self.depth += 1
        if self.step == 1 and torch.is_grad_enabled() and id(module) not in self._order_seen:
            self._order_seen.add(id(module))
            self.order.append(id(module))
            self.modules[id(module)] = module

    def _post_forward(self, module: nn.Module, args: Any, out: Any) -> None:
        if self._main() and self.depth > 0:
            self.depth -= 1

    def _top_call(self, module: nn.Module) -> None:
        if not any(m is module for m in self.tops):
            self.tops.append(module)
        if self.autocast is None and torch.is_autocast_enabled("cpu"):
            self.autocast = str(torch.get_autocast_dtype("cpu")).replace("torch.", "")
        key = (self.step, next(i for i, m in enumerate(self.tops) if m is module))
        if key in self.handled:
            return
        self.handled.add(key)
        if self.role == "A":
            state = named_state(module)
            if self.index == 0 or any(is_dtensor(t) for t in state.values()):  # every rank gathers FSDP2's shards
                copies = {k: whole(t.detach()).to("cpu", copy=True) for k, t in state.items()}
                if self.index == 0:
                    self.weights[key] = copies
        elif self.role == "B" and self.feed is not None and key in self.feed.weights:
            self.loaded[f"{key[0]}:{key[1]}"] = _load(module, self.feed.weights[key])

    # ---- optimizer steps ---------------------------------------------------------------------------------------------
    def _pre_step(self, opt: torch.optim.Optimizer, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if not self._main():
            return None
        if self.main_opt is None:
            self.main_opt = opt
        if opt is not self.main_opt:
            return None
        closure = kwargs.get("closure") if "closure" in kwargs else (args[1] if len(args) > 1 and callable(args[1]) else None)
        if closure is None:
            self._take_grads()
            return None
        watch = self

        def observed_closure() -> Any:
            out = closure()
            watch._take_grads()
            return out

        if "closure" in kwargs:
            return args, dict(kwargs, closure=observed_closure)
        return (args[0], observed_closure, *args[2:]), kwargs

    def _post_step(self, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self._main() or opt is not self.main_opt:
            return
        if self.calls.on_step_end():  # the reference's step measured its micro-batches (callfeed.py): run it again
            self._forget(self.step)
            return
        self.per_step.append({"step": self.step, "backward_calls": self.bw_in_step,
                              "yields": self.counts.get(self.train_loader, 0) if self.train_loader is not None else 0,
                              "location": self.user.innermost(skip=3)})
        self.bw_in_step = 0
        if self.step >= self.steps:
            self.finish("stepped")
            os._exit(0)
        self.step += 1

    def _forget(self, step: int) -> None:
        """What was recorded at `step`, which runs again (the next optimizer step is the same step)."""
        self.grads.pop(step, None)
        self.targets.pop(step, None)
        self.pre_clip.discard(step)
        self.backwards = [b for b in self.backwards if b.get("step") != step]
        self.clips = [c for c in self.clips if c.get("step") != step]
        self.handled = {k for k in self.handled if k[0] != step}
        self.loaded = {k: v for k, v in self.loaded.items() if not k.startswith(f"{step}:")}
        self.bw_in_step = 0

    def param_names(self, params: list[torch.Tensor] | None = None) -> dict[int, str]:
        """Names in the outermost module holding most of the parameters (a LightningModule whose training_step calls
        its children, not only the modules called at top level), the same in both setups; cached after the first."""
        if self._names is not None and (params is None or all(id(p) in self._names for p in params)):
            return self._names
        from gradprobe.scriptmode.rankwatch import _outermost

        wanted = list(params or []) + ([p for g in self.main_opt.param_groups for p in g["params"]] if self.main_opt else [])
        roots = list(self.tops) + [m for m in _outermost(wanted) if not any(m is t for t in self.tops)] if wanted else []
        names: dict[int, str] = {}
        ids = {id(p) for p in wanted}
        ordered = sorted(roots, key=lambda m: -sum(id(p) in ids for p in m.parameters()))
        for root in ordered:
            for n, p in unwrapped(root).named_parameters():
                names.setdefault(id(p), _clean(n))
        self._names, self._roots = names, ordered
        return names

    def _take_grads(self, params: list[torch.Tensor] | None = None) -> None:
        """Each parameter's gradient now (the main optimizer's, or `params` before a clip), unless taken this step."""
        if self.step in self.pre_clip:
            return
        if params is not None:
            groups = [params]
        elif self.main_opt is not None:
            groups = [g["params"] for g in self.main_opt.param_groups]
        else:
            return
        names = self.param_names([p for g in groups for p in g])
        out: dict[str, torch.Tensor | None] = {}
        for gi, group in enumerate(groups):
            for pi, p in enumerate(group):
                name = names.get(id(p), f"group{gi}.param{pi}")
                g = p.grad
                if g is not None:
                    self.sharded = self.sharded or is_dtensor(g)
                    local = whole(g)  # FSDP2's shards gathered on every rank (dtensors.py)
                    self.grad_dtypes.add(str(local.dtype).replace("torch.", ""))
                    out[name] = local.detach().to("cpu", torch.float64 if local.dtype == torch.float64 else torch.float32,
                                                  copy=True)
                    red = self.reduced.get(id(g))
                    if red is not None:
                        red.setdefault("params", []).append(name)
                else:
                    out[name] = None
        self.grads[self.step] = out

    # ---- backward ----------------------------------------------------------------------------------------------------
    def _patch_backward(self) -> None:
        watch = self
        orig_tensor, orig_autograd = torch.Tensor.backward, torch.autograd.backward

        def run(fn: Callable[..., Any], root: Any, *args: Any, **kwargs: Any) -> Any:
            if watch._in_backward or not watch._main():
                return fn(*args, **kwargs)
            watch._in_backward = True
            try:
                watch.before_backward(root)
                return fn(*args, **kwargs)
            finally:
                watch._in_backward = False

        def tensor_backward(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            return run(orig_tensor, t, t, *args, **kwargs)

        def autograd_backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            root = tensors if isinstance(tensors, torch.Tensor) else (
                tensors[0] if isinstance(tensors, (list, tuple)) and tensors else None)
            return run(orig_autograd, root, tensors, *args, **kwargs)

        torch.Tensor.backward = tensor_backward  # type: ignore[method-assign,assignment]
        torch.autograd.backward = autograd_backward
        self._undo += [(torch.Tensor, "backward", orig_tensor), (torch.autograd, "backward", orig_autograd)]

    def before_backward(self, loss: Any) -> None:
        if self.train_loader is None:
            self.train_loader = self.last_loader
            self.records = {k: v for k, v in self.records.items() if k == self.train_loader}
        self.bw_in_step += 1
        self.calls.on_backward(loss)
        self.sync.on_backward()
        if self.framework is None:
            self.framework = _framework_on_stack()
        rec: dict[str, Any] = {"step": self.step, "location": self.user.innermost(skip=4)}
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            rec["value"] = float(loss.detach().float())
            rec.update(self._read_graph(loss))
        if self.rng_after_yield is not None and self.random_in_step is None and rng_digest() != self.rng_after_yield:
            self.random_in_step = {"step": self.step, "backward": rec["location"]}
        if len(self.backwards) < MAX_EVENTS:
            self.backwards.append(rec)

    def _read_graph(self, loss: torch.Tensor) -> dict[str, Any]:
        """The loss's constant scaling and reduction (with lines when traced), and its cross-entropy targets."""
        out: dict[str, Any] = {}
        try:
            out["scaling"], targets = read_loss(loss, self.user if self.trace else None)
            self.targets.setdefault(self.step, []).extend(targets)
        except Exception as exc:  # reading the graph must never break the user's step
            out["graph_error"] = f"{type(exc).__name__}: {exc}"[:200]
        return out

    # ---- collectives and randomness ------------------------------------------------------------------------------------
    def _patch_collectives(self) -> None:
        """The collectives the script calls itself (torch.distributed's, and the differentiable gather of
        torch.distributed.nn, which frameworks call under no_grad when asked for no gradient: Lightning's and Fabric's
        all_gather with sync_grads=False)."""
        import torch.distributed as dist

        if not dist.is_available():
            return
        for name, pos in (("all_reduce", 0), ("all_gather", 1), ("all_gather_into_tensor", 1), ("reduce_scatter", 1)):
            orig = getattr(dist, name, None)
            if orig is not None:
                setattr(dist, name, self._collective(orig, name, pos, dist, differentiable=False))
                self._undo.append((dist, name, orig))
        try:
            import torch.distributed.nn.functional as dist_fn
        except ImportError:
            return
        orig = getattr(dist_fn, "all_gather", None)
        if orig is not None:
            dist_fn.all_gather = self._collective(orig, "all_gather", 0, dist_fn, differentiable=True)
            self._undo.append((dist_fn, "all_gather", orig))

    def _collective(self, orig: Callable[..., Any], name: str, pos: int, owner: Any, differentiable: bool) -> Callable[..., Any]:
        watch = self

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            t = args[pos] if len(args) > pos else kwargs.get("tensor")
            if watch._in_collective or not (watch._main() and len(watch.collectives) < MAX_EVENTS and
                                            isinstance(t, torch.Tensor)):
                return orig(*args, **kwargs)
            op = kwargs.get("op", args[1] if name == "all_reduce" and len(args) > 1 else None)
            rec = {"kind": name, "step": watch.step, "location": watch.user.innermost(skip=2),
                   "requires_grad": bool(t.requires_grad), "grad_enabled": torch.is_grad_enabled(),
                   # copies without gradient: torch.distributed's own gather with grad on (inside a custom Function's
                   # forward grad is off and its backward may carry it), the differentiable one under no_grad
                   "copies_without_grad": bool(t.requires_grad) and torch.is_grad_enabled() != differentiable,
                   "op": str(op).rsplit(".", 1)[-1] if op is not None else ("SUM" if name == "all_reduce" else None)}
            watch.collectives.append(rec)
            if name == "all_reduce":
                watch.reduced[id(t)] = rec
            watch._in_collective = True  # the torch.distributed call inside the differentiable gather is the same one
            try:
                return orig(*args, **kwargs)
            finally:
                watch._in_collective = False

        return wrapped

    def _patch_clipping(self) -> None:
        """clip_grad_norm_ and clip_grads_with_norm_ (what accelerate and the Trainer call): the gradients are taken
        before the clip, which both setups apply alike, and the clip is recorded."""
        import torch.nn.utils as nn_utils

        watch = self
        for name in ("clip_grad_norm_", "clip_grads_with_norm_"):
            orig = getattr(nn_utils, name, None)
            if orig is None:
                continue

            def clip(parameters: Any, max_norm: float, *args: Any, _orig: Callable[..., Any] = orig,
                     **kwargs: Any) -> Any:
                params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
                if watch._main() and watch.step not in watch.grads:  # compared before the clip: both setups clip
                    watch._take_grads(params)
                    watch.pre_clip.add(watch.step)
                out = _orig(params, max_norm, *args, **kwargs)
                if watch._main() and len(watch.clips) < MAX_EVENTS and watch.step not in {c["step"] for c in watch.clips}:
                    total = out if isinstance(out, torch.Tensor) else (args[0] if args else kwargs.get("total_norm"))
                    watch.clips.append({"step": watch.step, "max_norm": float(max_norm),
                                        "norm": float(total) if isinstance(total, torch.Tensor) else None,
                                        "location": watch.user.innermost(skip=2)})
                return out

            setattr(nn_utils, name, clip)
            self._undo.append((nn_utils, name, orig))

    # ---- the end ---------------------------------------------------------------------------------------------------
    def module_order(self) -> list[str]:
        names: dict[int, str] = {}
        for top in self._roots or self.tops:
            for n, m in unwrapped(top).named_modules():
                names.setdefault(id(m), _clean(n))
        return [names[i] for i in self.order if i in names]

    def finish(self, ended: str, error: str | None = None, location: dict | None = None) -> None:
        """Write this process's files (the tensors, then the JSON that says they are complete)."""
        if self.finished:
            return
        self.finished = True
        self.uninstall()
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else None
        batches = self.records.get(self.train_loader, []) if self.train_loader is not None else []
        if self.calls.mode and self.random_in_step is None:
            self.random_in_step = self.calls.random_in_call
        torch.save({"grads": self.grads, "weights": self.weights, "batches": batches,
                    "calls": self.calls.steps if self.role == "A" and self.calls.mode else {},
                    "targets": {s: [t for _, t in v] for s, v in self.targets.items()}},
                   os.path.join(self.out_dir, f"rank{self.index}.pt"))
        info = {"index": self.index, "rank": rank, "world_size": world, "ended": ended, "error": error,
                "location": location, "steps_done": len(self.per_step), "per_step": self.per_step,
                "backwards": self.backwards, "collectives": self.collectives, "train_loader": self.train_loader,
                "loaders": len(self.loader_ids), "yields": self.counts, "recorded": len(batches),
                "record_refused": self.record_refused, "fed": self.fed + self.calls.fed, "loaded": self.loaded,
                "module_order": self.module_order(), "optimizer": type(self.main_opt).__name__ if self.main_opt else None,
                "optimizer_module": type(self.main_opt).__module__ if self.main_opt else None,
                "grad_dtypes": sorted(self.grad_dtypes), "autocast": self.autocast, "framework": self.framework,
                "sharded": self.sharded, "spawned": self.spawned,
                "knobs": self.knobs, "clips": self.clips, "pre_clip": sorted(self.pre_clip),
                "random_in_step": self.random_in_step, "dropout_calls": self.same.dropout_calls,
                "batchnorm_eval": len(self.same.batchnorm),
                "target_lines": {str(s): [line for line, _ in v] for s, v in self.targets.items()},
                "ddp_sync": self.sync.events, **self.calls.facts(), **self.extra}
        write_json(os.path.join(self.out_dir, f"rank{self.index}.json"), info)


def _load(module: nn.Module, state: dict[str, torch.Tensor]) -> int:
    n = 0
    with torch.no_grad():
        for name, t in named_state(module).items():
            src = state.get(name)
            if src is not None and tuple(src.shape) == tuple(t.shape):
                load_into(t, src)
                n += 1
    return n


def _framework_on_stack() -> str:
    """The outermost framework on the stack of a backward() call (the Trainer drives accelerate's backward)."""
    found = "plain loop"
    f = sys._getframe(2)
    while f is not None:
        path = f.f_code.co_filename
        found = next((name for name, marker in FRAMEWORKS if marker in path), found)
        f = f.f_back  # type: ignore[assignment]
    return found


