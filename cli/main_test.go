package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/screenshot"
	"github.com/toolhost/toolhost/internal/testenv"
)

// The real binary, built once by TestMain (its built-in plugins are inside it).
var (
	binDir      string
	toolBin     string
	testDataDir string // compilation cache shared by every run

	wordcountWasm string // testdata/wordcount, the README's example plugin
)

// builtinDir is a directory of plugin files: the built-ins as committed, which plugins_dir
// can point at.
func builtinDir() string { return filepath.Join(moduleRoot, "internal", "builtins", "wasm") }

func TestMain(m *testing.M) {
	toolhost.Reexec() // the sandbox agent and the browser's wrapper are this test binary, re-executed
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	// A call that answers starts a session daemon for the next (serve.daemon_calls): no
	// binary a test runs with this process's environment does, so none outlives its test
	// writing into the test's directories. runBinIn sets it again; a daemon test says true.
	os.Setenv("TOOLHOST_SERVE_DAEMON_CALLS", "false")
	tmp, err := os.MkdirTemp("", "toolhost-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	binDir = filepath.Join(tmp, "bin")
	toolBin = filepath.Join(binDir, "toolhost")
	testDataDir = filepath.Join(tmp, "data")

	root, err := filepath.Abs("..")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	moduleRoot = root
	build := func(env []string, args ...string) error {
		cmd := exec.Command("go", append([]string{"build"}, args...)...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("go build %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	// As make build builds it: the agent-only executable beside the CLI, its digest linked
	// into the CLI.
	agentBin := filepath.Join(binDir, "toolhost-sandbox-agent")
	if err := build(nil, "-o", agentBin, "./internal/sandbox/local/agentbin"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	agentBytes, err := os.ReadFile(agentBin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	digest := sha256.Sum256(agentBytes)
	ldflags := "-X github.com/toolhost/toolhost/internal/sandbox/local.agentDigest=" + hex.EncodeToString(digest[:])
	if err := build(nil, "-ldflags", ldflags, "-o", toolBin, "./cmd/toolhost"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The README's example plugin, outside the plugins directory.
	if err := build([]string{"GOOS=wasip1", "GOARCH=wasm"}, "-buildmode=c-shared", "-o", filepath.Join(tmp, "wordcount.wasm"), "./cli/testdata/wordcount"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	wordcountWasm = filepath.Join(tmp, "wordcount.wasm")

	// Fill the compilation cache once, so that the parallel tests do not all compile the
	// plugins at the same time.
	warm := exec.Command(toolBin, "tools", "--warm", "--log-level", "warn")
	warm.Dir = tmp
	warm.Env = append(os.Environ(), "TOOLHOST_DATA_DIR="+testDataDir)
	if out, err := warm.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "toolhost tools: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

var (
	moduleRoot string
	trackOnce  sync.Once
)

// trackSources stats every source file the plugins are built from. TestMain builds them
// with a go build subprocess, which go test does not see; statting their sources from a
// test (TestMain is too early: go test logs file access only once m.Run starts) puts them
// in the test cache's key, so a change to a plugin reruns these tests instead of reusing a
// stale result.
func trackSources() {
	trackOnce.Do(func() {
		for _, dir := range []string{"abi", "pdk", "plugins", "cli/testdata"} {
			filepath.WalkDir(filepath.Join(moduleRoot, dir), func(p string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					os.Stat(p)
				}
				return nil
			})
		}
		os.Stat(filepath.Join(moduleRoot, "go.mod"))
		os.Stat(filepath.Join(moduleRoot, "go.sum"))
	})
}

// testStores holds each test's directory store, by test name: the tests run in parallel,
// and the project lease keeps two processes on one store from running one project (the
// default one, say) at once.
var testStores sync.Map

// testStore is t's own store directory (env may still name another).
func testStore(t testing.TB) string {
	if d, ok := testStores.Load(t.Name()); ok {
		return d.(string)
	}
	d, _ := testStores.LoadOrStore(t.Name(), t.TempDir())
	return d.(string)
}

type runResult struct {
	code           int
	stdout, stderr string
}

// runCLI runs the binary in a scratch directory with a clean TOOLHOST_ environment plus
// env, and returns its exit code and output.
func runCLI(t *testing.T, env []string, args ...string) runResult {
	t.Helper()
	return runCLIIn(t, t.TempDir(), env, args...)
}

// runCLIIn runs the CLI with dir as its working directory.
func runCLIIn(t *testing.T, dir string, env []string, args ...string) runResult {
	t.Helper()
	return runBinIn(t, toolBin, dir, env, args...)
}

// runBinIn runs bin, a build of the CLI, as runCLIIn runs the test's own.
func runBinIn(t *testing.T, bin, dir string, env []string, args ...string) runResult {
	t.Helper()
	trackSources()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TOOLHOST_") && !strings.HasPrefix(kv, "XDG_CONFIG_HOME=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	// No user config file: every test states its configuration.
	// No call runs in, or starts, a session daemon unless the test says so: a test's
	// daemon is in its own runtime directory (sessionEnv).
	cmd.Env = append(cmd.Env, "TOOLHOST_DATA_DIR="+testDataDir, "TOOLHOST_STORE_DIR="+testStore(t), "XDG_CONFIG_HOME="+t.TempDir(),
		"TOOLHOST_SERVE_DAEMON_CALLS=false")
	cmd.Env = append(cmd.Env, env...)
	awaitCompiles(t, cmd.Env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("running toolhost %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return runResult{code, stdout.String(), stderr.String()}
}

// awaitCompiles makes t's end wait for the compile a one-shot call run with env may have
// left to a detached `toolhost tools --warm`: that process opens the store (creating its
// directories) and fills the data dir after the call has exited, so the test's
// directories may be removed only once it has ended. Cleanups run last-registered first:
// this one runs before the removal of every directory t made so far.
func awaitCompiles(t testing.TB, env []string) {
	dataDir := testDataDir
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "TOOLHOST_DATA_DIR="); ok {
			dataDir = v
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a hang bound
		defer cancel()
		if err := waitCompiled(ctx, dataDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Error(err)
		}
	})
}

func (r runResult) String() string {
	return fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", r.code, r.stdout, r.stderr)
}

func requireBwrap(t testing.TB) {
	t.Helper()
	testenv.NeedBwrap(t)
}

// oneLineError checks a failure: the wanted exit code, nothing on stdout, and one line on
// stderr that contains want.
func oneLineError(t *testing.T, r runResult, code int, want string) {
	t.Helper()
	if r.code != code {
		t.Errorf("exit code %d, want %d\n%s", r.code, code, r)
	}
	if r.stdout != "" {
		t.Errorf("stdout not empty on failure:\n%s", r)
	}
	msg := strings.TrimSuffix(r.stderr, "\n")
	if msg == "" || strings.Contains(msg, "\n") {
		t.Errorf("stderr is not one line:\n%s", r)
	}
	if !strings.Contains(msg, want) {
		t.Errorf("stderr %q does not contain %q", msg, want)
	}
}

func TestToolsAnthropic(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"tools"}, {"tools", "--format", "anthropic"}, {"--format=anthropic", "tools"}} {
		r := runCLI(t, nil, args...)
		if r.code != 0 {
			t.Fatalf("toolhost %v:\n%s", args, r)
		}
		var tools []map[string]json.RawMessage
		if err := json.Unmarshal([]byte(r.stdout), &tools); err != nil {
			t.Fatalf("toolhost %v: stdout is not a JSON array of objects: %v\n%s", args, err, r.stdout)
		}
		var names []string
		for _, tool := range tools {
			var keys []string
			for k := range tool {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			if !slices.Equal(keys, []string{"description", "input_schema", "name"}) {
				t.Errorf("tool has keys %v, want exactly name, description, input_schema", keys)
			}
			var name, desc string
			var schema struct {
				Type string `json:"type"`
			}
			json.Unmarshal(tool["name"], &name)
			json.Unmarshal(tool["description"], &desc)
			json.Unmarshal(tool["input_schema"], &schema)
			if desc == "" || schema.Type != "object" {
				t.Errorf("tool %s: description %q, schema type %q", name, desc, schema.Type)
			}
			names = append(names, name)
		}
		slices.Sort(names)
		want := []string{"apply_patch", "bash", "bash_kill", "bash_output", "edit_file", "exec_command", "glob", "grep", "read_file", "take_screenshot", "write_file", "write_stdin"}
		if !slices.Equal(names, want) {
			t.Errorf("toolhost %v: tools %v, want %v", args, names, want)
		}
	}
}

func TestToolsJSON(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "tools", "--format", "json")
	if r.code != 0 {
		t.Fatal(r)
	}
	var plugins []struct {
		Name    string           `json:"name"`
		Version string           `json:"version"`
		Grants  []abi.Capability `json:"grants"`
		Imports []string         `json:"imports"`
		Tools   []abi.Tool       `json:"tools"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &plugins); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, r.stdout)
	}
	if len(plugins) != 4 {
		t.Fatalf("%d plugins, want 4:\n%s", len(plugins), r.stdout)
	}
	tools := 0
	for _, p := range plugins {
		if p.Name == "" || p.Version == "" || len(p.Grants) == 0 || len(p.Imports) == 0 || len(p.Tools) == 0 {
			t.Errorf("plugin described incompletely: %+v", p)
		}
		tools += len(p.Tools)
	}
	if tools != 12 {
		t.Errorf("%d tools across the plugins, want 12", tools)
	}
}

// The openai and mcp formats carry each tool of the anthropic format, name, description
// and schema alike, in their own shapes and with exactly their own keys.
func TestToolsOpenAIAndMCP(t *testing.T) {
	t.Parallel()
	var anthropic []abi.Tool
	if r := runCLI(t, nil, "tools"); r.code != 0 || json.Unmarshal([]byte(r.stdout), &anthropic) != nil || len(anthropic) != 12 {
		t.Fatalf("toolhost tools:\n%s", r)
	}
	keysOf := func(raw json.RawMessage) []string {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("not a JSON object: %s", raw)
		}
		var keys []string
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		return keys
	}
	sameSchema := func(format, name string, got, want json.RawMessage) {
		var g, w any
		json.Unmarshal(got, &g)
		json.Unmarshal(want, &w)
		if !reflect.DeepEqual(g, w) || g == nil {
			t.Errorf("--format %s: tool %s has schema %s, want %s", format, name, got, want)
		}
	}

	r := runCLI(t, nil, "tools", "--format", "openai")
	if r.code != 0 {
		t.Fatal(r)
	}
	var openai []json.RawMessage
	if err := json.Unmarshal([]byte(r.stdout), &openai); err != nil || len(openai) != len(anthropic) {
		t.Fatalf("--format openai: %d tools, %v\n%s", len(openai), err, r.stdout)
	}
	for i, raw := range openai {
		var tool struct {
			Type     string `json:"type"`
			Function struct {
				Name        string          `json:"name"`
				Description string          `json:"description"`
				Parameters  json.RawMessage `json:"parameters"`
			} `json:"function"`
		}
		json.Unmarshal(raw, &tool)
		fn := struct{ Function json.RawMessage }{}
		json.Unmarshal(raw, &fn)
		if k := keysOf(raw); !slices.Equal(k, []string{"function", "type"}) || tool.Type != "function" {
			t.Errorf("--format openai: tool %d has keys %v and type %q", i, k, tool.Type)
		}
		if k := keysOf(fn.Function); !slices.Equal(k, []string{"description", "name", "parameters"}) {
			t.Errorf("--format openai: function %d has keys %v", i, k)
		}
		if tool.Function.Name != anthropic[i].Name || tool.Function.Description != anthropic[i].Description {
			t.Errorf("--format openai: tool %d is %s, want %s with its description", i, tool.Function.Name, anthropic[i].Name)
		}
		sameSchema("openai", anthropic[i].Name, tool.Function.Parameters, json.RawMessage(anthropic[i].InputSchema))
	}

	// --format mcp prints the tools toolhost mcp lists in answer to tools/list: the
	// plugins' with their titles and annotations, and the server's own (commit,
	// checkpoints, rewind).
	r = runCLI(t, nil, "tools", "--format", "mcp")
	if r.code != 0 {
		t.Fatal(r)
	}
	var printed any
	if err := json.Unmarshal([]byte(r.stdout), &printed); err != nil {
		t.Fatalf("--format mcp: %v\n%s", err, r.stdout)
	}
	if answered := map[string]any{"tools": toolsListAnswer(t)["tools"]}; !reflect.DeepEqual(printed, answered) {
		t.Errorf("--format mcp printed\n%s\nwhile toolhost mcp answers tools/list with\n%s", r.stdout, mustJSON(answered))
	}
	var mcp struct{ Tools []json.RawMessage }
	if err := json.Unmarshal([]byte(r.stdout), &mcp); err != nil || len(mcp.Tools) != len(anthropic)+3 {
		t.Fatalf("--format mcp: %d tools, %v\n%s", len(mcp.Tools), err, r.stdout)
	}
	byName := map[string]json.RawMessage{}
	for _, raw := range mcp.Tools {
		var tool struct {
			Name        string `json:"name"`
			Title       string `json:"title"`
			Annotations struct {
				Title string `json:"title"`
			} `json:"annotations"`
		}
		json.Unmarshal(raw, &tool)
		byName[tool.Name] = raw
		if tool.Title == "" || tool.Annotations.Title != tool.Title {
			t.Errorf("--format mcp: %s has title %q and annotations' title %q", tool.Name, tool.Title, tool.Annotations.Title)
		}
		// A tool with an output schema (bash, grep, glob) has it as outputSchema.
		if k := keysOf(raw); slices.Contains(k, "outputSchema") != slices.Contains([]string{"bash", "grep", "glob"}, tool.Name) {
			t.Errorf("--format mcp: %s has keys %v", tool.Name, k)
		}
	}
	for _, name := range []string{"commit", "checkpoints", "rewind"} {
		if byName[name] == nil {
			t.Errorf("--format mcp: no %s", name)
		}
	}
	for _, want := range anthropic {
		var tool struct {
			Description string          `json:"description"`
			InputSchema json.RawMessage `json:"inputSchema"`
		}
		if err := json.Unmarshal(byName[want.Name], &tool); err != nil || tool.Description != want.Description {
			t.Errorf("--format mcp: %s is missing or has another description", want.Name)
			continue
		}
		sameSchema("mcp", want.Name, tool.InputSchema, json.RawMessage(want.InputSchema))
	}
}

// toolsListAnswer is the result toolhost mcp answers a tools/list with.
func toolsListAnswer(t *testing.T) map[string]any {
	t.Helper()
	lines := []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"sh","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, toolBin, "mcp", "--log-level", "warn")
	cmd.Dir = t.TempDir()
	cmd.Env = cliEnv(t, "TOOLHOST_STORE_DIR="+t.TempDir())
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("toolhost mcp: %v\n%s", err, stderr.String())
	}
	for line := range strings.SplitSeq(string(out), "\n") {
		var msg struct {
			ID     int
			Result map[string]any
		}
		if json.Unmarshal([]byte(line), &msg) == nil && msg.ID == 2 {
			return msg.Result
		}
	}
	t.Fatalf("no answer to tools/list:\n%s\n%s", out, stderr.String())
	return nil
}

func mustJSON(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

func TestToolsUnknownFormat(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "tools", "--format", "yaml")
	oneLineError(t, r, 2, `--format must be one of anthropic, openai, mcp, json, got "yaml"`)
}

func TestCallWriteThenRead(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	ws := t.TempDir()
	content := "line one <b> & \"quoted\"\nline two\n"
	input, _ := json.Marshal(map[string]string{"path": "notes/a.txt", "content": content})

	// Flags before the positional arguments.
	r := runCLI(t, []string{"TOOLHOST_LOG_LEVEL=debug"}, "--workspace", ws, "call", "write_file", string(input))
	if r.code != 0 {
		t.Fatalf("write_file:\n%s", r)
	}
	// TestMain compiled every plugin (tools --warm): editfile is warm although the call
	// runs it under another environment (its guard off), so nothing is left to compile.
	if strings.Contains(r.stderr, "in a process of its own") {
		t.Errorf("a call on a warm data dir left a compile behind:\n%s", r.stderr)
	}
	res := decodeResult(t, r)
	if res.IsError || !strings.Contains(res.Content[0].Text, "notes/a.txt") {
		t.Errorf("write_file result: %+v", res)
	}
	got, err := os.ReadFile(filepath.Join(ws, "notes", "a.txt"))
	if err != nil || string(got) != content {
		t.Fatalf("file on disk: %q, %v; want %q", got, err, content)
	}

	// Flags after the positional arguments.
	r = runCLI(t, nil, "call", "read_file", `{"path":"notes/a.txt"}`, "--workspace", ws)
	if r.code != 0 {
		t.Fatalf("read_file:\n%s", r)
	}
	res = decodeResult(t, r)
	if res.IsError || !strings.Contains(res.Content[0].Text, `line one <b> & "quoted"`) || !strings.Contains(res.Content[0].Text, "line two") {
		t.Errorf("read_file result: %+v", res)
	}
	// One line of JSON, with <, > and & as they are.
	if strings.Count(strings.TrimSuffix(r.stdout, "\n"), "\n") != 0 || strings.Contains(r.stdout, `\u003c`) {
		t.Errorf("stdout is not one readable line of JSON: %q", r.stdout)
	}

	// Flags between them, the short spelling, and the input from stdin.
	cmd := exec.Command(toolBin, "call", "-w", ws, "read_file", "-")
	cmd.Env = append(os.Environ(), "TOOLHOST_DATA_DIR="+testDataDir, "TOOLHOST_STORE_DIR="+testStore(t))
	cmd.Stdin = strings.NewReader(`{"path": "notes/a.txt", "offset": 2}`)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("read_file from stdin: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "line two") || strings.Contains(string(out), "line one") {
		t.Errorf("read_file offset 2: %s", out)
	}
}

// TestCallToolError: a tool that ran and reported an error exits 0 with is_error.
// TestCallFreshDataDirLoadsNothingInFull: a one-shot call on a fresh data dir registers
// every built-in from its seed (internal/builtins' SeedEnvs cover the environment the call
// gives each, such as editfile's guard off), so it compiles only the plugin it calls.
// Without editfile's seed for its guard off, the call waited ~0.7 s for editfile.
//
// The call exits as soon as it has answered: the compile of bash is handed to a detached
// `toolhost tools --warm`, which holds the data dir's compile lock while it runs. Once it
// has, the next call finds bash compiled (it hands nothing on) and compiles no other
// plugin (OneShot).
func TestCallFreshDataDirLoadsNothingInFull(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	dataDir := filepath.Join(t.TempDir(), "data")
	ws := t.TempDir()
	t.Cleanup(func() { // the detached compile writes into dataDir: let it end first
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if err := waitCompiled(ctx, dataDir); err != nil {
			t.Error(err)
		}
	})
	env := []string{"TOOLHOST_DATA_DIR=" + dataDir, "TOOLHOST_LOG_LEVEL=debug"}
	r := runCLI(t, env, "call", "bash", `{"command":"true"}`, "--workspace", ws)
	if r.code != 0 || decodeResult(t, r).IsError {
		t.Fatalf("call bash:\n%s", r)
	}
	if !strings.Contains(r.stderr, "plugins loaded") {
		t.Fatalf("no debug log of the plugins' load:\n%s", r)
	}
	if strings.Contains(r.stderr, "loaded in full") {
		t.Errorf("a built-in was loaded in full on a fresh data dir: a seed is missing (internal/builtins SeedEnvs, make plugins):\n%s", r)
	}
	if !strings.Contains(r.stderr, "in a process of its own") || strings.Contains(r.stderr, "plugin compiled") {
		t.Errorf("the first call did not hand the compile of bash to a process of its own, or compiled a plugin itself:\n%s", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a hang bound
	defer cancel()
	if err := waitCompiled(ctx, dataDir); err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, env, "call", "bash", `{"command":"true"}`, "--workspace", ws)
	if r.code != 0 || decodeResult(t, r).IsError {
		t.Fatalf("second call bash:\n%s", r)
	}
	if strings.Contains(r.stderr, "in a process of its own") {
		t.Errorf("the second call found bash not compiled:\n%s", r)
	}
	if n := strings.Count(r.stderr, `msg="plugin compiled"`); n != 1 || !strings.Contains(r.stderr, "plugin compiled\" plugin=bash") {
		t.Errorf("the second call compiled %d plugins, want bash alone (from the cache):\n%s", n, r)
	}
}

func TestCallToolError(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	ws := t.TempDir()
	r := runCLI(t, nil, "call", "read_file", `{"path":"missing.txt"}`, "--workspace", ws)
	if r.code != 0 {
		t.Fatalf("exit %d for a tool error, want 0\n%s", r.code, r)
	}
	res := decodeResult(t, r)
	if !res.IsError || !strings.Contains(res.Content[0].Text, "missing.txt") {
		t.Errorf("result: %+v", res)
	}
	// The workspace is the current directory by default.
	r = runCLI(t, nil, "call", "bash", `{"command":"pwd; echo hi > made-here.txt"}`)
	if r.code != 0 || !strings.Contains(decodeResult(t, r).Content[0].Text, "/home/user") {
		t.Errorf("bash in the default workspace:\n%s", r)
	}
}

func decodeResult(t *testing.T, r runResult) abi.Result {
	t.Helper()
	var res abi.Result
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&res); err != nil {
		t.Fatalf("stdout is not a result {content, is_error}: %v\n%s", err, r)
	}
	if len(res.Content) == 0 {
		t.Fatalf("result has no content:\n%s", r)
	}
	return res
}

// TestCallFailures: what the host cannot run exits non-zero with one line on stderr.
func TestCallFailures(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	if err := os.Mkdir(filepath.Join(ws, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		env  []string
		args []string
		code int
		want string
	}{
		{"bad JSON", nil, []string{"call", "read_file", `{"path": "a.txt"`, "--workspace", ws}, 2, "not valid JSON"},
		{"not an object", nil, []string{"call", "read_file", `["a.txt"]`, "--workspace", ws}, 2, "JSON object"},
		{"unknown tool", nil, []string{"call", "deploy", `{}`, "--workspace", ws}, 2, `unknown tool "deploy"`},
		{"missing input", nil, []string{"call", "read_file", "--workspace", ws}, 2, "missing"},
		{"workspace missing", nil, []string{"call", "read_file", `{"path":"a"}`, "--workspace", filepath.Join(ws, "nope")}, 2, "--workspace"},
		{"no plugins", nil, []string{"call", "read_file", `{"path":"a"}`, "--workspace", ws, "--plugins-dir", filepath.Join(t.TempDir(), "nope")}, 1, "leave plugins_dir empty to use the built-in plugins"},
		{"not a built-in", nil, []string{"tools", "--config", writeConfig(t, "plugins: [{path: lint.wasm}]\n")}, 1, "lint.wasm is not a built-in plugin"},
		{"unknown variable", []string{"TOOLHOST_SANDBOX_NETWROK=host"}, []string{"tools"}, 2, "TOOLHOST_SANDBOX_NETWROK is not a toolhost variable"},
		// What the host trusts never lives in a workspace: the sandbox could rewrite it.
		{"plugins dir in the workspace", nil, []string{"call", "read_file", `{"path":"a"}`, "--workspace", ws, "--plugins-dir", filepath.Join(ws, "plugins")}, 2, "the plugins dir"},
		{"data dir in the workspace", []string{"TOOLHOST_DATA_DIR=" + filepath.Join(ws, "data")}, []string{"call", "read_file", `{"path":"a"}`, "--workspace", ws}, 2, "the data dir"},
		{"workspace in the data dir", []string{"TOOLHOST_DATA_DIR=" + ws}, []string{"call", "read_file", `{"path":"a"}`, "--workspace", filepath.Join(ws, "sub")}, 2, "host's own state"},
		{"browser in the workspace", []string{"TOOLHOST_SCREENSHOT_CHROMIUM=" + filepath.Join(ws, "chromium")}, []string{"call", "read_file", `{"path":"a"}`, "--workspace", ws}, 2, "screenshot.chromium"},
		{"bad config value", []string{"TOOLHOST_LIMITS_POOL_SIZE=many"}, []string{"call", "read_file", `{"path":"a"}`}, 2, "limits.pool_size"},
		{"unknown flag", nil, []string{"call", "read_file", `{"path":"a"}`, "--format", "json"}, 2, "unknown flag: --format"},
		{"unknown command", nil, []string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{"unknown subcommand", nil, []string{"plugin", "remove", "x"}, 2, `unknown command "plugin remove"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			oneLineError(t, runCLI(t, tc.env, tc.args...), tc.code, tc.want)
		})
	}
}

// writeConfig writes a config file for one test.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPluginInspect(t *testing.T) {
	t.Parallel()
	wasm := filepath.Join(builtinDir(), "grepglob.wasm")
	r := runCLI(t, nil, "plugin", "inspect", wasm)
	if r.code != 0 {
		t.Fatal(r)
	}
	for _, want := range []string{"grepglob", "grep", "glob", "toolhost_sandbox_exec", "toolhost_sandbox_files", "needs"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, r.stdout)
		}
	}

	r = runCLI(t, nil, "plugin", "inspect", "--format", "json", filepath.Join(builtinDir(), "bash.wasm"))
	if r.code != 0 {
		t.Fatal(r)
	}
	var in struct {
		Manifest abi.Manifest     `json:"manifest"`
		Imports  []string         `json:"imports"`
		Needs    []abi.Capability `json:"needs"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &in); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, r.stdout)
	}
	if in.Manifest.Name != "bash" || len(in.Manifest.Tools) == 0 || in.Manifest.Tools[0].Name != "bash" || !slices.Contains(in.Needs, abi.CapSandboxExec) {
		t.Errorf("inspect bash.wasm: %+v", in)
	}
	if !slices.Contains(in.Imports, "toolhost_sandbox_exec.run") {
		t.Errorf("imports %v lack toolhost_sandbox_exec.run", in.Imports)
	}

	oneLineError(t, runCLI(t, nil, "plugin", "inspect", filepath.Join(t.TempDir(), "none.wasm")), 1, "none.wasm")
	notWasm := filepath.Join(t.TempDir(), "x.wasm")
	os.WriteFile(notWasm, []byte("not wasm"), 0o644)
	oneLineError(t, runCLI(t, nil, "plugin", "inspect", notWasm), 1, "x.wasm")
}

// TestConfigLayers goes through the binary: a file's plugins_dir is overridden by the
// environment, which is overridden by a flag.
func TestConfigLayers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := builtinDir()
	bad1, bad2 := filepath.Join(dir, "from-file"), filepath.Join(dir, "from-flag")
	cfg := filepath.Join(dir, "c.yaml")
	os.WriteFile(cfg, []byte("plugins_dir: "+bad1+"\n"), 0o644)

	r := runCLI(t, nil, "tools", "--config", cfg)
	oneLineError(t, r, 1, bad1) // the file's directory has no plugins
	r = runCLI(t, []string{"TOOLHOST_CONFIG=" + cfg}, "tools")
	oneLineError(t, r, 1, bad1) // found through TOOLHOST_CONFIG too
	r = runCLI(t, []string{"TOOLHOST_PLUGINS_DIR=" + good}, "tools", "--config", cfg)
	if r.code != 0 {
		t.Errorf("env over file: %s", r)
	}
	r = runCLI(t, []string{"TOOLHOST_PLUGINS_DIR=" + good}, "tools", "--config", cfg, "--plugins-dir", bad2)
	oneLineError(t, r, 1, bad2)
	oneLineError(t, runCLI(t, nil, "tools", "--config", filepath.Join(dir, "none.yaml")), 2, "none.yaml")
}

func TestHelpAndVersion(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "plugin inspect") || !strings.Contains(r.stdout, "--config") {
		t.Errorf("--help:\n%s", r)
	}
	for _, args := range [][]string{{"call", "--help"}, {"help", "call"}, {"call", "-h"}} {
		r = runCLI(t, nil, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "toolhost call TOOL JSON") || !strings.Contains(r.stdout, "--workspace") {
			t.Errorf("%v:\n%s", args, r)
		}
	}
	r = runCLI(t, nil, "plugin", "inspect", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "FILE.wasm") {
		t.Errorf("plugin inspect --help:\n%s", r)
	}
	r = runCLI(t, nil)
	if r.code != 2 || !strings.Contains(r.stderr, "Commands:") {
		t.Errorf("no arguments: want usage on stderr and exit 2\n%s", r)
	}
	for _, args := range [][]string{{"version"}, {"--version"}, {"tools", "--version"}} {
		r = runCLI(t, nil, args...)
		if r.code != 0 || !strings.HasPrefix(r.stdout, "toolhost ") || !strings.Contains(r.stdout, "ABI v1") ||
			!strings.Contains(r.stdout, runtime.Version()) || strings.Count(r.stdout, "\n") != 1 {
			t.Errorf("%v:\n%s", args, r)
		}
	}
	// The help of a command group lists its commands and exits 0; the group alone is
	// still a usage mistake.
	for group, want := range map[string][]string{
		"snapshot":   {"snapshot save", "snapshot list", "snapshot restore", "snapshot delete", "snapshot prune"},
		"screenshot": {"screenshot list"},
		"plugin":     {"plugin inspect"},
	} {
		for _, args := range [][]string{{group, "--help"}, {"help", group}, {group, "-h"}} {
			r = runCLI(t, nil, args...)
			if r.code != 0 || r.stderr != "" {
				t.Errorf("%v: want the group's help and exit 0\n%s", args, r)
			}
			for _, w := range want {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("%v: help lacks %q\n%s", args, w, r)
				}
			}
		}
		oneLineError(t, runCLI(t, nil, group), 2, "needs a subcommand")
	}
}

// TestDemo runs the whole demo (it needs the browser: it checks a pixel of its
// screenshot), then lists what it left in the store with the snapshot and screenshot
// commands.
func TestDemo(t *testing.T) {
	requireBwrap(t)
	requireBrowser(t)
	t.Parallel()
	project := "demo-test"
	r := runCLI(t, nil, "demo", "--project", project)
	if r.code != 0 {
		t.Fatalf("demo failed:\n%s", r)
	}
	for _, want := range []string{"write_file", "read_file", "edit_file", "grep", "glob", "bash", "background",
		"apply_patch", "[cwd is now /home/user/src]", "Hello, Linus, from the sandbox!",
		"egress: example.com is not an allowed domain", "take_screenshot", "pixel (4,4) is " + demoColour, "committed: projects/" + project + "/snapshots/",
		"auto/ images of this run", "rotations: 0 -> 1", "a pause of about", "woke in",
		// The rotation takes the path every session of the CLI takes with the local
		// provider: the workspace is handed over, not restored from the snapshot.
		"the work moved by handoff",
		"came back byte for byte", "every result as expected"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	if strings.Contains(r.stdout, `"data":`) {
		t.Error("demo output dumps image data")
	}
	if testing.Verbose() {
		t.Log("\n" + r.stdout)
	}

	// What the demo stored: its screenshots (2 of the agent's, at least 4 of the session's)
	// and one snapshot: the commit's. The rotation saves too, but its archive is the very
	// archive the commit stored (nothing changed in between), and a save whose archive the
	// newest snapshot already holds stores nothing ("unchanged"), by design.
	r = runCLI(t, nil, "screenshot", "list", "--project", project, "--kind", "agent")
	if r.code != 0 || strings.Count(r.stdout, " agent ") != 2 ||
		!strings.Contains(r.stdout, "desktop 1280x800") || !strings.Contains(r.stdout, "mobile 390x844") {
		t.Errorf("screenshot list --kind agent:\n%s", r)
	}
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n")[1:] {
		url := line[strings.LastIndex(line, " ")+1:]
		if st, err := os.Stat(url); err != nil || st.Size() == 0 {
			t.Errorf("the listed URL %s is not the stored image: %v", url, err)
		}
	}
	r = runCLI(t, nil, "screenshot", "list", "--project", project)
	if r.code != 0 || strings.Count(r.stdout, " auto ") < 4 || strings.Count(r.stdout, " agent ") != 2 {
		t.Errorf("screenshot list:\n%s", r)
	}
	r = runCLI(t, nil, "snapshot", "list", "--project", project)
	if r.code != 0 || strings.Count(r.stdout, "projects/"+project+"/snapshots/") != 1 {
		t.Errorf("snapshot list after the demo:\n%s", r)
	}

	// `make run` a second time: the project wakes with the first run's files, which the
	// demo's writes would be refused to overwrite unread; it starts from an empty
	// workspace and passes again.
	r = runCLI(t, nil, "demo", "--project", project)
	if r.code != 0 || !strings.Contains(r.stdout, "the demo empties the workspace") || !strings.Contains(r.stdout, "every result as expected") {
		t.Fatalf("the demo run a second time:\n%s", r)
	}
}

// requireBrowser skips when Chromium or the Playwright driver is genuinely absent.
func requireBrowser(t *testing.T) {
	t.Helper()
	testenv.Require(t, "no browser for screenshots (scripts/setup-browser.sh installs it; make test runs it)",
		screenshot.New(screenshot.Config{}).Check())
}

// TestThirdPartyPlugin: the README's example plugin, added through a config file next to a
// built-in, works with its grant and is refused at load without it.
func TestThirdPartyPlugin(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	dir, ws := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(ws, "words.txt"), []byte("one two\nthree\n"), 0o644)
	write := func(name, grants string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(`plugins:
  - path: editfile.wasm
    grants: [sandbox_exec, sandbox_files, log]
  - path: `+wordcountWasm+`
    grants: [`+grants+`]
`), 0o644)
		return p
	}
	granted, ungranted := write("ok.yaml", "sandbox_files"), write("no.yaml", "log")

	r := runCLI(t, nil, "call", "word_count", `{"path":"words.txt"}`, "--workspace", ws, "--config", granted)
	if r.code != 0 {
		t.Fatal(r)
	}
	if res := decodeResult(t, r); res.IsError || res.Content[0].Text != "3 words" {
		t.Errorf("word_count: %+v", res)
	}
	r = runCLI(t, nil, "tools", "--config", granted)
	if r.code != 0 || !strings.Contains(r.stdout, `"word_count"`) || !strings.Contains(r.stdout, `"read_file"`) {
		t.Errorf("tools with the extra plugin:\n%s", r)
	}
	r = runCLI(t, nil, "tools", "--config", ungranted)
	oneLineError(t, r, 1, "toolhost_sandbox_files.read")
	if !strings.Contains(r.stderr, "wordcount") || !strings.Contains(r.stderr, "sandbox_files") {
		t.Errorf("the refusal does not name the plugin and the grant: %s", r.stderr)
	}
}

// TestInterrupt: SIGINT during a call stops it promptly, cleans up, and exits 130.
func TestInterrupt(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	trackSources()
	ws := t.TempDir()
	cmd := exec.Command(toolBin, "call", "bash", `{"command":"touch started; sleep 60"}`, "--workspace", ws)
	cmd.Env = append(os.Environ(), "TOOLHOST_DATA_DIR="+testDataDir, "TOOLHOST_STORE_DIR="+testStore(t))
	awaitCompiles(t, cmd.Env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait until the command runs in the sandbox.
	if !testenv.Eventually(func() bool { _, err := os.Stat(filepath.Join(ws, "started")); return err == nil }) {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the command never started\n%s", stderr.String())
	}
	start := time.Now()
	cmd.Process.Signal(os.Interrupt)
	err := cmd.Wait()
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("took %s to stop after SIGINT", took)
	}
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != exitInterrupted {
		t.Errorf("exit: %v, want code %d\n%s", err, exitInterrupted, stderr.String())
	}
	if !strings.Contains(stderr.String(), "toolhost call: interrupted") {
		t.Errorf("stderr: %q", stderr.String())
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout: %q", stdout.String())
	}
}

// The reproduction of issue 7: a bash call writes toolhost.yaml (sandbox.network: host)
// into the directory it runs in; the next command run from that directory must still give
// the sandbox no network. Both with the directory mounted as the workspace and without
// (then the call runs in the project's private workspace and the file never reaches it).
func TestSandboxCannotConfigureTheHost(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	dir := t.TempDir()
	env := []string{"TOOLHOST_PROJECT=planted-config"}
	plant := `{"command":"printf 'sandbox:\\n  network: host\\n' > toolhost.yaml; cat toolhost.yaml"}`
	r := runCLIIn(t, dir, env, "call", "bash", plant, "--workspace", dir)
	if r.code != 0 || !strings.Contains(r.stdout, "network: host") {
		t.Fatalf("planting the file:\n%s", r)
	}
	if _, err := os.Stat(filepath.Join(dir, "toolhost.yaml")); err != nil {
		t.Fatalf("the sandbox did not write the file into the mounted directory: %v", err)
	}
	// Only loopback: the host's network would show its interfaces too.
	probe := `{"command":"grep -c : /proc/net/dev"}`
	for _, args := range [][]string{{"--workspace", dir}, {}} {
		r = runCLIIn(t, dir, env, append([]string{"call", "bash", probe}, args...)...)
		if r.code != 0 {
			t.Fatalf("probe %v:\n%s", args, r)
		}
		res := decodeResult(t, r)
		if !strings.Contains(res.Content[0].Text, "\n1\n") {
			t.Fatalf("probe %v: the sandbox sees more than loopback (the planted config was read):\n%s", args, res.Content[0].Text)
		}
	}
	// Without --workspace the call ran in the project's own workspace: the planted file
	// is not there, and the current directory is not mounted.
	r = runCLIIn(t, dir, env, "call", "bash", `{"command":"ls -A; pwd"}`)
	if res := decodeResult(t, r); strings.Contains(res.Content[0].Text, "toolhost.yaml") {
		t.Fatalf("the project's workspace shows the current directory:\n%s", res.Content[0].Text)
	}
}

// TestGoInstall: go install into a temporary GOBIN gives a CLI that works from / with no
// other file: its built-in plugins are inside it, its state goes to the user's data dir.
func TestGoInstall(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	trackSources()
	gobin := t.TempDir()
	install := exec.Command("go", "install", "./cmd/toolhost")
	install.Dir = moduleRoot
	install.Env = append(os.Environ(), "GOBIN="+gobin)
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install: %v\n%s", err, out)
	}
	home := t.TempDir()
	run := func(args ...string) runResult {
		t.Helper()
		cmd := exec.Command(filepath.Join(gobin, "toolhost"), args...)
		cmd.Dir = "/"
		// Nothing of this repository, no TOOLHOST_ variable, no config: a stranger's shell.
		cmd.Env = []string{"HOME=" + home, "PATH=/usr/local/bin:/usr/bin:/bin", "TMPDIR=" + os.TempDir()}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return runResult{code, stdout.String(), stderr.String()}
	}
	r := run("tools")
	var tools []abi.Tool
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &tools) != nil || len(tools) != 12 {
		t.Fatalf("tools from /:\n%s", r)
	}
	r = run("call", "bash", `{"command":"echo hi > hi.txt; cat hi.txt; pwd"}`, "--log-level", "warn")
	if r.code != 0 {
		t.Fatalf("call from /:\n%s", r)
	}
	if res := decodeResult(t, r); res.IsError || !strings.Contains(res.Content[0].Text, "hi\n/home/user") {
		t.Errorf("call from /: %+v", res)
	}
	// The next call sees the first one's file: the project's workspace, in the data dir.
	r = run("call", "read_file", `{"path":"hi.txt"}`, "--log-level", "warn")
	if res := decodeResult(t, r); res.IsError || !strings.Contains(res.Content[0].Text, "hi") {
		t.Errorf("second call: %+v", res)
	}
	snaps := 0
	filepath.WalkDir(filepath.Join(home, ".local", "share", "toolhost", "store"), func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.Contains(p, "projects/default/snapshots/") && (strings.HasSuffix(p, ".tar.gz") || strings.HasSuffix(p, ".snap")) {
			snaps++
		}
		return nil
	})
	if snaps == 0 {
		t.Error("the project's snapshots are not in the user's data dir")
	}
	if r := run("--version"); r.code != 0 || !strings.HasPrefix(r.stdout, "toolhost ") {
		t.Errorf("--version:\n%s", r)
	}
}

// TestAgentOnlyExecutable: the CLI built as make build builds it runs the agent-only
// executable beside it as each sandbox's agent; a copy of the CLI alone, or beside an
// agent that is not the one it was built with, runs itself as the agent (the latter says
// so in a warning), and both still work.
func TestAgentOnlyExecutable(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	call := func(bin string) runResult {
		t.Helper()
		r := runBinIn(t, bin, t.TempDir(), []string{"TOOLHOST_LOG_LEVEL=debug"}, "call", "bash", `{"command":"echo hi"}`, "--workspace", t.TempDir())
		if r.code != 0 || !strings.Contains(decodeResult(t, r).Content[0].Text, "hi") {
			t.Fatalf("call bash with %s:\n%s", bin, r)
		}
		return r
	}
	copyFile := func(src, dst string, extra []byte) {
		t.Helper()
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, append(b, extra...), 0o755); err != nil {
			t.Fatal(err)
		}
	}

	if r := call(toolBin); !strings.Contains(r.stderr, "sandbox agent: the agent-only executable") {
		t.Errorf("make build's CLI did not run the agent-only executable:\n%s", r)
	}

	alone := filepath.Join(t.TempDir(), "toolhost")
	copyFile(toolBin, alone, nil)
	if r := call(alone); !strings.Contains(r.stderr, "sandbox agent: this executable") || strings.Contains(r.stderr, "level=WARN msg=\"sandbox agent") {
		t.Errorf("the CLI alone: want its own executable as the agent, quietly:\n%s", r)
	}

	dir := t.TempDir()
	other := filepath.Join(dir, "toolhost")
	copyFile(toolBin, other, nil)
	copyFile(filepath.Join(binDir, "toolhost-sandbox-agent"), filepath.Join(dir, "toolhost-sandbox-agent"), []byte("changed"))
	if r := call(other); !strings.Contains(r.stderr, "level=WARN msg=\"sandbox agent: this executable") || !strings.Contains(r.stderr, "is not the agent this binary was built with") {
		t.Errorf("a CLI beside another agent: want a warning and its own executable as the agent:\n%s", r)
	}
}
