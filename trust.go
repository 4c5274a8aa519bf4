package toolhost

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
func (c *Config) CheckWorkspace(dir, configFile string) error {
	cfg := c
	ws := realPath(dir)
	type trusted struct{ what, path string }
	list := []trusted{
		{"the config file", configFile},
		{"the data dir", cfg.DataDir},
		{"the browser (screenshot.chromium)", cfg.Screenshot.Chromium},
		{"the audit file (audit.file)", cfg.Audit.File},
	}
	for _, k := range ConfigKeys() {
		if !k.HostPath || k.Module == "" {
			continue
		}
		if v, err := cfg.Get(k.Name); err == nil {
			if p, ok := v.(string); ok && p != "" {
				list = append(list, trusted{"a directory of the " + k.Module + " module (" + k.Name + ")", p})
			}
		}
	}
	if exe, err := os.Executable(); err == nil {
		list = append(list, trusted{"the toolhost executable", exe})
	}
	pd := ""
	if cfg.PluginsDir != "" {
		if abs, err := filepath.Abs(cfg.PluginsDir); err == nil {
			pd = abs
			list = append(list, trusted{"the plugins dir", pd})
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
		list = append(list, trusted{"the plugin " + p.Path, path})
	}
	for _, t := range list {
		if t.path == "" {
			continue
		}
		p := realPath(t.path)
		if within(p, ws) {
			return fmt.Errorf("refusing %s as the workspace: %s (%s) lies inside it, and a sandbox can rewrite anything in its workspace; move it out or choose another workspace", ws, t.what, p)
		}
		if t.what == "the data dir" || t.what == "the directory store (store.dir)" {
			if within(ws, p) {
				return fmt.Errorf("refusing %s as the workspace: it lies inside %s (%s), the host's own state; choose a workspace outside it", ws, t.what, p)
			}
		}
	}
	return nil
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
