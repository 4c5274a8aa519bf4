//go:build linux

package cli

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/internal/daemon"
	"github.com/toolhost/toolhost/internal/testenv"
)

// TestWorkspaceHoldingTheDaemonIsRefused: a workspace that holds the runtime dir, and so
// the session daemon's directory, is refused before any sandbox or daemon starts: its
// sandbox, running as this user, could reach the daemon's socket and open sessions on any
// host directory.
func TestWorkspaceHoldingTheDaemonIsRefused(t *testing.T) {
	t.Parallel()
	ws, err := os.MkdirTemp("", "th-ws-") // short: the daemon's socket will be below it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(ws) })
	rt := filepath.Join(ws, "rt")
	if err := os.Mkdir(rt, 0o700); err != nil {
		t.Fatal(err)
	}
	e := sessionEnvIn(t, rt)
	for _, args := range [][]string{
		{"session", "start", "--workspace", ws},
		{"call", "--workspace", ws, "bash", `{"command":"true"}`},
		{"session", "start", "--workspace", rt},
	} {
		r := e.run(args...)
		if r.code != 2 || !strings.Contains(r.stderr, "the session daemon's directory ("+e.dir+")") {
			t.Errorf("toolhost %s: want exit 2 naming the daemon's directory %s:\n%s", strings.Join(args, " "), e.dir, r)
		}
	}
	if _, err := os.Stat(daemon.SocketPath(e.dir)); !os.IsNotExist(err) {
		t.Errorf("a daemon started for a refused workspace: %v", err)
	}
}

// impostorScript listens, as whoever runs it, on the socket it is given as descriptor 3
// (bound by the test), answers every request with a forged session list and tool result,
// and when its stdin closes prints how many bytes it was sent.
const impostorScript = `
import socket, sys, threading
s = socket.socket(fileno=3)
s.listen(8)
lock, total = threading.Lock(), 0
forged = b'{"sessions":[{"id":"forged-1","project":"forged"}],"content":[{"type":"text","text":"forged answer"}],"id":"forged-1"}'
def serve(c):
    global total
    head = b""
    while True:
        try:
            b = c.recv(65536)
        except OSError:
            break
        if not b:
            break
        with lock:
            total += len(b)
        head += b
        if b"\r\n\r\n" in head:
            try:
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(forged) + forged)
            except OSError:
                pass
            break
    c.close()
def accept():
    while True:
        c, _ = s.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
threading.Thread(target=accept, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
with lock:
    print("received", total, "bytes", flush=True)
`

// TestCLIRefusesAnImpostorDaemon: something else listening on the daemon's socket (what
// a sandbox could do as root through an idmapped workspace holding the runtime dir: the
// socket file then belongs to root, 0600, in the right directory) is refused by the CLI
// before it sends a byte, by the peer's credentials: session list, call --session and
// session start all fail naming the uid behind the socket, and show nothing it forged.
func TestCLIRefusesAnImpostorDaemon(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skipf(t, "this test serves the socket as another user (nobody), which needs root")
	}
	py := "/usr/bin/python3" // Debian's: one nobody may run (not a shim under /root)
	if _, err := os.Stat(py); err != nil {
		testenv.Skipf(t, "python3 is not installed (scripts/setup.sh installs it): %v", err)
	}
	t.Parallel()
	e := newSessionEnv(t)
	if err := os.Mkdir(e.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := daemon.SocketPath(e.dir)
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "impostor")
	defer f.Close()
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(sock) // before the environment's cleanup looks for a daemon there
	if err := os.Chmod(sock, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-c", impostorScript)
	cmd.Dir = "/"
	cmd.ExtraFiles = []*os.File{f}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { // owned by the test: ends when its stdin closes, or is killed
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	}()
	out := bufio.NewReader(stdout)
	if line, err := out.ReadString('\n'); line != "ready\n" {
		cmd.Wait()
		t.Fatalf("the impostor did not start: %q %v\n%s", line, err, stderr.String())
	}

	for _, args := range [][]string{
		{"session", "list"},
		{"call", "--session", "forged-1", "bash", `{"command":"id"}`},
		{"session", "start"},
	} {
		r := e.run(args...)
		if r.code == 0 || strings.Contains(r.stdout, "forged") || !strings.Contains(r.stderr, "uid 65534") || !strings.Contains(r.stderr, sock) {
			t.Errorf("toolhost %s: want a refusal naming uid 65534 and %s, nothing forged shown:\n%s", strings.Join(args, " "), sock, r)
		}
	}
	stdin.Close()
	rest, _ := io.ReadAll(out)
	if got := strings.TrimSpace(string(rest)); got != "received 0 bytes" {
		t.Errorf("the impostor %s; want nothing sent to it (its stderr: %s)", got, stderr.String())
	}
}
