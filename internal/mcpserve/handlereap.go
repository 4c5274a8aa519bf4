package mcpserve

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/rootapi"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// A stateless session's record outlives its session when its replica dies with it open
// (kill -9, out of memory): nothing ends it there. The record says when the session was
// last used (its holder writes the time again as a call starts and ends, at most every
// quarter of its idle timeout), so any replica can tell when the session has certainly
// ended, idle: staleAt. A call naming a stale handle finds no session (adoptHandle), and
// the orphan reaper's pass (orphans.go) deletes stale records, each holding its project's
// lease as it does (rootapi.HoldFreeProject, the lease the orphans are killed under): a project
// someone holds may hold the session, and a replica that wakes from a pause longer than
// the lease has lost it, so its copy of the session ends.

// handleSkew is how far the clocks of two replicas may disagree: a record is stale this
// long after its session would have ended, idle, by the clock of the replica that wrote it.
const handleSkew = time.Minute

// staleAt is when rec's session has certainly ended, idle (or its replica died): its
// last use, plus its idle timeout, plus the quarter of it a holder may leave the record's
// time unwritten, plus handleSkew.
func (r handleRecord) staleAt() time.Time {
	used := r.Used
	if used.IsZero() {
		used = r.Created // a record written before records had the time of their last use
	}
	idle := time.Duration(r.IdleMS) * time.Millisecond
	return used.Add(idle + idle/4 + handleSkew)
}

// touchHandle writes the record of h, a session held here, again with the time of its
// last use, when it was last written more than a quarter of its idle timeout ago. This
// replica holds the project's lease, under which alone a record is reaped.
func (s *Server) touchHandle(ctx context.Context, h *held) {
	now := time.Now()
	if !h.recorded || now.Sub(time.Unix(0, h.touched.Load())) < h.idle/4 {
		return
	}
	select {
	case <-h.b.gone:
		return // ended: its record is gone, or another replica's
	default:
	}
	h.touched.Store(now.UnixNano())
	if err := s.writeHandle(ctx, handleRecord{ID: h.id, Project: h.b.project, Owner: h.b.owner,
		IdleMS: h.idle.Milliseconds(), Created: h.started.UTC(), Used: now.UTC()}, false); err != nil {
		s.log.Warn("fleet: writing the time of a session's last use in its record", "session", h.id, "err", err)
	}
}

// reapHandles deletes the records of the fleet's stateless sessions that are stale
// (staleAt passed) and that no replica holds: for each of their projects it takes the
// project's lease when nobody holds it (or holds it already, for a session of its own),
// judges each record again under it and deletes it. It returns how many it deleted.
func (s *Server) reapHandles(ctx context.Context) (int, error) {
	st := s.fleetStore()
	objs, err := store.ListAll(ctx, st, storekeys.FleetHandles)
	if err != nil {
		return 0, fmt.Errorf("listing the sessions' records: %w", err)
	}
	now := time.Now()
	stale := map[string][]string{} // by project
	for _, o := range objs {
		id := strings.TrimPrefix(o.Key, storekeys.FleetHandles)
		rec, err := s.handleRecord(ctx, id)
		if err != nil || !now.After(rec.staleAt()) || s.holdsHandle(id) {
			continue // gone, not one a replica wrote (left alone), or not stale
		}
		stale[rec.Project] = append(stale[rec.Project], id)
	}
	n := 0
	var errs []error
	for project, ids := range stale {
		del := func(ctx context.Context, lost func() error) error {
			for _, id := range ids {
				// Judged again under the lease: an adopter may have written it since.
				rec, err := s.handleRecord(ctx, id)
				if err != nil || !time.Now().After(rec.staleAt()) || s.holdsHandle(id) {
					continue
				}
				if err := lost(); err != nil {
					return err // another replica judges now
				}
				if err := st.Delete(ctx, storekeys.FleetHandle(id)); err != nil {
					return fmt.Errorf("deleting the record of session %s: %w", id, err)
				}
				n++
				s.log.Info("fleet: deleted the record of a session idle past its timeout whose replica is gone",
					"session", id, "project", project, "written_by", rec.Instance, "used", rec.Used)
			}
			return nil
		}
		// Under the lease this replica holds for a session of its own, the stale records
		// of the project it does not hold (holdsHandle) are no other replica's either.
		_, err := rootapi.HoldFreeProject(ctx, s.th, project, 0, del)
		if err != nil {
			errs = append(errs, fmt.Errorf("reaping the sessions' records of project %s: %w", project, err))
		}
	}
	return n, errors.Join(errs...)
}

// holdsHandle reports whether session id is held here, or being adopted here.
func (s *Server) holdsHandle(id string) bool {
	s.held.mu.Lock()
	defer s.held.mu.Unlock()
	return s.held.byID[id] != nil || s.held.adopting[id] != nil
}
