// The official E2B JavaScript SDK drives the fake E2B. The SDK reads E2B_API_KEY,
// E2B_API_URL and E2B_SANDBOX_URL (and E2B_DOMAIN); TOOLHOST_E2B_SDK_DIR is where
// scripts/setup-e2b-sdk.sh installed it. One JSON object goes to stdout: what each step
// saw, for the Go test to check. Any unexpected error exits 1.
'use strict';

const { createRequire } = require('node:module');
const path = require('node:path');

const sdkDir = process.env.TOOLHOST_E2B_SDK_DIR;
if (!sdkDir) {
  console.error('TOOLHOST_E2B_SDK_DIR is not set');
  process.exit(2);
}
const sdk = createRequire(path.join(sdkDir, 'package.json'))('e2b');
const { Sandbox } = sdk;

function errName(e) {
  return e && e.constructor ? e.constructor.name : String(e);
}

async function main() {
  const out = { sdkVersion: require(path.join(sdkDir, 'node_modules', 'e2b', 'package.json')).version };

  // Create, with metadata and an environment variable.
  const sbx = await Sandbox.create({ timeoutMs: 120_000, metadata: { from: 'official-sdk' }, envs: { GREETING: 'hello' } });
  out.id = sbx.sandboxId;

  // Run a command.
  const r = await sbx.commands.run('echo "$GREETING from $(id -un) in $(pwd)"');
  out.stdout = r.stdout;
  out.exitCode = r.exitCode;
  try {
    await sbx.commands.run('echo oops >&2; exit 3');
    out.failed = 'no error';
  } catch (e) {
    out.failed = { error: errName(e), exitCode: e.exitCode, stderr: e.stderr };
  }
  try {
    await sbx.commands.run('sleep 299', { timeoutMs: 1000 });
    out.commandTimeout = 'no error';
  } catch (e) {
    out.commandTimeout = errName(e);
  }
  // The SDK gave up at the deadline and went; envd kills the command at its deadline
  // whether or not the client stayed. Wait (a hang bound, far under the 299 s the command
  // would otherwise live) for it to leave the process list.
  out.timedOutCommandEnded = false;
  for (const until = Date.now() + 60_000; Date.now() < until; ) {
    const procs = await sbx.commands.list();
    if (!procs.some((p) => [p.cmd, ...(p.args || [])].join(' ').includes('sleep 299'))) {
      out.timedOutCommandEnded = true;
      break;
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  const bg = await sbx.commands.run('sleep 300', { background: true });
  out.backgroundPid = bg.pid;
  out.killedBackground = await bg.kill();

  // Write a file and read it back, through the SDK and through a command.
  const w = await sbx.files.write('/home/user/dir/hello.txt', 'written by the official SDK\n');
  out.writtenPath = w.path;
  out.read = await sbx.files.read('/home/user/dir/hello.txt');
  out.catted = (await sbx.commands.run('cat dir/hello.txt')).stdout;
  out.exists = await sbx.files.exists('dir/hello.txt');
  out.listed = (await sbx.files.list('/home/user/dir')).map((e) => `${e.name}:${e.type}`);
  try {
    await sbx.files.read('/home/user/nope.txt');
    out.missing = 'no error';
  } catch (e) {
    out.missing = errName(e);
  }

  // Set a timeout: the end time moves.
  const before = new Date((await sbx.getInfo()).endAt);
  await sbx.setTimeout(600_000);
  const info = await sbx.getInfo();
  out.extendedSeconds = Math.round((new Date(info.endAt) - before) / 1000);
  out.metadata = info.metadata;
  out.state = info.state;
  out.running = await sbx.isRunning();
  const page = await Sandbox.list().nextItems();
  out.inList = page.some((s) => s.sandboxId === out.id);

  // Connect: another client (as another process would) reaches the running sandbox by its
  // ID, its files and background processes as they are. A connect only ever extends.
  const server = await sbx.commands.run('sleep 600', { background: true });
  out.serverPid = server.pid;
  const again = await Sandbox.connect(out.id, { timeoutMs: 900_000 });
  out.connectedId = again.sandboxId;
  out.connectedRead = await again.files.read('/home/user/dir/hello.txt');
  out.connectedPids = (await again.commands.list()).map((p) => p.pid);
  const endConnected = new Date((await again.getInfo()).endAt);
  out.connectExtendedSeconds = Math.round((endConnected - new Date(info.endAt)) / 1000);
  await Sandbox.connect(out.id, { timeoutMs: 60_000 });
  out.shortConnectKeptEnd = new Date((await again.getInfo()).endAt).getTime() === endConnected.getTime();
  await again.commands.kill(server.pid);

  // List by metadata: keys and values with characters a query escapes, several keys, a
  // key a sandbox lacks (matches no value, not even the empty one), and the state filter.
  const odd = 'shop & co=1/ü+%';
  const a = await Sandbox.create({ timeoutMs: 120_000, metadata: { toolhost_project: odd, toolhost_epoch: '7' } });
  const b = await Sandbox.create({ timeoutMs: 120_000, metadata: { toolhost_project: 'shop', toolhost_epoch: '7' } });
  const ids = async (query) => (await Sandbox.list({ query }).nextItems()).map((s) => s.sandboxId).sort();
  out.listOdd = await ids({ metadata: { toolhost_project: odd } });
  out.listEpoch = await ids({ metadata: { toolhost_epoch: '7' } });
  out.listBoth = await ids({ metadata: { toolhost_project: 'shop', toolhost_epoch: '7' } });
  out.listWrongEpoch = await ids({ metadata: { toolhost_project: 'shop', toolhost_epoch: '8' } });
  out.listMissingKey = await ids({ metadata: { nokey: '' } });
  out.listRunning = await ids({ metadata: { toolhost_project: 'shop' }, state: ['running'] });
  out.listPaused = await ids({ metadata: { toolhost_project: 'shop' }, state: ['paused'] });
  const listed = (await Sandbox.list({ query: { metadata: { toolhost_project: odd } } }).nextItems())[0];
  out.listedMetadata = listed ? listed.metadata : null;
  out.oddId = a.sandboxId;
  out.shopId = b.sandboxId;
  await a.kill();
  await b.kill();

  // Kill.
  out.killed = await sbx.kill();
  out.runningAfterKill = await sbx.isRunning();
  try {
    await Sandbox.getInfo(out.id);
    out.infoAfterKill = 'found';
  } catch (e) {
    out.infoAfterKill = errName(e);
  }
  out.killedAgain = await Sandbox.kill(out.id);
  try {
    await Sandbox.connect(out.id, { timeoutMs: 60_000 });
    out.connectAfterKill = 'connected';
  } catch (e) {
    out.connectAfterKill = errName(e);
  }
  process.stdout.write(JSON.stringify(out) + '\n');
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(1);
});
