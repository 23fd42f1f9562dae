"""`audit_training`: several real steps of the user's own train_step (or the default step), observed (GP6xx)."""

from __future__ import annotations

import base64
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, ImageContent
from pydantic import Field

from gradprobe.server.models import Report
from gradprobe.server.tools._call import READ_ONLY, TARGET_HELP, call_tool
from gradprobe.stepchart import MAX_STEPS, clean_groups, steps_svg
from gradprobe.target import Target

DESCRIPTION = f"""Run the user's own training step `steps` times (default 4) on the target's batch and watch it:
per parameter group and step the learning rate as applied, the gradient norm after backward() and at
optimizer.step() (a clipping or hook in between is seen, a gradient zeroed there is named with its
line), the update/weight ratio; backward calls per step and how each loss was scaled; zero_grad,
scheduler.step and optimizer.step in order with their lines; autograd.grad calls; parameters changed
outside the optimizer (EMA copies: how much of their gap to the student they kept); optimizers rebuilt;
modules attached during the steps. Headline: per parameter, over the steps, in the optimizer, a finite
non-zero gradient at step time, moved. Findings: accumulation not averaged or zeroed inside the loop
(GP601), gradients never cleared (GP602), lr 0 at every step (GP603), scheduler before optimizer
(GP604), a gradient zeroed before the step (GP605), a parameter that never moves (GP606), optimizer
state lost (GP607), a gradient penalty without create_graph (GP608), a broken EMA copy (GP609),
clipping before scaler.unscale_ (GP615), a GradScaler that skips every step (GP617), a group
whose update is half its weights or more at every step (GP618), every dropout module in eval
mode while training (GP610), accumulation divided twice: the accumulated gradient 1/k of the
full-batch one (GP611; facts.full_batch: that ratio per group, measured after the step when
accumulation is seen and the target has a loss; in script mode, read from the micro-batch losses'
graphs: together they weigh 1/k of one mean), an LR schedule in epochs stepped per batch or the
reverse (GP612; script mode, from the DataLoader's length).
When nothing is wrong, facts.verified lists what was measured. `overfit_steps` (opt-in, e.g. 20) then
runs that many more steps on the same batch and checks that the loss goes down, per loss term
(facts.overfit_one_batch; GP616 when it does not, with the parameters that did not move). The result
carries an SVG chart per parameter group of the lr, grad norm and update ratio over the steps.

Use it when one step looks fine but training does not: the target needs `train_step` (or
`optimizer`, then the default loss and step run, and a scheduler make_optimizer returns is stepped).
Script mode (`script`/`module`): the script's own loop runs under whatever it uses (DDP, HF Trainer,
accelerate, Lightning), its own optimizer steps are watched as they run (nothing is replayed), and it
is stopped before its optimizer's step `steps`+1.
{TARGET_HELP}
Example: {{"target": {{"project_dir": "/home/ana/proj", "model": "train.py"}}, "steps": 4}}
Script mode: {{"target": {{"project_dir": "/home/ana/proj", "script": "train.py", "args": ["--epochs=1"]}}}}"""


def steps_picture(report: dict, steps: int = MAX_STEPS) -> list:
    """The per-group chart of the steps (lr, grad norm, update ratio), when the steps measured a group. The child's
    rows are first cut to what the call ran (`steps`, finite numbers, capped counts: stepchart.clean_groups), in
    the report too: the answer stays the size of what was measured."""
    facts = report.get("facts") or {}
    if "param_groups" not in facts:
        return []
    groups = facts["param_groups"] = clean_groups(facts["param_groups"], steps)
    if not groups:
        return []
    svg = steps_svg(groups).encode()
    return [ImageContent(type="image", data=base64.b64encode(svg).decode(), mime_type="image/svg+xml")]


def register(server: Any, runtime: Any) -> None:
    @server.tool(name="audit_training", title="Audit several training steps", description=DESCRIPTION, annotations=READ_ONLY)
    async def audit_training(
        target: Target,
        ctx: Context,
        steps: Annotated[int, Field(ge=1, le=32, description=(
            "How many steps to run (one call of train_step each; in script mode, optimizer steps of the script)."))] = 4,
        overfit_steps: Annotated[int, Field(ge=0, le=200, description=(
            "Opt-in, build_model()/train_step form: after the audit, run this many more steps on the same batch and "
            "check that the loss goes down (20 is a good value; 0: off)."))] = 0,
    ) -> Annotated[CallToolResult, Report]:
        if (target.script or target.module) and overfit_steps:
            raise ToolError("overfit_steps needs the build_model()/train_step form (a script's own loop decides its "
                            "batches): give `model` and `train_step`, or leave overfit_steps at 0.")
        return await call_tool(runtime, "audit_training", target, {"steps": steps, "overfit_steps": overfit_steps}, ctx,
                               post=lambda report: steps_picture(report, steps))
