//go:build linux

// Package local is the sandbox provider for this machine: every sandbox is a bubblewrap
// (bwrap) container with a minimal read-only root, the workspace at /home/user, a private
// /tmp, an unprivileged user, no network unless asked, a seccomp filter, and a limit on
// every resource. Inside runs the envd-compatible agent (package envd) as the sandbox's
// pid 1, re-executed from the host's own binary (see agent.go), and the provider talks to
// it through a unix socket.
//
// The sandbox is hostile: everything it writes or says is input to the host. So the
// provider hands bwrap no host path that the sandbox could read back (see launch), runs
// it as an unprivileged uid when the host is root (see identity), bounds every resource
// (see Limits), never logs what the sandbox prints (see sandboxOutput), and bounds every
// wait on the agent (client.Client's deadlines): an agent that stops answering ends its
// sandbox, and the workspace stays for whoever hands it over to the next one.
package local

import (
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
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/cgroup"
	"github.com/toolhost/toolhost/internal/envd/client"
	"github.com/toolhost/toolhost/internal/lockfile"
	"github.com/toolhost/toolhost/internal/preview"
	"github.com/toolhost/toolhost/internal/reexec"
	"github.com/toolhost/toolhost/internal/seccomp"
	"github.com/toolhost/toolhost/internal/volume"
)

// BwrapPath is the bubblewrap binary (Debian package bubblewrap).
const BwrapPath = "/usr/bin/bwrap"

// ErrNoBwrap: bubblewrap is not installed.
var ErrNoBwrap = errors.New("bubblewrap is not installed (" + BwrapPath + "; Debian package bubblewrap)")

// Identity of the sandbox user inside.
const (
	sandboxUID = 1000
	sandboxGID = 1000
)

// Config configures the provider.
type Config struct {
	// RunDir holds one private directory per sandbox (its agent socket); none of it is
	// visible inside a sandbox. It must be the host user's own and writable by no one
	// else; it is created 0700. Default os.TempDir()/toolhost-run-UID.
	RunDir string
	// WorkspaceDir holds the private workspaces (and, as root, the staging mounts of host
	// directories). When the host runs as root, bubblewrap runs as the sandbox user and
	// must be able to walk to it: every directory above it must let others pass (x), as
	// /var/tmp does. It is created root:sandbox-group 0710. Default
	// /var/tmp/toolhost-workspaces-UID (disk-backed: a workspace may hold gigabytes).
	WorkspaceDir string
	// DefaultTimeout is a sandbox's lifetime when CreateOptions.Timeout is zero (1h).
	DefaultTimeout time.Duration
	// MaxLifetime caps StartedAt..EndsAt; SetTimeout refuses to go past it (24h).
	MaxLifetime time.Duration
	// Limits bound each sandbox's resources; zero fields take their defaults.
	Limits Limits
	// HostUID and HostGID are the host ids the sandbox user runs as when the host runs as
	// root; 0 means DefaultHostID. Ignored otherwise (the sandbox user is the host user).
	HostUID, HostGID int
	// Adopt, when the host runs as root and a host directory given as a workspace cannot
	// be attached through an idmapped mount (its filesystem or kernel refuses), hands every
	// entry of it that root owns to the sandbox user (HostUID) for good, instead of
	// refusing the directory. Where idmapped mounts work it changes nothing: no owner on
	// disk changes. Not as root it changes nothing either (the sandbox user is the host
	// user).
	Adopt bool
	// Pool is how many started sandboxes the provider keeps ready for each configuration
	// it is asked for (see Warm and pool.go), at most MaxPool: Create and Handoff take one
	// and attach the workspace to it. 0 (the default) keeps none. It needs root (the host
	// mounts the workspace for the sandbox); without it the provider keeps none and says so.
	Pool   int
	Logger *slog.Logger
}

// Provider creates bubblewrap sandboxes. Close releases it.
type Provider struct {
	cfg    Config
	log    *slog.Logger
	id     identity
	limits Limits
	sbDir  string // RunDir/sandboxes
	wsDir  string // WorkspaceDir

	// agent opens the agent's executable once (agent.go): this binary or the agent-only one
	// beside it, or a sealed memfd copy of either. Checking the agent-only one (hashing 12
	// MB) takes several milliseconds, so New starts it on a goroutine of its own rather than
	// on its caller's path; whatever needs the executable (a start, Close) calls agent,
	// which waits for that goroutine to end. The goroutine is thus the provider's, bounded
	// by one read of a regular file of at most maxAgentBytes.
	agent    func() (*os.File, error)
	seccomp  []byte // the filter; nil when this architecture has none
	cgroups  *cgroup.Manager
	cgSup    cgroup.Support
	volumes  *volume.Pool   // nil when volumes are unavailable
	spare    *spareVolume   // with volumes: the next private workspace, made ahead
	pool     *sparePool     // with Config.Pool: sandboxes made ahead (pool.go)
	retired  sync.WaitGroup // shutdowns of sandboxes frozen by a handoff (handoff.go); Close waits
	enforced []Enforcement
	userns   usernsCache // the mappings of idmapped host workspaces (idmap.go)
	noIdmap  bool        // tests: act as if idmapped mounts were refused

	freezeWait time.Duration // a handoff's bound on freezing the old sandbox: freezeBound; tests raise it
}

var _ sandbox.Provider = (*Provider)(nil)

// New checks that bubblewrap and this executable are usable, prepares the run and
// workspace directories, finds how each limit can be enforced here and logs it (a limit
// that cannot be enforced is a warning, never silent).
func New(cfg Config) (*Provider, error) {
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = time.Hour
	}
	if cfg.MaxLifetime <= 0 {
		cfg.MaxLifetime = 24 * time.Hour
	}
	if cfg.Pool < 0 || cfg.Pool > MaxPool {
		return nil, fmt.Errorf("local provider: pool %d: must be between 0 and %d", cfg.Pool, MaxPool)
	}
	if cfg.DefaultTimeout > cfg.MaxLifetime {
		return nil, fmt.Errorf("local provider: default timeout %s exceeds max lifetime %s", cfg.DefaultTimeout, cfg.MaxLifetime)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.HostUID == 0 {
		cfg.HostUID = DefaultHostID
	}
	if cfg.HostGID == 0 {
		cfg.HostGID = cfg.HostUID
	}
	if cfg.RunDir == "" {
		cfg.RunDir = DefaultRunDir()
	}
	if cfg.WorkspaceDir == "" {
		cfg.WorkspaceDir = DefaultWorkspaceDir()
	}
	if _, err := os.Stat(BwrapPath); err != nil {
		return nil, fmt.Errorf("local provider: %w: %v", ErrNoBwrap, err)
	}
	if err := reexec.Check(); err != nil {
		return nil, fmt.Errorf("local provider: the sandbox's agent: %w", err)
	}
	id, err := newIdentity(cfg.HostUID, cfg.HostGID)
	if err != nil {
		return nil, fmt.Errorf("local provider: %w", err)
	}
	p := &Provider{cfg: cfg, log: cfg.Logger, id: id, limits: cfg.Limits.withDefaults(), freezeWait: freezeBound}
	if l := p.limits; l.MemoryBytes > 0 && l.TmpBytes+l.ShmBytes >= l.MemoryBytes {
		// Files alone would fill the memory limit, and the OOM killer would then pick the
		// biggest process: the agent.
		return nil, fmt.Errorf("local provider: the memory limit (%s) must exceed /tmp and /dev/shm together (%s)",
			humanBytes(l.MemoryBytes), humanBytes(l.TmpBytes+l.ShmBytes))
	}
	if err := p.prepareDirs(); err != nil {
		return nil, fmt.Errorf("local provider: %w", err)
	}
	p.agent = sync.OnceValues(func() (*os.File, error) { return agentExecutable(id, p.log) })
	if agentDigest != "" {
		go p.agent() // see Provider.agent
	} else if _, err := p.agent(); err != nil {
		return nil, fmt.Errorf("local provider: %w", err)
	}
	seccompErr := error(nil)
	if p.seccomp, seccompErr = seccomp.Program(); seccompErr != nil {
		p.seccomp = nil
	}
	p.cgroups, err = cgroup.Open("toolhost", p.log)
	if err != nil {
		if f, _ := p.agent(); f != nil {
			f.Close()
		}
		return nil, fmt.Errorf("local provider: cgroups: %w", err)
	}
	p.cgSup = p.cgroups.Support()
	volumesErr := errors.New("disabled")
	if p.limits.DiskBytes > 0 {
		if volumesErr = volume.Check(); volumesErr == nil {
			p.volumes, volumesErr = volume.New(volume.Config{
				Dir: p.wsDir, Size: p.limits.DiskBytes,
				RootUID: rootOwner(id), RootGID: id.gid, RootMode: rootMode(id),
				Logger: p.log,
			})
		}
	}
	p.prune()
	if p.volumes != nil {
		p.spare = newSpareVolume(p.volumes)
	}
	switch {
	case cfg.Pool > 0 && id.root:
		p.pool = newSparePool(p, cfg.Pool)
	case cfg.Pool > 0:
		p.log.Info("no spare sandboxes: keeping them needs root (the host mounts each workspace for its sandbox)")
	}
	p.enforced = p.enforcement(p.cgSup, volumesErr, seccompErr)
	p.log.Info("sandbox limits", "limits", limitsLine(p.enforced), "user", p.userLine())
	for _, e := range p.enforced {
		if e.Missing != "" {
			p.log.Warn("sandbox limit not enforced", "resource", e.Resource, "limit", e.Limit, "why", e.Missing)
		}
	}
	return p, nil
}

func rootOwner(id identity) int {
	if id.root {
		return 0
	}
	return id.uid
}

func rootMode(id identity) os.FileMode {
	if id.root {
		return 0o770
	}
	return 0o700
}

func (p *Provider) userLine() string {
	if p.id.root {
		return fmt.Sprintf("sandbox user 1000 is host uid %d gid %d (unprivileged); host root is not mapped", p.id.uid, p.id.gid)
	}
	return fmt.Sprintf("sandbox user 1000 is the host user (uid %d): not running as root, so there is no other uid to give it", p.id.uid)
}

// Enforcement reports each limit and how it is enforced on this host.
func (p *Provider) Enforcement() []Enforcement { return slices.Clone(p.enforced) }

// Close releases what the provider holds, after waiting (within ctx) for the deletion
// of closed workspaces' volumes. Sandboxes still open keep working until they are closed.
func (p *Provider) Close(ctx context.Context) error {
	if p.pool != nil {
		p.pool.close() // before the agent's executable and the volumes: spares use both
	}
	p.retired.Wait() // bounded: each is a kill (kill bounds its waits) and a cleanup
	err := p.userns.close()
	if f, _ := p.agent(); f != nil {
		err = errors.Join(err, f.Close())
	}
	if p.spare != nil {
		err = errors.Join(err, p.spare.close())
	}
	if p.volumes != nil {
		err = errors.Join(err, p.volumes.Close(ctx))
	}
	return err
}

const (
	passwd = "root:x:0:0:root:/root:/usr/sbin/nologin\n" +
		"user:x:1000:1000:user:/home/user:/bin/bash\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
	group = "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n"
	// gitconfig: the workspace root belongs to someone else (root, as the sandbox sees
	// "nobody") when the host is root, which git's safe.directory check would refuse.
	gitconfig = "[safe]\n\tdirectory = *\n"
)

// etcFiles are copied (files) or bound read-only (directories) from the host when present:
// what the loader and common tools need, nothing secret.
var etcFiles = []string{
	"/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
	"/etc/localtime", "/etc/nsswitch.conf", "/etc/ssl/certs", "/etc/ca-certificates",
	"/etc/mime.types", "/etc/bash.bashrc", "/etc/profile", "/etc/inputrc",
}

// etcNetFiles are added with NetworkHost.
var etcNetFiles = []string{"/etc/resolv.conf", "/etc/hosts", "/etc/host.conf", "/etc/gai.conf"}

// plan builds the bubblewrap invocation of one sandbox: its arguments and descriptors.
// listener is the agent's listening socket (it becomes descriptor 3 in the sandbox).
func (p *Provider) plan(ws *workspace, listener *os.File, info, block *os.File, opts sandbox.CreateOptions, egress *egressLink) (*launch, error) {
	l := &launch{}
	agentFD := l.add(listener)
	l.arg(
		"--unshare-user", "--uid", strconv.Itoa(sandboxUID), "--gid", strconv.Itoa(sandboxGID),
		// No nested user namespaces: they would hand the sandbox capabilities over new
		// namespaces and with them much more kernel surface (bwrap >= 0.8).
		"--disable-userns",
		// The agent is the sandbox's pid 1: the kernel then drops SIGKILL and SIGSTOP sent
		// to it from inside, and the seccomp filter refuses the rest (kill(1, ...)).
		"--unshare-pid", "--as-pid-1", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
		"--hostname", "sandbox",
		"--die-with-parent", "--new-session", "--clearenv",
		"--cap-drop", "ALL",
		"--ro-bind", "/usr", "/usr",
	)
	if opts.Network != sandbox.NetworkHost {
		l.arg("--unshare-net")
	}
	// Merged-/usr systems make these symlinks into /usr; older ones have real directories.
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			if t, err := os.Readlink(d); err == nil {
				l.arg("--symlink", t, d)
			}
		case fi.IsDir():
			l.arg("--ro-bind", d, d)
		}
	}
	files := etcFiles
	if opts.Network == sandbox.NetworkHost {
		files = append(slices.Clone(files), etcNetFiles...)
	}
	// /etc is a directory of the sandbox's root tmpfs, read-only with it (--remount-ro /
	// below). Its files are copies made here (--file: no mount, so bubblewrap does not
	// re-read its mount table after each as it does after a bind); the host's directories
	// stay read-only binds.
	for _, f := range files {
		if err := etcCopy(l, f); err != nil {
			l.close()
			return nil, err
		}
	}
	for _, d := range []struct{ name, dest, data string }{
		{"passwd", "/etc/passwd", passwd}, {"group", "/etc/group", group}, {"gitconfig", "/etc/gitconfig", gitconfig},
	} {
		fd, err := l.data(d.name, []byte(d.data))
		if err != nil {
			l.close()
			return nil, err
		}
		l.arg("--perms", "0444", "--file", fd, d.dest)
	}
	if egress != nil {
		if err := egress.plan(l); err != nil {
			l.close()
			return nil, err
		}
	}
	lim := p.limits
	l.arg("--proc", "/proc", "--dev", "/dev")
	if lim.ShmBytes > 0 {
		l.arg("--size", strconv.FormatInt(lim.ShmBytes, 10))
	}
	l.arg("--tmpfs", "/dev/shm") // private, like /tmp; shared-memory users need it
	if lim.TmpBytes > 0 {
		l.arg("--size", strconv.FormatInt(lim.TmpBytes, 10))
	}
	l.arg("--tmpfs", "/tmp",
		"--bind", ws.path, sandbox.WorkspaceRoot,
		"--chdir", sandbox.WorkspaceRoot,
		"--setenv", "HOME", sandbox.WorkspaceRoot,
		"--setenv", "USER", "user",
		"--setenv", "LOGNAME", "user",
		"--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
		"--setenv", "LANG", "C.UTF-8",
		"--setenv", "TERM", "dumb",
	)
	for _, k := range slices.Sorted(maps.Keys(opts.Env)) {
		l.arg("--setenv", k, opts.Env[k])
	}
	l.arg(
		"--setenv", envAgent, "1",
		"--setenv", envAgentFD, agentFD,
		"--setenv", envAgentRlimits, p.rlimits(p.cgSup.Pids.OK()),
		// Everything not mounted read-write above (the workspace, /tmp, /dev/shm) is
		// read-only; the device nodes in /dev are their own mounts and stay usable.
		"--remount-ro", "/dev",
		"--remount-ro", "/",
		"--info-fd", l.add(info),
		// The first process waits here, set up but not yet running the agent, until the
		// host has put it in its cgroups and set its rlimits (so nothing escapes them).
		"--block-fd", l.add(block),
	)
	if p.seccomp != nil {
		fd, err := l.data("seccomp", p.seccomp)
		if err != nil {
			l.close()
			return nil, err
		}
		l.arg("--seccomp", fd)
	}
	// The agent (this very binary, or the agent-only one beside it) runs through an
	// inherited descriptor: no host path of it is mounted in the sandbox.
	agent, err := p.agent()
	if err != nil {
		l.close()
		return nil, fmt.Errorf("the sandbox's agent: %w", err)
	}
	exe, err := dupFile(agent)
	if err != nil {
		l.close()
		return nil, err
	}
	l.command = "/proc/self/fd/" + l.add(exe)
	return l, nil
}

// etcCopy adds the host's path to the plan: a directory as a read-only bind, a regular
// file as a copy (--file) of its content at this moment, with the host's mode less any
// write bits. Symlinks are followed, as a bind follows them. Nothing is added for a path
// that does not exist, is neither, or is not readable by everyone on the host (the sandbox
// user could not have read it through a bind either; a copy would be readable by it).
func etcCopy(l *launch, path string) error {
	// O_NONBLOCK: opening a FIFO put in the way does not wait for a writer.
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) {
			return nil
		}
		return fmt.Errorf("open %s: %w", path, err)
	}
	fi, err := f.Stat()
	switch {
	case err != nil:
		f.Close()
		return fmt.Errorf("stat %s: %w", path, err)
	case fi.IsDir():
		f.Close()
		l.arg("--ro-bind-try", path, path)
		return nil
	case !fi.Mode().IsRegular() || fi.Mode().Perm()&0o004 == 0:
		f.Close()
		return nil
	}
	if err := unix.SetNonblock(int(f.Fd()), false); err != nil {
		f.Close()
		return fmt.Errorf("open %s: %w", path, err)
	}
	l.arg("--perms", fmt.Sprintf("%04o", fi.Mode().Perm()&0o555), "--file", l.add(f), path)
	return nil
}

func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup %s: %w", f.Name(), err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
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
	if p.pool != nil {
		p.pool.want(opts)
		if spare := p.pool.take(opts); spare != nil {
			s, err := p.createFrom(ctx, spare, timeout, opts)
			if err == nil {
				return s, nil
			}
			if errors.Is(err, ErrOwnersKept) {
				return nil, fmt.Errorf("create local sandbox %s: %w", spare.id, err)
			}
			p.log.Warn("a spare sandbox could not be taken; starting one", "err", err)
		}
	}
	id := newID()
	ws, err := p.newWorkspace(ctx, id, opts.Workspace)
	if err != nil {
		return nil, fmt.Errorf("create local sandbox %s: %w", id, err)
	}
	s, err := p.start(ctx, id, ws, timeout, opts)
	if err != nil {
		if rerr := ws.release(); rerr != nil {
			p.log.Warn("release the workspace of a sandbox that did not start", "sandbox", id, "err", rerr)
		}
		return nil, fmt.Errorf("create local sandbox %s: %w", id, err)
	}
	return s, nil
}

// createFrom gives a spare sandbox its workspace: a host directory is staged exactly as for
// a sandbox started on it (as root through an idmapped mount, owners kept), and the staged
// mount is what the slot shows.
func (p *Provider) createFrom(ctx context.Context, spare *Sandbox, timeout time.Duration, opts sandbox.CreateOptions) (*Sandbox, error) {
	ws, err := p.newWorkspace(ctx, spare.id, opts.Workspace)
	if err != nil {
		spare.shutdown("was a spare whose workspace could not be made")
		return nil, err
	}
	if err := spare.takeOver(ctx, ws, timeout); err != nil {
		if rerr := ws.release(); rerr != nil {
			p.log.Warn("release the workspace of a spare that could not be taken", "sandbox", spare.id, "err", rerr)
		}
		return nil, err
	}
	spare.log.Debug("sandbox taken from the pool", "workspace", ws.path, "kind", ws.kind)
	return spare, nil
}

// check validates options and returns the lifetime to give the sandbox.
func (p *Provider) check(opts sandbox.CreateOptions) (time.Duration, error) {
	switch opts.Network {
	case "", sandbox.NetworkNone, sandbox.NetworkHost:
	case sandbox.NetworkEgress:
		if opts.Egress == nil || opts.Egress.Gateway == nil {
			return 0, fmt.Errorf("network %q needs the host's egress gateway (CreateOptions.Egress.Gateway)", opts.Network)
		}
	default:
		return 0, fmt.Errorf("unknown network mode %q (want %q, %q or %q)", opts.Network, sandbox.NetworkNone, sandbox.NetworkEgress, sandbox.NetworkHost)
	}
	for k := range opts.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || k == envAgent || k == envAgentFD || k == envAgentRlimits || k == envAgentEgress {
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

// start runs bwrap for a sandbox over ws. On failure ws is left to the caller.
func (p *Provider) start(ctx context.Context, id string, ws *workspace, timeout time.Duration, opts sandbox.CreateOptions) (*Sandbox, error) {
	runDir := filepath.Join(p.sbDir, id)
	if err := os.Mkdir(runDir, 0o700); err != nil {
		return nil, fmt.Errorf("run dir: %w", err)
	}
	lock, err := holdLock(filepath.Join(runDir, "lock"+lockSuffix), "sandbox")
	if err != nil {
		_ = os.RemoveAll(runDir)
		return nil, fmt.Errorf("run dir: %w", err)
	}
	s, err := p.startIn(ctx, id, runDir, lock, ws, timeout, opts)
	if err != nil {
		_ = os.RemoveAll(runDir) // the lock file with it: we hold it
		_ = lock.Release()
		return nil, err
	}
	return s, nil
}

func (p *Provider) startIn(ctx context.Context, id, runDir string, lock *lockfile.Lock, ws *workspace, timeout time.Duration, opts sandbox.CreateOptions) (*Sandbox, error) {
	begin := time.Now()
	// The host creates the listening socket and hands it over as a descriptor: the agent
	// needs no writable mount outside the workspace, and connections queue until it
	// accepts.
	sock := filepath.Join(runDir, "agent.sock")
	if len(sock) >= 108 { // sun_path
		return nil, fmt.Errorf("agent socket path %s is too long for a unix socket; use a shorter RunDir", sock)
	}
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on agent socket: %w", err)
	}
	ul.SetUnlinkOnClose(false)
	lf, err := ul.File()
	ul.Close()
	if err != nil {
		return nil, fmt.Errorf("agent socket file: %w", err)
	}
	client, err := client.New(client.Config{SocketPath: sock})
	if err != nil {
		lf.Close()
		return nil, err
	}
	log := p.log.With("sandbox", id)

	var cg *cgroup.Group
	if p.cgSup.Memory.OK() || p.cgSup.Pids.OK() || p.cgSup.CPU.OK() || p.cgSup.Kill.OK() {
		if cg, err = p.cgroups.Create(id, cgroup.Limits{MemoryBytes: p.limits.MemoryBytes, Pids: p.limits.Processes, CPUs: p.limits.CPUs}); err != nil {
			lf.Close()
			return nil, fmt.Errorf("cgroup: %w", err)
		}
	}
	fail := func(err error) (*Sandbox, error) {
		if cg != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = cg.Close(cctx)
			cancel()
		}
		return nil, err
	}

	infoR, infoW, err := os.Pipe()
	if err != nil {
		lf.Close()
		return fail(err)
	}
	defer infoR.Close()
	blockR, blockW, err := os.Pipe()
	if err != nil {
		lf.Close()
		infoW.Close()
		return fail(err)
	}
	defer blockW.Close()
	var egress *egressLink
	if opts.Network == sandbox.NetworkEgress {
		if egress, err = newEgressLink(opts, id, log); err != nil {
			lf.Close()
			infoW.Close()
			blockR.Close()
			return fail(err)
		}
	}
	plan, err := p.plan(ws, lf, infoW, blockR, opts, egress)
	if err != nil {
		lf.Close()
		infoW.Close()
		blockR.Close()
		if egress != nil {
			egress.close()
		}
		return fail(err)
	}
	argsFD, err := plan.data("args", plan.argsData())
	if err != nil {
		plan.close()
		return fail(err)
	}
	out := &sandboxOutput{log: log}
	// bwrap takes the command itself from its real command line, after the options.
	cmd := exec.Command(BwrapPath, "--args", argsFD, "--", plan.command)
	cmd.Env = []string{} // bwrap --clearenv anyway; nothing of ours leaks through argv either
	cmd.ExtraFiles = plan.files
	cmd.Stderr = out // stdout: /dev/null
	// Wait returns once bwrap has exited and its stderr is drained; a process of the
	// sandbox that outlived bwrap (kill ends them all, but belt and braces) would hold
	// that pipe, and Wait with it, forever.
	cmd.WaitDelay = waitDelay
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// If the host dies, take the sandbox with it (bwrap --die-with-parent covers the
		// inside).
		Pdeathsig:  syscall.SIGKILL,
		Credential: p.id.credential(),
	}
	s := &Sandbox{
		id: id, p: p, log: log, cmd: cmd, client: client, runDir: runDir, lock: lock, ws: ws, out: out, cg: cg,
		egress: egress, dead: make(chan struct{}), closeDone: make(chan struct{}), initFD: -1,
	}
	if egress != nil {
		egress.start() // shutdown closes it, whichever way the start goes from here
	}
	s.startedAt = time.Now()
	s.endsAt = s.startedAt.Add(timeout)
	started := make(chan error, 1)
	go func() { // owner of the bwrap process: starts and reaps it; shutdown waits for it
		// Pdeathsig fires when the *thread* that forked bwrap exits, and Go may retire a
		// thread; pinning this goroutine keeps that thread alive exactly as long as bwrap.
		runtime.LockOSThread()
		// In its cgroup from birth (the cgroup package forks it from inside the group),
		// so bwrap's cgroup namespace is rooted there and the sandbox sees "/" as its
		// cgroup, not the host's layout.
		start := cmd.Start
		if cg != nil {
			start = func() error { return cg.Start(cmd) }
		}
		if err := start(); err != nil {
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
		s.shutdown(fmt.Sprintf("exited unexpectedly (%v; last output: %s)", err, out))
	}()
	err = <-started
	forked := time.Now()
	plan.close() // the child has its copies
	if err != nil {
		if egress != nil {
			egress.close()
		}
		return fail(err)
	}
	if err := s.admit(ctx, infoR, blockW); err != nil {
		s.shutdown("failed to start") // closes the cgroup too
		return nil, err
	}
	admitted := time.Now()
	if err := s.waitReady(ctx); err != nil {
		s.shutdown("failed to start")
		return nil, err
	}
	s.mu.Lock()
	s.timer = time.AfterFunc(time.Until(s.endsAt), s.expire)
	s.mu.Unlock()
	// Where the start's time went (docs/BENCHMARKS.md, issue 18): the host's preparation
	// (run dir, socket, cgroup and its limits, bwrap's plan), forking bwrap into its
	// cgroups, bwrap's own start until it names the sandbox's first process, and the rest
	// of bwrap's setup (namespaces, mounts, seccomp) with the agent's start and its first
	// answer.
	now := time.Now()
	log.Debug("sandbox ready", "workspace", ws.path, "network", opts.Network, "took", now.Sub(s.startedAt),
		slog.Group("phases", "prepare", s.startedAt.Sub(begin), "fork", forked.Sub(s.startedAt),
			"admit", admitted.Sub(forked), "agent", now.Sub(admitted)))
	return s, nil
}

// waitDelay bounds how long Wait waits for bwrap's stderr after bwrap exited;
// admitGrace, how long a cancelled create still waits to learn the sandbox's first
// process (bwrap tells it at once; the bound is for a bwrap that hangs).
const (
	waitDelay  = 2 * time.Second
	admitGrace = 10 * time.Second
)

// admit learns the host pid of the sandbox's first process, which bwrap holds before it
// runs the agent, and lets it go.
//
// A create cancelled meanwhile still learns the pid before it returns: the first process
// is pid 1 of its own namespace and outlives the outer bwrap, and once the host closes
// the block descriptor it runs the agent. Only with its pid can kill end the namespace
// (on a host without cgroups nothing else can), so no cancelled create leaves a sandbox
// running on its own.
func (s *Sandbox) admit(ctx context.Context, info *os.File, block *os.File) error {
	type result struct {
		pid int
		err error
	}
	got := make(chan result, 1)
	go func() { // owned by admit: ends when bwrap writes or closes its info descriptor
		pid, err := readChildPID(info)
		got <- result{pid, err}
	}()
	var r result
	select {
	case r = <-got:
	case <-s.dead:
		return fmt.Errorf("sandbox exited while starting: %s", s.out)
	case <-ctx.Done():
		select {
		case r = <-got:
			if r.err == nil {
				s.holdInit(r.pid)
			}
		case <-s.dead:
		case <-time.After(admitGrace):
			s.log.Warn("bwrap did not say its first process's pid in time", "waited", admitGrace)
		}
		return fmt.Errorf("wait for bwrap: %w", ctx.Err())
	}
	if r.err != nil {
		return fmt.Errorf("%w (bwrap said: %s)", r.err, s.out)
	}
	s.holdInit(r.pid)

	if _, err := block.Write([]byte{1}); err != nil {
		return fmt.Errorf("let the sandbox run: %w (bwrap said: %s)", err, s.out)
	}
	return nil
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
			return fmt.Errorf("sandbox exited while starting: %s", s.out)
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
	client    *client.Client
	runDir    string
	lock      *lockfile.Lock // held while the run dir is in use (see prune)
	out       *sandboxOutput
	cg        *cgroup.Group      // nil when the host has no cgroups for us
	egress    *egressLink        // nil unless the network is egress
	initPID   int                // host pid of the sandbox's pid 1 (the agent)
	initFD    int                // pidfd of initPID, or -1: kill signals the very process, never a reused pid
	slot      *slot              // a spare's (pool.go): what bwrap bound at /home/user; nil otherwise
	previews  preview.Forwarders // host listeners of PreviewURL
	startedAt time.Time
	frozen    atomic.Bool // a handoff froze its cgroup (retire): it dies on the provider's time

	mu     sync.Mutex
	endsAt time.Time
	timer  *time.Timer
	reason string     // why it closed; "" while open
	ws     *workspace // nil once released or handed over

	dead      chan struct{} // closed when bwrap has exited
	closeOnce sync.Once
	closeDone chan struct{}
}

var _ sandbox.Sandbox = (*Sandbox)(nil)

// ID names the sandbox.
func (s *Sandbox) ID() string { return s.id }

var (
	_ sandbox.ProcessLister   = (*Sandbox)(nil)
	_ sandbox.GuardedFiles    = (*Sandbox)(nil)
	_ sandbox.ArchiveReporter = (*Sandbox)(nil)
	_ sandbox.PortLister      = (*Sandbox)(nil)
)

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

// refused is closedErr for a call that has done nothing yet: it wraps sandbox.ErrNotRun
// too, so a session may run it on the next sandbox whatever it is.
func (s *Sandbox) refused() error {
	if err := s.closedErr(); err != nil {
		return fmt.Errorf("%w (%w)", err, sandbox.ErrNotRun)
	}
	return nil
}

// wrap turns a failure of a sandbox that died meanwhile into ErrClosed, and ends a
// sandbox whose agent stopped answering (it wraps both ErrUnresponsive and ErrClosed then).
func (s *Sandbox) wrap(err error) error {
	if err == nil || errors.Is(err, sandbox.ErrClosed) {
		return err
	}
	select {
	case <-s.dead:
		if cerr := s.closedErr(); cerr != nil {
			return fmt.Errorf("%w: %w", cerr, err)
		}
		return fmt.Errorf("sandbox %s died: %w: %w", s.id, sandbox.ErrClosed, err)
	default:
	}
	if errors.Is(err, sandbox.ErrUnresponsive) {
		// Stopped (SIGSTOP cannot reach it from inside, but a starved or wedged agent is
		// as bad): nothing more can be done in this sandbox. Its workspace stays, for a
		// handoff to the next one.
		s.log.Warn("sandbox agent stopped answering; ending the sandbox", "err", err)
		s.shutdown("stopped answering")
		return fmt.Errorf("sandbox %s stopped answering and was ended: %w", s.id, errors.Join(sandbox.ErrClosed, err))
	}
	// A connection the agent refused or dropped may mean it is gone (killed from inside,
	// say); then nothing can be done in the sandbox any more: end it and say so.
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if s.client.Health(ctx) != nil {
			s.shutdown("lost its agent")
			return fmt.Errorf("sandbox %s lost its agent: %w: %w", s.id, sandbox.ErrClosed, err)
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

// Close kills every process of the sandbox, removes its run directory and releases its
// workspace (unless a handoff took it).
func (s *Sandbox) Close(ctx context.Context) error {
	go s.shutdown("was closed")
	select {
	case <-s.closeDone:
	case <-ctx.Done():
		return fmt.Errorf("close sandbox %s: %w", s.id, ctx.Err())
	}
	s.mu.Lock()
	ws := s.ws
	s.ws = nil
	s.mu.Unlock()
	if ws != nil {
		if err := ws.release(); err != nil {
			return fmt.Errorf("close sandbox %s: release its workspace: %w", s.id, err)
		}
	}
	return nil
}

// takeWorkspace hands the workspace of an ended sandbox to its successor (Handoff).
func (s *Sandbox) takeWorkspace() *workspace {
	<-s.closeDone
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := s.ws
	s.ws = nil
	return ws
}

// shutdown kills the sandbox once; later callers wait for the first to finish. The
// workspace stays (Close releases it, Handoff takes it): a sandbox that died or stopped
// answering has not lost its files.
func (s *Sandbox) shutdown(reason string) {
	s.closeOnce.Do(func() {
		defer close(s.closeDone)
		s.mu.Lock()
		s.reason = reason
		if s.timer != nil {
			s.timer.Stop()
		}
		s.mu.Unlock()
		s.previews.Close() // no new preview connections; the open ones end
		s.client.Close()
		s.kill()
		if s.egress != nil {
			s.egress.close() // after the kill: no agent is left to send more
		}
		s.mu.Lock()
		sl := s.slot
		s.mu.Unlock()
		if sl != nil { // the workspace is free for a handoff once this is done
			if err := sl.release(); err != nil {
				s.log.Warn("release the sandbox's slot", "err", err)
			}
		}
		if err := os.RemoveAll(s.runDir); err != nil {
			s.log.Warn("remove sandbox run dir", "dir", s.runDir, "err", err)
		}
		_ = s.lock.Release() // its file went with the run dir
		if reason != "was closed" && !strings.HasPrefix(reason, "was handed off") && !strings.HasPrefix(reason, "was a spare") {
			s.log.Warn("sandbox ended", "reason", reason)
		}
	})
	<-s.closeDone
}

// holdInit records the host pid of the sandbox's first process and opens a pidfd on it,
// while bwrap still holds it (blocked on its block descriptor, it cannot have exited and
// been reaped, so the pid is still its own). Its parent must be the outer bwrap.
func (s *Sandbox) holdInit(pid int) {
	s.initPID = pid
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // kernels before 5.3: kill falls back to the pid
	}
	if ppid, err := parentPID(pid); err != nil || ppid != s.cmd.Process.Pid {
		unix.Close(fd)
		s.initPID = 0
		return
	}
	s.initFD = fd
}

// parentPID reads the parent of pid from /proc.
func parentPID(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold anything: count fields after its last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	return strconv.Atoi(f[1])
}

// killInit sends SIGKILL to the sandbox's first process: through its pidfd, which names
// that very process even after it was reaped; by pid only while bwrap, its parent, has
// not exited (until then no one reaps it and the pid cannot be reused).
func (s *Sandbox) killInit() {
	switch {
	case s.initFD >= 0:
		_ = unix.PidfdSendSignal(s.initFD, unix.SIGKILL, nil, 0)
	case s.initPID > 0:
		select {
		case <-s.dead:
		default:
			_ = syscall.Kill(s.initPID, syscall.SIGKILL)
		}
	}
}

// kill ends the pid namespace: SIGKILL its init (the agent), which makes the kernel kill
// every process in it; the outer bwrap then reaps init and exits, so nothing is left to be
// reparented, and once bwrap has exited every process of the sandbox is gone. When init
// is unknown (bwrap never said it) or does not go, the cgroup, which holds every process
// of the sandbox from bwrap's birth on whatever state its start was in, is killed; the
// outer bwrap last. The cgroup is emptied and removed in any case. Every wait is bounded.
func (s *Sandbox) kill() {
	defer func() {
		if s.cg != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := s.cg.Close(ctx); err != nil {
				s.log.Warn("remove the sandbox's cgroup", "err", err)
			}
			cancel()
		}
		if s.initFD >= 0 {
			unix.Close(s.initFD)
			s.initFD = -1
		}
	}()
	killGroup := func() {
		if s.cg == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := s.cg.Kill(ctx); err != nil {
			s.log.Warn("kill the sandbox's cgroup", "err", err)
		}
		cancel()
	}
	if s.frozen.Load() {
		s.killFrozen(killGroup)
	}
	if s.initFD < 0 && s.initPID <= 0 {
		killGroup()
	}
	s.killInit()
	select {
	case <-s.dead:
		return
	case <-time.After(2 * time.Second):
	}
	killGroup()
	_ = s.cmd.Process.Kill()
	select {
	case <-s.dead:
	case <-time.After(waitDelay + 5*time.Second):
		// Wait is bounded by WaitDelay once bwrap exits; a bwrap that a SIGKILL does not
		// end is a kernel matter. Do not hold the caller (a process being told to stop).
		s.log.Error("bwrap did not exit after SIGKILL", "pid", s.cmd.Process.Pid)
	}
}

// Exec runs a foreground command.
func (s *Sandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	if err := s.refused(); err != nil {
		return sandbox.ExecResult{}, err
	}
	kills := s.oomKills()
	res, err := s.client.Exec(ctx, req)
	if res.ExitCode == -1 && !res.TimedOut && s.oomKills() > kills {
		res.OOMKilled = true
	}
	return res, s.wrap(err)
}

// oomKills counts the processes the sandbox's memory limit has killed so far.
func (s *Sandbox) oomKills() int64 {
	if s.cg == nil {
		return 0
	}
	n, err := s.cg.OOMKills()
	if err != nil {
		return 0
	}
	return n
}

// Start runs a background command.
func (s *Sandbox) Start(ctx context.Context, req sandbox.ExecRequest) (sandbox.Process, error) {
	if err := s.refused(); err != nil {
		return sandbox.Process{}, err
	}
	pr, err := s.client.Start(ctx, req)
	return pr, s.wrap(err)
}

// ReadFile reads a workspace file.
func (s *Sandbox) ReadFile(ctx context.Context, path string, maxBytes int64) ([]byte, error) {
	if err := s.refused(); err != nil {
		return nil, err
	}
	b, err := s.client.ReadFile(ctx, path, maxBytes)
	return b, s.wrap(err)
}

// WriteFile writes a workspace file.
func (s *Sandbox) WriteFile(ctx context.Context, path string, data []byte) error {
	if err := s.refused(); err != nil {
		return err
	}
	return s.wrap(s.client.WriteFile(ctx, path, data))
}

// ReadFileGuarded reads a workspace file with the guard checked by the agent as it opens
// the path (sandbox.GuardedFiles).
func (s *Sandbox) ReadFileGuarded(ctx context.Context, path string, maxBytes int64, g sandbox.FileGuard) ([]byte, error) {
	if err := s.refused(); err != nil {
		return nil, err
	}
	b, err := s.client.ReadFileGuarded(ctx, path, maxBytes, g)
	return b, s.wrap(err)
}

// WriteFileGuarded writes a workspace file with the guard checked by the agent in the same
// step: a versioned write is decided under a lock on the file's directory that every
// sandbox sharing the directory takes (sandbox.GuardedFiles).
func (s *Sandbox) WriteFileGuarded(ctx context.Context, path string, data []byte, g sandbox.FileGuard) error {
	if err := s.refused(); err != nil {
		return err
	}
	return s.wrap(s.client.WriteFileGuarded(ctx, path, data, g))
}

// StatGuarded, ListGuarded and RemoveFileGuarded are Stat, List and a file's removal with
// the guard checked by the agent as it opens the path (sandbox.GuardedFiles).
func (s *Sandbox) StatGuarded(ctx context.Context, path string, g sandbox.FileGuard) (sandbox.FileInfo, error) {
	if err := s.refused(); err != nil {
		return sandbox.FileInfo{}, err
	}
	fi, err := s.client.StatGuarded(ctx, path, g)
	return fi, s.wrap(err)
}

func (s *Sandbox) ListGuarded(ctx context.Context, req sandbox.ListRequest, g sandbox.FileGuard) (sandbox.ListResult, error) {
	if err := s.refused(); err != nil {
		return sandbox.ListResult{}, err
	}
	res, err := s.client.ListGuarded(ctx, req, g)
	return res, s.wrap(err)
}

func (s *Sandbox) RemoveFileGuarded(ctx context.Context, path string, g sandbox.FileGuard) error {
	if err := s.refused(); err != nil {
		return err
	}
	return s.wrap(s.client.RemoveFileGuarded(ctx, path, g))
}

// Stat describes a workspace path.
func (s *Sandbox) Stat(ctx context.Context, path string) (sandbox.FileInfo, error) {
	if err := s.refused(); err != nil {
		return sandbox.FileInfo{}, err
	}
	fi, err := s.client.Stat(ctx, path)
	return fi, s.wrap(err)
}

// List lists a workspace directory.
func (s *Sandbox) List(ctx context.Context, req sandbox.ListRequest) (sandbox.ListResult, error) {
	if err := s.refused(); err != nil {
		return sandbox.ListResult{}, err
	}
	res, err := s.client.List(ctx, req)
	return res, s.wrap(err)
}
