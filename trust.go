package toolhost

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/toolhost/toolhost/internal/daemon"
	"github.com/toolhost/toolhost/internal/mountinfo"
	"github.com/toolhost/toolhost/internal/sandbox/local"
)

// CheckWorkspace refuses dir as a sandbox's workspace when something the host trusts lies
// inside it, or when it lies inside the host's own state. Whatever is in a workspace, the
// sandbox can write: a config file there could give the next command the host's network,
// a plugin or a browser binary there would run on the host, the data dir holds compiled
// machine code the host maps executable, and the session daemon's socket runs anything on
// any host directory for a process of this user. Open runs it on SessionOptions.Workspace.
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
// audit file, the plugins and the browser, the session daemon's directories (wherever a
// daemon of this user may listen: daemon.Dirs) and the user's runtime dir around them
// ($XDG_RUNTIME_DIR, which also holds the sockets of the user's session bus and agents);
// the data dir, the daemon's directories and the modules' directories (the directory
// store, the local sandboxes' run and workspace dirs) are the host's own state, which a
// workspace may neither hold nor lie in.
//
// "Inside" is what the sandbox would reach, not how the paths are spelled: links are
// resolved; a directory that is the workspace itself under another name (another case on
// a case-insensitive filesystem, a bind mount of it) counts as the workspace; and on
// Linux the mount table shows what else the workspace reaches: a mount inside it (the
// sandbox gets the workspace's mounts too), and a directory of its filesystem that is
// mounted elsewhere as well.
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
	}
	for _, d := range daemon.Dirs() {
		list = append(list, trusted{what: "the session daemon's directory", path: d, state: true})
	}
	list = append(list, []trusted{
		{what: "the user's runtime dir (XDG_RUNTIME_DIR)", path: os.Getenv("XDG_RUNTIME_DIR")},
		{what: "the browser (screenshot.chromium)", path: cfg.Screenshot.Chromium},
		{what: "the audit file (audit.file)", path: cfg.Audit.File},
		// The local sandboxes' directories when their keys leave them to the default.
		{what: "the sandboxes' default run dir", path: local.DefaultRunDir(), state: true},
		{what: "the sandboxes' default workspace dir", path: local.DefaultWorkspaceDir(), state: true},
	}...)
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
	for _, k := range cfg.Registry.Keys {
		list = append(list, trusted{what: "a signing key trusted for plugins (registry.keys)", path: k})
	}
	if configFile != "" {
		// toolhost.lock (package pluginreg), beside the config file
		list = append(list, trusted{what: "the plugin lock file", path: filepath.Join(filepath.Dir(configFile), "toolhost.lock")})
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
	var mounts mountTable
	if runtime.GOOS == "linux" {
		m, err := mountinfo.Read()
		if err != nil {
			return fmt.Errorf("refusing %s as the workspace: what it reaches through mounts cannot be checked: %w", ws, err)
		}
		mounts = m
	}
	for _, t := range list {
		if t.path == "" {
			continue
		}
		p := realPath(t.path)
		if within(p, ws) {
			return fmt.Errorf("refusing %s as the workspace: %s (%s) lies inside it, and a sandbox can rewrite anything in its workspace; move it out or choose another workspace", ws, t.what, p)
		}
		if reaches(mounts, ws, p, true) {
			return fmt.Errorf("refusing %s as the workspace: %s (%s) lies inside it by another path (a bind mount, or the same directory spelled otherwise), and a sandbox can rewrite anything in its workspace; move it out or choose another workspace", ws, t.what, p)
		}
		if t.state && (within(ws, p) || reaches(mounts, p, ws, false)) {
			return fmt.Errorf("refusing %s as the workspace: it lies inside %s (%s), the host's own state; choose a workspace outside it", ws, t.what, p)
		}
	}
	return nil
}

// reaches reports whether p (a real path) can be reached inside the directory dir (one
// too) other than by its spelling: an existing ancestor of p is dir under another name
// (the same file: another case on a case-insensitive filesystem, a bind mount), or, by
// the mount table, p's directory on its filesystem lies in what dir shows of that
// filesystem: dir itself (a bind mount shows the same directory at another path, both
// ways round) and, with inner, the mounts inside dir. They count for a workspace, whose
// sandbox gets its mounts; not for the host's state, whose mounts are the host's own
// (the local sandboxes stage every host workspace in their workspace dir, so each would
// lie "inside" it).
func reaches(mounts mountTable, dir, p string, inner bool) bool {
	if st, err := os.Stat(dir); err == nil {
		for a := p; ; a = filepath.Dir(a) {
			if ast, err := os.Stat(a); err == nil && os.SameFile(ast, st) {
				return true
			}
			if filepath.Dir(a) == a {
				break
			}
		}
	}
	dev, loc, ok := mounts.locate(p)
	if !ok {
		return false
	}
	if ddev, dloc, ok := mounts.locate(dir); ok && ddev == dev && within(loc, dloc) {
		return true
	}
	for _, m := range mounts {
		if inner && m.Point != dir && within(m.Point, dir) && m.Dev == dev && within(loc, m.Root) {
			return true
		}
	}
	return false
}

// mountTable is this process's mounts (Linux), in mount order.
type mountTable []mountinfo.Mount

// locate is where the real path p is: its filesystem (major:minor) and its path within
// that filesystem, by the mount on top at the deepest mount point holding p.
func (t mountTable) locate(p string) (dev, path string, ok bool) {
	best := -1
	for i, m := range t {
		if !within(p, m.Point) {
			continue
		}
		// The deepest point wins; at one point, the mount on top (mounted on the other).
		if best < 0 || len(m.Point) > len(t[best].Point) || (m.Point == t[best].Point && m.Parent == t[best].ID) {
			best = i
		}
	}
	if best < 0 {
		return "", "", false
	}
	m := t[best]
	return m.Dev, filepath.Join(m.Root, strings.TrimPrefix(p, m.Point)), true
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
