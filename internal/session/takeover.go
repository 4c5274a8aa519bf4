package session

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/snapshot"
)

// A session outlives its process. Its owner keeps a record of it in the store (what State
// says, rewritten whenever OnChange fires), and its sandboxes carry labels naming the
// project, the lease epoch, the process and the session. When a process dies without
// closing its session, the next session of the project takes over from the record
// (Config.Takeover): where the provider can reconnect to a sandbox another process started
// (sandbox.Reconnector: E2B's outlive the replica that made them) and the recorded sandbox
// is alive and labelled with the project, the session reconnects to it, and nothing is
// lost: the files written since the last commit are there, the background processes still
// run and the session knows them again (their logs hold what they wrote). Otherwise (a
// local sandbox died with its host, an E2B one reached its end) it wakes from the last
// snapshot as always, and its first tool result says what was lost: the files changed
// since that snapshot, and which background processes no longer run. Config.Autosave
// bounds that loss. Sandboxes of the project that an earlier holder left running are
// killed (Config.Orphans).

// Labels the sandboxes of a session carry (CreateOptions.Labels, E2B's metadata), set by
// the session's owner.
const (
	LabelProject  = "toolhost_project"
	LabelEpoch    = "toolhost_epoch"
	LabelInstance = "toolhost_instance"
	LabelSession  = "toolhost_session"
	// LabelFleet names the fleet whose replica started the sandbox (the fleet's ID in
	// its store): a fleet reaps only its own orphans.
	LabelFleet = "toolhost_fleet"
)

// AutosaveLabel labels the commits Config.Autosave makes.
const AutosaveLabel = "autosave"

// ProcessState is a background process as the session knows it: enough to tell the agent
// about it, to find it again by its ID, and to start it again after a rotation.
type ProcessState struct {
	ID      string
	Argv    []string
	Cwd     string
	PID     int
	LogPath string
}

// TerminalState is a program on a terminal as the session knows it.
type TerminalState struct {
	ID         string
	Argv       []string
	Cwd        string
	Cols, Rows int
}

// State is what a session's record holds of it: its sandbox and what runs there.
type State struct {
	SandboxID string
	Processes []ProcessState
	Terminals []TerminalState
}

// Takeover is what an earlier session of the project left in its record when its process
// stopped without closing it. The record is data from the store: stale, maybe hostile; the
// owner validated its form, and the session reaches no sandbox without Labels.
type Takeover struct {
	// SandboxID is the sandbox the earlier session recorded last.
	SandboxID string
	// Session is the earlier session's LabelSession. When SandboxID is gone, the newest
	// sandbox labelled with it is taken instead: a rotation made it and the process died
	// before recording it.
	Session string
	// Labels are what the sandbox must carry ({LabelProject: the project}); the project's
	// sandboxes are listed by them.
	Labels    map[string]string
	Processes []ProcessState
	Terminals []TerminalState
	// Who and When say, for the notice and the log, who wrote the record and when.
	Who  string
	When time.Time
}

// Orphans are sandboxes of the project that nobody holds: a session kills, once it runs,
// those Filter lists (sandbox.Lister) and Orphan says are orphans (an earlier lease
// epoch's), except its own.
type Orphans struct {
	Filter map[string]string
	Orphan func(sandbox.SandboxInfo) bool
}

// State reports the session's sandbox and the background processes and terminals it
// knows: what its record says.
func (s *Workspace) State() State {
	s.mu.RLock()
	st := State{SandboxID: s.sb.ID()}
	s.mu.RUnlock()
	s.bg.mu.Lock()
	defer s.bg.mu.Unlock()
	for _, p := range s.bg.procs {
		st.Processes = append(st.Processes, ProcessState{ID: p.tag, Argv: slices.Clone(p.argv), Cwd: p.cwd, PID: p.pid, LogPath: p.logPath})
	}
	for _, t := range s.bg.terms {
		st.Terminals = append(st.Terminals, TerminalState{ID: t.req.Tag, Argv: slices.Clone(t.req.Argv), Cwd: t.req.Cwd, Cols: t.req.Cols, Rows: t.req.Rows})
	}
	return st
}

// TookOver reports whether Open reconnected to the sandbox an earlier session left
// (Config.Takeover), its background processes known again.
func (s *Workspace) TookOver() bool { return s.tookOver }

// changed tells the owner that State may say something new. It may be called with the
// session's locks held: OnChange only signals.
func (s *Workspace) changed() {
	if s.cfg.OnChange != nil {
		s.cfg.OnChange()
	}
}

// takeOver reconnects to the sandbox t names (or a newer one of its session) when the
// provider can. It returns nil and why not when it cannot; spare says the sandbox may
// still be alive (it could not be reached), so no orphan sweep may kill it. An error is
// ctx's only.
func (s *Workspace) takeOver(ctx context.Context, t *Takeover) (sb sandbox.Sandbox, why string, spare bool, err error) {
	r, ok := sandbox.ProviderAs[sandbox.Reconnector](s.cfg.Provider)
	if !ok {
		return nil, "its sandbox was not one this session can reconnect to (the local provider's sandboxes end with their host)", false, nil
	}
	target := t.SandboxID
	if l, ok := sandbox.ProviderAs[sandbox.Lister](s.cfg.Provider); ok && len(t.Labels) > 0 {
		infos, err := l.List(ctx, t.Labels)
		switch {
		case err == nil:
			target = pick(infos, t)
		case ctx.Err() != nil:
			return nil, "", false, ctx.Err()
		default:
			s.log.Warn("session: cannot list the project's sandboxes; trying the recorded one", "sandbox", t.SandboxID, "err", err)
		}
	}
	if target == "" {
		return nil, "its sandbox is gone (it reached its end time, or was killed)", false, nil
	}
	// The sandbox is this session's from now on: its labels name this session's lease
	// epoch and process, and its egress goes through this process's gateway.
	sb, err = r.Reconnect(ctx, target, sandbox.ReconnectOptions{Timeout: s.cfg.TTL, Labels: t.Labels,
		SetLabels: s.cfg.Sandbox.Labels, Egress: s.cfg.Sandbox.Egress})
	switch {
	case err == nil:
		return sb, "", false, nil
	case ctx.Err() != nil:
		return nil, "", false, ctx.Err()
	case errors.Is(err, sandbox.ErrGone):
		return nil, "its sandbox is gone (it reached its end time, or was killed)", false, nil
	case errors.Is(err, sandbox.ErrForeign):
		// Another provider's sandbox (a local one, in "e2b,local"), or one whose own labels
		// name another project: a stale or hostile record. The error says which.
		s.log.Warn("session: the sandbox the project's record names is not one this session may take", "sandbox", target, "err", err)
		return nil, "its record named a sandbox this session may not take (another provider's, or not this project's)", false, nil
	default:
		s.log.Error("session: could not reconnect to the sandbox an earlier session left; starting from the last snapshot", "sandbox", target, "err", err)
		return nil, "its sandbox could not be reached", true, nil
	}
}

// pick is the sandbox to take among the project's: the recorded one when it is listed,
// else the newest of the earlier session, else none.
func pick(infos []sandbox.SandboxInfo, t *Takeover) string {
	var best *sandbox.SandboxInfo
	for i, in := range infos {
		if in.ID == t.SandboxID {
			return in.ID
		}
		if t.Session != "" && in.Labels[LabelSession] == t.Session && (best == nil || in.StartedAt.After(best.StartedAt)) {
			best = &infos[i]
		}
	}
	if best == nil {
		return ""
	}
	return best.ID
}

// adoptRecorded makes the processes and terminals t recorded the session's own again,
// those that still run in sb (all of them when sb cannot tell), and sets the notice that
// says so. Called before the session runs.
func (s *Workspace) adoptRecorded(ctx context.Context, sb sandbox.Sandbox, t *Takeover) {
	alive := map[string]int{} // id -> pid
	listed := false
	if pl, ok := sandbox.As[sandbox.ProcessLister](sb); ok {
		lctx, cancel := context.WithTimeout(ctx, listTimeout)
		infos, err := pl.Processes(lctx)
		cancel()
		if err == nil {
			listed = true
			for _, in := range infos {
				alive[in.ID] = in.PID
			}
		} else {
			s.log.Warn("session: cannot tell which recorded background processes still run; taking all as running", "err", err)
		}
	}
	running := func(id string) (int, bool) {
		pid, ok := alive[id]
		return pid, ok || !listed
	}
	var runLines, endLines []string
	pids := map[int]bool{}
	s.bg.mu.Lock()
	for _, p := range t.Processes {
		pid, ok := running(p.ID)
		if !ok {
			endLines = append(endLines, fmt.Sprintf("- %s (log %s): %s", p.ID, p.LogPath, display(p.Argv)))
			continue
		}
		if pid == 0 {
			pid = p.PID
		}
		pids[pid] = true
		s.bg.procs = append(s.bg.procs, &bgProc{tag: p.ID, argv: slices.Clone(p.Argv), cwd: p.Cwd, pid: pid, logPath: p.LogPath})
		runLines = append(runLines, fmt.Sprintf("- %s (pid %d, log %s): %s", p.ID, pid, p.LogPath, display(p.Argv)))
	}
	for _, tm := range t.Terminals {
		if _, ok := running(tm.ID); !ok {
			endLines = append(endLines, fmt.Sprintf("- terminal %s: %s", tm.ID, display(tm.Argv)))
			continue
		}
		s.bg.terms = append(s.bg.terms, &termProc{req: sandbox.TerminalRequest{Argv: slices.Clone(tm.Argv), Cwd: tm.Cwd, Cols: tm.Cols, Rows: tm.Rows, Tag: tm.ID}})
		runLines = append(runLines, fmt.Sprintf("- terminal %s: %s", tm.ID, display(tm.Argv)))
	}
	notice := fmt.Sprintf("[Note: this session took over from an earlier session of the project that stopped without closing (%s, last recorded %s). It reconnected to the same sandbox: %s.",
		t.Who, t.When.UTC().Format(time.RFC3339), filesKept)
	if len(runLines) > 0 {
		notice += " These background processes still run, under their ids:\n" + strings.Join(runLines, "\n")
	}
	if len(endLines) > 0 {
		notice += "\nThese ended while no session watched (their logs remain):\n" + strings.Join(endLines, "\n")
	}
	s.bg.notice = notice + "]"
	s.bg.mu.Unlock()
	// The dev server is the one of theirs that listens (the lowest port), for
	// take_screenshot's default.
	if ports, err := sandbox.Ports(ctx, sb); err == nil {
		for _, lp := range ports {
			if pids[lp.PID] && (s.devPort == 0 || lp.Port < s.devPort) {
				s.devPort = lp.Port
			}
		}
	}
}

// noticeLost sets the notice of a takeover that could not reconnect: what is lost.
func (s *Workspace) noticeLost(t *Takeover, why string, restored snapshot.Info, woke bool) {
	notice := fmt.Sprintf("[Note: this session took over from an earlier session of the project that stopped without closing (%s, last recorded %s); %s.",
		t.Who, t.When.UTC().Format(time.RFC3339), why)
	if woke {
		notice += fmt.Sprintf(" The workspace was restored from the last snapshot, taken %s: files changed after that are gone.", restored.Time.UTC().Format(time.RFC3339))
	} else {
		notice += " There was no snapshot to restore: the workspace starts empty, and the files of that session are gone."
	}
	var lines []string
	for _, p := range t.Processes {
		lines = append(lines, fmt.Sprintf("- %s: %s", p.ID, display(p.Argv)))
	}
	for _, tm := range t.Terminals {
		lines = append(lines, fmt.Sprintf("- terminal %s: %s", tm.ID, display(tm.Argv)))
	}
	if len(lines) > 0 {
		notice += " These background processes of that session are not running here, and their output is gone; start again what you need:\n" + strings.Join(lines, "\n")
	}
	s.bg.mu.Lock()
	s.bg.notice = notice + "]"
	s.bg.mu.Unlock()
}

// sweep kills the sandboxes o names orphans, except the session's own. Run once, in the
// background, after the session opened.
func (s *Workspace) sweep(ctx context.Context, o *Orphans) {
	l, ok := sandbox.ProviderAs[sandbox.Lister](s.cfg.Provider)
	k, ok2 := sandbox.ProviderAs[sandbox.Killer](s.cfg.Provider)
	if !ok || !ok2 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	infos, err := l.List(ctx, o.Filter)
	if err != nil {
		s.log.Warn("session: cannot list the project's sandboxes to end those left behind", "err", err)
		return
	}
	for _, in := range infos {
		s.mu.RLock()
		own := in.ID == s.sb.ID()
		s.mu.RUnlock()
		if own || !o.Orphan(in) {
			continue
		}
		if err := k.Kill(ctx, in.ID); err != nil {
			s.log.Warn("session: could not kill a sandbox an earlier session of the project left", "sandbox", in.ID, "err", err)
			continue
		}
		s.log.Warn("session: killed a sandbox an earlier session of the project left running", "sandbox", in.ID,
			"labels", in.Labels, "started", in.StartedAt.UTC().Format(time.RFC3339))
	}
}

// autosave commits every Config.Autosave until the session closes (a commit labelled
// AutosaveLabel, through Commit as any other): what a death of this process can lose is
// bounded by it.
func (s *Workspace) autosave(ctx context.Context) {
	wake := make(chan struct{}, 1)
	for {
		t := s.clock.AfterFunc(s.cfg.Autosave, func() {
			select {
			case wake <- struct{}{}:
			default:
			}
		})
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-wake:
		}
		cctx, cancel := context.WithTimeout(ctx, max(s.cfg.Autosave, 5*time.Minute))
		info, err := s.Commit(cctx, AutosaveLabel)
		cancel()
		switch {
		case err == nil:
			s.log.Debug("session: autosaved", "snapshot", info.Key, "unchanged", info.Unchanged)
		case errors.Is(err, ErrClosed) || ctx.Err() != nil:
			return
		default:
			s.log.Warn("session: autosave failed; trying again at the next period", "err", err)
		}
	}
}
