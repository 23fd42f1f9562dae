"""`inspect_parameters`: what the model registers, and what it should but does not (GP1xx)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult

from gradprobe.server.models import Report
from gradprobe.server.tools._call import READ_ONLY, TARGET_HELP, call_tool
from gradprobe.target import Target

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from gradprobe.server.runtime import Runtime

DESCRIPTION = f"""Load the user's model in a sandbox and list every registered parameter and buffer
(name, shape, dtype, device, requires_grad, is_leaf, tied aliases), plus what the model should
register but does not: plain tensors with requires_grad (GP101), Parameters or Modules in Python
lists/dicts (GP102/GP103), non-leaf "parameters" from nn.Parameter(x).to(...) (GP109),
`module.requires_grad = True` attributes (GP107), learnable buffers (GP104), frozen/tied
parameters, no trainable parameters, grad mode off, missing super().__init__(), and distinct
Parameters over one storage (a tie made with `.data`: each gets part of the gradient), found by
storage identity at the line that made the second.

Use it when a parameter is missing from named_parameters()/the state_dict, or never changes.
device="meta" inspects models too large for the machine without allocating weights.
{TARGET_HELP}
Example: {{"target": {{"project_dir": "/home/ana/proj", "model": "model.py:build_model"}}}}"""


def register(server: MCPServer, runtime: Runtime) -> None:
    @server.tool(name="inspect_parameters", title="Inspect parameters", description=DESCRIPTION, annotations=READ_ONLY)
    async def inspect_parameters(target: Target, ctx: Context) -> Annotated[CallToolResult, Report]:
        return await call_tool(runtime, "inspect_parameters", target, {}, ctx)
