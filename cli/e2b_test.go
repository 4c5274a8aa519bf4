package cli

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	e2bfakeOnce sync.Once
	e2bfakeBin  string
	e2bfakeErr  error
)

// startE2BFake runs cmd/e2bfake, the fake E2B on its own, as E2B's users would: it prints
// the variables the official SDKs read, which are returned, and serves until the test
// ends (SIGTERM: it kills its sandboxes and exits).
func startE2BFake(t testing.TB, args ...string) []string {
	t.Helper()
	requireBwrap(t) // its sandboxes are local ones
	e2bfakeOnce.Do(func() {
		e2bfakeBin = filepath.Join(binDir, "e2bfake")
		cmd := exec.Command("go", "build", "-o", e2bfakeBin, "./cmd/e2bfake")
		cmd.Dir = moduleRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			e2bfakeErr = fmt.Errorf("go build ./cmd/e2bfake: %v\n%s", err, out)
		}
	})
	if e2bfakeErr != nil {
		t.Fatal(e2bfakeErr)
	}
	cmd := exec.Command(e2bfakeBin, append([]string{"-listen", "127.0.0.1:0"}, args...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("e2bfake: %v", err)
			}
		case <-time.After(2 * time.Minute):
			cmd.Process.Kill()
			t.Errorf("e2bfake did not stop on SIGTERM")
			<-exited
		}
	})
	// The reader goroutine is owned by this test: it ends when e2bfake closes its stdout
	// (exits: the cleanup above stops it), and then reaps it. It never blocks on the
	// channel, which holds more than the few lines e2bfake prints.
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	var env []string
	for len(env) < 4 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("e2bfake exited after printing %v", env)
			}
			kv, ok := strings.CutPrefix(l, "export ")
			if !ok || !strings.HasPrefix(kv, "E2B_") {
				t.Fatalf("e2bfake printed %q, want export E2B_...=...", l)
			}
			env = append(env, kv)
		case <-time.After(time.Minute):
			t.Fatal("e2bfake printed no environment within a minute")
		}
	}
	return env
}

// e2bDataDir is a data dir of the test's own (the quota ledger is in it) that shares the
// compilation cache.
func e2bDataDir(t testing.TB) string {
	d := t.TempDir()
	if err := os.MkdirAll(filepath.Join(testDataDir, "cache"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(testDataDir, "cache"), filepath.Join(d, "cache")); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestCallOnE2B: `toolhost call` with sandbox.provider e2b, against cmd/e2bfake pointed
// at by the official SDKs' variables: each call is a session on a new E2B sandbox that
// wakes from the project's snapshot and commits a new one; toolhost quota counts them.
// Without a key the call fails with E2B's own words; e2b,local then runs here.
func TestCallOnE2B(t *testing.T) {
	t.Parallel()
	fake := startE2BFake(t)
	env := append([]string{"TOOLHOST_SANDBOX_PROVIDER=e2b", "TOOLHOST_DATA_DIR=" + e2bDataDir(t)}, fake...)
	project := "cli-e2b"
	r := runCLI(t, env, "call", "write_file", `{"path":"notes.txt","content":"written on E2B\n"}`, "--project", project)
	if r.code != 0 || decodeResult(t, r).IsError {
		t.Fatalf("write_file on e2b:\n%s", r)
	}
	r = runCLI(t, env, "call", "bash", `{"command":"cat notes.txt; echo provider=$TOOLHOST_SANDBOX_PROVIDER"}`, "--project", project)
	if r.code != 0 {
		t.Fatalf("bash on e2b:\n%s", r)
	}
	if text := decodeResult(t, r).Content[0].Text; !strings.Contains(text, "written on E2B\nprovider=e2b") {
		t.Errorf("the second call, in a new E2B sandbox woken from the snapshot, sees %q", text)
	}

	// Two sessions, one sandbox each, both closed.
	r = runCLI(t, env, "quota", "--live")
	if r.code != 0 {
		t.Fatalf("quota:\n%s", r)
	}
	for _, want := range []string{"plan hobby", "sandboxes created  2", "running now        0 of 20", project, "running now at E2B (the team's, every host): 0"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("quota does not say %q:\n%s", want, r)
		}
	}
	if strings.Contains(r.stdout, "WARNING") || r.stderr != "" {
		t.Errorf("quota warns:\n%s", r)
	}

	// No key: E2B's words, one line; with e2b,local the call runs here.
	noKey := []string{"E2B_API_KEY=", "TOOLHOST_DATA_DIR=" + e2bDataDir(t)}
	oneLineError(t, runCLI(t, append(noKey, "TOOLHOST_SANDBOX_PROVIDER=e2b"), "call", "bash", `{"command":"true"}`), 1,
		"create sandbox: E2B API key not configured")
	r = runCLI(t, append(noKey, "TOOLHOST_SANDBOX_PROVIDER=e2b,local", "TOOLHOST_LOG_LEVEL=warn"), "call", "bash", `{"command":"echo provider=$TOOLHOST_SANDBOX_PROVIDER."}`)
	if r.code != 0 || !strings.Contains(decodeResult(t, r).Content[0].Text, "provider=.") ||
		!strings.Contains(r.stderr, `reason="E2B API key not configured"`) {
		t.Errorf("e2b,local without a key:\n%s", r)
	}
}

// TestQuotaWithoutE2B: quota says so when the configuration creates no E2B sandboxes.
func TestQuotaWithoutE2B(t *testing.T) {
	t.Parallel()
	r := runCLI(t, []string{"TOOLHOST_DATA_DIR=" + e2bDataDir(t)}, "quota")
	if r.code != 0 || !strings.Contains(r.stdout, "sandboxes created  0") || !strings.Contains(r.stderr, "creates no E2B sandboxes") {
		t.Errorf("quota with the local provider:\n%s", r)
	}
}
