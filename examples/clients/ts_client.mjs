// Drive gradprobe with the TypeScript MCP SDK (the SDK most desktop and IDE hosts embed).
//   npm install @modelcontextprotocol/sdk@1.32.2
//   node ts_client.mjs <project_dir> <file.py> [python]
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [projectDir, model, python = "python3"] = process.argv.slice(2);
const transport = new StdioClientTransport({ command: python, args: ["-m", "gradprobe", "serve"], stderr: "ignore" });
const client = new Client({ name: "gradprobe-ts-example", version: "1.0.0" });
await client.connect(transport);

const { tools } = await client.listTools();
const progress = [];
const result = await client.callTool(
  { name: "diagnose", arguments: { target: { project_dir: projectDir, model } } },
  undefined,
  { onprogress: (p) => progress.push(p.message), timeout: 300000 },
);
console.log(JSON.stringify({
  tools: tools.map((t) => t.name),
  hasOutputSchema: tools.every((t) => !!t.outputSchema),
  root: result.structuredContent.findings[0] ?? null,
  ok: result.structuredContent.ok,
  contentTypes: result.content.map((c) => c.mimeType ?? c.type),
  progress,
}));
await client.close();
