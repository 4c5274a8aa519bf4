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
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// A request the client cancelled (notifications/cancelled) gets no response: the MCP
// specification says the receiver SHOULD NOT send one, and a client that reused the id
// or already moved on would misread it. The SDK cancels the handler's context and then
// answers whatever the handler returns; so the answer is dropped on its way out: by a
// wrapper of the connection on stdio and in memory (cancelConn), and over streamable
// HTTP by a wrapper of the response stream of the POST that carried the request
// (cancelGuard). Either way the command the call started is killed by the cancelled
// context, as before.

const methodCancelled = "notifications/cancelled"

// idKey names a request id the same way whether it came decoded (jsonrpc.ID) or raw from
// a cancellation's params: a number and a string of the same digits differ.
func idKey(id jsonrpc.ID) string { return fmt.Sprintf("%T:%v", id.Raw(), id.Raw()) }

// cancelledID is the request id a notifications/cancelled names, if any.
func cancelledID(params json.RawMessage) (string, bool) {
	var p struct {
		RequestID any `json:"requestId"`
	}
	if json.Unmarshal(params, &p) != nil || p.RequestID == nil {
		return "", false
	}
	id, err := jsonrpc.MakeID(p.RequestID)
	if err != nil || !id.IsValid() {
		return "", false
	}
	return idKey(id), true
}

// cancelTransport wraps a transport so that its connections drop the responses to
// cancelled requests.
type cancelTransport struct {
	mcp.Transport
	dropped func() // counts a dropped response
}

func (t cancelTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &cancelConn{Connection: c, dropped: t.dropped, inflight: map[string]bool{}}, nil
}

// cancelConn tracks the requests in flight (read, not yet answered) and which of them the
// client cancelled; the map holds only requests in flight, so it is bounded by them.
type cancelConn struct {
	mcp.Connection
	dropped func()

	mu       sync.Mutex
	inflight map[string]bool // id -> cancelled
}

func (c *cancelConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	m, err := c.Connection.Read(ctx)
	if req, ok := m.(*jsonrpc.Request); ok && err == nil {
		c.mu.Lock()
		switch {
		case req.IsCall():
			c.inflight[idKey(req.ID)] = false
		case req.Method == methodCancelled:
			// Marked before the SDK sees the notification and cancels the handler, so the
			// handler's answer always finds the mark.
			if k, ok := cancelledID(req.Params); ok {
				if _, in := c.inflight[k]; in {
					c.inflight[k] = true
				}
			}
		}
		c.mu.Unlock()
	}
	return m, err
}

func (c *cancelConn) Write(ctx context.Context, m jsonrpc.Message) error {
	if resp, ok := m.(*jsonrpc.Response); ok && resp.ID.IsValid() {
		k := idKey(resp.ID)
		c.mu.Lock()
		cancelled := c.inflight[k]
		delete(c.inflight, k)
		c.mu.Unlock()
		if cancelled {
			c.dropped()
			return nil
		}
	}
	return c.Connection.Write(ctx, m)
}

// cancelGuard does the same over streamable HTTP, where each request's response travels
// on the stream of the POST that carried it: a POST holding one call is registered under
// its session and id while it runs, and a POST holding a cancellation of it mutes that
// stream before the SDK reads the cancellation. What the stream would still carry (the
// response, progress) is discarded; the POST then ends without a response.
type cancelGuard struct {
	h       http.Handler
	maxBody int64
	dropped func()

	mu      sync.Mutex
	streams map[string]*mutableWriter // session id + "\x00" + idKey
}

func newCancelGuard(h http.Handler, maxBody int64, dropped func()) *cancelGuard {
	return &cancelGuard{h: h, maxBody: maxBody, dropped: dropped, streams: map[string]*mutableWriter{}}
}

func (g *cancelGuard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sid := r.Header.Get("Mcp-Session-Id")
	if r.Method != http.MethodPost || sid == "" || r.Body == nil {
		g.h.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			http.Error(w, fmt.Sprintf("request body exceeds %d bytes", mbe.Limit), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "reading the request: "+err.Error(), http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	m, err := jsonrpc.DecodeMessage(body) // a batch or garbage: the SDK answers it
	req, ok := m.(*jsonrpc.Request)
	if err != nil || !ok {
		g.h.ServeHTTP(w, r)
		return
	}
	switch {
	case req.IsCall():
		key := sid + "\x00" + idKey(req.ID)
		mw := &mutableWriter{ResponseWriter: w}
		g.mu.Lock()
		g.streams[key] = mw
		g.mu.Unlock()
		defer func() {
			g.mu.Lock()
			if g.streams[key] == mw {
				delete(g.streams, key)
			}
			g.mu.Unlock()
			if mw.muted.Load() {
				g.dropped()
			}
		}()
		g.h.ServeHTTP(mw, r)
		return
	case req.Method == methodCancelled:
		if k, ok := cancelledID(req.Params); ok {
			g.mu.Lock()
			if mw := g.streams[sid+"\x00"+k]; mw != nil {
				mw.mute()
			}
			g.mu.Unlock()
		}
	}
	g.h.ServeHTTP(w, r)
}

// mutableWriter passes a response through until muted, then discards what is written
// (the muted writes report success: the SDK needs to know nothing).
type mutableWriter struct {
	http.ResponseWriter
	mu    sync.Mutex
	muted atomic.Bool
}

func (w *mutableWriter) mute() {
	w.mu.Lock() // after a write under way
	w.muted.Store(true)
	w.mu.Unlock()
}

func (w *mutableWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.muted.Load() {
		return len(p), nil
	}
	return w.ResponseWriter.Write(p)
}

func (w *mutableWriter) WriteHeader(code int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.muted.Load() {
		w.ResponseWriter.WriteHeader(code)
	}
}

func (w *mutableWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if f, ok := w.ResponseWriter.(http.Flusher); ok && !w.muted.Load() {
		f.Flush()
	}
}

func (w *mutableWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
