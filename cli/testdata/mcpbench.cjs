// mcpbench.cjs times one tool call, bash `true`, made by the official MCP TypeScript SDK's
// client (npm @modelcontextprotocol/sdk, pinned in internal/mcpserve/testdata/npmclient)
// over streamable HTTP to a running `toolhost serve` and over stdio to a `toolhost mcp` it
// starts, the two interleaved call by call, and prints the round trips in milliseconds as
// one JSON object. Run by cmd/toolhost's BenchmarkMCPTransports with
//   TOOLHOST_MCP_CLIENT_DIR  where scripts/setup-mcp-client.sh installed the SDK
//   MCP_URL                  the server's /mcp endpoint
//   MCP_BIN                  the toolhost binary (stdio: MCP_BIN mcp)
//   MCP_CALLS                calls per transport
"use strict";
const path = require("node:path");
const { createRequire } = require("node:module");

const sdk = createRequire(path.join(process.env.TOOLHOST_MCP_CLIENT_DIR, "package.json"));
const { Client } = sdk("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = sdk("@modelcontextprotocol/sdk/client/streamableHttp.js");
const { StdioClientTransport } = sdk("@modelcontextprotocol/sdk/client/stdio.js");

async function call(client) {
  const t0 = process.hrtime.bigint();
  const res = await client.callTool({ name: "bash", arguments: { command: "true" } });
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  if (res.isError) throw new Error("bash true: " + JSON.stringify(res.content));
  return ms;
}

async function main() {
  const http = new Client({ name: "toolhost-bench-http", version: "1.0.0" });
  const url = new URL(process.env.MCP_URL);
  url.searchParams.set("project", "bench-http"); // each its own project: one host holds a project's lease
  const httpT = new StreamableHTTPClientTransport(url);
  await http.connect(httpT);
  const stdio = new Client({ name: "toolhost-bench-stdio", version: "1.0.0" });
  const env = { ...process.env };
  delete env.TOOLHOST_MCP_CLIENT_DIR; // not the server's: toolhost refuses variables it does not know
  const stdioT = new StdioClientTransport({ command: process.env.MCP_BIN, args: ["mcp", "--project", "bench-stdio"], env, stderr: "ignore" });
  await stdio.connect(stdioT);
  for (let i = 0; i < 5; i++) { // the sandboxes start, the plugins warm up
    await call(http);
    await call(stdio);
  }
  const n = Number(process.env.MCP_CALLS || "50");
  const out = { http: [], stdio: [] };
  for (let i = 0; i < n; i++) {
    if (i % 2 === 0) {
      out.http.push(await call(http));
      out.stdio.push(await call(stdio));
    } else {
      out.stdio.push(await call(stdio));
      out.http.push(await call(http));
    }
  }
  await httpT.terminateSession();
  await http.close();
  await stdio.close();
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().catch((err) => {
  process.stderr.write(String(err && err.stack || err) + "\n");
  process.exit(1);
});
