"""Comparison 2 on a build_model() target: the user's train_step, run `steps` times as it is, against the gradient
of the target's loss on the whole batch from the same pre-step weights (the existing full-batch measurement of
checks/steps/fullbatch.py, taken here for every parameter rather than the norms of those nearest the loss).

Each step: the weights and buffers are copied, train_step runs (its backward() calls counted and their losses read,
the gradients taken when its optimizer steps, or before a clip_grad_norm_ it calls), then the pre-step weights are
put back for a moment and the full-batch gradient is taken with torch.autograd.grad (no .grad touched), and the
trained weights put back. Both with dropout off and BatchNorm on its running statistics (determinism.py). The
verdict comes from measured.py, as for scripts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gradprobe.checks.equivalence.determinism import SameComputation
from gradprobe.checks.equivalence.graph import read_loss
from gradprobe.checks.equivalence.measured import Pair, evaluate, result

REFERENCE = "the target's loss on the whole batch, from the same weights"


class _Watch:
    """backward() calls (their losses read) and the gradients of the target's optimizer at its step, or before a clip."""

    def __init__(self, optimizer: torch.optim.Optimizer, names: dict[int, str], user: Any):
        self.optimizer, self.names, self.user = optimizer, names, user
        self.step = 1
        self.grads: dict[int, dict[str, torch.Tensor | None]] = {}
        self.backwards: list[dict[str, Any]] = []
        self.clips: list[dict[str, Any]] = []
        self._undo: list[Any] = []

    def take(self, params: list[torch.Tensor] | None = None) -> None:
        if self.step in self.grads:
            return
        params = params if params is not None else [p for g in self.optimizer.param_groups for p in g["params"]]
        self.grads[self.step] = {self.names.get(id(p), f"param{i}"): (p.grad.detach().float().clone()
                                                                      if p.grad is not None else None)
                                 for i, p in enumerate(params)}

    def __enter__(self) -> _Watch:
        import torch.nn.utils as nn_utils

        watch = self
        self._undo.append(self.optimizer.register_step_pre_hook(lambda opt, args, kwargs: watch.take()))
        orig_backward = torch.Tensor.backward

        def backward(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            rec: dict[str, Any] = {"step": watch.step, "location": watch.user.innermost(skip=2)}
            if t.numel() == 1:
                rec["value"] = float(t.detach().float())
                rec["scaling"], _ = read_loss(t, watch.user)
            watch.backwards.append(rec)
            return orig_backward(t, *args, **kwargs)

        torch.Tensor.backward = backward  # type: ignore[method-assign,assignment]
        self._undo.append((torch.Tensor, "backward", orig_backward))
        for name in ("clip_grad_norm_", "clip_grads_with_norm_"):
            orig = getattr(nn_utils, name, None)
            if orig is None:
                continue

            def clip(parameters: Any, max_norm: float, *args: Any, _orig: Callable[..., Any] = orig, **kw: Any) -> Any:
                params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
                if watch.step not in watch.grads:
                    watch.take(params)
                    watch.clips.append({"step": watch.step, "max_norm": float(max_norm),
                                        "location": watch.user.innermost(skip=2)})
                return _orig(params, max_norm, *args, **kw)

            setattr(nn_utils, name, clip)
            self._undo.append((nn_utils, name, orig))
        return self

    def __exit__(self, *exc: Any) -> None:
        for item in reversed(self._undo):
            if isinstance(item, tuple):
                setattr(*item)
            else:
                item.remove()
        self._undo.clear()


def _loss_on(loaded: Any) -> tuple[torch.Tensor | None, str]:
    from gradprobe.checks.core.step import call_model

    try:
        out = call_model(loaded.model, loaded.batch)
    except Exception:
        if loaded.loss_fn is None:  # a batch only the user's train_step knows how to feed: no loss to take
            return None, ""
        raise
    if loaded.loss_fn is not None:
        return loaded.loss_fn(out, loaded.batch), "loss_fn"
    hf = getattr(out, "loss", None) if not isinstance(out, torch.Tensor) else None
    return (hf, "the model's .loss") if isinstance(hf, torch.Tensor) else (None, "")


def _examples(batch: Any) -> int | None:
    from gradprobe.checks.equivalence.batches import tensors_of

    found = [t for t in tensors_of(batch) if t.dim() > 0]
    return int(found[0].shape[0]) if found else None


def accumulation_in_process(loaded: Any, options: dict[str, Any]) -> dict[str, Any]:
    if loaded is None or loaded.train_step is None:
        return result(False, "the build_model() form accumulates inside a train_step (several backward() calls per "
                             "optimizer step); this target has no train_step")
    if loaded.optimizer is None:
        return result(False, "the target's train_step needs the target's optimizer, which it does not give")
    if int(options.get("_world_size") or 1) > 1:
        return result(True, not_run=[{"check": "the accumulation comparison at several ranks", "cause": "not_applicable",
                                      "why": "a build_model() target's accumulation is compared at world_size 1 (at "
                                             "world_size N its ranks are compared against one process)"}])
    from gradprobe.checks.core.step import param_names

    model, steps = loaded.model, int(options.get("steps") or 2)
    names = {pid: ns[0] for pid, ns in param_names(model).items()}
    watch = _Watch(loaded.optimizer, names, loaded.user)
    same = SameComputation()
    tensors = [t for t in list(model.parameters()) + list(model.buffers())]
    full: dict[int, dict[str, torch.Tensor | None]] = {}
    b_backwards: list[dict[str, Any]] = []
    anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
    try:
        torch.set_anomaly_enabled(True, False)  # the forward's tracebacks: the lines of the loss's scaling
        for s in range(1, steps + 1):
            watch.step = s
            before = [t.detach().clone() for t in tensors]
            with same, watch, torch.enable_grad():
                try:
                    loaded.train_step(model, loaded.batch, loaded.optimizer)
                except Exception as exc:
                    return result(True, not_run=[{"check": "the accumulation comparison", "cause": "user_code",
                                                  "why": f"train_step raised at step {s}: {type(exc).__name__}: {exc}"[:400],
                                                  "location": loaded.user.innermost_of_traceback(exc)}])
            ref = _full_batch(loaded, tensors, before, same)
            if isinstance(ref, str):
                return result(True, not_run=[{"check": "the accumulation comparison", "why": ref, "cause": "refused"}])
            full[s], rec = ref
            b_backwards.append(dict(rec, step=s))
    finally:
        torch.set_anomaly_enabled(*anomaly)
    ks = [sum(1 for b in watch.backwards if b["step"] == s) for s in range(1, steps + 1)]
    if max(ks) < 2:
        return result(False, f"train_step runs one backward() per optimizer step ({ks}): no accumulation")
    a_info = {"optimizer": type(loaded.optimizer).__name__, "backwards": watch.backwards, "clips": watch.clips,
              "pre_clip": sorted({c["step"] for c in watch.clips}), "framework": "plain loop",
              "grad_dtypes": sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()}),
              "module_order": [n for n, _ in model.named_modules()], "dropout_calls": same.dropout_calls,
              "batchnorm_eval": len(same.batchnorm)}
    pair = Pair(kind="accumulation", entry={"reference": REFERENCE, "examples": _examples(loaded.batch), "k": max(ks),
                                            "examples_text": "the target's batch"},
                a_infos=[a_info], b_infos=[{"backwards": b_backwards, "grad_dtypes": a_info["grad_dtypes"]}],
                a={"grads": watch.grads, "targets": {}}, b={"grads": full, "targets": {}}, k=max(ks))
    return evaluate(pair, steps)


def _full_batch(loaded: Any, tensors: list[torch.Tensor], before: list[torch.Tensor],
                same: SameComputation) -> tuple[dict[str, torch.Tensor | None], dict[str, Any]] | str:
    """The full-batch gradient from the pre-step weights `before` (the trained ones put back after), or why not."""
    from gradprobe.checks.core.step import param_names

    model = loaded.model
    trained = [t.detach().clone() for t in tensors]
    params = [p for p in model.parameters() if p.requires_grad]
    names = {pid: ns[0] for pid, ns in param_names(model).items()}
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.no_grad():
            for t, b in zip(tensors, before, strict=True):
                t.copy_(b)
        with torch.random.fork_rng(devices=devices), torch.enable_grad(), same:
            loss, source = _loss_on(loaded)
            if loss is None:
                return ("the full-batch gradient needs the step's loss on the whole batch: give `loss` (loss_fn(output, "
                        "batch)), or a model whose output has .loss")
            if loss.numel() != 1 or not loss.requires_grad:
                return "the target's loss on the whole batch is not a scalar that requires grad"
            rec = {"value": float(loss.detach()), "scaling": read_loss(loss, loaded.user)[0], "source": source}
            grads = torch.autograd.grad(loss, params, allow_unused=True)
    finally:
        with torch.no_grad():
            for t, v in zip(tensors, trained, strict=True):
                t.copy_(v)
    return {names.get(id(p), f"param{i}"): (g.detach().float().clone() if g is not None else None)
            for i, (p, g) in enumerate(zip(params, grads, strict=True))}, rec
