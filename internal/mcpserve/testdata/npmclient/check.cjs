// check.cjs drives toolhost's MCP server with the official MCP TypeScript SDK's client
// (npm @modelcontextprotocol/sdk, pinned in package.json) over streamable HTTP: it lists
// the tools (with their titles and annotations), calls bash, serves a page from the sandbox and takes its screenshot, and
// prints what it got as one JSON object on stdout. Run by mcpserve's TestNPMClient with
//   TOOLHOST_MCP_CLIENT_DIR  where scripts/setup-mcp-client.sh installed the SDK
//   MCP_URL                  the server's /mcp endpoint
//   MCP_TOKEN                a bearer token
//   MCP_SCREENSHOT           "1" to take the screenshot (needs Chromium and python3)
"use strict";
const path = require("node:path");
const { createRequire } = require("node:module");

const sdk = createRequire(path.join(process.env.TOOLHOST_MCP_CLIENT_DIR, "package.json"));
const { Client } = sdk("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = sdk("@modelcontextprotocol/sdk/client/streamableHttp.js");

function text(res) {
  return res.content.filter((c) => c.type === "text").map((c) => c.text).join("");
}

async function main() {
  const transport = new StreamableHTTPClientTransport(new URL(process.env.MCP_URL), {
    requestInit: { headers: { Authorization: `Bearer ${process.env.MCP_TOKEN}` } },
  });
  const client = new Client({ name: "toolhost-npm-check", version: "1.0.0" });
  // Each request's bound is the test's (a hang bound): the SDK's own 60 s default is a
  // timing a loaded machine misses (a browser start alone took 87 s at load 30).
  const bound = Number(process.env.MCP_REQUEST_TIMEOUT_MS) || undefined;
  if (bound) {
    const request = client.request.bind(client);
    client.request = (req, schema, options) => request(req, schema, { timeout: bound, ...options });
  }
  await client.connect(transport);
  const out = { protocolVersion: transport.protocolVersion || null };

  const { tools } = await client.listTools();
  out.tools = tools.map((t) => t.name);
  out.bashSchemaType = (tools.find((t) => t.name === "bash") || {}).inputSchema?.type || null;
  out.bashTimeout = (tools.find((t) => t.name === "bash") || {}).inputSchema?.properties?.timeout || null;
  // Titles and annotations as the SDK parsed them (its ToolSchema validates their types).
  out.annotations = {};
  for (const t of tools) out.annotations[t.name] = { title: t.title ?? null, ...(t.annotations || {}) };

  out.outputSchemas = tools.filter((t) => t.outputSchema).map((t) => t.name);

  // callTool validates structuredContent against the tool's outputSchema (it throws when
  // a tool with one answers without it, or with content that does not match).
  const bash = await client.callTool({ name: "bash", arguments: { command: "echo hello from node; echo oops >&2; exit 3" } });
  out.bash = { isError: !!bash.isError, text: text(bash), structured: bash.structuredContent ?? null };
  await client.callTool({ name: "write_file", arguments: { path: "g/one.txt", content: "alpha\nneedle here\n" } });
  await client.callTool({ name: "write_file", arguments: { path: "g/two.md", content: "needle again\n" } });
  const grep = await client.callTool({ name: "grep", arguments: { pattern: "needle", path: "g" } });
  out.grep = { isError: !!grep.isError, text: text(grep), structured: grep.structuredContent ?? null };
  const files = await client.callTool({ name: "grep", arguments: { pattern: "needle", path: "g", output_mode: "files_with_matches" } });
  out.grepFiles = { isError: !!files.isError, text: text(files), structured: files.structuredContent ?? null };
  const glob = await client.callTool({ name: "glob", arguments: { pattern: "g/**/*.txt" } });
  out.glob = { isError: !!glob.isError, text: text(glob), structured: glob.structuredContent ?? null };
  const none = await client.callTool({ name: "glob", arguments: { pattern: "nothing/*.zz" } });
  out.globNone = { isError: !!none.isError, text: text(none), structured: none.structuredContent ?? null };

  const missing = await client.callTool({ name: "read_file", arguments: { path: "no/such/file" } });
  out.missing = { isError: !!missing.isError, text: text(missing) };

  if (process.env.MCP_SCREENSHOT === "1") {
    await client.callTool({ name: "write_file", arguments: { path: "site/index.html", content: "<h1>Hello, Node client</h1>" } });
    await client.callTool({ name: "bash", arguments: { command: "cd site && exec python3 -m http.server 8000", background: true } });
    await client.callTool({
      name: "bash",
      arguments: { command: "for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/8000) 2>/dev/null && exit 0; sleep 0.1; done; exit 1" },
    });
    const shot = await client.callTool({ name: "take_screenshot", arguments: { port: 8000 } });
    out.screenshot = {
      isError: !!shot.isError,
      text: text(shot),
      images: shot.content
        .filter((c) => c.type === "image")
        .map((c) => ({ mimeType: c.mimeType, bytes: Buffer.from(c.data, "base64").length, riff: Buffer.from(c.data, "base64").subarray(0, 4).toString() })),
    };
  }
  await transport.terminateSession(); // DELETE: the server commits and closes the session now
  await client.close();
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().catch((err) => {
  process.stderr.write(`check.cjs: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
