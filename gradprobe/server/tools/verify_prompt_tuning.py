"""`verify_prompt_tuning`: prove the soft prompt learns and nothing else does (GP5xx)."""

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

DESCRIPTION = f"""For soft-prompt / prefix / p-tuning (hand-written or PEFT) on Hugging Face causal LMs:
find the prompt, observe one real step with the base model's forward and generate() watched, and
prove the prompt gets a gradient and is optimized while the base stays frozen. Reports the prompt
(name, shape, dtype, leaf), its grad norm, trainable accounting (tie-aware), what reached the base
model (input_ids / inputs_embeds / attention_mask / labels / past_key_values / use_cache), and the
mask/labels alignment. Findings: prompt gets no grad (GP501), prompt cast into input_ids (GP502),
base not frozen (GP503), prompt not in optimizer (GP504), loss from generate() (GP505), attention
mask zero on prompt positions (GP506), labels misaligned (GP507), tied embedding trained (GP508),
cache in training (GP509), prompt not a leaf (GP510), reentrant checkpointing without input grads (GP511).
`prompt` names the prompt parameter or attribute when detection should not guess.
{TARGET_HELP}
Example: {{"target": {{"project_dir": "/home/ana/pt", "model": "train.py"}}, "prompt": "soft_prompt"}}"""


def register(server: MCPServer, runtime: Runtime) -> None:
    @server.tool(name="verify_prompt_tuning", title="Verify prompt tuning", description=DESCRIPTION, annotations=READ_ONLY)
    async def verify_prompt_tuning(
        target: Target,
        ctx: Context,
        prompt: Annotated[str | None, Field(description=(
            "Parameter name or attribute path of the soft prompt (default: detected)."))] = None,
    ) -> Annotated[CallToolResult, Report]:
        return await call_tool(runtime, "verify_prompt_tuning", target, {"prompt": prompt}, ctx)
