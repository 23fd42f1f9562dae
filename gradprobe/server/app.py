"""Build the gradprobe MCPServer: tools, the findings catalogue as resources, and a prompt."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError, UnexpectedToolError
from pydantic import ValidationError

from gradprobe import __version__
from gradprobe.findings import catalogue
from gradprobe.server.options import ServeOptions
from gradprobe.server.runtime import Runtime
from gradprobe.server.tools import register_all
from gradprobe.target import explain_validation_error

if TYPE_CHECKING:
    from mcp.server.auth.provider import TokenVerifier
    from mcp.server.auth.settings import AuthSettings
    from mcp.server.mcpserver import Context
    from mcp.types import CallToolResult, InputRequiredResult
    from starlette.requests import Request
    from starlette.responses import Response

INSTRUCTIONS = (
    "gradprobe measures why gradients do not flow in the user's PyTorch code, instead of guessing. "
    "Start with `diagnose` (all checks in one run); use the specific tools to dig deeper. Every tool "
    "takes a `target` naming the user's project directory and the callables that build the model "
    "and a batch. Quote the finding's file:line and fix to the user."
)


class GradprobeServer(MCPServer):
    """MCPServer whose argument errors say, in a sentence or two, which field is wrong and what to write."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(exc, UnexpectedToolError) or not isinstance(cause, ValidationError):
                raise
            raise ToolError(f"Error executing tool {name}: {explain_validation_error(cause)}") from cause


def build_server(runtime: Runtime | None = None, token_verifier: TokenVerifier | None = None,
                 auth: AuthSettings | None = None) -> MCPServer:
    runtime = runtime or Runtime()

    @contextlib.asynccontextmanager
    async def lifespan(_server: MCPServer) -> AsyncIterator[dict[str, Runtime]]:
        # warm the worker in the background: tools/list answers at once, the first call is fast
        task = asyncio.ensure_future(runtime.executor.start())
        try:
            yield {"runtime": runtime}
        finally:
            task.cancel()
            runtime.close()

    server = GradprobeServer(
        "gradprobe",
        lifespan=lifespan,
        title="gradprobe",
        description="Measure why gradients do not flow in PyTorch code",
        instructions=INSTRUCTIONS,
        version=__version__,
        token_verifier=token_verifier,
        auth=auth,
    )
    register_all(server, runtime)

    @server.custom_route("/health", methods=["GET"])
    async def health(_request: Request) -> Response:
        from starlette.responses import JSONResponse

        return JSONResponse({"status": "ok", "version": __version__, "running": runtime.running,
                             "queued": runtime.queued, "warm_worker": runtime.executor.warm_alive})

    @server.resource("gradprobe://findings", mime_type="application/json", title="Findings catalogue")
    def findings_catalogue() -> str:
        """Every finding code gradprobe emits: name, severity, meaning, why it breaks gradients, example, fix."""
        return json.dumps(list(catalogue().values()), indent=1)

    @server.resource("gradprobe://findings/{code}", mime_type="text/markdown", title="One finding code")
    def finding_doc(code: str) -> str:
        """What one code means, why it breaks gradients, an example and the fix."""
        rule = catalogue().get(code.upper())
        if rule is None:
            raise ResourceNotFoundError(f"unknown code {code}: gradprobe://findings lists every code")
        return (f"# {rule['code']} {rule['name']} ({rule['severity']})\n\n{rule['summary']}\n\n"
                f"## Why it breaks gradients\n{rule['why']}\n\n## Example\n```python\n{rule['example']}\n```\n\n"
                f"## Fix\n```python\n{rule['fix']}\n```\n")

    @server.prompt(title="Investigate gradients that do not flow")
    def investigate_gradients(project_dir: str, model: str = "train.py") -> str:
        """How to investigate "my parameter gets no gradient" with gradprobe's tools."""
        return (
            f"The user's PyTorch code in {project_dir} does not learn as expected. Do not guess.\n"
            "1. On a real project, prefer the script form: call `diagnose` with "
            f"target={{\"project_dir\": \"{project_dir}\", \"script\": \"train.py\", \"args\": [...]}} "
            "(the project's own training script and the arguments that make it train a few steps quickly, "
            "e.g. --max_iters=1, fast_dev_run, max_steps=1; `module` for `python -m` entry points): gradprobe runs it "
            "to its first optimizer step and checks that real step, with no adapter code to write. "
            "For a single file with build_model/make_inputs, "
            f"target={{\"project_dir\": \"{project_dir}\", \"model\": \"{model}\"}} "
            "(add inputs/loss/optimizer/train_step references if needed). GP112 means the script reached no step: "
            "read how far it got and adjust args or timeout_s.\n"
            "2. Read the first error finding: it names the parameters, the user's file:line and the fix.\n"
            "3. If a custom autograd.Function is involved, call `run_gradcheck`; for soft prompts, `verify_prompt_tuning`.\n"
            "4. Show the user the line and the fix; after they change the code, call `diagnose` again to confirm ok=true."
        )

    return server


def make_nondumpable() -> None:
    """Children (same uid, no capabilities) then cannot read this process's environment or memory via /proc."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except Exception:
        pass


def serve_stdio(options: ServeOptions) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    make_nondumpable()
    build_server(Runtime(options)).run("stdio")
