"""`check_equivalence`: the gradient of two setups that must agree, measured against each other (GP8xx)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult
from pydantic import BaseModel, ConfigDict, Field

from gradprobe.server.models import Report
from gradprobe.server.tools._call import READ_ONLY, TARGET_HELP, call_tool
from gradprobe.target import Target

Comparison = Literal["ranks", "accumulation", "custom_ops", "storage", "packing"]

DESCRIPTION = f"""Compare the gradient of two setups that must give the same gradient, on the same weights, the same
seed and the same examples, over `steps` optimizer steps (default 2: some bugs appear only at step 2), per parameter
tensor (relative error, cosine, norm ratio, with the exact ratios a mistake gives named: 1/N, N, 1/k, k, 1/2, 2, 0),
and report the first step and the first module (forward order; and the one nearest the loss) whose gradient departs,
at the user's line where the cause is measured (the division, the reduction, the all-reduce, the gather, the targets).
Comparisons (`compare`, default: every one that applies):
- ranks: a script at `world_size` N (torchrun-style, gloo) against the same script as one process fed the N ranks'
  batches joined (rank order), each step from the same weights (GP801: a loss summed over the local batch, a SUM
  all-reduce not divided, a per-rank token count, features gathered without gradient, per-rank targets wrong from
  step 2);
- accumulation: k micro-batches per optimizer step against one batch of the same examples (GP802): scripts under a
  plain loop, the Hugging Face Trainer, accelerate or Lightning, set to accumulation 1 through the framework's own
  setting (a plain loop: name the reference's arguments in `reference.args`); a build_model() train_step with several
  backward() calls against the target's loss on the whole batch;
- custom_ops: every custom autograd.Function the step calls, at its recorded inputs and with its weight-like inputs
  perturbed (a backward can be exact only while a norm weight is 1), tolerances from the dtype it computes in (as
  run_gradcheck, with its codes);
  with `reference.module` and `reference.replaces`, a fused module against the one it replaces (GP804);
- storage: distinct Parameters over one storage (a tie made with `.data`), measured at one step (GP805);
- packing: packed rows (position ids restarting, cu_seqlens) against the same examples padded, one per row (GP803);
GP806 (info) is a per-tensor scale a scheme gives on purpose that the optimizer (Adam and its kin) does not see (a
shared logit scale under contrastive accumulation). Both setups run with dropout off and BatchNorm on its running
statistics (per-process batch statistics differ by design). When nothing departs, facts.verified says what was
compared and the largest difference; a comparison that could not run is in facts.not_run with why.
Cost: the script runs twice (the reference once per comparison), for `steps` steps each.
{TARGET_HELP}
Example: {{"target": {{"project_dir": "/home/ana/proj", "script": "train.py", "args": ["--epochs=1"], "world_size": 2}}}}
A plain loop's accumulation: {{"target": {{...}}, "compare": ["accumulation"], "reference": {{"args": ["--grad-accum", "1"]}}}}"""


class Reference(BaseModel):
    """How the reference setup differs from the setup under test, where gradprobe does not set it itself."""

    model_config = ConfigDict(extra="forbid")
    args: list[str] = Field(default_factory=list, description=(
        "Arguments appended to the script's own for the reference run (argparse takes the last value of an option), "
        "e.g. [\"--grad-accum\", \"1\"] for a plain loop's accumulation."))
    module: str | None = Field(default=None, description=(
        'custom_ops: a custom or fused module, "file.py:Class" (every instance in the model) or a submodule path, '
        "compared with the module it replaces on the same weights and recorded inputs."))
    replaces: str | None = Field(default=None, description=(
        'custom_ops: the reference implementation, "file.py:Class" (or a factory taking the custom module) or a submodule '
        "path inside the model."))
    init: dict[str, Any] | None = Field(default=None, description="custom_ops: keyword arguments to build the reference class.")
    map: str | None = Field(default=None, description=(
        'custom_ops: "file.py:fn" mapping the custom state_dict to the reference\'s.'))


def register(server: Any, runtime: Any) -> None:
    @server.tool(name="check_equivalence", title="Compare two setups' gradients",
                 description=DESCRIPTION, annotations=READ_ONLY)
    async def check_equivalence(
        target: Target,
        ctx: Context,
        compare: Annotated[list[Comparison] | None, Field(description=(
            "Which comparisons to run (default: every one that applies to the target)."))] = None,
        steps: Annotated[int, Field(ge=2, le=8, description="Optimizer steps compared in each setup.")] = 2,
        reference: Annotated[Reference | None, Field(description=(
            "The reference setup, where gradprobe does not set it: `args` for a plain loop's accumulation, "
            "`module`/`replaces` for a fused module and the one it replaces."))] = None,
    ) -> Annotated[CallToolResult, Report]:
        options = {"compare": list(compare or []), "steps": steps,
                   "reference": reference.model_dump(exclude_none=True) if reference is not None else {}}
        return await call_tool(runtime, "check_equivalence", target, options, ctx)
