"""The sweep's ground truth (benchmarks/sweep.py): one real training step of a model in plain PyTorch, without
gradprobe. A fork server that imported torch once answers each spec (a JSON line on stdin) from a forked child: does
the model train (finite loss and gradients, AdamW moves the trainable parameters), and which gradients are None or
zero by design. `GroundTruth` is one such server (a lane of the sweep), restarted if it dies.

    python benchmarks/sweep_truth.py     # the server itself (what GroundTruth starts; sweep.py --gt-server too)
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
EXAMPLES = ROOT / "examples" / "broken"
GT_TIMEOUT_S = 90.0


def gt_server() -> None:
    """Read specs (JSON lines) on stdin, answer each with the plain-PyTorch ground truth on stdout."""
    sys.path.insert(0, str(BENCH))
    import torch  # noqa: F401  (imported once, before forking; no tensor op runs in this process)

    for mod in ("transformers", "peft", "diffusers"):
        try:
            __import__(mod)
        except Exception:
            pass
    out = sys.stdout
    for line in sys.stdin:
        spec = json.loads(line)
        out.write(json.dumps(_gt_fork(spec)) + "\n")
        out.flush()


def _gt_fork(spec: dict) -> dict:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            res = _gt_child(spec)
        except BaseException as exc:
            res = {"error": f"{type(exc).__name__}: {str(exc)[:300]}", "tb": traceback.format_exc()[-1500:]}
        data = json.dumps(res, default=str).encode()
        with os.fdopen(w, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(w)
    buf = b""
    deadline = time.monotonic() + GT_TIMEOUT_S
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            return {"error": f"plain step did not finish in {GT_TIMEOUT_S:g} s"}
        ready, _, _ = select.select([r], [], [], min(left, 1.0))
        if ready:
            chunk = os.read(r, 1 << 20)
            if not chunk:
                break
            buf += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if not buf:
        return {"error": f"plain step child died (status {status})"}
    return json.loads(buf)


def _gt_child(spec: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    import sweep_models as sm

    if spec["family"] == "examples":
        return _gt_example(spec)
    if spec["family"] in ("transformers", "midtrain"):
        errors = []
        for variant in range(4):
            try:
                res = sm.plain_step({**spec, "variant": variant})
                res["variant"] = variant
                return res
            except TimeoutError as exc:
                return {"error": str(exc)}
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                if variant == 0 and _not_a_shape_problem(exc):
                    break
        return {"error": errors[0], "all_errors": errors}
    return sm.plain_step(spec)


def _not_a_shape_problem(exc: BaseException) -> bool:
    """Build failures (not the batch's shape) are not retried with another batch."""
    tb = traceback.extract_tb(exc.__traceback__)
    return not any(fr.name in ("forward", "hf_inputs", "_call_impl", "plain_step") for fr in tb[1:]) and \
        not isinstance(exc, (RuntimeError, ValueError, IndexError))


def _gt_example(spec: dict) -> dict:
    import importlib.util

    import torch

    sys.path.insert(0, str(EXAMPLES))
    modspec = importlib.util.spec_from_file_location("example_under_sweep", EXAMPLES / spec["file"])
    mod = importlib.util.module_from_spec(modspec)
    modspec.loader.exec_module(mod)
    t0 = time.perf_counter()
    model = mod.build_model()
    batch = mod.make_inputs() if hasattr(mod, "make_inputs") else None
    # build_model() may return several modules (a dict or a list of them, one optimizer over them)
    parts = model.items() if isinstance(model, dict) else enumerate(model) if isinstance(model, (list, tuple)) else \
        [("", model)]
    named = [(f"{k}.{n}" if k != "" else n, p) for k, m in parts for n, p in m.named_parameters() if p.requires_grad]
    opt = mod.make_optimizer(model) if hasattr(mod, "make_optimizer") else \
        torch.optim.AdamW([p for _, p in named], lr=1e-3)
    build_s = time.perf_counter() - t0
    before = {n: p.detach().clone() for n, p in named}
    t1 = time.perf_counter()
    if hasattr(mod, "train_step"):
        mod.train_step(model, batch, opt)
        loss_val = None
    else:
        out = _call(model, batch)
        loss = mod.loss_fn(out, batch) if hasattr(mod, "loss_fn") else _default_loss(out)
        loss.backward()
        opt.step()
        loss_val = float(loss.detach())
    step_s = time.perf_counter() - t1
    moved = [n for n, p in named if not torch.equal(before[n], p.detach())]
    none = [n for n, p in named if p.grad is None]
    zero = [n for n, p in named if p.grad is not None and not bool(p.grad.any())]
    trains = bool(moved) and (loss_val is None or loss_val == loss_val)
    return {"trains": trains, "why": "" if trains else "no parameter moved", "loss": loss_val, "build_s": build_s,
            "step_s": step_s, "trainable": len(named), "grad_none": none, "grad_zero": zero, "moved": len(moved)}


def _call(model, batch):
    """The documented call of a build_model() target: a dict's keys that the forward takes (all of them when it takes
    **kwargs), a tuple as arguments, anything else as the one argument (docs/targets.md)."""
    import inspect

    if isinstance(batch, dict):
        inner = getattr(model, "_orig_mod", model)  # a compiled module's forward takes anything: the module's own
        params = inspect.signature(inner.forward).parameters.values()
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            names = {p.name for p in params}
            batch = {k: v for k, v in batch.items() if k in names}
        return model(**batch)
    return model(*batch) if isinstance(batch, tuple) else model(batch)


def _default_loss(out):
    """gradprobe's documented default: an HF output's .loss, a scalar as it is, else a fixed random projection."""
    import torch

    if getattr(out, "loss", None) is not None:
        return out.loss
    if isinstance(out, torch.Tensor) and out.numel() == 1:
        return out.reshape(())
    flat = [t for t in (out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else [out])
            if isinstance(t, torch.Tensor) and t.is_floating_point()]
    g = torch.Generator().manual_seed(0)
    return sum((t * torch.randn(t.shape, generator=g)).sum() for t in flat)


class GroundTruth:
    """One fork server process (a lane); restarted if it dies."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve())],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
                                              TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false",
                                              HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"),
                                     cwd=tempfile.gettempdir())

    def ask(self, spec: dict) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(spec) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError) as exc:
            self.proc = None
            return {"error": f"ground-truth server died: {exc}"}
        if not line:
            self.proc = None
            return {"error": "ground-truth server died"}
        return json.loads(line)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


if __name__ == "__main__":
    gt_server()
