package sessionapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/daemon"
)

// Client talks to a daemon over its socket.
type Client struct {
	hc     *http.Client
	digest string
}

// NewClient is a client of the daemon reached by dial (a unix socket), sending digest as
// its configuration's.
func NewClient(dial func(ctx context.Context) (net.Conn, error), digest string) *Client {
	tr := &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		MaxIdleConns:        2,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
		TLSHandshakeTimeout: time.Second,
	}
	return &Client{hc: &http.Client{Transport: tr}, digest: digest}
}

// Close drops the client's idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// StatusError is an error answer of the daemon.
type StatusError struct {
	Status int
	Msg    string
}

func (e *StatusError) Error() string { return e.Msg }

// Status is the HTTP status of err when the daemon answered with an error, else 0.
func Status(err error) int {
	if se, ok := errors.AsType[*StatusError](err); ok {
		return se.Status
	}
	return 0
}

// Unreachable reports whether err says no daemon answered on the socket (none runs, or
// it exited between the request and its answer). A socket refused as not this user's
// daemon (daemon.ErrUntrusted) is not: no daemon should be started in its place, and no
// caller should take it for "no sessions".
func Unreachable(err error) bool {
	if err == nil || Status(err) != 0 || errors.Is(err, daemon.ErrUntrusted) {
		return false
	}
	var ue *url.Error
	return errors.As(err, &ue) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://toolhost"+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.digest != "" {
		req.Header.Set(ConfigDigestHeader, c.digest)
	}
	resp, err := c.hc.Do(req)
	if ue, ok := errors.AsType[*url.Error](err); ok && errors.Is(err, daemon.ErrUntrusted) {
		return ue.Err // the refusal says it all; no request was made
	}
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("reading the session daemon's answer: %w", err)
	}
	if resp.StatusCode >= 300 {
		var e Error
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(b))
		}
		return &StatusError{Status: resp.StatusCode, Msg: e.Error}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("the session daemon's answer does not decode: %w", err)
	}
	return nil
}

// Info describes the daemon.
func (c *Client) Info(ctx context.Context) (Info, error) {
	var i Info
	return i, c.do(ctx, http.MethodGet, "/v1/daemon", nil, &i)
}

// Start opens a session and returns it once its sandbox is ready.
func (c *Client) Start(ctx context.Context, r StartRequest) (Held, error) {
	var s Held
	return s, c.do(ctx, http.MethodPost, "/v1/sessions", r, &s)
}

// List returns the daemon's sessions.
func (c *Client) List(ctx context.Context) ([]Held, error) {
	var l List
	err := c.do(ctx, http.MethodGet, "/v1/sessions", nil, &l)
	return l.Sessions, err
}

// Call runs one tool call in session id.
func (c *Client) Call(ctx context.Context, id, tool string, input json.RawMessage) (abi.Result, error) {
	var r abi.Result
	return r, c.do(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/calls", CallRequest{Tool: tool, Input: input}, &r)
}

// OneShot runs one tool call as a session of its own (OneShotRequest).
func (c *Client) OneShot(ctx context.Context, r OneShotRequest) (abi.Result, error) {
	var res abi.Result
	return res, c.do(ctx, http.MethodPost, "/v1/calls", r, &res)
}

// Commit saves a snapshot of session id's workspace.
func (c *Client) Commit(ctx context.Context, id, label string) (Snapshot, error) {
	var s Snapshot
	return s, c.do(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/commit", CommitRequest{Label: label}, &s)
}

// Stop ends session id: its workspace committed, its sandbox closed.
func (c *Client) Stop(ctx context.Context, id string) (Snapshot, error) {
	var s Snapshot
	return s, c.do(ctx, http.MethodDelete, "/v1/sessions/"+url.PathEscape(id), nil, &s)
}
