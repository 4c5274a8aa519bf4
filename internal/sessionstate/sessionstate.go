// Package sessionstate is the record of a live session in the store, one per session
// (storekeys.SessionState): the provider and sandbox it runs in, the shell's working
// directory, the background processes and terminals it knows, and who wrote it (the
// lease epoch, the writer's instance, the time). The session's holder rewrites it whenever
// it changes and deletes it when the session closes; a record of an earlier lease epoch
// that is still there when the project is opened next names a session whose process died,
// and a session of the next holder takes over from it (internal/session's Takeover) and
// deletes it.
//
// A record is data from the store: stale (its writer may have lost the project since) or
// hostile (anyone who can write the store can write it). Read bounds its size and checks
// every field, and a record that fails is as good as none; what it names is still checked
// where it is used (a sandbox is reconnected to only if its own labels name the project).
package sessionstate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// Version is the record format this package writes and reads.
const Version = 1

// Bounds on a record and its fields.
const (
	MaxBytes     = 256 << 10 // a record larger than this is not read
	MaxProcesses = 16        // the background processes a session carries over
	MaxTerminals = 16
	// MaxStateBytes bounds the plugins' session values a record carries (keys and values).
	MaxStateBytes = 128 << 10
	maxArgs       = 256
	maxArgvBytes  = 16 << 10
	maxPath       = 4096
	maxName       = 128
)

// ErrInvalid: a record is not one this version reads, or a field fails its check.
var ErrInvalid = errors.New("invalid session state record")

// Record is one project's live session.
type Record struct {
	V       int    `json:"v"`
	Project string `json:"project"`
	// Session names the session (its sandboxes' toolhost_session label).
	Session string `json:"session"`
	// Provider is the sandbox.provider the session ran with ("e2b", "e2b,local").
	Provider string `json:"provider"`
	// SandboxID is the sandbox the session runs in.
	SandboxID string `json:"sandbox_id"`
	// Cwd is the shell's working directory (the bash tool's, inside the sandbox).
	Cwd       string     `json:"cwd,omitempty"`
	Processes []Process  `json:"processes,omitempty"`
	Terminals []Terminal `json:"terminals,omitempty"`
	// State is the plugins' session values (toolhost_session.set), by plugin then key:
	// the files the model has read (edit_file's guard), the shell's directory. A session
	// whose values are over MaxStateBytes carries those that fit, smallest plugins
	// first; what is left out, the plugin asks for again (read the file first).
	State map[string]map[string][]byte `json:"state,omitempty"`
	// Epoch is the lease generation the writer held the project at (0: leases off).
	Epoch uint64 `json:"epoch"`
	// Instance names the writer's process.
	Instance  string    `json:"instance"`
	WrittenAt time.Time `json:"written_at"`
}

// Process is a background process of the session. Its environment is not recorded: it
// holds the secrets of the plugin that started it.
type Process struct {
	ID string `json:"id"`
	// Plugin is the plugin that started it ("" when none did): the one that may ask
	// after it and stop it.
	Plugin string   `json:"plugin,omitempty"`
	Argv   []string `json:"argv"`
	Cwd    string   `json:"cwd,omitempty"`
	PID    int      `json:"pid"`
	Log    string   `json:"log"`
}

// Terminal is a program the session runs on a terminal.
type Terminal struct {
	ID     string   `json:"id"`
	Plugin string   `json:"plugin,omitempty"`
	Argv   []string `json:"argv"`
	Cwd    string   `json:"cwd,omitempty"`
	Cols   int      `json:"cols,omitempty"`
	Rows   int      `json:"rows,omitempty"`
}

// The patterns are compiled at first use, not at package init: a counted repetition
// compiles into that many copies of its class (~0.5 MB allocated at the start of every
// process that links this package, a one-shot call's included).
var (
	idRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`) })
	// sessionRE names a session: one segment of a store key.
	sessionRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`) })
	nameRE    = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`) })
	pluginRE  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`) })
	// providerRE is a sandbox.provider value: names and commas.
	providerRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._, -]{0,127}$`) })
)

// Check reports the first field of r that fails its check for project, or nil.
func (r *Record) Check(project string) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
	}
	switch {
	case r.V != Version:
		return bad("version %d, this toolhost reads %d", r.V, Version)
	case r.Project != project:
		return bad("it names project %q, not %q", r.Project, project)
	case !sessionRE().MatchString(r.Session):
		return bad("session %q", r.Session)
	case !providerRE().MatchString(r.Provider):
		return bad("provider %q", r.Provider)
	case !idRE().MatchString(r.SandboxID):
		return bad("sandbox id %q", r.SandboxID)
	case r.Instance != "" && !nameRE().MatchString(r.Instance):
		return bad("instance %q", r.Instance)
	case r.WrittenAt.IsZero():
		return bad("no time written")
	case len(r.Processes) > MaxProcesses:
		return bad("%d processes, at most %d", len(r.Processes), MaxProcesses)
	case len(r.Terminals) > MaxTerminals:
		return bad("%d terminals, at most %d", len(r.Terminals), MaxTerminals)
	}
	if err := CheckPath(r.Cwd, false); err != nil {
		return bad("cwd: %v", err)
	}
	n := 0
	for plugin, vals := range r.State {
		if !pluginRE().MatchString(plugin) {
			return bad("state of plugin %q", plugin)
		}
		for k, v := range vals {
			if !validStateKey(k) || len(v) == 0 {
				return bad("state of plugin %s: key %q", plugin, k)
			}
			n += len(k) + len(v)
		}
	}
	if n > MaxStateBytes {
		return bad("plugin state of %d bytes, at most %d", n, MaxStateBytes)
	}
	seen := map[string]bool{}
	for i, p := range r.Processes {
		if seen[p.ID] {
			return bad("process %d: id %q twice", i, p.ID)
		}
		seen[p.ID] = true
		if err := p.Check(); err != nil {
			return bad("process %d: %v", i, err)
		}
	}
	for i, t := range r.Terminals {
		if seen[t.ID] {
			return bad("terminal %d: id %q twice", i, t.ID)
		}
		seen[t.ID] = true
		if err := t.Check(); err != nil {
			return bad("terminal %d: %v", i, err)
		}
	}
	return nil
}

// validStateKey reports whether k is a key of a plugin's session value as the host allows
// it: 1 to 512 of A-Z a-z 0-9 . _ / : @ + = -.
func validStateKey(k string) bool {
	if len(k) == 0 || len(k) > 512 {
		return false
	}
	for _, c := range []byte(k) {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', strings.IndexByte("._/:@+=-", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// Check reports what of p fails its check, or nil.
func (p Process) Check() error {
	switch {
	case !idRE().MatchString(p.ID):
		return fmt.Errorf("id %q", p.ID)
	case p.Plugin != "" && !pluginRE().MatchString(p.Plugin):
		return fmt.Errorf("%s: plugin %q", p.ID, p.Plugin)
	case p.PID <= 0 || p.PID > 1<<22:
		return fmt.Errorf("%s: pid %d", p.ID, p.PID)
	}
	if err := checkArgv(p.Argv); err != nil {
		return fmt.Errorf("%s: %w", p.ID, err)
	}
	if err := CheckPath(p.Cwd, false); err != nil {
		return fmt.Errorf("%s: cwd: %w", p.ID, err)
	}
	if p.Log != "" {
		if err := CheckPath(p.Log, true); err != nil {
			return fmt.Errorf("%s: log: %w", p.ID, err)
		}
	}
	return nil
}

// Check reports what of t fails its check, or nil.
func (t Terminal) Check() error {
	switch {
	case !idRE().MatchString(t.ID):
		return fmt.Errorf("id %q", t.ID)
	case t.Plugin != "" && !pluginRE().MatchString(t.Plugin):
		return fmt.Errorf("%s: plugin %q", t.ID, t.Plugin)
	case t.Cols < 0 || t.Cols > 1000 || t.Rows < 0 || t.Rows > 1000:
		return fmt.Errorf("%s: size %dx%d", t.ID, t.Cols, t.Rows)
	}
	if err := checkArgv(t.Argv); err != nil {
		return fmt.Errorf("%s: %w", t.ID, err)
	}
	if err := CheckPath(t.Cwd, false); err != nil {
		return fmt.Errorf("%s: cwd: %w", t.ID, err)
	}
	return nil
}

// checkArgv: 1 to maxArgs arguments of UTF-8 without NUL, maxArgvBytes in all.
func checkArgv(argv []string) error {
	if len(argv) == 0 || len(argv) > maxArgs {
		return fmt.Errorf("%d arguments", len(argv))
	}
	n := 0
	for _, a := range argv {
		n += len(a)
		if !utf8.ValidString(a) || strings.ContainsRune(a, 0) {
			return errors.New("an argument is not text")
		}
	}
	if n > maxArgvBytes || argv[0] == "" {
		return fmt.Errorf("argv of %d bytes, or no program", n)
	}
	return nil
}

// CheckPath: a path inside the sandbox, of text without control characters; abs: it must
// be absolute and clean (a log file's), else it may be empty or relative (a working
// directory's, against the workspace).
func CheckPath(p string, abs bool) error {
	if p == "" && !abs {
		return nil
	}
	if p == "" || len(p) > maxPath || !utf8.ValidString(p) {
		return fmt.Errorf("%q is not a path", p)
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%q holds a control character", p)
		}
	}
	if abs && (!path.IsAbs(p) || path.Clean(p) != p) {
		return fmt.Errorf("%q is not an absolute, clean path", p)
	}
	return nil
}

// MaxRecords bounds the records of one project List reads: a store holding more (left by
// many dead processes, or by someone else) gives the first MaxRecords.
const MaxRecords = 64

// Read reads one session's record. ok is false when there is none; a record that is too
// large or fails Check gives an error wrapping ErrInvalid (the caller goes on as if there
// were none, and says so).
func Read(ctx context.Context, st store.Store, project, session string) (rec Record, ok bool, err error) {
	if !sessionRE().MatchString(session) {
		return Record{}, false, fmt.Errorf("the session state of project %s: %w: session %q", project, ErrInvalid, session)
	}
	key := storekeys.SessionState(project, session)
	rc, info, err := st.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("read the session state %s: %w", key, err)
	}
	defer rc.Close()
	if info.Size > MaxBytes {
		return Record{}, false, fmt.Errorf("the session state %s: %w: %d bytes, at most %d", key, ErrInvalid, info.Size, MaxBytes)
	}
	b, err := io.ReadAll(io.LimitReader(rc, MaxBytes+1))
	if err != nil {
		return Record{}, false, fmt.Errorf("read the session state %s: %w", key, err)
	}
	if len(b) > MaxBytes {
		return Record{}, false, fmt.Errorf("the session state %s: %w: more than %d bytes", key, ErrInvalid, MaxBytes)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return Record{}, false, fmt.Errorf("the session state %s: %w: %v", key, ErrInvalid, err)
	}
	if err := rec.Check(project); err != nil {
		return Record{}, false, fmt.Errorf("the session state %s: %w", key, err)
	}
	if rec.Session != session {
		return Record{}, false, fmt.Errorf("the session state %s: %w: it names session %q", key, ErrInvalid, rec.Session)
	}
	return rec, true, nil
}

// List reads the records of project's live sessions (at most MaxRecords). Each record
// that cannot be used is left out, with why in bad; err is the listing's own failure.
func List(ctx context.Context, st store.Store, project string) (recs []Record, bad []error, err error) {
	objs, err := store.ListAll(ctx, st, storekeys.SessionStates(project))
	if err != nil {
		return nil, nil, fmt.Errorf("list the session states of project %s: %w", project, err)
	}
	if len(objs) > MaxRecords {
		bad = append(bad, fmt.Errorf("%w: project %s has %d session records; reading the first %d", ErrInvalid, project, len(objs), MaxRecords))
		objs = objs[:MaxRecords]
	}
	for _, o := range objs {
		session, ok := storekeys.ParseSessionState(project, o.Key)
		if !ok {
			bad = append(bad, fmt.Errorf("%w: %s is not a session record's key", ErrInvalid, o.Key))
			continue
		}
		rec, ok, err := Read(ctx, st, project, session)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return nil, nil, err
			}
			bad = append(bad, err)
		case ok:
			recs = append(recs, rec)
		}
	}
	return recs, bad, nil
}

// Write stores rec as its session's record, replacing the one there. It checks rec first:
// a session never writes what the next one would refuse.
func Write(ctx context.Context, st store.Store, rec Record) error {
	rec.V = Version
	if err := rec.Check(rec.Project); err != nil {
		return fmt.Errorf("write the session state of project %s: %w", rec.Project, err)
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if len(b) > MaxBytes {
		return fmt.Errorf("write the session state of project %s: %w: %d bytes, at most %d", rec.Project, ErrInvalid, len(b), MaxBytes)
	}
	key := storekeys.SessionState(rec.Project, rec.Session)
	if _, err := st.Put(ctx, key, bytes.NewReader(b), store.PutOptions{Size: int64(len(b)), ContentType: "application/json"}); err != nil {
		return fmt.Errorf("write the session state %s: %w", key, err)
	}
	return nil
}

// Delete removes a session's record (it closed, or another took over from it).
func Delete(ctx context.Context, st store.Store, project, session string) error {
	if !sessionRE().MatchString(session) {
		return fmt.Errorf("delete the session state of project %s: %w: session %q", project, ErrInvalid, session)
	}
	key := storekeys.SessionState(project, session)
	if err := st.Delete(ctx, key); err != nil {
		return fmt.Errorf("delete the session state %s: %w", key, err)
	}
	return nil
}

// Same reports whether a and b record the same session state, whenever they were written.
func Same(a, b Record) bool {
	a.WrittenAt, b.WrittenAt = time.Time{}, time.Time{}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}
