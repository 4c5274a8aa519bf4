package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/splice"
)

// ClientConfig says how to reach an agent.
type Config struct {
	// SocketPath dials a unix socket (the local provider). When set, BaseURL may be empty.
	SocketPath string
	// BaseURL is the agent's address, e.g. https://49983-<id>.e2b.app.
	BaseURL string
	// Header is added to every request (X-Access-Token, Authorization, ...).
	Header http.Header
	// Transport overrides the HTTP transport (tests count bytes with it).
	Transport http.RoundTripper
	// IdleTimeout is the host's own bound on an agent that makes no progress: a call that
	// gets no answer, and no bytes read or written, for this long fails with
	// sandbox.ErrUnresponsive. Default DefaultIdleTimeout.
	IdleTimeout time.Duration
	// ExecGrace is added to a command's timeout to give Exec its host-side deadline: the
	// agent kills the command at its timeout and answers; an agent that does not answer
	// by timeout + grace is unresponsive. Default DefaultExecGrace.
	ExecGrace time.Duration

	// The fields below adapt the client to an agent that is not ours (E2B's envd), which
	// ignores the toolhost extensions: it kills only the process it started when a
	// command's timeout passes or SendSignal arrives, and writes no background log.

	// WrapTimeout, when set, returns the argv that runs argv under a wrapper inside the
	// sandbox that kills the command's whole process group at timeout (zero: no timeout,
	// but the command still leads its own group and a KillSignal sent to the wrapper
	// reaches all of it). Exec then gives the agent TimeoutMargin more than the timeout
	// before its own kill, so the wrapper acts first, and reports a command that a
	// signal killed at or after its timeout as timed out.
	WrapTimeout func(argv []string, timeout time.Duration) []string
	// TimeoutMargin is what Exec adds to the timeout it gives the agent when WrapTimeout
	// is set. Default DefaultTimeoutMargin.
	TimeoutMargin time.Duration
	// WrapBackground, when set, returns the argv that runs a background command with its
	// output appended to a log file in the sandbox (named after tag), and that file's
	// path; Start reports it as the process's LogPath.
	WrapBackground func(argv []string, tag string) (wrapped []string, logPath string)
	// KillSignal is what the client sends a command it gives up on (its call's ctx
	// ended, or its stream was cut): SignalKill (the default) or SignalTerm, for a
	// wrapper that passes it on to the command's group.
	KillSignal string
}

// Host-side bounds on an agent, when ClientConfig leaves them zero.
const (
	DefaultIdleTimeout   = 30 * time.Second
	DefaultExecGrace     = 5 * time.Second
	DefaultTimeoutMargin = 2 * time.Second
)

// Client talks to one agent. It is safe for concurrent use.
type Client struct {
	base   string
	sock   string // unix socket of the agent, "" for BaseURL agents
	header http.Header
	hc     *http.Client
	tr     *http.Transport // nil when the caller supplied the transport
	idle   time.Duration
	grace  time.Duration
	closed atomic.Bool

	wrapTimeout    func([]string, time.Duration) []string
	margin         time.Duration
	wrapBackground func([]string, string) ([]string, string)
	killSignal     string
}

// NewClient builds a client; it does not connect.
func New(cfg Config) (*Client, error) {
	c := &Client{header: cfg.Header, base: strings.TrimRight(cfg.BaseURL, "/"), sock: cfg.SocketPath,
		idle: cfg.IdleTimeout, grace: cfg.ExecGrace,
		wrapTimeout: cfg.WrapTimeout, margin: cfg.TimeoutMargin, wrapBackground: cfg.WrapBackground, killSignal: cfg.KillSignal}
	if c.margin <= 0 {
		c.margin = DefaultTimeoutMargin
	}
	switch c.killSignal {
	case "":
		c.killSignal = envd.SignalKill
	case envd.SignalKill, envd.SignalTerm:
	default:
		return nil, fmt.Errorf("envd client: KillSignal %q is neither %s nor %s", cfg.KillSignal, envd.SignalKill, envd.SignalTerm)
	}
	if c.idle <= 0 {
		c.idle = DefaultIdleTimeout
	}
	if c.grace <= 0 {
		c.grace = DefaultExecGrace
	}
	rt := cfg.Transport
	if rt == nil {
		c.tr = &http.Transport{
			MaxIdleConns:        64,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		}
		if cfg.SocketPath != "" {
			sock := cfg.SocketPath
			c.tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			}
		} else {
			c.tr.Proxy = http.ProxyFromEnvironment
		}
		rt = c.tr
	}
	if c.base == "" {
		if cfg.SocketPath == "" {
			return nil, errors.New("envd client: neither SocketPath nor BaseURL given")
		}
		c.base = "http://sandbox"
	}
	if _, err := url.Parse(c.base); err != nil {
		return nil, fmt.Errorf("envd client: parse base URL: %w", err)
	}
	c.hc = &http.Client{Transport: rt}
	return c, nil
}

// Close makes every later call fail with sandbox.ErrClosed and drops idle connections.
func (c *Client) Close() {
	c.closed.Store(true)
	if c.tr != nil {
		c.tr.CloseIdleConnections()
	}
}

func (c *Client) newRequest(ctx context.Context, method, p string, q url.Values, body io.Reader) (*http.Request, error) {
	u := c.base + p
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	for k, v := range c.header {
		req.Header[k] = slices.Clone(v)
	}
	return req, nil
}

// do sends a request; a transport failure after Close reports ErrClosed.
func (c *Client) do(req *http.Request) (*http.Response, error) {
	if c.closed.Load() {
		return nil, sandbox.ErrClosed
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if c.closed.Load() {
			return nil, fmt.Errorf("%w: %w", sandbox.ErrClosed, err)
		}
		return nil, err
	}
	return resp, nil
}

// call sends req under the host's own bound on the agent: unless a request or response
// byte moves, or the answer arrives, every IdleTimeout, the call is cut and fails with
// sandbox.ErrUnresponsive. Reading the returned body keeps the bound fed; closing it ends it.
func (c *Client) call(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(req.Context())
	wd := &watchdog{d: c.idle, cancel: cancel}
	wd.t = time.AfterFunc(c.idle, wd.fire)
	req = req.WithContext(ctx)
	if req.Body != nil {
		req.Body = &watchedReader{r: req.Body, wd: wd, request: true}
		req.GetBody = nil
	}
	resp, err := c.do(req)
	if err != nil {
		wd.stop()
		return nil, wd.wrap(err)
	}
	wd.touch()
	resp.Body = &watchedReader{r: resp.Body, wd: wd}
	return resp, nil
}

// watchdog cancels a call whose agent makes no progress for d. Its timer goroutine (the
// runtime's, via AfterFunc) is stopped by stop, which the call's body Close runs.
type watchdog struct {
	d      time.Duration
	t      *time.Timer
	cancel context.CancelFunc
	fired  atomic.Bool
}

func (w *watchdog) fire() { w.fired.Store(true); w.cancel() }

func (w *watchdog) touch() {
	if !w.fired.Load() {
		w.t.Reset(w.d)
	}
}

func (w *watchdog) stop() { w.t.Stop(); w.cancel() }

// wrap names an error caused by the watchdog for what it is.
func (w *watchdog) wrap(err error) error {
	if err != nil && w.fired.Load() {
		return fmt.Errorf("%w: no answer for %s (%v)", sandbox.ErrUnresponsive, w.d, err)
	}
	return err
}

// watchedReader feeds its watchdog on every read (of a request body: the agent is taking
// it; of a response body: the agent is sending it). Closing the response body stops the
// watchdog (the transport closes a request body as soon as it is sent).
type watchedReader struct {
	r       io.ReadCloser
	wd      *watchdog
	request bool
}

func (b *watchedReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if n > 0 {
		b.wd.touch()
	}
	return n, b.wd.wrap(err)
}

func (b *watchedReader) Close() error {
	if !b.request {
		b.wd.stop()
	}
	return b.r.Close()
}

// Health checks GET /health.
func (c *Client) Health(ctx context.Context) error {
	req, err := c.newRequest(ctx, http.MethodGet, envd.PathHealth, nil, nil)
	if err != nil {
		return err
	}
	resp, err := c.call(req)
	if err != nil {
		return fmt.Errorf("envd health: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("envd health: HTTP %d", resp.StatusCode)
	}
	return nil
}

// OpenWorkspace asks the agent to open its workspace again (POST /toolhost/workspace):
// the local provider calls it once it has attached a workspace to a pooled sandbox.
func (c *Client) OpenWorkspace(ctx context.Context) error {
	req, err := c.newRequest(ctx, http.MethodPost, envd.PathWorkspace, nil, nil)
	if err != nil {
		return err
	}
	resp, err := c.call(req)
	if err != nil {
		return fmt.Errorf("open the workspace: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return readError(resp)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	return nil
}

// Claim claims a warm-pool agent (POST /toolhost/claim): the client carries the pool's
// token; the agent takes req.Token as its own from then on (and req.Env), once.
func (c *Client) Claim(ctx context.Context, claim envd.ClaimRequest) error {
	body, err := json.Marshal(claim)
	if err != nil {
		return err
	}
	req, err := c.newRequest(ctx, http.MethodPost, envd.PathClaim, nil, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.call(req)
	if err != nil {
		return fmt.Errorf("claim the agent: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("claim the agent: %w", readError(resp))
	}
	return nil
}

// SetEgressRelay moves a relaying agent's egress to another host's relay (POST
// /toolhost/egress-relay): the host that takes the sandbox over gives its own.
func (c *Client) SetEgressRelay(ctx context.Context, r envd.EgressRelayRequest) error {
	body, err := json.Marshal(r)
	if err != nil {
		return err
	}
	req, err := c.newRequest(ctx, http.MethodPost, envd.PathEgressRelay, nil, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.call(req)
	if err != nil {
		return fmt.Errorf("move the agent's egress relay: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("move the agent's egress relay: %w", readError(resp))
	}
	return nil
}

// SetTrust gives the sandbox certificates to trust besides its image's (POST
// /toolhost/trust): PEM.
func (c *Client) SetTrust(ctx context.Context, pemCerts []byte) error {
	body, err := json.Marshal(envd.TrustRequest{PEM: string(pemCerts)})
	if err != nil {
		return err
	}
	req, err := c.newRequest(ctx, http.MethodPost, envd.PathTrust, nil, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.call(req)
	if err != nil {
		return fmt.Errorf("give the sandbox its trusted certificates: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("give the sandbox its trusted certificates: %w", readError(resp))
	}
	return nil
}

// readError turns a non-success response into *Error.
func readError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &envd.Error{Status: resp.StatusCode}
	var probe map[string]json.RawMessage
	if json.Unmarshal(body, &probe) == nil {
		var msg, kind string
		_ = json.Unmarshal(probe["message"], &msg)
		_ = json.Unmarshal(probe["toolhostKind"], &kind)
		var code string
		if json.Unmarshal(probe["code"], &code) == nil {
			e.Code = code
		}
		e.Message = msg
		e.Kind = envd.KindError(kind)
	} else {
		e.Message = strings.TrimSpace(string(body))
	}
	rpc := strings.HasPrefix(resp.Request.URL.Path, "/process.") || strings.HasPrefix(resp.Request.URL.Path, "/filesystem.")
	if rpc && e.Code == "" {
		e.Code = envd.CodeFromHTTP(resp.StatusCode)
	}
	if e.Message == "" {
		e.Message = http.StatusText(resp.StatusCode)
	}
	if e.Kind == nil {
		e.Kind = envd.GuessKind(resp.StatusCode, e.Code, e.Message)
	}
	return e
}

// unary calls a Connect unary procedure.
func (c *Client) unary(ctx context.Context, proc string, in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := c.newRequest(ctx, http.MethodPost, proc, nil, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", envd.ContentJSON)
	req.Header.Set(envd.HeaderProtocol, "1")
	resp, err := c.call(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return readError(resp)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, envd.MaxEnvelope+1))
	if err != nil {
		return fmt.Errorf("read response: %w", err)
	}
	if len(body) > envd.MaxEnvelope {
		return fmt.Errorf("the reply is larger than %d bytes: %w", envd.MaxEnvelope, sandbox.ErrTooLarge)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	return nil
}

// ---- files

// ReadFile reads a workspace file; over maxBytes (when > 0) it gives ErrTooLarge.
func (c *Client) ReadFile(ctx context.Context, p string, maxBytes int64) ([]byte, error) {
	return c.readFile(ctx, p, maxBytes, nil)
}

// ReadFileGuarded is ReadFile with the guard g checked by the agent as it opens the path
// (sandbox.GuardedFiles). Only this project's agent knows the guard: a real envd would
// ignore it, so callers send it only to the agent.
func (c *Client) ReadFileGuarded(ctx context.Context, p string, maxBytes int64, g sandbox.FileGuard) ([]byte, error) {
	return c.readFile(ctx, p, maxBytes, guardQuery(g))
}

// guardQuery is g as /files query parameters.
func guardQuery(g sandbox.FileGuard) url.Values {
	q := url.Values{}
	if g.NoLinks {
		q.Set(envd.QueryNoLinks, "1")
	}
	if g.Versioned {
		if g.Version == "" {
			q.Set(envd.QueryIfAbsent, "1")
		} else {
			q.Set(envd.QueryIfVersion, g.Version)
		}
	}
	return q
}

func (c *Client) readFile(ctx context.Context, p string, maxBytes int64, q url.Values) ([]byte, error) {
	abs, err := sandbox.Resolve(p)
	if err != nil {
		return nil, fmt.Errorf("read file: %w", err)
	}
	if q == nil {
		q = url.Values{}
	}
	q.Set("path", abs)
	if maxBytes > 0 {
		q.Set(envd.QueryMaxBytes, strconv.FormatInt(maxBytes, 10))
	}
	req, err := c.newRequest(ctx, http.MethodGet, envd.PathFiles, q, nil)
	if err != nil {
		return nil, fmt.Errorf("read file %s: %w", abs, err)
	}
	resp, err := c.call(req)
	if err != nil {
		return nil, fmt.Errorf("read file %s: %w", abs, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("read file %s: %w", abs, readError(resp))
	}
	// A real envd ignores the size query: check here too, before reading.
	if maxBytes > 0 && resp.ContentLength > maxBytes {
		return nil, fmt.Errorf("read file %s: %d bytes, limit %d: %w", abs, resp.ContentLength, maxBytes, sandbox.ErrTooLarge)
	}
	r := io.Reader(resp.Body)
	if maxBytes > 0 {
		r = io.LimitReader(r, maxBytes+1)
	}
	var buf bytes.Buffer
	if resp.ContentLength > 0 {
		buf.Grow(int(resp.ContentLength))
	}
	if _, err := buf.ReadFrom(r); err != nil {
		return nil, fmt.Errorf("read file %s: %w", abs, c.streamErr(err))
	}
	if maxBytes > 0 && int64(buf.Len()) > maxBytes {
		return nil, fmt.Errorf("read file %s: more than %d bytes: %w", abs, maxBytes, sandbox.ErrTooLarge)
	}
	return buf.Bytes(), nil
}

// WriteFile creates or replaces a workspace file, creating parent directories.
func (c *Client) WriteFile(ctx context.Context, p string, data []byte) error {
	return c.writeFile(ctx, p, data, nil)
}

// WriteFileGuarded is WriteFile with the guard g checked by the agent in the same step
// (sandbox.GuardedFiles); see ReadFileGuarded.
func (c *Client) WriteFileGuarded(ctx context.Context, p string, data []byte, g sandbox.FileGuard) error {
	return c.writeFile(ctx, p, data, guardQuery(g))
}

func (c *Client) writeFile(ctx context.Context, p string, data []byte, q url.Values) error {
	abs, err := sandbox.Resolve(p)
	if err != nil {
		return fmt.Errorf("write file: %w", err)
	}
	if q == nil {
		q = url.Values{}
	}
	q.Set("path", abs)
	req, err := c.newRequest(ctx, http.MethodPost, envd.PathFiles, q, bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("write file %s: %w", abs, err)
	}
	req.Header.Set("Content-Type", envd.ContentOctet)
	resp, err := c.call(req)
	if err != nil {
		return fmt.Errorf("write file %s: %w", abs, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("write file %s: %w", abs, readError(resp))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return nil
}

// Stat describes a workspace path without following a final symbolic link.
func (c *Client) Stat(ctx context.Context, p string) (sandbox.FileInfo, error) {
	return c.stat(ctx, p, false)
}

// StatGuarded is Stat with g.NoLinks checked by the agent as it opens the path
// (sandbox.GuardedFiles); see ReadFileGuarded.
func (c *Client) StatGuarded(ctx context.Context, p string, g sandbox.FileGuard) (sandbox.FileInfo, error) {
	return c.stat(ctx, p, g.NoLinks)
}

func (c *Client) stat(ctx context.Context, p string, noLinks bool) (sandbox.FileInfo, error) {
	abs, err := sandbox.Resolve(p)
	if err != nil {
		return sandbox.FileInfo{}, fmt.Errorf("stat: %w", err)
	}
	var out envd.EntryResponse
	if err := c.unary(ctx, envd.PathFilesystemStat, envd.PathRequest{Path: abs, ToolhostNoLinks: noLinks}, &out); err != nil {
		return sandbox.FileInfo{}, fmt.Errorf("stat %s: %w", abs, err)
	}
	return envd.FileInfo(out.Entry, p), nil
}

// MakeDir creates a workspace directory and its parents; an existing one is ErrExists.
func (c *Client) MakeDir(ctx context.Context, p string) error {
	abs, err := sandbox.Resolve(p)
	if err != nil {
		return fmt.Errorf("make directory: %w", err)
	}
	var out envd.EntryResponse
	if err := c.unary(ctx, envd.PathFilesystemMkd, envd.PathRequest{Path: abs}, &out); err != nil {
		return fmt.Errorf("make directory %s: %w", abs, err)
	}
	return nil
}

// Remove deletes a workspace path recursively; a missing path is not an error.
func (c *Client) Remove(ctx context.Context, p string) error {
	abs, err := sandbox.Resolve(p)
	if err != nil {
		return fmt.Errorf("remove: %w", err)
	}
	if abs == sandbox.WorkspaceRoot {
		return fmt.Errorf("remove: refusing to remove the workspace root: %w", sandbox.ErrOutside)
	}
	var out envd.Empty
	if err := c.unary(ctx, envd.PathFilesystemRm, envd.PathRequest{Path: abs}, &out); err != nil {
		return fmt.Errorf("remove %s: %w", abs, err)
	}
	return nil
}

// RemoveFileGuarded removes one entry that is not a directory, never recursively, with
// g.NoLinks checked by the agent as it opens the path (sandbox.GuardedFiles): a directory
// is ErrIsDir, a missing entry ErrNotFound. See ReadFileGuarded.
func (c *Client) RemoveFileGuarded(ctx context.Context, p string, g sandbox.FileGuard) error {
	abs, err := sandbox.Resolve(p)
	if err != nil {
		return fmt.Errorf("remove: %w", err)
	}
	if abs == sandbox.WorkspaceRoot {
		return fmt.Errorf("remove: refusing to remove the workspace root: %w", sandbox.ErrOutside)
	}
	var out envd.Empty
	in := envd.PathRequest{Path: abs, ToolhostNoLinks: g.NoLinks, ToolhostFileOnly: true}
	if err := c.unary(ctx, envd.PathFilesystemRm, in, &out); err != nil {
		return fmt.Errorf("remove %s: %w", abs, err)
	}
	return nil
}

// listDepth stands for "unbounded" in ListDir.
const listDepth = 1 << 16

// List returns the entries below a workspace directory, sorted by path, never following
// symbolic links. Skip and Limit are applied here as well, for agents that ignore them.
func (c *Client) List(ctx context.Context, lr sandbox.ListRequest) (sandbox.ListResult, error) {
	return c.list(ctx, lr, false)
}

// ListGuarded is List with g.NoLinks checked by the agent as it opens the listed
// directory's path (sandbox.GuardedFiles); see ReadFileGuarded.
func (c *Client) ListGuarded(ctx context.Context, lr sandbox.ListRequest, g sandbox.FileGuard) (sandbox.ListResult, error) {
	return c.list(ctx, lr, g.NoLinks)
}

func (c *Client) list(ctx context.Context, lr sandbox.ListRequest, noLinks bool) (sandbox.ListResult, error) {
	abs, err := sandbox.Resolve(lr.Path)
	if err != nil {
		return sandbox.ListResult{}, fmt.Errorf("list: %w", err)
	}
	in := envd.ListDirRequest{Path: abs, Depth: 1, ToolhostSkip: lr.Skip, ToolhostNoLinks: noLinks}
	if lr.Recursive {
		in.Depth = listDepth
	}
	if lr.Limit > 0 {
		in.ToolhostLimit = uint32(lr.Limit)
	}
	var out envd.ListDirResponse
	if err := c.unary(ctx, envd.PathFilesystemList, in, &out); err != nil {
		return sandbox.ListResult{}, fmt.Errorf("list %s: %w", abs, err)
	}
	if e := out.ToolhostError; e != nil { // the agent's walk failed after it began to answer
		err := &envd.Error{Status: envd.HTTPStatus(e.Code), Code: e.Code, Message: e.Message, Kind: envd.KindError(e.ToolhostKind)}
		if err.Kind == nil {
			err.Kind = envd.GuessKind(err.Status, err.Code, err.Message)
		}
		return sandbox.ListResult{}, fmt.Errorf("list %s: %w", abs, err)
	}
	res := sandbox.ListResult{Truncated: out.ToolhostTruncated}
	prefix := abs + "/"
	for _, e := range out.Entries {
		rel, ok := strings.CutPrefix(e.Path, prefix)
		if !ok || rel == "" {
			continue
		}
		if skipped(rel, lr.Skip) {
			continue
		}
		res.Entries = append(res.Entries, envd.FileInfo(e, rel))
	}
	slices.SortFunc(res.Entries, func(a, b sandbox.FileInfo) int { return strings.Compare(a.Path, b.Path) })
	if lr.Limit > 0 && len(res.Entries) > lr.Limit {
		res.Entries, res.Truncated = res.Entries[:lr.Limit], true
	}
	return res, nil
}

// skipped reports whether rel lies below a directory named in skip.
func skipped(rel string, skip []string) bool {
	if len(skip) == 0 {
		return false
	}
	dir := path.Dir(rel)
	for dir != "." {
		if slices.Contains(skip, path.Base(dir)) {
			return true
		}
		dir = path.Dir(dir)
	}
	return false
}

// ---- processes

// Processes returns the processes the agent runs.
func (c *Client) Processes(ctx context.Context) ([]envd.ProcessInfo, error) {
	var out envd.ListResponse
	if err := c.unary(ctx, envd.PathProcessList, envd.ListRequest{}, &out); err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	return out.Processes, nil
}

// BackgroundProcesses lists the background processes the agent started that still run
// (sandbox.ProcessLister): those with a tag.
func (c *Client) BackgroundProcesses(ctx context.Context) ([]sandbox.ProcessInfo, error) {
	infos, err := c.Processes(ctx)
	if err != nil {
		return nil, err
	}
	var out []sandbox.ProcessInfo
	for _, in := range infos {
		// A foreground command is tagged fg- (Exec); terminals (term-) are listed: they
		// too run on until they end, and a session restarts them after a rotation.
		if in.Tag != "" && !strings.HasPrefix(in.Tag, "fg-") {
			out = append(out, sandbox.ProcessInfo{ID: in.Tag, PID: int(in.Pid)})
		}
	}
	return out, nil
}

// Signal sends SIGNAL_SIGKILL or SIGNAL_SIGTERM to a process (its group, on our agent).
func (c *Client) Signal(ctx context.Context, pid uint32, signal string) error {
	return c.signal(ctx, envd.ProcessSelector{Pid: pid}, signal)
}

func (c *Client) signal(ctx context.Context, sel envd.ProcessSelector, signal string) error {
	var out envd.Empty
	if err := c.unary(ctx, envd.PathProcessSignal, envd.SendSignalRequest{Process: sel, Signal: envd.Enum(signal)}, &out); err != nil {
		return fmt.Errorf("signal process %d %s: %w", sel.Pid, sel.Tag, err)
	}
	return nil
}

// giveUp sends KillSignal to a command the call no longer waits for: by pid once the
// start event told it, else by its tag (a cancel that lands before the start event).
// Best effort, bounded by the exec grace.
func (c *Client) giveUp(ctx context.Context, pid uint32, tag string) {
	sel := envd.ProcessSelector{Pid: pid}
	if pid == 0 {
		sel = envd.ProcessSelector{Tag: tag}
	}
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.grace)
	defer cancel()
	_ = c.signal(kctx, sel, c.killSignal)
}

// newTag names a process uniquely, so it can be signalled before its pid is known.
func newTag(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func startRequest(r sandbox.ExecRequest, tag string) (envd.StartRequest, error) {
	if len(r.Argv) == 0 || r.Argv[0] == "" {
		return envd.StartRequest{}, errors.New("empty argv")
	}
	no := false
	sr := envd.StartRequest{Process: envd.ProcessConfig{Cmd: r.Argv[0], Args: r.Argv[1:]}, Tag: tag, Stdin: &no}
	if len(r.Env) > 0 {
		sr.Process.Envs = maps.Clone(r.Env)
	}
	if r.Cwd != "" {
		sr.Process.Cwd = r.Cwd
		if !path.IsAbs(r.Cwd) {
			sr.Process.Cwd = path.Join(sandbox.WorkspaceRoot, r.Cwd)
		}
	}
	return sr, nil
}

// openStream starts /process.Process/Start and checks the response is a stream.
// With watched, the call is bounded like any other (the agent answers a background start
// at once); without, the caller bounds it (a foreground command is silent while it runs).
func (c *Client) openStream(ctx context.Context, sr envd.StartRequest, hdr map[string]string, watched bool) (*http.Response, error) {
	b, err := json.Marshal(sr)
	if err != nil {
		return nil, err
	}
	var body bytes.Buffer
	_ = envd.WriteEnvelope(&body, 0, b)
	req, err := c.newRequest(ctx, http.MethodPost, envd.PathProcessStart, nil, &body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", envd.ContentStreamJSON)
	req.Header.Set(envd.HeaderProtocol, "1")
	req.Header.Set("Keepalive-Ping-Interval", "50")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	send := c.do
	if watched {
		send = c.call
	}
	resp, err := send(req)
	if err != nil {
		return nil, err
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(ct, "application/connect+") {
		defer resp.Body.Close()
		return nil, readError(resp)
	}
	return resp, nil
}

func (c *Client) streamErr(err error) error {
	if c.closed.Load() {
		return fmt.Errorf("%w: %w", sandbox.ErrClosed, err)
	}
	return err
}

// Exec runs a foreground command. The agent kills its process group at the timeout (sent
// as Connect-Timeout-Ms, the earlier of req.Timeout and ctx's deadline), or the wrapper
// of WrapTimeout does; when ctx is canceled the client sends KillSignal with SendSignal.
// Either way the partial output comes back with TimedOut set; a cancellation also returns
// ctx's error. A stream cut before its end gets the command the same signal.
func (c *Client) Exec(ctx context.Context, r sandbox.ExecRequest) (sandbox.ExecResult, error) {
	began := time.Now()
	if len(r.Argv) == 0 || r.Argv[0] == "" {
		return sandbox.ExecResult{}, errors.New("exec: empty argv")
	}
	cmdName := r.Argv[0]
	maxOut := r.MaxOutputBytes
	if maxOut <= 0 {
		maxOut = sandbox.DefaultMaxOutputBytes
	}
	timeout := r.Timeout
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); timeout <= 0 || left < timeout {
			timeout = max(left, time.Millisecond)
		}
	}
	// The agent's own deadline: the timeout, or a little more when a wrapper inside the
	// sandbox enforces it on the whole group (the agent's kill would reach only the
	// wrapper, and must not win the race).
	agentTimeout := timeout
	if c.wrapTimeout != nil {
		r.Argv = c.wrapTimeout(r.Argv, timeout)
		if timeout > 0 {
			agentTimeout = timeout + c.margin
		}
	}
	tag := r.Tag // the caller's name for the command (the egress audit's), else a fresh one
	if tag == "" {
		tag = newTag("fg-")
	}
	sr, err := startRequest(r, tag)
	if err != nil {
		return sandbox.ExecResult{}, fmt.Errorf("exec: %w", err)
	}
	// Kill-on-disconnect covers a cancel that lands before the start event told us the pid
	// (and a host that dies mid-call) on our agent; the tag covers it on a real envd.
	hdr := map[string]string{envd.HeaderMaxOutputBytes: strconv.Itoa(maxOut), envd.HeaderKillOnClose: "1"}
	if agentTimeout > 0 {
		ms := agentTimeout.Milliseconds()
		if ms < 1 {
			ms = 1
		}
		hdr[envd.HeaderTimeoutMs] = strconv.FormatInt(ms, 10)
	}

	// The stream outlives ctx a little when the agent owns the deadline, so the agent's
	// deadline_exceeded (with the tail of the output) wins the race against our cancel.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	var canceled atomic.Bool
	stop := context.AfterFunc(ctx, func() {
		canceled.Store(true)
		if errors.Is(ctx.Err(), context.DeadlineExceeded) && timeout > 0 {
			t := time.AfterFunc(agentTimeout-timeout+c.grace, cancel)
			context.AfterFunc(sctx, func() { t.Stop() })
			return
		}
		cancel()
	})
	defer stop()
	// The host's own deadline: the agent answers by the command's timeout (it kills the
	// command then); one that has not answered by timeout + grace is not answering at all
	// (stopped, wedged), and the call must not wait for it any longer.
	var unresponsive atomic.Bool
	if agentTimeout > 0 {
		t := time.AfterFunc(agentTimeout+c.grace, func() { unresponsive.Store(true); cancel() })
		defer t.Stop()
	}
	noAnswer := func(err error) error {
		return fmt.Errorf("exec %s: %w: no answer %s after the command's %s timeout (%v)",
			cmdName, sandbox.ErrUnresponsive, c.grace, timeout, err)
	}

	res := sandbox.ExecResult{ExitCode: -1}
	resp, err := c.openStream(sctx, sr, hdr, false)
	if err != nil {
		if unresponsive.Load() && !canceled.Load() {
			res.Duration = time.Since(began)
			return res, noAnswer(err)
		}
		if canceled.Load() {
			c.giveUp(ctx, 0, tag)
			res.TimedOut, res.Duration = true, time.Since(began)
			return res, fmt.Errorf("exec %s: %w", cmdName, ctx.Err())
		}
		return res, fmt.Errorf("exec %s: %w", cmdName, err)
	}
	defer resp.Body.Close()

	out, errb := envd.NewHeadTail(maxOut), envd.NewHeadTail(maxOut)
	var outDropped, errDropped int64
	var pid uint32
	sawEnd := false
	finish := func() sandbox.ExecResult {
		res.Stdout = append(append([]byte(nil), out.Head()...), out.Tail()...)
		res.Stderr = append(append([]byte(nil), errb.Head()...), errb.Tail()...)
		res.StdoutCut = outDropped + out.Dropped()
		res.StderrCut = errDropped + errb.Dropped()
		res.Duration = time.Since(began)
		// Behind a timeout wrapper the command ends like any killed one: it timed out when
		// the signal came no earlier than its timeout (the wrapper starts after the call).
		if c.wrapTimeout != nil && timeout > 0 && sawEnd && res.ExitCode == -1 && res.Duration >= timeout {
			res.TimedOut = true
		}
		return res
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		flags, payload, err := envd.ReadEnvelope(br)
		if err != nil {
			if unresponsive.Load() && !canceled.Load() {
				return finish(), noAnswer(err)
			}
			if canceled.Load() || sctx.Err() != nil {
				// ctx ended and we cut the stream: kill what we started.
				c.giveUp(ctx, pid, tag)
				res.TimedOut = true
				return finish(), fmt.Errorf("exec %s: %w", cmdName, ctx.Err())
			}
			// The stream was cut under us (a proxy, the network). Our agent kills the
			// command with its stream; an agent that does not would leave it running with
			// nobody to read its output: end it.
			err = c.streamErr(err)
			if c.wrapTimeout != nil && !errors.Is(err, sandbox.ErrClosed) {
				c.giveUp(ctx, pid, tag)
			}
			return finish(), fmt.Errorf("exec %s: %w", cmdName, &StreamCutError{Missing: "end-of-stream", Err: err})
		}
		if flags&envd.FlagEndStream != 0 {
			var es envd.EndStreamResponse
			if err := json.Unmarshal(payload, &es); err != nil {
				return finish(), fmt.Errorf("exec %s: decode end of stream: %w", cmdName, err)
			}
			if es.Error != nil {
				if es.Error.Code == envd.CodeDeadlineExceeded {
					res.TimedOut, res.ExitCode = true, -1
					return finish(), nil
				}
				e := &envd.Error{Status: http.StatusOK, Code: es.Error.Code, Message: es.Error.Message, Kind: envd.KindError(es.Error.ToolhostKind)}
				if e.Kind == nil {
					e.Kind = envd.GuessKind(0, e.Code, e.Message)
				}
				return finish(), fmt.Errorf("exec %s: %w", cmdName, e)
			}
			if !sawEnd {
				return finish(), fmt.Errorf("exec %s: %w", cmdName, &StreamCutError{Missing: "an end event"})
			}
			return finish(), nil
		}
		var ev envd.StartResponse
		if err := json.Unmarshal(payload, &ev); err != nil {
			return finish(), fmt.Errorf("exec %s: decode event: %w", cmdName, err)
		}
		switch e := ev.Event; {
		case e.Start != nil:
			pid = e.Start.Pid
		case e.Data != nil:
			if len(e.Data.Stdout) > 0 {
				outDropped += int64(e.Data.ToolhostDropped)
				out.Write(e.Data.Stdout)
			}
			if len(e.Data.Stderr) > 0 {
				errDropped += int64(e.Data.ToolhostDropped)
				errb.Write(e.Data.Stderr)
			}
		case e.End != nil:
			sawEnd = true
			res.ExitCode = int(e.End.ExitCode)
			if !e.End.Exited && e.End.ExitCode == 0 {
				res.ExitCode = -1
			}
		}
	}
}

// Start runs a background command whose output goes to a log file in the sandbox named
// after its tag (r.Tag, else a fresh one); it returns once the process has started.
func (c *Client) Start(ctx context.Context, r sandbox.ExecRequest) (sandbox.Process, error) {
	tag := r.Tag
	if tag == "" {
		tag = newTag("bg-")
	}
	if len(r.Argv) == 0 || r.Argv[0] == "" {
		return sandbox.Process{}, errors.New("start: empty argv")
	}
	cmdName := r.Argv[0]
	var logPath string
	if c.wrapBackground != nil {
		r.Argv, logPath = c.wrapBackground(r.Argv, tag)
	}
	sr, err := startRequest(r, tag)
	if err != nil {
		return sandbox.Process{}, fmt.Errorf("start: %w", err)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel() // closing the stream leaves the process running
	resp, err := c.openStream(sctx, sr, map[string]string{envd.HeaderBackground: "1"}, true)
	if err != nil {
		return sandbox.Process{}, fmt.Errorf("start %s: %w", cmdName, err)
	}
	defer resp.Body.Close()
	for {
		flags, payload, err := envd.ReadEnvelope(resp.Body)
		if err != nil {
			return sandbox.Process{}, fmt.Errorf("start %s: %w", cmdName, c.streamErr(err))
		}
		if flags&envd.FlagEndStream != 0 {
			var es envd.EndStreamResponse
			_ = json.Unmarshal(payload, &es)
			if es.Error != nil {
				return sandbox.Process{}, fmt.Errorf("start %s: %w", cmdName, &envd.Error{Status: http.StatusOK, Code: es.Error.Code, Message: es.Error.Message, Kind: envd.KindError(es.Error.ToolhostKind)})
			}
			return sandbox.Process{}, fmt.Errorf("start %s: stream ended before the start event", cmdName)
		}
		var ev envd.StartResponse
		if err := json.Unmarshal(payload, &ev); err != nil {
			return sandbox.Process{}, fmt.Errorf("start %s: decode event: %w", cmdName, err)
		}
		if s := ev.Event.Start; s != nil {
			if s.ToolhostLogPath != "" {
				logPath = s.ToolhostLogPath
			}
			return sandbox.Process{ID: tag, PID: int(s.Pid), LogPath: logPath}, nil
		}
	}
}

// ---- ports (toolhost extensions)

// Ports lists the TCP ports that processes of the sandbox listen on, sorted by port (GET
// /toolhost/ports). With the host network the host's own listeners are not among them.
func (c *Client) Ports(ctx context.Context) ([]envd.ListeningPort, error) {
	req, err := c.newRequest(ctx, http.MethodGet, envd.PathPorts, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("list listening ports: %w", err)
	}
	resp, err := c.call(req)
	if err != nil {
		return nil, fmt.Errorf("list listening ports: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("list listening ports: %w", readError(resp))
	}
	var out envd.PortsResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, envd.MaxEnvelope)).Decode(&out); err != nil {
		return nil, fmt.Errorf("list listening ports: decode: %w", c.streamErr(err))
	}
	return out.Ports, nil
}

// DialPort opens a connection to port inside the sandbox through the agent (GET
// /toolhost/dial, upgraded to a raw byte stream): it works whatever the sandbox's
// network, and reaches only a port that a process of the sandbox listens on — otherwise
// the error wraps sandbox.ErrPortClosed. ctx bounds the handshake, not the connection.
// Only agents of toolhost's are supported: on a unix socket, or at http://ADDRESS:PORT.
func (c *Client) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("dial port %d: not in 1..65535", port)
	}
	if c.closed.Load() {
		return nil, fmt.Errorf("dial port %d: %w", port, sandbox.ErrClosed)
	}
	network, addr := "unix", c.sock
	if c.sock == "" {
		// An agent of ours on a network (a pod's address) is reached in plain HTTP on its
		// port; an https base is another's envd, which has no dial extension.
		u, err := url.Parse(c.base)
		if err != nil || u.Scheme != "http" || u.Port() == "" {
			return nil, fmt.Errorf("dial port %d: %w: only an agent of toolhost's (a unix socket, or http://ADDRESS:PORT) has the dial extension", port, errors.ErrUnsupported)
		}
		network, addr = "tcp", u.Host
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("dial port %d: connect to the agent: %w", port, c.streamErr(err))
	}
	tc, err := c.dialHandshake(ctx, conn, port)
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("dial port %d: %w: %w", port, ctx.Err(), err)
		}
		return nil, fmt.Errorf("dial port %d: %w", port, c.streamErr(err))
	}
	return tc, nil
}

func (c *Client) dialHandshake(ctx context.Context, conn net.Conn, port int) (net.Conn, error) {
	// A canceled ctx interrupts the handshake through the deadline.
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req, err := c.newRequest(ctx, http.MethodGet, envd.PathDial, url.Values{envd.QueryPort: {strconv.Itoa(port)}}, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", envd.UpgradeTCP)
	if err := req.Write(conn); err != nil {
		return nil, fmt.Errorf("send request: %w", err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, fmt.Errorf("read response: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		return nil, readError(resp)
	}
	if !strings.EqualFold(resp.Header.Get("Upgrade"), envd.UpgradeTCP) {
		return nil, fmt.Errorf("agent switched to %q, not %s", resp.Header.Get("Upgrade"), envd.UpgradeTCP)
	}
	if !stop() {
		return nil, ctx.Err()
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	if br.Buffered() == 0 {
		return conn, nil // the bare socket: io.Copy may splice(2) it
	}
	return &bufferedConn{Conn: conn, r: br}, nil
}

// bufferedConn is a connection whose first bytes were already read into r.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// CloseWrite passes a half-close on (see Splice).
func (b *bufferedConn) CloseWrite() error {
	if cw, ok := b.Conn.(splice.CloseWriter); ok {
		return cw.CloseWrite()
	}
	return b.Conn.Close()
}

// StreamCutError is a command's stream that ended before its end: the exchange with the
// agent broke (a proxy, the network), which says nothing of the command. Missing is what
// did not come; Err, when set, is how the stream ended.
type StreamCutError struct {
	Missing string
	Err     error
}

func (e *StreamCutError) Error() string {
	if e.Err == nil {
		return "stream ended without " + e.Missing
	}
	return "stream ended without " + e.Missing + ": " + e.Err.Error()
}

func (e *StreamCutError) Unwrap() error { return e.Err }
