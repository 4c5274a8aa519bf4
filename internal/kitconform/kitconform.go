// Package kitconform is the conformance suite of toolhost's plugin kits: Go (pdk/), Rust
// (pdk/rust) and AssemblyScript (pdk/assemblyscript). Each kit ships the same example
// plugin, "notes", and Run holds a build of it to one behaviour, through the real host
// and a real (bubblewrap) sandbox: what it declares, the host's schema checks before
// it, host calls refused without a grant or outside a scope, results and inputs far
// larger than a kit's buffers, text that is not ASCII, and what it logs; and, on bare
// wazero, the JSON requests of hosts older than the framed input.
//
// The example's contract (any kit's, so a new kit is checked by writing it once more):
//
//   - write_note {path, text}: writes text (UTF-8) to path, logs at info and returns
//     "wrote N bytes to PATH" (N the bytes written).
//   - read_note {path}: returns the file's text.
//   - run {argv}: runs argv in the sandbox (no shell) and returns "exit N\n" followed
//     by its stdout and then its stderr.
//
// A host call that fails makes an error result "Error: " followed by the host's message
// (toolhost.last_error) as it is. Every schema has "additionalProperties": false, path
// is a string of minLength 1, argv an array of at least one string.
package kitconform

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testplugins"
	"github.com/toolhost/toolhost/policy"
)

// Tools are the example's tools, in the order it declares them.
var Tools = []string{"write_note", "read_note", "run"}

// Grants are the capabilities the example needs, and all it imports besides WASI and the
// ungranted toolhost modules.
var Grants = []abi.Capability{abi.CapLog, abi.CapSandboxExec, abi.CapSandboxFiles}

// Run checks wasm, a build of the notes example whose manifest names the plugin name.
func Run(t *testing.T, name string, wasm []byte) {
	t.Run("declare", func(t *testing.T) { declare(t, name, wasm) })
	t.Run("ungranted", func(t *testing.T) { ungranted(t, name, wasm) })
	t.Run("json", func(t *testing.T) { jsonRequests(t, wasm) })
	e := newEnv(t, name, wasm, policy.Scope{})
	t.Run("schema", e.schema)
	t.Run("files", e.files)
	t.Run("run", e.run)
	t.Run("large", e.large)
	t.Run("logging", e.logging)
	t.Run("scoped", func(t *testing.T) {
		s := newEnv(t, name, wasm, policy.Scope{
			Files: &policy.Files{Read: []string{"docs/**"}, Write: []string{"docs/**"}},
			Exec:  &policy.Exec{Programs: []string{"echo"}},
		})
		s.scoped(t)
	})
}

// declare: the manifest, the schemas the host accepted, and the imports.
func declare(t *testing.T, name string, wasm []byte) {
	in, err := host.Inspect(context.Background(), wasm)
	if err != nil {
		t.Fatalf("inspect: %v", err)
	}
	m := in.Manifest
	if m.ABIVersion != 1 || m.Name != name || m.Version == "" {
		t.Errorf("manifest: abi_version %d, name %q, version %q; want 1, %q, a version", m.ABIVersion, m.Name, m.Version, name)
	}
	var names []string
	for _, tool := range m.Tools {
		names = append(names, tool.Name)
		if tool.Description == "" {
			t.Errorf("tool %s has no description", tool.Name)
		}
		var schema struct {
			Type                 string                     `json:"type"`
			AdditionalProperties *bool                      `json:"additionalProperties"`
			Properties           map[string]json.RawMessage `json:"properties"`
			Required             []string                   `json:"required"`
		}
		if err := json.Unmarshal(tool.InputSchema, &schema); err != nil {
			t.Errorf("tool %s: schema %s: %v", tool.Name, tool.InputSchema, err)
			continue
		}
		if schema.Type != "object" || schema.AdditionalProperties == nil || *schema.AdditionalProperties || len(schema.Required) == 0 {
			t.Errorf("tool %s: schema %s: want an object with required members and additionalProperties false", tool.Name, tool.InputSchema)
		}
	}
	if !slices.Equal(names, Tools) {
		t.Errorf("tools %v, want %v", names, Tools)
	}
	needs := slices.Clone(in.Needs)
	slices.Sort(needs)
	want := slices.Clone(Grants)
	slices.Sort(want)
	if !slices.Equal(needs, want) {
		t.Errorf("needs %v, want %v", needs, want)
	}
	for _, imp := range in.Imports {
		if strings.HasPrefix(imp.Module, "toolhost") && !slices.Contains([]string{"toolhost", "toolhost_log", "toolhost_sandbox_files", "toolhost_sandbox_exec"}, imp.Module) {
			t.Errorf("imports %s.%s, which the example has no use for", imp.Module, imp.Name)
		}
	}
}

// ungranted: without sandbox_exec and log the plugin is refused at load, in one error
// that names each import and the grant it needs.
func ungranted(t *testing.T, name string, wasm []byte) {
	h, err := host.New(context.Background(), host.Config{DataDir: testplugins.DataDir(), Plugins: []host.PluginSpec{{
		Path: name + ".wasm", Wasm: wasm, Grants: []abi.Capability{abi.CapSandboxFiles},
	}}})
	if err == nil {
		h.Close(context.Background())
		t.Fatal("loaded without the grants sandbox_exec and log")
	}
	for _, want := range []string{name + ".wasm", "toolhost_sandbox_exec.run", `"sandbox_exec"`, "toolhost_log.write", `"log"`} {
		if !strings.Contains(err.Error(), want) { // codecheck:errtext the load error is the message a tool author reads: its text is what is checked
			t.Errorf("load error %q does not name %s", err, want)
		}
	}
}

type env struct {
	name string
	s    *host.Dispatcher
	ws   string
	logs *logBuffer
}

func newEnv(t *testing.T, name string, wasm []byte, scope policy.Scope) *env {
	t.Helper()
	logs := &logBuffer{}
	h, err := host.New(context.Background(), host.Config{
		DataDir: testplugins.DataDir(),
		Logger:  slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		// The plugin's budget is a hang bound here: the suite checks behaviour, and a first
		// call may run in the interpreter on a loaded machine (benchmarks measure speed).
		Plugins: []host.PluginSpec{{Path: name + ".wasm", Wasm: wasm, Grants: Grants, Scope: scope, CallTimeout: testenv.HangBound}},
	})
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	sb, ws := newSandbox(t)
	return &env{name: name, s: h.OpenSession(sb), ws: ws, logs: logs}
}

// call dispatches a tool call; a host error (a plugin failure) fails the test.
func (e *env) call(t *testing.T, tool, input string) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	res, err := e.s.Dispatch(ctx, tool, json.RawMessage(input))
	if err != nil {
		t.Fatalf("%s %.200s: host error %v", tool, input, err)
	}
	return testenv.ResultText(res), res.IsError
}

func (e *env) expect(t *testing.T, tool, input, want string, isErr bool) {
	t.Helper()
	got, gotErr := e.call(t, tool, input)
	if got != want || gotErr != isErr {
		t.Errorf("%s %.200s: %q (is_error %v), want %q (%v)", tool, input, got, gotErr, want, isErr)
	}
}

func (e *env) file(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.ws, rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (e *env) put(t *testing.T, rel string, data []byte) {
	t.Helper()
	p := filepath.Join(e.ws, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// schema: the host checks input against the schemas the plugin declared, before it.
func (e *env) schema(t *testing.T) {
	for _, c := range []struct{ tool, input, want string }{
		{"write_note", `{"path":"a.txt"}`, "text: required property is missing"},
		{"write_note", `{"path":"","text":"x"}`, "path:"},
		{"write_note", `{"path":"a.txt","text":5}`, "text: must be string, got integer"},
		{"read_note", `{"path":"a.txt","more":1}`, "more: unknown property (allowed: path)"},
		{"run", `{"argv":[]}`, "argv:"},
		{"run", `{"argv":["echo",1]}`, "must be string"},
	} {
		got, isErr := e.call(t, c.tool, c.input)
		if !isErr || !strings.HasPrefix(got, "["+c.tool+": invalid input: ") || !strings.Contains(got, c.want) {
			t.Errorf("%s %s: %q (is_error %v), want an invalid-input error containing %q", c.tool, c.input, got, isErr, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(e.ws, "a.txt")); err == nil {
		t.Error("a call refused for its input wrote a.txt")
	}
}

// tricky is text a kit's JSON and string handling must carry unchanged: escapes, control
// characters, two- to four-byte UTF-8 (a surrogate pair in JSON and in UTF-16).
const tricky = "h\u00e9llo \"w\u00f6rld\"\n\ttab \\ slash / \u20ac \U0001F600 \u0001 end"

// files: write, read back, and the host's messages for what fails, as they are.
func (e *env) files(t *testing.T) {
	in, _ := json.Marshal(map[string]string{"path": "notes/a.txt", "text": tricky})
	e.expect(t, "write_note", string(in), "wrote "+strconv.Itoa(len(tricky))+" bytes to notes/a.txt", false)
	if got := string(e.file(t, "notes/a.txt")); got != tricky {
		t.Errorf("notes/a.txt holds %q, want %q", got, tricky)
	}
	e.expect(t, "read_note", `{"path":"notes/a.txt"}`, tricky, false)
	// The escapes spelled by hand, as a caller may send them: \u escapes and a surrogate pair.
	e.expect(t, "write_note", `{"path":"b.txt","text":"\u00e9\ud83d\ude00\"\\\/\n"}`, "wrote 10 bytes to b.txt", false)
	if got := string(e.file(t, "b.txt")); got != "\u00e9\U0001F600\"\\/\n" {
		t.Errorf("b.txt holds %q", got)
	}
	e.put(t, "w\u00f6rds.txt", []byte("one\n"))
	e.expect(t, "read_note", `{"path":"w\u00f6rds.txt"}`, "one\n", false)
	e.expect(t, "write_note", `{"path":"empty.txt","text":""}`, "wrote 0 bytes to empty.txt", false)
	e.expect(t, "read_note", `{"path":"empty.txt"}`, "", false)

	e.expect(t, "read_note", `{"path":"missing.txt"}`, "Error: read missing.txt: no such file or directory", true)
	e.expect(t, "read_note", `{"path":"../etc/passwd"}`, "Error: ../etc/passwd: path is outside the workspace", true)
	e.expect(t, "read_note", `{"path":"notes"}`, "Error: read notes: is a directory", true)
	e.expect(t, "write_note", `{"path":"notes","text":"x"}`, "Error: write notes: is a directory", true)
}

// run: a program's exit code and output; argv is data, never a shell's.
func (e *env) run(t *testing.T) {
	e.expect(t, "run", `{"argv":["sh","-c","printf out; printf err >&2; exit 3"]}`, "exit 3\nouterr", false)
	e.expect(t, "run", `{"argv":["echo","$HOME; rm -rf x","\u00e9"]}`, "exit 0\n$HOME; rm -rf x \u00e9\n", false)
	e.expect(t, "run", `{"argv":["cat","notes/a.txt"]}`, "exit 0\n"+tricky, false)
	got, isErr := e.call(t, "run", `{"argv":["no-such-program-here"]}`)
	// ABI.md says exit code 127; the local sandbox answers EIO (an error result).
	if !strings.HasPrefix(got, "exit 127\n") && (!isErr || !strings.HasPrefix(got, "Error: exec: ")) {
		t.Errorf("run of a missing program: %q (is_error %v), want exit 127 or the host's error", got, isErr)
	}
}

// large: an input and a file far past any kit's buffers (the input buffer grows; a reply
// larger than the plugin's buffer comes through toolhost.take), and a result the host
// cuts to its head and tail.
func (e *env) large(t *testing.T) {
	var b strings.Builder
	for i := 0; b.Len() < 1<<20; i++ { // 16 times the largest buffer of a kit (64 KiB)
		b.WriteString("line " + strconv.Itoa(i) + " \u00e9\u20ac\U0001F600\n")
	}
	big := b.String()
	in, _ := json.Marshal(map[string]string{"path": "big.txt", "text": big})
	e.expect(t, "write_note", string(in), "wrote "+strconv.Itoa(len(big))+" bytes to big.txt", false)
	if got := e.file(t, "big.txt"); !bytes.Equal(got, []byte(big)) {
		t.Fatalf("big.txt: %d bytes, want the %d written", len(got), len(big))
	}
	e.put(t, "big2.txt", []byte(big))
	got, isErr := e.call(t, "read_note", `{"path":"big2.txt"}`)
	half := host.MaxTextChars / 2
	runes := []rune(big)
	head, tail := string(runes[:half]), string(runes[len(runes)-half:])
	if isErr || !strings.HasPrefix(got, head) || !strings.HasSuffix(got, tail) || !strings.Contains(got, "characters cut") {
		t.Errorf("read_note of %d bytes: %d characters (is_error %v), want the first and last %d characters of the file with the cut between", len(big), utf8.RuneCountInString(got), isErr, half)
	}
	// Output from a program past the plugin's buffer (the host keeps its head and tail).
	got, isErr = e.call(t, "run", `{"argv":["cat","big2.txt"]}`)
	if isErr || !strings.HasPrefix(got, "exit 0\n"+string(runes[:1000])) || !strings.HasSuffix(got, string(runes[len(runes)-1000:])) {
		t.Errorf("run cat big2.txt: %.100q... (is_error %v)", got, isErr)
	}
}

// logging: what the plugin logs reaches the host's log at its level, attributed to it.
func (e *env) logging(t *testing.T) {
	e.expect(t, "write_note", `{"path":"log.txt","text":"12345"}`, "wrote 5 bytes to log.txt", false)
	want := map[string]any{"level": "INFO", "msg": "wrote 5 bytes to log.txt", "plugin": e.name}
	for _, line := range e.logs.lines() {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		if rec["msg"] == want["msg"] {
			if rec["level"] != want["level"] || rec["plugin"] != want["plugin"] {
				t.Errorf("log record %s, want level INFO and plugin %s", line, e.name)
			}
			return
		}
	}
	t.Errorf("the host's log has no record %v:\n%s", want, strings.Join(e.logs.lines(), "\n"))
}

// scoped: calls the plugin's scope refuses come back as the host's policy message, in an
// error result; calls it allows work.
func (e *env) scoped(t *testing.T) {
	e.put(t, "secret.txt", []byte("s"))
	e.put(t, "docs/a.md", []byte("# a\n"))
	e.expect(t, "read_note", `{"path":"docs/a.md"}`, "# a\n", false)
	e.expect(t, "read_note", `{"path":"secret.txt"}`, "Error: policy: plugin "+e.name+" may not read secret.txt (allowed: docs/**)", true)
	e.expect(t, "write_note", `{"path":"docs/b.md","text":"b"}`, "wrote 1 bytes to docs/b.md", false)
	e.expect(t, "write_note", `{"path":"src/x.go","text":"x"}`, "Error: policy: plugin "+e.name+" may not write src/x.go (allowed: docs/**)", true)
	if _, err := os.Stat(filepath.Join(e.ws, "src")); err == nil {
		t.Error("a refused write made src/")
	}
	e.expect(t, "run", `{"argv":["echo","hi"]}`, "exit 0\nhi\n", false)
	e.expect(t, "run", `{"argv":["cat","secret.txt"]}`, "Error: policy: plugin "+e.name+" may not run cat (allowed: echo)", true)
}

// logBuffer collects the host's JSON log lines; the host logs from many goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Split(strings.TrimSpace(l.buf.String()), "\n")
}
