//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/module"
)

// defaultHostID is DefaultHostID where module.go (built everywhere) can name it.
const defaultHostID = DefaultHostID

// newFromSection is NewFromSection as a sandbox.Provider (module.go's New).
func newFromSection(s *Section, env module.Env) (sandbox.Provider, error) {
	p, err := NewFromSection(s, env)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// NewFromSection is the local provider of its keys and the sandbox policy of env.
func NewFromSection(s *Section, env module.Env) (*Provider, error) {
	set := env.Settings
	p, err := New(Config{
		RunDir:         s.RunDir,
		WorkspaceDir:   s.WorkspaceDir,
		DefaultTimeout: set.TTL,
		MaxLifetime:    set.MaxLifetime,
		Limits: Limits{
			MemoryBytes: set.MemoryBytes, Processes: set.Processes, CPUs: set.CPUs,
			TmpBytes: set.TmpBytes, ShmBytes: set.ShmBytes, DiskBytes: set.DiskBytes, OpenFiles: set.OpenFiles,
		},
		HostUID: s.HostUID,
		Adopt:   s.Adopt,
		Pool:    s.Pool,
		Logger:  env.Logger,
	})
	if err != nil {
		hint := ""
		if _, serr := os.Stat(BwrapPath); serr != nil {
			hint = " (install bubblewrap: make setup, or apt-get install bubblewrap)"
		}
		return nil, fmt.Errorf("local sandbox provider: %w%s", err, hint)
	}
	return p, nil
}

// doctor starts a sandbox and runs a command in it (which needs bubblewrap and user
// namespaces), reports how the limits are enforced and looks for python3 in it.
func doctor(ctx context.Context, s *Section, env module.Env) []module.Check {
	sb := module.Check{Name: "sandbox", Needed: true}
	p, err := NewFromSection(s, env)
	if err != nil {
		sb.Detail = err.Error()
		if errors.Is(err, ErrNoBwrap) {
			sb.Detail = "bubblewrap is not installed: make setup, or apt-get install bubblewrap"
		}
		return []module.Check{sb}
	}
	defer p.Close(context.WithoutCancel(ctx))
	limits := module.Check{Name: "limits", OK: true}
	var missing, all []string
	for _, e := range p.Enforcement() {
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
	sbx, err := p.Create(cctx, sandbox.CreateOptions{Timeout: time.Minute})
	if err != nil {
		sb.Detail = fmt.Sprintf("starting a sandbox failed: %v (bubblewrap needs unprivileged user namespaces: sysctl kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0; in a container, run it with --privileged or a seccomp profile that allows them)", err)
		return []module.Check{sb, limits}
	}
	defer sbx.Close(context.WithoutCancel(ctx))
	res, err := sbx.Exec(cctx, sandbox.ExecRequest{Argv: []string{"/bin/sh", "-c", "id -u"}, Timeout: 30 * time.Second})
	if err != nil || res.ExitCode != 0 {
		sb.Detail = fmt.Sprintf("a sandbox started but could not run a command: %v %s", err, strings.TrimSpace(string(res.Stderr)))
		return []module.Check{sb, limits}
	}
	sb.OK = true
	sb.Detail = fmt.Sprintf("bubblewrap %s and user namespaces: a sandbox started and ran a command as uid %s in %s",
		BwrapPath, strings.TrimSpace(string(res.Stdout)), time.Since(start).Round(time.Millisecond))

	py := module.Check{Name: "python3"}
	res, err = sbx.Exec(cctx, sandbox.ExecRequest{Argv: []string{"python3", "--version"}, Timeout: 30 * time.Second})
	if err == nil && res.ExitCode == 0 {
		py.OK, py.Detail = true, strings.TrimSpace(string(res.Stdout)+string(res.Stderr))+" in the sandbox (the demo serves its page with it)"
	} else {
		py.Detail = "no python3 in the sandbox: the demo's dev server needs it (make setup, or apt-get install python3)"
	}
	return []module.Check{sb, limits, py, p.ownersCheck(cctx)}
}
