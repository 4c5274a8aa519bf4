//go:build unix

// Package policytest runs a plugin's tools natively under go test with a tool policy in
// force: every host call they make is decided by the toolhost's own policy code (package
// internal/policy), refused the way the host refuses it (abi.StatusPermission and the same
// message for the model), and recorded as the host's audit records it. A test then asserts
// what the tools did and that the rest was refused, without a wasm build or a sandbox.
//
//	func TestDocsWriter(t *testing.T) {
//		h := policytest.New(t, policy.Scope{Files: &policy.Files{
//			Read: []string{"**"}, Write: []string{"docs/**"}}})
//		h.Write("src/main.go", "package main\n")
//		text, isErr := h.Call("write_file", `{"path":"src/main.go","content":"x"}`)
//		// isErr; text holds "policy: plugin editfile may not write src/main.go (allowed: docs/**)"
//		h.MustDeny(policytest.Match{Op: "write", Path: "src/main.go"})
//		h.MustNotAllow(policytest.Match{Op: "write"})
//	}
//
// It is built on the kit's native test host (package pdktest): the workspace is a
// temporary directory, commands run as processes in it, and the plugin's tools run
// through pdk.Handle. The kit implements read_text and read_versioned on ReadFile and
// write_versioned on ReadFile and WriteFile, so natively those calls are recorded as a
// read (and a write); Match's Op "read" and "write" match all of their kind, here and
// against the host's audit. The store and capture capabilities are not served.
package policytest

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/audit"
	"github.com/toolhost/toolhost/core/sandbox"
	policyengine "github.com/toolhost/toolhost/internal/policy"
	"github.com/toolhost/toolhost/pdk"
	"github.com/toolhost/toolhost/pdk/pdktest"
	"github.com/toolhost/toolhost/policy"
)

// Host is a pdktest.Host with a policy in force and a record of the host calls.
type Host struct {
	*pdktest.Host
	// Plugin is the name refusals give the plugin: its manifest's.
	Plugin string

	t      testing.TB
	policy *policyengine.Policy
	mu     sync.Mutex
	tool   string // the tool being called
	rec    audit.Recorder
}

// New makes a temporary workspace, routes the plugin's host calls to it through scope for
// the test (as pdktest.New does), and fails the test if scope does not compile.
func New(t testing.TB, scope policy.Scope) *Host {
	t.Helper()
	p, err := policyengine.Compile(scope)
	if err != nil {
		t.Fatalf("policytest: the scope does not compile: %v", err)
	}
	h := &Host{Host: pdktest.New(t), t: t, policy: p, Plugin: manifestName()}
	pdk.SetHost(h) // pdktest restores the previous host at cleanup
	return h
}

func manifestName() string {
	var m abi.Manifest
	if json.Unmarshal(pdk.Manifest(), &m) != nil || m.Name == "" {
		return "plugin"
	}
	return m.Name
}

// Result calls a tool as pdktest.Host.Result does, recording its host calls under its name.
func (h *Host) Result(tool, input string) abi.Result {
	h.t.Helper()
	h.mu.Lock()
	h.tool = tool
	h.mu.Unlock()
	return h.Host.Result(tool, input)
}

// Call calls a tool and returns the text of its result and whether it is an error.
func (h *Host) Call(tool, input string) (text string, isError bool) {
	h.t.Helper()
	res := h.Result(tool, input)
	var b strings.Builder
	for _, c := range res.Content {
		b.WriteString(c.Text)
	}
	return b.String(), res.IsError
}

// Calls returns the host calls recorded so far, in order.
func (h *Host) Calls() []audit.Record { return h.rec.Records() }

// Reset forgets the calls recorded so far.
func (h *Host) Reset() { h.rec.Reset() }

// Match selects host calls; the fields left empty match anything. Op "read" matches
// read, read_text and read_versioned, "write" write and write_versioned.
type Match struct {
	Tool    string
	Cap     abi.Capability
	Op      string
	Path    string // workspace-relative, as resolved
	Program string // argv[0]
}

func family(op string) string {
	switch op {
	case abi.FnRead, abi.FnReadText, abi.FnReadVersioned:
		return abi.FnRead
	case abi.FnWrite, abi.FnWriteVersioned:
		return abi.FnWrite
	}
	return op
}

// Matches reports whether m selects r (a record of this harness or of the host's audit).
func (m Match) Matches(r *audit.Record) bool {
	prog := ""
	if len(r.Argv) > 0 {
		prog = r.Argv[0]
	}
	return (m.Tool == "" || m.Tool == r.Tool) && (m.Cap == "" || string(m.Cap) == r.Cap) &&
		(m.Op == "" || family(m.Op) == family(r.Op)) && (m.Path == "" || m.Path == r.Path) &&
		(m.Program == "" || m.Program == prog)
}

func (h *Host) find(m Match, decision string) bool {
	return slices.ContainsFunc(h.Calls(), func(r audit.Record) bool { return r.Decision == decision && m.Matches(&r) })
}

// Allowed reports whether a call m selects was made and allowed; Denied, refused.
func (h *Host) Allowed(m Match) bool { return h.find(m, audit.Allow) }

// Denied reports whether a call m selects was refused by the policy.
func (h *Host) Denied(m Match) bool { return h.find(m, audit.Deny) }

// MustAllow fails the test unless a call m selects was made and allowed.
func (h *Host) MustAllow(m Match) {
	h.t.Helper()
	if !h.Allowed(m) {
		h.t.Errorf("no allowed host call %+v; the calls:\n%s", m, h.describe())
	}
}

// MustDeny fails the test unless a call m selects was refused.
func (h *Host) MustDeny(m Match) {
	h.t.Helper()
	if !h.Denied(m) {
		h.t.Errorf("no denied host call %+v; the calls:\n%s", m, h.describe())
	}
}

// MustNotAllow fails the test if a call m selects was allowed.
func (h *Host) MustNotAllow(m Match) {
	h.t.Helper()
	if h.Allowed(m) {
		h.t.Errorf("a host call %+v was allowed; the calls:\n%s", m, h.describe())
	}
}

func (h *Host) describe() string {
	var b strings.Builder
	for _, r := range h.Calls() {
		on := r.Path
		if len(r.Argv) > 0 {
			on = strings.Join(r.Argv, " ")
		}
		b.WriteString("  " + r.Tool + ": " + r.Decision + " " + r.Cap + "." + r.Op + " " + on)
		if r.Error != "" {
			b.WriteString(": " + r.Error)
		}
		b.WriteByte('\n')
	}
	if b.Len() == 0 {
		return "  (none)\n"
	}
	return b.String()
}

// decide resolves a call's path as the host does, asks the policy and checks links for a
// scoped path. It returns the request with its workspace-relative path and the rule that
// allowed it, or the error the plugin gets (and records the refusal).
func (h *Host) decide(req policyengine.Request, raw string, start time.Time) (policyengine.Request, string, error) {
	if req.Cap == abi.CapSandboxFiles || raw != "" {
		abs, err := sandbox.Resolve(raw)
		if err != nil {
			st := abi.StatusInvalid
			switch {
			case errors.Is(err, sandbox.ErrOutside):
				st = abi.StatusOutside
			case errors.Is(err, sandbox.ErrNotFound):
				st = abi.StatusNotFound
			}
			req.Path = raw
			e := &pdk.Error{Op: req.Op, Status: st, Msg: err.Error()}
			h.record(req, start, audit.Invalid, "", e)
			return req, "", e
		}
		req.Path = sandbox.Rel(abs)
	}
	d := h.policy.Decide(h.Plugin, req)
	if d.Allowed && d.CheckLinks {
		link, err := policyengine.CheckLinks(req.Path, func(rel string) (bool, bool, error) {
			fi, err := os.Lstat(filepath.Join(h.Root, filepath.FromSlash(rel)))
			switch {
			case errors.Is(err, os.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
				return false, false, nil
			case err != nil:
				return false, false, err
			}
			return fi.Mode()&os.ModeSymlink != 0, true, nil
		})
		if err != nil {
			h.record(req, start, audit.Allow, d.Rule, err)
			return req, "", err
		}
		if link != "" {
			d = h.policy.LinkRefusal(h.Plugin, req, link)
		}
	}
	if !d.Allowed {
		err := &pdk.Error{Op: req.Op, Status: abi.StatusPermission, Msg: d.Message}
		h.record(req, start, audit.Deny, d.Rule, err)
		return req, "", err
	}
	return req, d.Rule, nil
}

func (h *Host) record(req policyengine.Request, start time.Time, decision, why string, err error) {
	h.mu.Lock()
	tool := h.tool
	h.mu.Unlock()
	r := audit.Record{Time: time.Now(), Plugin: h.Plugin, Tool: tool, Cap: string(req.Cap), Op: req.Op,
		Path: req.Path, Argv: req.Argv, Env: req.Env, Port: req.Port, Key: req.Key, Decision: decision, Why: why,
		Micros: time.Since(start).Microseconds()}
	var e *pdk.Error
	if errors.As(err, &e) {
		r.Status, r.Error = int64(e.Status), e.Error()
	} else if err != nil {
		r.Status, r.Error = int64(abi.StatusIO), err.Error()
	}
	h.rec.Record(&r)
}

// fileCall runs a file call through the policy and records it.
func fileCall[T any](h *Host, op, p string, do func() (T, error)) (T, error) {
	start := time.Now()
	req, why, err := h.decide(policyengine.Request{Cap: abi.CapSandboxFiles, Op: op}, p, start)
	if err != nil {
		var zero T
		return zero, err
	}
	v, err := do()
	h.record(req, start, audit.Allow, why, err)
	return v, err
}

// ReadFile implements pdk.Host.
func (h *Host) ReadFile(p string) ([]byte, error) {
	return fileCall(h, abi.FnRead, p, func() ([]byte, error) { return h.Host.ReadFile(p) })
}

// WriteFile implements pdk.Host.
func (h *Host) WriteFile(p string, data []byte) error {
	_, err := fileCall(h, abi.FnWrite, p, func() (struct{}, error) { return struct{}{}, h.Host.WriteFile(p, data) })
	return err
}

// Stat implements pdk.Host.
func (h *Host) Stat(p string) (abi.FileInfo, error) {
	return fileCall(h, abi.FnStat, p, func() (abi.FileInfo, error) { return h.Host.Stat(p) })
}

// List implements pdk.Host: a scoped plugin sees what it may read and the directories on
// the way to it, as from the host.
func (h *Host) List(req abi.ListRequest) (abi.ListResult, error) {
	p := req.Path
	if p == "" {
		p = "."
	}
	res, err := fileCall(h, abi.FnList, p, func() (abi.ListResult, error) { return h.Host.List(req) })
	if err != nil {
		return res, err
	}
	abs, _ := sandbox.Resolve(p)
	base := sandbox.Rel(abs)
	res.Entries = slices.DeleteFunc(res.Entries, func(e abi.FileInfo) bool {
		return !h.policy.Visible(filepath.ToSlash(filepath.Join(base, e.Path)), e.Type == abi.TypeDir)
	})
	return res, nil
}

// Exec implements pdk.Host: the program, the variables it sets and a background start are
// decided as the host decides them, and the timeout is cut to the policy's max_timeout.
func (h *Host) Exec(req abi.ExecRequest) (abi.ExecResult, error) {
	start := time.Now()
	preq := policyengine.Request{Cap: abi.CapSandboxExec, Op: abi.FnExec, Argv: req.Argv, Background: req.Background,
		Env: slices.Sorted(maps.Keys(req.Env))}
	preq, why, err := h.decide(preq, req.Cwd, start)
	if err != nil {
		return abi.ExecResult{}, err
	}
	if m := h.policy.MaxTimeout(); m > 0 && (req.TimeoutMS <= 0 || time.Duration(req.TimeoutMS)*time.Millisecond > m) {
		req.TimeoutMS = m.Milliseconds()
	}
	res, err := h.Host.Exec(req)
	h.record(preq, start, audit.Allow, why, err)
	return res, err
}
