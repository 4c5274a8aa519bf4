// agent.cjs is one agent of the fleet test (cmd/toolhost TestFleet): the official MCP
// TypeScript SDK's client (npm @modelcontextprotocol/sdk, the version
// internal/mcpserve/testdata/npmclient pins) working on one project through a balancer
// with no affinity, while the test kills, stops and rolls the replicas behind it.
//
// Until FLEET_SECONDS have passed it repeats a round: write a file, edit it, run a
// command, and every few rounds commit; at the start it starts a background HTTP server in
// the sandbox and, every round, calls it. Every call must be answered: an error result or
// a transport failure is retried, at most once per failure, and the retry must succeed
// (or, for a request lost with a killed replica, find its work done: see call).
// At the end it checks that every file a call reported written is there with its last
// content, and that the server started at the start still answers. It prints one JSON
// object on stdout: calls, retries, failures (each with what it said), files written and
// missing, and whether the server answered.
//
//   TOOLHOST_MCP_CLIENT_DIR  where scripts/setup-mcp-client.sh installed the SDK
//   MCP_URL, MCP_TOKEN       the balancer's /mcp and a bearer token
//   PROJECT                  the agent's project
//   FLEET_SECONDS            how long to work
//   SERVER_PORT              the port of the agent's background server in its sandbox
"use strict";
const path = require("node:path");
const { createRequire } = require("node:module");

const sdk = createRequire(path.join(process.env.TOOLHOST_MCP_CLIENT_DIR, "package.json"));
const { Client } = sdk("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = sdk("@modelcontextprotocol/sdk/client/streamableHttp.js");

const text = (res) => (res.content || []).filter((c) => c.type === "text").map((c) => c.text).join("");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const out = { project: process.env.PROJECT, calls: 0, retries: 0, failures: [], unknown: [], reconnects: 0,
  written: 0, missing: [], serverStarted: false, serverAnswered: false, servedBy: {} };

let client, transport;
async function connect() {
  transport = new StreamableHTTPClientTransport(new URL(process.env.MCP_URL), {
    requestInit: { headers: { Authorization: `Bearer ${process.env.MCP_TOKEN}`, "Toolhost-Project": process.env.PROJECT } },
    // The SDK's own reconnection of its standalone stream, with a short first delay.
    reconnectionOptions: { initialReconnectionDelay: 200, maxReconnectionDelay: 2000, reconnectionDelayGrowFactor: 1.5, maxRetries: 50 },
  });
  client = new Client({ name: "toolhost-fleet-agent", version: "1.0.0" });
  await client.connect(transport);
}

// call makes one tool call; a failure (an error result, or a request that failed) is
// retried once, after a short pause, and the retry must succeed.
//
// A request that got no answer at all (the connection cut, or the balancer's 502) has an
// unknown outcome: it may have run, in part or in full, on a replica killed before it
// answered. No server can answer for it. Nor can a replica that was paused while it ran
// the call and lost the project meanwhile: its error result says so. A model would look
// before repeating a call that is not idempotent; so does this agent: when the retry of
// such a call fails, applied() checks whether the first request did the work (an
// edit_file's retry finds its old_string gone), and if so the call counts as done, its
// time and why kept in out.unknown so the test can check that it happened at the kill -9
// or at the paused replica's waking, and nowhere else.
async function call(name, args, want, applied) {
  out.calls++;
  const attempts = [];
  let lost = null; // the time of a first attempt that got no answer
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      const res = await client.callTool({ name, arguments: args }, undefined, { timeout: 300000 });
      const t = text(res);
      if (!res.isError && (!want || t.includes(want))) return t;
      attempts.push(`${new Date().toISOString()} error result: ${t.slice(0, 300)}`);
      // The replica ran the call but lost the project while it did (it was paused past
      // its lease): the result says so, and that the call may have done its work.
      if (attempt === 0 && res.isError && /lost project .* while it ran/.test(t)) lost = { at: new Date().toISOString(), why: "lost mid-call" };
    } catch (e) {
      const msg = String(e && e.message || e);
      attempts.push(`${new Date().toISOString()} ${msg.slice(0, 300)}${e && e.cause ? ` (cause: ${String(e.cause.message || e.cause).slice(0, 200)})` : ""}`);
      if (attempt === 0 && /fetch failed|HTTP 502/.test(msg)) lost = { at: new Date().toISOString(), why: "no answer" };
      if (/session not found|Session not found|404/.test(String(e))) {
        // The session is gone for good (the MCP spec: start a new one): a reconnect.
        out.reconnects++;
        try { await connect(); } catch (e2) { /* the retry says */ }
      }
    }
    if (attempt === 0) { out.retries++; await sleep(500); }
  }
  if (lost && applied && await applied()) {
    out.unknown.push({ at: lost.at, why: lost.why, call: name, attempts });
    return "";
  }
  out.failures.push(`${name}: ${attempts.join("; then ")}`);
  return null;
}

// fileHas reads p and reports whether it holds want.
async function fileHas(p, want) {
  try {
    const res = await client.callTool({ name: "read_file", arguments: { path: p } }, undefined, { timeout: 300000 });
    return !res.isError && text(res).includes(want);
  } catch (e) {
    return false;
  }
}

async function main() {
  // The handshake is a request like any other: one in flight when its replica is killed
  // fails, and is made again once.
  try { await connect(); } catch (e) { out.retries++; await sleep(500); await connect(); }
  const port = Number(process.env.SERVER_PORT);
  const deadline = Date.now() + Number(process.env.FLEET_SECONDS) * 1000;
  const files = new Map();
  await call("write_file", { path: "www/index.html", content: `served for ${out.project}\n` });
  const bg = await call("bash", { command: `cd www && exec python3 -m http.server ${port} --bind 127.0.0.1`, background: true });
  out.serverStarted = bg !== null;
  for (let i = 0; i < 50 && out.serverStarted; i++) {
    const r = await call("bash", { command: `curl -sf http://127.0.0.1:${port}/ || python3 -c 'import urllib.request;print(urllib.request.urlopen("http://127.0.0.1:${port}/").read().decode())'` });
    if (r && r.includes("served for")) break;
    await sleep(200);
  }
  for (let round = 0; Date.now() < deadline; round++) {
    const p = `work/f${round}.txt`;
    const content = `round ${round} of ${out.project}\n`;
    if ((await call("write_file", { path: p, content })) !== null) files.set(p, content);
    const edited = content.replace(`round ${round}`, `ROUND ${round}`);
    if ((await call("edit_file", { path: p, old_string: `round ${round}`, new_string: `ROUND ${round}` }, undefined,
      () => fileHas(p, edited.trim()))) !== null) {
      files.set(p, edited);
    }
    await call("bash", { command: `wc -l work/*.txt | tail -1` });
    await call("bash", { command: `python3 -c 'import urllib.request;print(urllib.request.urlopen("http://127.0.0.1:${port}/").read().decode())'` }, "served for");
    if (round % 5 === 4) await call("commit", { label: `round ${round}` });
  }
  out.written = files.size;
  for (const [p, content] of files) {
    const got = await call("read_file", { path: p });
    if (got === null || !got.includes(content.trim())) out.missing.push(p);
  }
  const s = await call("bash", { command: `python3 -c 'import urllib.request;print(urllib.request.urlopen("http://127.0.0.1:${port}/").read().decode())'` }, "served for");
  out.serverAnswered = s !== null;
  // The session ends as the MCP spec says (DELETE with its id): its replica commits and
  // closes its sandbox, so none is left but those of open sessions.
  try { await transport.terminateSession(); } catch (e) { out.failures.push(`ending the session: ${String(e && e.message || e).slice(0, 300)}`); }
  await client.close();
}

main().then(
  () => { process.stdout.write(JSON.stringify(out) + "\n"); process.exit(0); },
  (e) => { out.fatal = String(e && e.stack || e); process.stdout.write(JSON.stringify(out) + "\n"); process.exit(1); },
);
