"""`check_optimizer_coverage`: the optimizer against the model, by identity, plus one real step (GP2xx)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult
from pydantic import Field

from gradprobe.server.models import Report
from gradprobe.server.tools._call import READ_ONLY, TARGET_HELP, call_tool
from gradprobe.target import Target

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from gradprobe.server.runtime import Runtime

DESCRIPTION = f"""Compare the user's optimizer with the model by tensor identity: trainable parameters
in no param group (GP201), stale tensors from a rebuilt/deep-copied model (GP202), frozen or
duplicate or non-leaf tensors in groups (GP203/204/206), lr 0 (GP205), an empty optimizer (GP208).
With step=true it snapshots the parameters, runs one real step (the user's train_step when
given) and reports parameters with a nonzero gradient that did not change (GP207) and why.
Distinct Parameters over one storage that the optimizer holds both of (a tie made with `.data`)
are reported with the step measured: the storage's move against one tied Parameter's.
Reports per group: lr, weight decay, tensor count and names.

Use it when the loss does not go down although gradients exist. The target needs `optimizer`
(a callable taking the model), or a file defining make_optimizer.
{TARGET_HELP}
Example: {{"target": {{"project_dir": "/home/ana/proj", "model": "train.py"}}, "step": true}}"""


def register(server: MCPServer, runtime: Runtime) -> None:
    @server.tool(name="check_optimizer_coverage", title="Check optimizer coverage", description=DESCRIPTION,
                 annotations=READ_ONLY)
    async def check_optimizer_coverage(
        target: Target,
        ctx: Context,
        step: Annotated[bool, Field(description="Run one real optimizer step and report parameters that did not move.")] = True,
    ) -> Annotated[CallToolResult, Report]:
        return await call_tool(runtime, "check_optimizer_coverage", target, {"step": step}, ctx)
