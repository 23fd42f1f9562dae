"""One module per tool (gradprobe/server/tools/<name>.py): its options, its description for the model reading it, and the call.

Which tools exist is the torch-free table gradprobe.tools.TOOLS.
"""

import importlib

from gradprobe.tools import TOOLS


def register_all(server, runtime) -> None:
    for tool in TOOLS:
        importlib.import_module(f"gradprobe.server.tools.{tool.name}").register(server, runtime)
