//go:build linux

package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd/client"
	"github.com/toolhost/toolhost/internal/testenv"
)

func newProvider(t testing.TB, cfg Config) *Provider {
	t.Helper()
	testenv.NeedBwrap(t)
	if cfg.RunDir == "" {
		cfg.RunDir = t.TempDir()
	}
	// The agent is this test binary (race-instrumented under -race): its stderr reaches the
	// provider's logger, so a race or panic inside a sandbox fails the test too.
	w := &agentWatch{}
	cfg.Logger = slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if w.bad.Load() {
			t.Errorf("the in-sandbox agent reported a problem:\n%s", w.String())
		}
	})
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			t.Errorf("provider Close: %v", err)
		}
	})
	return p
}

func newSandbox(t testing.TB, p *Provider, opts sandbox.CreateOptions) *Sandbox {
	t.Helper()
	if opts.Workspace == "" {
		opts.Workspace = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sb, err := p.Create(ctx, opts)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := sb.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return sb.(*Sandbox)
}

// sh runs a bash script in the sandbox and fails the test on a transport error.
func sh(t testing.TB, sb sandbox.Sandbox, script string) sandbox.ExecResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", script}})
	if err != nil {
		t.Fatalf("Exec %q: %v", script, err)
	}
	return res
}

// hostProcs lists host pids whose command line contains marker.
func hostProcs(marker string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(marker)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func uniqueMarker() string { return strconv.FormatInt(time.Now().UnixNano()%1e9+6e9, 10) }

func TestExec(t *testing.T) {
	p := newProvider(t, Config{})
	ws := t.TempDir()
	sb := newSandbox(t, p, sandbox.CreateOptions{Workspace: ws, Env: map[string]string{"FROM_CREATE": "c1"}})
	ctx := context.Background()

	res := sh(t, sb, `echo out; echo err >&2; exit 7`)
	if res.ExitCode != 7 || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" || res.TimedOut {
		t.Fatalf("exit 7: %+v stdout=%q stderr=%q", res, res.Stdout, res.Stderr)
	}
	if res := sh(t, sb, "true"); res.ExitCode != 0 {
		t.Fatalf("true: exit %d", res.ExitCode)
	}
	if res := sh(t, sb, "kill -9 $$"); res.ExitCode != -1 {
		t.Fatalf("killed by a signal: exit %d, want -1", res.ExitCode)
	}
	if res := sh(t, sb, "pwd"); string(res.Stdout) != "/home/user\n" {
		t.Fatalf("default cwd %q", res.Stdout)
	}
	if err := os.MkdirAll(filepath.Join(ws, "sub", "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, cwd := range []string{"sub/dir", "/home/user/sub/dir"} {
		res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"pwd"}, Cwd: cwd})
		if err != nil || string(res.Stdout) != "/home/user/sub/dir\n" {
			t.Fatalf("cwd %s: %q %v", cwd, res.Stdout, err)
		}
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"pwd"}, Cwd: "missing"}); err == nil {
		t.Fatal("missing cwd: no error")
	}
	// argv runs without a shell: $HOME stays literal.
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"echo", "$HOME", "a b"}})
	if err != nil || string(res.Stdout) != "$HOME a b\n" {
		t.Fatalf("argv: %q %v", res.Stdout, err)
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"no-such-program"}}); err == nil {
		t.Fatal("unknown program: no error")
	}
	res, err = sb.Exec(ctx, sandbox.ExecRequest{
		Argv: []string{"bash", "-c", `printf '%s|' "$HOME" "$USER" "$LANG" "$TERM" "$PATH" "$FROM_CREATE" "$FROM_EXEC" "${TOOLHOST_SANDBOX_AGENT-unset}"; env | wc -l`},
		Env:  map[string]string{"FROM_EXEC": "e1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "/home/user|user|C.UTF-8|dumb|/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin|c1|e1|unset|"
	if !strings.HasPrefix(string(res.Stdout), want) {
		t.Fatalf("env:\n got %q\nwant %q", res.Stdout, want)
	}
	// stdin is /dev/null: a reader gets EOF instead of hanging.
	if res := sh(t, sb, "cat; echo done"); string(res.Stdout) != "done\n" {
		t.Fatalf("stdin: %q", res.Stdout)
	}
}

// A directory standing for the host's secrets: the data dir, another user's files.
func secretDir(t *testing.T) (dir, file, content string) {
	dir = t.TempDir()
	content = "SECRET-" + uniqueMarker()
	file = filepath.Join(dir, "secret.txt")
	if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, file, content
}

func TestHostIsInvisible(t *testing.T) {
	p := newProvider(t, Config{})
	dataDir, secretFile, _ := secretDir(t)
	// A descriptor the host holds without close-on-exec (as one inherited from its own
	// parent would be) must not reach the sandbox.
	leak, err := syscall.Open(secretFile, syscall.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	syscall.Close(leak)
	if res := sh(t, sb, "ls -l /proc/[0-9]*/fd/ 2>/dev/null"); strings.Contains(string(res.Stdout), secretFile) {
		t.Errorf("a host descriptor leaked into the sandbox:\n%s", res.Stdout)
	}
	other := newSandbox(t, p, sandbox.CreateOptions{})

	hostHome, _ := os.UserHomeDir()
	paths := []string{"/root", "/etc/shadow", "/etc/hostname", "/work", "/var", "/opt", "/mnt", "/srv",
		dataDir, secretFile, p.cfg.RunDir, other.runDir, sb.runDir, filepath.Join(other.runDir, "agent.sock")}
	if hostHome != "" {
		paths = append(paths, hostHome)
	}
	if ents, err := os.ReadDir("/home"); err == nil {
		for _, e := range ents {
			paths = append(paths, filepath.Join("/home", e.Name()))
		}
	}
	for _, pth := range paths {
		if pth == sandbox.WorkspaceRoot {
			continue
		}
		res := sh(t, sb, fmt.Sprintf("ls -d %q 2>/dev/null && cat %q 2>/dev/null | head -c 100", pth, pth))
		if res.ExitCode == 0 {
			t.Errorf("host path %s is visible in the sandbox: %q", pth, res.Stdout)
		}
	}
	if res := sh(t, sb, "ls -A /home"); string(res.Stdout) != "user\n" {
		t.Errorf("/home holds %q, want only user", res.Stdout)
	}
	if res := sh(t, sb, "ls -A /etc | sort | tr '\\n' ' '"); strings.Contains(string(res.Stdout), "shadow") || strings.Contains(string(res.Stdout), "sudoers") {
		t.Errorf("/etc holds secrets: %q", res.Stdout)
	}
	if res := sh(t, sb, "cat /etc/passwd"); strings.Contains(string(res.Stdout), "/root:/bin/bash") || !strings.Contains(string(res.Stdout), "user:x:1000:1000") {
		t.Errorf("/etc/passwd is not the synthetic one: %q", res.Stdout)
	}
	// Only the sandbox's own processes are visible: the agent (pid 1), this shell.
	res := sh(t, sb, `for p in /proc/[0-9]*; do echo "$(basename $p) $(tr '\0' ' ' < $p/cmdline)"; done`)
	for _, line := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
		pid, cmdline, _ := strings.Cut(line, " ")
		if !(pid == "1" && strings.HasPrefix(cmdline, "/proc/self/fd/")) && !strings.HasPrefix(cmdline, "bash -c") && cmdline != "" {
			t.Errorf("a foreign process is visible in the sandbox: %q", line)
		}
	}
	// The host's environment does not leak.
	t.Setenv("TOOLHOST_TEST_HOST_SECRET", "leak")
	if res := sh(t, sb, "env"); strings.Contains(string(res.Stdout), "TOOLHOST_TEST_HOST_SECRET") || strings.Contains(string(res.Stdout), "/root") {
		t.Errorf("host environment visible: %q", res.Stdout)
	}
}

func TestNothingWritableOutsideWorkspace(t *testing.T) {
	p := newProvider(t, Config{})
	ws := t.TempDir()
	sb := newSandbox(t, p, sandbox.CreateOptions{Workspace: ws})
	for _, dir := range []string{"/", "/usr", "/usr/local/bin", "/etc", "/home", "/run", "/run/toolhost", "/bin", "/lib", "/proc/sys/kernel", "/dev", "/sys"} {
		res := sh(t, sb, fmt.Sprintf("touch %q/toolhost-probe 2>&1 || mkdir %q/toolhost-probe-dir 2>&1", dir, dir))
		if res.ExitCode == 0 {
			t.Errorf("wrote into %s inside the sandbox", dir)
		}
	}
	if res := sh(t, sb, "echo x >> /etc/passwd"); res.ExitCode == 0 {
		t.Error("appended to /etc/passwd")
	}
	if res := sh(t, sb, "echo x > /run/toolhost/agent"); res.ExitCode == 0 {
		t.Error("overwrote the agent binary")
	}
	if res := sh(t, sb, "echo ok > /home/user/w && echo ok > /tmp/t && cat /home/user/w /tmp/t"); string(res.Stdout) != "ok\nok\n" {
		t.Errorf("workspace and /tmp not writable: %+v %q", res, res.Stderr)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "w")); err != nil || string(b) != "ok\n" {
		t.Errorf("workspace write not on the host: %q %v", b, err)
	}
	if _, err := os.Stat("/tmp/t"); err == nil {
		t.Log("note: host /tmp/t exists (not from this sandbox: its /tmp is private)")
	}
	// /tmp and /dev/shm (bwrap's --dev gives a private one; shared-memory users need it)
	// are private to each sandbox: neither the host nor another sandbox sees them.
	name := "toolhost-probe-" + uniqueMarker()
	if res := sh(t, sb, "echo x > /dev/shm/"+name); res.ExitCode != 0 {
		t.Errorf("/dev/shm not usable: %q", res.Stderr)
	}
	if _, err := os.Stat("/dev/shm/" + name); err == nil {
		t.Error("the sandbox's /dev/shm is the host's")
	}
	other := newSandbox(t, p, sandbox.CreateOptions{})
	if res := sh(t, other, "cat /tmp/t || cat /dev/shm/"+name); res.ExitCode == 0 {
		t.Error("another sandbox sees this sandbox's /tmp or /dev/shm")
	}
}

func TestUnprivilegedUser(t *testing.T) {
	p := newProvider(t, Config{})
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	res := sh(t, sb, "id -u; id -g; grep -E '^Cap(Eff|Prm|Bnd|Amb):' /proc/self/status")
	out := string(res.Stdout)
	if !strings.HasPrefix(out, "1000\n1000\n") {
		t.Fatalf("ids: %q", out)
	}
	for _, c := range []string{"CapEff", "CapPrm", "CapBnd", "CapAmb"} {
		if !strings.Contains(out, c+":\t0000000000000000") {
			t.Errorf("%s is not zero: %q", c, out)
		}
	}
	// No way to regain capabilities in a nested user namespace.
	if res := sh(t, sb, "unshare -U -r true"); res.ExitCode == 0 {
		t.Error("the sandbox can create a user namespace")
	}
	// The agent is pid 1 and cannot be inspected or traced by the sandbox's processes.
	if res := sh(t, sb, `cat /proc/1/comm; readlink /proc/1/fd/0 >/dev/null 2>&1 && echo "fds open to the sandbox"; readlink /proc/1/exe >/dev/null 2>&1 && echo "exe readable"; cat /proc/1/environ >/dev/null 2>&1 && echo "environ readable"; head -c1 /proc/1/mem >/dev/null 2>&1 && echo "memory readable"`); string(res.Stdout) != "toolhost-agent\n" {
		t.Errorf("agent is open to the sandbox: %q", res.Stdout)
	}
	// The agent itself has no capabilities either.
	res = sh(t, sb, "grep CapEff /proc/1/status")
	if !strings.Contains(string(res.Stdout), "CapEff:\t0000000000000000") {
		t.Errorf("agent capabilities: %q", res.Stdout)
	}
}

func TestNetwork(t *testing.T) {
	p := newProvider(t, Config{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	probe := fmt.Sprintf("exec 3<>/dev/tcp/127.0.0.1/%d && echo connected", port)

	none := newSandbox(t, p, sandbox.CreateOptions{})
	res := sh(t, none, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
	if string(res.Stdout) != "lo\n" {
		t.Errorf("network none has interfaces %q, want only lo", res.Stdout)
	}
	if res := sh(t, none, probe); res.ExitCode == 0 || accepted.Load() != 0 {
		t.Errorf("network none reached a host listener: %q", res.Stdout)
	}
	// The same probe succeeds with the host network, so the check above means something.
	host := newSandbox(t, p, sandbox.CreateOptions{Network: sandbox.NetworkHost})
	if res := sh(t, host, probe); res.ExitCode != 0 || string(res.Stdout) != "connected\n" {
		t.Errorf("network host cannot reach the host listener: %+v %q", res, res.Stderr)
	}
	if _, err := p.Create(context.Background(), sandbox.CreateOptions{Workspace: t.TempDir(), Network: "bridge"}); err == nil {
		t.Error("unknown network mode accepted")
	}
}

func TestFilesStayInWorkspace(t *testing.T) {
	p := newProvider(t, Config{})
	ws := t.TempDir()
	_, secretFile, secret := secretDir(t)
	for name, target := range map[string]string{"hostname": "/etc/hostname", "secret": secretFile, "passwd": "../../../../../../etc/passwd"} {
		if err := os.Symlink(target, filepath.Join(ws, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Dir(secretFile), filepath.Join(ws, "secretdir")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "a.txt"), []byte("inside"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.txt", filepath.Join(ws, "in")); err != nil {
		t.Fatal(err)
	}
	sb := newSandbox(t, p, sandbox.CreateOptions{Workspace: ws})
	ctx := context.Background()

	for _, pth := range []string{"../../etc/passwd", "/etc/passwd", "/home/user/../../etc/passwd", "hostname", "secret", "passwd", "secretdir/secret.txt", "/home/user/secret"} {
		b, err := sb.ReadFile(ctx, pth, 0)
		if !errors.Is(err, sandbox.ErrOutside) {
			t.Errorf("ReadFile(%q) = %q, %v; want ErrOutside", pth, b, err)
		}
	}
	for _, pth := range []string{"secret", "secretdir/new.txt", "../x"} {
		if err := sb.WriteFile(ctx, pth, []byte("overwritten")); !errors.Is(err, sandbox.ErrOutside) {
			t.Errorf("WriteFile(%q) = %v; want ErrOutside", pth, err)
		}
	}
	if b, _ := os.ReadFile(secretFile); string(b) != secret {
		t.Fatalf("the host secret changed: %q", b)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(secretFile), "new.txt")); err == nil {
		t.Fatal("a file was created outside the workspace through a link")
	}
	if b, err := sb.ReadFile(ctx, "in", 0); err != nil || string(b) != "inside" {
		t.Errorf("link inside the workspace: %q %v", b, err)
	}
	fi, err := sb.Stat(ctx, "secret")
	if err != nil || fi.Mode&fs.ModeSymlink == 0 {
		t.Errorf("Stat of a link: %+v %v (want the link itself)", fi, err)
	}
	lr, err := sb.List(ctx, sandbox.ListRequest{Path: ".", Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range lr.Entries {
		if strings.HasPrefix(e.Path, "secretdir/") {
			t.Errorf("List followed a link out of the workspace: %s", e.Path)
		}
	}
}

func TestFiles(t *testing.T) {
	p := newProvider(t, Config{})
	ws := t.TempDir()
	sb := newSandbox(t, p, sandbox.CreateOptions{Workspace: ws})
	ctx := context.Background()

	if err := sb.WriteFile(ctx, "deep/er/f.txt", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "deep/er/f.txt")); err != nil || string(b) != "hello" {
		t.Fatalf("written file on the host: %q %v", b, err)
	}
	if b, err := sb.ReadFile(ctx, "/home/user/deep/er/f.txt", 5); err != nil || string(b) != "hello" {
		t.Fatalf("ReadFile: %q %v", b, err)
	}
	if _, err := sb.ReadFile(ctx, "deep/er/f.txt", 4); !errors.Is(err, sandbox.ErrTooLarge) {
		t.Errorf("ReadFile over the limit: %v", err)
	}
	if _, err := sb.ReadFile(ctx, "nope", 0); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("ReadFile missing: %v", err)
	}
	if _, err := sb.ReadFile(ctx, "deep", 0); !errors.Is(err, sandbox.ErrIsDir) {
		t.Errorf("ReadFile dir: %v", err)
	}
	if err := sb.WriteFile(ctx, "deep", []byte("x")); !errors.Is(err, sandbox.ErrIsDir) {
		t.Errorf("WriteFile over a dir: %v", err)
	}
	if err := sb.WriteFile(ctx, "deep/er/f.txt/x", []byte("x")); !errors.Is(err, sandbox.ErrNotDir) {
		t.Errorf("WriteFile below a file: %v", err)
	}
	if err := sb.WriteFile(ctx, "empty", nil); err != nil {
		t.Fatal(err)
	}
	if b, err := sb.ReadFile(ctx, "empty", 0); err != nil || len(b) != 0 {
		t.Fatalf("empty file: %q %v", b, err)
	}
	fi, err := sb.Stat(ctx, "deep/er/f.txt")
	if err != nil || fi.Size != 5 || !fi.Mode.IsRegular() || fi.Path != "deep/er/f.txt" || fi.ModTime.IsZero() {
		t.Fatalf("Stat: %+v %v", fi, err)
	}
	if fi, err := sb.Stat(ctx, "deep"); err != nil || !fi.IsDir() {
		t.Fatalf("Stat dir: %+v %v", fi, err)
	}
	if _, err := sb.Stat(ctx, "missing"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Stat missing: %v", err)
	}
	// Files written inside the sandbox by a process are seen by the file API and vice versa.
	sh(t, sb, "mkdir -p a/node_modules/pkg b && echo 1 > a/x && echo 2 > a.txt && echo 3 > a/node_modules/pkg/i.js && echo 4 > b/y")
	lr, err := sb.List(ctx, sandbox.ListRequest{Path: ".", Recursive: true, Skip: []string{"node_modules"}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range lr.Entries {
		got = append(got, e.Path)
	}
	want := "a a.txt a/node_modules a/x b b/y deep deep/er deep/er/f.txt empty"
	if strings.Join(got, " ") != want || lr.Truncated {
		t.Errorf("List recursive:\n got %q\nwant %q", strings.Join(got, " "), want)
	}
	lr, err = sb.List(ctx, sandbox.ListRequest{Path: "a"})
	if err != nil || len(lr.Entries) != 2 || lr.Entries[0].Path != "node_modules" || !lr.Entries[0].IsDir() || lr.Entries[1].Path != "x" {
		t.Errorf("List flat: %+v %v", lr, err)
	}
	lr, err = sb.List(ctx, sandbox.ListRequest{Path: ".", Recursive: true, Limit: 3})
	if err != nil || len(lr.Entries) != 3 || !lr.Truncated {
		t.Errorf("List limit: %+v %v", lr, err)
	}
	if _, err := sb.List(ctx, sandbox.ListRequest{Path: "a.txt"}); !errors.Is(err, sandbox.ErrNotDir) {
		t.Errorf("List of a file: %v", err)
	}
	if _, err := sb.List(ctx, sandbox.ListRequest{Path: "zzz"}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("List of a missing dir: %v", err)
	}
}

func TestTimeoutKillsProcessGroup(t *testing.T) {
	p := newProvider(t, Config{})
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	marker := uniqueMarker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := sb.Exec(ctx, sandbox.ExecRequest{
		Argv:    []string{"bash", "-c", fmt.Sprintf("echo before; sleep %s & sleep %s", marker, marker)},
		Timeout: time.Second,
	})
	if err != nil || !res.TimedOut || res.ExitCode != -1 || string(res.Stdout) != "before\n" {
		t.Fatalf("timed-out exec: %+v %q %v", res, res.Stdout, err)
	}
	t.Logf("1s timeout returned after %s", res.Duration)
	left := func() string {
		return string(sh(t, sb, `for p in /proc/[0-9]*; do c=$(tr '\0' ' ' < $p/cmdline 2>/dev/null); case "$c" in *`+marker+`*) echo "$p $c";; esac; done | grep -v 'for p'`).Stdout)
	}
	if out := left(); out != "" {
		t.Fatalf("processes left after the timeout:\n%s", out)
	}

	// ctx's deadline bounds the command like a timeout.
	dctx, dcancel := context.WithTimeout(context.Background(), time.Second)
	defer dcancel()
	res, err = sb.Exec(dctx, sandbox.ExecRequest{Argv: []string{"sleep", marker}})
	if !res.TimedOut {
		t.Fatalf("ctx deadline: %+v %v", res, err)
	}
	// Cancelling ctx kills the command too.
	cctx, ccancel := context.WithCancel(context.Background())
	time.AfterFunc(500*time.Millisecond, ccancel)
	res, err = sb.Exec(cctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", "sleep " + marker + " & sleep " + marker}})
	if !res.TimedOut || !errors.Is(err, context.Canceled) {
		t.Fatalf("ctx cancel: %+v %v", res, err)
	}
	if !testenv.Eventually(func() bool { return left() == "" }) {
		t.Fatalf("processes left after cancel:\n%s", left())
	}

	// A leftover background child holding the pipes does not hang the call.
	res = sh(t, sb, "sleep "+marker+" & echo hi")
	if string(res.Stdout) != "hi\n" || res.ExitCode != 0 {
		t.Fatalf("leftover child: %+v %q", res, res.Stdout)
	}
	t.Logf("exec with a leftover child holding the pipe returned after %s", res.Duration)
}

func TestOutputIsCappedAtTheSource(t *testing.T) {
	p := newProvider(t, Config{})
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	const total = 100_000_000
	const limit = 64 << 10

	// A second client on the same socket that counts the bytes it receives.
	var received atomic.Int64
	counting, err := client.New(client.Config{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", filepath.Join(sb.runDir, "agent.sock"))
			if err != nil {
				return nil, err
			}
			return &countConn{Conn: c, n: &received}, nil
		},
	}, BaseURL: "http://sandbox"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	agentPID := agentHostPID(t, sb)
	agentBefore := vmHWM(t, agentPID)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	res, err := counting.Exec(ctx, sandbox.ExecRequest{
		Argv:           []string{"bash", "-c", fmt.Sprintf(`head -c %d /dev/zero | tr '\0' x; echo end >&2`, total)},
		MaxOutputBytes: limit,
	})
	runtime.GC()
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Stdout) != limit || res.StdoutCut != total-limit || res.ExitCode != 0 {
		t.Fatalf("flood: len %d cut %d exit %d", len(res.Stdout), res.StdoutCut, res.ExitCode)
	}
	if bytes.Count(res.Stdout, []byte("x")) != limit || string(res.Stderr) != "end\n" || res.StderrCut != 0 {
		t.Fatalf("flood content: stderr %q", res.Stderr)
	}
	growth := int64(after.HeapInuse) - int64(before.HeapInuse)
	t.Logf("100 MB flood: %d bytes over the socket, host HeapInuse %+d bytes, TotalAlloc +%d, took %s",
		received.Load(), growth, after.TotalAlloc-before.TotalAlloc, res.Duration)
	if received.Load() > 1<<20 {
		t.Errorf("%d bytes crossed the socket for a %d-byte cap", received.Load(), limit)
	}
	if growth > 4<<20 {
		t.Errorf("host heap grew by %d bytes", growth)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
		t.Errorf("host allocated %d bytes in total", alloc)
	}
	// The agent's peak resident set barely moves either.
	agentAfter := vmHWM(t, agentPID)
	t.Logf("agent VmHWM %d kB before, %d kB after the flood", agentBefore, agentAfter)
	if agentAfter-agentBefore > 8<<10 {
		t.Errorf("agent peak memory grew by %d kB", agentAfter-agentBefore)
	}

	// yes never ends: the timeout does, and the output is still capped head+tail.
	res, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"yes"}, Timeout: time.Second, MaxOutputBytes: limit})
	if err != nil || !res.TimedOut || len(res.Stdout) != limit || res.StdoutCut <= 0 {
		t.Fatalf("yes: %v timedOut=%v len=%d cut=%d", err, res.TimedOut, len(res.Stdout), res.StdoutCut)
	}
	if !bytes.HasPrefix(res.Stdout, []byte("y\ny\n")) || !bytes.HasSuffix(res.Stdout, []byte("y\n")) && !bytes.HasSuffix(res.Stdout, []byte("y")) {
		t.Fatalf("yes output is not head+tail of y lines")
	}
	t.Logf("yes for 1s: kept %d bytes, cut %d", len(res.Stdout), res.StdoutCut)

	// Head and tail are the real beginning and end, and the default cap applies.
	res = sh(t, sb, "seq 1 200000")
	if !bytes.HasPrefix(res.Stdout, []byte("1\n2\n3\n")) || !bytes.HasSuffix(res.Stdout, []byte("\n199999\n200000\n")) ||
		len(res.Stdout) != sandbox.DefaultMaxOutputBytes || int64(len(res.Stdout))+res.StdoutCut != 1288895 {
		t.Fatalf("seq: len %d cut %d", len(res.Stdout), res.StdoutCut)
	}
}

type agentWatch struct {
	mu  sync.Mutex
	buf bytes.Buffer
	bad atomic.Bool
}

func (w *agentWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if bytes.Contains(p, []byte("DATA RACE")) || bytes.Contains(p, []byte("panic:")) || bytes.Contains(p, []byte("level=ERROR")) {
		w.bad.Store(true)
	}
	if w.buf.Len() < 64<<10 {
		w.buf.Write(p)
	}
	return len(p), nil
}

func (w *agentWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// agentHostPID is the agent's pid as the host sees it: the sandbox's pid 1.
func agentHostPID(t *testing.T, sb *Sandbox) int {
	t.Helper()
	if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", sb.initPID)); !bytes.HasPrefix(b, []byte("/proc/self/fd/")) {
		t.Fatalf("pid %d is not the agent: %q", sb.initPID, b)
	}
	return sb.initPID
}

// vmHWM is a process's peak resident set in kB.
func vmHWM(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return n
		}
	}
	t.Fatalf("no VmHWM for %d", pid)
	return 0
}

type countConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func TestBackgroundProcess(t *testing.T) {
	p := newProvider(t, Config{})
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	ctx := context.Background()
	marker := uniqueMarker()
	pr, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", "echo started; echo oops >&2; exec sleep " + marker}})
	if err != nil {
		t.Fatal(err)
	}
	if pr.PID <= 0 || pr.ID == "" || !strings.HasPrefix(pr.LogPath, "/tmp/toolhost/") {
		t.Fatalf("process: %+v", pr)
	}
	// It outlives the Start call, writes its log, and is listed.
	var log string
	if !testenv.Eventually(func() bool {
		log = string(sh(t, sb, "cat "+pr.LogPath).Stdout)
		return log == "started\noops\n"
	}) {
		t.Fatalf("log %s holds %q", pr.LogPath, log)
	}
	procs, err := sb.client.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, pi := range procs {
		found = found || (int(pi.Pid) == pr.PID && pi.Tag == pr.ID)
	}
	if !found {
		t.Fatalf("process %+v not listed in %+v", pr, procs)
	}
	// The log is written before bash execs sleep: wait for the exec to show.
	var cmdline string
	if !testenv.Eventually(func() bool {
		cmdline = string(sh(t, sb, fmt.Sprintf("tr '\\0' ' ' < /proc/%d/cmdline", pr.PID)).Stdout)
		return strings.Contains(cmdline, marker)
	}) {
		t.Fatalf("pid %d is not the process: %q", pr.PID, cmdline)
	}
	if len(hostProcs(marker)) == 0 {
		t.Fatal("the background process is not visible from the host; the check below would prove nothing")
	}
	runDir := sb.runDir
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if pids := hostProcs(marker); len(pids) != 0 {
		t.Fatalf("processes left after Close: %v", pids)
	}
	if _, err := os.Stat(runDir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("run dir left after Close: %v", err)
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("Exec after Close: %v", err)
	}
	if _, err := sb.ReadFile(ctx, "x", 0); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("ReadFile after Close: %v", err)
	}
	if err := sb.SetTimeout(ctx, time.Minute); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("SetTimeout after Close: %v", err)
	}
}

func TestTTLKillsTheSandbox(t *testing.T) {
	p := newProvider(t, Config{})
	sb := newSandbox(t, p, sandbox.CreateOptions{Timeout: time.Second})
	if d := sb.EndsAt().Sub(sb.StartedAt()); d != time.Second {
		t.Fatalf("EndsAt-StartedAt = %s", d)
	}
	ctx := context.Background()
	marker := uniqueMarker()
	if _, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"sleep", marker}}); err != nil {
		t.Fatal(err)
	}
	// A command still running when the sandbox is killed fails with ErrClosed.
	inflight := make(chan error, 1)
	go func() {
		_, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sleep", marker}})
		inflight <- err
	}()
	var err error
	if !testenv.Eventually(func() bool {
		_, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}})
		return err != nil
	}) {
		t.Fatal("the sandbox still runs commands after its end time")
	}
	if !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("Exec after the end time: %v, want ErrClosed", err)
	}
	t.Logf("after the end time: %v", err)
	if err := <-inflight; !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("in-flight Exec at the end time: %v, want ErrClosed", err)
	}
	// ErrClosed shows as soon as the kill starts; the teardown finishes right after.
	if !testenv.Eventually(func() bool { return len(hostProcs(marker)) == 0 }) {
		t.Fatalf("processes left after the TTL kill: %v", hostProcs(marker))
	}
	if !testenv.Eventually(func() bool { _, err := os.Stat(sb.runDir); return errors.Is(err, fs.ErrNotExist) }) {
		t.Fatal("run dir left after the TTL kill")
	}
	ctx2, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := sb.Close(ctx2); err != nil {
		t.Fatalf("Close after the TTL kill: %v", err)
	}
}

// TestSandboxDiesOnItsOwn: when bwrap dies without Close (OOM killer, a stray kill), calls
// fail with ErrClosed and the sandbox is released.
func TestSandboxDiesOnItsOwn(t *testing.T) {
	p := newProvider(t, Config{})
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	if err := syscall.Kill(agentHostPID(t, sb), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var err error
	if !testenv.Eventually(func() bool { _, err = sb.Stat(context.Background(), "."); return errors.Is(err, sandbox.ErrClosed) }) {
		t.Fatalf("Stat after the agent died: %v", err)
	}
	if !testenv.Eventually(func() bool { _, err := os.Stat(sb.runDir); return errors.Is(err, fs.ErrNotExist) }) {
		t.Fatal("run dir not removed")
	}
	t.Logf("after the agent died: %v", err)
}

func TestSetTimeout(t *testing.T) {
	p := newProvider(t, Config{MaxLifetime: 10 * time.Minute, DefaultTimeout: time.Minute})
	sb := newSandbox(t, p, sandbox.CreateOptions{Timeout: time.Second})
	ctx := context.Background()
	if err := sb.SetTimeout(ctx, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	if left := time.Until(sb.EndsAt()); left < 4*time.Minute {
		t.Fatalf("EndsAt not moved: %s left", left)
	}
	// Past the original end time it still runs.
	time.Sleep(time.Until(sb.StartedAt().Add(1500 * time.Millisecond)))
	if res := sh(t, sb, "echo alive"); string(res.Stdout) != "alive\n" {
		t.Fatalf("extended sandbox: %q", res.Stdout)
	}
	end := sb.EndsAt()
	err := sb.SetTimeout(ctx, 11*time.Minute)
	if err == nil || !strings.Contains(err.Error(), "maximum lifetime") || errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("SetTimeout past the max lifetime: %v", err)
	}
	t.Logf("refusal: %v", err)
	if !sb.EndsAt().Equal(end) {
		t.Fatal("a refused SetTimeout moved EndsAt")
	}
	if err := sb.SetTimeout(ctx, 0); err == nil {
		t.Fatal("SetTimeout(0) accepted")
	}
	// Shortening works too, and the timer follows.
	if err := sb.SetTimeout(ctx, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if !testenv.Eventually(func() bool {
		_, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}})
		return errors.Is(err, sandbox.ErrClosed)
	}) {
		t.Fatal("shortened sandbox still alive")
	}
	// Create refuses a timeout past the max lifetime, and takes the default when zero.
	if _, err := p.Create(ctx, sandbox.CreateOptions{Workspace: t.TempDir(), Timeout: time.Hour}); err == nil {
		t.Fatal("Create past the max lifetime accepted")
	}
	d := newSandbox(t, p, sandbox.CreateOptions{})
	if got := d.EndsAt().Sub(d.StartedAt()); got != time.Minute {
		t.Fatalf("default timeout %s", got)
	}
	// Without a workspace the sandbox gets a private, empty one that goes with it.
	sbi, err := p.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		t.Fatalf("Create without a workspace: %v", err)
	}
	priv := sbi.(*Sandbox)
	if res := sh(t, priv, "ls -A; echo x > f"); len(res.Stdout) != 0 || res.ExitCode != 0 {
		t.Fatalf("private workspace: %+v %q", res, res.Stdout)
	}
	wsPath := priv.ws.path
	if !strings.HasPrefix(wsPath, p.wsDir+"/") {
		t.Fatalf("private workspace %s is not in the workspace dir %s", wsPath, p.wsDir)
	}
	if err := priv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(wsPath); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("private workspace left after Close: %v", err)
	}
}

func TestConcurrency(t *testing.T) {
	p := newProvider(t, Config{})
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", fmt.Sprintf("echo %d; echo e%d >&2", i, i)}})
			if err != nil || string(res.Stdout) != fmt.Sprintf("%d\n", i) || string(res.Stderr) != fmt.Sprintf("e%d\n", i) {
				t.Errorf("exec %d: %q %q %+v %v", i, res.Stdout, res.Stderr, res, err)
			}
			name := fmt.Sprintf("c/%d.txt", i)
			if err := sb.WriteFile(ctx, name, []byte(name)); err != nil {
				t.Errorf("write %d: %v", i, err)
			}
			if b, err := sb.ReadFile(ctx, name, 0); err != nil || string(b) != name {
				t.Errorf("read %d: %q %v", i, b, err)
			}
		})
	}
	// Several sandboxes at once, created and closed concurrently.
	for i := range 4 {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			s, err := p.Create(cctx, sandbox.CreateOptions{Workspace: t.TempDir()})
			if err != nil {
				t.Errorf("create %d: %v", i, err)
				return
			}
			defer s.Close(cctx)
			res, err := s.Exec(cctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", "echo $((6*7))"}})
			if err != nil || string(res.Stdout) != "42\n" {
				t.Errorf("sandbox %d: %q %v", i, res.Stdout, err)
			}
		})
	}
	wg.Wait()
	lr, err := sb.List(ctx, sandbox.ListRequest{Path: "c"})
	if err != nil || len(lr.Entries) != 32 {
		t.Fatalf("list after concurrent writes: %d %v", len(lr.Entries), err)
	}
}

// TestNoGoroutineLeft: everything a sandbox starts on the host side ends with Close.
func TestNoGoroutineLeft(t *testing.T) {
	p := newProvider(t, Config{})
	ctx := context.Background()
	before := runtime.NumGoroutine()
	ws := filepath.Join(t.TempDir(), "not", "yet")
	for range 3 {
		sb, err := p.Create(ctx, sandbox.CreateOptions{Workspace: ws, Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "600"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "600"}, Timeout: 100 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		if err := sb.WriteFile(ctx, "f", []byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := sb.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if fi, err := os.Stat(ws); err != nil || !fi.IsDir() {
		t.Fatalf("a missing workspace was not created: %v", err)
	}
	if !testenv.Eventually(func() bool { return runtime.NumGoroutine() <= before }) {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
	}
}

// TestCreateLatency reports Create→first result; the figure is logged, not asserted.
func TestCreateLatency(t *testing.T) {
	p := newProvider(t, Config{})
	ctx := context.Background()
	var total time.Duration
	const n = 5
	for range n {
		began := time.Now()
		sb, err := p.Create(ctx, sandbox.CreateOptions{Workspace: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}})
		took := time.Since(began)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("first command: %+v %v", res, err)
		}
		total += took
		if err := sb.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("Create to first command result: %s on average over %d", total/n, n)
}
