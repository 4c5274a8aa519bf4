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
		cfg.RunDir = testenv.RunDir(t)
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

// TestEnvironment: what the local provider's processes find (the conformance suite checks
// HOME, CreateOptions.Env and ExecRequest.Env, which every provider sets): a login-like
// user, locale and terminal, the standard PATH, and nothing of the agent's own.
func TestEnvironment(t *testing.T) {
	p := newProvider(t, Config{})
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	res := sh(t, sb, `printf '%s|' "$HOME" "$USER" "$LANG" "$TERM" "$PATH" "${TOOLHOST_SANDBOX_AGENT-unset}"`)
	if want := "/home/user|user|C.UTF-8|dumb|/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin|unset|"; string(res.Stdout) != want {
		t.Fatalf("env:\n got %q\nwant %q", res.Stdout, want)
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

	for _, pth := range []string{"hostname", "secret", "passwd", "secretdir/secret.txt", "/home/user/secret"} {
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

// TestBackgroundProcess: what the suite cannot see from inside: the process Start names
// is the one running (its pid in the sandbox, its log under /tmp/toolhost), it runs on
// the host, and Close leaves neither it nor the sandbox's run directory behind.
func TestBackgroundProcess(t *testing.T) {
	p := newProvider(t, Config{})
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	ctx := context.Background()
	marker := uniqueMarker()
	pr, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", "echo started; exec sleep " + marker}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(pr.LogPath, "/tmp/toolhost/") {
		t.Fatalf("process: %+v, want its log under /tmp/toolhost", pr)
	}
	// bash execs sleep after it starts: wait for the exec to show.
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
	if pids := hostProcs(marker); len(pids) != 0 {
		t.Fatalf("processes left after Close: %v", pids)
	}
	if _, err := os.Stat(runDir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("run dir left after Close: %v", err)
	}
}

func TestTTLKillsTheSandbox(t *testing.T) {
	p := newProvider(t, Config{})
	// The end comes only once the commands below are running: a loaded machine may take
	// longer than a short lifetime to start a sandbox.
	sb := newSandbox(t, p, sandbox.CreateOptions{Timeout: time.Hour})
	if d := sb.EndsAt().Sub(sb.StartedAt()); d != time.Hour {
		t.Fatalf("EndsAt-StartedAt = %s", d)
	}
	ctx := context.Background()
	marker := uniqueMarker()
	if _, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"sleep", marker}}); err != nil {
		t.Fatal(err)
	}
	if err := sb.SetTimeout(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
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

// TestLifetimeLimits: the provider's own bounds (the suite checks extension, shortening
// and a refusal past any maximum): Config.MaxLifetime for SetTimeout and Create,
// Config.DefaultTimeout, no zero timeout; and the private workspace of a sandbox created
// without one lives in the workspace dir and goes with the sandbox.
func TestLifetimeLimits(t *testing.T) {
	p := newProvider(t, Config{MaxLifetime: 10 * time.Minute, DefaultTimeout: time.Minute})
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	ctx := context.Background()
	if got := sb.EndsAt().Sub(sb.StartedAt()); got != time.Minute {
		t.Fatalf("default timeout %s, want Config.DefaultTimeout", got)
	}
	if err := sb.SetTimeout(ctx, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	end := sb.EndsAt()
	err := sb.SetTimeout(ctx, 11*time.Minute)
	if err == nil || !strings.Contains(err.Error(), "maximum lifetime") || errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("SetTimeout past Config.MaxLifetime: %v", err)
	}
	t.Logf("refusal: %v", err)
	if !sb.EndsAt().Equal(end) {
		t.Fatal("a refused SetTimeout moved EndsAt")
	}
	if err := sb.SetTimeout(ctx, 0); err == nil {
		t.Fatal("SetTimeout(0) accepted")
	}
	if _, err := p.Create(ctx, sandbox.CreateOptions{Workspace: t.TempDir(), Timeout: time.Hour}); err == nil {
		t.Fatal("Create past Config.MaxLifetime accepted")
	}
	// Without a workspace the sandbox gets a private one that goes with it.
	sbi, err := p.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		t.Fatalf("Create without a workspace: %v", err)
	}
	priv := sbi.(*Sandbox)
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
