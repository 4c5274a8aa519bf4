package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
)

// Optional abilities.
//
// Some sandboxes can do more than the Sandbox interface asks: list the ports their
// processes listen on (PortLister), report the dev server they saw start (DevServer),
// list their background processes (ProcessLister), report what an archive left out
// (ArchiveReporter), or have something to tell the model (Noticer). Each
// such ability is a small named interface, and callers find it with As, never with a bare
// type assertion, because sandboxes are often wrapped (a session around the provider's
// sandbox, a test double around a real one): As looks through every wrapper that
// implements Wrapper. So a wrapper forwards an ability only when it changes it; otherwise
// it implements Unwrap and the ability of the sandbox under it shows through. This is the
// convention net/http's ResponseController follows for ResponseWriter wrappers.
//
// Providers have optional abilities too: Handoff (and HandoffChecker), LifetimeBound,
// ProjectScoped, Closer, and for sandboxes that outlive the process that made them
// Reconnector, Lister and Killer, found with ProviderAs through any provider wrapper
// (ProviderWrapper). A Chain implements each over its members.

// Wrapper is a Sandbox that runs on another one.
type Wrapper interface {
	// Unwrap returns the sandbox this one wraps (for a session, the current one).
	Unwrap() Sandbox
}

// maxUnwrap bounds the walk down a chain of wrappers: a wrapper that returns itself, or a
// cycle, must not hang a caller.
const maxUnwrap = 32

// As returns the first sandbox in the chain sb, sb.Unwrap(), sb.Unwrap().Unwrap(), ...
// that is a T, where T is an ability interface (or a provider's concrete type, which a
// provider uses to find its own sandbox under wrappers).
func As[T any](sb Sandbox) (T, bool) {
	for range maxUnwrap {
		if sb == nil {
			break
		}
		if t, ok := sb.(T); ok {
			return t, true
		}
		w, ok := sb.(Wrapper)
		if !ok {
			break
		}
		sb = w.Unwrap()
	}
	var zero T
	return zero, false
}

// ListeningPort is one TCP port in LISTEN state held by a process of the sandbox.
type ListeningPort struct {
	Port int `json:"port"`
	// PID (in the sandbox's pid namespace) and Cmd (its command name) of the
	// lowest-numbered process holding one of the port's listening sockets.
	PID int    `json:"pid"`
	Cmd string `json:"cmd"`
	// Addrs are the local addresses the port is bound on, e.g. "0.0.0.0", "::", "127.0.0.1".
	Addrs []string `json:"addrs,omitempty"`
	// Dial is the loopback address inside the sandbox that a preview of the port connects
	// to, "127.0.0.1:N" or "[::1]:N"; empty when the port cannot be previewed: it is bound
	// only on other addresses, or a socket outside the sandbox (the host's, with the host
	// network) would also accept on that address.
	Dial string `json:"dial,omitempty"`
}

// PortLister is a sandbox that can tell which TCP ports its own processes listen on (never
// the host's, even with the host network).
type PortLister interface {
	Ports(ctx context.Context) ([]ListeningPort, error)
}

// DevServer is a sandbox that watches its background processes: DevServerPort is the port
// the one it saw start listening last listens on, or 0. take_screenshot uses it when the
// model names no port.
type DevServer interface {
	DevServerPort() int
}

// Ports lists the ports sb's processes listen on, through any wrappers. A sandbox that
// cannot tell gives an error wrapping errors.ErrUnsupported.
func Ports(ctx context.Context, sb Sandbox) ([]ListeningPort, error) {
	pl, ok := As[PortLister](sb)
	if !ok {
		return nil, fmt.Errorf("sandbox %s cannot list its ports: %w", sb.ID(), ErrUnsupported)
	}
	return pl.Ports(ctx)
}

// DevServerPort is the dev server port sb (or a sandbox it wraps) saw start, or 0.
func DevServerPort(sb Sandbox) int {
	if ds, ok := As[DevServer](sb); ok {
		return ds.DevServerPort()
	}
	return 0
}

// ProcessInfo is a background process a sandbox knows of (one Start made and that still
// runs).
type ProcessInfo struct {
	// ID is the Process.ID Start gave it (ExecRequest.Tag when one was passed).
	ID string
	// PID is its process id inside the sandbox.
	PID int
}

// ProcessLister is a sandbox that can tell which of its background processes still run.
// A session asks before a rotation, to start again only what was running; a process that
// exited, or that the sandbox killed, is not listed. Processes run in the foreground
// (Exec) are not listed.
type ProcessLister interface {
	Processes(ctx context.Context) ([]ProcessInfo, error)
}

// ArchiveSkip is an entry a pack left out, and why (a name too long, an unreadable file,
// a FIFO or socket, an entry past a bound). Path is the sandbox's own name for it: data
// the sandbox wrote, to be quoted wherever it is shown.
type ArchiveSkip struct {
	Path   string
	Reason string
}

// ArchiveReport says what a pack stored and what it left out.
type ArchiveReport struct {
	Files, Dirs, Symlinks int
	// Bytes is the size of the files' contents.
	Bytes int64
	// Skipped counts the entries left out; Skips names the first of them (at most 100).
	Skipped int
	Skips   []ArchiveSkip
}

// ArchiveReporter is a sandbox whose Archive can say what it stored and left out: a
// snapshot then reports the entries it could not hold (the local provider's agent packs
// inside the sandbox and tells). ArchiveReport writes exactly what Archive would write.
type ArchiveReporter interface {
	ArchiveReport(ctx context.Context, w io.Writer, excludes []string) (ArchiveReport, error)
}

// ArchiveWithReport archives sb to w, with its report when sb (or a sandbox it wraps) is
// an ArchiveReporter, else with an empty report.
func ArchiveWithReport(ctx context.Context, sb Sandbox, w io.Writer, excludes []string) (ArchiveReport, error) {
	if ar, ok := As[ArchiveReporter](sb); ok {
		return ar.ArchiveReport(ctx, w, excludes)
	}
	return ArchiveReport{}, sb.Archive(ctx, w, excludes)
}

// Noticer is a sandbox with something to tell the model once, in the next tool result: a
// session says which background processes a rotation restarted, or that work was lost.
// Notice returns the text and forgets it; "" when there is nothing to tell.
type Noticer interface {
	Notice() string
}

// Provider abilities.

// ProviderWrapper is a Provider that runs on another one (a test double, a view).
type ProviderWrapper interface {
	UnwrapProvider() Provider
}

// ProviderAs returns the first provider in the chain p, p.UnwrapProvider(), ... that is a
// T, where T is a provider ability.
func ProviderAs[T any](p Provider) (T, bool) {
	for range maxUnwrap {
		if p == nil {
			break
		}
		if t, ok := p.(T); ok {
			return t, true
		}
		w, ok := p.(ProviderWrapper)
		if !ok {
			break
		}
		p = w.UnwrapProvider()
	}
	var zero T
	return zero, false
}

// LifetimeBound is a provider whose sandboxes cannot live past a bound (an E2B plan's):
// a session keeps its sandbox's ttl and its own max_lifetime within MaxLifetime.
type LifetimeBound interface {
	MaxLifetime() time.Duration
}

// MaxLifetimeOf is p's bound on a sandbox's life, or 0 when it has none.
func MaxLifetimeOf(p Provider) time.Duration {
	if lb, ok := ProviderAs[LifetimeBound](p); ok {
		return lb.MaxLifetime()
	}
	return 0
}

// ProjectScoped is a provider that counts its sandboxes under a project (E2B's quota
// ledger): ForProject returns the view a session of project creates through, which
// creates the same sandboxes and labels them with the project. The view shares the
// provider's resources; closing the provider closes it.
type ProjectScoped interface {
	ForProject(project string) Provider
}

// ForProject is p's view for project, or p itself when it is not ProjectScoped.
func ForProject(p Provider, project string) Provider {
	if ps, ok := ProviderAs[ProjectScoped](p); ok {
		return ps.ForProject(project)
	}
	return p
}

// Closer is a provider that holds resources until it is closed (a connection pool, a
// spare volume, a cgroup): the owner of the provider calls Close once, after every
// sandbox it made is closed; Close returns when the resources are released or ctx ends.
type Closer interface {
	Close(ctx context.Context) error
}

// CloseProvider closes p when it is a Closer.
func CloseProvider(ctx context.Context, p Provider) error {
	if c, ok := ProviderAs[Closer](p); ok {
		return c.Close(ctx)
	}
	return nil
}

// ErrGone: a provider was asked to reconnect to (or kill) a sandbox it no longer has: it
// was killed, reached its end time, or never existed.
var ErrGone = errors.New("the sandbox is gone")

// ReconnectOptions configure a Reconnect.
type ReconnectOptions struct {
	// Timeout is how long the sandbox lives from now: its end time moves there unless it
	// is already later (a provider never shortens a sandbox it reconnects to). Zero means
	// the provider's default for new sandboxes; never the platform's own default (E2B's
	// connect gives 300 s when none is sent).
	Timeout time.Duration
	// Labels the sandbox must carry (CreateOptions.Labels at its creation). A sandbox
	// without every one of them, with its value, is refused with an error wrapping
	// ErrForeign and left as it is: not resumed, not extended. An id read from a record
	// that may be stale or hostile never reaches a sandbox of another project.
	Labels map[string]string
	// SetLabels are labels the sandbox carries from now on, each set to its value (the new
	// holder's lease epoch, process and session), where the provider can change a
	// sandbox's labels (Kubernetes'); a provider that cannot (E2B's metadata is fixed at
	// creation) ignores it. Labels are checked before any is set.
	SetLabels map[string]string
	// Egress is this process's way out for a sandbox created with NetworkEgress
	// (CreateOptions.Egress): a provider whose sandboxes reach the gateway of the process
	// that holds them (Kubernetes' egress relay) moves the sandbox's way out to this one,
	// so the process that held it before serves it no more. Such a provider refuses to
	// reconnect a sandbox with NetworkEgress without it (an error wrapping
	// ErrUnsupported) rather than leave its egress with the earlier process.
	Egress *Egress
}

// Reconnector is a provider whose sandboxes outlive the process that created them (E2B's
// run on E2B's fleet): Reconnect attaches to a running sandbox by its ID, as another
// process left it, files and background processes included. The Sandbox it returns is
// indistinguishable from a created one: it runs commands, reads and writes files, lists
// its processes and ports, serves previews and knows its lifetime; what ran before keeps
// running (only its output that no one read while no client held it may be gone, so
// background processes write to their log files). A sandbox the provider no longer has
// gives an error wrapping ErrGone; an ID of another provider's sandbox, or one without
// opts.Labels, an error wrapping ErrForeign.
type Reconnector interface {
	Reconnect(ctx context.Context, id string, opts ReconnectOptions) (Sandbox, error)
}

// SandboxInfo is a sandbox as a provider lists it.
type SandboxInfo struct {
	ID string
	// Labels are the sandbox's (CreateOptions.Labels and the provider's own).
	Labels map[string]string
	// State is "running", or "paused" for a sandbox a provider keeps stopped.
	State     string
	StartedAt time.Time
	EndsAt    time.Time
}

// Lister is a provider that can list its sandboxes, alive or paused, whichever process
// created them: those that carry every label of filter, with its value (nil or empty:
// all). A fleet finds with it the sandboxes of a project that a dead replica left.
type Lister interface {
	List(ctx context.Context, filter map[string]string) ([]SandboxInfo, error)
}

// Killer is a provider that can kill one of its sandboxes by ID, whichever process
// created it (an orphan a dead replica left running). A sandbox that is gone already is
// not an error; an ID of another provider's sandbox is an error wrapping ErrForeign.
type Killer interface {
	Kill(ctx context.Context, id string) error
}
