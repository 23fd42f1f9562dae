"""`trace_grad_path`: which parameters the loss cannot reach, and the user's line where the path breaks (GP3xx)."""

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

DESCRIPTION = f"""Run one real step of the user's model (their train_step when given, else forward +
loss + backward) with every torch op observed, and report, per trainable parameter, whether the
forward read it and whether its .grad is None, zero, finite or non-finite. For each parameter the
loss cannot reach it names the op and the user's file:line where the path breaks and why:
.detach()/.data (GP302), no_grad/inference_mode (GP303), .item()/.numpy() then torch.tensor/
from_numpy (GP304), argmax/round/integer casts (GP305), tensors sent to another process (GP309),
else GP301. Also: backward errors (GP308), NaN/Inf grads (GP307), non-differentiable loss (GP310),
unused (GP311) or zero-gradient (GP306) parameters, norm spread (GP312), hooks (GP313), .grad of
non-leaves read (GP314).

Use it for "my layer gets no gradient" / "element 0 of tensors does not require grad".
`parameters` restricts the report to some parameter names (prefixes allowed).
{TARGET_HELP}
Example: {{"target": {{"project_dir": "/home/ana/proj", "model": "train.py"}}}}"""


def register(server: MCPServer, runtime: Runtime) -> None:
    @server.tool(name="trace_grad_path", title="Trace the gradient path", description=DESCRIPTION, annotations=READ_ONLY)
    async def trace_grad_path(
        target: Target,
        ctx: Context,
        parameters: Annotated[list[str] | None, Field(description="Only report these parameter names or name prefixes.")] = None,
    ) -> Annotated[CallToolResult, Report]:
        return await call_tool(runtime, "trace_grad_path", target, {"parameters": parameters}, ctx)
