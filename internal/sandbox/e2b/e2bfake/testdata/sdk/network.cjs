// The official E2B JavaScript SDK's network options against the fake E2B: allowOut and
// denyOut on create, updateNetwork at run time, allowInternetAccess false. The fake's
// sandboxes reach the test's own internet through the egress gateway. One JSON object
// goes to stdout for the Go test to check.
'use strict';

const { createRequire } = require('node:module');
const path = require('node:path');

const sdk = createRequire(path.join(process.env.TOOLHOST_E2B_SDK_DIR, 'package.json'))('e2b');
const { Sandbox, ALL_TRAFFIC } = sdk;

async function run(sbx, cmd) {
  try {
    const r = await sbx.commands.run(cmd, { timeoutMs: 60_000 });
    return { exitCode: r.exitCode, stdout: r.stdout };
  } catch (e) {
    return { exitCode: e.exitCode, stdout: e.stdout, stderr: e.stderr };
  }
}

async function main() {
  const out = {};
  const sbx = await Sandbox.create({ timeoutMs: 120_000, network: { allowOut: ['registry.test'], denyOut: [ALL_TRAFFIC] } });
  out.allowed = await run(sbx, 'curl -sS --max-time 30 http://registry.test/');
  out.refused = await run(sbx, 'curl -sS --max-time 30 http://other.test/');
  out.refusedIP = await run(sbx, 'curl -sS --max-time 30 http://' + process.env.OTHER_IP + '/');
  await sbx.updateNetwork({ allowOut: ['registry.test', 'other.test'], denyOut: [ALL_TRAFFIC] });
  out.afterUpdate = await run(sbx, 'curl -sS --max-time 30 http://other.test/');
  const open = await Sandbox.create({ timeoutMs: 120_000, network: { denyOut: [process.env.OTHER_IP + '/32'] } });
  out.openAllowed = await run(open, 'curl -sS --max-time 30 http://registry.test/');
  out.openDenied = await run(open, 'curl -sS --max-time 30 http://other.test/');
  const off = await Sandbox.create({ timeoutMs: 120_000, allowInternetAccess: false });
  out.offline = await run(off, 'curl -sS --max-time 30 http://registry.test/');
  await sbx.kill();
  await open.kill();
  await off.kill();
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(1);
});
