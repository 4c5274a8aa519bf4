// Package memsandbox is an in-memory sandbox.Sandbox for tests of the host itself and for
// measuring the host's own overhead, where the sandbox operation must cost next to nothing.
// Tests of tool behaviour run against real local sandboxes instead.
package memsandbox

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net/url"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
)

// Sandbox keeps files in a map keyed by absolute path; Exec echoes its argv.
type Sandbox struct {
	mu    sync.Mutex
	files map[string][]byte // absolute path -> contents
	Argvs [][]string
}

// New returns an empty sandbox.
func New() *Sandbox { return &Sandbox{files: map[string][]byte{}} }

func (m *Sandbox) ID() string { return "mem" }

func (m *Sandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	m.mu.Lock()
	m.Argvs = append(m.Argvs, req.Argv)
	m.mu.Unlock()
	return sandbox.ExecResult{Stdout: []byte(strings.Join(req.Argv, " ") + "\n")}, nil
}

func (m *Sandbox) Start(ctx context.Context, req sandbox.ExecRequest) (sandbox.Process, error) {
	return sandbox.Process{ID: "bg-1", PID: 42, LogPath: "/tmp/bg-1.log"}, nil
}

func (m *Sandbox) ReadFile(ctx context.Context, p string, max int64) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.files[p]
	if !ok {
		if m.isDir(p) {
			return nil, sandbox.ErrIsDir
		}
		return nil, sandbox.ErrNotFound
	}
	if max > 0 && int64(len(b)) > max {
		return nil, sandbox.ErrTooLarge
	}
	return b, nil
}

func (m *Sandbox) isDir(p string) bool {
	for k := range m.files {
		if strings.HasPrefix(k, p+"/") {
			return true
		}
	}
	return false
}

func (m *Sandbox) WriteFile(ctx context.Context, p string, data []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.files[p] = append([]byte(nil), data...)
	return nil
}

func (m *Sandbox) Stat(ctx context.Context, p string) (sandbox.FileInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if b, ok := m.files[p]; ok {
		return sandbox.FileInfo{Path: p, Mode: 0o644, Size: int64(len(b))}, nil
	}
	if m.isDir(p) {
		return sandbox.FileInfo{Path: p, Mode: fs.ModeDir | 0o755}, nil
	}
	return sandbox.FileInfo{}, sandbox.ErrNotFound
}

func (m *Sandbox) List(ctx context.Context, req sandbox.ListRequest) (sandbox.ListResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var res sandbox.ListResult
	for k, b := range m.files {
		if rel, ok := strings.CutPrefix(k, req.Path+"/"); ok && (req.Recursive || !strings.Contains(rel, "/")) {
			res.Entries = append(res.Entries, sandbox.FileInfo{Path: rel, Mode: 0o644, Size: int64(len(b))})
		}
	}
	sort.Slice(res.Entries, func(i, j int) bool { return res.Entries[i].Path < res.Entries[j].Path })
	return res, nil
}

func (m *Sandbox) StartedAt() time.Time                                  { return time.Time{} }
func (m *Sandbox) EndsAt() time.Time                                     { return time.Time{}.Add(time.Hour) }
func (m *Sandbox) SetTimeout(ctx context.Context, d time.Duration) error { return nil }
func (m *Sandbox) Close(ctx context.Context) error                       { return nil }

var _ sandbox.Sandbox = (*Sandbox)(nil)

func (m *Sandbox) Put(rel, content string) {
	m.files[path.Join(sandbox.WorkspaceRoot, rel)] = []byte(content)
}

// ErrUnsupported is what the operations a memory sandbox cannot do return.
var ErrUnsupported = errors.New("memsandbox: not supported")

func (m *Sandbox) Archive(ctx context.Context, w io.Writer, excludes []string) error {
	return ErrUnsupported
}
func (m *Sandbox) Extract(ctx context.Context, r io.Reader) error { return ErrUnsupported }
func (m *Sandbox) PreviewURL(ctx context.Context, port int) (*url.URL, error) {
	return nil, ErrUnsupported
}
