package toolhost

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/toolhost/toolhost/internal/sandbox/local"
)

// CheckWorkspace refuses dir as a sandbox's workspace when something the host trusts lies
// inside it, or when it lies inside the host's own state. Whatever is in a workspace, the
// sandbox can write: a config file there could give the next command the host's network,
// a plugin or a browser binary there would run on the host, and the data dir holds
// compiled machine code the host maps executable. Open runs it on SessionOptions.Workspace.
func (t *Toolhost) CheckWorkspace(dir string) error {
	return t.cfg.CheckWorkspace(dir, t.opts.configFile)
}

// CheckWorkspace is Toolhost.CheckWorkspace before a Toolhost exists (the CLI refuses a
// workspace before it loads anything). configFile is the file c was read from, or "".
//
// What is checked is every path the host reads or writes on its own behalf, whether it
// exists yet or not: a sandbox that may create the default config file (which no command
// read, because there was none) would configure every later command. So the list holds
// the config file read, the one TOOLHOST_CONFIG names, the default one, the data dir, the
// audit file, the plugins and the browser; the data dir and the modules' directories
// (the directory store, the local sandboxes' run and workspace dirs) are the host's own
// state, which a workspace may neither hold nor lie in.
func (c *Config) CheckWorkspace(dir, configFile string) error {
	cfg := c
	ws := realPath(dir)
	type trusted struct {
		what, path string
		state      bool // the host's own state: no workspace inside it either
	}
	list := []trusted{
		{what: "the config file", path: configFile},
		{what: "the config file TOOLHOST_CONFIG names", path: os.Getenv(EnvPrefix + "CONFIG")},
		{what: "the default config file", path: DefaultConfigFile()},
		{what: "the data dir", path: cfg.DataDir, state: true},
		{what: "the browser (screenshot.chromium)", path: cfg.Screenshot.Chromium},
		{what: "the audit file (audit.file)", path: cfg.Audit.File},
		// The local sandboxes' directories when their keys leave them to the default.
		{what: "the sandboxes' default run dir", path: local.DefaultRunDir(), state: true},
		{what: "the sandboxes' default workspace dir", path: local.DefaultWorkspaceDir(), state: true},
	}
	for _, k := range ConfigKeys() {
		if !k.HostPath || k.Module == "" {
			continue
		}
		if v, err := cfg.Get(k.Name); err == nil {
			if p, ok := v.(string); ok && p != "" {
				list = append(list, trusted{what: "a directory of the " + k.Module + " module (" + k.Name + ")", path: p, state: true})
			}
		}
	}
	if exe, err := os.Executable(); err == nil {
		list = append(list, trusted{what: "the toolhost executable", path: exe})
	}
	pd := ""
	if cfg.PluginsDir != "" {
		if abs, err := filepath.Abs(cfg.PluginsDir); err == nil {
			pd = abs
			list = append(list, trusted{what: "the plugins dir", path: pd})
		}
	}
	for _, p := range cfg.Plugins {
		path := p.Path
		switch {
		case filepath.IsAbs(path):
		case pd != "":
			path = filepath.Join(pd, path)
		default:
			continue // a built-in, inside the binary
		}
		list = append(list, trusted{what: "the plugin " + p.Path, path: path})
	}
	for _, t := range list {
		if t.path == "" {
			continue
		}
		p := realPath(t.path)
		if within(p, ws) {
			return fmt.Errorf("refusing %s as the workspace: %s (%s) lies inside it, and a sandbox can rewrite anything in its workspace; move it out or choose another workspace", ws, t.what, p)
		}
		if t.state {
			if within(ws, p) {
				return fmt.Errorf("refusing %s as the workspace: it lies inside %s (%s), the host's own state; choose a workspace outside it", ws, t.what, p)
			}
		}
	}
	return nil
}

// DefaultConfigFile is the config file the CLI reads when none is named: the user's
// configuration directory (os.UserConfigDir)/toolhost/toolhost.yaml; "" when there is no
// such directory.
func DefaultConfigFile() string {
	d, err := os.UserConfigDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "toolhost", "toolhost.yaml")
}

// realPath is p absolute with its symbolic links resolved, as far as it exists.
func realPath(p string) string {
	abs, err := filepath.Abs(p)
	if err != nil {
		return filepath.Clean(p)
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		return r
	}
	// Resolve the part that exists, keep the rest.
	dir, base := filepath.Split(abs)
	if dir == abs || dir == "" {
		return abs
	}
	return filepath.Join(realPath(filepath.Clean(dir)), base)
}

// within reports whether p is dir or lies below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}
