"""gradprobe: measure why gradients do not flow in PyTorch code.

The top-level package imports neither torch nor user code, so that the MCP server
starts fast; the checks live in `gradprobe.checks` and run in a sandboxed child.
"""

__version__ = "0.1.0"
