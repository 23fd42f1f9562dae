#!/usr/bin/env bash
# The MCP Inspector CLI against gradprobe over stdio: list the tools, then diagnose a broken example.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
work="${GRADPROBE_INSPECTOR_DIR:-$HOME/.cache/gradprobe-inspector}"
mkdir -p "$work"
if [ ! -x "$work/node_modules/.bin/inspector" ]; then
  (cd "$work" && npm init -y >/dev/null && npm install @modelcontextprotocol/inspector@2.12.0 --no-audit --no-fund >/dev/null)
fi
I="$work/node_modules/.bin/inspector --cli"
$I python3 -m gradprobe serve --method tools/list
$I python3 -m gradprobe serve --method tools/call --tool-name diagnose \
  --tool-args-json "{\"target\": {\"project_dir\": \"$here/examples/broken\", \"model\": \"gp303_no_grad_block.py\"}}"
