"""The MCP face: a thin MCPServer whose tools validate arguments and call the sandbox."""
