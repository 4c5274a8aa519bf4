// The AssemblyScript kit's example plugin, the one every plugin kit ships (the Go kit's
// in pdk/examples/notes, the Rust kit's in pdk/rust/examples/notes.rs): three tools that
// write and read files of the workspace and run a program, and log what they write.
// toolhost's kit conformance suite (internal/kitconform) holds it to the same behaviour
// as the others. It needs the grants log, sandbox_files and sandbox_exec.
//
//   npx asc example/notes.ts --config asconfig.json --outFile notes.wasm

import {
  Input, Plugin, ToolResult, exec, log, readFile, register, utf8, writeFile, Bytes, LEVEL_INFO,
} from "../assembly/index";

export { toolhost_abi_version, toolhost_describe, toolhost_input_buffer, toolhost_call } from "../assembly/index";

function writeNote(input: Input): ToolResult {
  const path = input.getString("path");
  const text = input.getBytes("text"); // UTF-8 as it came: no trip through a string
  const err = writeFile(path, text);
  if (err !== null) return ToolResult.hostError(err);
  const msg = "wrote " + text.length.toString() + " bytes to " + path;
  log(LEVEL_INFO, msg);
  return ToolResult.text(msg);
}

function readNote(input: Input): ToolResult {
  const r = readFile(input.getString("path"));
  if (r.error !== null) return ToolResult.hostError(r.error!);
  return ToolResult.bytes(r.data);
}

function run(input: Input): ToolResult {
  const r = exec(input.getStrings("argv"));
  if (r.error !== null) return ToolResult.hostError(r.error!);
  const out = new Bytes(16 + r.stdout.length + r.stderr.length);
  out.append(utf8("exit " + r.exitCode.toString() + "\n"));
  out.append(r.stdout);
  out.append(r.stderr);
  return ToolResult.bytes(out.bytes());
}

register(
  new Plugin("notes-as", "0.1.0")
    .tool("write_note", "Writes text to a file of the workspace, replacing what it held.",
      `{"type": "object", "additionalProperties": false, "required": ["path", "text"],
        "properties": {"path": {"type": "string", "minLength": 1, "description": "the file, relative to the workspace"},
                       "text": {"type": "string", "description": "what it is to hold"}}}`,
      writeNote)
    .tool("read_note", "Reads a text file of the workspace.",
      `{"type": "object", "additionalProperties": false, "required": ["path"],
        "properties": {"path": {"type": "string", "minLength": 1, "description": "the file, relative to the workspace"}}}`,
      readNote)
    .tool("run", "Runs a program in the sandbox (no shell) and returns its exit code, then its output.",
      `{"type": "object", "additionalProperties": false, "required": ["argv"],
        "properties": {"argv": {"type": "array", "minItems": 1, "items": {"type": "string"}, "description": "the program and its arguments"}}}`,
      run),
);
