"""What one rank of a several-rank script run measures for the checks across ranks (gradprobe/checks/ranks/rules.py).

Installed in each rank process before the script (or the spawned worker's function) runs, beside the step watch
(scriptmode/observe.py), and independent of it:
- the leaves of the graph of every tensor the script backpropagates from before its first optimizer step (which
  parameters took part in the loss on this rank), and the user line that called each module (the branch taken);
- `torch.distributed`'s collectives the script calls itself: an all-reduce of a parameter's gradient, with its op,
  its line and a checksum of the tensor before it (to tell a sum from an average across ranks);
- where each parameter was built (the user's line that registered it in its module: a parameter registration hook),
  and a checksum of its value when a module holding it is first called with grad (before any step can move it);
- the user's line that entered DDP's `no_sync()`, and the lines that called FSDP2's `fully_shard` (seen as FSDP2
  registering its forward pre-hook on the module: no import of torch.distributed.fsdp needed), with a checksum of
  each plain parameter it is about to shard, whole (FSDP2 broadcasts nothing: each rank keeps a slice of its own);
- at the first `optimizer.step()` (a global step pre-hook, registered before the step watch's so it runs first):
  per parameter a checksum of its value and of its gradient (DTensors: their local shard, with their placements),
  whether DDP's gradient sync was on (`no_sync()`), and the rank as the process group says.
The checks compare the checksums at the first forward with those at the step to tell where a difference arose.
The snapshot is written to `obs<index>.json` in the call's rank folder before the checks run on the step.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import weakref
from typing import Any

import torch
import torch.nn as nn

from gradprobe.userframes import UserCode
from gradprobe.scriptmode.observe import undo
from gradprobe.scriptmode.modelranks import WRAPPED_BY_GRADPROBE

COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "barrier", "reduce", "all_to_all", "gather", "scatter", "all_gather_object",
               "broadcast_object_list")
MAX_LEAVES = 200_000


def write_json(path: str, data: Any) -> None:
    """Atomically (a reader never sees half a file)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, default=repr)
    os.replace(tmp, path)


def _local(t: torch.Tensor) -> tuple[torch.Tensor, list[str] | None]:
    """A DTensor's local shard and its placements; a plain tensor as it is."""
    to_local = getattr(t, "to_local", None)
    if callable(to_local) and hasattr(t, "placements"):
        return to_local(), [type(p).__name__ for p in t.placements]  # Shard, Replicate, Partial
    return t, None


def checksum(t: torch.Tensor | None) -> float | None:
    if t is None:
        return None
    local, _ = _local(t.detach())
    if not (local.is_floating_point() or local.is_complex()):
        return None
    flat = local.detach().reshape(-1).double()
    weights = (torch.arange(flat.numel(), dtype=torch.float64) % 13 + 1).to(flat.device)  # linear, not symmetric
    return float((flat * weights).sum().item())


def _scaled_by_world(root: torch.Tensor, depth: int = 8) -> bool:
    """The loss's last ops include a division by the world size (or a product with its inverse)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    n = float(dist.get_world_size())
    node, seen = root.grad_fn, 0
    stack = [node] if node is not None else []
    while stack and seen < depth:
        node = stack.pop(0)
        seen += 1
        name = type(node).__name__
        other = getattr(node, "_saved_other", None)
        if isinstance(other, torch.Tensor) and other.numel() == 1 and not other.requires_grad:
            other = float(other)
        if isinstance(other, (int, float)) and ((name.startswith("Div") and abs(other - n) < 1e-9)
                                                 or (name.startswith("Mul") and abs(other * n - 1) < 1e-9)):
            return True
        stack.extend(nxt for nxt, _ in getattr(node, "next_functions", ()) if nxt is not None)
    return False


def _leaf_ids(roots: list[torch.Tensor]) -> set[int]:
    """Ids of the leaf tensors (parameters) in the graphs behind `roots`."""
    seen: set[int] = set()
    leaves: set[int] = {id(r) for r in roots if r.grad_fn is None and r.requires_grad}
    stack = [r.grad_fn for r in roots if r.grad_fn is not None]
    while stack and len(seen) < MAX_LEAVES:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        var = getattr(node, "variable", None)
        if isinstance(var, torch.Tensor):
            leaves.add(id(var))
        stack.extend(nxt for nxt, _ in getattr(node, "next_functions", ()) if nxt is not None)
    return leaves


class RankWatch:
    """The observers of one rank (see the module docstring); `install` before the script, `uninstall` after."""

    def __init__(self, user: UserCode, out_dir: str, index: int, release: bool = True):
        self.user = user
        self.release = release  # drop DDP's reducer at the first step (False: the run goes on, audit_training's steps)
        self.path = os.path.join(out_dir, f"obs{index}.json")
        self.pre_path = os.path.join(out_dir, f"pre{index}.json")
        self.index = index
        self.used: set[int] = set()
        self.sites: dict[int, dict[str, Any]] = {}  # id(module) -> the user line that first called it with grad
        self.modules: dict[int, nn.Module] = {}  # the modules called with grad before the first step
        self._ddp_types: set[type] = set()
        self.ddp_sync_at_last_forward: bool | None = None
        self.loss_scaled_by_world = False  # a loss divided by the world size before backward (a SUM is then an average)
        self.reduced: dict[int, dict[str, Any]] = {}  # id(tensor) -> its last all_reduce by the script
        self.built: dict[int, tuple[weakref.ref[torch.Tensor], dict[str, Any] | None]] = {}  # id(param) -> its line
        self.at_forward: dict[int, float | None] = {}  # id(param) -> its checksum when first called with grad
        self.at_wrap: dict[int, tuple[float | None, dict[str, Any] | None]] = {}  # id(param) -> after DDP's broadcast
        self.no_sync_at: dict[str, Any] | None = None  # the user's line that last entered DDP's no_sync()
        self.reduce_at: dict[str, Any] | None = None  # the user's line of the script's first all_reduce
        self.sharded_at: list[dict[str, Any]] = []  # the user's lines that called fully_shard, in order
        # (id(module), attribute) -> the whole parameter's checksum and build line just before fully_shard sharded it
        self.at_shard: dict[tuple[int, str], tuple[float | None, dict[str, Any] | None, dict[str, Any] | None]] = {}
        self.taken = False
        self._undo: list[Any] = []

    # ---- the observers ------------------------------------------------------------------------------------
    def install(self) -> None:
        from torch.nn.modules.module import register_module_forward_pre_hook, register_module_parameter_registration_hook
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._undo.append(register_module_forward_pre_hook(self._module_called))
        self._undo.append(register_optimizer_step_pre_hook(self._pre_step))
        self._undo.append(register_module_parameter_registration_hook(self._param_registered))
        self._patch_backward()
        self._patch_collectives()
        self._patch_no_sync()
        self._patch_pre_hooks()

    def _patch_pre_hooks(self) -> None:
        orig = nn.Module.register_forward_pre_hook
        watch = self

        def register_forward_pre_hook(module: nn.Module, hook: Any, *args: Any, **kwargs: Any) -> Any:
            owner = type(getattr(hook, "__self__", None))
            if owner.__module__.startswith("torch.distributed.fsdp") and not watch.taken:
                loc = watch.user.innermost(skip=2)
                if loc is not None and loc not in watch.sharded_at:
                    watch.sharded_at.append(loc)
                watch.note_shard(module, loc)
            return orig(module, hook, *args, **kwargs)

        nn.Module.register_forward_pre_hook = register_forward_pre_hook  # type: ignore[method-assign,assignment]
        self._undo.append((nn.Module, "register_forward_pre_hook", orig))

    def note_shard(self, module: nn.Module, loc: dict[str, Any] | None) -> None:
        """Each plain parameter fully_shard is about to shard (it registers its pre-hook first): its checksum whole,
        local to this rank (FSDP2 broadcasts nothing: each rank keeps its own slice of what it built)."""
        try:
            for sub in module.modules():
                for attr, p in sub._parameters.items():
                    if p is not None and not hasattr(p, "placements") and not p.is_meta:
                        self.at_shard.setdefault((id(sub), attr), (checksum(p), self.built_at(p), loc))
        except Exception:  # ours: the check across ranks loses these parameters, the script's fully_shard goes on
            pass

    def _shard_sums(self, roots: list[nn.Module]) -> dict[int, tuple[float | None, dict[str, Any] | None,
                                                                      dict[str, Any] | None]]:
        """id(parameter now) -> its `at_shard` record (fully_shard replaced the tensor; the module and name stay)."""
        return {id(p): self.at_shard[(id(sub), attr)] for root in roots for sub in root.modules()
                for attr, p in sub._parameters.items() if p is not None and (id(sub), attr) in self.at_shard}

    def _param_registered(self, module: nn.Module, name: str, param: torch.Tensor | None) -> None:
        if param is not None and not self.taken and id(param) not in self.built:
            try:
                self.built[id(param)] = (weakref.ref(param), self.user.innermost(skip=2))
            except TypeError:  # not weak-referenceable
                pass

    def built_at(self, p: torch.Tensor) -> dict[str, Any] | None:
        hit = self.built.get(id(p))
        return hit[1] if hit is not None and hit[0]() is p else None

    def _patch_no_sync(self) -> None:
        """DDP's no_sync() (its line), and DDP's construction (its line, and each parameter's checksum right after
        DDP broadcast rank 0's weights)."""
        from torch.nn.parallel import DistributedDataParallel

        orig = DistributedDataParallel.no_sync
        orig_init = DistributedDataParallel.__init__
        watch = self

        def init(ddp: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
            orig_init(ddp, *args, **kwargs)
            if not watch.taken:
                loc = watch.user.innermost(skip=2)
                for p in ddp.parameters():
                    watch.at_wrap[id(p)] = (checksum(p), loc)

        DistributedDataParallel.__init__ = init  # type: ignore[method-assign,assignment]
        self._undo.append((DistributedDataParallel, "__init__", orig_init))

        def no_sync(ddp: DistributedDataParallel) -> Any:
            if not watch.taken:
                watch.no_sync_at = watch.user.innermost(skip=2)
            return orig(ddp)

        DistributedDataParallel.no_sync = no_sync  # type: ignore[method-assign,assignment]
        self._undo.append((DistributedDataParallel, "no_sync", orig))

    def uninstall(self) -> None:
        undo(self._undo)

    def _module_called(self, module: nn.Module, args: Any) -> None:
        if not self.taken and torch.is_grad_enabled() and type(module) in self._ddp_types:
            # DDP decides at its forward whether the backward that follows all-reduces (off inside no_sync())
            self.ddp_sync_at_last_forward = bool(getattr(module, "require_backward_grad_sync", True))
        if not self.taken and torch.is_grad_enabled() and id(module) not in self.modules:
            if _is_ddp(module):
                self._ddp_types.add(type(module))
                self.ddp_sync_at_last_forward = bool(getattr(module, "require_backward_grad_sync", True))
            self.modules[id(module)] = module
            for p in module.parameters():
                if id(p) not in self.at_forward:
                    self.at_forward[id(p)] = checksum(p)
            loc = self.user.innermost(skip=2)
            if loc is not None:
                self.sites[id(module)] = loc

    def roots(self) -> list[nn.Module]:
        """The outermost of the modules the script called with grad (no gc walk: ranks share a loaded machine)."""
        inner = {id(c) for m in self.modules.values() for c in m.modules() if c is not m}
        return [m for i, m in self.modules.items() if i not in inner]

    def _patch_backward(self) -> None:
        watch = self
        orig_tensor, orig_autograd = torch.Tensor.backward, torch.autograd.backward

        def tensor_backward(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if not watch.taken:
                watch.note_backward([t])
            return orig_tensor(t, *args, **kwargs)

        def autograd_backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if not watch.taken and sys._getframe(1).f_code is not tensor_backward.__code__:
                roots = [tensors] if isinstance(tensors, torch.Tensor) else [
                    t for t in (tensors or ()) if isinstance(t, torch.Tensor)]
                watch.note_backward(roots)
            return orig_autograd(tensors, *args, **kwargs)

        torch.Tensor.backward = tensor_backward  # type: ignore[method-assign,assignment]
        torch.autograd.backward = autograd_backward
        self._undo += [(torch.Tensor, "backward", orig_tensor), (torch.autograd, "backward", orig_autograd)]

    def note_backward(self, roots: list[torch.Tensor]) -> None:
        """Before a backward: the parameters in its graph, and `pre<index>.json` (kept even if this rank then hangs)."""
        if not self.loss_scaled_by_world:
            self.loss_scaled_by_world = any(_scaled_by_world(r) for r in roots)
        leaves = _leaf_ids(roots)
        if leaves <= self.used:
            return
        self.used |= leaves
        try:
            write_json(self.pre_path, self.used_snapshot())
        except Exception:  # ours: the check of parameters used on some ranks loses this rank
            pass

    def used_snapshot(self) -> dict[str, Any]:
        """Every parameter of the model(s) in the loss's graph, and for those in it the line that called their module."""
        from gradprobe.sharded import unsharded_to_sharded
        from gradprobe.wrappers import clean_name, unwrap_library

        names: list[str] = []
        used: dict[str, Any] = {}
        called: dict[str, Any] = {}  # parameters whose module was called with grad but that are not in the graph
        params: list[torch.Tensor] = []
        roots = self.roots()
        for root in roots:
            model, _ = unwrap_library(root)
            owned = {id(p): id(m) for m in model.modules() for p in m._parameters.values() if p is not None}
            named = list(model.named_parameters())
            # FSDP2: the graph's leaves are the unsharded parameters its forward swapped in for the sharded ones
            took_part = self.used | {id(sh) for uid, sh in unsharded_to_sharded(model).items() if uid in self.used}
            if not any(id(p) in took_part for _, p in named):
                continue
            for raw, p in named:
                n = clean_name(raw)
                names.append(n)
                params.append(p)
                if id(p) in took_part:
                    used[n] = self.sites.get(owned.get(id(p), -1))
                elif owned.get(id(p), -1) in self.sites:
                    called[n] = self.sites[owned[id(p)]]
        ddps = [m for m in roots if _is_ddp(m)]
        return {"index": self.index, "params": names, "used": used, "called": called, "ddp": bool(ddps),
                "find_unused": any(bool(getattr(d, "find_unused_parameters", False)) for d in ddps)}

    def _patch_collectives(self) -> None:
        import torch.distributed as dist

        if not dist.is_available():
            return
        orig = getattr(dist, "all_reduce", None)
        if orig is None:
            return
        watch = self

        def all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if not watch.taken and isinstance(tensor, torch.Tensor):
                op = kwargs.get("op", args[0] if args else dist.ReduceOp.SUM)
                loc = watch.user.innermost(skip=2)
                watch.reduced[id(tensor)] = {"op": str(op).rsplit(".", 1)[-1], "before": checksum(tensor),
                                             "location": loc}
                watch.reduce_at = watch.reduce_at or loc
            return orig(tensor, *args, **kwargs)

        dist.all_reduce = all_reduce
        self._undo.append((dist, "all_reduce", orig))

    # ---- the snapshot at the first step ---------------------------------------------------------------------
    def _pre_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.taken:
            return None
        self.taken = True
        try:
            write_json(self.path, self.snapshot(opt))
        except Exception as exc:  # ours: the checks across ranks lose this rank, the script's step goes on
            write_json(self.path, {"index": self.index, "error": f"{type(exc).__name__}: {exc}"})
        closure = kwargs.get("closure") or (args[1] if len(args) > 1 else None)
        lrs = [g.get("lr") for g in opt.param_groups]
        if self.release and closure is None and not all(lr == 0 for lr in lrs):  # captured here: the script ends
            self.release_ddp()
        return None

    def release_ddp(self) -> None:
        """Drop DDP's reducer (its destructor removes its gradient hooks): the checks then replay the step on the
        wrapped module alone, as on one rank. A reducer left mid-iteration (a bucket a rank never filled) would
        raise at the replay's backward. Only once the rank's step was captured: the script does not go on."""
        for m in self.roots():
            if _is_ddp(m):
                for attr in ("reducer", "logger"):
                    if attr in m.__dict__:
                        m.__dict__[attr] = None

    def snapshot(self, opt: torch.optim.Optimizer) -> dict[str, Any]:
        import torch.distributed as dist

        params = [p for g in opt.param_groups for p in g["params"]]
        roots = self.roots() or _outermost(params)
        names = _names(params, roots)
        owners = _owners(params, roots)
        ddps = [m for m in roots if _is_ddp(m)]
        rows = []
        at_shard = self._shard_sums(roots) if self.at_shard else {}
        for i, p in enumerate(params):
            _, placements = _local(p)
            whole, built, sharded_by = at_shard.get(id(p), (None, None, None))
            red = self.reduced.get(id(p.grad)) if p.grad is not None else None
            owner = owners.get(id(p))
            rows.append({"name": names.get(id(p), f"param[{i}]"), "shape": list(p.shape), "placements": placements,
                         "requires_grad": bool(p.requires_grad),
                         "value": checksum(p), "grad": checksum(p.grad), "used": id(p) in self.used,
                         "site": self.sites.get(owner) if owner is not None else None, "reduced": red,
                         "at_forward": self.at_forward.get(id(p)), "built": built or self.built_at(p),
                         "at_shard": whole, "sharded_by": sharded_by,
                         "at_wrap": self.at_wrap.get(id(p), (None, None))[0],
                         "wrapped_at": self.at_wrap.get(id(p), (None, None))[1]})
        initialized = dist.is_available() and dist.is_initialized()
        return {
            "index": self.index, "pid": os.getpid(),
            "rank": dist.get_rank() if initialized else None,
            "world_size": dist.get_world_size() if initialized else None,
            "step_location": self.user.innermost(skip=3),
            "loss_scaled_by_world": self.loss_scaled_by_world,
            "no_sync_at": self.no_sync_at, "reduce_at": self.reduce_at, "sharded_at": self.sharded_at,
            "ddp": [{"sync": self.ddp_sync_at_last_forward is not False, "by_gradprobe": d in WRAPPED_BY_GRADPROBE,
                     "find_unused": bool(getattr(d, "find_unused_parameters", False))} for d in ddps],
            "params": rows,
        }


def _outermost(params: list[torch.Tensor]) -> list[nn.Module]:
    ids = {id(p) for p in params}
    mods = [o for o in gc.get_objects() if issubclass(type(o), nn.Module)]
    inner = {id(c) for m in mods for c in m.children()}
    return [m for m in mods if id(m) not in inner and any(id(p) in ids for p in m.parameters())]


def _names(params: list[torch.Tensor], roots: list[nn.Module]) -> dict[int, str]:
    """Parameter names in the module holding most of them, without library wrappers' prefixes."""
    from gradprobe.wrappers import clean_name, unwrap_library

    ids = {id(p) for p in params}
    best: dict[int, str] = {}
    for root in roots:
        inner, _ = unwrap_library(root)
        names = {id(p): clean_name(n) for n, p in inner.named_parameters() if id(p) in ids}
        if len(names) > len(best):
            best = names
    return best


def _owners(params: list[torch.Tensor], roots: list[nn.Module]) -> dict[int, int]:
    """id(parameter) -> id(the module that holds it directly)."""
    ids = {id(p) for p in params}
    out: dict[int, int] = {}
    for root in roots:
        for m in root.modules():
            for p in m._parameters.values():
                if p is not None and id(p) in ids:
                    out.setdefault(id(p), id(m))
    return out


def _is_ddp(m: object) -> bool:
    return any(k.__name__ == "DistributedDataParallel" and k.__module__.startswith("torch.") for k in type(m).__mro__)


def last_dump(path: str) -> str:
    """The last faulthandler dump in a rank's stack file."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return ""
    cut = max(text.rfind("Stack (most recent call first)"), text.rfind("Current thread"))
    return text[cut:] if cut >= 0 else text


def collective_of(stack: str, user: UserCode | None = None) -> tuple[str | None, dict[str, Any] | None]:
    """From a faulthandler dump (most recent call first): the collective a rank waits in and the user's line."""
    import re

    collective, line = None, None
    for m in re.finditer(r'File "([^"]+)", line (\d+) in (\S+)', stack):
        path, lineno, fn = m.group(1), int(m.group(2)), m.group(3)
        if collective is None and os.sep + "distributed" + os.sep in path and fn in COLLECTIVES + ("wait",):
            collective = fn if fn != "wait" else None
        if collective is None and fn in ("_engine_run_backward", "backward") and "autograd" in path:
            collective = "backward (DDP's gradient all-reduce)"
        if line is None and user is not None and user.is_user_file(path):
            line = user.location_of(path, lineno, fn)
    return collective, line


__all__ = ["RankWatch", "write_json", "checksum", "collective_of", "last_dump", "COLLECTIVES"]
