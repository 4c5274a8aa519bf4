package pluginreg

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/toolhost/toolhost/abi"
)

// LockFileName is the lock file's name, beside the configuration file.
const LockFileName = "toolhost.lock"

// LockPath is the lock file of the configuration file config.
func LockPath(config string) string { return filepath.Join(filepath.Dir(config), LockFileName) }

// Unsigned is the signer of a plugin installed unsigned (allowed from its registry).
const Unsigned = "unsigned"

// Lock is toolhost.lock: each plugin installed from a registry, pinned.
type Lock struct {
	Version int            `json:"version"`
	Plugins []LockedPlugin `json:"plugins"`
}

// LockedPlugin pins one plugin.
type LockedPlugin struct {
	// Name and Version are the plugin's own (its manifest's).
	Name    string `json:"name"`
	Version string `json:"version"`
	// Ref is the reference it was installed from; Digest the manifest's digest there.
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
	// Wasm is the module's digest; Path the file the configuration loads it from.
	Wasm string `json:"wasm"`
	Path string `json:"path"`
	// Signer is the ID of the key that signed it (KeyID), or Unsigned.
	Signer string `json:"signer"`
	// Needs are the grants it needs.
	Needs []abi.Capability `json:"needs"`
}

// ReadLock reads the lock file at path; a missing file is an empty lock.
func ReadLock(path string) (*Lock, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &Lock{Version: 1}, nil
	}
	if err != nil {
		return nil, err
	}
	var l Lock
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if l.Version != 1 {
		return nil, fmt.Errorf("%s: version %d, this toolhost reads version 1", path, l.Version)
	}
	return &l, nil
}

// Find returns the entry of the plugin named name.
func (l *Lock) Find(name string) (*LockedPlugin, bool) {
	i := slices.IndexFunc(l.Plugins, func(p LockedPlugin) bool { return p.Name == name })
	if i < 0 {
		return nil, false
	}
	return &l.Plugins[i], true
}

// Put adds or replaces the entry of p.Name.
func (l *Lock) Put(p LockedPlugin) {
	if old, ok := l.Find(p.Name); ok {
		*old = p
		return
	}
	l.Plugins = append(l.Plugins, p)
	slices.SortFunc(l.Plugins, func(a, b LockedPlugin) int { return strings.Compare(a.Name, b.Name) })
}

// Marshal is the lock file's bytes.
func (l *Lock) Marshal() ([]byte, error) {
	b, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Check reads the file of each locked plugin the configuration loads (paths, absolute)
// and refuses one whose bytes differ from the lock, naming both digests. With stampDir
// (a directory only this user writes, under data_dir), a file whose stamp (stampOf) is
// the one recorded when its digest last matched is not read again: that is what keeps a
// locked load as fast as a load by path.
func (l *Lock) Check(paths []string, stampDir string) error {
	for _, p := range l.Plugins {
		if !slices.Contains(paths, p.Path) {
			continue
		}
		var stamp, stampFile string
		if stampDir != "" {
			if fi, err := os.Stat(p.Path); err == nil {
				stamp = stampOf(fi)
			}
			stampFile = filepath.Join(stampDir, strings.TrimPrefix(Digest([]byte(p.Path+"\x00"+p.Wasm)), "sha256:"))
			if b, err := os.ReadFile(stampFile); stamp != "" && err == nil && string(b) == stamp {
				continue
			}
		}
		b, err := os.ReadFile(p.Path)
		if err != nil {
			return fmt.Errorf("plugin %s (locked in %s): %w", p.Name, LockFileName, err)
		}
		if got := Digest(b); got != p.Wasm {
			return fmt.Errorf("plugin %s: %s has digest %s, the lock pins %s (installed from %s); reinstall it with toolhost plugin add, or upgrade it: %w",
				p.Name, p.Path, got, p.Wasm, p.Ref, ErrLockDiffers)
		}
		if stamp != "" {
			// Best effort: without it, the next check reads the file again.
			if os.MkdirAll(stampDir, 0o700) == nil {
				WriteFiles(map[string][]byte{stampFile: []byte(stamp)}, []string{stampFile})
			}
		}
	}
	return nil
}

// StampDir is where Check keeps its stamps under dataDir.
func StampDir(dataDir string) string { return filepath.Join(dataDir, "plugins", "verified") }

// WriteFiles writes each file atomically (a temporary file in the same directory,
// synced, then renamed over it), the files in order, keeping an existing file's mode.
// It writes every temporary file before renaming any, so that a failure leaves every
// file as it was unless a rename itself fails.
func WriteFiles(files map[string][]byte, order []string) error {
	tmps := map[string]string{}
	defer func() {
		for _, t := range tmps {
			os.Remove(t)
		}
	}()
	for _, path := range order {
		mode := fs.FileMode(0o600)
		if fi, err := os.Stat(path); err == nil {
			mode = fi.Mode().Perm()
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return err
		}
		f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
		if err != nil {
			return err
		}
		tmps[path] = f.Name()
		_, err = f.Write(files[path])
		if err == nil {
			err = f.Chmod(mode)
		}
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
	}
	for _, path := range order {
		if err := os.Rename(tmps[path], path); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		delete(tmps, path)
	}
	return nil
}

// CachePath is where a module of digest wasmDigest is kept under dataDir.
func CachePath(dataDir, wasmDigest string) string {
	return filepath.Join(dataDir, "plugins", strings.Replace(wasmDigest, ":", "-", 1)+".wasm")
}

// CachePut keeps wasm under dataDir (CachePath) and returns its path.
func CachePut(dataDir string, wasm []byte) (string, error) {
	p := CachePath(dataDir, Digest(wasm))
	if b, err := os.ReadFile(p); err == nil && bytes.Equal(b, wasm) {
		return p, nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return "", err
	}
	return p, WriteFiles(map[string][]byte{p: wasm}, []string{p})
}
