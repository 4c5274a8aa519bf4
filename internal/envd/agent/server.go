//go:build linux

package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"mime"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
)

// ServerConfig configures the agent.
type Config struct {
	// Workspace is the real directory standing for sandbox.WorkspaceRoot. Inside a
	// sandbox it is WorkspaceRoot itself (the default); tests point it elsewhere.
	Workspace string
	// LogDir receives the logs of background processes (default /tmp/toolhost).
	LogDir string
	// Env is the base environment of every process (default os.Environ()).
	Env []string
	// DrainTimeout bounds how long output is still read after the main process exited
	// (a leftover `cmd &` may hold the pipes open); default 250ms.
	DrainTimeout time.Duration
	// ProcDir is the proc filesystem the port extensions read (default /proc). Inside a
	// sandbox it shows the sandbox's own pid namespace and network namespace.
	ProcDir string
	// Init says the agent is pid 1 of the sandbox's pid namespace: Serve then reaps every
	// process that ends in the sandbox, orphans included (see reaper).
	Init bool
	// Egress, when set, is the sandbox's way out (sandbox.NetworkEgress): see egress.go.
	Egress *EgressConfig
	// AccessToken, when set, is required of every request but the health check, in the
	// header envd.HeaderAccessToken (E2B's envd takes its access token the same way): an
	// agent served on a network (a pod's address) answers only the host that gave it the
	// token. Empty: whoever reaches the agent is trusted (a unix socket only the host holds).
	AccessToken string
	// PoolToken, when set (and AccessToken is not), starts the agent unclaimed, as a spare of
	// a warm pool whose pods all share this token: it then answers only the health check and
	// one claim (envd.PathClaim) carrying PoolToken and naming PodName, which gives it the
	// sandbox's own access token and environment; from then on it is an agent with that
	// token, and PoolToken is refused. So the shared token can never run anything, and a
	// claimed sandbox answers only its own token.
	PoolToken string
	PodName   string
	// TrustDir is where the trust a host gives is written (envd.PathTrust; default
	// envd.TrustDir).
	TrustDir string
	Logger   *slog.Logger
}

// DefaultLogDir is where background processes log inside a sandbox.
const DefaultLogDir = "/tmp/toolhost"

// readChunk is the size of one output read (envd reads at most 32 KiB).
const readChunk = 32 << 10

// Server is the in-sandbox agent.
type Server struct {
	cfg Config
	// root is the workspace; paths inside it are opened through it. A pooled sandbox's
	// agent starts before its workspace is attached, and opens it again then (PathWorkspace).
	root   atomic.Pointer[os.Root]
	mux    *http.ServeMux
	log    *slog.Logger
	launch launcher
	reaper *reaper   // set when cfg.Init
	writes pathLocks // serialises writes of the same file
	terms  terminals // programs on pseudo-terminals (terminal.go)
	egress *egress   // set by Serve when cfg.Egress

	// token is the access token requests must carry ("" : none); env the base
	// environment. Both change once, at a warm-pool agent's claim (handleClaim).
	token     atomic.Pointer[string]
	env       atomic.Pointer[[]string]
	claimMu   sync.Mutex
	poolToken string // a warm-pool agent's until it is claimed; "" after

	mu    sync.Mutex
	procs map[uint32]*proc
	// starting counts the commands being started, not yet in procs; started (on mu) is
	// signalled as each is.
	starting int
	started  *sync.Cond
	tunnels  map[net.Conn]struct{} // both ends of every open port tunnel
	closed   bool
	wg       sync.WaitGroup // background process waiters and port tunnels
}

type proc struct {
	cfg envd.ProcessConfig
	tag string
	pid int
}

// NewServer opens the workspace and builds the handler.
func New(cfg Config) (*Server, error) {
	if cfg.Workspace == "" {
		cfg.Workspace = sandbox.WorkspaceRoot
	}
	if cfg.LogDir == "" {
		cfg.LogDir = DefaultLogDir
	}
	if cfg.Env == nil {
		cfg.Env = os.Environ()
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 250 * time.Millisecond
	}
	if cfg.ProcDir == "" {
		cfg.ProcDir = "/proc"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	root, err := os.OpenRoot(cfg.Workspace)
	if err != nil {
		return nil, fmt.Errorf("open workspace %s: %w", cfg.Workspace, err)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, procs: map[uint32]*proc{}, tunnels: map[net.Conn]struct{}{}, launch: execLauncher{}}
	s.started = sync.NewCond(&s.mu)
	s.root.Store(root)
	token, env := cfg.AccessToken, slices.Clone(cfg.Env)
	s.token.Store(&token)
	s.env.Store(&env)
	if token == "" && cfg.PoolToken != "" {
		if cfg.PodName == "" {
			_ = root.Close()
			return nil, errors.New("a warm-pool agent (PoolToken) needs its pod's name")
		}
		s.poolToken = cfg.PoolToken
	}
	if cfg.Init {
		s.reaper = newReaper()
		s.launch = s.reaper
	}
	m := http.NewServeMux()
	m.HandleFunc("GET "+envd.PathHealth, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
	})
	m.HandleFunc("GET "+envd.PathFiles, s.handleDownload)
	m.HandleFunc("POST "+envd.PathFiles, s.handleUpload)
	m.HandleFunc("POST "+envd.PathProcessStart, s.handleStart)
	m.Handle("POST "+envd.PathProcessSignal, unary(s.sendSignal))
	m.Handle("POST "+envd.PathProcessList, unary(s.list))
	m.Handle("POST "+envd.PathFilesystemStat, unary(s.stat))
	m.HandleFunc("POST "+envd.PathFilesystemList, s.handleListDir)
	m.Handle("POST "+envd.PathFilesystemMkd, unary(s.makeDir))
	m.Handle("POST "+envd.PathFilesystemRm, unary(s.remove))
	m.HandleFunc("GET "+envd.PathPorts, s.handlePorts)
	m.HandleFunc("GET "+envd.PathDial, s.handleDial)
	m.HandleFunc("POST "+envd.PathWorkspace, s.handleWorkspace)
	m.HandleFunc("POST "+envd.PathClaim, s.handleClaim)
	m.HandleFunc("POST "+envd.PathEgressRelay, s.handleEgressRelay)
	m.HandleFunc("POST "+envd.PathTrust, s.handleTrust)
	m.HandleFunc("GET "+envd.PathArchive, s.handleArchive)
	m.HandleFunc("POST "+envd.PathExtract, s.handleExtract)
	m.HandleFunc("GET "+envd.PathTreeList, s.handleTreeList)
	m.HandleFunc("POST "+envd.PathTreeRead, s.handleTreeRead)
	s.handleTerminals(m)
	s.mux = m
	return s, nil
}

// handleWorkspace opens the workspace again: the host has just attached a workspace over
// the empty slot a pooled sandbox started on (mount propagation puts it at WorkspaceRoot in
// here). The host calls it before the sandbox runs anything else; the sandbox cannot reach
// this endpoint (the agent's socket is outside it).
func (s *Server) handleWorkspace(w http.ResponseWriter, _ *http.Request) {
	root, err := os.OpenRoot(s.cfg.Workspace)
	if err != nil {
		http.Error(w, "open the workspace: "+err.Error(), http.StatusInternalServerError)
		return
	}
	_ = os.Chdir(s.cfg.Workspace) // off the slot underneath, for good measure
	if old := s.root.Swap(root); old != nil {
		_ = old.Close()
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleClaim is a warm-pool agent's one claim (Config.PoolToken): ServeHTTP let it
// through with the pool's token; it names this pod and gives the sandbox's own token.
func (s *Server) handleClaim(w http.ResponseWriter, r *http.Request) {
	var req envd.ClaimRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		http.Error(w, "bad claim: "+err.Error(), http.StatusBadRequest)
		return
	}
	if len(req.Token) < 32 {
		http.Error(w, "bad claim: the token is too short", http.StatusBadRequest)
		return
	}
	for k := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			http.Error(w, fmt.Sprintf("bad claim: invalid environment variable name %q", k), http.StatusBadRequest)
			return
		}
	}
	s.claimMu.Lock()
	defer s.claimMu.Unlock()
	switch {
	case s.poolToken == "":
		http.Error(w, "this agent is claimed already", http.StatusConflict)
		return
	case req.Pod != s.cfg.PodName:
		http.Error(w, "this agent is not in the pod the claim names", http.StatusConflict)
		return
	}
	env := slices.Clone(*s.env.Load())
	for _, k := range slices.Sorted(maps.Keys(req.Env)) {
		env = append(env, k+"="+req.Env[k])
	}
	s.env.Store(&env)
	token := req.Token
	s.token.Store(&token)
	s.poolToken = ""
	s.log.Info("claimed", "pod", req.Pod)
	w.WriteHeader(http.StatusNoContent)
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != envd.PathHealth {
		s.claimMu.Lock()
		pool := s.poolToken
		s.claimMu.Unlock()
		switch {
		case pool != "":
			// Unclaimed: the pool's token may claim, and nothing else.
			if r.URL.Path != envd.PathClaim || !envd.TokenMatches(r.Header.Get(envd.HeaderAccessToken), pool) {
				http.Error(w, "this agent is a warm-pool spare: it answers only its claim", http.StatusUnauthorized)
				return
			}
		case r.URL.Path == envd.PathClaim:
			http.Error(w, "this agent is claimed already", http.StatusConflict)
			return
		default:
			if token := *s.token.Load(); token != "" && !envd.TokenMatches(r.Header.Get(envd.HeaderAccessToken), token) {
				http.Error(w, "missing or wrong access token", http.StatusUnauthorized)
				return
			}
		}
	}
	s.mux.ServeHTTP(w, r)
}

// Serve answers on l until ctx ends, then stops accepting, kills every process it
// started and returns.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	if s.reaper != nil {
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		go s.reaper.run(rctx) // owned by Serve: stops when Serve returns
	}
	// The egress port is taken before the first request can start a command.
	if err := s.startEgress(); err != nil {
		s.Close()
		return err
	}
	if s.egress != nil {
		s.wg.Add(1)
		go func() { // counted in s.wg: Close closes the listener
			defer s.wg.Done()
			s.serveEgress()
		}()
	}
	hs := &http.Server{Handler: s, ReadHeaderTimeout: 30 * time.Second, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	stop := context.AfterFunc(ctx, func() { _ = hs.Close() })
	defer stop()
	err := hs.Serve(l)
	s.Close()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serve envd: %w", err)
}

// Close kills every process group the server started, closes every port tunnel, and
// waits for their goroutines.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	for _, p := range s.procs {
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	}
	for c := range s.tunnels {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.closeTerminals()
	s.closeEgress()
	s.wg.Wait()
	_ = s.root.Load().Close()
}

// ---- paths

// where is a resolved path: rel != "" means inside the workspace (open through s.root),
// otherwise abs is opened directly.
type where struct {
	abs string // as seen in the sandbox
	rel string
}

func (s *Server) resolve(p string) (where, error) {
	if p == "" {
		return where{}, envd.BadArg("empty path")
	}
	if p == "~" || strings.HasPrefix(p, "~/") {
		p = sandbox.WorkspaceRoot + p[1:]
	}
	if !path.IsAbs(p) {
		p = path.Join(sandbox.WorkspaceRoot, p)
	}
	p = path.Clean(p)
	switch {
	case p == sandbox.WorkspaceRoot:
		return where{abs: p, rel: "."}, nil
	case strings.HasPrefix(p, sandbox.WorkspaceRoot+"/"):
		return where{abs: p, rel: p[len(sandbox.WorkspaceRoot)+1:]}, nil
	}
	return where{abs: p}, nil
}

// real is the path in the agent's own filesystem view.
func (s *Server) real(w where) string {
	if w.rel != "" {
		return filepath.Join(s.cfg.Workspace, w.rel)
	}
	return w.abs
}

func (s *Server) openFile(w where, flag int, perm fs.FileMode) (*os.File, error) {
	if w.rel != "" {
		return s.root.Load().OpenFile(w.rel, flag, perm)
	}
	return os.OpenFile(w.abs, flag, perm)
}

func (s *Server) lstat(w where) (fs.FileInfo, error) {
	if w.rel != "" {
		return s.root.Load().Lstat(w.rel)
	}
	return os.Lstat(w.abs)
}

func (s *Server) statFollow(w where) (fs.FileInfo, error) {
	if w.rel != "" {
		return s.root.Load().Stat(w.rel)
	}
	return os.Stat(w.abs)
}

func (s *Server) readlink(w where) (string, error) {
	if w.rel != "" {
		return s.root.Load().Readlink(w.rel)
	}
	return os.Readlink(w.abs)
}

func (s *Server) mkdirAll(w where) error {
	if w.rel != "" {
		return s.root.Load().MkdirAll(w.rel, 0o755)
	}
	return os.MkdirAll(w.abs, 0o755)
}

func (s *Server) removeAll(w where) error {
	if w.rel != "" {
		if w.rel == "." {
			return envd.BadArg("refusing to remove the workspace root")
		}
		return s.root.Load().RemoveAll(w.rel)
	}
	return os.RemoveAll(w.abs)
}

func (w where) join(name string) where {
	n := where{abs: path.Join(w.abs, name)}
	if w.rel != "" {
		n.rel = path.Join(w.rel, name)
	}
	return n
}

func (w where) parent() where {
	n := where{abs: path.Dir(w.abs)}
	if w.rel != "" && w.rel != "." {
		n.rel = path.Dir(w.rel)
	}
	return n
}

// ---- /files

func (s *Server) filesError(w http.ResponseWriter, status int, err error) {
	_, kind := envd.Classify(err)
	if kind == "not_found" {
		status = http.StatusNotFound
	}
	if kind == "outside" || kind == "link" {
		status = http.StatusForbidden
	}
	if kind == "changed" {
		status = http.StatusConflict
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(envd.FilesError{Code: status, Message: err.Error(), ToolhostKind: kind})
}

func (s *Server) handleDownload(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	wh, err := s.resolve(q.Get("path"))
	if err != nil {
		s.filesError(w, http.StatusBadRequest, err)
		return
	}
	if g, ok := guardOf(q); ok {
		var max int64
		if m := q.Get(envd.QueryMaxBytes); m != "" {
			max, _ = strconv.ParseInt(m, 10, 64)
		}
		data, err := s.readGuarded(wh, g, max)
		if err != nil {
			s.filesError(w, http.StatusBadRequest, err)
			return
		}
		w.Header().Set("Content-Type", envd.ContentOctet)
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		_, _ = w.Write(data)
		return
	}
	// Stat first so a FIFO or device is refused instead of blocking the open.
	fi, err := s.statFollow(wh)
	if err != nil {
		s.filesError(w, http.StatusBadRequest, fmt.Errorf("read %s: %w", wh.abs, err))
		return
	}
	if fi.IsDir() {
		s.filesError(w, http.StatusBadRequest, fmt.Errorf("path '%s' is a directory: %w", wh.abs, sandbox.ErrIsDir))
		return
	}
	if !fi.Mode().IsRegular() {
		s.filesError(w, http.StatusBadRequest, fmt.Errorf("read %s: it is a %s: %w", wh.abs, fileKind(fi.Mode()), sandbox.ErrNotRegular))
		return
	}
	if m := q.Get(envd.QueryMaxBytes); m != "" {
		if max, err := strconv.ParseInt(m, 10, 64); err == nil && max > 0 && fi.Size() > max {
			s.filesError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("path '%s' has %d bytes, more than %d: %w", wh.abs, fi.Size(), max, sandbox.ErrTooLarge))
			return
		}
	}
	f, err := s.openFile(wh, os.O_RDONLY, 0)
	if err != nil {
		s.filesError(w, http.StatusBadRequest, fmt.Errorf("open %s: %w", wh.abs, err))
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", envd.ContentOctet)
	http.ServeContent(w, r, path.Base(wh.abs), fi.ModTime(), f)
}

// ---- unary RPCs

func unary[Req, Resp any](fn func(context.Context, *Req) (*Resp, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := new(Req)
		if !decodeUnary(w, r, req) {
			return
		}
		resp, err := fn(r.Context(), req)
		if err != nil {
			code, kind := envd.Classify(err)
			writeUnaryError(w, code, err.Error(), kind)
			return
		}
		out, err := json.Marshal(resp)
		if err != nil {
			writeUnaryError(w, envd.CodeInternal, "encode response: "+err.Error(), "")
			return
		}
		w.Header().Set("Content-Type", envd.ContentJSON)
		_, _ = w.Write(out)
	})
}

// decodeUnary reads a Connect unary request body into req, or answers the error itself.
func decodeUnary(w http.ResponseWriter, r *http.Request, req any) bool {
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct != envd.ContentJSON {
		writeUnaryError(w, envd.CodeInvalidArgument, fmt.Sprintf("content type %q is not %s", ct, envd.ContentJSON), "")
		return false
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil || len(body) == 0 {
		writeUnaryError(w, envd.CodeInvalidArgument, "empty or unreadable request body", "")
		return false
	}
	if err := json.Unmarshal(body, req); err != nil {
		writeUnaryError(w, envd.CodeInvalidArgument, "decode request: "+err.Error(), "")
		return false
	}
	return true
}

func writeUnaryError(w http.ResponseWriter, code, msg, kind string) {
	w.Header().Set("Content-Type", envd.ContentJSON)
	w.WriteHeader(envd.HTTPStatus(code))
	_ = json.NewEncoder(w).Encode(envd.ConnectError{Code: code, Message: msg, ToolhostKind: kind})
}

func (s *Server) sendSignal(_ context.Context, req *envd.SendSignalRequest) (*envd.Empty, error) {
	var sig syscall.Signal
	switch req.Signal {
	case envd.SignalKill, "9":
		sig = syscall.SIGKILL
	case envd.SignalTerm, "15":
		sig = syscall.SIGTERM
	default:
		return nil, envd.BadArg("unsupported signal %q", req.Signal)
	}
	s.mu.Lock()
	var target *proc
	for pid, p := range s.procs {
		if (req.Process.Pid != 0 && pid == req.Process.Pid) || (req.Process.Tag != "" && p.tag == req.Process.Tag) {
			target = p
			break
		}
	}
	s.mu.Unlock()
	if target == nil {
		return nil, fmt.Errorf("process with pid %d tag %q: %w", req.Process.Pid, req.Process.Tag, sandbox.ErrNotFound)
	}
	// Every process leads its own group: signal all it spawned.
	if err := syscall.Kill(-target.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return nil, fmt.Errorf("signal process group %d: %w", target.pid, err)
	}
	return &envd.Empty{}, nil
}

func (s *Server) list(context.Context, *envd.ListRequest) (*envd.ListResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &envd.ListResponse{}
	for pid, p := range s.procs {
		out.Processes = append(out.Processes, envd.ProcessInfo{Config: p.cfg, Pid: pid, Tag: p.tag})
	}
	slices.SortFunc(out.Processes, func(a, b envd.ProcessInfo) int { return int(a.Pid) - int(b.Pid) })
	return out, nil
}

func (s *Server) entry(w where, fi fs.FileInfo) envd.EntryInfo {
	mt := fi.ModTime().UTC()
	e := envd.EntryInfo{
		Name:         fi.Name(),
		Path:         w.abs,
		Size:         envd.Int64(fi.Size()),
		Mode:         uint32(fi.Mode()),
		Permissions:  fi.Mode().String(),
		ModifiedTime: &mt,
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = envd.FileTypeSymlink
		if t, err := s.readlink(w); err == nil {
			e.SymlinkTarget = &t
		}
	case fi.IsDir():
		e.Type = envd.FileTypeDir
	default:
		e.Type = envd.FileTypeFile
	}
	if w.rel == "." {
		e.Name = path.Base(w.abs)
	}
	return e
}

func (s *Server) stat(_ context.Context, req *envd.PathRequest) (*envd.EntryResponse, error) {
	w, err := s.resolve(req.Path)
	if err != nil {
		return nil, err
	}
	if req.ToolhostNoLinks {
		fi, err := s.statNoLinks(w)
		if err != nil {
			return nil, fmt.Errorf("stat %s: %w", w.abs, err)
		}
		return &envd.EntryResponse{Entry: s.entry(w, fi)}, nil
	}
	fi, err := s.lstat(w)
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", w.abs, err)
	}
	return &envd.EntryResponse{Entry: s.entry(w, fi)}, nil
}

func (s *Server) makeDir(_ context.Context, req *envd.PathRequest) (*envd.EntryResponse, error) {
	w, err := s.resolve(req.Path)
	if err != nil {
		return nil, err
	}
	if fi, err := s.lstat(w); err == nil {
		if fi.IsDir() {
			return nil, fmt.Errorf("directory %s: %w", w.abs, sandbox.ErrExists)
		}
		return nil, fmt.Errorf("make directory %s: a file is in the way: %w", w.abs, sandbox.ErrNotDir)
	}
	if err := s.mkdirAll(w); err != nil {
		if errors.Is(err, fs.ErrExist) { // a file where a parent directory should be
			err = fmt.Errorf("%w: %w", err, sandbox.ErrNotDir)
		}
		return nil, fmt.Errorf("make directory %s: %w", w.abs, err)
	}
	fi, err := s.lstat(w)
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", w.abs, err)
	}
	return &envd.EntryResponse{Entry: s.entry(w, fi)}, nil
}

func (s *Server) remove(_ context.Context, req *envd.PathRequest) (*envd.Empty, error) {
	w, err := s.resolve(req.Path)
	if err != nil {
		return nil, err
	}
	switch {
	case req.ToolhostFileOnly:
		if err := s.removeOne(w, req.ToolhostNoLinks); err != nil {
			return nil, fmt.Errorf("remove %s: %w", w.abs, err)
		}
		return &envd.Empty{}, nil
	case req.ToolhostNoLinks:
		return nil, envd.BadArg("toolhostNoLinks on a remove needs toolhostFileOnly")
	}
	if err := s.removeAll(w); err != nil {
		return nil, fmt.Errorf("remove %s: %w", w.abs, err)
	}
	return &envd.Empty{}, nil
}

// ---- processes

// streamWriter serializes envelopes to one response; after the client went away it
// drops writes so the process keeps running and its output is discarded (as in envd).
type streamWriter struct {
	mu   sync.Mutex
	w    http.ResponseWriter
	rc   *http.ResponseController
	dead bool
}

func (sw *streamWriter) send(flags byte, msg any) {
	b, err := json.Marshal(msg)
	if err != nil {
		return
	}
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if sw.dead {
		return
	}
	if err := envd.WriteEnvelope(sw.w, flags, b); err != nil {
		sw.dead = true
		return
	}
	if err := sw.rc.Flush(); err != nil {
		sw.dead = true
	}
}

func (sw *streamWriter) event(ev envd.ProcessEvent) { sw.send(0, envd.StartResponse{Event: ev}) }

func (sw *streamWriter) end(e *envd.ConnectError) {
	sw.send(envd.FlagEndStream, envd.EndStreamResponse{Error: e})
}

func (s *Server) handleStart(w http.ResponseWriter, r *http.Request) {
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct != envd.ContentStreamJSON {
		writeUnaryError(w, envd.CodeInvalidArgument, fmt.Sprintf("content type %q is not %s", ct, envd.ContentStreamJSON), "")
		return
	}
	w.Header().Set("Content-Type", envd.ContentStreamJSON)
	sw := &streamWriter{w: w, rc: http.NewResponseController(w)}
	fail := func(code, msg string) { sw.end(&envd.ConnectError{Code: code, Message: msg}) }

	_, payload, err := envd.ReadEnvelope(r.Body)
	if err != nil {
		fail(envd.CodeInvalidArgument, "read request envelope: "+err.Error())
		return
	}
	// Reading the body to its end lets net/http watch the connection, so a client that
	// goes away cancels r.Context() even while nothing is being written.
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 1<<10))
	var req envd.StartRequest
	if err := json.Unmarshal(payload, &req); err != nil {
		fail(envd.CodeInvalidArgument, "decode StartRequest: "+err.Error())
		return
	}
	var timeout time.Duration
	if v := r.Header.Get(envd.HeaderTimeoutMs); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 || len(v) > 10 {
			fail(envd.CodeInvalidArgument, fmt.Sprintf("invalid %s %q", envd.HeaderTimeoutMs, v))
			return
		}
		timeout = time.Duration(ms) * time.Millisecond
	}
	maxOut := 0
	if v := r.Header.Get(envd.HeaderMaxOutputBytes); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			maxOut = n
		}
	}
	background := r.Header.Get(envd.HeaderBackground) != ""
	killOnClose := r.Header.Get(envd.HeaderKillOnClose) != ""

	cmd, err := s.command(req)
	if err != nil {
		fail(envd.CodeInvalidArgument, err.Error())
		return
	}
	if background {
		s.startBackground(sw, cmd, req)
		return
	}
	s.runForeground(r.Context(), sw, cmd, req, timeout, maxOut, killOnClose)
}

// startFailure is the end of a stream whose process could not start. A want of
// processes, descriptors or memory says so (sandbox.ErrCannotStart): the command did not
// run, and a sandbox where nothing can start any more is replaced by its session.
func startFailure(code, what string, err error) *envd.ConnectError {
	for _, e := range []error{syscall.EAGAIN, syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM} {
		if errors.Is(err, e) {
			return &envd.ConnectError{Code: envd.CodeResourceExhaust, Message: what + ": " + err.Error() + ": " + sandbox.ErrCannotStart.Error(), ToolhostKind: "cannot_start"}
		}
	}
	return &envd.ConnectError{Code: code, Message: what + ": " + err.Error()}
}

// command builds the process from its config: argv as given (no shell added), the base
// environment plus the request's, its own process group, stdin from /dev/null.
func (s *Server) command(req envd.StartRequest) (*exec.Cmd, error) {
	pc := req.Process
	if pc.Cmd == "" {
		return nil, envd.BadArg("empty cmd")
	}
	env := slices.Clone(*s.env.Load())
	for k, v := range pc.Envs {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, envd.BadArg("invalid environment variable name %q", k)
		}
		env = append(env, k+"="+v) // later entries win in os/exec
	}
	cwd := where{abs: sandbox.WorkspaceRoot, rel: "."}
	if pc.Cwd != "" {
		var err error
		if cwd, err = s.resolve(pc.Cwd); err != nil {
			return nil, err
		}
	}
	if fi, err := s.statFollow(cwd); err != nil || !fi.IsDir() {
		return nil, envd.BadArg("cwd '%s' does not exist", cwd.abs)
	}
	bin, err := lookPath(pc.Cmd, env)
	if err != nil {
		return nil, err
	}
	cmd := &exec.Cmd{
		Path:        bin,
		Args:        append([]string{pc.Cmd}, pc.Args...),
		Env:         env,
		Dir:         s.real(cwd),
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
		// Its streams are files (no copying goroutine), so Wait is never held by them;
		// set all the same, as on every exec.Cmd (internal/codecheck).
		WaitDelay: time.Second,
	}
	return cmd, nil
}

// lookPath searches the PATH the process will get, not the agent's.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	pathEnv := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathEnv = v
		}
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", envd.BadArg("executable %q not found in PATH", name)
}

// start launches cmd and tracks it until untrack. A server that is closing refuses (and
// kills what it just started).
func (s *Server) start(cmd *exec.Cmd, req envd.StartRequest) (int, <-chan exitStatus, error) {
	// Counted while it runs before it is tracked, so that a connection it makes meanwhile
	// is still attributed to it (commandOf waits for it).
	s.mu.Lock()
	s.starting++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.starting--
		s.started.Broadcast()
		s.mu.Unlock()
	}()
	pid, done, err := s.launch.start(cmd)
	if err != nil {
		return 0, nil, err
	}
	if s.cfg.Init {
		// At the sandbox's memory limit the kernel kills the process with the highest
		// score: make that a command, never the agent. Raising a score needs no
		// privilege. Best effort: a process that already exited has nothing to adjust.
		_ = os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(commandOOMScore), 0)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		return 0, nil, errShuttingDown
	}
	s.procs[uint32(pid)] = &proc{cfg: req.Process, tag: req.Tag, pid: pid}
	return pid, done, nil
}

var errShuttingDown = errors.New("agent is shutting down")

// commandOOMScore is the oom_score_adj of every command an init agent starts (and, by
// inheritance, of what they start): the OOM killer weighs it on top of a process's size.
const commandOOMScore = "500"

func (s *Server) untrack(pid int) {
	s.mu.Lock()
	delete(s.procs, uint32(pid))
	s.mu.Unlock()
}

// validTag: tags name log files, so no separators and no leading dot.
func validTag(t string) bool {
	return t != "" && len(t) <= 64 && t[0] != '.' &&
		strings.Trim(t, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == ""
}

func (s *Server) startBackground(sw *streamWriter, cmd *exec.Cmd, req envd.StartRequest) {
	if req.Tag == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		req.Tag = "bg-" + hex.EncodeToString(b[:])
	}
	if !validTag(req.Tag) {
		sw.end(&envd.ConnectError{Code: envd.CodeInvalidArgument, Message: fmt.Sprintf("invalid tag %q", req.Tag)})
		return
	}
	if err := os.MkdirAll(s.cfg.LogDir, 0o700); err != nil {
		sw.end(&envd.ConnectError{Code: envd.CodeInternal, Message: "create log directory: " + err.Error()})
		return
	}
	logPath := filepath.Join(s.cfg.LogDir, req.Tag+".log")
	lf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		sw.end(startFailure(envd.CodeInternal, "open process log", err))
		return
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	pid, done, err := s.start(cmd, req)
	lf.Close()
	if errors.Is(err, errShuttingDown) {
		sw.end(&envd.ConnectError{Code: envd.CodeUnavailable, Message: err.Error()})
		return
	}
	if err != nil {
		sw.end(startFailure(envd.CodeInvalidArgument, "start process", err))
		return
	}
	s.wg.Add(1)
	go func() { // owned by the server: waits for the process's end; Close kills it
		defer s.wg.Done()
		st := <-done
		s.untrack(pid)
		s.log.Debug("background process ended", "tag", req.Tag, "pid", pid, "status", st.desc)
	}()
	sw.event(envd.ProcessEvent{Start: &envd.StartEvent{Pid: uint32(pid), ToolhostLogPath: logPath}})
	sw.end(nil)
}

func (s *Server) runForeground(reqCtx context.Context, sw *streamWriter, cmd *exec.Cmd, req envd.StartRequest, timeout time.Duration, maxOut int, killOnClose bool) {
	outR, outW, err := os.Pipe()
	if err != nil {
		sw.end(startFailure(envd.CodeInternal, "create pipe", err))
		return
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		sw.end(startFailure(envd.CodeInternal, "create pipe", err))
		return
	}
	defer outR.Close()
	defer errR.Close()
	cmd.Stdout, cmd.Stderr = outW, errW
	pid, done, err := s.start(cmd, req)
	outW.Close()
	errW.Close()
	if errors.Is(err, errShuttingDown) {
		sw.end(&envd.ConnectError{Code: envd.CodeUnavailable, Message: err.Error()})
		return
	}
	if err != nil {
		sw.end(startFailure(envd.CodeInvalidArgument, "start process", err))
		return
	}
	defer s.untrack(pid)
	sw.event(envd.ProcessEvent{Start: &envd.StartEvent{Pid: uint32(pid)}})

	// Once the client is gone nobody reads the stream: stop writing. The process lives on
	// (envd's semantics) unless the client asked for it to die with the stream.
	stopWatch := context.AfterFunc(reqCtx, func() {
		if killOnClose {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
		sw.mu.Lock()
		sw.dead = true
		sw.mu.Unlock()
	})
	defer stopWatch()

	var timedOut bool
	var killMu sync.Mutex
	if timeout > 0 {
		t := time.AfterFunc(timeout, func() {
			killMu.Lock()
			timedOut = true
			killMu.Unlock()
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		})
		defer t.Stop()
	}

	var readers sync.WaitGroup
	caps := [2]*envd.HeadTail{}
	pump := func(i int, r *os.File) {
		defer readers.Done()
		buf := make([]byte, readChunk)
		forward := func(chunk []byte) {
			if caps[i] != nil {
				chunk = caps[i].Write(chunk)
			}
			if len(chunk) > 0 {
				sw.event(envd.ProcessEvent{Data: dataEvent(i, chunk, 0)})
			}
		}
		for {
			n, err := r.Read(buf)
			if n > 0 {
				forward(buf[:n])
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// A busy machine may not have scheduled this reader before the drain
				// deadline; what the process wrote before exiting is still in the pipe.
				drainNow(r, buf, forward)
				return
			}
			if err != nil {
				return
			}
		}
	}
	if maxOut > 0 {
		caps[0], caps[1] = envd.NewHeadTail(maxOut), envd.NewHeadTail(maxOut)
	}
	readers.Add(2)
	go pump(0, outR)
	go pump(1, errR)

	st := <-done
	// A leftover `cmd &` may hold the pipes: read what is already there, briefly. Such a
	// child keeps running; once we close the pipes its next write gets SIGPIPE.
	deadline := time.Now().Add(s.cfg.DrainTimeout)
	_ = outR.SetReadDeadline(deadline)
	_ = errR.SetReadDeadline(deadline)
	readers.Wait()

	for i, c := range caps {
		if c == nil {
			continue
		}
		if tail := c.Tail(); len(tail) > 0 {
			sw.event(envd.ProcessEvent{Data: dataEvent(i, tail, c.Dropped())})
		}
	}
	killMu.Lock()
	to := timedOut
	killMu.Unlock()
	if to {
		sw.end(&envd.ConnectError{Code: envd.CodeDeadlineExceeded, Message: fmt.Sprintf("process %d killed after its %s timeout", pid, timeout)})
		return
	}
	end := &envd.EndEvent{ExitCode: int32(st.code), Exited: st.signal == 0, Status: st.desc}
	if st.code != 0 {
		end.Error = st.desc
	}
	sw.event(envd.ProcessEvent{End: end})
	sw.end(nil)
}

// drainNow reads what a (non-blocking) pipe holds right now, bounded so that a leftover
// writer cannot keep it going.
func drainNow(f *os.File, buf []byte, fn func([]byte)) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		for total := 0; total < 1<<20; {
			n, err := syscall.Read(int(fd), buf)
			if n <= 0 || err != nil {
				return
			}
			total += n
			fn(buf[:n])
		}
	})
}

func dataEvent(stream int, b []byte, dropped int64) *envd.DataEvent {
	d := &envd.DataEvent{ToolhostDropped: envd.Int64(dropped)}
	if stream == 0 {
		d.Stdout = b
	} else {
		d.Stderr = b
	}
	return d
}
