// The AssemblyScript (TypeScript) plugin kit of toolhost: a WebAssembly tool plugin in a
// few lines of TypeScript that speaks the ABI of abi/ABI.md (version 1).
//
// AssemblyScript's strings are UTF-16; the ABI's are UTF-8. The kit converts at the
// boundary: tool inputs arrive as strings, results and host requests leave as UTF-8.
// AssemblyScript has no exceptions (a throw traps, which the host counts as a plugin
// failure), so host functions return their error (a HostError, or null) instead.

import { Bytes, Kind, Value, parse, parseError, utf8, fromUTF8, writeString } from "./json";

export { Bytes, Kind, Value, parse, utf8, fromUTF8, writeString } from "./json";

// ---- Imports (ABI.md section 3). The compiler emits only those a plugin calls, so a
// plugin needs only the grants it uses.

@external("toolhost", "take")
declare function host_take(out: usize, cap: u32): i64;
@external("toolhost", "last_error")
declare function host_last_error(out: usize, cap: u32): i64;
@external("toolhost_log", "write")
declare function host_log_write(level: i32, msg: usize, len: u32): void;
@external("toolhost_sandbox_files", "read")
declare function host_files_read(path: usize, pathLen: u32, out: usize, cap: u32): i64;
@external("toolhost_sandbox_files", "write")
declare function host_files_write(path: usize, pathLen: u32, data: usize, dataLen: u32): i64;
@external("toolhost_sandbox_files", "stat")
declare function host_files_stat(path: usize, pathLen: u32, out: usize, cap: u32): i64;
@external("toolhost_sandbox_files", "list")
declare function host_files_list(req: usize, reqLen: u32, out: usize, cap: u32): i64;
@external("toolhost_sandbox_files", "remove")
declare function host_files_remove(path: usize, pathLen: u32): i64;
@external("toolhost_sandbox_exec", "run")
declare function host_exec_run(req: usize, reqLen: u32, out: usize, cap: u32): i64;

// ---- Statuses (ABI.md section 3.1).
export const EPERM: i64 = -1;
export const ENOENT: i64 = -2;
export const EIO: i64 = -5;
export const EFAULT: i64 = -14;
export const EEXIST: i64 = -17;
export const EXDEV: i64 = -18;
export const ENOTDIR: i64 = -20;
export const EISDIR: i64 = -21;
export const EINVAL: i64 = -22;
export const EFBIG: i64 = -27;
export const ETIME: i64 = -62;
export const ESTALE: i64 = -116;

/** A failed host call: its status and the host's message, written for a model to read. */
export class HostError {
  constructor(public status: i64, public message: string) {}
}

function lastError(status: i64, op: string): HostError {
  let buf = new Uint8Array(512);
  let n = host_last_error(buf.dataStart, <u32>buf.length);
  if (n > <i64>buf.length) {
    buf = new Uint8Array(<i32>n);
    n = host_last_error(buf.dataStart, <u32>buf.length);
  }
  if (n > <i64>buf.length) n = buf.length;
  let msg = n > 0 ? fromUTF8(buf.subarray(0, <i32>n)) : "";
  if (msg.length == 0) msg = op + ": status " + status.toString();
  return new HostError(status, msg);
}

// The reusable reply buffer: 4 KiB, growing to 64 KiB.
let replyBuf = new Uint8Array(4096);

/** A host function's reply: its bytes, or the error. */
export class Reply {
  constructor(public data: Uint8Array, public error: HostError | null) {}
}

type OutFn = (out: usize, cap: u32, a: usize, alen: u32) => i64;

function reply(op: string, f: OutFn, a: Uint8Array): Reply {
  const n = f(replyBuf.dataStart, <u32>replyBuf.length, a.dataStart, <u32>a.length);
  if (n < 0) return new Reply(new Uint8Array(0), lastError(n, op));
  if (n <= <i64>replyBuf.length) return new Reply(replyBuf.slice(0, <i32>n), null);
  const out = new Uint8Array(<i32>n);
  const m = host_take(out.dataStart, <u32>out.length);
  if (m < 0) return new Reply(new Uint8Array(0), lastError(m, op));
  if (replyBuf.length < 65536) replyBuf = new Uint8Array(n < 65536 ? <i32>n : 65536);
  return new Reply(m < n ? out.slice(0, <i32>m) : out, null);
}

// ---- Host functions.

export const LEVEL_DEBUG: i32 = -4;
export const LEVEL_INFO: i32 = 0;
export const LEVEL_WARN: i32 = 4;
export const LEVEL_ERROR: i32 = 8;

/** Writes a message to the host's log, attributed to the plugin (grant log). */
export function log(level: i32, msg: string): void {
  const b = utf8(msg);
  host_log_write(level, b.dataStart, <u32>b.length);
}

/** The file's bytes (grant sandbox_files). Paths are relative to the workspace. */
export function readFile(path: string): Reply {
  return reply("read", (out: usize, cap: u32, a: usize, alen: u32): i64 => host_files_read(a, alen, out, cap), utf8(path));
}

/** A file's text. */
export class TextReply {
  constructor(public text: string, public error: HostError | null) {}
}

/** The file's text, decoded from UTF-8 (grant sandbox_files). */
export function readFileString(path: string): TextReply {
  const r = readFile(path);
  return new TextReply(r.error === null ? fromUTF8(r.data) : "", r.error);
}

/** Creates or replaces the file, creating its parent directories (grant sandbox_files). */
export function writeFile(path: string, data: Uint8Array): HostError | null {
  const p = utf8(path);
  const n = host_files_write(p.dataStart, <u32>p.length, data.dataStart, <u32>data.length);
  return n < 0 ? lastError(n, "write") : null;
}

/** writeFile of a string's UTF-8. */
export function writeFileString(path: string, text: string): HostError | null {
  return writeFile(path, utf8(text));
}

/** Removes a file or symbolic link (grant sandbox_files). */
export function remove(path: string): HostError | null {
  const p = utf8(path);
  const n = host_files_remove(p.dataStart, <u32>p.length);
  return n < 0 ? lastError(n, "remove") : null;
}

/** The stat reply JSON of ABI.md (grant sandbox_files). */
export function stat(path: string): Reply {
  return reply("stat", (out: usize, cap: u32, a: usize, alen: u32): i64 => host_files_stat(a, alen, out, cap), utf8(path));
}

/** The list reply JSON of ABI.md for a request such as {"path": ".", "recursive": true}. */
export function list(requestJSON: string): Reply {
  return reply("list", (out: usize, cap: u32, a: usize, alen: u32): i64 => host_files_list(a, alen, out, cap), utf8(requestJSON));
}

/** What a command did. */
export class ExecResult {
  exitCode: i64 = 0;
  stdout: Uint8Array = new Uint8Array(0);
  stderr: Uint8Array = new Uint8Array(0);
  stdoutCut: i64 = 0;
  stderrCut: i64 = 0;
  timedOut: bool = false;
  error: HostError | null = null;
}

/**
 * Runs argv in the sandbox (grant sandbox_exec), directly, never through a shell; cwd
 * is relative to the workspace ("" for its root), timeoutMs 0 the host's default.
 */
export function exec(argv: string[], cwd: string = "", timeoutMs: i64 = 0): ExecResult {
  const req = new Bytes(256);
  req.appendString('{"argv":[');
  for (let k = 0; k < argv.length; k++) {
    if (k > 0) req.push(0x2c);
    writeString(req, argv[k]);
  }
  req.push(0x5d);
  if (cwd.length > 0) {
    req.appendString(',"cwd":');
    writeString(req, cwd);
  }
  if (timeoutMs > 0) req.appendString(',"timeout_ms":' + timeoutMs.toString());
  req.push(0x7d);
  const r = reply("exec", (out: usize, cap: u32, a: usize, alen: u32): i64 => host_exec_run(a, alen, out, cap), req.bytes());
  const res = new ExecResult();
  if (r.error !== null) {
    res.error = r.error;
    return res;
  }
  const b = r.data;
  let nl = b.indexOf(0x0a);
  if (nl < 0) nl = b.length;
  const header = parse(b.subarray(0, nl));
  if (header === null) {
    res.error = new HostError(EIO, "exec: the host's reply is not JSON: " + parseError);
    return res;
  }
  res.exitCode = num(header, "exit_code");
  res.stdoutCut = num(header, "stdout_cut");
  res.stderrCut = num(header, "stderr_cut");
  const t = header.get("timed_out");
  res.timedOut = t !== null && t.kind == Kind.Bool && t.bool;
  const rest = nl < b.length ? b.subarray(nl + 1) : new Uint8Array(0);
  let so = <i32>num(header, "stdout_len");
  if (so < 0 || so > rest.length) so = rest.length;
  let se = <i32>num(header, "stderr_len");
  if (se < 0 || se > rest.length - so) se = rest.length - so;
  res.stdout = rest.slice(0, so);
  res.stderr = rest.slice(so, so + se);
  return res;
}

function num(v: Value, key: string): i64 {
  const m = v.get(key);
  return m === null ? 0 : m.asI64();
}

// ---- Tools, input, results.

/**
 * A tool's input: the object the host checked against the tool's schema. It comes framed
 * (ABI.md section 9: string members as their UTF-8 bytes, nothing to unescape) from a
 * host that knows that form, as JSON from an older one; the accessors read both.
 */
export class Input {
  // Framed: each member's key, kind ('s' or 'j') and bytes (a view of the request).
  private keys: string[] = [];
  private kinds: u8[] = [];
  private vals: Uint8Array[] = [];
  private json: Value | null = null;

  static fromJSON(v: Value): Input {
    const in_ = new Input();
    in_.json = v;
    return in_;
  }

  /** Reads the members after a framed request's tool name; null if they are malformed. */
  static fromFramed(b: Uint8Array, at: i32): Input | null {
    const in_ = new Input();
    while (at < b.length) {
      if (at + 5 > b.length) return null;
      const kind = b[at];
      const klen = <i32>load<u32>(b.dataStart + <usize>at + 1);
      at += 5;
      if (klen < 0 || at + klen + 4 > b.length) return null;
      const key = String.UTF8.decodeUnsafe(b.dataStart + <usize>at, <usize>klen);
      at += klen;
      const vlen = <i32>load<u32>(b.dataStart + <usize>at);
      at += 4;
      if (vlen < 0 || at + vlen > b.length) return null;
      in_.keys.push(key);
      in_.kinds.push(kind);
      in_.vals.push(b.subarray(at, at + vlen));
      at += vlen;
    }
    return in_;
  }

  private index(key: string): i32 {
    for (let k = this.keys.length - 1; k >= 0; k--) {
      if (this.keys[k] == key) return k;
    }
    return -1;
  }

  has(key: string): bool {
    const j = this.json;
    if (j !== null) return j.get(key) !== null;
    return this.index(key) >= 0;
  }

  /** The member key as a JSON value (null when missing). */
  get(key: string): Value | null {
    const j = this.json;
    if (j !== null) return j.get(key);
    const k = this.index(key);
    if (k < 0) return null;
    if (this.kinds[k] == 0x73) {
      const v = new Value();
      v.kind = Kind.String;
      v.str = fromUTF8(this.vals[k]);
      return v;
    }
    return parse(this.vals[k]);
  }

  /** The string member key as UTF-8 bytes, without a trip through UTF-16 (empty when
   * missing or not a string: the schema says which it is). */
  getBytes(key: string): Uint8Array {
    if (this.json === null) {
      const k = this.index(key);
      return k >= 0 && this.kinds[k] == 0x73 ? this.vals[k] : new Uint8Array(0);
    }
    const v = this.get(key);
    return v !== null && v.kind == Kind.String ? utf8(v.str) : new Uint8Array(0);
  }

  /** The string member key ("" when missing or not a string). */
  getString(key: string): string {
    const v = this.get(key);
    return v !== null && v.kind == Kind.String ? v.str : "";
  }

  getInt(key: string, def: i64 = 0): i64 {
    const v = this.get(key);
    return v !== null && v.kind == Kind.Number ? v.asI64() : def;
  }

  getBool(key: string, def: bool = false): bool {
    const v = this.get(key);
    return v !== null && v.kind == Kind.Bool ? v.bool : def;
  }

  /** The member key, an array of strings (other items are left out). */
  getStrings(key: string): string[] {
    const out = new Array<string>();
    const v = this.get(key);
    if (v === null || v.kind != Kind.Array) return out;
    for (let k = 0; k < v.items.length; k++) {
      if (v.items[k].kind == Kind.String) out.push(v.items[k].str);
    }
    return out;
  }
}

/** A tool's result: text blocks (UTF-8 bytes) and whether it is an error. */
export class ToolResult {
  blocks: Uint8Array[] = [];
  isError: bool = false;

  static text(s: string): ToolResult {
    return ToolResult.bytes(utf8(s));
  }

  /** A text block from bytes (a program's output), taken as UTF-8 by the host. */
  static bytes(b: Uint8Array): ToolResult {
    const r = new ToolResult();
    r.blocks.push(b);
    return r;
  }

  static error(s: string): ToolResult {
    const r = ToolResult.text(s);
    r.isError = true;
    return r;
  }

  /** The error result of a failed host call: "Error: " and the host's message. */
  static hostError(e: HostError): ToolResult {
    return ToolResult.error("Error: " + e.message);
  }

  /** The framed form of ABI.md section 5. */
  framed(): Bytes {
    let size = 6;
    for (let k = 0; k < this.blocks.length; k++) size += 5 + this.blocks[k].length;
    const out = new Bytes(size);
    out.push(0);
    out.appendString("thr1");
    out.push(this.isError ? 1 : 0);
    for (let k = 0; k < this.blocks.length; k++) {
      out.push(0x74);
      out.appendU32(<u32>this.blocks[k].length);
      out.append(this.blocks[k]);
    }
    return out;
  }
}

export type Handler = (input: Input) => ToolResult;

/** A tool: its name, what it does (for the model), its input's JSON Schema, its handler. */
export class Tool {
  constructor(public name: string, public description: string, public schema: string, public run: Handler) {}
}

/** A plugin: its name ([a-z0-9_-]{1,64}), version and tools. */
export class Plugin {
  tools: Tool[] = [];

  constructor(public name: string, public version: string) {}

  tool(name: string, description: string, schema: string, run: Handler): Plugin {
    this.tools.push(new Tool(name, description, schema, run));
    return this;
  }

  /** The manifest JSON of ABI.md section 4. */
  manifest(): Bytes {
    const out = new Bytes(1024);
    out.appendString('{"abi_version":1,"name":');
    writeString(out, this.name);
    out.appendString(',"version":');
    writeString(out, this.version);
    out.appendString(',"tools":[');
    for (let k = 0; k < this.tools.length; k++) {
      const t = this.tools[k];
      if (k > 0) out.push(0x2c);
      out.appendString('{"name":');
      writeString(out, t.name);
      out.appendString(',"description":');
      writeString(out, t.description);
      out.appendString(',"input_schema":');
      out.appendString(t.schema);
      out.push(0x7d);
    }
    // Requests come framed (section 9) from hosts that know the form; JSON from others.
    out.appendString('],"input_forms":["framed1"]}');
    return out;
  }

  /** Handles one request: framed (ABI.md section 9) or JSON (section 5). */
  handle(request: Uint8Array): ToolResult {
    let name = "";
    let input: Input | null = null;
    if (request.length > 0 && request[0] == 0) {
      if (request.length < 6 || fromUTF8(request.subarray(1, 5)) != "thi1") return ToolResult.error("the request is in a framed form this plugin does not read");
      const n = <i32>request[5];
      if (6 + n > request.length) return ToolResult.error("the framed request is cut short");
      name = fromUTF8(request.subarray(6, 6 + n));
      input = Input.fromFramed(request, 6 + n);
      if (input === null) return ToolResult.error("the framed request's input is malformed");
    } else {
      const req = parse(request);
      if (req === null || req.kind != Kind.Object) return ToolResult.error("the request is not a JSON object: " + parseError);
      const nameV = req.get("tool");
      name = nameV !== null && nameV.kind == Kind.String ? nameV.str : "";
      const inV = req.get("input");
      let v = new Value();
      v.kind = Kind.Object;
      if (inV !== null && inV.kind == Kind.Object) v = inV;
      input = Input.fromJSON(v);
    }
    for (let k = 0; k < this.tools.length; k++) {
      const t = this.tools[k];
      if (t.name == name) {
        const run = t.run;
        return run(input);
      }
    }
    return ToolResult.error("unknown tool " + name);
  }
}

let current: Plugin | null = null;

/** Makes p the plugin the exports serve. Call it once, at the top level of the entry file. */
export function register(p: Plugin): void {
  current = p;
}

// ---- Exports (ABI.md section 2). The entry file re-exports them:
//   export { toolhost_abi_version, toolhost_describe, toolhost_input_buffer, toolhost_call } from "<kit>";

// The input buffer stays in place until the next toolhost_input_buffer; a returned
// result stays valid (referenced here) until the next export call.
let inputBuf = new Uint8Array(0);
let output = new Bytes(0);

function pack(b: Bytes): i64 {
  return (<i64>b.buf.dataStart << 32) | <i64>b.length;
}

function plugin(): Plugin {
  const p = current;
  if (p === null) return new Plugin("unregistered", "0.0.0");
  return p;
}

export function toolhost_abi_version(): i32 {
  return 1;
}

export function toolhost_describe(): i64 {
  output = plugin().manifest();
  return pack(output);
}

export function toolhost_input_buffer(size: i32): usize {
  if (inputBuf.length < size) inputBuf = new Uint8Array(size);
  return inputBuf.dataStart;
}

export function toolhost_call(len: i32): i64 {
  output = new Bytes(0); // the last result's memory back before this call's
  if (len > inputBuf.length) len = inputBuf.length;
  output = plugin().handle(inputBuf.subarray(0, len)).framed();
  return pack(output);
}

@external("wasi_snapshot_preview1", "fd_write")
declare function wasi_fd_write(fd: u32, iovs: usize, iovsLen: usize, nwritten: usize): u16;

/**
 * The abort every AssemblyScript module needs (asconfig.json's "use" names it): it writes
 * the message and where to stderr, which the host quotes in its error when the instance
 * dies, and traps (a plugin failure).
 */
export function toolhost_abort(message: string | null, file: string | null, line: u32, column: u32): void {
  // Static memory, not a global: abort may come before the globals are set.
  const st = memory.data(16); // the iovec, the count written, a flag
  if (load<u32>(st, 12) == 0) {
    store<u32>(st, 1, 12); // an abort while writing (out of memory) only traps
    const b = utf8("abort: " + (message !== null ? message : "") + " at " + (file !== null ? file : "?") + ":" + line.toString() + ":" + column.toString() + "\n");
    store<u32>(st, <u32>b.dataStart);
    store<u32>(st, <u32>b.length, 4);
    wasi_fd_write(2, st, 1, st + 8);
  }
  unreachable();
}
