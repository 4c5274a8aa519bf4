//! The Rust kit's example plugin, the one every plugin kit ships (the Go kit's in
//! pdk/examples/notes, the AssemblyScript kit's in pdk/assemblyscript/example): three
//! tools that write and read files of the workspace and run a program, and log what they
//! write. toolhost's kit conformance suite (internal/kitconform) holds it to the same
//! behaviour as the others. It needs the grants log, sandbox_files and sandbox_exec.
//!
//!     cargo build --release --target wasm32-wasi --example notes
//!     # target/wasm32-wasi/release/examples/notes.wasm

use toolhost_pdk::host::{self, Exec};
use toolhost_pdk::{Error, Input, Level, Plugin, Tool, ToolResult};

fn plugin() -> Plugin {
    Plugin::new("notes-rust", "0.1.0")
        .tool(Tool::new(
            "write_note",
            "Writes text to a file of the workspace, replacing what it held.",
            r#"{"type": "object", "additionalProperties": false, "required": ["path", "text"],
                "properties": {"path": {"type": "string", "minLength": 1, "description": "the file, relative to the workspace"},
                               "text": {"type": "string", "description": "what it is to hold"}}}"#,
            write_note,
        ))
        .tool(Tool::new(
            "read_note",
            "Reads a text file of the workspace.",
            r#"{"type": "object", "additionalProperties": false, "required": ["path"],
                "properties": {"path": {"type": "string", "minLength": 1, "description": "the file, relative to the workspace"}}}"#,
            read_note,
        ))
        .tool(Tool::new(
            "run",
            "Runs a program in the sandbox (no shell) and returns its exit code, then its output.",
            r#"{"type": "object", "additionalProperties": false, "required": ["argv"],
                "properties": {"argv": {"type": "array", "minItems": 1, "items": {"type": "string"}, "description": "the program and its arguments"}}}"#,
            run,
        ))
}

toolhost_pdk::export!(plugin);

fn write_note(input: &Input) -> Result<ToolResult, Error> {
    let path = input.str("path")?;
    let text = input.str("text")?;
    host::write_file(path, text.as_bytes())?;
    let msg = format!("wrote {} bytes to {}", text.len(), path);
    host::log(Level::Info, &msg);
    Ok(ToolResult::text(msg))
}

fn read_note(input: &Input) -> Result<ToolResult, Error> {
    Ok(ToolResult::text_bytes(host::read_file(input.str("path")?)?))
}

fn run(input: &Input) -> Result<ToolResult, Error> {
    let r = Exec::new(&input.strings("argv")?).run()?;
    let mut out = format!("exit {}\n", r.exit_code).into_bytes();
    out.extend_from_slice(&r.stdout);
    out.extend_from_slice(&r.stderr);
    Ok(ToolResult::text_bytes(out))
}
