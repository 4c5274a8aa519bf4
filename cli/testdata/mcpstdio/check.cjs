// check.cjs drives `toolhost mcp` with the official MCP TypeScript SDK's client (npm
// @modelcontextprotocol/sdk, pinned in internal/mcpserve/testdata/npmclient) over stdio:
// the SDK starts the server itself, as Claude Code or Cursor would. It writes a file,
// appends to one that was there, lists the directory, and prints what it got as one JSON
// object on stdout. Run by cmd/toolhost's TestMCPWorkspaceNPM with
//   TOOLHOST_MCP_CLIENT_DIR  where scripts/setup-mcp-client.sh installed the SDK
//   MCP_COMMAND              the server's command, MCP_ARGS its arguments (JSON array)
"use strict";
const path = require("node:path");
const { createRequire } = require("node:module");

const sdk = createRequire(path.join(process.env.TOOLHOST_MCP_CLIENT_DIR, "package.json"));
const { Client } = sdk("@modelcontextprotocol/sdk/client/index.js");
const { StdioClientTransport } = sdk("@modelcontextprotocol/sdk/client/stdio.js");

function text(res) {
  return res.content.filter((c) => c.type === "text").map((c) => c.text).join("");
}

async function main() {
  const transport = new StdioClientTransport({
    command: process.env.MCP_COMMAND,
    args: JSON.parse(process.env.MCP_ARGS),
    env: process.env,
    stderr: "inherit",
  });
  const client = new Client({ name: "toolhost-npm-stdio-check", version: "1.0.0" });
  await client.connect(transport);
  const out = {};
  const { tools } = await client.listTools();
  out.tools = tools.map((t) => t.name);
  const w = await client.callTool({ name: "write_file", arguments: { path: "from-mcp/new.txt", content: "written over MCP\n" } });
  out.write = { isError: !!w.isError, text: text(w) };
  const b = await client.callTool({ name: "bash", arguments: { command: "echo appended >> existing.txt && ls -ln" } });
  out.bash = { isError: !!b.isError, text: text(b) };
  await client.close(); // the server commits the workspace and exits
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().catch((err) => {
  process.stderr.write(`check.cjs: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
