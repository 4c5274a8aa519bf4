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
			return newFromSection(cfg.(*Section), env)
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
