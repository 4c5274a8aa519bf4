package toolhost

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/session"
	"github.com/toolhost/toolhost/internal/sessionstate"
)

// A session's record in the store (internal/sessionstate), one per session: what a session
// of the next holder of the project takes over from when this process dies without
// closing the session. The session writes it (its recorder, session.go) as it opens and
// whenever it changes (its sandbox created, replaced or reconnected; a background process
// or terminal started or ended; the shell's directory changed), through the session's
// store, and deletes it when it closes. A session that took over from a record deletes
// that record once its own is written. A process that lost the project's lease writes
// nothing.

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
