//go:build linux

package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"github.com/toolhost/toolhost"
	"image"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "golang.org/x/image/webp"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/daemon"
	"github.com/toolhost/toolhost/internal/sessionapi"
	"github.com/toolhost/toolhost/internal/testenv"
)

// sessionEnv is a test's own runtime directory (so its own session daemon) and store.
type sessionEnv struct {
	t   *testing.T
	env []string
	dir string // the daemon's directory
}

func newSessionEnv(t *testing.T) *sessionEnv {
	t.Helper()
	testStore(t)                          // made first, so removed after the daemon is gone (cleanups run last first)
	rt, err := os.MkdirTemp("", "th-rt-") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(rt) })
	return sessionEnvIn(t, rt)
}

// sessionEnvIn is a sessionEnv whose runtime directory is rt (made 0700): the daemon's
// directory is rt/toolhost.
func sessionEnvIn(t *testing.T, rt string) *sessionEnv {
	t.Helper()
	testStore(t)
	os.Chmod(rt, 0o700)
	e := &sessionEnv{t: t, env: []string{"XDG_RUNTIME_DIR=" + rt}, dir: filepath.Join(rt, "toolhost")}
	t.Cleanup(func() {
		e.stopDaemon()
		if t.Failed() {
			if b, err := os.ReadFile(daemon.LogPath(e.dir)); err == nil {
				t.Logf("the daemon's log:\n%s", b)
			}
		}
	})
	return e
}

func (e *sessionEnv) run(args ...string) runResult {
	e.t.Helper()
	return runCLI(e.t, e.env, args...)
}

// client talks to the test's daemon directly.
func (e *sessionEnv) client() *sessionapi.Client {
	sock := daemon.SocketPath(e.dir)
	return sessionapi.NewClient(func(ctx context.Context) (net.Conn, error) { return daemon.DialContext(ctx, sock) }, "")
}

// stopDaemon stops every session and the daemon, and waits for it to be gone: no test
// leaves a process behind.
func (e *sessionEnv) stopDaemon() {
	cl := e.client()
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	info, err := cl.Info(ctx)
	cancel()
	if err != nil {
		return
	}
	runCLI(e.t, e.env, "session", "stop", "--all")
	if p, err := os.FindProcess(info.PID); err == nil {
		p.Signal(syscall.SIGTERM)
	}
	waitGone(e.t, info.PID, e.dir)
}

// waitGone waits (a hang bound, not a timing) for the daemon to exit and its socket to go.
func waitGone(t testing.TB, pid int, dir string) {
	t.Helper()
	if testenv.Eventually(func() bool {
		_, serr := os.Stat(daemon.SocketPath(dir))
		return syscall.Kill(pid, 0) != nil && os.IsNotExist(serr)
	}) {
		return
	}
	t.Errorf("the session daemon (pid %d) is still there after %s", pid, testenv.HangBound)
	syscall.Kill(pid, syscall.SIGKILL)
}

func (e *sessionEnv) call(id, tool, input string) abi.Result {
	e.t.Helper()
	r := e.run("call", "--session", id, tool, input)
	if r.code != 0 {
		e.t.Fatalf("call --session %s %s: %s", id, tool, r)
	}
	res := decodeResult(e.t, r)
	if res.IsError {
		e.t.Fatalf("call --session %s %s %s: an error result: %+v", id, tool, input, res)
	}
	return res
}

// centre decodes the images of a take_screenshot result and returns the colour of the
// desktop image's centre, as r,g,b bytes.
func centre(t *testing.T, res abi.Result) [3]uint8 {
	t.Helper()
	for _, c := range res.Content {
		if c.Type != abi.ContentImage {
			continue
		}
		raw, err := base64.StdEncoding.DecodeString(c.Source.Data)
		if err != nil {
			t.Fatal(err)
		}
		img, _, err := image.Decode(bytes.NewReader(raw))
		if err != nil {
			t.Fatalf("the screenshot does not decode: %v", err)
		}
		b := img.Bounds()
		r, g, bl, _ := img.At(b.Dx()/2, b.Dy()/2).RGBA()
		return [3]uint8{uint8(r >> 8), uint8(g >> 8), uint8(bl >> 8)}
	}
	t.Fatalf("no image in the screenshot's result: %+v", res)
	return [3]uint8{}
}

// TestSessionSeedFlow: the product's own flow from the shell. A held session keeps its
// sandbox between calls, so a dev server started in the background is still there for
// take_screenshot; an edit shows in the next screenshot; the work is committed; a plain
// call of the project goes to its session; stop ends it and the daemon exits once idle.
func TestSessionSeedFlow(t *testing.T) {
	requireBwrap(t)
	requireBrowser(t)
	t.Parallel()
	e := newSessionEnv(t)
	project := "seed"

	// The idle bound is short enough to see the daemon go, long enough that a loaded machine
	// still finds it up for the call right after the stop.
	r := e.run("session", "start", "--project", project, "--daemon-exit-idle", "15s")
	if r.code != 0 {
		t.Fatalf("session start: %s", r)
	}
	id := strings.TrimSpace(r.stdout)
	if !strings.HasPrefix(id, project+"-") || strings.Contains(id, "\n") {
		t.Fatalf("session start printed %q, want one id", r.stdout)
	}
	if !strings.Contains(r.stderr, "ready in") {
		t.Errorf("session start says nothing of the session: %s", r)
	}

	page := func(colour string) string {
		b, _ := json.Marshal(map[string]string{"path": "site/index.html",
			"content": "<!doctype html><html><body style=\"margin:0;background:" + colour + "\"><h1>shop</h1></body></html>"})
		return string(b)
	}
	e.call(id, "write_file", page("#ff0000"))
	e.call(id, "bash", `{"command":"cd site && exec python3 -m http.server 8000","background":true}`)
	e.call(id, "bash", `{"command":"for i in $(seq 300); do (exec 3<>/dev/tcp/127.0.0.1/8000) 2>/dev/null && exit 0; sleep 0.1; done; exit 1"}`)
	first := centre(t, e.call(id, "take_screenshot", `{"port":8000}`))
	if first != [3]uint8{255, 0, 0} {
		t.Errorf("the first screenshot's centre is %v, want the page's red", first)
	}
	e.call(id, "edit_file", `{"path":"site/index.html","old_string":"#ff0000","new_string":"#0000ff"}`)
	second := centre(t, e.call(id, "take_screenshot", `{"port":8000}`))
	if second != [3]uint8{0, 0, 255} {
		t.Errorf("after the edit the screenshot's centre is %v, want the page's blue (first %v)", second, first)
	}

	// The project's one held session takes a plain call: the server runs there.
	r = e.run("call", "--project", project, "bash", `{"command":"(exec 3<>/dev/tcp/127.0.0.1/8000) && echo listening"}`)
	if res := decodeResult(t, r); r.code != 0 || res.IsError || !strings.Contains(res.Content[0].Text, "listening") {
		t.Errorf("call --project %s did not reach the held session: %s", project, r)
	}

	r = e.run("session", "commit", id, "--label", "blue page")
	if r.code != 0 || !strings.Contains(r.stdout, "projects/"+project+"/snapshots/") {
		t.Fatalf("session commit: %s", r)
	}
	r = e.run("session", "list", "--format", "json")
	var list sessionapi.List
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &list) != nil || len(list.Sessions) != 1 ||
		list.Sessions[0].ID != id || list.Sessions[0].Calls != 7 {
		t.Fatalf("session list --format json: %s", r)
	}
	r = e.run("session", "list")
	if r.code != 0 || !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "(private)") {
		t.Errorf("session list: %s", r)
	}

	cl := e.client()
	info, err := cl.Info(context.Background())
	cl.Close()
	if err != nil {
		t.Fatal(err)
	}
	r = e.run("session", "stop", id)
	if r.code != 0 || !strings.Contains(r.stdout, "stopped "+id) {
		t.Fatalf("session stop: %s", r)
	}
	// A call to the ended session says what became of it (exit 2).
	oneLineError(t, e.run("call", "--session", id, "bash", `{"command":"true"}`), 2, "has ended (it was stopped)")
	// The work outlives the session: the project's newest snapshot has the blue page.
	ws := t.TempDir()
	if r := e.run("snapshot", "restore", "--project", project, "--workspace", ws); r.code != 0 {
		t.Fatalf("snapshot restore: %s", r)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "site", "index.html")); err != nil || !strings.Contains(string(b), "#0000ff") {
		t.Errorf("the committed page: %q, %v", b, err)
	}
	// With nothing held, the daemon exits after its idle bound (15s here).
	waitGone(t, info.PID, e.dir)
	// Then no session runs, and a call to one says so.
	oneLineError(t, e.run("call", "--session", id, "bash", `{"command":"true"}`), 2, "session daemon is not running")
	if r := e.run("session", "list"); r.code != 0 || r.stdout != "" {
		t.Errorf("session list with no daemon: %s", r)
	}
}

// TestSessionTwoShells: two shells call one session at once. The first call waits for a
// file the second creates: were calls taken one at a time, it would wait its whole bound
// and fail.
func TestSessionTwoShells(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	e := newSessionEnv(t)
	r := e.run("session", "start", "--project", "two-shells")
	if r.code != 0 {
		t.Fatalf("session start: %s", r)
	}
	id := strings.TrimSpace(r.stdout)
	var wg sync.WaitGroup
	var first runResult
	wg.Go(func() {
		first = e.run("call", "--session", id, "bash",
			`{"command":"touch started; for i in $(seq 600); do [ -f go ] && echo saw it && exit 0; sleep 0.1; done; exit 1","timeout":120}`)
	})
	// The second shell, once the first call runs (it made its file).
	testenv.WaitFor(t, "the first call to show up in the sandbox", func() bool {
		r := e.run("call", "--session", id, "bash", `{"command":"[ -f started ] && touch go && echo touched"}`)
		res := decodeResult(t, r)
		return !res.IsError && strings.Contains(res.Content[0].Text, "touched")
	})
	wg.Wait()
	if res := decodeResult(t, first); first.code != 0 || res.IsError || !strings.Contains(res.Content[0].Text, "saw it") {
		t.Errorf("the first shell's call: %s", first)
	}
	// An unknown tool and an unknown session are the caller's mistakes (exit 2).
	oneLineError(t, e.run("call", "--session", id, "no_such_tool", `{}`), 2, `unknown tool "no_such_tool"`)
	oneLineError(t, e.run("call", "--session", "nope-000000", "bash", `{}`), 2, "no session nope-000000 (running: "+id+")")
	// A second session of the project: a plain call no longer knows which to take.
	r = e.run("session", "start", "--project", "two-shells", "--format", "json")
	var second sessionapi.Held
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &second) != nil || second.ID == id {
		t.Fatalf("a second session start: %s", r)
	}
	oneLineError(t, e.run("call", "--project", "two-shells", "bash", `{"command":"true"}`), 2, "has 2 sessions")
	if r := e.run("session", "stop", "--all"); r.code != 0 || strings.Count(r.stdout, "stopped ") != 2 {
		t.Errorf("session stop --all: %s", r)
	}
}

// TestSessionDaemonRefusesOtherUsers: the daemon's socket is 0600 in a 0700 directory, so
// another user cannot connect; and were the modes opened, the daemon itself refuses a
// peer of another uid (SO_PEERCRED) without answering. A session start with another
// configuration is refused too.
func TestSessionDaemonRefusesOtherUsers(t *testing.T) {
	requireBwrap(t)
	if os.Geteuid() != 0 {
		testenv.Skipf(t, "this test connects as another user (nobody), which needs root")
	}
	py := "/usr/bin/python3" // Debian's: one nobody may run (not a shim under /root)
	if _, err := os.Stat(py); err != nil {
		testenv.Skipf(t, "python3 is not installed (scripts/setup.sh installs it): %v", err)
	}
	t.Parallel()
	e := newSessionEnv(t)
	r := e.run("session", "start", "--project", "uids")
	if r.code != 0 {
		t.Fatalf("session start: %s", r)
	}
	sock := daemon.SocketPath(e.dir)
	st, err := os.Stat(sock)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the socket's mode is %v (%v), want 0600", st.Mode().Perm(), err)
	}
	// As nobody: connect, send a request, print what comes back.
	probe := func() string {
		t.Helper()
		cmd := exec.Command(py, "-c", `
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("connect:", e.strerror); sys.exit(0)
try:
    s.sendall(b"GET /v1/sessions HTTP/1.1\r\nHost: x\r\n\r\n")
except OSError as e:
    print("send:", e.strerror); sys.exit(0)
s.settimeout(60)
try:
    print("answer:", repr(s.recv(4096)))
except OSError as e:
    print("recv:", e)
`, sock)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("the probe as nobody: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if got := probe(); !strings.Contains(got, "connect: Permission denied") {
		t.Errorf("as nobody, with the modes as made: %q, want the connect refused", got)
	}
	// Open the way, as a careless chmod would: the daemon still answers nobody nothing.
	rt := filepath.Dir(e.dir)
	for _, p := range []struct {
		path string
		mode os.FileMode
	}{{rt, 0o711}, {e.dir, 0o711}, {sock, 0o666}} {
		if err := os.Chmod(p.path, p.mode); err != nil {
			t.Fatal(err)
		}
	}
	got := probe()
	os.Chmod(sock, 0o600)
	os.Chmod(e.dir, 0o700)
	// Closed unanswered: at once (the send finds the pipe broken), while the request is read
	// (reset), or after it (end of file).
	if got != "answer: b''" && !strings.Contains(got, "Connection reset") && got != "send: Broken pipe" {
		t.Errorf("as nobody, with the socket open to all: %q, want the connection closed unanswered", got)
	}
	if b, _ := os.ReadFile(daemon.LogPath(e.dir)); !strings.Contains(string(b), "refused a connection from another user") ||
		!strings.Contains(string(b), "peer_uid=65534") {
		t.Errorf("the daemon's log does not record the refusal:\n%s", b)
	}
	// Still serving its own user.
	if r := e.run("session", "list"); r.code != 0 || !strings.Contains(r.stdout, "uids-") {
		t.Errorf("session list after the refusal: %s", r)
	}
	// Another configuration (another store) may not start a session in this daemon.
	r = runCLI(t, append(e.env, "TOOLHOST_STORE_DIR="+t.TempDir()), "session", "start", "--project", "uids")
	oneLineError(t, r, 1, "runs with another configuration")
}

// TestConfigDigest: the digest sees every key, a module's (store.dir) as well as the
// root's, and not the project, which each session names.
func TestConfigDigest(t *testing.T) {
	base := toolhost.DefaultConfig()
	d := configDigest(base)
	if d == "" {
		t.Fatal("no digest for the default configuration")
	}
	other := toolhost.DefaultConfig()
	other.Project, other.LogFormat = "another", "json"
	if configDigest(other) != d {
		t.Error("the project or the log format changes the digest")
	}
	if err := other.Set("store.dir", t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if configDigest(other) == d {
		t.Error("store.dir does not change the digest")
	}
}
