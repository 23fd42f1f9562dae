"""What every tool does once its options are validated: run the sandbox, forward progress, shape the result."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from gradprobe.flowchart import flow_mermaid
from gradprobe.render import render_text
from gradprobe.sandbox.call import execute
from gradprobe.errors import ToolInputError
from gradprobe.server.models import Report
from gradprobe.target import Target

if TYPE_CHECKING:
    from gradprobe.server.runtime import Runtime

log = logging.getLogger("gradprobe.audit")

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)

TARGET_HELP = (
    "`target` says where the user's code is: project_dir (absolute path; may be left out when model is an "
    "absolute file path, e.g. {\"model\": \"/home/ana/proj/train.py\"}), then either script "
    '("train.py", run to its first optimizer step, which is checked; args: its argv; module for '
    "`python -m` entry points; preferred on real projects) or model "
    '("train.py:build_model", or just "case.py" to pick up build_model/make_inputs/loss_fn/'
    "make_optimizer/train_step from that file), inputs, loss, optimizer, train_step (same "
    "FILE_OR_MODULE:CALLABLE form), setup (inline Python defining model/inputs/...), device "
    '("cpu", "cuda", "auto"), seed, timeout_s. The code runs in a sandboxed child process, never in the server, with '
    "the project's own Python environment (.venv, venv, env, .pixi or the conda env of environment.yml, found from "
    "project_dir up), else the server's interpreter: set python to an interpreter's absolute path to choose another "
    '("server" for the server\'s own); every report says which one ran. read_paths names data or cache directories '
    "outside the project the code may read; env sets variables (e.g. WANDB_MODE); memory_gb raises the memory limit. "
    "A dict batch is passed as keyword arguments (keys forward does not take stay for loss_fn(output, batch)); "
    "the full format, with a worked example, is docs/targets.md in the gradprobe repository."
)


def _caller() -> str:
    """The authenticated caller over HTTP (its token's client_id), "local" over stdio."""
    try:
        from mcp.server.auth.middleware.auth_context import get_access_token

        token = get_access_token()
    except Exception:
        token = None
    return token.client_id if token is not None else "local"


async def call_tool(runtime: Runtime, tool: str, target: Target, options: dict[str, Any], ctx: Context | None,
                    extra_content: list[Any] | None = None,
                    post: Callable[[dict[str, Any]], list[Any]] | None = None) -> CallToolResult:
    t0 = time.monotonic()

    async def progress(phase: str, elapsed: float | None) -> None:
        if ctx is not None:
            try:
                await ctx.report_progress(runtime.phase_index(phase), total=runtime.phase_total, message=phase)
            except Exception:  # a client that went away must not break the call
                pass

    outcome = "error"
    caller = _caller()
    try:
        await anyio.to_thread.run_sync(runtime.check_target, target, caller)  # realpath and friends: off the loop
        async with runtime.slot(ctx, caller, runtime.memory_for(target)):
            report = await execute(tool, target, options, progress=progress, executor=runtime.executor,
                                   interpreters=runtime.interpreters_for(caller), roots=runtime.roots_for(caller))
        outcome = str((report.get("verdict") or {}).get("status") or "findings")
    except ToolInputError as exc:
        outcome = "tool-error"
        raise ToolError(str(exc)) from None
    finally:
        # one JSON record per line: a newline or quote in a caller's field cannot forge another record
        log.info("call %s", json.dumps({"caller": caller, "tool": tool, "project": target.project_dir, "model": target.model,
                                        "outcome": outcome, "seconds": round(time.monotonic() - t0, 2)}))
    # checking, drawing and rendering what the child sent is the server's own work: bounded first, then off the loop
    data, content = await anyio.to_thread.run_sync(shape, report, extra_content, post)
    return CallToolResult(content=content, structured_content=data, is_error=False)


def shape(report: dict[str, Any], extra: list[Any] | None,
          post: Callable[[dict[str, Any]], list[Any]] | None) -> tuple[dict[str, Any], list[Any]]:
    """The answer: the pictures `post` draws (it bounds what it draws first: stepchart.clean_groups), the
    schema-checked report and its text."""
    facts: dict[str, Any] = report["facts"] if isinstance(report.get("facts"), dict) else {}
    if post is not None:
        extra = post(report)
    if "mermaid" in facts:  # the child's text is untrusted: rebuilt here from the type-checked graph
        facts["mermaid"] = flow_mermaid(facts["flow"]) if facts.get("flow") else ""
    validated = Report.model_validate(report)  # the child's JSON is untrusted: schema-check it
    data = validated.model_dump(mode="json")
    return data, [TextContent(type="text", text=render_text(data))] + list(extra or [])
