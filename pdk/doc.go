// Package pdk is the Go plugin kit of toolhost: it turns a few lines of Go into a
// WebAssembly tool plugin that speaks the ABI of abi/ABI.md.
//
// A plugin is a main package that registers its tools from an init function:
//
//	package main
//
//	import (
//		"bytes"
//		"strconv"
//
//		"github.com/toolhost/toolhost/abi"
//		"github.com/toolhost/toolhost/pdk"
//	)
//
//	func init() {
//		pdk.Plugin("wc", "1.0.0")
//		pdk.Register(pdk.Tool{
//			Name:        "count_lines",
//			Description: "Counts the lines of a text file in the workspace.",
//			Schema: `{"type": "object", "additionalProperties": false, "required": ["path"],
//			          "properties": {"path": {"type": "string", "minLength": 1}}}`,
//			Run: func(in pdk.Input) abi.Result {
//				data, err := pdk.ReadFile(in.String("path"))
//				if err != nil {
//					return pdk.Errorf("Error: %v", err)
//				}
//				return abi.Text(strconv.Itoa(bytes.Count(data, []byte("\n"))))
//			},
//		})
//	}
//
//	func main() {}
//
// Build it as a WASI reactor:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o wc.wasm ./wc
//
// # What the kit does
//
// It implements the exports (toolhost_abi_version, toolhost_describe,
// toolhost_input_buffer, toolhost_call), decodes requests, returns results in the framed
// form of ABI.md section 5 (raw text and image bytes: the host escapes and base64-encodes
// them), turns a panic in a tool into an error result ("panic in TOOL: ..."), and ends
// every export with runtime.Gosched(), without which the guest's garbage collector stalls
// across calls.
//
// The guest is slow at byte-by-byte work: under wazero's CloseOnContextDone every branch
// of Go-compiled wasm passes an interrupt check, so a plain byte loop costs about 30 ns a
// byte and reflection far more. Hence the host sends the tool input framed (ABI.md section
// 9): its string members arrive decoded, so a 64 KB file content costs one copy (String)
// or none (Bytes), whatever its escapes. Results are framed too, exec replies carry their
// output raw, and ReadText leaves line counting to the host; ReadTextHeld leaves the
// window there too (a host buffer, ABI.md section 5.1), for a tool that returns the lines
// as they are: HeldText.Block names them in the result and they never enter the guest.
// Input's accessors (String,
// Bytes, Int, Bool, Strings, Has, Raw) read the members; JSON gives the whole object, for
// json.Unmarshal when an input is too complex for them. The kit still reads the JSON
// request of ABI.md section 5, which older hosts send, with a small hand-written scanner.
//
// The kit links neither fmt, os, io/fs nor encoding/json (Errorf formats the common verbs
// itself): each brings half a megabyte of module that the host decodes and validates at
// every load, and a plugin that needs them pays for them itself.
//
// # Host functions
//
// Exec, ReadFile, ReadFileString, ReadText, WriteFile, Stat, List and Log call the host functions of
// ABI.md section 3 with the two-call protocol and a reusable buffer (4 KiB, growing to
// 64 KiB), so most replies take one host call. Each belongs to a capability (sandbox_exec,
// sandbox_files, log) that the plugin must be granted; Go's linker drops the imports of
// functions a plugin never calls, so a plugin imports exactly the capabilities it uses.
// Config reads the plugin's configuration (WASI environment variables).
//
// A failed host function returns an *Error carrying the abi.Status and the host's message
// (from toolhost.last_error). Test it with errors.Is against ErrNotFound, ErrIsDir, ... or
// against fs.ErrNotExist, fs.ErrExist and fs.ErrPermission.
//
// # Testing natively
//
// Built for any other target than wasip1, the host functions go to the Host set with
// SetHost, through the same byte-level protocol, so go test runs plugin logic on the build
// machine. Package pdktest provides a Host backed by a temporary directory and calls tools
// through Handle, the function behind the toolhost_call export.
package pdk
