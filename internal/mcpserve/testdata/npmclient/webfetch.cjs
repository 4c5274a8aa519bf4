// webfetch.cjs calls toolhost's web_fetch through MCP with the official MCP TypeScript
// SDK's client (npm @modelcontextprotocol/sdk, pinned in package.json) over streamable
// HTTP: a page on an allowed domain, and one on a refused domain. It prints what it got
// as one JSON object on stdout. Run by mcpserve's TestNPMClientWebFetch with
//   TOOLHOST_MCP_CLIENT_DIR  where scripts/setup-mcp-client.sh installed the SDK
//   MCP_URL                  the server's /mcp endpoint
//   MCP_TOKEN                a bearer token
//   WEB_URL                  a page web_fetch may fetch
//   WEB_REFUSED_URL          a page web_fetch must be refused
"use strict";
const path = require("node:path");
const { createRequire } = require("node:module");

const sdk = createRequire(path.join(process.env.TOOLHOST_MCP_CLIENT_DIR, "package.json"));
const { Client } = sdk("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = sdk("@modelcontextprotocol/sdk/client/streamableHttp.js");

function text(res) {
  return res.content.filter((c) => c.type === "text").map((c) => c.text).join("\n");
}

async function main() {
  const transport = new StreamableHTTPClientTransport(new URL(process.env.MCP_URL), {
    requestInit: { headers: { Authorization: `Bearer ${process.env.MCP_TOKEN}` } },
  });
  const client = new Client({ name: "toolhost-webfetch-check", version: "1.0.0" });
  // Each request's bound is the test's (a hang bound): the SDK's own 60 s default is a
  // timing a loaded machine misses (a browser start alone took 87 s at load 30).
  const bound = Number(process.env.MCP_REQUEST_TIMEOUT_MS) || undefined;
  if (bound) {
    const request = client.request.bind(client);
    client.request = (req, schema, options) => request(req, schema, { timeout: bound, ...options });
  }
  await client.connect(transport);
  const { tools } = await client.listTools();
  const wf = tools.find((t) => t.name === "web_fetch") || null;
  const out = { tool: wf && { title: wf.title ?? null, annotations: wf.annotations ?? null } };
  const call = async (args) => {
    const res = await client.callTool({ name: "web_fetch", arguments: args }, undefined, { timeout: 120000 });
    return { isError: !!res.isError, text: text(res) };
  };
  out.web = await call({ url: process.env.WEB_URL });
  out.webRefused = await call({ url: process.env.WEB_REFUSED_URL });
  await transport.terminateSession();
  await client.close();
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().catch((err) => {
  process.stderr.write(`webfetch.cjs: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
