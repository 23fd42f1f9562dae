"""One job inside the child: load the target, run the asked check, return a JSON-ready report."""

from __future__ import annotations

import math
import re
import traceback
from typing import Any, Callable

TOOLS = ("inspect_parameters", "check_optimizer_coverage", "run_gradcheck", "trace_grad_path", "verify_prompt_tuning", "diagnose")


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


def load_failure_report(tool: str, exc, user) -> dict:
    """GP100 (or GP106 for a missing super().__init__()) with the user's trimmed traceback."""
    from gradprobe.report import make_report
    from gradprobe.findings import make_finding

    cause = exc.cause or exc
    tb = user.trimmed_traceback(cause) if exc.cause is not None else ""
    loc = user.innermost_of_traceback(cause) if exc.cause is not None else None
    text = str(cause)
    evidence = {"phase": exc.phase, "exception": type(cause).__name__, "traceback": tb}
    if re.search(r"before Module.__init__\(\) call|has no attribute '_(parameters|modules|buffers)'", text):
        cls = _class_of_failing_init(cause)
        finding = make_finding(
            "GP106",
            f"{cls or 'A module class'}.__init__ never called super().__init__(), so assigning a submodule or parameter failed: {text}",
            parameters=[cls] if cls else [], location=loc, evidence=evidence,
            fix="class Net(nn.Module):\n    def __init__(self):\n        super().__init__()  # first line\n        ...",
        )
    else:
        finding = make_finding("GP100", f"The target failed while {exc.phase}: {exc}", location=loc, evidence=evidence)
    return make_report(tool, [finding], [f"The target could not be loaded ({exc.phase})."])


def _class_of_failing_init(exc: BaseException) -> str | None:
    tb = exc.__traceback__
    name = None
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "__init__" and "self" in frame.f_locals:
            if "torch/nn/modules/module.py" not in frame.f_code.co_filename:
                name = type(frame.f_locals["self"]).__name__
        tb = tb.tb_next
    return name


def run_job(job: dict, progress: Callable[[str], None]) -> dict:
    tool = job.get("tool")
    options = job.get("options") or {}
    if tool not in TOOLS:
        return {"tool_error": f"unknown tool {tool!r}"}
    try:
        from gradprobe.loading import TargetError, TargetRefError, load_target
        from gradprobe.userframes import UserCode
    except Exception as exc:  # torch missing or too old in the chosen interpreter
        return {"tool_error": f"this interpreter cannot run gradprobe's checks: {type(exc).__name__}: {exc}"}
    target = job.get("target") or {}
    import tempfile

    tempfile.tempdir = None  # a warm worker's fork inherits its cached temp dir: use this call's TMPDIR
    if target.get("script") or target.get("module"):
        from gradprobe.scripts.job import run_script_job

        return json_safe(run_script_job(tool, target, options, progress))
    try:
        if tool != "inspect_parameters" and target.get("device") == "meta":
            return {"tool_error": 'device="meta" is only for inspect_parameters (no weights exist to run a step on)'}
        loaded = load_target(target, progress)
    except TargetRefError as exc:
        return {"tool_error": str(exc)}
    except TargetError as exc:
        return json_safe(load_failure_report(tool, exc, UserCode(target.get("project_dir"))))
    if loaded.batch is None and loaded.train_step is None and tool in ("trace_grad_path", "run_gradcheck", "verify_prompt_tuning"):
        return {"tool_error": f"{tool} runs a step, so the target needs `inputs` (a callable returning a batch, "
                              "or make_inputs in the model's file) or a `train_step`"}
    progress("checking")
    from gradprobe.checks import run_tool

    try:
        report = run_tool(tool, loaded, options)
    except Exception as exc:  # a bug of ours must still come back as a readable finding
        from gradprobe.report import make_report
        from gradprobe.findings import make_finding

        report = make_report(tool, [make_finding(
            "GP100", f"gradprobe's {tool} check failed on this target: {type(exc).__name__}: {exc}",
            evidence={"phase": "checking", "internal_traceback": traceback.format_exc()[-4000:]},
            fix="This is a gradprobe bug or an unsupported construct; the evidence has the traceback.",
        )])
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


def _peak_rss_mb() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
