// Package mcpserve serves a toolhost.Toolhost's tools over the Model Context Protocol,
// with the official Go SDK: on stdio for one client (toolhost mcp), and over streamable
// HTTP for many (toolhost serve). One MCP session is one toolhost.Session: a sandbox of
// one project kept alive, rotated and snapshotted for as long as the client stays.
//
// What a client sees:
//   - tools/list: every plugin tool with its own JSON Schema, and commit (below).
//   - tools/call: the tool dispatched in the session's sandbox. The sandbox is opened on
//     the session's first call, woken from the project's newest snapshot. A tool's failure
//     (is_error) is an MCP error result, never a protocol error; images (take_screenshot's
//     WebP) are image content beside the text. Cancelling a call cancels it in the host,
//     which kills the command's process group. A call made with a progress token gets a
//     progress notification every Options.ProgressInterval while it runs.
//   - commit {"label": "..."}: saves a snapshot of the workspace now (a phase commit),
//     answering with its key and size.
//   - checkpoints: the project's snapshots with their times and labels (read-only);
//     rewind {"checkpoint": "..."}: the workspace back at one, the present saved first so
//     the rewind can be undone (marked destructive: a client asks its user first).
//
// When a session ends (the client closes it or goes away, it stays idle past
// Options.IdleTimeout over HTTP, or the server shuts down) its workspace is committed and
// its sandbox closed: nothing is lost.
//
// Over HTTP a session's project is the Toolhost-Project header, else the project query
// parameter of the request that opens the session, else the token's first project, else
// Options.Project; a token that names projects opens no other (403).
//
// The host package never links the SDK: only this package and the CLI do.
package mcpserve

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/fleet"
	"github.com/toolhost/toolhost/internal/lease"
	"github.com/toolhost/toolhost/internal/rootapi"
	"github.com/toolhost/toolhost/internal/sessionapi"
)

// probeTimeout bounds a probe of a lease holder's address.
const probeTimeout = time.Second

// shutdownBound bounds the commit and close of a stdio session after its client went.
const shutdownBound = 5 * time.Minute

// CommitTool is the name of the tool that commits a session's workspace.
const CommitTool = "commit"

// CheckpointsTool lists the project's snapshots; RewindTool moves the workspace back to
// one (saving the present first, so a rewind can be undone).
const (
	CheckpointsTool = "checkpoints"
	RewindTool      = "rewind"
)

// Options configure a Server. The zero value serves the Toolhost's project with the
// defaults below.
type Options struct {
	// Project is the project a session opens when nothing else names one; empty: the
	// Toolhost's configured project.
	Project string
	// Tokens are the bearer tokens the HTTP handler accepts; none: no authentication
	// (which only a loopback listener may go without; see CheckListen).
	Tokens []Token
	// MaxSessions bounds the MCP sessions connected over HTTP at once, and the sessions
	// with an open sandbox (default 64).
	MaxSessions int
	// IdleTimeout ends an HTTP session that made no request for this long: its workspace
	// is committed and its sandbox closed (default 15m).
	IdleTimeout time.Duration
	// MaxBodyBytes bounds an HTTP request's body (default 16 MiB); larger gets 413.
	MaxBodyBytes int64
	// ProgressInterval is how often a call made with a progress token reports progress
	// (default 2s).
	ProgressInterval time.Duration
	// Version is the server's version in the MCP handshake.
	Version string
	// Logger receives the server's records (sessions opened, committed, closed); never
	// stdout. Nil: slog.Default().
	Logger *slog.Logger
	// SessionOptions, when set, gives the options each session opens with for project
	// (a wrapper provider, a logger); its Project is set from project.
	SessionOptions func(project string) toolhost.SessionOptions
	// Workspaces maps projects to host directories their sessions work on directly (owners
	// kept) instead of their private workspaces: toolhost mcp --workspace, serve.workspaces.
	Workspaces map[string]string
	// ConfigDigest identifies the configuration, for the session API: a client with
	// another refuses to start sessions here (see sessionapi.ConfigDigestHeader).
	ConfigDigest string
	// Fleet, when set, makes the server a replica of a fleet (fleet.go): requests for a
	// project another replica holds are forwarded there, and sessions of other replicas
	// are adopted.
	Fleet *fleet.Fleet
	// OrphanAfter is how long, in a fleet, the sandboxes of a project nobody holds wait
	// for a replica to reconnect before any replica kills them (DefaultOrphanAfter when
	// zero): serve.fleet.orphan_after.
	OrphanAfter time.Duration
	// Drain is what Shutdown does with open sessions: toolhost.DrainClose (commit, close
	// the sandbox; also the zero value) or toolhost.DrainHandoff (in a fleet: hand each
	// over, see handoff.go).
	Drain string
	// HeldIdleTimeout ends a held session (the session API's, the stateless revision's)
	// after this long without a call (default IdleTimeout); a session may ask for its own.
	HeldIdleTimeout time.Duration
	// OneShot, when set, runs the session API's one-shot calls (POST /v1/calls, a plain
	// `toolhost call` served by the session daemon) once the server has checked the
	// request's configuration, project and workspace. Nil: the route answers 404.
	OneShot func(ctx context.Context, r sessionapi.OneShotRequest) (abi.Result, error)
	// OneShotReady, when set, is closed once OneShot may be called (the daemon's plugins
	// compiled); until then a one-shot call is answered 503, having run nothing.
	OneShotReady <-chan struct{}
}

// Server serves one Toolhost's tools to MCP clients. It is safe for concurrent use.
type Server struct {
	th      *toolhost.Toolhost
	opts    Options
	log     *slog.Logger
	tools   []*mcp.Tool // the plugins' tools and commit, made once
	metrics *Metrics
	// pluginCommit: a plugin has a tool named commit, which then shadows the server's.
	pluginCommit bool

	mu        sync.Mutex
	pending   int                   // HTTP requests opening a session, not yet watched or refused
	connected map[*binding]struct{} // MCP sessions being watched (see binding.watch)
	open      map[*binding]struct{} // sessions with a sandbox (or opening one)
	closing   bool
	watchers  sync.WaitGroup // the goroutines that finish a session when its client goes

	held heldSessions // the sessions the shell holds (held.go)

	sessRecs   recordCache[sessionRecord] // the fleet's MCP session records read (fleet.go)
	handleRecs recordCache[handleRecord]  // the handles' records read, for routing (handles.go)
	holders    holderCache                // the fleet's projects' holders, recently read (fleet.go)

	ready struct { // readyz's last check of the store (storeAnswers)
		mu  sync.Mutex
		at  time.Time
		err error
	}

	statelessOnce sync.Once
	stateless     *mcp.Server // the server of the stateless revision's requests (stateless.go)
}

// New makes a Server of th's tools. Tools whose schema is not a JSON object schema are
// left out (and logged): MCP requires one.
func New(th *toolhost.Toolhost, opts Options) *Server {
	if opts.Project == "" {
		opts.Project = th.Config().Project
	}
	if opts.MaxSessions <= 0 {
		opts.MaxSessions = 64
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = 15 * time.Minute
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 16 << 20
	}
	if opts.ProgressInterval <= 0 {
		opts.ProgressInterval = 2 * time.Second
	}
	if opts.Version == "" {
		opts.Version = toolhost.ReadBuildInfo().Version
		if opts.Version == "" {
			opts.Version = "(devel)"
		}
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if opts.HeldIdleTimeout <= 0 {
		opts.HeldIdleTimeout = opts.IdleTimeout
	}
	s := &Server{th: th, opts: opts, log: log, open: map[*binding]struct{}{}, connected: map[*binding]struct{}{}}
	if f := opts.Fleet; f != nil {
		// Leases this replica takes name it and its address; a live lease whose holder is
		// proven gone (refused, or another replica at its address) is taken over at once.
		rootapi.SetFleet(th, rootapi.FleetMember{ID: f.ID(), Instance: f.Instance(), Addr: f.Advertise(),
			Probe: func(ctx context.Context, h lease.Holder) lease.Liveness {
				if h.Instance == "" || h.Instance == f.Instance() {
					return lease.Unknown
				}
				return f.Probe(ctx, h.Addr, h.Instance, probeTimeout)
			}})
	}
	s.held.init()
	grants := toolGrants(th)
	no, yes := false, true
	for _, t := range th.Tools() {
		if t.Name == CommitTool {
			s.pluginCommit = true
			log.Warn("a plugin's tool is named commit: MCP clients get the plugin's, and cannot commit", "tool", t.Name)
		}
		schema := json.RawMessage(t.InputSchema)
		var head struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(schema, &head); err != nil || head.Type != "object" {
			log.Warn("tool left out of MCP: its input schema is not an object schema", "tool", t.Name)
			continue
		}
		mt := &mcp.Tool{Name: t.Name, Title: title(t.Name), Description: t.Description,
			InputSchema: schema, Annotations: annotations(t.Name, grants[t.Name])}
		if len(t.OutputSchema) > 0 { // the host compiled it at load: an object schema
			mt.OutputSchema = json.RawMessage(t.OutputSchema)
		}
		s.tools = append(s.tools, mt)
	}
	if !s.hasTool(CommitTool) {
		s.tools = append(s.tools, &mcp.Tool{
			Name: CommitTool,
			Description: "Save a snapshot of the workspace now, as a checkpoint of finished work " +
				"(it is also saved when the session ends). Give a short label saying what was done.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"label":{"type":"string",` +
				`"description":"what the snapshot holds, e.g. \"login page done\""}},"additionalProperties":false}`),
			// A snapshot is added, nothing is overwritten: not destructive, not read-only.
			Annotations: &mcp.ToolAnnotations{Title: "Commit the workspace", DestructiveHint: &no, OpenWorldHint: &no},
		})
	}
	if !s.hasTool(CheckpointsTool) {
		s.tools = append(s.tools, &mcp.Tool{
			Name: CheckpointsTool,
			Description: "List the workspace's checkpoints (saved snapshots), newest first, with their times and labels. " +
				"Any of them can be gone back to with rewind.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`),
			Annotations: &mcp.ToolAnnotations{Title: "List checkpoints", ReadOnlyHint: true, DestructiveHint: &no, OpenWorldHint: &no},
		})
	}
	if !s.hasTool(RewindTool) {
		s.tools = append(s.tools, &mcp.Tool{
			Name: RewindTool,
			Description: "Put the whole workspace back as it was at a checkpoint (files changed by any tool or command " +
				"included). The present is saved first as a checkpoint, so the rewind can be undone by rewinding to it; " +
				"background processes are restarted.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"checkpoint":{"type":"string",` +
				`"description":"the checkpoint's key, as checkpoints lists it"}},"required":["checkpoint"],"additionalProperties":false}`),
			Annotations: &mcp.ToolAnnotations{Title: "Rewind the workspace", DestructiveHint: &yes, OpenWorldHint: &no},
		})
	}
	// A tool's title (what clients show since 2025-06-18) is its annotations' (what older
	// clients read).
	names := make([]string, 0, len(s.tools))
	for _, t := range s.tools {
		if t.Title == "" && t.Annotations != nil {
			t.Title = t.Annotations.Title
		}
		names = append(names, t.Name)
	}
	s.metrics = newMetrics(names)
	s.metrics.egress = th.EgressCounts
	return s
}

func (s *Server) hasTool(name string) bool {
	for _, t := range s.tools {
		if t.Name == name {
			return true
		}
	}
	return false
}

// Metrics are the server's counters (see WriteMetrics).
func (s *Server) Metrics() *Metrics { return s.metrics }

// ConnectedSessions is how many MCP sessions are connected (with a sandbox or not yet).
func (s *Server) ConnectedSessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.connected)
}

// OpenSessions is how many sessions have a sandbox open.
func (s *Server) OpenSessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.open)
}

// newMCPServer is the MCP server of one session of project: its handlers share b.
func (s *Server) newMCPServer(project, owner string) *mcp.Server {
	return s.newMCPServerID(project, owner, "")
}

// newMCPServerID is newMCPServer for a session whose id is given (an adoption, fleet.go);
// "" lets the SDK make one.
func (s *Server) newMCPServerID(project, owner, id string) *mcp.Server {
	b := newBinding(s, project, owner, s.opts.Workspaces[project])
	var getID func() string
	if id != "" {
		getID = func() string { return id }
	}
	ms := mcp.NewServer(&mcp.Implementation{Name: "toolhost", Version: s.opts.Version},
		&mcp.ServerOptions{
			GetSessionID: getID,
			Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}, Resources: &mcp.ResourceCapabilities{}},
			// Watched from the handshake's end, so a session that never calls a tool is
			// counted against MaxSessions and forgotten when it ends.
			InitializedHandler: func(_ context.Context, req *mcp.InitializedRequest) { b.watch(req.Session) },
		})
	// And from its very first request (initialize, or a call of a client without a
	// handshake): a client that never sends notifications/initialized holds a session
	// all the same, and must be counted against MaxSessions.
	ms.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			ss, _ := req.GetSession().(*mcp.ServerSession)
			if ss != nil {
				b.watch(ss)
			}
			if method == "initialize" && s.opts.Fleet != nil {
				// In a fleet, any replica may get the session's next request: it is
				// recorded before the client learns its id.
				if err := s.recordSession(ctx, ss, project, owner, req.GetParams()); err != nil {
					s.log.Error("fleet: recording an MCP session", "project", project, "err", err)
					return nil, fmt.Errorf("the session could not be recorded for the other replicas; retry: %w", err)
				}
			}
			return next(ctx, method, req)
		}
	})
	ms.AddReceivingMiddleware(s.traceMCP(project)) // outermost: its span holds the rest
	s.addTools(ms, b.handler)
	ms.AddResourceTemplate(storedTemplate, b.readStored)
	return ms
}

// addTools adds the tools of every session's server to ms, each with its handler.
func (s *Server) addTools(ms *mcp.Server, handler func(name string) mcp.ToolHandler) {
	for _, t := range s.tools {
		ms.AddTool(t, handler(t.Name))
	}
}

// ListTools is what a session's server answers tools/list with (over stdio, whatever the
// client's revision): a server with the same tools answers it here, over a connection in
// memory. `toolhost tools --format mcp` prints it. Nothing is called: no session opens.
func (s *Server) ListTools(ctx context.Context) (*mcp.ListToolsResult, error) {
	ms := mcp.NewServer(&mcp.Implementation{Name: "toolhost", Version: s.opts.Version}, nil)
	s.addTools(ms, func(name string) mcp.ToolHandler {
		return func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return nil, fmt.Errorf("%s: only listed here", name)
		}
	})
	st, ct := mcp.NewInMemoryTransports()
	ss, err := ms.Connect(ctx, st, nil)
	if err != nil {
		return nil, fmt.Errorf("list the tools: %w", err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "toolhost", Version: s.opts.Version}, nil).Connect(ctx, ct, nil)
	if err != nil {
		return nil, fmt.Errorf("list the tools: %w", err)
	}
	defer cs.Close()
	var all []*mcp.Tool
	params := &mcp.ListToolsParams{}
	for {
		res, err := cs.ListTools(ctx, params)
		if err != nil {
			return nil, fmt.Errorf("list the tools: %w", err)
		}
		all = append(all, res.Tools...)
		if res.NextCursor == "" {
			res.Tools = all
			return res, nil
		}
		params.Cursor = res.NextCursor
	}
}

// Serve runs one MCP session over t (stdio: StdioTransport) for opts.Project,
// until the client goes or ctx ends; the session's workspace is then committed and its
// sandbox closed. At the end of its input every request read is answered first, so a
// client that writes its requests and closes its end still gets every answer.
func (s *Server) Serve(ctx context.Context, t mcp.Transport) error {
	ms := s.newMCPServer(s.opts.Project, "")
	err := ms.Run(ctx, drainAtEOF(cancelTransport{t, s.metrics.cancelDropped}, s.log))
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownBound)
	defer cancel()
	serr := s.Shutdown(sctx)
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		err = nil // asked to stop (a signal): not a failure of the session
	}
	return errors.Join(err, serr)
}

// Connect starts one MCP session over t for project ("" for Options.Project) and
// returns at once; the session ends when the client closes it (see Serve).
func (s *Server) Connect(ctx context.Context, t mcp.Transport, project string) (*mcp.ServerSession, error) {
	if project == "" {
		project = s.opts.Project
	}
	return s.newMCPServer(project, "").Connect(ctx, cancelTransport{t, s.metrics.cancelDropped}, nil)
}

// Shutdown commits every open session's workspace and closes its sandbox and its MCP
// session, then waits (at most until ctx ends) for the sessions' watchers. New sessions
// are refused from its start.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	var bs []*binding
	for b := range s.open {
		bs = append(bs, b)
	}
	for b := range s.connected {
		if _, ok := s.open[b]; !ok {
			bs = append(bs, b)
		}
	}
	s.mu.Unlock()
	errs := make([]error, len(bs))
	var wg sync.WaitGroup
	for i, b := range bs {
		wg.Go(func() { errs[i] = b.finish(ctx, "the server is shutting down") })
	}
	wg.Wait()
	done := make(chan struct{})
	go func() { // owned by Shutdown: it ends when the watchers have, or is abandoned with ctx
		s.watchers.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("waiting for the sessions to end: %w", ctx.Err()))
	}
	return errors.Join(errs...)
}

// binding is one MCP session's toolhost session, opened on its first call.
type binding struct {
	srv       *Server
	project   string
	owner     string                 // the token's name over HTTP, for the log
	workspace string                 // a host directory as the workspace; "": the project's private one
	egress    *toolhost.EgressPolicy // the token's narrowing of the egress policy, or nil
	gone      chan struct{}          // closed when the session has ended (finish)

	mu     sync.Mutex // held while opening
	moving bool       // being handed over (drain): calls are refused, to be made again
	// handing is closed when the handoff that set moving has ended (handingOver).
	handing chan struct{}
	// handedOver: its session went to another replica (handoff); its MCP session is
	// closed by finish, at Shutdown.
	handedOver bool
	active     sync.WaitGroup // calls running (begin), which a handover waits for
	sess       *toolhost.Session
	ss         *mcp.ServerSession
	watched    bool
	ended      bool
	endErr     error
	endInfo    toolhost.SnapshotInfo // the commit at the end, when it saved
	lostLease  bool                  // at its end, its session had lost the project's lease
}

func newBinding(s *Server, project, owner, workspace string) *binding {
	return &binding{srv: s, project: project, owner: owner, workspace: workspace, egress: s.tokenEgress(owner), gone: make(chan struct{})}
}

// tokenEgress is the egress narrowing of the token named owner, or nil.
func (s *Server) tokenEgress(owner string) *toolhost.EgressPolicy {
	for i := range s.opts.Tokens {
		if s.opts.Tokens[i].Name == owner {
			return s.opts.Tokens[i].Egress
		}
	}
	return nil
}

// watch starts, once, the goroutine that finishes b when its MCP session ss ends (the
// client closed it or went away, it idled out, Shutdown closed it), and counts b as
// connected until then. Called at the handshake's end and again on every call (a client
// of the stateless protocol era has no handshake).
func (b *binding) watch(ss *mcp.ServerSession) {
	if ss == nil {
		return
	}
	b.mu.Lock()
	if b.watched || b.ended {
		b.mu.Unlock()
		return
	}
	b.watched, b.ss = true, ss
	b.mu.Unlock()
	s := b.srv
	s.mu.Lock()
	if s.closing { // Shutdown has taken its list: this session would be missed
		s.mu.Unlock()
		ss.Close()
		return
	}
	s.connected[b] = struct{}{}
	s.watchers.Add(1) // under s.mu, so never after Shutdown's Wait began
	s.mu.Unlock()
	s.metrics.clientsConnected.Add(1)
	go func() { // owned by s.watchers: ends when the MCP session does (Shutdown closes it)
		defer s.watchers.Done()
		ss.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), shutdownBound)
		defer cancel()
		b.finish(ctx, "the client's session ended")
		s.mu.Lock()
		delete(s.connected, b)
		s.mu.Unlock()
		s.metrics.clientsConnected.Add(-1)
	}()
}

// session returns b's session, opening it (and its sandbox) on the first call.
func (b *binding) session(ctx context.Context) (*toolhost.Session, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return nil, errors.New("this session has ended (its work was committed); reconnect to open a new one")
	}
	s := b.srv
	if b.sess != nil {
		if s.opts.Fleet == nil || rootapi.LeaseLost(b.sess) == nil {
			return b.sess, nil
		}
		b.retake(ctx)
	}
	s.mu.Lock()
	switch {
	case s.closing:
		s.mu.Unlock()
		return nil, errors.New("the server is shutting down; reconnect later")
	case len(s.open) >= s.opts.MaxSessions:
		s.mu.Unlock()
		return nil, fmt.Errorf("the server already has %d sessions open, its limit; close one or try again later", s.opts.MaxSessions)
	}
	s.open[b] = struct{}{} // the slot is taken while the sandbox starts
	s.mu.Unlock()

	var so toolhost.SessionOptions
	if s.opts.SessionOptions != nil {
		so = s.opts.SessionOptions(b.project)
	}
	so.Project = b.project
	if b.workspace != "" {
		so.Workspace = b.workspace
	}
	if b.egress != nil {
		so.Egress = b.egress
	}
	start := time.Now()
	sess, err := s.th.Open(ctx, so)
	if err != nil {
		s.mu.Lock()
		delete(s.open, b)
		s.mu.Unlock()
		s.log.Error("mcp: opening a session", "project", b.project, "err", err)
		if held, ok := errors.AsType[*lease.HeldError](err); ok {
			return nil, held // "project P is open on host H (pid, since T); close it there or wait until E"
		}
		return nil, fmt.Errorf("the sandbox of project %s could not be started (the server's log says why); try again", b.project)
	}
	b.sess = sess
	s.metrics.sessionOpened()
	woke, ok := sess.Woke()
	s.log.Info("mcp: session opened", "project", b.project, "owner", b.owner, "took", time.Since(start).Round(time.Millisecond),
		"woke_from", woke.Key, "woke", ok)
	return sess, nil
}

// retake ends b's session, which lost its project's lease (its replica stalled past the
// lease's ttl, or the store did not answer its renewals), so that a new one opens in its
// place: the routing sent the call here because nobody else holds the project now. The
// old session is handed over (its E2B sandbox left running, its record left to take
// over) and the new one takes the lease anew and reconnects to that sandbox, files and
// background processes included. Called with b.mu held.
func (b *binding) retake(ctx context.Context) {
	s := b.srv
	old := b.sess
	b.sess = nil
	kept, err := rootapi.Handoff(context.WithoutCancel(ctx), old)
	s.mu.Lock()
	delete(s.open, b)
	s.mu.Unlock()
	s.metrics.sessionClosed()
	s.log.Warn("fleet: a session lost its project's lease; opening the project again here", "project", b.project,
		"kept_sandbox", kept, "err", err)
}

// finish commits b's workspace and closes its sandbox and MCP session, once.
func (b *binding) finish(ctx context.Context, why string) error {
	// The MCP session is closed once b.mu is released (this defer runs last): its close
	// waits for the handlers under way, which may be waiting for b.mu (watch).
	var ss *mcp.ServerSession
	defer func() {
		if ss != nil {
			ss.Close()
		}
	}()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		if b.handedOver {
			ss = b.ss // its session went to another replica: its MCP session ends here now
		}
		return b.endErr
	}
	b.ended = true
	defer close(b.gone)
	if b.sess == nil {
		ss = b.ss
		return nil
	}
	s := b.srv
	b.lostLease = s.opts.Fleet != nil && rootapi.LeaseLost(b.sess) != nil
	var errs []error
	info, err := b.sess.Commit(ctx, "mcp session end")
	if err != nil {
		errs = append(errs, fmt.Errorf("committing project %s: %w", b.project, err))
		s.log.Error("mcp: committing a session's workspace at its end", "project", b.project, "why", why, "err", err)
	} else {
		b.endInfo = info
		s.log.Info("mcp: session committed", "project", b.project, "why", why, "snapshot", info.Key, "bytes", info.Size)
	}
	if err := b.sess.Close(ctx); err != nil {
		errs = append(errs, fmt.Errorf("closing the sandbox of project %s: %w", b.project, err))
	}
	ss = b.let()
	b.endErr = errors.Join(errs...)
	return b.endErr
}

// let gives b's slot up, once its sandbox is closed or handed over, and returns its MCP
// session for the caller to close once it has released b.mu (the close waits for the
// handlers under way, which may wait for b.mu). Called with b.mu held.
func (b *binding) let() *mcp.ServerSession {
	s := b.srv
	s.mu.Lock()
	delete(s.open, b)
	s.mu.Unlock()
	s.metrics.sessionClosed()
	return b.ss
}

// handler is the tools/call handler of tool in b's session.
func (b *binding) handler(tool string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		start := time.Now()
		res := b.call(ctx, tool, req)
		b.srv.metrics.observe(tool, res.IsError, time.Since(start))
		return res, nil
	}
}

func (b *binding) call(ctx context.Context, tool string, req *mcp.CallToolRequest) *mcp.CallToolResult {
	b.watch(req.Session)
	sess, done, err := b.begin(ctx)
	if err != nil {
		return errorResult(err.Error())
	}
	defer done()
	stop := b.srv.reportProgress(ctx, req, tool)
	defer stop()
	input := req.Params.Arguments
	if len(input) == 0 || string(input) == "null" {
		input = json.RawMessage(`{}`)
	}
	if tool == CommitTool && !b.srv.pluginCommit {
		return b.commit(ctx, sess, input)
	}
	if (tool == CheckpointsTool || tool == RewindTool) && !b.srv.pluginTool(tool) {
		return b.checkpoint(ctx, sess, tool, input)
	}
	res, err := sess.Dispatch(ctx, tool, input)
	if err != nil {
		b.srv.log.Warn("mcp: a tool call failed in the host", "tool", tool, "project", b.project, "err", err)
		if ctx.Err() != nil {
			return errorResult(fmt.Sprintf("%s was cancelled", tool))
		}
	}
	return toMCP(res)
}

func (b *binding) commit(ctx context.Context, sess *toolhost.Session, input json.RawMessage) *mcp.CallToolResult {
	msg, isErr := b.commitText(ctx, sess, input)
	if isErr {
		return errorResult(msg)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: msg}}}
}

// commitText runs the commit tool: what it answers, and whether that is an error.
func (b *binding) commitText(ctx context.Context, sess *toolhost.Session, input json.RawMessage) (string, bool) {
	var in struct {
		Label string `json:"label"`
	}
	if err := json.Unmarshal(input, &in); err != nil {
		return `commit takes {"label": "what the snapshot holds"}`, true
	}
	info, err := sess.Commit(ctx, in.Label)
	if err != nil {
		b.srv.log.Error("mcp: commit", "project", b.project, "err", err)
		return "the workspace could not be saved (the server's log says why); try again", true
	}
	if info.Unchanged {
		return fmt.Sprintf("nothing changed since snapshot %s of project %s: it holds the workspace", info.Key, b.project), false
	}
	return fmt.Sprintf("saved snapshot %s of project %s (%d bytes)", info.Key, b.project, info.Size), false
}

// reportProgress sends a progress notification every ProgressInterval while a call made
// with a progress token runs; the returned func stops it (and waits for it).
func (s *Server) reportProgress(ctx context.Context, req *mcp.CallToolRequest, tool string) (stop func()) {
	tok := req.Params.GetProgressToken()
	if tok == nil || req.Session == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // owned by the call: stop ends it
		t := time.NewTicker(s.opts.ProgressInterval)
		defer t.Stop()
		start := time.Now()
		for n := 1; ; n++ {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				el := time.Since(start).Round(time.Second)
				err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
					ProgressToken: tok, Progress: float64(n),
					Message: fmt.Sprintf("%s still running after %s", tool, el)})
				if err != nil {
					s.log.Debug("mcp: progress notification", "tool", tool, "err", err)
				}
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// toMCP converts a tool_result's content: text stays text, a base64 image becomes image
// content (the SDK encodes the bytes on the wire), the structured result (a tool with an
// output schema) is structuredContent beside them.
func toMCP(r abi.Result) *mcp.CallToolResult {
	out := &mcp.CallToolResult{IsError: r.IsError, Content: make([]mcp.Content, 0, len(r.Content))}
	for _, c := range r.Content {
		switch {
		case c.Type == abi.ContentImage && c.Source != nil:
			data := c.Source.Raw
			if data == nil {
				d, err := base64.StdEncoding.DecodeString(c.Source.Data)
				if err != nil {
					out.Content = append(out.Content, &mcp.TextContent{Text: "(an image that could not be decoded was left out)"})
					continue
				}
				data = d
			}
			out.Content = append(out.Content, &mcp.ImageContent{Data: data, MIMEType: c.Source.MediaType})
		default:
			out.Content = append(out.Content, &mcp.TextContent{Text: c.Text})
		}
	}
	for _, st := range r.Stored {
		size := st.Size
		out.Content = append(out.Content, &mcp.ResourceLink{URI: st.URI, Name: st.Name, MIMEType: st.MIMEType, Size: &size})
	}
	if r.IsError && len(out.Content) == 0 {
		out.Content = append(out.Content, &mcp.TextContent{Text: "the tool failed without saying why"})
	}
	if len(r.Structured) > 0 && !r.IsError {
		// Checked by the host against the tool's output schema before it got here.
		out.StructuredContent = json.RawMessage(r.Structured)
	}
	return out
}

func errorResult(msg string) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: msg}}}
}

// pluginTool reports whether a plugin provides tool (which then shadows the server's).
func (s *Server) pluginTool(name string) bool {
	for _, t := range s.th.Tools() {
		if t.Name == name {
			return true
		}
	}
	return false
}

func (b *binding) checkpoint(ctx context.Context, sess *toolhost.Session, tool string, input json.RawMessage) *mcp.CallToolResult {
	msg, isErr := b.checkpointText(ctx, sess, tool, input)
	return &mcp.CallToolResult{IsError: isErr, Content: []mcp.Content{&mcp.TextContent{Text: msg}}}
}

func (b *binding) checkpointText(ctx context.Context, sess *toolhost.Session, tool string, input json.RawMessage) (string, bool) {
	if tool == CheckpointsTool {
		cps, err := sess.Checkpoints(ctx)
		if err != nil {
			b.srv.log.Error("mcp: checkpoints", "project", b.project, "err", err)
			return "the checkpoints could not be listed (the server's log says why); try again", true
		}
		if len(cps) == 0 {
			return "no checkpoints yet: commit saves one", false
		}
		var sb strings.Builder
		for _, c := range cps {
			label := c.Label
			if label == "" {
				label = "(no label)"
			}
			fmt.Fprintf(&sb, "%s  %s  %s\n", path.Base(c.Key), c.Time.UTC().Format("2006-01-02 15:04:05 UTC"), label)
		}
		return sb.String(), false
	}
	var in struct {
		Checkpoint string `json:"checkpoint"`
	}
	if err := json.Unmarshal(input, &in); err != nil || in.Checkpoint == "" {
		return `rewind takes {"checkpoint": "a key from checkpoints"}`, true
	}
	res, err := sess.Rewind(ctx, in.Checkpoint)
	if err != nil {
		b.srv.log.Error("mcp: rewind", "project", b.project, "checkpoint", in.Checkpoint, "err", err)
		if errors.Is(err, toolhost.ErrNoSuchSnapshot) {
			return fmt.Sprintf("there is no checkpoint %q; call checkpoints to list them", in.Checkpoint), true
		}
		return "the workspace could not be rewound (the server's log says why); it is as it was", true
	}
	msg := fmt.Sprintf("the workspace is back at checkpoint %s. The state before the rewind is checkpoint %s: rewind to it to undo.",
		path.Base(res.Checkpoint), path.Base(res.Undo))
	return msg, false
}
