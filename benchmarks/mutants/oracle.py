"""The plain-PyTorch oracle: run a project's driver once, outside gradprobe, and measure what trained.

`run_project` runs in a forked child of the bench (torch and the libraries already imported, so a run
costs the project's own import, build and step). It reports, per tensor name (parameters, buffers and
plain tensor attributes, by attribute path from the model root, through plain lists and dicts too), the
gradient state and whether the step changed it; the phase and error where the driver raised; the
lines of the project's files that ran while building and while stepping; and gradcheck verdicts for
the Functions the driver lists in `gradcheck_cases()`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
from torch import nn


def named_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()

    def add(name: str, t: Any) -> None:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and id(t) not in seen:
            seen.add(id(t))
            out[name] = t

    def walk(mod: nn.Module, prefix: str, stack: set[int]) -> None:
        if id(mod) in stack:
            return
        stack = stack | {id(mod)}
        for n, p in mod._parameters.items():
            add(prefix + n, p)
        for n, b in mod._buffers.items():
            add(prefix + n, b)
        for n, v in vars(mod).items():
            if n.startswith("_"):
                continue
            if isinstance(v, torch.Tensor):
                add(prefix + n, v)
            elif isinstance(v, (list, tuple, dict)):
                for k, x in (v.items() if isinstance(v, dict) else enumerate(v)):
                    if isinstance(x, nn.Module):
                        walk(x, f"{prefix}{n}.{k}.", stack)
                    else:
                        add(f"{prefix}{n}.{k}", x)
        for n, c in mod._modules.items():
            if c is not None:
                walk(c, f"{prefix}{n}.", stack)

    walk(model, "", set())
    return out


def grad_state(t: torch.Tensor) -> str:
    g = t.grad
    if g is None:
        return "none"
    if not torch.isfinite(g).all():
        return "nonfinite"
    return "zero" if bool((g == 0).all()) else "ok"


def _import(project: Path) -> Any:
    spec = importlib.util.spec_from_file_location("case", project / "case.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["case"] = mod
    spec.loader.exec_module(mod)
    return mod


def _forget_local_modules(project: Path) -> None:
    for p in project.glob("*.py"):
        sys.modules.pop(p.stem, None)
    sys.modules.pop("case", None)


def warm(project: Path) -> None:
    """Run the project once in this process, so that forked runs skip torch's and the libraries' lazy set-up."""
    try:
        run_project(project, False)
    finally:
        _forget_local_modules(project)
        while str(project) in sys.path:
            sys.path.remove(str(project))


def run_project(project: Path, trace: bool) -> dict[str, Any]:
    _forget_local_modules(project)
    sys.path.insert(0, str(project))
    files = {str(p.resolve()): p.name for p in project.glob("*.py")}
    lines: dict[str, set[tuple[str, int]]] = {"build": set(), "step": set()}
    phase = "load"
    res: dict[str, Any] = {"error": None, "phase": None}

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            lines["step" if phase == "step" else "build"].add((files[frame.f_code.co_filename], frame.f_lineno))
        return local

    def glob(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename in files:
            return local
        return None

    torch.set_grad_enabled(True)
    torch.manual_seed(0)
    at_step: dict[str, str] = {}  # gradient states when step() starts (a later zero_grad hides them)
    try:
        if trace:
            sys.settrace(glob)
        case = _import(project)
        phase = "build"
        model = case.build_model()
        phase = "inputs"
        batch = case.make_inputs()
        phase = "optimizer"
        opt = case.make_optimizer(model)
        before = {n: t.detach().clone() for n, t in named_tensors(model).items()}

        def pre_step(*_: Any) -> None:
            if not at_step:
                at_step.update({n: grad_state(t) for n, t in named_tensors(model).items()})

        if hasattr(opt, "register_step_pre_hook"):
            opt.register_step_pre_hook(pre_step)
        req = {n: bool(t.requires_grad) for n, t in named_tensors(model).items()}
        phase = "step"
        case.train_step(model, batch, opt)
        phase = "done"
    except BaseException as exc:  # the mutant's own failure is a measurement
        res["error"] = f"{type(exc).__name__}: {exc}"[:400]
        res["phase"] = phase
        res["where"] = [(files.get(str(Path(f.filename).resolve())), f.lineno)
                        for f in traceback.extract_tb(exc.__traceback__) if str(Path(f.filename).resolve()) in files]
    finally:
        sys.settrace(None)
    if res["error"] is None or res["phase"] == "step":
        try:
            after = named_tensors(model)
            res["tensors"] = {n: {"grad": (at_step.get(n) or grad_state(after[n])) if n in after else "missing",
                                  "changed": bool(n in after and not torch.equal(before[n], after[n].detach())),
                                  "requires_grad": req[n]}
                              for n in before}
            res["children"] = _children(model)
        except Exception as exc:
            res["tensors"] = {}
            res["children"] = []
            res["error"] = res["error"] or f"oracle: {exc}"
    if hasattr(sys.modules.get("case"), "gradcheck_cases"):
        _gradcheck_cases(sys.modules["case"], res)
    res["lines"] = {k: sorted(v) for k, v in lines.items()}
    return res


def _gradcheck_cases(case: Any, res: dict[str, Any]) -> None:
    """torch's gradcheck on each of the case's `gradcheck_cases()`, into res["gradcheck"]."""
    res["gradcheck"] = {}
    try:
        for fn, args in case.gradcheck_cases():
            try:
                ok = torch.autograd.gradcheck(fn.apply, args, raise_exception=False)
            except Exception:
                ok = False
            res["gradcheck"][fn.__name__] = bool(ok)
    except Exception as exc:
        res["gradcheck"]["<cases>"] = False
        res.setdefault("error", str(exc))


def _children(model: nn.Module) -> list[str]:
    out = []
    for name, mod in model.named_modules():
        if not name or name.count(".") > 2:
            continue
        if any(p.requires_grad for p in mod.parameters()):
            out.append(name)
    return out


def run_forked(project: Path, trace: bool = False, timeout: float = 90.0) -> dict[str, Any]:
    """Run `run_project` in a forked child; a hang or a crash is a result too."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        code = 0
        try:
            os.setpgid(0, 0)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            data = json.dumps(run_project(project, trace)).encode()
        except BaseException as exc:
            data = json.dumps({"error": f"oracle crashed: {exc!r}", "phase": "oracle"}).encode()
            code = 1
        with os.fdopen(w, "wb") as fh:
            fh.write(data)
        os._exit(code)
    os.close(w)
    chunks = []
    with os.fdopen(r, "rb") as fh:
        fd = fh.fileno()
        import time

        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.waitpid(pid, 0)
                return {"error": "timeout", "phase": "timeout"}
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
    try:
        os.killpg(pid, signal.SIGKILL)  # leftovers (e.g. a multiprocessing helper)
    except (ProcessLookupError, PermissionError):
        pass
    os.waitpid(pid, 0)
    try:
        return json.loads(b"".join(chunks) or b"{}") or {"error": "no result", "phase": "oracle"}
    except json.JSONDecodeError:
        return {"error": "bad result", "phase": "oracle"}
