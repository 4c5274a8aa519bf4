package mcpserve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/fleet"
	"github.com/toolhost/toolhost/internal/lease"
	"github.com/toolhost/toolhost/internal/rootapi"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// A replica of a fleet (Options.Fleet) serves any project. A request goes to the replica
// that holds its project's lease: served here when this replica holds it (or nobody does,
// and this one is not draining: opening the session takes the lease), else forwarded to
// the holder, signed with the fleet secret for the client's principal (a token's name;
// the client's token stays here). A holder whose connection is refused is gone: the
// request is served here, which takes the project over (the store judges).
//
// A request's project: its Toolhost-Project header (or ?project=, or the token's first
// project, as gate decides), and for a request of an MCP session (Mcp-Session-Id), the
// session's record in the store (fleet/sessions/{id}), written when the session was
// initialized, wherever that was. A replica that is asked for a session it does not know
// (its replica went away, or drained) adopts it from that record: the handshake the
// client made is replayed into a new session of the same id, so the client goes on.

// fleetToken is the bearer "token" a verified fleet request stands in with for the auth
// middleware: not a secret (the signature is what counts), and refused without one.
const fleetToken = "toolhost-fleet-verified-request"

type fleetCtxKey int

const (
	principalKey fleetCtxKey = iota // the principal a verified fleet request acts for
	adoptKey                        // the session being adopted (adoption)
)

// sessionRecord is an MCP session's record in the store.
type sessionRecord struct {
	ID       string `json:"id"`
	Project  string `json:"project"`
	Owner    string `json:"owner,omitempty"` // the token's name
	Protocol string `json:"protocol"`        // the negotiated MCP revision
	// Init is the client's initialize params, replayed when another replica adopts it.
	Init     json.RawMessage `json:"init"`
	Instance string          `json:"instance"` // the replica that wrote it
	Created  time.Time       `json:"created"`
}

const maxSessionRecord = 64 << 10

// adoption is a session a replica is taking in under its old id.
type adoption struct {
	id  string
	rec sessionRecord
}

// recordCache caches the fleet's records read, by id (a session's never changes once
// written; a handle's goes when its session ends, which a reader of the cache must
// allow for). Bounded: records are read again when dropped.
type recordCache[T any] struct {
	mu sync.Mutex
	m  map[string]T
}

func (c *recordCache[T]) get(id string) (T, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.m[id]
	return r, ok
}

func (c *recordCache[T]) put(id string, r T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= 16384 {
		c.m = map[string]T{}
	}
	c.m[id] = r
}

func (s *Server) fleetStore() store.Store { return rootapi.Store(s.th) }

// recordSession writes an MCP session's record when its initialize arrives (fleet only).
func (s *Server) recordSession(ctx context.Context, ss *mcp.ServerSession, project, owner string, params mcp.Params) error {
	if s.opts.Fleet == nil || ss == nil || ss.ID() == "" || params == nil {
		return nil
	}
	if a, ok := ctx.Value(adoptKey).(adoption); ok && a.id == ss.ID() {
		return nil // adopted: its record is the one it was adopted from
	}
	init, err := json.Marshal(params)
	if err != nil {
		return err
	}
	var head struct {
		ProtocolVersion string `json:"protocolVersion"`
	}
	json.Unmarshal(init, &head)
	rec := sessionRecord{ID: ss.ID(), Project: project, Owner: owner, Protocol: head.ProtocolVersion, Init: init,
		Instance: s.opts.Fleet.Instance(), Created: time.Now().UTC()}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if len(b) > maxSessionRecord {
		return fmt.Errorf("the initialize request is larger than %d bytes", maxSessionRecord)
	}
	if _, err := s.fleetStore().Put(ctx, storekeys.FleetSession(rec.ID), bytes.NewReader(b),
		store.PutOptions{Size: int64(len(b)), ContentType: "application/json", IfNotExists: true}); err != nil {
		return fmt.Errorf("recording the session in the store: %w", err)
	}
	s.sessRecs.put(rec.ID, rec)
	return nil
}

// sessionRecord finds the record of the MCP session id: store.ErrNotFound when there is
// none (or id cannot name one).
func (s *Server) sessionRecord(ctx context.Context, id string) (sessionRecord, error) {
	if r, ok := s.sessRecs.get(id); ok {
		return r, nil
	}
	var r sessionRecord
	if !storekeys.ValidFleetName(id) {
		return r, store.ErrNotFound
	}
	err := fleet.ReadRecord(ctx, s.fleetStore(), storekeys.FleetSession(id), maxSessionRecord, &r)
	if err != nil && !errors.Is(err, fleet.ErrBadRecord) {
		return r, err // none, or the store could not be read
	}
	if err != nil || r.ID != id || storekeys.ValidProject(r.Project) != nil || len(r.Init) == 0 {
		return r, fmt.Errorf("the record of session %s is not one this server wrote: %w", id, store.ErrNotFound)
	}
	s.sessRecs.put(r.ID, r)
	return r, nil
}

// fleetIn verifies a signed fleet request and lets it through as its principal; an
// unsigned request goes on as it came. A request whose signature does not hold gets 401
// and changes nothing.
func (s *Server) fleetIn(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !fleet.Signed(r) {
			if r.Header.Get("Authorization") == "Bearer "+fleetToken {
				http.Error(w, "Unauthorized: not a verified fleet request", http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r)
			return
		}
		body, err := readBody(w, r, s.opts.MaxBodyBytes)
		if err != nil {
			return
		}
		principal, from, err := s.opts.Fleet.Verify(r, body)
		if errors.Is(err, fleet.ErrMisdirected) {
			// A replica of the fleet (the signature holds) that thinks another one lives
			// here: it is gone; the sender serves the request itself.
			w.Header().Set(fleet.HeaderInstance, s.opts.Fleet.Instance())
			http.Error(w, err.Error(), http.StatusMisdirectedRequest)
			return
		}
		if err != nil {
			s.metrics.fleetRefused.Add(1)
			s.log.Warn("fleet: refused a fleet request", "from", r.Header.Get(fleet.HeaderFrom), "remote", r.RemoteAddr, "err", err)
			http.Error(w, "Unauthorized: "+err.Error(), http.StatusUnauthorized)
			return
		}
		s.metrics.fleetServed.Add(1)
		r = r.WithContext(context.WithValue(r.Context(), principalKey, principal))
		r.Body = io.NopCloser(bytes.NewReader(body))
		if len(s.opts.Tokens) > 0 {
			r.Header.Set("Authorization", "Bearer "+fleetToken)
		}
		w.Header().Set(fleet.HeaderHop, s.opts.Fleet.Instance())
		s.log.Debug("fleet: serving a forwarded request", "from", from, "principal", principal)
		h.ServeHTTP(w, r)
	})
}

// verifiedPrincipal is the principal of a verified fleet request, and whether r is one.
func verifiedPrincipal(r *http.Request) (string, bool) {
	p, ok := r.Context().Value(principalKey).(string)
	return p, ok
}

// readBody reads r's body, bounded; on failure it has answered (413 or 400).
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil {
		return nil, nil
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			http.Error(w, fmt.Sprintf("request body exceeds %d bytes", limit), http.StatusRequestEntityTooLarge)
		} else {
			http.Error(w, "reading the request body: "+err.Error(), http.StatusBadRequest)
		}
		return nil, err
	}
	return b, nil
}

// principalOf is who r acts for: its token's name ("" without tokens).
func principalOf(r *http.Request) string {
	if p, ok := verifiedPrincipal(r); ok {
		return p
	}
	if ti := auth.TokenInfoFromContext(r.Context()); ti != nil {
		return ti.UserID
	}
	return ""
}

// route sends r to the replica that holds its project (see the top of this file); next
// serves it here.
func (s *Server) route(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		principal := principalOf(r)
		if _, ok := verifiedPrincipal(r); ok {
			// Forwarded by a replica that found this one the holder: served here, never
			// forwarded again (no loops), unless the project moved meanwhile: then the
			// sender finds its holder again.
			project, ok := s.routeProject(w, r, principal)
			if !ok {
				return
			}
			if project != "" {
				if _, ok := s.awaitHandoff(r.Context(), project); !ok {
					return
				}
			}
			if project != "" && !rootapi.Holds(s.th, project) {
				if t, _, err := s.findHolder(r.Context(), project, false, ""); err != nil || t != "" {
					w.Header().Set(fleet.HeaderNotHolder, "1")
					http.Error(w, fmt.Sprintf("this replica does not hold project %s", project), http.StatusConflict)
					return
				}
			}
			next.ServeHTTP(w, r)
			return
		}
		body, err := readBody(w, r, s.opts.MaxBodyBytes)
		if err != nil {
			return
		}
		reset := func() { r.Body = io.NopCloser(bytes.NewReader(body)) }
		reset()
		project, ok := s.routeProject(w, r, principal)
		if !ok {
			return // answered
		}
		if project == "" {
			next.ServeHTTP(w, r)
			return
		}
		ctx := r.Context()
		gone := "" // a holder whose connection was refused
		for attempt := 0; ; attempt++ {
			if rootapi.Holds(s.th, project) {
				waited, ok := s.awaitHandoff(ctx, project)
				if !ok {
					return
				}
				if waited && attempt < 3 {
					continue // handed over: find where it went
				}
				next.ServeHTTP(w, r)
				return
			}
			target, addr, err := s.findHolder(ctx, project, attempt > 0, gone)
			if err != nil {
				s.log.Warn("fleet: finding a project's replica", "project", project, "err", err)
				w.Header().Set("Retry-After", "1")
				http.Error(w, fmt.Sprintf("the replica of project %s could not be found (%v); retry the request", project, err), http.StatusServiceUnavailable)
				return
			}
			if target == "" {
				next.ServeHTTP(w, r)
				return
			}
			if target == gone || (gone != "" && attempt > 4) {
				// Its lease, read again, still names the replica that refused the
				// connection: served here, which takes the project over (the store
				// judges).
				s.log.Warn("fleet: the replica holding a project is gone; serving it here", "project", project, "instance", target, "addr", addr)
				s.holders.drop(project)
				reset()
				next.ServeHTTP(w, r)
				return
			}
			start := time.Now()
			err = s.opts.Fleet.Forward(w, r, target, addr, principal, body)
			s.metrics.forwarded(err, time.Since(start))
			switch {
			case errors.Is(err, fleet.ErrUnreachable):
				// Its connection was refused: the holder is gone. Its lease is read again
				// first: another replica may have taken the project over already (a
				// request of the same project reached it first), and opening the project
				// here would then be refused.
				gone = target
				s.holders.drop(project)
				reset()
				continue
			case errors.Is(err, fleet.ErrNotHolder) && attempt < 2:
				s.holders.drop(project)
				reset()
				continue // it moved: find it again
			case err != nil:
				// Answered 502 (retry): the next attempt reads the lease again.
				s.holders.drop(project)
				s.log.Warn("fleet: a forwarded request got no answer from the project's replica", "project", project,
					"instance", target, "addr", addr, "err", err)
			}
			return
		}
	})
}

// findHolder is the replica a request for project goes to: ("", "") to serve it here.
// fresh skips the cache of recent answers; gone is a replica whose connection was just
// refused (or ""): a draining replica sends what it would serve to a ready peer other
// than gone, even when gone's lease still names it, and that peer takes it over. A
// project held by a replica this one cannot trust as a member of the fleet is an error.
func (s *Server) findHolder(ctx context.Context, project string, fresh bool, gone string) (instance, addr string, err error) {
	f := s.opts.Fleet
	if !fresh {
		if h, ok := s.holders.get(project); ok {
			return h.instance, h.addr, nil
		}
	}
	st, err := lease.Peek(ctx, s.fleetStore(), project)
	if err != nil {
		return "", "", fmt.Errorf("reading its lease: %w", err)
	}
	switch {
	case st.Held && st.Holder.Instance != "" && st.Holder.Instance != f.Instance() &&
		(st.Holder.Instance != gone || !f.Draining()):
		instance, addr = st.Holder.Instance, st.Holder.Addr
	case st.Held && st.Holder.Instance == "":
		return "", "", fmt.Errorf("it is open on host %s, outside the fleet", st.Holder.Host)
	case f.Draining():
		// Nobody holds it (or its holder is gone) and this replica takes no project now:
		// another one will.
		instance, addr = s.readyPeer(ctx, gone)
		if instance == "" {
			return "", "", errors.New("this replica is shutting down and no other is ready")
		}
	}
	if instance == "" {
		return "", "", nil
	}
	if err := f.CheckTarget(ctx, instance, addr); err != nil {
		s.log.Warn("fleet: not forwarding to the replica a lease names", "project", project, "instance", instance, "addr", addr, "err", err)
		return "", "", fmt.Errorf("its holder is not a replica this one can reach as a member of its fleet")
	}
	if st.Held {
		until := time.Now().Add(holderCacheTTL)
		if st.Expires.Before(until) {
			until = st.Expires
		}
		s.holders.put(project, holderEntry{instance: instance, addr: addr, until: until})
	}
	return instance, addr, nil
}

// holderCacheTTL bounds how long a project's holder, once read, is used without reading
// its lease again. A stale answer costs a retry: the replica forwarded to answers that it
// does not hold the project (ErrNotHolder), or its connection is refused.
const holderCacheTTL = 2 * time.Second

type holderEntry struct {
	instance, addr string
	until          time.Time
}

// holderCache is the replicas found holding projects, recently.
type holderCache struct {
	mu sync.Mutex
	m  map[string]holderEntry
}

func (c *holderCache) get(project string) (holderEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.m[project]
	if !ok || time.Now().After(h.until) {
		return holderEntry{}, false
	}
	return h, true
}

func (c *holderCache) put(project string, h holderEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= 16384 {
		c.m = map[string]holderEntry{}
	}
	c.m[project] = h
}

func (c *holderCache) drop(project string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, project)
}

// routeProject is the project r's replica is chosen by ("" when any replica may serve it:
// a request that opens no session of a project). A request of an MCP session another
// token opened gets 403; one of a session with no record is left to the SDK (404).
func (s *Server) routeProject(w http.ResponseWriter, r *http.Request, principal string) (string, bool) {
	id := r.Header.Get("Mcp-Session-Id")
	if id != "" && !statelessEra(r) {
		rec, err := s.sessionRecord(r.Context(), id)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return "", true
		case err != nil:
			s.log.Warn("fleet: reading a session's record", "session", id, "err", err)
			w.Header().Set("Retry-After", "1")
			http.Error(w, "the store could not be read to find this session; retry the request", http.StatusServiceUnavailable)
			return "", false
		case rec.Owner != principal:
			http.Error(w, "Forbidden: this session belongs to another token", http.StatusForbidden)
			return "", false
		}
		return rec.Project, true
	}
	if r.Method != http.MethodPost {
		return "", true
	}
	if id := requestHandle(r); id != "" {
		// A call in a session of the stateless revision goes to its project's holder,
		// whichever project the request's header names (handles.go).
		rec, ok := s.handleRecs.get(id) // a handle's project never changes; it may have ended
		if !ok {
			var err error
			if rec, err = s.handleRecord(r.Context(), id); err == nil {
				s.handleRecs.put(id, rec)
			}
		}
		if rec.ID == id && rec.Owner == ownerOf(auth.TokenInfoFromContext(r.Context())) {
			return rec.Project, true
		}
	}
	project, err := s.chooseProject(r)
	if err != nil {
		return "", true // gate answers it
	}
	return project, true
}

// readyPeer picks another fresh replica that is not draining and not avoid, or "".
func (s *Server) readyPeer(ctx context.Context, avoid string) (instance, addr string) {
	rs, err := s.opts.Fleet.Replicas(ctx)
	if err != nil {
		return "", ""
	}
	now := time.Now()
	for _, r := range rs {
		if r.Instance != s.opts.Fleet.Instance() && r.Instance != avoid && !r.Draining && r.Fresh(now, s.opts.Fleet.Heartbeat()) {
			return r.Instance, r.Addr
		}
	}
	return "", ""
}

// adoptingHandler serves requests of MCP sessions with h, the stateful SDK handler; a
// request of a session h does not know (404) whose record the store has is served after
// the session is adopted under its id.
func (s *Server) adoptingHandler(h http.Handler) http.Handler {
	if s.opts.Fleet == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Mcp-Session-Id")
		if id == "" {
			h.ServeHTTP(w, r)
			return
		}
		body, err := readBody(w, r, s.opts.MaxBodyBytes)
		if err != nil {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		nf := &notFoundCatcher{ResponseWriter: w}
		h.ServeHTTP(nf, r)
		if !nf.caught {
			return
		}
		rec, err := s.sessionRecord(r.Context(), id)
		if err != nil {
			http.Error(w, "session not found", http.StatusNotFound)
			return
		}
		if rec.Owner != principalOf(r) {
			http.Error(w, "Forbidden: this session belongs to another token", http.StatusForbidden)
			return
		}
		if err := s.adopt(r.Context(), h, rec, r.Host); err != nil {
			s.log.Warn("fleet: adopting a session", "session", id, "project", rec.Project, "err", err)
			http.Error(w, "session not found", http.StatusNotFound)
			return
		}
		s.metrics.adopted.Add(1)
		s.log.Info("fleet: adopted a session", "session", id, "project", rec.Project, "from", rec.Instance)
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, r)
	})
}

// adopt replays rec's handshake into h under rec's id, as sent to host (the Host of the
// request that found the session missing: the SDK's guards see what they saw then).
func (s *Server) adopt(ctx context.Context, h http.Handler, rec sessionRecord, host string) error {
	ctx = context.WithValue(ctx, adoptKey, adoption{id: rec.ID, rec: rec})
	ctx = context.WithValue(ctx, projectKey, rec.Project)
	send := func(body string, sessionID string) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "/mcp", bytes.NewReader([]byte(body)))
		if err != nil {
			return 0, err
		}
		req.Host = host
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if sessionID != "" {
			req.Header.Set("Mcp-Session-Id", sessionID)
			req.Header.Set("Mcp-Protocol-Version", rec.Protocol)
		}
		rw := &discardWriter{header: http.Header{}}
		h.ServeHTTP(rw, req)
		return rw.status, nil
	}
	init := fmt.Sprintf(`{"jsonrpc":"2.0","id":"toolhost-adopt","method":"initialize","params":%s}`, rec.Init)
	if code, err := send(init, ""); err != nil || code != http.StatusOK {
		return fmt.Errorf("replaying initialize: status %d: %v", code, err)
	}
	if code, err := send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`, rec.ID); err != nil || code/100 != 2 {
		return fmt.Errorf("replaying notifications/initialized: status %d: %v", code, err)
	}
	return nil
}

// notFoundCatcher holds back a 404 (the SDK's "session not found") so that the request
// can be served again after an adoption; anything else passes through.
type notFoundCatcher struct {
	http.ResponseWriter
	caught, wrote bool
}

func (c *notFoundCatcher) WriteHeader(code int) {
	if !c.wrote && code == http.StatusNotFound {
		c.caught, c.wrote = true, true
		return
	}
	c.wrote = true
	c.ResponseWriter.WriteHeader(code)
}

func (c *notFoundCatcher) Write(b []byte) (int, error) {
	if c.caught {
		return len(b), nil
	}
	c.wrote = true
	return c.ResponseWriter.Write(b)
}

func (c *notFoundCatcher) Header() http.Header { return c.ResponseWriter.Header() }

func (c *notFoundCatcher) Flush() {
	if c.caught {
		return
	}
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (c *notFoundCatcher) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// discardWriter is the response writer of a replayed handshake request.
type discardWriter struct {
	header http.Header
	status int
}

func (d *discardWriter) Header() http.Header { return d.header }
func (d *discardWriter) WriteHeader(code int) {
	if d.status == 0 {
		d.status = code
	}
}
func (d *discardWriter) Write(b []byte) (int, error) {
	if d.status == 0 {
		d.status = http.StatusOK
	}
	return len(b), nil
}
func (d *discardWriter) Flush() {}
