package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// checkWorkspace refuses dir as a sandbox's workspace when something the host trusts lies
// inside it, or when it lies inside the host's own state. Whatever is in a workspace, the
// sandbox can write: a config file there could give the next command the host's network,
// a plugin or a browser binary there would run on the host, and the data dir holds
// compiled machine code the host maps executable.
func (c *cli) checkWorkspace(dir string) error {
	ws := realPath(dir)
	cfg := &c.cfg.Config
	trusted := []struct{ what, path string }{
		{"the config file", c.cfg.File},
		{"the data dir", dataDir(cfg)},
		{"the browser (screenshot.chromium)", cfg.Screenshot.Chromium},
		{"the directory store (store.dir)", cfg.Store.Dir},
	}
	if exe, err := os.Executable(); err == nil {
		trusted = append(trusted, struct{ what, path string }{"the toolhost executable", exe})
	}
	if pd, err := pluginsDir(cfg); err == nil {
		trusted = append(trusted, struct{ what, path string }{"the plugins dir", pd})
		for _, p := range cfg.Plugins {
			path := p.Path
			if !filepath.IsAbs(path) {
				path = filepath.Join(pd, path)
			}
			trusted = append(trusted, struct{ what, path string }{"the plugin " + p.Path, path})
		}
	}
	for _, t := range trusted {
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
