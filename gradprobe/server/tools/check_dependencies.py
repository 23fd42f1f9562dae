"""`check_dependencies`: what each output may not see, measured by autograd on the user's model and batch (GP9xx)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult
from pydantic import Field

from gradprobe.server.models import Report
from gradprobe.server.tools._call import READ_ONLY, TARGET_HELP, call_tool
from gradprobe.target import Target

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from gradprobe.server.runtime import Runtime

Check = Literal["causality", "examples", "packed", "packed_outside", "packed_vs_padded"]

DESCRIPTION = f"""Measure, by autograd on the target's own model and batch, which inputs each sampled output depends
on (the Jacobian's structure from output positions to the input embeddings: exact zeros expected), and compare that
with what the code claims, read from what it does: a loss whose target at position t is input t+1 (labels shifted
by one, or an HF causal LM with labels == input_ids) claims causality; a batch of several rows claims independent
examples; position ids that restart, cu_seqlens, segment ids or a block-diagonal mask claim independent packed
examples. Findings: output t sees a later input (GP901, with the first block whose output has it, the attention call,
the line that built the mask or the config flag that switches it), an example sees another example of the batch
(GP902), examples packed in one row see each other in the path the training runs (GP903: all-ones attention_mask,
a KV cache built by default, FlashAttention kwargs ignored; info when only a call outside that path leaks), BatchNorm
in train mode couples the examples (GP904, info: by design). A packed batch is also run against the same examples
padded one per row at the same weights: loss and per-parameter gradients compared (relative error, cosine,
tolerance from the dtype). Dropout is off during the probe; no optimizer step, weights untouched. A bidirectional
encoder (masked LM), a prefix-LM's prefix, cross-attention to an encoder and a pooled classifier claim no causality
and stay clean. facts.verified says what was measured and how many positions/examples were sampled; facts.not_run
what was not, and why. Script mode probes the model at the script's first step with the batch the script fed it
(the Trainer's own settings, e.g. use_cache off).
{TARGET_HELP}
Example: {{"target": {{"project_dir": "/home/ana/proj", "model": "lm.py"}}, "positions": 9}}"""


def register(server: MCPServer, runtime: Runtime) -> None:
    @server.tool(name="check_dependencies", title="Check what outputs may not see", description=DESCRIPTION,
                 annotations=READ_ONLY)
    async def check_dependencies(
        target: Target,
        ctx: Context,
        positions: Annotated[int | None, Field(ge=1, le=32, description=(
            "Output positions to sample (first, middle, last, then random). Default: 5, in at most 3 backward passes "
            "(one per row each; those that do not fit are left out, so the check costs about one training step); a "
            "number given here is sampled in full, however many passes it takes."))] = None,
        checks: Annotated[list[Check] | None, Field(description=(
            "Only these checks (default: all that apply): causality, examples, packed (in the path the training "
            "runs), packed_outside (the same rows with use_cache=True), packed_vs_padded."))] = None,
    ) -> Annotated[CallToolResult, Report]:
        return await call_tool(runtime, "check_dependencies", target, {"positions": positions, "checks": checks}, ctx)
