// Command notes is the Go kit's example plugin, the one every plugin kit ships (the Rust
// kit's in pdk/rust/examples/notes.rs, the AssemblyScript kit's in
// pdk/assemblyscript/example/notes.ts): three tools that write and read files of the
// workspace and run a program, and log what they write. The kits' conformance suite
// (internal/kitconform) holds all three to the same behaviour. It needs the grants log,
// sandbox_files and sandbox_exec. Build it with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o notes.wasm ./pdk/examples/notes
package main

import (
	"strconv"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
)

func init() {
	pdk.Plugin("notes-go", "0.1.0")
	pdk.Register(pdk.Tool{
		Name:        "write_note",
		Description: "Writes text to a file of the workspace, replacing what it held.",
		Schema: `{"type": "object", "additionalProperties": false, "required": ["path", "text"],
		          "properties": {"path": {"type": "string", "minLength": 1, "description": "the file, relative to the workspace"},
		                         "text": {"type": "string", "description": "what it is to hold"}}}`,
		Run: func(in pdk.Input) abi.Result {
			path, text := in.String("path"), in.Bytes("text")
			if err := pdk.WriteFile(path, text); err != nil {
				return pdk.Errorf("Error: %v", err)
			}
			msg := "wrote " + strconv.Itoa(len(text)) + " bytes to " + path
			pdk.Log(abi.LevelInfo, msg)
			return abi.Text(msg)
		},
	})
	pdk.Register(pdk.Tool{
		Name:        "read_note",
		Description: "Reads a text file of the workspace.",
		Schema: `{"type": "object", "additionalProperties": false, "required": ["path"],
		          "properties": {"path": {"type": "string", "minLength": 1, "description": "the file, relative to the workspace"}}}`,
		Run: func(in pdk.Input) abi.Result {
			text, err := pdk.ReadFileString(in.String("path"))
			if err != nil {
				return pdk.Errorf("Error: %v", err)
			}
			return abi.Text(text)
		},
	})
	pdk.Register(pdk.Tool{
		Name:        "run",
		Description: "Runs a program in the sandbox (no shell) and returns its exit code, then its output.",
		Schema: `{"type": "object", "additionalProperties": false, "required": ["argv"],
		          "properties": {"argv": {"type": "array", "minItems": 1, "items": {"type": "string"}, "description": "the program and its arguments"}}}`,
		Run: func(in pdk.Input) abi.Result {
			r, err := pdk.Exec(abi.ExecRequest{Argv: in.Strings("argv")})
			if err != nil {
				return pdk.Errorf("Error: %v", err)
			}
			return abi.Text("exit " + strconv.Itoa(r.ExitCode) + "\n" + r.Stdout + r.Stderr)
		},
	})
}

func main() {}
