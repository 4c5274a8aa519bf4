//go:build linux

package e2b_test

// Every tool through the host on an E2B sandbox: the built-in plugins (real wasm, built
// from plugins/) dispatched by the real host into an e2b sandbox on the fake.

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/capture"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/sandbox/e2b/e2bfake"
	"github.com/toolhost/toolhost/internal/screenshot"
	"github.com/toolhost/toolhost/internal/store/dir"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testplugins"
)

var (
	builtinsOnce sync.Once
	builtinSpecs []host.PluginSpec
	builtinErr   error
)

func builtins(t testing.TB) []host.PluginSpec {
	t.Helper()
	builtinsOnce.Do(func() {
		for _, b := range testplugins.Builtins {
			p, err := testplugins.Build(b.Pkg)
			if err != nil {
				builtinErr = err
				return
			}
			spec := host.PluginSpec{Path: p}
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

// capturer is the browser for take_screenshot; absent, the test skips (fails with CI=true).
func capturer(t testing.TB) *screenshot.Capturer {
	t.Helper()
	c := screenshot.New(screenshot.Config{IdleBound: 2 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err := c.Check(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: no browser to capture with: %v", err)
		}
		t.Skipf("no browser to capture with (make test installs Chromium and the driver): %v", err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func needPython(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: python3 serves the dev server in the sandbox: %v", err)
		}
		t.Skipf("python3 serves the dev server in the sandbox and is not installed: %v", err)
	}
}

type toolEnv struct {
	t *testing.T
	s *host.Dispatcher
}

func (e *toolEnv) call(tool, input string) abi.Result {
	e.t.Helper()
	// A hang bound: a capture alone took 87 s at load 30, past the 90 s this once was.
	ctx, cancel := context.WithTimeout(context.Background(), 3*testenv.HangBound)
	defer cancel()
	res, err := e.s.Dispatch(ctx, tool, json.RawMessage(input))
	if err != nil {
		e.t.Fatalf("%s %s: host error %v", tool, input, err)
	}
	return res
}

func (e *toolEnv) expect(tool, input string, isErr bool, wants ...string) string {
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

func TestEveryToolThroughTheHost(t *testing.T) {
	needPython(t)
	capt := capturer(t)
	f := startFake(t, byHost, e2bfake.Config{})
	p := newProvider(t, providerConfig(t, f, byHost))
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	st, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rec := &screenshot.Recorder{Capturer: capt, Store: st}
	h, err := host.New(context.Background(), host.Config{DataDir: testplugins.DataDir(), Plugins: builtins(t), Capturer: capture.Of(rec), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	e := &toolEnv{t: t, s: h.OpenSession(sb, host.WithProject("e2b"))}

	// Files.
	e.expect("write_file", `{"path":"src/app/main.go","content":"package main\n\nfunc main() {}\n"}`, false, "File written: src/app/main.go (29 bytes)")
	e.expect("read_file", `{"path":"src/app/main.go"}`, false, "     1\tpackage main", "     3\tfunc main() {}")
	e.expect("read_file", `{"path":"/home/user/src/app/main.go","offset":3,"limit":1}`, false, "     3\tfunc main() {}")
	e.expect("read_file", `{"path":"missing.txt"}`, true, "Error: could not read missing.txt: ")
	e.expect("read_file", `{"path":"src"}`, true, "is a directory")
	e.expect("edit_file", `{"path":"src/app/main.go","old_string":"func main() {}","new_string":"func main() { println(1) }"}`, false, "File edited: src/app/main.go")
	e.expect("read_file", `{"path":"src/app/main.go"}`, false, "println(1)")
	e.expect("edit_file", `{"path":"src/app/main.go","old_string":"absent","new_string":"b"}`, true, "Error: old_string not found in src/app/main.go")
	// The workspace rule holds on E2B too.
	e.expect("bash", `{"command":"ln -s /etc/passwd link.txt && ln -s /etc etcdir"}`, false, "[exit 0]")
	for _, in := range []string{`{"path":"../../etc/passwd"}`, `{"path":"/etc/passwd"}`, `{"path":"link.txt"}`, `{"path":"etcdir/hostname"}`} {
		if got := e.expect("read_file", in, true, "Error: could not read"); strings.Contains(got, "root:x:0") {
			t.Errorf("read_file %s leaked: %q", in, got)
		}
	}
	e.expect("write_file", `{"path":"link.txt","content":"overwritten"}`, true, "Error: could not write")

	// Commands.
	e.expect("bash", `{"command":"echo hi; echo oops >&2; exit 3"}`, false, "hi\n", "[stderr]\noops\n", "[exit 3]")
	e.expect("bash", `{"command":"pwd; id -un; cat /dev/stdin | wc -c"}`, false, "/home/user\nuser\n0\n", "[exit 0]")
	e.expect("bash", `{"command":"sleep 600 & sleep 600","timeout":1}`, true, "[timed out after 1 s]")
	if ps := e.expect("bash", `{"command":"ps -eo comm= | grep -c '^sleep$' || true"}`, false); !strings.Contains(ps, "\n0\n") {
		t.Errorf("sleep processes survived the timeout: %q", ps)
	}
	got := e.expect("bash", `{"command":"for i in 1 2 3; do echo tick $i; sleep 0.1; done; sleep 600","background":true}`, false, "Started in background")
	_, after, _ := strings.Cut(got, "log ")
	logPath := strings.TrimRight(strings.Fields(after)[0], ",.;")
	if !testenv.Eventually(func() bool {
		return strings.Contains(testenv.ResultText(e.call("bash", `{"command":"cat `+logPath+`"}`)), "tick 3")
	}) {
		t.Errorf("background log %s never showed tick 3", logPath)
	}

	// Search.
	e.expect("write_file", `{"path":"a/one.go","content":"package a\n// TODO: first\n"}`, false)
	e.expect("write_file", `{"path":"node_modules/x/index.js","content":"// TODO: vendored\n"}`, false)
	if got := e.expect("grep", `{"pattern":"TODO"}`, false, "a/one.go:2:// TODO: first"); strings.Contains(got, "node_modules") {
		t.Errorf("grep searched node_modules: %q", got)
	}
	e.expect("glob", `{"pattern":"**/*.go"}`, false, "a/one.go\nsrc/app/main.go")
	e.expect("glob", `{"pattern":"**/*.rs"}`, false, "[glob: no files matched]")

	// A screenshot of a dev server in the sandbox, through E2B's preview host.
	e.expect("write_file", `{"path":"site/index.html","content":"<!doctype html><body style=\"margin:0;background:#3366cc\"><h1>e2b</h1></body>"}`, false)
	e.expect("bash", `{"command":"cd site && exec python3 -m http.server 8000","background":true}`, false, "Started in background")
	var res abi.Result
	if !testenv.Eventually(func() bool { res = e.call("take_screenshot", `{"port":8000}`); return !res.IsError }) {
		t.Fatalf("take_screenshot: %q", testenv.ResultText(res))
	}
	if len(res.Content) != 3 || res.Content[0].Type != abi.ContentImage || !strings.Contains(res.Content[2].Text, "desktop 1280x800") {
		t.Errorf("take_screenshot: %+v", res.Content)
	}
	e.expect("take_screenshot", `{"port":8001}`, true, "8001")
}
