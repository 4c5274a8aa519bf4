// agenttools.cjs drives the agent tools of toolhost's MCP server with the official MCP
// TypeScript SDK's client (npm @modelcontextprotocol/sdk, pinned in package.json) over
// streamable HTTP: the shell that remembers, background output and kill, an interactive
// Python on a terminal, apply_patch, guarded writes, and read_file of a PNG, a PDF and a
// notebook. It prints what it got as one JSON object on stdout. Run by mcpserve's
// TestNPMClientAgentTools with
//   TOOLHOST_MCP_CLIENT_DIR  where scripts/setup-mcp-client.sh installed the SDK
//   MCP_URL                  the server's /mcp endpoint
//   MCP_TOKEN                a bearer token
//   PDF_B64                  a two-page PDF, base64 (empty: no PDF step)
//   WEB_URL                  a page web_fetch may fetch (empty: no web_fetch step)
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

function images(res) {
  return res.content
    .filter((c) => c.type === "image")
    .map((c) => {
      const b = Buffer.from(c.data, "base64");
      // PNG: the width and height are big-endian at bytes 16 and 20.
      const png = c.mimeType === "image/png" && b.length > 24;
      return { mimeType: c.mimeType, bytes: b.length, width: png ? b.readUInt32BE(16) : 0, height: png ? b.readUInt32BE(20) : 0 };
    });
}

async function main() {
  const transport = new StreamableHTTPClientTransport(new URL(process.env.MCP_URL), {
    requestInit: { headers: { Authorization: `Bearer ${process.env.MCP_TOKEN}` } },
  });
  const client = new Client({ name: "toolhost-agent-tools-check", version: "1.0.0" });
  // Each request's bound is the test's (a hang bound): the SDK's own 60 s default is a
  // timing a loaded machine misses (a browser start alone took 87 s at load 30).
  const bound = Number(process.env.MCP_REQUEST_TIMEOUT_MS) || undefined;
  if (bound) {
    const request = client.request.bind(client);
    client.request = (req, schema, options) => request(req, schema, { timeout: bound, ...options });
  }
  await client.connect(transport);
  const call = async (name, args) => {
    const res = await client.callTool({ name, arguments: args }, undefined, { timeout: 120000 });
    return { isError: !!res.isError, text: text(res), images: images(res) };
  };
  const out = {};
  const { tools } = await client.listTools();
  out.tools = tools.map((t) => t.name);

  // The shell that remembers.
  out.cd = await call("bash", { command: "mkdir -p src && cd src" });
  out.pwd = await call("bash", { command: "pwd" });

  // A background command: its output, then stopped.
  const bg = await call("bash", { command: "echo started-in-bg; sleep 1000", background: true });
  const id = (bg.text.match(/id (bg-[0-9a-f]+)/) || [])[1];
  let output = { text: "" };
  for (let i = 0; i < 100 && !output.text.includes("started-in-bg"); i++) {
    output = await call("bash_output", { id });
    if (!output.text.includes("started-in-bg")) await new Promise((r) => setTimeout(r, 100));
  }
  out.bgOutput = output;
  out.bgKill = await call("bash_kill", { id });

  // Python on a terminal: define, call, interrupt.
  const py = await call("exec_command", { cmd: "python3 -q", yield_time_ms: 20000 });
  const sid = (py.text.match(/session (term-[0-9a-f]+)/) || [])[1];
  const type = async (chars, want) => {
    let all = "";
    for (let i = 0; i < 30 && !all.includes(want); i++) {
      const r = await call("write_stdin", { session_id: sid, chars: i === 0 ? chars : "", yield_time_ms: 3000 });
      all += r.text;
    }
    return all;
  };
  out.replDefine = await type("def double(x):\n    return 2 * x\n\n", ">>>");
  out.replCall = await type("double(21)\n", "42");
  await call("write_stdin", { session_id: sid, chars: "while True: pass\n", yield_time_ms: 500 });
  out.replInterrupt = await type("\u0003", "KeyboardInterrupt");
  out.replExit = await type("exit()\n", "exited with code");

  // apply_patch across files, then guarded writes.
  await call("write_file", { path: "/home/user/p/a.txt", content: "one\ntwo\n" });
  out.patch = await call("apply_patch", {
    input: "*** Begin Patch\n*** Update File: p/a.txt\n@@\n one\n-two\n+2\n*** Add File: p/b.txt\n+bee\n*** End Patch\n",
  });
  out.patchResult = await call("bash", { command: "cat /home/user/p/a.txt /home/user/p/b.txt" });
  await call("bash", { command: "echo unread > /home/user/p/c.txt" });
  out.guardRefused = await call("edit_file", { path: "p/c.txt", old_string: "unread", new_string: "read" });
  await call("read_file", { path: "p/c.txt" });
  out.guardAllowed = await call("edit_file", { path: "p/c.txt", old_string: "unread", new_string: "read" });

  // read_file sees: a PNG the sandbox draws, a notebook, a PDF.
  const draw = [
    "import struct, zlib",
    "w, h = 120, 80",
    "rows = b''.join(b'\\x00' + b''.join(bytes((x, y, 9)) for x in range(w)) for y in range(h))",
    "def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)",
    "ihdr = struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0)",
    "open('/home/user/pic.png', 'wb').write(b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', ihdr) + chunk(b'IDAT', zlib.compress(rows)) + chunk(b'IEND', b''))",
  ].join("\n");
  await call("write_file", { path: "/home/user/draw.py", content: draw + "\n" });
  out.draw = await call("bash", { command: "python3 /home/user/draw.py" });
  out.png = await call("read_file", { path: "/home/user/pic.png" });
  await call("write_file", {
    path: "/home/user/n.ipynb",
    content: JSON.stringify({ cells: [{ cell_type: "code", execution_count: 1, source: ["print('nb out')"], outputs: [{ output_type: "stream", name: "stdout", text: ["nb out\n"] }] }], metadata: {} }),
  });
  out.notebook = await call("read_file", { path: "/home/user/n.ipynb" });
  if (process.env.PDF_B64) {
    await call("write_file", { path: "/home/user/doc.pdf", content: Buffer.from(process.env.PDF_B64, "base64").toString("latin1") });
    out.pdf = await call("read_file", { path: "/home/user/doc.pdf" });
  }
  if (process.env.WEB_URL) {
    out.web = await call("web_fetch", { url: process.env.WEB_URL });
    out.webRefused = await call("web_fetch", { url: process.env.WEB_REFUSED_URL });
  }
  await transport.terminateSession();
  await client.close();
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().catch((err) => {
  process.stderr.write(`agenttools.cjs: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
