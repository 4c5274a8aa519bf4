//go:build linux

package host_test

// End-to-end tests: the built-in plugins, built from plugins/ for wasip1, run by the real
// host in real bubblewrap sandboxes.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/sandbox/local"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testplugins"
)

var (
	builtinsOnce sync.Once
	builtinSpecs []host.PluginSpec
	builtinErr   error
	e2eDataDir   = testplugins.DataDir() // shared and warm across runs
)

func builtinPlugins(t testing.TB) []host.PluginSpec {
	t.Helper()
	builtinsOnce.Do(func() {
		for _, b := range testplugins.Builtins {
			p, err := testplugins.Build(b.Pkg)
			if err != nil {
				builtinErr = err
				return
			}
			spec := host.PluginSpec{Path: p}
			if b.Pkg == "plugins/editfile" {
				// These tests are of the file tools' mechanics and the host's policy, on
				// files they put in place: the guard (tested at the root) stays out.
				spec.Env = map[string]string{"TOOLHOST_EDITFILE_GUARD": "off"}
			}
			for _, g := range b.Grants {
				spec.Grants = append(spec.Grants, abi.Capability(g))
			}
			builtinSpecs = append(builtinSpecs, spec)
		}
	})
	if builtinErr != nil {
		t.Fatal(builtinErr)
	}
	return builtinSpecs
}

func newHost(t testing.TB) *host.Host {
	t.Helper()
	h, err := host.New(context.Background(), host.Config{DataDir: e2eDataDir, Plugins: builtinPlugins(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	// Plugins found recorded finish loading in the background; tests that measure start
	// from a host that has.
	if err := h.Ready(context.Background()); err != nil {
		t.Fatal(err)
	}
	return h
}

func newProvider(t testing.TB) *local.Provider {
	t.Helper()
	testenv.NeedBwrap(t)
	p, err := local.New(local.Config{RunDir: testenv.RunDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) }) // after the sandboxes (registered later)
	return p
}

// newSandbox creates a local sandbox over a fresh workspace directory.
func newSandbox(t testing.TB, p *local.Provider) (sandbox.Sandbox, string) {
	t.Helper()
	ws := t.TempDir()
	sb, err := p.Create(context.Background(), sandbox.CreateOptions{Workspace: ws})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	return sb, ws
}

type env struct {
	t  *testing.T
	s  *host.Dispatcher
	ws string
}

func newEnv(t *testing.T) *env {
	sb, ws := newSandbox(t, newProvider(t))
	return &env{t: t, s: newHost(t).OpenSession(sb), ws: ws}
}

func (e *env) call(tool, input string) abi.Result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound) // a hang bound: a first call may load its plugin
	defer cancel()
	res, err := e.s.Dispatch(ctx, tool, json.RawMessage(input))
	if err != nil {
		e.t.Fatalf("%s %s: host error %v", tool, input, err)
	}
	return res
}

// expect asserts a call's is_error flag and that its text contains every want.
func (e *env) expect(tool, input string, isErr bool, wants ...string) string {
	e.t.Helper()
	res := e.call(tool, input)
	got := testenv.ResultText(res)
	if res.IsError != isErr {
		e.t.Errorf("%s %s: is_error = %v, want %v; text: %q", tool, input, res.IsError, isErr, got)
	}
	for _, w := range wants {
		if !strings.Contains(got, w) {
			e.t.Errorf("%s %s: text %q does not contain %q", tool, input, got, w)
		}
	}
	return got
}

func (e *env) file(rel string) string {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.ws, rel))
	if err != nil {
		e.t.Fatal(err)
	}
	return string(b)
}

func (e *env) put(rel, content string) {
	e.t.Helper()
	p := filepath.Join(e.ws, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

func TestToolsList(t *testing.T) {
	var names []string
	for _, tl := range newHost(t).Tools() {
		names = append(names, tl.Name)
	}
	if got := strings.Join(names, ","); got != "bash,bash_output,bash_kill,exec_command,write_stdin,read_file,write_file,edit_file,apply_patch,grep,glob,take_screenshot" {
		t.Fatalf("tools = %s", got)
	}
}

func TestFileTools(t *testing.T) {
	e := newEnv(t)
	e.expect("write_file", `{"path":"src/app/main.go","content":"package main\n\nfunc main() {}\n"}`, false,
		"File written: src/app/main.go (29 bytes)")
	if e.file("src/app/main.go") != "package main\n\nfunc main() {}\n" {
		t.Error("write_file did not create the file with its parents")
	}
	e.expect("read_file", `{"path":"src/app/main.go"}`, false, "     1\tpackage main", "     3\tfunc main() {}")
	e.expect("read_file", `{"path":"/home/user/src/app/main.go","offset":3,"limit":1}`, false, "     3\tfunc main() {}")

	var long strings.Builder
	for i := 1; i <= 2500; i++ {
		long.WriteString("line\n")
	}
	e.put("long.txt", long.String())
	got := e.expect("read_file", `{"path":"long.txt"}`, false, "  2000\tline", "2500", "2001")
	if strings.Contains(got, "  2001\tline") {
		t.Error("read_file showed more than the default 2000 lines")
	}
	e.expect("read_file", `{"path":"long.txt","offset":2001}`, false, "  2500\tline")

	e.expect("read_file", `{"path":"missing.txt"}`, true, "Error: could not read missing.txt: ")
	e.expect("read_file", `{"path":"src"}`, true, "is a directory")
	e.put("bin.dat", "ELF\x00\x01\x02binary")
	e.expect("read_file", `{"path":"bin.dat"}`, true, "binary file")

	e.expect("edit_file", `{"path":"src/app/main.go","old_string":"func main() {}","new_string":"func main() { println(1) }"}`, false,
		"File edited: src/app/main.go")
	if !strings.Contains(e.file("src/app/main.go"), "println(1)") {
		t.Error("edit_file did not change the file")
	}
	e.expect("edit_file", `{"path":"nope.go","old_string":"a","new_string":"b"}`, true, "Error: could not read nope.go: ")
	e.expect("edit_file", `{"path":"src/app/main.go","old_string":"absent","new_string":"b"}`, true,
		"Error: old_string not found in src/app/main.go")
	e.put("dup.txt", "x = 1\nx = 1\nx = 1\n")
	e.expect("edit_file", `{"path":"dup.txt","old_string":"x = 1","new_string":"x = 2"}`, true,
		"Error: old_string found 3 times in dup.txt; add surrounding context or set replace_all")
	e.expect("edit_file", `{"path":"dup.txt","old_string":"x = 1","new_string":"x = 2","replace_all":true}`, false, "File edited: dup.txt")
	if e.file("dup.txt") != "x = 2\nx = 2\nx = 2\n" {
		t.Errorf("replace_all gave %q", e.file("dup.txt"))
	}
	e.expect("edit_file", `{"path":"dup.txt","old_string":"same","new_string":"same"}`, true, "Error: old_string and new_string are the same")

	e.put("crlf.txt", "one\r\ntwo\r\nthree\r\n")
	e.expect("edit_file", `{"path":"crlf.txt","old_string":"one\ntwo","new_string":"uno\ndos"}`, false, "File edited: crlf.txt")
	if got := e.file("crlf.txt"); got != "uno\r\ndos\r\nthree\r\n" {
		t.Errorf("CRLF edit gave %q, want CRLF kept", got)
	}
}

func TestFileToolsStayInWorkspace(t *testing.T) {
	e := newEnv(t)
	secret := filepath.Join(t.TempDir(), "secret.txt")
	if err := os.WriteFile(secret, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(e.ws, "link.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(e.ws, "etcdir")); err != nil {
		t.Fatal(err)
	}
	for _, in := range []string{
		`{"path":"../../etc/passwd"}`, `{"path":"/etc/passwd"}`, `{"path":"link.txt"}`,
		`{"path":"etcdir/hostname"}`, `{"path":"/root/.bashrc"}`,
	} {
		got := e.expect("read_file", in, true, "Error: could not read")
		if strings.Contains(got, "host secret") || strings.Contains(got, "root:x:0") {
			t.Errorf("read_file %s leaked: %q", in, got)
		}
	}
	e.expect("write_file", `{"path":"../escape.txt","content":"x"}`, true, "Error: could not write")
	e.expect("write_file", `{"path":"link.txt","content":"overwritten"}`, true, "Error: could not write")
	e.expect("edit_file", `{"path":"link.txt","old_string":"host","new_string":"pwned"}`, true, "Error: could not read")
	if b, _ := os.ReadFile(secret); string(b) != "host secret" {
		t.Fatalf("the host file behind the symlink changed: %q", b)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(e.ws), "escape.txt")); err == nil {
		t.Fatal("write_file ../escape.txt wrote outside the workspace")
	}
}

func TestBash(t *testing.T) {
	e := newEnv(t)
	e.expect("bash", `{"command":"echo hi; echo oops >&2; exit 3"}`, false,
		"$ echo hi; echo oops >&2; exit 3\nhi\n", "[stderr]\noops\n", "[exit 3]")
	e.expect("bash", `{"command":"pwd; id -u; cat /dev/stdin | wc -c"}`, false, "/home/user\n1000\n0\n", "[exit 0]")
	e.expect("bash", `{"command":"printf '\\033[31mred\\033[0m'"}`, false, "red")
	if got := testenv.ResultText(e.call("bash", `{"command":"printf '\\033[31mred\\033[0m'"}`)); strings.Contains(got, "\x1b") {
		t.Errorf("ANSI escapes reached the result: %q", got)
	}

	// The whole process group dies at the deadline, background children included.
	start := time.Now()
	e.expect("bash", `{"command":"sleep 600 & sleep 600","timeout":1}`, true, "[timed out after 1 s]")
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("a 1 s timeout took %s to return", took)
	}
	ps := e.expect("bash", `{"command":"ps -eo comm= | grep -c '^sleep$' || true"}`, false)
	if !strings.Contains(ps, "\n0\n") {
		t.Errorf("sleep processes survived the timeout: %q", ps)
	}
	e.expect("bash", `{"command":"true","timeout":100000}`, true, "timeout: must be at most 600") // the schema's maximum

	// Background processes outlive the call and keep logging.
	got := e.expect("bash", `{"command":"for i in 1 2 3; do echo tick $i; sleep 0.1; done; sleep 600","background":true}`, false,
		"Started in background")
	_, after, _ := strings.Cut(got, "log ")
	logPath := strings.TrimRight(strings.Fields(after)[0], ",.;")
	var out string
	if !testenv.Eventually(func() bool {
		out = testenv.ResultText(e.call("bash", `{"command":"cat `+logPath+`"}`))
		return strings.Contains(out, "tick 3")
	}) {
		t.Fatalf("background log %s never showed tick 3: %q", logPath, out)
	}
}

func TestBashOutputFloodIsCapped(t *testing.T) {
	e := newEnv(t)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	got := e.expect("bash", `{"command":"head -c 100000000 /dev/zero | tr '\\0' x"}`, false, "[exit 0]", "cut")
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if n := len([]rune(got)); n > host.MaxTextChars+500 {
		t.Errorf("a 100 MB flood gave %d characters", n)
	}
	// The host never holds the flood: its total allocation over the call stays at a
	// few MB although 100 MB went through the command's stdout.
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 32<<20 {
		t.Errorf("the host allocated %d MB for a 100 MB flood; output is not capped at the source", grew>>20)
	}
	e.expect("bash", `{"command":"yes","timeout":2}`, true, "[timed out after 2 s]")
}

func TestSearchTools(t *testing.T) {
	e := newEnv(t)
	e.put("a/one.go", "package a\n// TODO: first\nfunc One() {}\n")
	e.put("a/b/two.go", "package b\n// todo: second\n")
	e.put("notes.md", "no match here\n$(touch pwned); 'quoted' -rf\n")
	e.put("node_modules/x/index.js", "// TODO: vendored\n")
	e.put(".git/config", "TODO in git\n")

	got := e.expect("grep", `{"pattern":"TODO"}`, false, "a/one.go:2:// TODO: first")
	if strings.Contains(got, "node_modules") || strings.Contains(got, ".git") {
		t.Errorf("grep searched node_modules or .git: %q", got)
	}
	e.expect("grep", `{"pattern":"todo","ignore_case":true,"output_mode":"files_with_matches"}`, false, "a/b/two.go", "a/one.go")
	e.expect("grep", `{"pattern":"TODO","output_mode":"count"}`, false, "a/one.go:1")
	e.expect("grep", `{"pattern":"func","glob":"**/*.go","context":1}`, false, "a/one.go-2-// TODO: first")
	e.expect("grep", `{"pattern":"nothing-like-this"}`, false, "[grep: no matches found]")
	e.expect("grep", `{"pattern":"(unclosed"}`, true, "Error:")
	// The pattern is data: nothing runs, and shell syntax is searched for as text.
	e.expect("grep", `{"pattern":"\\$\\(touch pwned\\); 'quoted'"}`, false, "notes.md:2:")
	e.expect("grep", `{"pattern":"-rf"}`, false, "notes.md:2:")
	e.expect("grep", `{"pattern":"$(touch /home/user/pwned2)"}`, false)
	if _, err := os.Stat(filepath.Join(e.ws, "pwned2")); err == nil {
		t.Fatal("a grep pattern ran as a shell command")
	}

	e.expect("glob", `{"pattern":"**/*.go"}`, false, "a/b/two.go\na/one.go")
	e.expect("glob", `{"pattern":"*.md"}`, false, "notes.md")
	e.expect("glob", `{"pattern":"**/*.rs"}`, false, "[glob: no files matched]")
	e.expect("glob", `{"pattern":"*.go","path":"a"}`, false, "one.go")
}

func TestUnknownToolAndBadInput(t *testing.T) {
	e := newEnv(t)
	e.expect("frobnicate", `{}`, true, "[frobnicate: unknown tool]")
	e.expect("read_file", `{"file":"x"}`, true, "[read_file: invalid input: ")
	e.expect("read_file", `{"path":"x","offset":0}`, true, "offset: must be at least 1")
	e.expect("grep", `{"pattern":"x","output_mode":"lines"}`, true, "output_mode: must be one of")
}

func TestConcurrentSessions(t *testing.T) {
	h := newHost(t)
	p := newProvider(t)
	var wg sync.WaitGroup
	for i := range 16 {
		sb, ws := newSandbox(t, p)
		s := h.OpenSession(sb)
		wg.Go(func() {
			ctx := context.Background()
			name := filepath.Join("dir", strings.Repeat("f", i+1)+".txt")
			content := strings.Repeat("session data\n", i+1)
			in, _ := json.Marshal(map[string]string{"path": name, "content": content})
			if res, err := s.Dispatch(ctx, "write_file", in); err != nil || res.IsError {
				t.Errorf("session %d write: %+v %v", i, res, err)
				return
			}
			res, err := s.Dispatch(ctx, "bash", json.RawMessage(`{"command":"wc -l < `+name+`"}`))
			if err != nil || !strings.Contains(testenv.ResultText(res), strings.TrimSpace(strings.Repeat(" ", 0))+itoa(i+1)+"\n") {
				t.Errorf("session %d bash: %q %v", i, testenv.ResultText(res), err)
			}
			res, err = s.Dispatch(ctx, "grep", json.RawMessage(`{"pattern":"session","output_mode":"count"}`))
			if err != nil || !strings.Contains(testenv.ResultText(res), ":"+itoa(i+1)) {
				t.Errorf("session %d grep: %q %v", i, testenv.ResultText(res), err)
			}
			if b, err := os.ReadFile(filepath.Join(ws, name)); err != nil || string(b) != content {
				t.Errorf("session %d: workspace holds %q, %v", i, b, err)
			}
		})
	}
	wg.Wait()
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

// 16 concurrent edit_file calls on one file lose no edit: each one's read-modify-write is
// checked against the version it read, and redone when another edit won the race.
func TestConcurrentEditsLoseNothing(t *testing.T) {
	e := newEnv(t)
	var lines []string
	for i := range 16 {
		lines = append(lines, fmt.Sprintf("slot-%02d", i))
	}
	e.put("shared.txt", strings.Join(lines, "\n")+"\n")
	var wg sync.WaitGroup
	errs := make(chan string, 16)
	for i := range 16 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
			defer cancel()
			in := fmt.Sprintf(`{"path":"shared.txt","old_string":"slot-%02d","new_string":"done-%02d"}`, i, i)
			res, err := e.s.Dispatch(ctx, "edit_file", json.RawMessage(in))
			if err != nil || res.IsError {
				errs <- fmt.Sprintf("edit %d: %v %s", i, err, testenv.ResultText(res))
			}
		})
	}
	wg.Wait()
	close(errs)
	for msg := range errs {
		t.Error(msg)
	}
	got := e.file("shared.txt")
	for i := range 16 {
		if !strings.Contains(got, fmt.Sprintf("done-%02d", i)) {
			t.Errorf("edit %d was lost:\n%s", i, got)
		}
	}
}

// write_file refuses a FIFO at once, and says so in words.
func TestWriteFileRefusesAFIFO(t *testing.T) {
	e := newEnv(t)
	e.expect("bash", `{"command":"mkfifo pipe && echo made"}`, false, "made")
	e.expect("write_file", `{"path":"pipe","content":"x"}`, true, "pipe", "not a regular file")
	e.expect("read_file", `{"path":"pipe"}`, true, "pipe")
}

// The timeouts configured on the host are bash's: a call without one runs under the
// configured default and reports that one when killed, the maximum bounds a call, and the
// tool's description says both. (Through the library, with a 2 s maximum, nothing says 10
// or 600.)
func TestBashTimeoutsAsConfigured(t *testing.T) {
	h, err := host.New(context.Background(), host.Config{DataDir: e2eDataDir, Plugins: builtinPlugins(t),
		DefaultExecTimeout: 1500 * time.Millisecond, MaxExecTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	for _, tool := range h.Tools() {
		if tool.Name == "bash" {
			if !strings.Contains(tool.Description, "default 1.5, at most 2)") || strings.Contains(tool.Description, "600") {
				t.Errorf("bash's description does not say the configured timeouts: %s", tool.Description)
			}
			if !strings.Contains(string(tool.InputSchema), `"default": 1,`) || !strings.Contains(string(tool.InputSchema), `"maximum": 2,`) {
				t.Errorf("schema: %s", tool.InputSchema)
			}
		}
	}
	sb, _ := newSandbox(t, newProvider(t))
	e := &env{t: t, s: h.OpenSession(sb)}
	e.expect("bash", `{"command":"echo started; sleep 30"}`, true, "started\n", "[timed out after 1.5 s]")
	e.expect("bash", `{"command":"sleep 30","timeout":10}`, true, "timeout: must be at most 2")
	e.expect("bash", `{"command":"sleep 30","timeout":2}`, true, "[timed out after 2 s]")
}

// noticeSandbox has something to tell the agent once.
type noticeSandbox struct {
	sandbox.Sandbox
	mu     sync.Mutex
	notice string
}

func (n *noticeSandbox) Notice() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.notice
	n.notice = ""
	return s
}

// A sandbox's notice (a session's: the processes a rotation restarted) is appended to the
// next tool result as a text block, once.
func TestNoticeReachesTheNextResultOnce(t *testing.T) {
	sb, _ := newSandbox(t, newProvider(t))
	ns := &noticeSandbox{Sandbox: sb, notice: "[Note: restarted bg-1]"}
	e := &env{t: t, s: newHost(t).OpenSession(ns)}
	res := e.call("bash", `{"command":"echo hi"}`)
	if n := len(res.Content); n != 2 || res.Content[1].Text != "[Note: restarted bg-1]" || !strings.Contains(res.Content[0].Text, "hi") {
		t.Errorf("first result: %+v", res.Content)
	}
	if res := e.call("bash", `{"command":"echo hi"}`); len(res.Content) != 1 {
		t.Errorf("the notice came twice: %+v", res.Content)
	}
}
