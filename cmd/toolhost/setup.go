package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/cmd/toolhost/internal/config"
	"github.com/toolhost/toolhost/core/sandbox/local"
	"github.com/toolhost/toolhost/core/screenshot"
	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/host"
)

// EnvBashMaxTimeout tells the bash plugin the longest timeout it may accept, in seconds.
const envBashMaxTimeout = "TOOLHOST_BASH_MAX_TIMEOUT"

// pluginsDir is where relative plugin paths resolve: plugins_dir, else "plugins" next to
// the executable, else ./bin/plugins.
func pluginsDir(cfg *config.Config) (string, error) {
	if cfg.PluginsDir != "" {
		return filepath.Abs(cfg.PluginsDir)
	}
	if exe, err := os.Executable(); err == nil {
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			exe = real
		}
		dir := filepath.Join(filepath.Dir(exe), "plugins")
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			return dir, nil
		}
	}
	return filepath.Abs(filepath.Join("bin", "plugins"))
}

// dataDir is data_dir, else the host's default.
func dataDir(cfg *config.Config) string {
	if cfg.DataDir != "" {
		return cfg.DataDir
	}
	return host.DefaultDataDir()
}

// hostConfig turns the CLI's configuration into the host's.
func (c *cli) hostConfig() (host.Config, error) {
	cfg := &c.cfg.Config
	dir, err := pluginsDir(cfg)
	if err != nil {
		return host.Config{}, fmt.Errorf("resolving plugins_dir: %w", err)
	}
	hc := host.Config{
		DataDir:            dataDir(cfg),
		MemoryLimitMiB:     cfg.Limits.MemoryMiB,
		CallTimeout:        cfg.Limits.CallTimeout,
		PoolSize:           cfg.Limits.PoolSize,
		DefaultExecTimeout: cfg.Limits.ExecTimeoutDefault,
		MaxExecTimeout:     cfg.Limits.ExecTimeoutMax,
		MaxReadBytes:       cfg.Limits.ReadMaxBytes,
		MaxExecOutputBytes: cfg.Limits.ExecOutputMaxBytes,
		Logger:             c.log,
	}
	maxExec := strconv.FormatInt(int64(cfg.Limits.ExecTimeoutMax/time.Second), 10)
	for i, p := range cfg.Plugins {
		path := p.Path
		if !filepath.IsAbs(path) {
			path = filepath.Join(dir, path)
		}
		if _, err := os.Stat(path); err != nil {
			hint := ""
			if errors.Is(err, fs.ErrNotExist) {
				hint = " (build the built-in plugins with 'make plugins', or set plugins_dir)"
			}
			return host.Config{}, fmt.Errorf("plugins[%d]: %w%s", i, err, hint)
		}
		spec := host.PluginSpec{Path: path, Env: maps.Clone(p.Env)}
		for _, g := range p.Grants {
			spec.Grants = append(spec.Grants, abi.Capability(g))
		}
		// A plugin that may run commands learns the configured maximum timeout, unless its
		// own env says otherwise.
		if hasGrant(spec.Grants, abi.CapSandboxExec) {
			if _, set := spec.Env[envBashMaxTimeout]; !set {
				if spec.Env == nil {
					spec.Env = map[string]string{}
				}
				spec.Env[envBashMaxTimeout] = maxExec
			}
		}
		hc.Plugins = append(hc.Plugins, spec)
	}
	return hc, nil
}

func hasGrant(grants []abi.Capability, c abi.Capability) bool {
	for _, g := range grants {
		if g == c {
			return true
		}
	}
	return false
}

// newHost loads the configured plugins. st and rec serve the store and capture
// capabilities; either may be nil (a capture then says that screenshots are off).
func (c *cli) newHost(ctx context.Context, st store.Store, rec *screenshot.Recorder) (*host.Host, error) {
	hc, err := c.hostConfig()
	if err != nil {
		return nil, err
	}
	hc.Store, hc.Screenshots = st, rec
	h, err := host.New(ctx, hc)
	if err != nil {
		return nil, fmt.Errorf("loading plugins: %w", err)
	}
	return h, nil
}

// newProvider is the local (bubblewrap) sandbox provider with the configured lifetime.
func (c *cli) newProvider() (*local.Provider, error) {
	cfg := &c.cfg.Config
	mib := func(v int64) int64 {
		if v < 0 {
			return -1 // no limit
		}
		return v << 20
	}
	sb := cfg.Sandbox
	p, err := local.New(local.Config{
		RunDir:         sb.RunDir,
		WorkspaceDir:   sb.WorkspaceDir,
		DefaultTimeout: cfg.Session.TTL,
		MaxLifetime:    cfg.Session.MaxLifetime,
		Limits: local.Limits{
			MemoryBytes: mib(sb.MemoryMiB), Processes: sb.Processes, CPUs: sb.CPUs,
			TmpBytes: mib(sb.TmpMiB), ShmBytes: mib(sb.ShmMiB), DiskBytes: mib(sb.DiskMiB), OpenFiles: sb.OpenFiles,
		},
		HostUID: sb.HostUID,
		Logger:  c.log,
	})
	if err != nil {
		return nil, fmt.Errorf("local sandbox provider: %w%s", err, bwrapHint())
	}
	return p, nil
}

func bwrapHint() string {
	if _, err := os.Stat(local.BwrapPath); err != nil {
		return " (install bubblewrap: make setup, or apt-get install bubblewrap)"
	}
	return ""
}

// cleanupContext outlives an interrupted ctx long enough to close things properly.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
}

// closeHost closes h and logs a failure.
func (c *cli) closeHost(ctx context.Context, h *host.Host) {
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	if err := h.Close(cctx); err != nil {
		c.log.Warn("closing the host", "err", err)
	}
}
