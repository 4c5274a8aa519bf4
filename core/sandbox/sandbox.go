// Package sandbox defines where tools act: a Provider creates Sandboxes, and a Sandbox runs
// processes and touches files inside an isolated workspace whose root is WorkspaceRoot.
//
// What a sandbox may do beyond the Sandbox interface is a named optional ability
// (PortLister, DevServer; Handoff for providers), found with As through any wrapper (see
// Wrapper). Package sandboxtest is the conformance suite every provider runs.
//
// Providers live in subpackages: local (bubblewrap on this machine). They speak to the
// in-sandbox agent through the envd-compatible data-plane client in package envd.
package sandbox

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net/url"
	"time"
)

// WorkspaceRoot is the workspace directory as seen inside every sandbox. Relative paths
// given to a Sandbox resolve against it.
const WorkspaceRoot = "/home/user"

// Errors callers branch on. Providers wrap them with context; test with errors.Is.
var (
	ErrNotFound = errors.New("no such file or directory")
	ErrIsDir    = errors.New("is a directory")
	ErrNotDir   = errors.New("not a directory")
	ErrExists   = errors.New("file exists")
	// ErrOutside: the path leaves the workspace (by .., an absolute path elsewhere, or a
	// symbolic link that points out of it).
	ErrOutside = errors.New("path is outside the workspace")
	// ErrTooLarge: a file is bigger than the limit of the operation.
	ErrTooLarge = errors.New("file too large")
	// ErrClosed: the sandbox was closed or reached its end time.
	ErrClosed = errors.New("sandbox is closed")
	// ErrNotRun comes with ErrClosed when the sandbox refused the operation before doing
	// any of it, having ended already: nothing of it ran, so running it elsewhere (on a
	// session's next sandbox) is safe even for a command. ErrClosed without it says
	// nothing of how much ran.
	ErrNotRun = errors.New("the operation did not run")
	// ErrNotRegular: the path is a FIFO, socket or device, which file tools do not open
	// (opening a FIFO would wait for its other end).
	ErrNotRegular = errors.New("not a regular file (a FIFO, socket or device)")
	// ErrPortClosed: nothing in the sandbox listens on the port asked for.
	ErrPortClosed = errors.New("nothing in the sandbox listens on that port")
	// ErrUnresponsive: the sandbox did not answer within the host's own deadline (its agent
	// was stopped, wedged or starved of CPU). The host never waits for a sandbox without
	// such a bound; a provider ends a sandbox that missed one, so the error also wraps
	// ErrClosed once the provider has done so.
	ErrUnresponsive = errors.New("the sandbox stopped answering")
	// ErrCannotStart: a command could not be started for want of a resource of the
	// sandbox (processes, file descriptors, memory: EAGAIN, EMFILE, ENFILE, ENOMEM): what
	// runs in it has taken them all. It did not run, so running it again is safe. A
	// session that finds a trivial command cannot start either replaces the sandbox as it
	// does a dead one.
	ErrCannotStart = errors.New("the sandbox cannot start commands: its processes, files or memory are used up")
	// ErrUnsupported: the provider or sandbox cannot do what was asked (mount a host
	// directory, list its ports). It is errors.ErrUnsupported.
	ErrUnsupported = errors.ErrUnsupported
)

// Provider creates sandboxes.
type Provider interface {
	Create(ctx context.Context, opts CreateOptions) (Sandbox, error)
}

// Network modes.
const (
	NetworkNone = "none" // no network at all, not even loopback to the host
	NetworkHost = "host" // the host's network
	// NetworkEgress: no route anywhere; the sandbox reaches what its policy allows
	// through the host's egress gateway (CreateOptions.Egress; see Egress).
	NetworkEgress = "egress"
)

// Handoff is the optional ability of providers whose workspaces outlive their sandboxes
// (local: a host directory). Handoff ends old and creates a new sandbox over the same
// workspace, so a rotation need not copy the tree out and back in. old may be a wrapper of
// one of the provider's sandboxes (the provider finds its own with As). The caller saves a
// snapshot first; if Handoff fails, the workspace may be gone with old, and the caller
// restores.
type Handoff interface {
	Handoff(ctx context.Context, old Sandbox, opts CreateOptions) (Sandbox, error)
}

// HandoffChecker is a Handoff provider that can tell, before a rotation saves, whether it
// can hand one given sandbox's workspace over: a provider can only hand over its own
// sandboxes, and a Chain only those of its providers that can. A caller that knows the
// answer ahead takes the restore path from the start when it is no (keeping a copy of the
// snapshot it restores from), instead of finding out from a failed Handoff.
type HandoffChecker interface {
	CanHandoff(old Sandbox) bool
}

// CanHandoff reports whether p can hand old's workspace over: p implements Handoff and,
// when it implements HandoffChecker, says yes for old.
func CanHandoff(p Provider, old Sandbox) bool {
	if _, ok := p.(Handoff); !ok {
		return false
	}
	if c, ok := p.(HandoffChecker); ok {
		return c.CanHandoff(old)
	}
	return true
}

// CreateOptions configure a new sandbox.
type CreateOptions struct {
	// Workspace is a host directory to mount at WorkspaceRoot. Empty means a fresh, empty
	// workspace that lives and dies with the sandbox. A provider that cannot mount host
	// directories (a remote one) refuses a non-empty Workspace with an error wrapping
	// ErrUnsupported; it never ignores it.
	Workspace string
	// Timeout is how long the sandbox lives before it is killed, unless extended with
	// SetTimeout. Zero means the provider's default.
	Timeout time.Duration
	// Network is NetworkNone (the default when empty), NetworkEgress or NetworkHost.
	Network string
	// Egress is the way out of a sandbox with NetworkEgress; required with it. A provider
	// that cannot enforce it refuses the sandbox, never gives it more network.
	Egress *Egress
	// Env is added to the environment of every process.
	Env map[string]string
	// Labels name the sandbox for whoever lists it later, from any process: a provider
	// that keeps labels with its sandboxes (E2B's metadata) stores them, and its Lister
	// filters by them and its Reconnector checks them; one that keeps none ignores them.
	// A session labels its sandboxes with its project, its lease's epoch, its process
	// and itself.
	Labels map[string]string
}

// Sandbox is one isolated workspace. All methods are safe for concurrent use.
type Sandbox interface {
	// ID names the sandbox uniquely within its provider.
	ID() string

	// Exec runs a command in the foreground until it exits, its timeout passes or ctx ends,
	// whichever is first; on timeout or cancellation its whole process group is killed and
	// the partial output is returned with TimedOut set. Captured output is capped at the
	// source: each stream keeps its head and tail within ExecRequest.MaxOutputBytes.
	Exec(ctx context.Context, req ExecRequest) (ExecResult, error)
	// Start runs a command in the background: it returns as soon as the process has
	// started, and the process lives until the sandbox closes. Its stdout and stderr go to
	// a log file inside the sandbox.
	Start(ctx context.Context, req ExecRequest) (Process, error)

	// ReadFile returns a file's contents; a file bigger than maxBytes (when > 0) gives
	// ErrTooLarge without being read.
	ReadFile(ctx context.Context, path string, maxBytes int64) ([]byte, error)
	// WriteFile creates or replaces a file, creating its parent directories.
	WriteFile(ctx context.Context, path string, data []byte) error
	// Stat describes a path without following a final symbolic link.
	Stat(ctx context.Context, path string) (FileInfo, error)
	// List returns the entries below a directory, sorted by path.
	List(ctx context.Context, req ListRequest) (ListResult, error)

	// Archive writes the workspace to w as one tar.gz stream, leaving out files and
	// directories whose base name is in excludes (nil: the provider's defaults, those of
	// package archive). Symbolic links are stored, never followed.
	Archive(ctx context.Context, w io.Writer, excludes []string) error
	// Extract unpacks a tar.gz stream into the workspace, which must be empty. Entries
	// that would land outside it (.., absolute names, links out, devices) are refused.
	Extract(ctx context.Context, r io.Reader) error

	// PreviewURL returns an http URL, reachable from the host, that serves what listens
	// on port inside the sandbox. It fails when nothing in the sandbox listens there.
	PreviewURL(ctx context.Context, port int) (*url.URL, error)

	// StartedAt and EndsAt report the sandbox's lifetime; the sandbox is killed at EndsAt.
	StartedAt() time.Time
	EndsAt() time.Time
	// SetTimeout moves the end time to now + d; providers refuse to go past their maximum
	// lifetime.
	SetTimeout(ctx context.Context, d time.Duration) error

	// Close kills every process and releases the sandbox. It is idempotent.
	Close(ctx context.Context) error
}

// ExecRequest describes a command to run.
type ExecRequest struct {
	// Argv is the program and its arguments, run without a shell.
	Argv []string
	// Cwd is the working directory; empty means WorkspaceRoot, relative resolves against it.
	Cwd string
	// Env adds to the sandbox's environment.
	Env map[string]string
	// Timeout bounds a foreground command (Exec). Zero means no bound beyond ctx.
	Timeout time.Duration
	// MaxOutputBytes bounds what Exec captures of each stream (head and tail kept,
	// the middle dropped and counted). Zero means DefaultMaxOutputBytes.
	MaxOutputBytes int
	// Tag names a background process (Start): its Process.ID and its log file. Empty
	// means a fresh one; a session restarting a process after a rotation passes the old
	// one, so the process keeps its id and log path. For Exec it names the command (it
	// must then be unique within the sandbox): the egress gateway attributes the
	// connections of the command and its children to it (see EgressReporter).
	Tag string
}

// DefaultMaxOutputBytes is the per-stream capture bound of Exec when none is given.
const DefaultMaxOutputBytes = 256 << 10

// ExecResult is how a foreground command ended.
type ExecResult struct {
	ExitCode int // -1 when killed by a signal
	Stdout   []byte
	Stderr   []byte
	// StdoutCut and StderrCut count bytes dropped from the middle of each stream.
	StdoutCut int64
	StderrCut int64
	TimedOut  bool
	// OOMKilled: a signal killed the command while the sandbox was at its memory limit
	// (the kernel killed a process of the sandbox for memory during the command).
	OOMKilled bool
	Duration  time.Duration
}

// Process is a background command.
type Process struct {
	ID      string // stable handle, unique within the sandbox
	PID     int    // process id inside the sandbox
	LogPath string // absolute path, inside the sandbox, of its combined stdout+stderr
}

// FileInfo describes one file. Path is as requested for Stat, relative to the listed
// directory for List.
type FileInfo struct {
	Path    string
	Mode    fs.FileMode
	Size    int64
	ModTime time.Time
}

// IsDir reports whether the entry is a directory.
func (fi FileInfo) IsDir() bool { return fi.Mode.IsDir() }

// ListRequest asks for the entries below Path.
type ListRequest struct {
	Path      string
	Recursive bool
	// Skip names directories (by base name) not to descend into.
	Skip []string
	// Limit stops after this many entries (0: no limit) and sets Truncated.
	Limit int
}

// ListResult holds List's entries, sorted by path.
type ListResult struct {
	Entries   []FileInfo
	Truncated bool
}
