"""One job inside the child: load the target (or run the script), run the asked check, return a JSON-ready report."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gradprobe.sandbox.interpreter import interpreter_error, unusable_interpreter
from gradprobe.sandbox.protocol import Job, Phase, ToolError, json_safe
from gradprobe.tools import BY_NAME, Tool

Progress = Callable[[str], None]


def run_job(job: Job | Mapping[str, Any], progress: Progress) -> ToolError | dict[str, Any]:
    """The report of one tool call, or why the call cannot run as asked."""
    job = job if isinstance(job, Job) else Job.model_validate(job)
    spec = BY_NAME.get(job.tool)
    if spec is None:
        return ToolError(tool_error=f"unknown tool {job.tool!r}")
    unusable = unusable_interpreter()
    if unusable:
        return ToolError(tool_error=unusable, tool_error_kind="interpreter")
    try:
        from gradprobe.loading import load_target  # noqa: F401  (torch: the interpreter's first need)
    except Exception as exc:  # torch missing or too old in the chosen interpreter
        return ToolError(tool_error=interpreter_error(exc), tool_error_kind="interpreter")
    import tempfile

    tempfile.tempdir = None  # a warm worker's fork inherits its cached temp dir: use this call's TMPDIR
    if spec.name == "diagnose" and "compare" in job.options:  # check_equivalence's comparisons, run beside diagnose
        from gradprobe.scriptmode.paired import diagnose_with_comparisons

        return _safe(diagnose_with_comparisons(job, progress, _dispatch))
    return _dispatch(spec, job, progress)


def _dispatch(spec: Tool, job: Job, progress: Progress,
              also: Callable[[Any], dict[str, Any]] | None = None) -> ToolError | dict[str, Any]:
    """The job as its target asks: a script's (or several ranks'), or a build_model() target loaded here."""
    if spec.name == "check_equivalence" and (job.target.get("script") or job.target.get("module")):
        # the setup under test and its reference, each run in processes of its own (scriptmode/paired.py)
        from gradprobe.scriptmode.paired import run_equivalence_job

        return _safe(run_equivalence_job(spec.name, job.target, job.options, progress))
    if spec.name == "check_equivalence" and int(job.target.get("world_size") or 1) > 1:
        # a build_model() target: N processes against one by paired runs (each rank runs it as modelranks.py does),
        # the other comparisons on the target loaded in this process
        from gradprobe.scriptmode.paired import compare_pairs

        paired = compare_pairs(job.target, job.options, progress)
        job = Job(tool=job.tool, target=dict(job.target, world_size=1), options=dict(job.options, _paired=paired, _world_size=int(
            job.target.get("world_size") or 1)))
    elif job.target.get("script") or job.target.get("module") or int(job.target.get("world_size") or 1) > 1:
        # several ranks (a script's, or a build_model() target's), or workers a script spawns; else as one
        from gradprobe.scriptmode.ranks import run_script_ranks

        return _safe(run_script_ranks(spec.name, job.target, job.options, progress))
    return _check_target(spec, job, progress, also)


def _safe(report: ToolError | dict[str, Any]) -> ToolError | dict[str, Any]:
    from gradprobe.verdict import settle

    return report if isinstance(report, ToolError) else json_safe(settle(report))


def _check_target(spec: Tool, job: Job, progress: Progress,
                  also: Callable[[Any], dict[str, Any]] | None = None) -> ToolError | dict[str, Any]:
    """Load a build_model() target and run the tool on it (and `also` on the same loaded target, into facts._also)."""
    from gradprobe.errors import TargetError, TargetRefError
    from gradprobe.loading import load_target
    from gradprobe.userframes import UserCode

    target = job.target
    try:
        if not spec.allows_meta and target.get("device") == "meta":
            return ToolError(tool_error='device="meta" is only for inspect_parameters (no weights exist to run a step on)')
        loaded = load_target(target, progress)
    except TargetRefError as exc:
        return ToolError(tool_error=str(exc))
    except TargetError as exc:
        from gradprobe.sandbox.failures import load_failure_report

        return _safe(load_failure_report(spec.name, exc, UserCode(target.get("project_dir"))))
    if loaded.batch is None and loaded.train_step is None and spec.needs_step:
        several = (loaded.info.get("models") or {}).get("note")  # several models given, no train_step
        return ToolError(tool_error=f"{spec.name} runs a step: {several}" if several else
                         f"{spec.name} runs a step, so the target needs `inputs` (a callable returning a batch, "
                         "or make_inputs in the model's file) or a `train_step`")
    progress(Phase.CHECKING)
    from gradprobe.tools import run_tool

    try:
        report = run_tool(spec.name, loaded, job.options)
    except Exception as exc:  # a bug of ours comes back as GP000, never as the user's error
        from gradprobe.sandbox.failures import internal_error_report

        report = internal_error_report(spec.name, exc)
    if also is not None:
        report.setdefault("facts", {})["_also"] = also(loaded)
    report.setdefault("facts", {})["target"] = loaded.info
    report["facts"]["child_peak_rss_mb"] = _peak_rss_mb()
    if str(loaded.device).startswith("cuda"):
        report["facts"]["cuda"] = _cuda_facts(loaded.device)
    return _safe(report)


def _cuda_facts(device: str) -> dict[str, Any]:
    import torch

    dev = torch.device(device)
    return {
        "device_name": torch.cuda.get_device_name(dev), "cuda_version": torch.version.cuda,
        "memory_allocated_mb": round(torch.cuda.memory_allocated(dev) / 2**20, 1),
        "max_memory_allocated_mb": round(torch.cuda.max_memory_allocated(dev) / 2**20, 1),
    }


def runtime_facts() -> dict[str, Any]:
    """What this interpreter is (reported by the child; the server adds how it was chosen)."""
    import platform
    import sys

    torch = sys.modules.get("torch")
    return {"python_version": platform.python_version(), "torch_version": str(getattr(torch, "__version__", "")) or None,
            "executable": sys.executable}


def _peak_rss_mb() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
