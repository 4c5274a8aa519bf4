package e2b

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
)

// Sandboxes outlive the process that created them: an E2B sandbox runs on E2B's fleet until
// its end time, whoever holds it. So another process can reconnect to one
// (sandbox.Reconnector: POST /sandboxes/{id}/connect, always with an explicit timeout),
// list the sandboxes of a project by their metadata (sandbox.Lister: GET /v2/sandboxes
// with the metadata filter) and kill one a dead process left behind (sandbox.Killer).

var (
	_ sandbox.Reconnector = (*Provider)(nil)
	_ sandbox.Lister      = (*Provider)(nil)
	_ sandbox.Killer      = (*Provider)(nil)
	_ sandbox.Reconnector = (*projectProvider)(nil)
	_ sandbox.Lister      = (*projectProvider)(nil)
	_ sandbox.Killer      = (*projectProvider)(nil)
)

// sandboxIDRE is what an E2B sandbox ID looks like (20 characters of [a-z0-9] today; a
// self-hosted cluster's may be longer). Anything else, a local sandbox's "local-..." say,
// is not E2B's, and never reaches a URL path.
var sandboxIDRE = regexp.MustCompile(`^[a-z0-9]{8,64}$`)

// maxListPages bounds the pages one List reads (100 sandboxes each): a paging token that
// never ends cannot hang it.
const maxListPages = 50

func (p *Provider) foreign(op, id string) error {
	return fmt.Errorf("%s %q: not an E2B sandbox ID: %w", op, id, sandbox.ErrForeign)
}

// Reconnect attaches to the running (or paused: it resumes) sandbox id, left by any
// process (sandbox.Reconnector). It first reads the sandbox's metadata (GET
// /sandboxes/{id}) and refuses, untouched, one that lacks opts.Labels (ErrForeign); then
// connects with an explicit timeout, which only ever extends the sandbox. A sandbox E2B
// no longer has gives an error wrapping sandbox.ErrGone.
func (p *Provider) Reconnect(ctx context.Context, id string, opts sandbox.ReconnectOptions) (sandbox.Sandbox, error) {
	sb, err := p.reconnect(ctx, id, opts, p.project)
	if err != nil {
		return nil, err
	}
	return sb, nil
}

func (pp *projectProvider) Reconnect(ctx context.Context, id string, opts sandbox.ReconnectOptions) (sandbox.Sandbox, error) {
	sb, err := pp.p.reconnect(ctx, id, opts, pp.project)
	if err != nil {
		return nil, err
	}
	return sb, nil
}

func (p *Provider) reconnect(ctx context.Context, id string, opts sandbox.ReconnectOptions, project string) (*Sandbox, error) {
	const op = "reconnect to E2B sandbox"
	if !sandboxIDRE.MatchString(id) {
		return nil, p.foreign(op, id)
	}
	if p.cfg.APIKey == "" {
		return nil, ErrNoAPIKey
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = p.cfg.DefaultTimeout
	}
	if timeout > p.cfg.Plan.MaxLifetime {
		return nil, fmt.Errorf("%s %s: timeout %s exceeds the E2B plan's maximum sandbox lifetime of %s", op, id, timeout, p.cfg.Plan.MaxLifetime)
	}
	began := time.Now()
	detail, err := p.api.get(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", op, id, gone(err))
	}
	for k, v := range opts.Labels {
		if got, ok := detail.Metadata[k]; !ok || got != v {
			return nil, fmt.Errorf("%s %s: its metadata %s is %q, not %q: it is not this one's to take: %w", op, id, k, got, v, sandbox.ErrForeign)
		}
	}
	created, status, err := p.api.connect(ctx, id, int(math.Ceil(timeout.Seconds())))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", op, id, gone(err))
	}
	if created.SandboxID != id {
		return nil, fmt.Errorf("%s %s: E2B answered for sandbox %q", op, id, created.SandboxID)
	}
	tmpl := Template{TemplateID: detail.TemplateID, CPUCount: detail.CPUCount, MemoryMB: detail.MemoryMB}
	sb, err := p.open(ctx, created, tmpl, project, timeout, began)
	if err != nil {
		// Not ours to kill: it runs what another process left, and stays for whoever can
		// reach it (until its end time).
		return nil, fmt.Errorf("%s %s: %w", op, id, err)
	}
	// What runs in it was there before this process came: the workspace holds work.
	sb.touched.Store(true)
	how := "running"
	if status == http.StatusCreated {
		how = "resumed"
	}
	p.log.Info("E2B sandbox reconnected", "sandbox", id, "how", how, "template", tmpl.TemplateID,
		"started", sb.StartedAt().UTC().Format(time.RFC3339), "ends", sb.EndsAt().UTC().Format(time.RFC3339), "took", time.Since(began))
	return sb, nil
}

// gone makes a 404 of the API about a sandbox an error wrapping sandbox.ErrGone too.
func gone(err error) error {
	var ae *APIError
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
		return errors.Join(err, sandbox.ErrGone)
	}
	return err
}

// List lists the team's sandboxes, running and paused, that carry every metadata entry
// of filter (sandbox.Lister), whichever process created them.
func (p *Provider) List(ctx context.Context, filter map[string]string) ([]sandbox.SandboxInfo, error) {
	if p.cfg.APIKey == "" {
		return nil, ErrNoAPIKey
	}
	var out []sandbox.SandboxInfo
	token := ""
	for range maxListPages {
		page, next, err := p.api.list(ctx, filter, token)
		if err != nil {
			return nil, fmt.Errorf("list E2B sandboxes: %w", err)
		}
		for _, d := range page {
			if !sandboxIDRE.MatchString(d.SandboxID) {
				continue
			}
			out = append(out, sandbox.SandboxInfo{ID: d.SandboxID, Labels: d.Metadata, State: d.State,
				StartedAt: d.StartedAt, EndsAt: d.EndAt})
		}
		if next == "" {
			return out, nil
		}
		token = next
	}
	return out, fmt.Errorf("list E2B sandboxes: more than %d pages", maxListPages)
}

func (pp *projectProvider) List(ctx context.Context, filter map[string]string) ([]sandbox.SandboxInfo, error) {
	return pp.p.List(ctx, filter)
}

// Kill kills the sandbox id, whichever process created it (sandbox.Killer); one E2B no
// longer has is not an error.
func (p *Provider) Kill(ctx context.Context, id string) error {
	if !sandboxIDRE.MatchString(id) {
		return p.foreign("kill E2B sandbox", id)
	}
	if p.cfg.APIKey == "" {
		return ErrNoAPIKey
	}
	if err := p.api.kill(ctx, id); err != nil {
		return fmt.Errorf("kill E2B sandbox %s: %w", id, err)
	}
	if q := p.cfg.Quota; q != nil {
		q.Closed(ctx, id, time.Now(), p.log)
	}
	p.log.Info("E2B sandbox killed by ID", "sandbox", id)
	return nil
}

func (pp *projectProvider) Kill(ctx context.Context, id string) error { return pp.p.Kill(ctx, id) }

// connect is POST /sandboxes/{id}/connect with the timeout always sent: 200 for a running
// sandbox (its end time only ever extended), 201 for a paused one resumed.
func (a *api) connect(ctx context.Context, id string, seconds int) (sandboxCreated, int, error) {
	var out sandboxCreated
	status, err := a.do(ctx, "connect to sandbox "+id, id, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/connect", nil, timeoutBody{Timeout: seconds}, &out)
	return out, status, err
}

// list reads one page of GET /v2/sandboxes, running and paused, filtered by metadata as
// the official SDKs encode it: each key and value escaped, the pairs joined as a query,
// and that whole query the value of the metadata parameter (E2B unescapes the parameter,
// then each key and value).
func (a *api) list(ctx context.Context, filter map[string]string, token string) ([]sandboxDetail, string, error) {
	q := url.Values{"state": {"running,paused"}, "limit": {"100"}}
	if len(filter) > 0 {
		pairs := url.Values{}
		for k, v := range filter {
			pairs.Set(url.QueryEscape(k), url.QueryEscape(v))
		}
		q.Set("metadata", pairs.Encode())
	}
	if token != "" {
		q.Set("nextToken", token)
	}
	var out []sandboxDetail
	var hdr http.Header
	_, err := a.sendHeader(ctx, 0, "list sandboxes", "", http.MethodGet, "/v2/sandboxes", q, nil, &out, &hdr)
	if err != nil {
		return nil, "", err
	}
	return out, strings.TrimSpace(hdr.Get("X-Next-Token")), nil
}
