"""`audit_training`: several real steps of the user's own train_step (or the default step), observed (GP6xx)."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult
from pydantic import Field

from gradprobe.server.models import Report
from gradprobe.server.tools._call import READ_ONLY, TARGET_HELP, call_tool
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
state lost (GP607), a gradient penalty without create_graph (GP608), a broken EMA copy (GP609), every
dropout module in eval mode while training (GP610).
When nothing is wrong, facts.verified lists what was measured.

Use it when one step looks fine but training does not: the target needs `train_step` (or
`optimizer`, then the default loss and step run, and a scheduler make_optimizer returns is stepped).
Script mode (`script`/`module`): the script's own loop runs under whatever it uses (DDP, HF Trainer,
accelerate, Lightning), its own optimizer steps are watched as they run (nothing is replayed), and it
is stopped before its optimizer's step `steps`+1.
{TARGET_HELP}
Example: {{"target": {{"project_dir": "/home/ana/proj", "model": "train.py"}}, "steps": 4}}
Script mode: {{"target": {{"project_dir": "/home/ana/proj", "script": "train.py", "args": ["--epochs=1"]}}}}"""


def register(server: Any, runtime: Any) -> None:
    @server.tool(name="audit_training", title="Audit several training steps", description=DESCRIPTION, annotations=READ_ONLY)
    async def audit_training(
        target: Target,
        ctx: Context,
        steps: Annotated[int, Field(ge=1, le=32, description=(
            "How many steps to run (one call of train_step each; in script mode, optimizer steps of the script)."))] = 4,
    ) -> Annotated[CallToolResult, Report]:
        return await call_tool(runtime, "audit_training", target, {"steps": steps}, ctx)
