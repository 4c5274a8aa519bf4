// Package webfetch fetches web pages for plugins granted the web capability
// (toolhost_web.fetch), through the same egress gateway that is a sandbox's only way out.
//
// A fetch never dials anything itself. Each one makes the gateway's side of a "sandbox"
// of its own, whose policy is the plugin's web scope (narrowing the host's egress policy
// when there is one), and speaks to it as a sandbox's curl would: an HTTP forward proxy
// for http URLs and a CONNECT tunnel for https, over an in-memory pipe. So the gateway
// decides every destination exactly as it does a sandbox's: the name against the rules
// before any lookup, every address the gateway's own resolver returns checked just before
// it connects (loopback, private, link-local and metadata, the host's own addresses are
// refused whatever name led there), the TLS server name against the target. Every
// redirect is a new request through the gateway, decided again. What the gateway refused
// comes back as its own sentence, for the model.
//
// The answer is bounded: the body at the caller's byte limit (read no further, so a
// response that never ends or a compression bomb costs no more), the headers at 64 KiB,
// the whole fetch by the caller's context, the redirects at MaxRedirects.
package webfetch

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/policy"
)

// Defaults of Config.
const (
	DefaultMaxRedirects = 5
	// maxHeaderBytes bounds a response's headers.
	maxHeaderBytes = 64 << 10
	// maxConns bounds the gateway connections of one fetch (one per redirect hop at most).
	maxConns = 4
	// UserAgent is what a fetch says it is.
	UserAgent = "toolhost-web_fetch/1 (an agent's tool; +https://github.com/toolhost/toolhost)"
)

// Config configures a Fetcher.
type Config struct {
	// Gateway decides and makes every connection; required.
	Gateway *egress.Gateway
	// Base is the host's own egress policy (the sandboxes'); every plugin's scope narrows
	// it, never widens it. nil: a plugin's web scope alone decides (with the gateway's
	// addresses that are always refused).
	Base *egress.Policy
	// RootCAs verify the servers of https URLs; nil is the host's roots.
	RootCAs *x509.CertPool
	// MaxRedirects bounds the redirects one fetch follows; 0 is DefaultMaxRedirects.
	MaxRedirects int
}

// Fetcher implements host.Fetcher over the egress gateway.
type Fetcher struct {
	cfg Config
}

var _ host.Fetcher = (*Fetcher)(nil)

// New makes a Fetcher.
func New(cfg Config) (*Fetcher, error) {
	if cfg.Gateway == nil {
		return nil, errors.New("webfetch: no egress gateway")
	}
	if cfg.MaxRedirects <= 0 {
		cfg.MaxRedirects = DefaultMaxRedirects
	}
	return &Fetcher{cfg: cfg}, nil
}

// Spec is the egress policy a web scope stands for: its entries as they are, and left
// out, what the registries preset names (the sandboxes' default).
func Spec(w *policy.Web) egress.Spec {
	if w == nil {
		return egress.Spec{Preset: egress.PresetRegistries}
	}
	return egress.Spec{Preset: w.Preset, Allow: w.Allow, Deny: w.Deny, Ports: w.Ports}
}

// Check compiles a web scope: the error names the entry that is wrong. Configuration
// checks it at load.
func Check(w *policy.Web) error {
	_, err := egress.Compile(Spec(w))
	return err
}

// policy is the compiled policy of a plugin's scope (compiled at each fetch: it costs
// microseconds, against a fetch's milliseconds).
func (f *Fetcher) policy(w *policy.Web) (*egress.Policy, error) {
	var p *egress.Policy
	var err error
	if f.cfg.Base != nil {
		p, err = f.cfg.Base.Narrow(Spec(w))
	} else {
		p, err = egress.Compile(Spec(w))
	}
	if err != nil {
		return nil, fmt.Errorf("the plugin's web scope: %w", err)
	}
	return p, nil
}

// proxyURL names the gateway to the transport; the name is never resolved (DialContext
// ignores it and opens a pipe to the gateway).
var proxyURL = &url.URL{Scheme: "http", Host: "egress.gateway.invalid:3128"}

// Fetch implements host.Fetcher.
func (f *Fetcher) Fetch(ctx context.Context, target host.FetchTarget, req abi.FetchRequest) (host.FetchResponse, error) {
	pol, err := f.policy(target.Scope)
	if err != nil {
		return host.FetchResponse{}, err
	}
	// The gateway's side of this fetch: a client of its own (its connections, its
	// refusals), closed when the fetch ends, which ends every connection it still has.
	gc, err := f.cfg.Gateway.NewClient(egress.ClientConfig{
		Sandbox: "plugin " + target.Plugin,
		Project: target.Project,
		Policy:  pol,
		Limits:  egress.Limits{MaxConns: maxConns},
	})
	if err != nil {
		return host.FetchResponse{}, err
	}
	tag := newTag()
	// serving counts the goroutines serving the gateway's ends of the pipes: owned by this
	// call, which closes the client (ending them) and waits for them before it returns.
	var serving sync.WaitGroup
	defer serving.Wait()
	defer gc.Close()
	tr := &http.Transport{
		Proxy: http.ProxyURL(proxyURL),
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			mine, gws := net.Pipe()
			serving.Add(1)
			go func() {
				defer serving.Done()
				gc.ServeConn(gws, egress.ConnInfo{Command: tag})
			}()
			return mine, nil
		},
		TLSClientConfig:        &tls.Config{RootCAs: f.cfg.RootCAs, MinVersion: tls.VersionTLS12},
		MaxResponseHeaderBytes: maxHeaderBytes,
		DisableKeepAlives:      true,
		MaxConnsPerHost:        1,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{
		Transport: tr,
		CheckRedirect: func(next *http.Request, via []*http.Request) error {
			if len(via) > f.cfg.MaxRedirects {
				return fmt.Errorf("stopped after %d redirects (the last to %s)", f.cfg.MaxRedirects, next.URL.Redacted())
			}
			if next.URL.Scheme != "http" && next.URL.Scheme != "https" {
				return fmt.Errorf("a redirect to %s, which is not an http or https URL, was not followed", next.URL.Redacted())
			}
			if next.URL.User != nil {
				return fmt.Errorf("a redirect to a URL with a user name or password was not followed")
			}
			return nil
		},
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, req.URL, nil)
	if err != nil {
		return host.FetchResponse{}, fmt.Errorf("not a URL: %w", err)
	}
	accept := req.Accept
	if accept == "" {
		accept = "text/html, text/markdown, text/plain, application/json;q=0.9, */*;q=0.5"
	}
	hreq.Header.Set("Accept", accept)
	hreq.Header.Set("User-Agent", UserAgent)

	resp, err := client.Do(hreq)
	if rs := gc.TakeRefusals(tag); len(rs) > 0 {
		if resp != nil {
			resp.Body.Close()
		}
		return host.FetchResponse{}, refusal(rs)
	}
	if err != nil {
		if ctx.Err() != nil {
			return host.FetchResponse{}, ctx.Err()
		}
		return host.FetchResponse{}, cleanErr(err)
	}
	defer resp.Body.Close()
	max := req.MaxBytes
	if max <= 0 {
		max = host.DefaultFetchBytes
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, int64(max)+1))
	if rs := gc.TakeRefusals(tag); len(rs) > 0 { // the budget, or a tunnel cut half way
		return host.FetchResponse{}, refusal(rs)
	}
	if err != nil {
		if ctx.Err() != nil {
			return host.FetchResponse{}, ctx.Err()
		}
		return host.FetchResponse{}, fmt.Errorf("reading the answer of %s: %w", resp.Request.URL.Redacted(), cleanErr(err))
	}
	out := host.FetchResponse{
		URL:         resp.Request.URL.Redacted(),
		Status:      resp.StatusCode,
		ContentType: resp.Header.Get("Content-Type"),
		Body:        body,
	}
	if len(body) > max {
		out.Body, out.Truncated = body[:max], true
	}
	return out, nil
}

// refusal is the error of a fetch the gateway refused: its sentences, each once.
func refusal(rs []egress.Refusal) error {
	seen := map[string]bool{}
	var reasons []string
	for _, r := range rs {
		if !seen[r.Reason] {
			seen[r.Reason] = true
			reasons = append(reasons, plugReason(r.Reason))
		}
	}
	return fmt.Errorf("%w: %s", host.ErrRefused, strings.Join(reasons, "; "))
}

// plugReason rewords the gateway's sentence for a fetch: the list to ask for is the
// plugin's web scope, not the sandbox's, and what is never reached is never reached by a
// fetch either.
func plugReason(reason string) string {
	reason = strings.TrimPrefix(reason, "egress: ")
	reason = strings.ReplaceAll(reason, "sandbox.egress.allow", "the web_fetch plugin's web.allow")
	return strings.ReplaceAll(reason, "which a sandbox may never reach", "which is never fetched")
}

// cleanErr keeps what a model can use of a transport error: Go's url.Error names the
// pretend proxy, which is none of the model's business.
func cleanErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	msg := strings.ReplaceAll(err.Error(), proxyURL.Host, "the egress gateway")
	return errors.New(msg)
}

func newTag() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "fetch-" + hex.EncodeToString(b[:])
}
