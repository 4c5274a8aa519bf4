package host

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/policy"
)

// toolhost_web.fetch: a plugin granted web reads pages of the web, never through the
// sandbox (which may have no network at all) but through the host's egress gateway, which
// decides every destination against the plugin's own egress scope (policy.Web), resolves
// names itself and never connects to a private, link-local or host address. The host
// only decodes, audits and bounds the call; the Fetcher does the rest.

// Defaults and bounds of a fetch.
const (
	DefaultFetchBytes   = 5 << 20
	DefaultFetchTimeout = 30 * time.Second
)

// ErrRefused: the egress gateway refused a fetch's destination. The error's message is
// the gateway's reason, written for the model.
var ErrRefused = errors.New("refused by the egress gateway")

// FetchTarget is who fetches: the plugin and its egress scope (nil: the Fetcher's
// default).
type FetchTarget struct {
	Plugin string
	// Project is the session's project ("" outside a session): the gateway counts and
	// audits the fetch under it.
	Project string
	Scope   *policy.Web
}

// FetchResponse is what a fetch got.
type FetchResponse struct {
	URL         string // after redirects
	Status      int
	ContentType string
	Body        []byte
	Truncated   bool
}

// Fetcher fetches web pages for plugins granted web (internal/webfetch implements it over
// the egress gateway).
type Fetcher interface {
	// Fetch GETs req.URL within target's scope, following redirects (each one decided
	// again), keeping at most req.MaxBytes of the body and giving up at req.TimeoutMS.
	// A destination the scope or the gateway refuses is an error wrapping ErrRefused whose
	// message is the gateway's reason.
	Fetch(ctx context.Context, target FetchTarget, req abi.FetchRequest) (FetchResponse, error)
}

func (h *Host) decodeFetch(_ context.Context, inst *instance, stack []uint64, c *hostCall) bool {
	c.outPtr, c.outCap = uint32(stack[2]), uint32(stack[3])
	req := &c.fetch
	if !inst.jsonArg(stack, c, "fetch", maxInputBytes, req) {
		return false
	}
	c.req.Key = req.URL // the audit names what was fetched
	u, err := url.Parse(req.URL)
	switch {
	case err != nil:
		stack[0] = inst.status(abi.StatusInvalid, "fetch %s: not a URL: %v", req.URL, err)
		return false
	case u.Scheme != "http" && u.Scheme != "https":
		stack[0] = inst.status(abi.StatusInvalid, "fetch %s: only http and https URLs can be fetched", req.URL)
		return false
	case u.Host == "":
		stack[0] = inst.status(abi.StatusInvalid, "fetch %s: the URL has no host", req.URL)
		return false
	case u.User != nil:
		stack[0] = inst.status(abi.StatusInvalid, "fetch %s: a URL with a user name or password is refused", req.URL)
		return false
	}
	if req.MaxBytes <= 0 || req.MaxBytes > DefaultFetchBytes {
		req.MaxBytes = DefaultFetchBytes
	}
	if req.TimeoutMS <= 0 || time.Duration(req.TimeoutMS)*time.Millisecond > DefaultFetchTimeout {
		req.TimeoutMS = int(DefaultFetchTimeout / time.Millisecond)
	}
	return true
}

func (h *Host) fetch(ctx context.Context, inst *instance, c *hostCall) uint64 {
	req := c.fetch
	if h.cfg.Fetcher == nil {
		return inst.status(abi.StatusIO, "fetch %s: this host has no web access (no egress gateway is configured)", req.URL)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(req.TimeoutMS)*time.Millisecond)
	defer cancel()
	target := FetchTarget{Plugin: inst.p.name, Scope: inst.p.spec.Scope.Web}
	if inst.session != nil {
		target.Project = inst.session.project
	}
	res, err := h.cfg.Fetcher.Fetch(ctx, target, req)
	switch {
	case errors.Is(err, ErrRefused):
		return inst.status(abi.StatusPermission, "%s", err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return inst.status(abi.StatusTimeout, "fetch %s: no answer within %d s", req.URL, req.TimeoutMS/1000)
	case err != nil:
		return inst.status(abi.StatusIO, "fetch %s: %v", req.URL, err)
	}
	body := h.secrets.redactBytes(res.Body)
	hdr, _ := json.Marshal(abi.FetchReply{URL: res.URL, Status: res.Status, ContentType: res.ContentType, BodyLen: len(body), Truncated: res.Truncated})
	out := make([]byte, 0, len(hdr)+1+len(body))
	return inst.reply(c.outPtr, c.outCap, append(append(append(out, hdr...), '\n'), body...))
}
