"""`run_gradcheck`: every custom autograd.Function the model uses, checked on the inputs it really gets (GP4xx)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult
from pydantic import BaseModel, Field

from gradprobe.server.models import Report
from gradprobe.server.tools._call import READ_ONLY, TARGET_HELP, call_tool
from gradprobe.target import Target


class Reference(BaseModel):
    """A custom or fused module and the reference implementation it replaces."""

    module: str = Field(description='The custom module: "file.py:Class" (every instance in the model) or a submodule path.')
    replaces: str = Field(description='The reference: "file.py:Class" (or a factory taking the custom module) or a '
                          'submodule path inside the model.')
    init: dict[str, Any] | None = Field(default=None, description="Keyword arguments to build the reference class.")
    map: str | None = Field(default=None, description='"file.py:fn" mapping the custom state_dict to the reference\'s.')


if TYPE_CHECKING:
    from mcp.server import MCPServer

    from gradprobe.server.runtime import Runtime

DESCRIPTION = f"""Find every user-defined torch.autograd.Function the model calls during one forward,
capture the real inputs each received, and check its backward on float64 copies: analytical vs
numerical Jacobian (GP401, with the input, output, worst element and both values), wrong number
of gradients (GP402), wrong gradient shape (GP403), None/zero gradient for an input that needs one
(GP404, naming the parameters fed to that input), Function.forward called directly (GP406),
second derivatives (GP407, with check_second_order), nondeterministic backward (GP408).
Each Function is checked at the recorded inputs and again with its weight-like inputs (parameters)
perturbed, since a backward can be exact while a norm weight is all ones; step and tolerances come
from the dtype its forward computes in (a float32 cast inside is not a wrong derivative).

Use it when the user wrote their own backward. `function` ("file.py:MyFn") checks one Function,
module or plain function explicitly on the target's inputs. `reference` compares a custom or fused
module with the reference implementation it replaces, on the same weights and recorded inputs:
{{"module": "model.py:FusedMLP", "replaces": "model.py:MLP"}} (classes, or submodule paths such as
"blocks.0.mlp"; optional "init" kwargs to build the reference, "map" a state_dict mapping function).
{TARGET_HELP}
Example: {{"target": {{"project_dir": "/home/ana/proj", "model": "model.py"}}}}"""


def register(server: MCPServer, runtime: Runtime) -> None:
    @server.tool(name="run_gradcheck", title="Check custom autograd Functions", description=DESCRIPTION, annotations=READ_ONLY)
    async def run_gradcheck(
        target: Target,
        ctx: Context,
        function: Annotated[str | None, Field(description=(
            'Check only this: "file.py:MyFn" (autograd.Function, module class/factory or function).'))] = None,
        check_second_order: Annotated[bool, Field(description="Also compare second derivatives (gradgradcheck).")] = False,
        fast_mode: Annotated[bool | None, Field(description=(
            "Force fast mode on (true) or off (false); default: chosen by input size."))] = None,
        atol: Annotated[float | None, Field(gt=0, description="Absolute tolerance (default 1e-5).")] = None,
        rtol: Annotated[float | None, Field(gt=0, description="Relative tolerance (default 1e-3).")] = None,
        reference: Annotated[Reference | None, Field(description=(
            "Compare a custom/fused module with the reference it replaces, on the same weights and inputs."))] = None,
    ) -> Annotated[CallToolResult, Report]:
        options: dict[str, Any] = {"function": function, "check_second_order": check_second_order, "fast_mode": fast_mode,
                                   "atol": atol, "rtol": rtol}
        if reference is not None:
            options["reference"] = reference.model_dump(exclude_none=True)
        return await call_tool(runtime, "run_gradcheck", target, options, ctx)
