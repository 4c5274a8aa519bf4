// Package memsandbox is a sandbox that lives in memory: a file tree in a map, commands run
// by a small built-in shell and a few programs written in Go, and a preview server for
// `python3 -m http.server`. It is for tests of the host itself and for measuring the
// host's own overhead, where a sandbox operation must cost next to nothing; it passes the
// sandbox conformance suite (sandboxtest) like every real provider, so what the host
// relies on holds here too. Tests of tool behaviour run against real sandboxes.
//
// Its shell knows simple commands joined by ;, &&, || and &, quotes, $VAR and $1, the
// redirections >, >>, <, 2>, >&2 and 2>&1, and the builtins cd, exit, exec and kill; its
// programs are sh (and bash), echo, cat, pwd, sleep, yes, true, false, mkdir [-p],
// ln -s, mkfifo, chmod (octal) and python3 -m http.server. Nothing runs on the host.
package memsandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
)

// Provider creates in-memory sandboxes. The zero value is ready: sandboxes live an hour
// unless extended, and at most a day. It cannot mount host directories and refuses
// CreateOptions.Workspace, as a remote provider does.
type Provider struct {
	DefaultTimeout time.Duration // 0: one hour
	MaxLifetime    time.Duration // 0: 24 hours
}

var (
	_ sandbox.Provider   = (*Provider)(nil)
	_ sandbox.Sandbox    = (*Sandbox)(nil)
	_ sandbox.PortLister = (*Sandbox)(nil)
)

var seq atomic.Int64

// Create makes a sandbox with an empty workspace.
func (p *Provider) Create(ctx context.Context, opts sandbox.CreateOptions) (sandbox.Sandbox, error) {
	if opts.Workspace != "" {
		return nil, fmt.Errorf("create memory sandbox: a host directory (%s) cannot be its workspace: %w", opts.Workspace, sandbox.ErrUnsupported)
	}
	switch opts.Network {
	case "", sandbox.NetworkNone, sandbox.NetworkHost:
	case sandbox.NetworkEgress: // it has no network to give: commands reach nothing, as with none
	default:
		return nil, fmt.Errorf("create memory sandbox: unknown network mode %q", opts.Network)
	}
	maxLife := p.MaxLifetime
	if maxLife <= 0 {
		maxLife = 24 * time.Hour
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = p.DefaultTimeout
	}
	if timeout <= 0 {
		timeout = time.Hour
	}
	if timeout > maxLife {
		return nil, fmt.Errorf("create memory sandbox: timeout %s exceeds the maximum lifetime %s", timeout, maxLife)
	}
	return newSandbox(opts.Env, timeout, maxLife), nil
}

// New returns a sandbox of a zero Provider: an empty workspace, an hour to live.
func New() *Sandbox { return newSandbox(nil, time.Hour, 24*time.Hour) }

// node is one entry of the file tree.
type node struct {
	dir  bool
	fifo bool   // a named pipe: the file API does not open it
	link string // a symbolic link's target, or ""
	data []byte
	mode fs.FileMode // permission bits
	mod  time.Time
}

// Sandbox is an in-memory sandbox. All methods are safe for concurrent use.
type Sandbox struct {
	id  string
	env map[string]string

	mu    sync.Mutex
	files map[string]*node // absolute, clean path -> entry
	ports map[int]*server  // sandbox port -> the server listening on it
	pid   int              // last process id handed out
	bgSeq int

	// Argvs records the argv of every Exec, for tests of what reached the sandbox.
	Argvs [][]string

	startedAt time.Time
	endsAt    time.Time
	maxEnd    time.Time
	timer     *time.Timer
	closed    bool
	why       string // why the sandbox is closed

	life context.Context // ends when the sandbox closes: every process runs under it
	end  context.CancelFunc
	wg   sync.WaitGroup // the processes and servers; Close waits for them
}

func newSandbox(env map[string]string, timeout, maxLife time.Duration) *Sandbox {
	now := time.Now()
	s := &Sandbox{
		id:  fmt.Sprintf("mem-%d", seq.Add(1)),
		env: env, files: map[string]*node{}, ports: map[int]*server{},
		startedAt: now, endsAt: now.Add(timeout), maxEnd: now.Add(maxLife),
	}
	for _, d := range []string{"/", "/home", sandbox.WorkspaceRoot, "/tmp"} {
		s.files[d] = &node{dir: true, mode: 0o755, mod: now}
	}
	s.life, s.end = context.WithCancel(context.Background())
	s.timer = time.AfterFunc(timeout, func() { s.shutdown("reached its end time") })
	return s
}

// ID names the sandbox.
func (s *Sandbox) ID() string { return s.id }

// closedErr is ErrClosed, saying why, once the sandbox has ended, for a call that has
// done nothing yet (it wraps ErrNotRun too). Called with mu held.
func (s *Sandbox) closedErr() error {
	if err := s.endedErr(); err != nil {
		return fmt.Errorf("%w (%w)", err, sandbox.ErrNotRun)
	}
	return nil
}

// endedErr is ErrClosed, saying why, once the sandbox has ended, for a call that its end
// cut short. Called with mu held.
func (s *Sandbox) endedErr() error {
	if s.closed {
		return fmt.Errorf("sandbox %s %s: %w", s.id, s.why, sandbox.ErrClosed)
	}
	return nil
}

func (s *Sandbox) checkOpen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closedErr()
}

// Put writes a workspace file (rel is relative to the workspace root), for tests that
// arrange a workspace.
func (s *Sandbox) Put(rel, content string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.write(path.Join(sandbox.WorkspaceRoot, rel), []byte(content), false); err != nil {
		panic(err)
	}
}

// within reports whether abs is the workspace root or below it.
func within(abs string) bool {
	return abs == sandbox.WorkspaceRoot || strings.HasPrefix(abs, sandbox.WorkspaceRoot+"/")
}

// resolve follows the symbolic links of abs's directories (and of abs itself when
// followLast), as the kernel would, refusing with ErrOutside a link that leads out of the
// workspace when the path started in it. Called with mu held.
func (s *Sandbox) resolve(abs string, followLast bool) (string, error) {
	confined := within(abs)
	for hops := 0; ; hops++ {
		if hops > 40 {
			return "", fmt.Errorf("%s: too many levels of symbolic links: %w", abs, sandbox.ErrOutside)
		}
		parts := strings.Split(strings.TrimPrefix(abs, "/"), "/")
		cur, changed := "/", false
		for i, part := range parts {
			if part == "" {
				continue
			}
			next := path.Join(cur, part)
			n := s.files[next]
			if n != nil && n.link != "" && (i < len(parts)-1 || followLast) {
				target := n.link
				if !path.IsAbs(target) {
					target = path.Join(cur, target)
				}
				abs = path.Clean(path.Join(append([]string{target}, parts[i+1:]...)...))
				if confined && !within(abs) {
					return "", fmt.Errorf("%s leads out of the workspace: %w", next, sandbox.ErrOutside)
				}
				changed = true
				break
			}
			cur = next
		}
		if !changed {
			return abs, nil
		}
	}
}

// lookup returns the entry at abs, following links.
func (s *Sandbox) lookup(abs string, followLast bool) (string, *node, error) {
	p, err := s.resolve(abs, followLast)
	if err != nil {
		return "", nil, err
	}
	n := s.files[p]
	if n == nil {
		// A file on the way makes it "not a directory".
		for dir := path.Dir(p); dir != "/"; dir = path.Dir(dir) {
			if d := s.files[dir]; d != nil && !d.dir {
				return p, nil, fmt.Errorf("%s: %w", dir, sandbox.ErrNotDir)
			}
		}
		return p, nil, sandbox.ErrNotFound
	}
	return p, n, nil
}

// write creates or replaces the file at abs and its missing parent directories. A link
// on the way, the last one too, is followed (a file a link names is written, the link
// stays), refused with ErrOutside when it leads out of the workspace. Called with mu held.
func (s *Sandbox) write(abs string, data []byte, appendTo bool) error {
	p, err := s.resolve(abs, true)
	if err != nil {
		return err
	}
	if err := s.mkdirAll(path.Dir(p)); err != nil {
		return err
	}
	now := time.Now()
	switch n := s.files[p]; {
	case n == nil:
		s.files[p] = &node{data: append([]byte(nil), data...), mode: 0o644, mod: now}
	case n.dir:
		return fmt.Errorf("%s: %w", p, sandbox.ErrIsDir)
	case n.fifo:
		return notRegular(p)
	case appendTo:
		n.data, n.mod = append(n.data, data...), now
	default: // a new file in the old one's place, keeping its permission bits
		s.files[p] = &node{data: append([]byte(nil), data...), mode: n.mode, mod: now}
	}
	return nil
}

// mkdirAll makes dir and its parents. Called with mu held.
func (s *Sandbox) mkdirAll(dir string) error {
	if n := s.files[dir]; n != nil {
		if !n.dir {
			return fmt.Errorf("%s: %w", dir, sandbox.ErrNotDir)
		}
		return nil
	}
	if dir != "/" {
		if err := s.mkdirAll(path.Dir(dir)); err != nil {
			return err
		}
	}
	s.files[dir] = &node{dir: true, mode: 0o755, mod: time.Now()}
	return nil
}

// ReadFile returns a workspace file's contents.
func (s *Sandbox) ReadFile(ctx context.Context, p string, maxBytes int64) ([]byte, error) {
	abs, err := sandbox.Resolve(p)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.closedErr(); err != nil {
		return nil, err
	}
	_, n, err := s.lookup(abs, true)
	switch {
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", p, err)
	case n.dir:
		return nil, fmt.Errorf("read %s: %w", p, sandbox.ErrIsDir)
	case n.fifo:
		return nil, fmt.Errorf("read %w", notRegular(p))
	case maxBytes > 0 && int64(len(n.data)) > maxBytes:
		return nil, fmt.Errorf("read %s: %d bytes: %w", p, len(n.data), sandbox.ErrTooLarge)
	}
	return append([]byte(nil), n.data...), nil
}

// WriteFile creates or replaces a workspace file and its parent directories.
func (s *Sandbox) WriteFile(ctx context.Context, p string, data []byte) error {
	abs, err := sandbox.Resolve(p)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.closedErr(); err != nil {
		return err
	}
	if abs == sandbox.WorkspaceRoot {
		return fmt.Errorf("write %s: %w", p, sandbox.ErrIsDir)
	}
	if err := s.write(abs, data, false); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

func info(p string, n *node) sandbox.FileInfo {
	fi := sandbox.FileInfo{Path: p, Mode: n.mode, Size: int64(len(n.data)), ModTime: n.mod}
	switch {
	case n.dir:
		fi.Mode |= fs.ModeDir
		fi.Size = 0
	case n.link != "":
		fi.Mode, fi.Size = fs.ModeSymlink|0o777, int64(len(n.link))
	case n.fifo:
		fi.Mode |= fs.ModeNamedPipe
	}
	return fi
}

// Stat describes a workspace path without following a final symbolic link.
func (s *Sandbox) Stat(ctx context.Context, p string) (sandbox.FileInfo, error) {
	abs, err := sandbox.Resolve(p)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.closedErr(); err != nil {
		return sandbox.FileInfo{}, err
	}
	_, n, err := s.lookup(abs, false)
	if err != nil {
		return sandbox.FileInfo{}, fmt.Errorf("stat %s: %w", p, err)
	}
	return info(p, n), nil
}

// List returns the entries below a workspace directory, sorted by path.
func (s *Sandbox) List(ctx context.Context, req sandbox.ListRequest) (sandbox.ListResult, error) {
	abs, err := sandbox.Resolve(req.Path)
	if err != nil {
		return sandbox.ListResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.closedErr(); err != nil {
		return sandbox.ListResult{}, err
	}
	dir, n, err := s.lookup(abs, true)
	switch {
	case err != nil:
		return sandbox.ListResult{}, fmt.Errorf("list %s: %w", req.Path, err)
	case !n.dir:
		return sandbox.ListResult{}, fmt.Errorf("list %s: %w", req.Path, sandbox.ErrNotDir)
	}
	var res sandbox.ListResult
	for _, p := range s.below(dir) {
		rel := strings.TrimPrefix(p, dir+"/")
		parts := strings.Split(rel, "/")
		if !req.Recursive && len(parts) > 1 {
			continue
		}
		skipped := false
		for _, d := range parts[:len(parts)-1] {
			if slices.Contains(req.Skip, d) {
				skipped = true
			}
		}
		if skipped {
			continue
		}
		if req.Limit > 0 && len(res.Entries) == req.Limit {
			res.Truncated = true
			break
		}
		res.Entries = append(res.Entries, info(rel, s.files[p]))
	}
	return res, nil
}

// below lists the paths under dir, sorted. Called with mu held.
func (s *Sandbox) below(dir string) []string {
	prefix := strings.TrimSuffix(dir, "/") + "/"
	var out []string
	for p := range s.files {
		if strings.HasPrefix(p, prefix) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// StartedAt is when the sandbox was made.
func (s *Sandbox) StartedAt() time.Time { return s.startedAt }

// EndsAt is when the sandbox ends unless extended.
func (s *Sandbox) EndsAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endsAt
}

// SetTimeout moves the end to now + d, within the maximum lifetime.
func (s *Sandbox) SetTimeout(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.closedErr(); err != nil {
		return err
	}
	end := time.Now().Add(d)
	if end.After(s.maxEnd) {
		return fmt.Errorf("sandbox %s: an end at %s would pass its maximum lifetime (%s)", s.id,
			end.UTC().Format(time.RFC3339), s.maxEnd.UTC().Format(time.RFC3339))
	}
	s.endsAt = end
	s.timer.Reset(d)
	return nil
}

// PreviewURL is the URL of what listens on port inside the sandbox.
func (s *Sandbox) PreviewURL(ctx context.Context, port int) (*url.URL, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("preview of port %d in sandbox %s: not a port (1..65535)", port, s.id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.closedErr(); err != nil {
		return nil, err
	}
	srv := s.ports[port]
	if srv == nil {
		return nil, fmt.Errorf("preview of port %d in sandbox %s: %w", port, s.id, sandbox.ErrPortClosed)
	}
	return &url.URL{Scheme: "http", Host: srv.addr}, nil
}

// Ports lists the ports the sandbox's servers listen on.
func (s *Sandbox) Ports(ctx context.Context) ([]sandbox.ListeningPort, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.closedErr(); err != nil {
		return nil, err
	}
	var out []sandbox.ListeningPort
	for _, port := range slices.Sorted(maps.Keys(s.ports)) {
		srv := s.ports[port]
		out = append(out, sandbox.ListeningPort{Port: port, PID: srv.pid, Cmd: srv.cmd,
			Addrs: []string{"0.0.0.0"}, Dial: fmt.Sprintf("127.0.0.1:%d", port)})
	}
	return out, nil
}

// shutdown ends the sandbox: every process is stopped. It does not wait for them.
func (s *Sandbox) shutdown(why string) {
	s.mu.Lock()
	if !s.closed {
		s.closed, s.why = true, why
	}
	s.mu.Unlock()
	s.timer.Stop()
	s.end()
}

// Close stops every process and server and waits (within ctx) until they are gone. It is
// idempotent.
func (s *Sandbox) Close(ctx context.Context) error {
	s.shutdown("was closed")
	done := make(chan struct{})
	go func() { // owned by Close: it ends when the processes have
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close sandbox %s: processes still stopping: %w", s.id, ctx.Err())
	}
}

// errNoProgram: the program does not exist in this sandbox.
var errNoProgram = errors.New("no such program in the memory sandbox")
