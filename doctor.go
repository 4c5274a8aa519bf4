package toolhost

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/lease"
	"github.com/toolhost/toolhost/internal/module"
	"github.com/toolhost/toolhost/internal/screenshot"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// Check is one finding of Doctor: a part of the configuration and whether it is usable
// here (Name, OK, Needed, Detail; see the type it stands for).
type Check = module.Check

// Doctor checks what cfg needs on this machine, each part for real: it loads the
// plugins, starts a tiny local sandbox and runs commands in it (when sandbox.provider
// names local), reports how its limits are enforced, looks for the browser, writes, reads
// and deletes a probe object in the store (and checks it keeps project leases), and, only
// when sandbox.provider names e2b, asks E2B whether the API key is accepted. Every check
// ends by ctx.
func Doctor(ctx context.Context, cfg Config, opts ...Option) []Check {
	if err := cfg.Validate(); err != nil {
		return []Check{{Name: "config", Needed: true, Detail: err.Error()}}
	}
	o := newOptions(opts)
	quiet := slog.New(slog.DiscardHandler)
	var out []Check
	out = append(out, doctorPlugins(ctx, &cfg, o))
	out = append(out, doctorNetwork(ctx, &cfg, o))
	out = append(out, doctorBrowser(&cfg))
	stores, st := doctorStore(ctx, &cfg, quiet)
	out = append(out, stores...)
	if st != nil {
		defer st.Close()
	}
	// Each provider sandbox.provider names checks what it needs, with the store when it
	// opened (a provider may keep records in it).
	names := ProviderNamesOf(cfg.Sandbox.Provider)
	env := module.Env{Logger: quiet, DataDir: cfg.DataDir, Settings: cfg.settings()}
	if st != nil {
		env.Store, env.StoreShared = st.store, st.shared
	}
	for _, name := range names {
		if m, ok := module.LookupProvider(name); ok {
			out = append(out, m.Doctor(ctx, cfg.Module(name), env, len(names) == 1)...)
		}
	}
	return out
}

func doctorPlugins(ctx context.Context, cfg *Config, o options) Check {
	c := Check{Name: "plugins", Needed: true}
	t := &Toolhost{cfg: cloneConfig(*cfg), opts: o}
	specs, err := t.pluginSpecs()
	if err != nil {
		c.Detail = err.Error()
		return c
	}
	h, err := host.New(ctx, host.Config{
		DataDir: cfg.DataDir, Plugins: specs, MemoryLimitMiB: cfg.Limits.MemoryMiB, CallTimeout: cfg.Limits.CallTimeout,
		PoolSize: cfg.Limits.PoolSize, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		c.Detail = fmt.Sprintf("loading the plugins: %v (fix the plugins list, or leave it out for the built-ins)", err)
		return c
	}
	defer h.Close(context.WithoutCancel(ctx))
	// Compiled, not only registered: a plugin that does not compile is found here, and
	// the compilation cache is filled for the first calls.
	if err := h.Ready(ctx); err != nil {
		c.Detail = fmt.Sprintf("compiling the plugins: %v", err)
		return c
	}
	var names []string
	for _, p := range h.Plugins() {
		names = append(names, p.Name+" "+p.Version)
	}
	c.OK, c.Detail = true, fmt.Sprintf("%d loaded and compiled (%s), %d tools", len(names), strings.Join(names, ", "), len(h.Tools()))
	return c
}

func doctorBrowser(cfg *Config) Check {
	c := Check{Name: "browser", Needed: cfg.Screenshot.Enabled}
	if !cfg.Screenshot.Enabled {
		c.OK, c.Detail = true, "screenshots are off (screenshot.enabled: false): no browser needed"
		return c
	}
	if err := screenshot.New(screenshot.Config{ExecutablePath: cfg.Screenshot.Chromium}).Check(); err != nil {
		c.Detail = fmt.Sprintf("%v: scripts/setup-browser.sh installs Chromium and the Playwright driver (or set screenshot.enabled: false)", err)
		return c
	}
	c.OK, c.Detail = true, "Chromium and the Playwright driver are installed"
	return c
}

// doctorStore opens the store and puts, gets and deletes a probe object; then it checks
// that the store keeps project leases (when lease.enabled). When the store works it is
// returned open, for the providers' checks; the caller closes it.
func doctorStore(ctx context.Context, cfg *Config, quiet *slog.Logger) (_ []Check, opened *Storage) {
	c := Check{Name: "store", Needed: true}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	st, err := openStorage(cctx, cfg, options{log: quiet, snapLog: quiet})
	if err != nil {
		c.Detail = doctorStoreHint(cfg, err)
		return []Check{c}, nil
	}
	defer func() {
		if opened == nil {
			st.Close()
		}
	}()
	probe := storekeys.DoctorProbe(hostName(), os.Getpid(), time.Now().UnixNano())
	body := "toolhost doctor"
	if _, err := st.store.Put(cctx, probe, strings.NewReader(body), store.PutOptions{Size: int64(len(body))}); err != nil {
		c.Detail = doctorStoreHint(cfg, fmt.Errorf("writing a probe object: %w", err))
		return []Check{c}, nil
	}
	defer st.store.Delete(context.WithoutCancel(cctx), probe)
	r, _, err := st.store.Get(cctx, probe)
	if err == nil {
		var b strings.Builder
		_, err = store.CopyContext(cctx, &b, r)
		r.Close()
		if err == nil && b.String() != body {
			err = fmt.Errorf("read %q back, wrote %q", b.String(), body)
		}
	}
	if err != nil {
		c.Detail = doctorStoreHint(cfg, fmt.Errorf("reading the probe object back: %w", err))
		return []Check{c}, nil
	}
	if err := st.store.Delete(cctx, probe); err != nil {
		c.Detail = doctorStoreHint(cfg, fmt.Errorf("deleting the probe object: %w", err))
		return []Check{c}, nil
	}
	c.OK, c.Detail = true, st.where+": wrote, read and deleted a probe object"

	l := Check{Name: "lease"}
	if !cfg.Lease.Enabled {
		l.OK, l.Detail = true, "project leases are off (lease.enabled: false): run one host per store"
		return []Check{c, l}, st
	}
	switch err := lease.Check(cctx, st.store, probe+"-lease"); {
	case err == nil:
		l.OK, l.Detail = true, fmt.Sprintf("the store keeps project leases (conditional writes honoured; ttl %s, renewed every %s)", durationText(cfg.Lease.TTL), durationText(cfg.Lease.Renew))
	case errors.Is(err, lease.ErrUnsupported):
		l.Detail = fmt.Sprintf("%v: two hosts sharing this store could open one project at once; use a store that honours If-None-Match (AWS S3, a recent MinIO) or run one host", err)
	default:
		l.Detail = doctorStoreHint(cfg, fmt.Errorf("checking conditional writes: %w", err))
	}
	return []Check{c, l}, st
}

// doctorStoreHint is err with what to do about it.
func doctorStoreHint(cfg *Config, err error) string {
	hint := ""
	switch {
	case cfg.Store.Kind == "dir":
		hint = "check that store.dir is a directory this user can write"
	case errors.Is(err, store.ErrNoCredentials):
		// The S3 store's error says which variables to set (internal/store/s3/errors.go).
	case errors.Is(err, store.ErrAccessDenied):
		hint = "the credentials are refused: check the key, and that its policy allows s3:PutObject, GetObject, DeleteObject and ListBucket on the bucket"
	case errors.Is(err, store.ErrNoBucket):
		hint = "create the bucket, or set store.s3.create_bucket: true"
	case errors.Is(err, store.ErrUnreachable):
		hint = "check store.s3.endpoint and store.s3.region, and that the endpoint answers from here"
	}
	if hint == "" {
		return err.Error()
	}
	return err.Error() + ": " + hint
}

// doctorNetwork says what sandboxes may reach, and, for egress, that the gateway's policy
// compiles, refuses what it must, and that its resolver answers.
func doctorNetwork(ctx context.Context, cfg *Config, o options) Check {
	c := Check{Name: "network", Needed: true}
	switch cfg.Sandbox.Network {
	case NetworkNone:
		c.OK, c.Detail = true, "none: sandboxes reach no network at all (npm, pip and git clone cannot download)"
		return c
	case NetworkHost:
		c.OK, c.Detail = true, "host: sandboxes share this machine's network, its loopback and its cloud's metadata service included (trusted work only)"
		return c
	}
	o.log = slog.New(slog.DiscardHandler)
	t := &Toolhost{cfg: cloneConfig(*cfg), opts: o}
	gs, err := t.gateway()
	if err != nil {
		c.Detail = "the egress gateway: " + err.Error()
		return c
	}
	if v := egress.Decide(gs.host, "169.254.169.254:80"); v.Allowed {
		c.Detail = "the egress policy allows the metadata address 169.254.169.254 (" + v.Rule + ")"
		return c
	}
	e := &cfg.Sandbox.Egress
	allowed := gs.host.Allowed()
	detail := fmt.Sprintf("egress through the gateway: preset %s, %d destinations allowed, ports %v, resolver %s; loopback, private, link-local, metadata and this host's addresses refused",
		e.Preset, len(allowed), gs.host.Ports(), e.Resolver)
	name := ""
	for _, a := range allowed {
		if !strings.ContainsAny(a, "*/:") && !strings.Contains(a, "[") {
			name = a
			break
		}
	}
	c.OK, c.Detail = true, detail
	if name == "" {
		return c
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := gs.g.Lookup(rctx, name)
	if err != nil {
		// Not fatal: an offline machine runs sandboxes; they reach nothing outside.
		c.Needed, c.OK = false, false
		c.Detail = fmt.Sprintf("%s; but the gateway's resolver could not resolve %s (%v): sandboxes will not reach their registries (check sandbox.egress.resolver and this machine's DNS)", detail, name, err)
		return c
	}
	c.Detail = fmt.Sprintf("%s; the resolver answers (%s is %s)", detail, name, addrs[0])
	return c
}
