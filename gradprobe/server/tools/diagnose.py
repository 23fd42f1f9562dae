"""`diagnose`: every check that applies, in one child and one load; the root cause first."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Annotated

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult, ImageContent
from pydantic import Field

from gradprobe.flowchart import flow_mermaid, flow_svg
from gradprobe.server.models import Report
from gradprobe.server.tools._call import READ_ONLY, TARGET_HELP, call_tool
from gradprobe.server.tools.audit_training import steps_picture
from gradprobe.target import Target

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from gradprobe.server.runtime import Runtime

DESCRIPTION = f"""Start here when "gradients don't flow" or "the model does not learn". Loads the user's
code once in a sandbox and runs every check that applies: registration (GP1xx), optimizer
coverage and one real step (GP2xx, when an optimizer is given), the traced step (GP3xx), gradcheck
of the custom autograd Functions it sees (GP4xx), and prompt-tuning checks when a soft prompt or
PEFT model is found (GP5xx). One root cause yields one finding (consequences are folded into its
evidence.related); the summary's first line names the root cause and the fix. The result also
carries a Mermaid flowchart of the gradient flow (facts.mermaid) and an SVG picture of it.
With `steps` > 0 it also runs that many real training steps, observed (audit_training's GP6xx checks:
facts.steps, with a per-group SVG chart of the lr, grad norm and update ratio over the steps); an EMA
copy left with requires_grad=True outside the optimizer that its EMA update moved at every step is then
recognised as such (no GP201). On a script target the script's own loop is watched for those steps, and
the checks run on the step after them (one run of the script).
{TARGET_HELP}
Example: {{"target": {{"project_dir": "/home/ana/proj", "model": "train.py"}}}}"""


def _picture(report: dict, steps: int = 0) -> list:
    facts = report.get("facts") or {}
    chart = steps_picture({"facts": facts["steps"]}, steps or 1) if isinstance(facts.get("steps"), dict) else []
    graph = facts.get("flow")
    if not graph:
        facts.pop("mermaid", None)
        return chart
    facts["mermaid"] = flow_mermaid(graph)  # made here from the checked graph, never the child's own text
    svg = flow_svg(graph).encode()
    return [ImageContent(type="image", data=base64.b64encode(svg).decode(), mime_type="image/svg+xml"), *chart]


def register(server: MCPServer, runtime: Runtime) -> None:
    @server.tool(name="diagnose", title="Diagnose gradient flow", description=DESCRIPTION, annotations=READ_ONLY)
    async def diagnose(
        target: Target,
        ctx: Context,
        steps: Annotated[int, Field(ge=0, le=32, description=(
            "0 (default): one observed step. N > 0: also run N real training steps, observed (audit_training's "
            "checks), and merge their findings."))] = 0,
    ) -> Annotated[CallToolResult, Report]:
        return await call_tool(runtime, "diagnose", target, {"steps": steps} if steps else {}, ctx,
                               post=lambda report: _picture(report, steps))
