//go:build linux

package toolhost

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/sandbox/local"
)

// The local provider (bubblewrap) is Linux's: local_other.go says so elsewhere.

// newLocalProvider is the local (bubblewrap) provider with the sandbox.* limits and the
// session's lifetime.
func newLocalProvider(_ context.Context, env providerEnv) (sandbox.Provider, error) {
	cfg := env.cfg
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
		Logger:  env.log,
	})
	if err != nil {
		return nil, fmt.Errorf("local sandbox provider: %w%s", err, bwrapHint())
	}
	return p, nil
}

// bwrapHint tells people how to get bubblewrap when it is missing.
func bwrapHint() string {
	if _, err := os.Stat(local.BwrapPath); err != nil {
		return " (install bubblewrap: make setup, or apt-get install bubblewrap)"
	}
	return ""
}

// doctorLocal starts a sandbox of the local provider and runs a command in it (which
// needs bubblewrap and user namespaces), reports the limits and looks for python3 in it.
func doctorLocal(ctx context.Context, cfg *Config, quiet *slog.Logger) []Check {
	sb := Check{Name: "sandbox", Needed: true}
	p, err := newLocalProvider(ctx, providerEnv{cfg: cfg, log: quiet})
	if err != nil {
		sb.Detail = err.Error()
		if errors.Is(err, local.ErrNoBwrap) {
			sb.Detail = "bubblewrap is not installed: make setup, or apt-get install bubblewrap"
		}
		return []Check{sb}
	}
	lp := p.(*local.Provider)
	defer lp.Close(context.WithoutCancel(ctx))
	limits := Check{Name: "limits", OK: true}
	var missing, all []string
	for _, e := range lp.Enforcement() {
		all = append(all, e.String())
		if e.Missing != "" {
			missing = append(missing, e.String())
		}
	}
	limits.Detail = strings.Join(all, "; ")
	if len(missing) > 0 {
		limits.OK = false
		limits.Detail = strings.Join(missing, "; ") + ": the sandbox runs without them (docs/SECURITY.md says what each needs)"
	}

	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	start := time.Now()
	s, err := lp.Create(cctx, sandbox.CreateOptions{Timeout: time.Minute})
	if err != nil {
		sb.Detail = fmt.Sprintf("starting a sandbox failed: %v (bubblewrap needs unprivileged user namespaces: sysctl kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0; in a container, run it with --privileged or a seccomp profile that allows them)", err)
		return []Check{sb, limits}
	}
	defer s.Close(context.WithoutCancel(ctx))
	res, err := s.Exec(cctx, sandbox.ExecRequest{Argv: []string{"/bin/sh", "-c", "id -u"}, Timeout: 30 * time.Second})
	if err != nil || res.ExitCode != 0 {
		sb.Detail = fmt.Sprintf("a sandbox started but could not run a command: %v %s", err, strings.TrimSpace(string(res.Stderr)))
		return []Check{sb, limits}
	}
	sb.OK = true
	sb.Detail = fmt.Sprintf("bubblewrap %s and user namespaces: a sandbox started and ran a command as uid %s in %s",
		local.BwrapPath, strings.TrimSpace(string(res.Stdout)), time.Since(start).Round(time.Millisecond))

	py := Check{Name: "python3"}
	res, err = s.Exec(cctx, sandbox.ExecRequest{Argv: []string{"python3", "--version"}, Timeout: 30 * time.Second})
	if err == nil && res.ExitCode == 0 {
		py.OK, py.Detail = true, strings.TrimSpace(string(res.Stdout)+string(res.Stderr))+" in the sandbox (the demo serves its page with it)"
	} else {
		py.Detail = "no python3 in the sandbox: the demo's dev server needs it (make setup, or apt-get install python3)"
	}
	return []Check{sb, limits, py}
}
