package e2b

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
	"strconv"
	"strings"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
)

// The control plane: E2B's REST API (spec/openapi.yml of e2b-dev/infra), with the
// X-API-Key header on every request.

// APIError is an answer of the E2B API other than success: its HTTP status and the
// {"code","message"} body every endpoint uses.
type APIError struct {
	Status    int
	Message   string
	ErrorCode string // the optional semantic error_code (placement failures)
	Op        string // what was being done: "create sandbox", "set timeout of xyz", ...
	Sandbox   string // the sandbox the request addressed, if any
}

func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	if e.ErrorCode != "" {
		msg += " (" + e.ErrorCode + ")"
	}
	return fmt.Sprintf("E2B API: %s: HTTP %d: %s", e.Op, e.Status, msg)
}

// Unwrap classifies the answer: a missing sandbox is closed, a service that cannot serve
// now is unavailable (a chain gives way), anything else is the caller's to fix.
func (e *APIError) Unwrap() error {
	switch {
	case e.Status == http.StatusNotFound && e.Sandbox != "":
		return sandbox.ErrClosed
	case e.Status == http.StatusTooManyRequests, e.Status >= 500:
		return sandbox.ErrUnavailable
	}
	return nil
}

// api is a client of the control plane. It is safe for concurrent use.
type api struct {
	base    string // https://api.e2b.app
	key     string
	hc      *http.Client
	timeout time.Duration // per request, including 429 waits
	// answer bounds how long the requests that decide the service's availability (create,
	// the template listing) wait for the answer to begin (e2b.connect_timeout): a service
	// that accepts the connection and never answers gives way in a chain within it, not
	// only after timeout.
	answer time.Duration
}

// errNoAnswer is the cause of a request given up because its answer did not begin within
// api.answer.
var errNoAnswer = errors.New("no answer")

// errUnreachable marks a request that never reached the service.
type unreachableError struct {
	base string
	err  error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot reach the E2B API at %s: %v", e.base, e.err)
}
func (e *unreachableError) Unwrap() []error { return []error{sandbox.ErrUnavailable, e.err} }

// do sends one request and decodes a JSON answer into out (nil: none expected). A 429 is
// retried after its Retry-After, as long as the wait ends within the request's deadline
// (ctx's, or the client's own timeout); any other failure is returned at once.
func (a *api) do(ctx context.Context, op, id, method, path string, q url.Values, in, out any) (int, error) {
	return a.send(ctx, 0, op, id, method, path, q, in, out)
}

// send is do with the answer's beginning (the response header) bounded by within when > 0.
func (a *api) send(ctx context.Context, within time.Duration, op, id, method, path string, q url.Values, in, out any) (int, error) {
	return a.sendHeader(ctx, within, op, id, method, path, q, in, out, nil)
}

// sendHeader is send that also gives the answer's header (hdr, when not nil).
func (a *api) sendHeader(ctx context.Context, within time.Duration, op, id, method, path string, q url.Values, in, out any, hdr *http.Header) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return 0, fmt.Errorf("E2B API: %s: encode request: %w", op, err)
		}
	}
	u := a.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	for {
		rctx, stopAnswer := ctx, func() bool { return true }
		if within > 0 && within < a.timeout {
			var cancelReq context.CancelCauseFunc
			rctx, cancelReq = context.WithCancelCause(ctx)
			defer cancelReq(nil)
			stopAnswer = time.AfterFunc(within, func() { cancelReq(errNoAnswer) }).Stop
		}
		req, err := http.NewRequestWithContext(rctx, method, u, bytes.NewReader(body))
		if err != nil {
			return 0, fmt.Errorf("E2B API: %s: %w", op, err)
		}
		req.Header.Set("X-API-Key", a.key)
		req.Header.Set("Accept", "application/json")
		if in != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := a.hc.Do(req)
		if answered := stopAnswer(); !answered || errors.Is(context.Cause(rctx), errNoAnswer) {
			// The answer did not begin in time (a timer that fired as it began counts too:
			// its body may be cut): the service cannot serve now.
			if resp != nil {
				resp.Body.Close()
			}
			if err == nil {
				err = errNoAnswer
			}
			return 0, fmt.Errorf("E2B API: %s: no answer within %s (e2b.connect_timeout): %w", op, within, errors.Join(sandbox.ErrUnavailable, err))
		}
		if err != nil {
			if ctx.Err() != nil && !errors.Is(context.Cause(ctx), context.Canceled) {
				// Connected but got no answer in time (a hang): the service cannot serve.
				return 0, fmt.Errorf("E2B API: %s: no answer within %s: %w", op, a.timeout, errors.Join(sandbox.ErrUnavailable, err))
			}
			if ctx.Err() != nil {
				return 0, fmt.Errorf("E2B API: %s: %w", op, ctx.Err())
			}
			return 0, fmt.Errorf("E2B API: %s: %w", op, &unreachableError{base: a.base, err: err})
		}
		if resp.StatusCode == http.StatusTooManyRequests {
			wait, ok := retryAfter(resp.Header.Get("Retry-After"))
			resp.Body.Close()
			dl, _ := ctx.Deadline()
			if ok && time.Now().Add(wait).Before(dl) {
				t := time.NewTimer(wait)
				select {
				case <-t.C:
					continue
				case <-ctx.Done():
					t.Stop()
				}
			}
			return resp.StatusCode, &APIError{Status: resp.StatusCode, Op: op, Sandbox: id,
				Message: fmt.Sprintf("rate limited (Retry-After %q), and the wait would pass the request's deadline", resp.Header.Get("Retry-After"))}
		}
		if hdr != nil {
			*hdr = resp.Header.Clone()
		}
		err = decode(resp, op, out)
		if e, ok := err.(*APIError); ok {
			e.Sandbox = id
		}
		return resp.StatusCode, err
	}
}

// decode reads a success into out, or the error body into *APIError.
func decode(resp *http.Response, op string, out any) error {
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return fmt.Errorf("E2B API: %s: read answer: %w", op, err)
	}
	if resp.StatusCode/100 != 2 {
		e := &APIError{Status: resp.StatusCode, Op: op}
		var body struct {
			Message   string `json:"message"`
			ErrorCode string `json:"error_code"`
		}
		if json.Unmarshal(b, &body) == nil && body.Message != "" {
			e.Message, e.ErrorCode = body.Message, body.ErrorCode
		} else {
			e.Message = strings.TrimSpace(string(b[:min(len(b), 512)]))
		}
		return e
	}
	if out == nil || len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("E2B API: %s: decode answer: %w", op, err)
	}
	return nil
}

// retryAfter parses Retry-After: delay seconds or an HTTP date.
func retryAfter(v string) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s >= 0 {
		return time.Duration(s) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0), true
	}
	return 0, false
}

// ---- wire types (JSON field names as in the OpenAPI spec)

type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             int               `json:"timeout,omitempty"`
	Metadata            map[string]string `json:"metadata,omitempty"`
	EnvVars             map[string]string `json:"envVars,omitempty"`
	AllowInternetAccess *bool             `json:"allow_internet_access,omitempty"`
	AutoPause           *bool             `json:"autoPause,omitempty"`
	Network             *networkConfig    `json:"network,omitempty"`
}

type networkConfig struct {
	AllowPublicTraffic *bool    `json:"allowPublicTraffic,omitempty"`
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
}

type sandboxCreated struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID,omitempty"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken,omitempty"`
	Domain             *string `json:"domain,omitempty"`
}

type sandboxDetail struct {
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	SandboxID   string            `json:"sandboxID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	EnvdVersion string            `json:"envdVersion,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	State       string            `json:"state"`
}

type timeoutBody struct {
	Timeout int `json:"timeout"`
}

// Template is a template's size as the API reports it (GET /templates).
type Template struct {
	TemplateID string   `json:"templateID"`
	Aliases    []string `json:"aliases,omitempty"`
	Names      []string `json:"names,omitempty"`
	CPUCount   int      `json:"cpuCount"`
	MemoryMB   int      `json:"memoryMB"`
}

func (a *api) create(ctx context.Context, in newSandbox) (sandboxCreated, error) {
	var out sandboxCreated
	_, err := a.send(ctx, a.answer, "create sandbox from template "+strconv.Quote(in.TemplateID), "", http.MethodPost, "/v2/sandboxes", nil, in, &out)
	if err == nil && out.SandboxID == "" {
		err = fmt.Errorf("E2B API: create sandbox: the answer names no sandbox")
	}
	return out, err
}

func (a *api) get(ctx context.Context, id string) (sandboxDetail, error) {
	var out sandboxDetail
	_, err := a.do(ctx, "get sandbox "+id, id, http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil, nil, &out)
	return out, err
}

func (a *api) setTimeout(ctx context.Context, id string, seconds int) error {
	_, err := a.do(ctx, "set timeout of sandbox "+id, id, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/timeout", nil, timeoutBody{Timeout: seconds}, nil)
	return err
}

// kill deletes a sandbox; one that is gone already is not an error.
func (a *api) kill(ctx context.Context, id string) error {
	status, err := a.do(ctx, "kill sandbox "+id, id, http.MethodDelete, "/sandboxes/"+url.PathEscape(id), nil, nil, nil)
	if status == http.StatusNotFound {
		return nil
	}
	return err
}

func (a *api) templates(ctx context.Context) ([]Template, error) {
	var out []Template
	_, err := a.send(ctx, a.answer, "list templates", "", http.MethodGet, "/templates", nil, nil, &out)
	return out, err
}

// running counts the team's running sandboxes (GET /v2/sandboxes, X-Total-Running).
func (a *api) running(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+"/v2/sandboxes?state=running&limit=1", nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-API-Key", a.key)
	resp, err := a.hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("E2B API: count running sandboxes: %w", &unreachableError{base: a.base, err: err})
	}
	if resp.StatusCode != http.StatusOK {
		return 0, decode(resp, "count running sandboxes", nil)
	}
	resp.Body.Close()
	n, err := strconv.Atoi(resp.Header.Get("X-Total-Running"))
	if err != nil {
		return 0, fmt.Errorf("E2B API: count running sandboxes: no X-Total-Running header")
	}
	return n, nil
}

// isUnreachable reports whether err is a request that never reached the service, or
// reached nothing that answered.
func isUnreachable(err error) bool {
	var u *unreachableError
	var ne net.Error
	return errors.As(err, &u) || (errors.As(err, &ne) && ne.Timeout())
}
