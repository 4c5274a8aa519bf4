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

// The local provider as a module of toolhost's configuration: its keys (the sandbox.* keys
// only it reads), their validation, the provider they make with the sandbox policy every
// provider honours (limits, session lifetime), and its doctor lines.
func init() {
	module.RegisterProvider(module.Provider{
		Name:   "local",
		Prefix: "sandbox.",
		Keys:   keys,
		Config: func() any { return DefaultSection() },
		Validate: func(cfg any, _ module.Settings) error {
			if s := cfg.(*Section); s.HostUID <= 0 {
				return fmt.Errorf("config: sandbox.host_uid: must be an unprivileged uid (not 0), got %d", s.HostUID)
			}
			return nil
		},
		New: func(_ context.Context, cfg any, env module.Env) (sandbox.Provider, error) {
			return NewFromSection(cfg.(*Section), env)
		},
		Doctor: func(ctx context.Context, cfg any, env module.Env, _ bool) []module.Check {
			return doctor(ctx, cfg.(*Section), env)
		},
	})
}

// Section is the keys of the local provider.
type Section struct {
	HostUID      int    `key:"host_uid"`
	RunDir       string `key:"run_dir"`
	WorkspaceDir string `key:"workspace_dir"`
}

// DefaultSection is their defaults.
func DefaultSection() *Section { return &Section{HostUID: DefaultHostID} }

var keys = []module.Key{
	{Name: "sandbox.host_uid", Flag: "sandbox-host-uid",
		Usage: "host uid and gid of the sandbox user when toolhost runs as root",
		Doc: `When toolhost runs as root, the sandbox user is this unprivileged host uid (and gid),
never root: files a sandbox makes belong to it. Pick one nothing else uses. (local)`},
	{Name: "sandbox.run_dir", Flag: "run-dir", Default: `"" ($TMPDIR/toolhost-run-UID)`, HostPath: true,
		Usage: "private directory of the sandboxes' sockets (default $TMPDIR/toolhost-run-UID)",
		Doc: `The private directory of the sandboxes' sockets; must be this user's and writable by
no one else. (local)`},
	{Name: "sandbox.workspace_dir", Flag: "workspace-dir", Default: `"" (/var/tmp/toolhost-workspaces-UID)`, HostPath: true,
		Usage: "directory of the private workspaces (default /var/tmp/toolhost-workspaces-UID)",
		Doc: `Where private workspaces live (their volumes, as root): disk-backed, and below
directories anyone may pass through (bubblewrap runs as the sandbox user). (local)`},
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
	return []module.Check{sb, limits, py}
}
