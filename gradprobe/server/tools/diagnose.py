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
evidence.related). The summary's first line is the verdict (`verdict` in the result): "problems found:" with the
root cause and its fix, "verified:" with what was measured, or "partly checked:" / "not checked:" naming each
check that did not run and why (never OK over a check that did not run). The result also
carries a Mermaid flowchart of the gradient flow (facts.mermaid) and an SVG picture of it.
With `steps` > 0 it also runs that many real training steps, observed (audit_training's GP6xx checks:
facts.steps, with a per-group SVG chart of the lr, grad norm and update ratio over the steps); an EMA
copy left with requires_grad=True outside the optimizer that its EMA update moved at every step is then
recognised as such (no GP201). On a script target the script's own loop is watched for those steps, and
the checks run on the step after them (one run of the script). With `compare: true` it also runs
check_equivalence's paired comparisons that apply (N processes against one, k micro-batches against one batch:
GP8xx; a second run of the script); otherwise facts.not_run says they did not run. Custom Functions, shared storage
and packed vs padded are among its own checks either way.
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
        compare: Annotated[bool, Field(description=(
            "Also run check_equivalence's comparisons that apply (N processes against one at world_size > 1; k "
            "micro-batches against one batch): they run the script a second time. Off by default; the report then "
            "says they did not run."))] = False,
    ) -> Annotated[CallToolResult, Report]:
        options: dict[str, object] = {"steps": steps} if steps else {}
        options["compare"] = compare
        return await call_tool(runtime, "diagnose", target, options, ctx, post=lambda report: _picture(report, steps))
