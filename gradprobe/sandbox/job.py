"""One job inside the child: load the target, run the asked check, return a JSON-ready report."""

from __future__ import annotations

import math
from typing import Any
from collections.abc import Callable

from gradprobe.tools import BY_NAME


def json_safe(obj: Any, depth: int = 0) -> Any:
    """Plain JSON values only: non-finite floats become None, unknown objects their repr."""
    if depth > 40:
        return repr(obj)[:200]
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [json_safe(v, depth + 1) for v in obj]
    try:
        import torch

        if isinstance(obj, torch.Tensor) and obj.numel() == 1:
            return json_safe(obj.item(), depth + 1)
    except Exception:
        pass
    return repr(obj)[:500]


def run_job(job: dict, progress: Callable[[str], None]) -> dict:
    tool = job.get("tool")
    options = job.get("options") or {}
    spec = BY_NAME.get(tool) if isinstance(tool, str) else None
    if spec is None:
        return {"tool_error": f"unknown tool {tool!r}"}
    unusable = _unusable_interpreter()
    if unusable:
        return {"tool_error": unusable, "tool_error_kind": "interpreter"}
    try:
        from gradprobe.loading import TargetError, TargetRefError, load_target
        from gradprobe.userframes import UserCode
    except Exception as exc:  # torch missing or too old in the chosen interpreter
        return {"tool_error": f"this interpreter cannot run gradprobe's checks: {type(exc).__name__}: {exc}",
                "tool_error_kind": "interpreter"}
    target = job.get("target") or {}
    import tempfile

    tempfile.tempdir = None  # a warm worker's fork inherits its cached temp dir: use this call's TMPDIR
    if target.get("script") or target.get("module"):
        from gradprobe.scripts.job import run_script_job

        return json_safe(run_script_job(spec.name, target, options, progress))
    try:
        if not spec.allows_meta and target.get("device") == "meta":
            return {"tool_error": 'device="meta" is only for inspect_parameters (no weights exist to run a step on)'}
        loaded = load_target(target, progress)
    except TargetRefError as exc:
        return {"tool_error": str(exc)}
    except TargetError as exc:
        from gradprobe.sandbox.failures import load_failure_report

        return json_safe(load_failure_report(spec.name, exc, UserCode(target.get("project_dir"))))
    if loaded.batch is None and loaded.train_step is None and spec.needs_step:
        return {"tool_error": f"{tool} runs a step, so the target needs `inputs` (a callable returning a batch, "
                              "or make_inputs in the model's file) or a `train_step`"}
    progress("checking")
    from gradprobe.tools import run_tool

    try:
        report = run_tool(spec.name, loaded, options)
    except Exception as exc:  # a bug of ours comes back as GP000, never as the user's error
        from gradprobe.sandbox.failures import internal_error_report

        report = internal_error_report(spec.name, exc)
    report.setdefault("facts", {})["target"] = loaded.info
    report["facts"]["child_peak_rss_mb"] = _peak_rss_mb()
    if str(loaded.device).startswith("cuda"):
        import torch

        dev = torch.device(loaded.device)
        report["facts"]["cuda"] = {
            "device_name": torch.cuda.get_device_name(dev), "cuda_version": torch.version.cuda,
            "memory_allocated_mb": round(torch.cuda.memory_allocated(dev) / 2**20, 1),
            "max_memory_allocated_mb": round(torch.cuda.max_memory_allocated(dev) / 2**20, 1),
        }
    return json_safe(report)


def _unusable_interpreter() -> str | None:
    """Why this interpreter cannot run the checks (no torch, a torch or Python too old), or None."""
    import sys

    from gradprobe.sandbox.interpreter import MIN_PYTHON, MIN_TORCH, SUPPORTED

    here = f"Python {sys.version.split()[0]}"
    if sys.version_info[:2] < MIN_PYTHON:
        return f"this interpreter is {here}, older than gradprobe supports ({SUPPORTED})"
    try:
        import torch
    except ImportError as exc:
        return f"this interpreter ({here}) has no torch ({type(exc).__name__}: {exc}); gradprobe needs {SUPPORTED}"
    version = str(getattr(torch, "__version__", "0"))
    parts = tuple(int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit())
    if parts < MIN_TORCH:
        return f"this interpreter's torch is {version} ({here}), older than gradprobe supports ({SUPPORTED})"
    return None


def runtime_facts() -> dict:
    """What this interpreter is (reported by the child; the server adds how it was chosen)."""
    import platform
    import sys

    torch = sys.modules.get("torch")
    return {"python_version": platform.python_version(), "torch_version": str(getattr(torch, "__version__", "")) or None,
            "executable": sys.executable}


def _peak_rss_mb() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
