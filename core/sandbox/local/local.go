// Package local is the sandbox provider for this machine: every sandbox is a bubblewrap
// (bwrap) container with a minimal read-only root, the workspace at /home/user, a private
// /tmp, an unprivileged user and no network unless asked. Inside runs the envd-compatible
// agent (package envd), re-executed from the host's own binary (see agent.go), and the
// provider talks to it through a unix socket.
package local

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/sandbox/envd"
)

// BwrapPath is the bubblewrap binary (Debian package bubblewrap).
const BwrapPath = "/usr/bin/bwrap"

// ErrNoBwrap: bubblewrap is not installed.
var ErrNoBwrap = errors.New("bubblewrap is not installed (" + BwrapPath + "; Debian package bubblewrap)")

// Identity of the sandbox user.
const (
	sandboxUID = 1000
	sandboxGID = 1000
)

// Config configures the provider.
type Config struct {
	// RunDir holds one private directory per sandbox (its agent socket and /etc/passwd);
	// none of it is visible inside a sandbox. Default os.TempDir()/toolhost-run.
	RunDir string
	// DefaultTimeout is a sandbox's lifetime when CreateOptions.Timeout is zero (1h).
	DefaultTimeout time.Duration
	// MaxLifetime caps StartedAt..EndsAt; SetTimeout refuses to go past it (24h).
	MaxLifetime time.Duration
	Logger      *slog.Logger
}

// Provider creates bubblewrap sandboxes.
type Provider struct {
	cfg Config
	exe string // this binary, re-executed as the agent
	log *slog.Logger
}

var _ sandbox.Provider = (*Provider)(nil)

// New checks that bubblewrap and this executable are usable and prepares RunDir.
func New(cfg Config) (*Provider, error) {
	if cfg.RunDir == "" {
		cfg.RunDir = filepath.Join(os.TempDir(), "toolhost-run")
	}
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = time.Hour
	}
	if cfg.MaxLifetime <= 0 {
		cfg.MaxLifetime = 24 * time.Hour
	}
	if cfg.DefaultTimeout > cfg.MaxLifetime {
		return nil, fmt.Errorf("local provider: default timeout %s exceeds max lifetime %s", cfg.DefaultTimeout, cfg.MaxLifetime)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if _, err := os.Stat(BwrapPath); err != nil {
		return nil, fmt.Errorf("local provider: %w: %v", ErrNoBwrap, err)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("local provider: find own executable for the agent: %w", err)
	}
	if exe, err = filepath.EvalSymlinks(exe); err != nil {
		return nil, fmt.Errorf("local provider: resolve own executable: %w", err)
	}
	runDir, err := filepath.Abs(cfg.RunDir)
	if err != nil {
		return nil, fmt.Errorf("local provider: run dir: %w", err)
	}
	cfg.RunDir = runDir
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		return nil, fmt.Errorf("local provider: create run dir: %w", err)
	}
	return &Provider{cfg: cfg, exe: exe, log: cfg.Logger}, nil
}

const (
	passwd = "root:x:0:0:root:/root:/usr/sbin/nologin\n" +
		"user:x:1000:1000:user:/home/user:/bin/bash\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
	group = "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n"
)

// etcFiles are bound read-only from the host when present: what the loader and common
// tools need, nothing secret.
var etcFiles = []string{
	"/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
	"/etc/localtime", "/etc/nsswitch.conf", "/etc/ssl/certs", "/etc/ca-certificates",
	"/etc/mime.types", "/etc/bash.bashrc", "/etc/profile", "/etc/inputrc",
}

// etcNetFiles are added with NetworkHost.
var etcNetFiles = []string{"/etc/resolv.conf", "/etc/hosts", "/etc/host.conf", "/etc/gai.conf"}

// bwrapArgs builds the bubblewrap command line of one sandbox.
func (p *Provider) bwrapArgs(ws, runDir string, opts sandbox.CreateOptions) []string {
	a := []string{
		"--unshare-user", "--uid", strconv.Itoa(sandboxUID), "--gid", strconv.Itoa(sandboxGID),
		// No nested user namespaces: they would hand the sandbox capabilities over new
		// namespaces and with them much more kernel surface (bwrap >= 0.8).
		"--disable-userns",
		"--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
		"--hostname", "sandbox",
		"--die-with-parent", "--new-session", "--clearenv",
		"--cap-drop", "ALL",
		"--ro-bind", "/usr", "/usr",
	}
	if opts.Network != sandbox.NetworkHost {
		a = append(a, "--unshare-net")
	}
	// Merged-/usr systems make these symlinks into /usr; older ones have real directories.
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			if t, err := os.Readlink(d); err == nil {
				a = append(a, "--symlink", t, d)
			}
		case fi.IsDir():
			a = append(a, "--ro-bind", d, d)
		}
	}
	files := etcFiles
	if opts.Network == sandbox.NetworkHost {
		files = append(slices.Clone(files), etcNetFiles...)
	}
	for _, f := range files {
		a = append(a, "--ro-bind-try", f, f)
	}
	a = append(a,
		"--ro-bind", filepath.Join(runDir, "passwd"), "/etc/passwd",
		"--ro-bind", filepath.Join(runDir, "group"), "/etc/group",
		"--proc", "/proc",
		"--dev", "/dev",
		"--tmpfs", "/dev/shm", // private, like /tmp; shared-memory users need it
		"--tmpfs", "/tmp",
		"--bind", ws, sandbox.WorkspaceRoot,
		"--ro-bind", p.exe, agentPath,
		"--chdir", sandbox.WorkspaceRoot,
		"--setenv", "HOME", sandbox.WorkspaceRoot,
		"--setenv", "USER", "user",
		"--setenv", "LOGNAME", "user",
		"--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
		"--setenv", "LANG", "C.UTF-8",
		"--setenv", "TERM", "dumb",
	)
	for _, k := range slices.Sorted(maps.Keys(opts.Env)) {
		a = append(a, "--setenv", k, opts.Env[k])
	}
	a = append(a,
		"--setenv", envAgent, "1",
		"--setenv", envAgentFD, "3",
		// Everything not mounted read-write above (the workspace, /tmp, /dev/shm) is
		// read-only; the device nodes in /dev are their own mounts and stay usable.
		"--remount-ro", "/dev",
		"--remount-ro", "/",
		"--", agentPath,
	)
	return a
}

func newID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "local-" + hex.EncodeToString(b[:])
}

// Create starts a sandbox and returns once its agent answers.
func (p *Provider) Create(ctx context.Context, opts sandbox.CreateOptions) (sandbox.Sandbox, error) {
	timeout, err := p.check(opts)
	if err != nil {
		return nil, fmt.Errorf("create local sandbox: %w", err)
	}
	id := newID()
	runDir := filepath.Join(p.cfg.RunDir, id)
	if err := os.Mkdir(runDir, 0o700); err != nil {
		return nil, fmt.Errorf("create local sandbox %s: run dir: %w", id, err)
	}
	// Without a workspace of its own the sandbox gets a private, empty one that lives and
	// dies with it: what a session restores snapshots into.
	ws := opts.Workspace
	if ws == "" {
		ws = filepath.Join(runDir, "workspace")
	}
	ws, err = prepareWorkspace(ws)
	if err != nil {
		_ = os.RemoveAll(runDir)
		return nil, fmt.Errorf("create local sandbox %s: %w", id, err)
	}
	s, err := p.start(ctx, id, ws, runDir, timeout, opts)
	if err != nil {
		_ = os.RemoveAll(runDir)
		return nil, fmt.Errorf("create local sandbox %s: %w", id, err)
	}
	return s, nil
}

// check validates options and returns the lifetime to give the sandbox.
func (p *Provider) check(opts sandbox.CreateOptions) (time.Duration, error) {
	switch opts.Network {
	case "", sandbox.NetworkNone, sandbox.NetworkHost:
	default:
		return 0, fmt.Errorf("unknown network mode %q (want %q or %q)", opts.Network, sandbox.NetworkNone, sandbox.NetworkHost)
	}
	for k := range opts.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || k == envAgent || k == envAgentFD {
			return 0, fmt.Errorf("invalid environment variable name %q", k)
		}
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = p.cfg.DefaultTimeout
	}
	if timeout > p.cfg.MaxLifetime {
		return 0, fmt.Errorf("timeout %s exceeds the maximum lifetime %s", timeout, p.cfg.MaxLifetime)
	}
	return timeout, nil
}

func prepareWorkspace(dir string) (string, error) {
	ws, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("workspace: %w", err)
	}
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return "", fmt.Errorf("create workspace: %w", err)
	}
	if ws, err = filepath.EvalSymlinks(ws); err != nil {
		return "", fmt.Errorf("resolve workspace: %w", err)
	}
	return ws, nil
}

func (p *Provider) start(ctx context.Context, id, ws, runDir string, timeout time.Duration, opts sandbox.CreateOptions) (*Sandbox, error) {
	if err := os.WriteFile(filepath.Join(runDir, "passwd"), []byte(passwd), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(runDir, "group"), []byte(group), 0o644); err != nil {
		return nil, err
	}
	// The host creates the listening socket and hands it over as fd 3: the agent needs no
	// writable mount outside the workspace, and connections queue until it accepts.
	sock := filepath.Join(runDir, "agent.sock")
	if len(sock) >= 108 { // sun_path
		return nil, fmt.Errorf("agent socket path %s is too long for a unix socket; use a shorter RunDir", sock)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on agent socket: %w", err)
	}
	l.SetUnlinkOnClose(false)
	lf, err := l.File()
	l.Close()
	if err != nil {
		return nil, fmt.Errorf("agent socket file: %w", err)
	}
	defer lf.Close()

	client, err := envd.NewClient(envd.ClientConfig{SocketPath: sock})
	if err != nil {
		return nil, err
	}
	log := p.log.With("sandbox", id)
	stderr := &tailLog{log: log}
	args := p.bwrapArgs(ws, runDir, opts)
	log.Debug("starting bwrap", "args", args)
	cmd := exec.Command(BwrapPath, args...)
	cmd.Env = []string{} // bwrap --clearenv anyway; nothing of ours leaks through argv either
	cmd.ExtraFiles = []*os.File{lf}
	cmd.Stdout, cmd.Stderr = stderr, stderr
	// If the host dies, take the sandbox with it (bwrap --die-with-parent covers the inside).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	s := &Sandbox{
		id: id, p: p, log: log, cmd: cmd, client: client, runDir: runDir, workspace: ws, stderr: stderr,
		dead: make(chan struct{}), closeDone: make(chan struct{}),
	}
	s.startedAt = time.Now()
	s.endsAt = s.startedAt.Add(timeout)
	started := make(chan error, 1)
	go func() { // owner of the bwrap process: starts and reaps it; shutdown waits for it
		// Pdeathsig fires when the *thread* that forked bwrap exits, and Go may retire a
		// thread; pinning this goroutine keeps that thread alive exactly as long as bwrap.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			close(s.dead)
			started <- fmt.Errorf("start bwrap: %w", err)
			return
		}
		started <- nil
		err := cmd.Wait()
		close(s.dead)
		log.Debug("bwrap exited", "err", err)
		// Died on its own (OOM killer, someone's kill): release it like a Close. When we
		// killed it, shutdown is already under way and this just waits for it.
		s.shutdown(fmt.Sprintf("exited unexpectedly (%v)", err))
	}()
	err = <-started
	lf.Close()
	if err != nil {
		return nil, err
	}
	if err := s.waitReady(ctx); err != nil {
		s.shutdown("failed to start")
		return nil, err
	}
	s.mu.Lock()
	s.timer = time.AfterFunc(time.Until(s.endsAt), s.expire)
	s.mu.Unlock()
	log.Debug("sandbox ready", "workspace", ws, "network", opts.Network, "took", time.Since(s.startedAt))
	return s, nil
}

// waitReady polls /health until the agent answers, bwrap exits or ctx ends.
func (s *Sandbox) waitReady(ctx context.Context) error {
	for {
		hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := s.client.Health(hctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.dead:
			return fmt.Errorf("sandbox exited while starting: %s", s.stderr.String())
		case <-ctx.Done():
			return fmt.Errorf("wait for the sandbox agent: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// Sandbox is one bubblewrap sandbox.
type Sandbox struct {
	id        string
	p         *Provider
	log       *slog.Logger
	cmd       *exec.Cmd
	client    *envd.Client
	runDir    string
	workspace string // host directory mounted at /home/user
	stderr    *tailLog
	previews  previews // host listeners of PreviewURL
	startedAt time.Time

	mu     sync.Mutex
	endsAt time.Time
	timer  *time.Timer
	reason string // why it closed; "" while open

	dead      chan struct{} // closed when bwrap has exited
	closeOnce sync.Once
	closeDone chan struct{}
}

var _ sandbox.Sandbox = (*Sandbox)(nil)

// ID names the sandbox.
func (s *Sandbox) ID() string { return s.id }

// Client is the data-plane client of the sandbox's agent (for what the Sandbox interface
// does not cover, such as listing processes).
func (s *Sandbox) Client() *envd.Client { return s.client }

// StartedAt is when bwrap was started.
func (s *Sandbox) StartedAt() time.Time { return s.startedAt }

// EndsAt is when the sandbox will be killed.
func (s *Sandbox) EndsAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endsAt
}

func (s *Sandbox) closedErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reason == "" {
		return nil
	}
	return fmt.Errorf("sandbox %s %s: %w", s.id, s.reason, sandbox.ErrClosed)
}

// wrap turns a failure of a sandbox that died meanwhile into ErrClosed.
func (s *Sandbox) wrap(err error) error {
	if err == nil || errors.Is(err, sandbox.ErrClosed) {
		return err
	}
	select {
	case <-s.dead:
		if cerr := s.closedErr(); cerr != nil {
			return fmt.Errorf("%w (%v)", cerr, err)
		}
		return fmt.Errorf("sandbox %s died: %w (%v)", s.id, sandbox.ErrClosed, err)
	default:
	}
	// A connection the agent refused or dropped may mean it is gone (killed from inside,
	// say); then nothing can be done in the sandbox any more: end it and say so.
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if s.client.Health(ctx) != nil {
			s.shutdown("lost its agent")
			return fmt.Errorf("sandbox %s lost its agent: %w (%v)", s.id, sandbox.ErrClosed, err)
		}
	}
	return err
}

// SetTimeout moves the end time to now+d, within the provider's maximum lifetime.
func (s *Sandbox) SetTimeout(_ context.Context, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("set timeout of sandbox %s: %s is not positive", s.id, d)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reason != "" {
		return fmt.Errorf("set timeout of sandbox %s (%s): %w", s.id, s.reason, sandbox.ErrClosed)
	}
	end := time.Now().Add(d)
	limit := s.startedAt.Add(s.p.cfg.MaxLifetime)
	if end.After(limit) {
		return fmt.Errorf("set timeout of sandbox %s to %s: it would end at %s, past its maximum lifetime of %s (it must end by %s)",
			s.id, d, end.Format(time.RFC3339), s.p.cfg.MaxLifetime, limit.Format(time.RFC3339))
	}
	s.endsAt = end
	s.timer.Reset(d)
	return nil
}

// expire runs on the TTL timer.
func (s *Sandbox) expire() {
	s.mu.Lock()
	early := time.Now().Before(s.endsAt) // extended after the timer fired
	at := s.endsAt
	s.mu.Unlock()
	if early {
		return
	}
	s.log.Info("sandbox reached its end time; killing it", "ends_at", at)
	s.shutdown("reached its end time at " + at.Format(time.RFC3339))
}

// Close kills every process of the sandbox and removes its run directory.
func (s *Sandbox) Close(ctx context.Context) error {
	go s.shutdown("was closed")
	select {
	case <-s.closeDone:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close sandbox %s: %w", s.id, ctx.Err())
	}
}

// shutdown kills the sandbox once; later callers wait for the first to finish.
func (s *Sandbox) shutdown(reason string) { s.shutdownThen(reason, nil) }

// shutdownThen is shutdown with a step run once every process is dead, before the run
// dir goes: a handoff moves the private workspace out there. When afterKill returns
// false the run dir is kept (it still holds data).
func (s *Sandbox) shutdownThen(reason string, afterKill func() bool) {
	s.closeOnce.Do(func() {
		defer close(s.closeDone)
		s.mu.Lock()
		s.reason = reason
		if s.timer != nil {
			s.timer.Stop()
		}
		s.mu.Unlock()
		s.previews.close() // no new preview connections; the open ones end
		s.client.Close()
		s.kill()
		if afterKill != nil && !afterKill() {
			s.log.Warn("sandbox run dir kept: it still holds the workspace", "dir", s.runDir)
			return
		}
		if err := os.RemoveAll(s.runDir); err != nil {
			s.log.Warn("remove sandbox run dir", "dir", s.runDir, "err", err)
		}
	})
	<-s.closeDone
}

// kill ends the pid namespace: SIGKILL its init (bwrap's child), which makes the kernel
// kill every process in it; the outer bwrap then reaps init and exits, so nothing is left
// to be reparented. Killing the outer bwrap is the fallback.
func (s *Sandbox) kill() {
	select {
	case <-s.dead: // reaped already: its pid may belong to someone else now
		return
	default:
	}
	pid := s.cmd.Process.Pid
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid)); err == nil {
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(c, syscall.SIGKILL)
			}
		}
	}
	select {
	case <-s.dead:
		return
	case <-time.After(2 * time.Second):
	}
	_ = s.cmd.Process.Kill()
	<-s.dead
}

// Exec runs a foreground command.
func (s *Sandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	if err := s.closedErr(); err != nil {
		return sandbox.ExecResult{}, err
	}
	res, err := s.client.Exec(ctx, req)
	return res, s.wrap(err)
}

// Start runs a background command.
func (s *Sandbox) Start(ctx context.Context, req sandbox.ExecRequest) (sandbox.Process, error) {
	if err := s.closedErr(); err != nil {
		return sandbox.Process{}, err
	}
	pr, err := s.client.Start(ctx, req)
	return pr, s.wrap(err)
}

// ReadFile reads a workspace file.
func (s *Sandbox) ReadFile(ctx context.Context, path string, maxBytes int64) ([]byte, error) {
	if err := s.closedErr(); err != nil {
		return nil, err
	}
	b, err := s.client.ReadFile(ctx, path, maxBytes)
	return b, s.wrap(err)
}

// WriteFile writes a workspace file.
func (s *Sandbox) WriteFile(ctx context.Context, path string, data []byte) error {
	if err := s.closedErr(); err != nil {
		return err
	}
	return s.wrap(s.client.WriteFile(ctx, path, data))
}

// Stat describes a workspace path.
func (s *Sandbox) Stat(ctx context.Context, path string) (sandbox.FileInfo, error) {
	if err := s.closedErr(); err != nil {
		return sandbox.FileInfo{}, err
	}
	fi, err := s.client.Stat(ctx, path)
	return fi, s.wrap(err)
}

// List lists a workspace directory.
func (s *Sandbox) List(ctx context.Context, req sandbox.ListRequest) (sandbox.ListResult, error) {
	if err := s.closedErr(); err != nil {
		return sandbox.ListResult{}, err
	}
	res, err := s.client.List(ctx, req)
	return res, s.wrap(err)
}

// tailLog logs bwrap's and the agent's output line by line and keeps the last few KB
// for error messages.
type tailLog struct {
	log  *slog.Logger
	mu   sync.Mutex
	buf  []byte // incomplete line
	tail []byte
}

func (t *tailLog) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.tail = append(t.tail, p...)
	if len(t.tail) > 4<<10 {
		t.tail = t.tail[len(t.tail)-4<<10:]
	}
	t.buf = append(t.buf, p...)
	for {
		i := bytes.IndexByte(t.buf, '\n')
		if i < 0 {
			break
		}
		t.log.Info("sandbox output", "line", string(t.buf[:i]))
		t.buf = t.buf[i+1:]
	}
	if len(t.buf) > 4<<10 {
		t.log.Info("sandbox output", "line", string(t.buf))
		t.buf = t.buf[:0]
	}
	return len(p), nil
}

func (t *tailLog) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.tail))
}
