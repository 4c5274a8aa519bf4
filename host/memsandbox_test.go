package host

import (
	"context"
	"io/fs"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
)

// memSandbox is an in-memory sandbox for tests of the host itself and for measuring the
// host's own overhead, where the sandbox operation must cost next to nothing. Tests of tool
// behaviour run against real local sandboxes instead.
type memSandbox struct {
	mu    sync.Mutex
	files map[string][]byte // absolute path -> contents
	argvs [][]string
}

func newMemSandbox() *memSandbox { return &memSandbox{files: map[string][]byte{}} }

func (m *memSandbox) ID() string { return "mem" }

func (m *memSandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	m.mu.Lock()
	m.argvs = append(m.argvs, req.Argv)
	m.mu.Unlock()
	return sandbox.ExecResult{Stdout: []byte(strings.Join(req.Argv, " ") + "\n")}, nil
}

func (m *memSandbox) Start(ctx context.Context, req sandbox.ExecRequest) (sandbox.Process, error) {
	return sandbox.Process{ID: "bg-1", PID: 42, LogPath: "/tmp/bg-1.log"}, nil
}

func (m *memSandbox) ReadFile(ctx context.Context, p string, max int64) ([]byte, error) {
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

func (m *memSandbox) isDir(p string) bool {
	for k := range m.files {
		if strings.HasPrefix(k, p+"/") {
			return true
		}
	}
	return false
}

func (m *memSandbox) WriteFile(ctx context.Context, p string, data []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.files[p] = append([]byte(nil), data...)
	return nil
}

func (m *memSandbox) Stat(ctx context.Context, p string) (sandbox.FileInfo, error) {
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

func (m *memSandbox) List(ctx context.Context, req sandbox.ListRequest) (sandbox.ListResult, error) {
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

func (m *memSandbox) StartedAt() time.Time                                  { return time.Time{} }
func (m *memSandbox) EndsAt() time.Time                                     { return time.Time{}.Add(time.Hour) }
func (m *memSandbox) SetTimeout(ctx context.Context, d time.Duration) error { return nil }
func (m *memSandbox) Close(ctx context.Context) error                       { return nil }

var _ sandbox.Sandbox = (*memSandbox)(nil)

func (m *memSandbox) put(rel, content string) {
	m.files[path.Join(sandbox.WorkspaceRoot, rel)] = []byte(content)
}
