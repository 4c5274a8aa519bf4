package toolhost

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/session"
	"github.com/toolhost/toolhost/internal/sessionstate"
)

// A session's record in the store (internal/sessionstate), one per session: what a session
// of the next holder of the project takes over from when this process dies without
// closing the session. The session writes it as it opens and whenever it changes (its
// sandbox created, replaced or reconnected; a background process or terminal started or
// ended; the shell's directory changed), through the session's store, and deletes it when
// it closes. A session that took over from a record deletes that record once its own is
// written. A process that lost the project's lease writes nothing.

// The bash plugin keeps the shell's working directory in its session state under this key
// (plugins/bash/shell.go): the record carries it, so the next session's shell starts there.
const (
	bashPlugin = "bash"
	bashCwdKey = "shell/cwd"
)

// recordRetry is the wait before writing a record again after a failed write.
const recordRetry = 10 * time.Second

func newSessionID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "s-" + hex.EncodeToString(b[:])
}

// recordStore is where sessions' records are read from (each session writes its own
// through its fenced store, Session.store).
func (t *Toolhost) recordStore() store.Store { return t.storage.store }

// epochOf is the lease epoch a session holds its project at (0: leases off).
func epochOf(ls *projectLease) uint64 {
	if ls == nil || ls.l == nil {
		return 0
	}
	return ls.l.Epoch()
}

// takeover is what a session opening a project takes over, if anything, and what it must
// leave alone.
type takeover struct {
	to  *session.Takeover   // nil: nothing to take over
	rec sessionstate.Record // the record taken over
	// pending are the sessions of other dead records, each for a later session of the
	// project to take over: the orphan sweep leaves their sandboxes alone.
	pending map[string]bool
}

// takeoverFrom reads the project's session records and picks the one this session takes
// over: the newest of a session whose holder lost the project (an earlier lease epoch, of
// another process: dead, or fenced off) that no other session of this process took. It
// claims it; release gives it back if the session does not open. With leases off, no record
// says whether its writer is dead, so none is taken over. A record that fails its checks is
// logged and ignored.
func (t *Toolhost) takeoverFrom(ctx context.Context, project string, epoch uint64, log *slog.Logger) (takeover, func()) {
	none := func() {}
	recs, bad, err := sessionstate.List(ctx, t.recordStore(), project)
	for _, e := range bad {
		log.Warn("a session record of the project cannot be used; ignoring it", "project", project, "err", e)
	}
	if err != nil {
		log.Warn("the project's session records cannot be read; opening without them", "project", project, "err", err)
		return takeover{}, none
	}
	var dead []sessionstate.Record
	for _, rec := range recs {
		switch {
		case rec.Epoch >= epoch:
			// This lease's (another session of this process), or a future epoch's: never
			// a dead holder's.
		case rec.Instance == t.instance && !t.wasLeft(project, rec.Session):
			// An earlier lease of this very process: its session may still be open here
			// (it lost the lease and keeps its sandbox until it closes), unless it was
			// handed over (a fleet's session that lost its lease and is opened again).
		default:
			dead = append(dead, rec)
		}
	}
	if len(dead) == 0 {
		return takeover{}, none
	}
	if epoch == 0 {
		log.Warn("earlier sessions of the project left their records, but with leases off whether they still run cannot be known: not taking over from them",
			"project", project, "records", len(dead))
		return takeover{}, none
	}
	slices.SortFunc(dead, func(a, b sessionstate.Record) int { return b.WrittenAt.Compare(a.WrittenAt) })
	tk := takeover{pending: map[string]bool{}}
	t.claimMu.Lock()
	for _, rec := range dead {
		key := project + "/" + rec.Session
		if t.claimed[key] {
			continue
		}
		if tk.to == nil {
			if t.claimed == nil {
				t.claimed = map[string]bool{}
			}
			t.claimed[key] = true
			tk.rec = rec
			tk.to = &session.Takeover{}
			continue
		}
		tk.pending[rec.Session] = true
	}
	t.claimMu.Unlock()
	if tk.to == nil {
		return tk, none
	}
	rec := tk.rec
	release := func() {
		t.claimMu.Lock()
		delete(t.claimed, project+"/"+rec.Session)
		t.claimMu.Unlock()
	}
	to := tk.to
	to.SandboxID, to.Session = rec.SandboxID, rec.Session
	to.Labels = map[string]string{session.LabelProject: project}
	to.Who, to.When = fmt.Sprintf("instance %s, lease epoch %d", rec.Instance, rec.Epoch), rec.WrittenAt
	for _, p := range rec.Processes {
		to.Processes = append(to.Processes, session.ProcessState{ID: p.ID, Argv: p.Argv, Cwd: p.Cwd, PID: p.PID, LogPath: p.Log})
	}
	for _, tm := range rec.Terminals {
		to.Terminals = append(to.Terminals, session.TerminalState{ID: tm.ID, Argv: tm.Argv, Cwd: tm.Cwd, Cols: tm.Cols, Rows: tm.Rows})
	}
	log.Warn("an earlier session of the project stopped without closing; taking over from its record",
		"project", project, "sandbox", rec.SandboxID, "session", rec.Session, "recorded_by", rec.Instance, "record_epoch", rec.Epoch,
		"epoch", epoch, "recorded", rec.WrittenAt.UTC().Format(time.RFC3339), "processes", len(rec.Processes), "others_pending", len(tk.pending))
	return tk, release
}

// leave marks the record of session sess of project, handed over by this process, as one
// a later session of this process may take over.
func (t *Toolhost) leave(project, sess string) {
	t.claimMu.Lock()
	defer t.claimMu.Unlock()
	if t.left == nil || len(t.left) >= 16384 {
		t.left = map[string]bool{}
	}
	t.left[project+"/"+sess] = true
}

// wasLeft reports whether this process handed over the session sess of project.
func (t *Toolhost) wasLeft(project, sess string) bool {
	t.claimMu.Lock()
	defer t.claimMu.Unlock()
	return t.left[project+"/"+sess]
}

// orphansOf says which sandboxes of the project are orphans for a session at epoch: those
// labelled with an earlier epoch (their holder lost the project), except those of sessions
// whose records wait for a later session to take them over. Nil with leases off.
func orphansOf(project string, epoch uint64, pending map[string]bool) *session.Orphans {
	if epoch == 0 {
		return nil
	}
	return &session.Orphans{
		Filter: map[string]string{session.LabelProject: project},
		Orphan: func(in sandbox.SandboxInfo) bool {
			e, err := strconv.ParseUint(in.Labels[session.LabelEpoch], 10, 64)
			return err == nil && e < epoch && !pending[in.Labels[session.LabelSession]]
		},
	}
}

// adoptCarried gives back to the plugins what the session took over: each its background
// processes and terminals (when the sandbox was reconnected: they still run there), and
// the shell its working directory.
func (s *Session) adoptCarried(rec sessionstate.Record) {
	if s.live.TookOver() {
		for _, p := range rec.Processes {
			if p.Plugin != "" {
				s.tools.AdoptProcess(p.Plugin, p.ID, p.Log)
			}
		}
		for _, tm := range rec.Terminals {
			if tm.Plugin != "" {
				s.tools.AdoptTerminal(tm.Plugin, tm.ID)
			}
		}
	}
	for plugin, vals := range rec.State {
		for k, v := range vals {
			s.tools.SetPluginState(plugin, k, v)
		}
	}
	if rec.Cwd != "" {
		s.tools.SetPluginState(bashPlugin, bashCwdKey, []byte(rec.Cwd))
	}
}

// carriedState is the plugins' session values a record carries: whole plugins, the
// smallest first, while they fit in sessionstate.MaxStateBytes (a plugin's values are
// carried all or none: a part of them could say something none of them says).
func carriedState(all map[string]map[string][]byte) map[string]map[string][]byte {
	type sized struct {
		plugin string
		n      int
	}
	var ps []sized
	for plugin, vals := range all {
		n := 0
		for k, v := range vals {
			n += len(k) + len(v)
		}
		if len(vals) > 0 {
			ps = append(ps, sized{plugin, n})
		}
	}
	slices.SortFunc(ps, func(a, b sized) int { return cmp.Or(cmp.Compare(a.n, b.n), strings.Compare(a.plugin, b.plugin)) })
	var out map[string]map[string][]byte
	total := 0
	for _, p := range ps {
		if total+p.n > sessionstate.MaxStateBytes {
			break
		}
		total += p.n
		if out == nil {
			out = map[string]map[string][]byte{}
		}
		out[p.plugin] = all[p.plugin]
	}
	return out
}

// record is what the session's record says now.
func (s *Session) record() sessionstate.Record {
	st := s.live.State()
	rec := sessionstate.Record{
		V: sessionstate.Version, Project: s.project, Session: s.id, Provider: s.th.cfg.Sandbox.Provider,
		SandboxID: st.SandboxID, Epoch: epochOf(s.lease), Instance: s.th.instance,
	}
	if cwd, ok := s.tools.PluginState(bashPlugin, bashCwdKey); ok && sessionstate.CheckPath(string(cwd), false) == nil {
		rec.Cwd = string(cwd)
	}
	rec.State = carriedState(s.tools.PluginStates())
	owner := map[string]string{}
	for _, o := range s.tools.OwnedProcesses() {
		owner[o.ID] = o.Plugin
	}
	for _, o := range s.tools.OwnedTerminals() {
		owner[o.ID] = o.Plugin
	}
	// What a reader would refuse is left out (a command past the record's bounds), so
	// the rest is recorded.
	for _, p := range st.Processes {
		rp := sessionstate.Process{ID: p.ID, Plugin: owner[p.ID], Argv: p.Argv, Cwd: p.Cwd, PID: p.PID, Log: p.LogPath}
		if rp.Check() == nil && len(rec.Processes) < sessionstate.MaxProcesses {
			rec.Processes = append(rec.Processes, rp)
		}
	}
	for _, tm := range st.Terminals {
		rt := sessionstate.Terminal{ID: tm.ID, Plugin: owner[tm.ID], Argv: tm.Argv, Cwd: tm.Cwd, Cols: tm.Cols, Rows: tm.Rows}
		if rt.Check() == nil && len(rec.Terminals) < sessionstate.MaxTerminals {
			rec.Terminals = append(rec.Terminals, rt)
		}
	}
	return rec
}

// recorder keeps a session's record: it writes it when it changed, from its own goroutine
// (a change may be noticed under the session's locks), until stopped.
type recorder struct {
	s    *Session
	kick chan struct{}
	stop context.CancelFunc
	done chan struct{}

	wmu     sync.Mutex // held by a flush from reading the session to writing its record
	mu      sync.Mutex
	last    sessionstate.Record
	written bool
	retry   *time.Timer
	said    bool // a record that could not be written was logged
}

func newRecorder(s *Session) *recorder {
	return &recorder{s: s, kick: make(chan struct{}, 1), done: make(chan struct{})}
}

// changed asks for the record to be written if it changed. It never blocks.
func (r *recorder) changed() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// start runs the writer until stop.
func (r *recorder) start() {
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	go func() {
		defer close(r.done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-r.kick:
			}
			r.flush(ctx)
		}
	}()
}

// close stops the writer and waits for it.
func (r *recorder) close() {
	if r.stop == nil {
		return
	}
	r.stop()
	<-r.done
	r.mu.Lock()
	if r.retry != nil {
		r.retry.Stop()
	}
	r.mu.Unlock()
}

// flush writes the record if it changed since it was last written. A failed write is
// tried again after recordRetry.
func (r *recorder) flush(ctx context.Context) {
	r.wmu.Lock() // two flushes at once could write an older record over a newer one
	defer r.wmu.Unlock()
	s := r.s
	if s.leaseErr() != nil {
		return // the project is another's now: its record is too
	}
	rec := s.record()
	r.mu.Lock()
	same := r.written && sessionstate.Same(rec, r.last)
	r.mu.Unlock()
	if same {
		return
	}
	rec.WrittenAt = time.Now().UTC()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err := sessionstate.Write(wctx, s.store, rec)
	cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		if !r.said || !errors.Is(err, sessionstate.ErrInvalid) {
			s.log.Warn("the session's record could not be written; a takeover after a crash would start from a stale one", "project", s.project, "err", err)
			r.said = true
		}
		if r.retry != nil {
			r.retry.Stop()
		}
		r.retry = time.AfterFunc(recordRetry, r.changed)
		return
	}
	r.last, r.written = rec, true
}
