"""One module per tool (gradprobe/server/tools/<name>.py): its options, its description for the model reading it, and the call.

Which tools exist is the torch-free table gradprobe.tools.TOOLS.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from gradprobe.tools import TOOLS

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from gradprobe.server.runtime import Runtime


def register_all(server: MCPServer, runtime: Runtime) -> None:
    for tool in TOOLS:
        importlib.import_module(f"gradprobe.server.tools.{tool.name}").register(server, runtime)
