package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/module"
)

// The local provider as a module of toolhost's configuration: its keys (the sandbox.* keys
// only it reads), their validation, the provider they make with the sandbox policy every
// provider honours (limits, session lifetime), and its doctor lines.
func init() {
	module.RegisterProvider(module.Provider[Section]{
		Name:   "local",
		Prefix: "sandbox.",
		Keys:   keys,
		Config: DefaultSection,
		Validate: func(s *Section, _ module.Settings) error {
			if s.HostUID <= 0 {
				return fmt.Errorf("config: sandbox.host_uid: must be an unprivileged uid (not 0), got %d", s.HostUID)
			}
			if s.Pool < 0 || s.Pool > MaxPool {
				return fmt.Errorf("config: sandbox.pool: must be between 0 and %d, got %d", MaxPool, s.Pool)
			}
			return nil
		},
		New: func(_ context.Context, cfg *Section, env module.Env) (sandbox.Provider, error) {
			return newFromSection(cfg, env)
		},
		Doctor: func(ctx context.Context, cfg *Section, env module.Env, _ bool) []module.Check {
			return doctor(ctx, cfg, env)
		},
	})
}

// Section is the keys of the local provider.
type Section struct {
	HostUID      int    `key:"host_uid"`
	RunDir       string `key:"run_dir"`
	WorkspaceDir string `key:"workspace_dir"`
	Adopt        bool   `key:"adopt"`
	Pool         int    `key:"pool"`
}

// MaxPool bounds sandbox.pool (Config.Pool): each spare is a live sandbox (an agent, a
// cgroup, a tmpfs) that costs memory while it waits.
const MaxPool = 8

// DefaultSection is their defaults.
func DefaultSection() *Section { return &Section{HostUID: defaultHostID} }

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
	{Name: "sandbox.adopt", Flag: "adopt",
		Usage: "as root, where a host workspace cannot be idmapped, re-own what root owns in it to the sandbox user",
		Doc: `As root, a host directory given as the workspace is attached through an idmapped
mount that makes the sandbox user act as the directory's owner: no owner on disk changes,
and files the sandbox creates belong to the directory's owner. Where that cannot be done
(a filesystem or kernel without idmapped mounts), toolhost refuses the directory unless
this is true: then every entry in it that root owns is handed to the sandbox user
(sandbox.host_uid) for good, the directory itself gains that user's group with group rwx,
and entries of other users stay as they are. It changes nothing where idmapped mounts work,
or when toolhost does not run as root. (local)`},
	{Name: "sandbox.pool", Flag: "sandbox-pool",
		Usage: "started sandboxes kept ready per configuration (0: none; local, and kubernetes' warm pool)",
		Doc: `How many local sandboxes are kept started ahead of need, for each configuration
sessions use (network mode, egress policy, environment): opening a session or rotating
one then takes a running sandbox, its limits and seccomp filter already in force, and
attaches the workspace to it (a host directory through the same idmapped mount, owners
kept), instead of waiting for bubblewrap and the agent. A sandbox is taken once and never
given to another session; a spare made for one egress policy is never given to a sandbox
with another. Each kept sandbox costs its agent's memory (about 20 MB) while it waits.
Needs root (the host mounts the workspace for the sandbox); otherwise none are kept. At
most 8. 0 (the default): none. (local) The kubernetes provider honours it too: a
SandboxWarmPool of this many pods per network mode, each sandbox a SandboxClaim served
from it (docs/KUBERNETES.md).`},
}

// DefaultRunDir is Config.RunDir when none is given: os.TempDir()/toolhost-run-UID.
func DefaultRunDir() string {
	return filepath.Join(os.TempDir(), "toolhost-run-"+strconv.Itoa(os.Geteuid()))
}

// DefaultWorkspaceDir is Config.WorkspaceDir when none is given:
// /var/tmp/toolhost-workspaces-UID.
func DefaultWorkspaceDir() string {
	return filepath.Join("/var/tmp", "toolhost-workspaces-"+strconv.Itoa(os.Geteuid()))
}
