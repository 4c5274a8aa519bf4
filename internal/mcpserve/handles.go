package mcpserve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/fleet"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// In a fleet, a session of the stateless revision (a handle session_start answered, or a
// token's default session of a project) outlives its replica as an MCP session does: its
// record in the store (fleet/handles/{handle}) names its project and owner, written
// before the handle is answered. A call naming a handle goes to its project's holder
// (route reads the handle's record); a holder that does not know the handle (the replica
// that opened it died, or handed it over at a deploy) adopts it from its record: the
// session opens again under the same handle, which takes the project over (its E2B
// sandbox reconnected, files and background processes included). A handle ends at
// session_end, idle or the server's end, and its record with it; a handoff keeps it. A
// record whose replica died with the session open goes stale (handlereap.go).

// handleRecord is a stateless session's record in the store.
type handleRecord struct {
	ID       string    `json:"id"`
	Project  string    `json:"project"`
	Owner    string    `json:"owner"`    // ownerOf the token that opened it
	IdleMS   int64     `json:"idle_ms"`  // its idle timeout
	Instance string    `json:"instance"` // the replica that wrote it last
	Created  time.Time `json:"created"`
	// Used is when the session was last used, by its holder's clock, written again at
	// most every quarter of its idle timeout (handlereap.go); zero in older records.
	Used time.Time `json:"used,omitzero"`
}

const maxHandleRecord = 4 << 10

// recordsHandles reports whether owner's held sessions have records: a fleet's
// stateless sessions (the shell's sessions belong to one daemon).
func (s *Server) recordsHandles(owner string) bool {
	return s.opts.Fleet != nil && owner != shellOwner
}

// recordHandle writes the record of a new handle; false when another replica has
// minted the same one (its record exists).
func (s *Server) recordHandle(ctx context.Context, id, project, owner string, idle time.Duration) (bool, error) {
	now := time.Now().UTC()
	err := s.writeHandle(ctx, handleRecord{ID: id, Project: project, Owner: owner, IdleMS: idle.Milliseconds(),
		Created: now, Used: now}, true)
	if errors.Is(err, store.ErrExists) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("recording session %s in the store: %w", id, err)
	}
	return true, nil
}

// writeHandle writes rec as this replica's, store.ErrExists when ifNotExists and there
// is a record of the handle.
func (s *Server) writeHandle(ctx context.Context, rec handleRecord, ifNotExists bool) error {
	rec.Instance = s.opts.Fleet.Instance()
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	_, err = s.fleetStore().Put(ctx, storekeys.FleetHandle(rec.ID), bytes.NewReader(b),
		store.PutOptions{Size: int64(len(b)), ContentType: "application/json", IfNotExists: ifNotExists})
	return err
}

// handleRecord reads the record of handle id: store.ErrNotFound when there is none, or
// it is not one a replica wrote.
func (s *Server) handleRecord(ctx context.Context, id string) (handleRecord, error) {
	var r handleRecord
	if !storekeys.ValidHandle(id) {
		return r, store.ErrNotFound
	}
	err := fleet.ReadRecord(ctx, s.fleetStore(), storekeys.FleetHandle(id), maxHandleRecord, &r)
	if err != nil && !errors.Is(err, fleet.ErrBadRecord) {
		return r, err // none, or the store could not be read
	}
	if err != nil || r.ID != id || r.Owner == "" || storekeys.ValidProject(r.Project) != nil {
		return r, fmt.Errorf("the record of session %s is not one this server wrote: %w", id, store.ErrNotFound)
	}
	return r, nil
}

// dropHandle deletes the record of a handle that ended.
func (s *Server) dropHandle(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.fleetStore().Delete(ctx, storekeys.FleetHandle(id)); err != nil && !errors.Is(err, store.ErrNotFound) {
		s.log.Warn("fleet: deleting the record of an ended session", "session", id, "err", err)
	}
}

// adoptHandle opens, under its handle, the stateless session id that req's token opened
// on another replica of the fleet, when this replica does not have it: its record in the
// store says which project. Nothing when this replica has it, or when there is no
// record of it for this token (the call then says there is no such session).
func (s *Server) adoptHandle(ctx context.Context, req *mcp.CallToolRequest, id string) error {
	owner := requestOwner(req)
	if !s.recordsHandles(owner) {
		return nil
	}
	if _, err := s.lookup(owner, id); err == nil || !errors.Is(err, errNoSuchSession) {
		return nil // here, or ended here (the call says so)
	}
	rec, err := s.handleRecord(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && rec.Owner != owner) {
		return nil // no session of this token: the call says so
	}
	if err != nil {
		s.log.Warn("fleet: reading a session's record", "session", id, "err", err)
		return fmt.Errorf("session %s could not be found: the store did not answer; make the call again", id)
	}
	if allowed := tokenProjects(req); len(allowed) > 0 && !slices.Contains(allowed, rec.Project) {
		return nil // the token may no longer open its project: no session of this token
	}
	if time.Now().After(rec.staleAt()) {
		return nil // idle past its timeout, its replica gone: it has ended (the call says so)
	}
	s.held.mu.Lock()
	slot := s.held.adopting[id]
	if slot == nil {
		slot = &defaultSlot{}
		s.held.adopting[id] = slot
	}
	s.held.mu.Unlock()
	slot.mu.Lock() // held while the session opens: a second call of the handle waits
	defer slot.mu.Unlock()
	defer func() {
		s.held.mu.Lock()
		if s.held.adopting[id] == slot {
			delete(s.held.adopting, id)
		}
		s.held.mu.Unlock()
	}()
	if _, err := s.lookup(owner, id); err == nil {
		return nil // adopted by the call that held the slot
	}
	if _, err := s.openHeld(ctx, owner, rec.Project, "", time.Duration(rec.IdleMS)*time.Millisecond, id, true); err != nil {
		return fmt.Errorf("session %s could not be opened again on this server: %w", id, err)
	}
	s.metrics.adopted.Add(1)
	s.log.Info("fleet: adopted a session", "session", id, "project", rec.Project, "from", rec.Instance)
	return nil
}

// tokenProjects is the projects req's token may open (nil: any).
func tokenProjects(req *mcp.CallToolRequest) []string {
	if req.Extra == nil || req.Extra.TokenInfo == nil {
		return nil
	}
	p, _ := req.Extra.TokenInfo.Extra["projects"].([]string)
	return p
}

// requestHandle is the session handle a stateless tools/call request names in its
// arguments, or "". r's body is read and put back.
func requestHandle(r *http.Request) string {
	if r.Body == nil {
		return ""
	}
	body, err := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return ""
	}
	var msg struct {
		Method string `json:"method"`
		Params struct {
			Arguments json.RawMessage `json:"arguments"`
		} `json:"params"`
	}
	if json.Unmarshal(body, &msg) != nil || msg.Method != "tools/call" {
		return ""
	}
	id, _, err := splitSession(msg.Params.Arguments)
	if err != nil || !storekeys.ValidHandle(id) {
		return ""
	}
	return id
}
