// Package tree is a workspace as a list of entries (directories, regular files, symbolic
// links), read from a directory by a walk that never follows a link and written back by
// a writer that never writes through one. Snapshots of every format build on it: the
// chunked format stores its entries, and the walk and the writer are what the in-sandbox
// agent and the host both run.
//
// Everything a tree holds may come from a sandbox, so both ends check every name and
// every link target by the same rules (Check): relative, local, no "..", no NUL, within
// the bounds, links that stay inside the tree. What the walk cannot store (sockets,
// devices, links out, names too long) it skips and reports; what the writer is given
// that breaks a rule it refuses with ErrUnsafe before touching the disk.
package tree

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"strings"
)

// Type is an entry's kind.
type Type uint8

// The kinds of entries a tree holds.
const (
	Dir     Type = 1
	File    Type = 2
	Symlink Type = 3
)

func (t Type) String() string {
	switch t {
	case Dir:
		return "directory"
	case File:
		return "file"
	case Symlink:
		return "symbolic link"
	}
	return fmt.Sprintf("type %d", t)
}

// Entry is one directory, regular file or symbolic link below the root. The root itself
// is never an entry: its mode, owner and times are the caller's.
type Entry struct {
	// Path is slash-separated and relative to the root, cleaned ("a/b", never "./a",
	// "a/" or "").
	Path string
	Type Type
	// Mode holds the permission bits only (0777): no setuid, setgid or sticky bit.
	Mode fs.FileMode
	// Size is a file's length in bytes (0 for the others).
	Size int64
	// MTime is the modification time in Unix nanoseconds.
	MTime int64
	// Target is a symbolic link's target: relative, cleaned, staying inside the tree.
	Target string

	// CTime and Ino are the walk's view of the file (status change time, inode), kept
	// so that a later walk can tell a file that did not change without reading it. They
	// are not part of a snapshot.
	CTime int64
	Ino   uint64
}

// Limits every tree is held to, by default.
const (
	DefaultMaxEntries = 1_000_000
	DefaultMaxNameLen = 4096     // bytes, for paths and link targets (PATH_MAX)
	DefaultMaxBytes   = 16 << 30 // file contents
)

// ErrUnsafe: an entry breaks a rule of Check (the message names it).
var ErrUnsafe = errors.New("unsafe tree entry")

// ErrTooLarge: a tree passes a bound (entries, bytes).
var ErrTooLarge = errors.New("tree exceeds a limit")

// CheckPath reports why p cannot name an entry, or nil.
func CheckPath(p string, maxLen int) error {
	if maxLen <= 0 {
		maxLen = DefaultMaxNameLen
	}
	switch {
	case p == "" || p == ".":
		return fmt.Errorf("entry %q: empty name or the root: %w", p, ErrUnsafe)
	case len(p) > maxLen:
		return fmt.Errorf("entry %.64q...: name longer than %d bytes: %w", p, maxLen, ErrUnsafe)
	case strings.ContainsRune(p, 0):
		return fmt.Errorf("entry %q: NUL in name: %w", p, ErrUnsafe)
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("entry %q: absolute name: %w", p, ErrUnsafe)
	case path.Clean(p) != p || !filepath.IsLocal(p):
		return fmt.Errorf("entry %q: name is not clean and local (no .., no //, no trailing /): %w", p, ErrUnsafe)
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return fmt.Errorf("entry %q: name has a .. component: %w", p, ErrUnsafe)
		}
	}
	return nil
}

// CheckName checks an entry name as an archive gives it ("./a", "a/" and "a//b" are
// common in tar streams) and returns it cleaned, "." for the root. It is CheckPath on the
// cleaned name, and stricter than cleaning: a ".." component anywhere in the name as given
// is refused even where cleaning would remove it ("a/../b"), and the bound applies to the
// name as given. On Windows the name must also be one Windows creates as given
// (CheckPlatform).
func CheckName(name string, maxLen int) (string, error) {
	if maxLen <= 0 {
		maxLen = DefaultMaxNameLen
	}
	switch {
	case len(name) > maxLen:
		return "", fmt.Errorf("entry %.64q...: name longer than %d bytes: %w", name, maxLen, ErrUnsafe)
	case name == "" || strings.HasPrefix(name, "/"):
		return "", fmt.Errorf("entry %q: absolute or empty name: %w", name, ErrUnsafe)
	}
	for c := range strings.SplitSeq(name, "/") {
		if c == ".." {
			return "", fmt.Errorf("entry %q: name has a .. component: %w", name, ErrUnsafe)
		}
	}
	clean := path.Clean(name)
	if clean == "." {
		return clean, nil
	}
	if err := CheckPath(clean, maxLen); err != nil {
		return "", fmt.Errorf("entry %q: %w", name, err)
	}
	if err := CheckPlatform(clean, ""); err != nil {
		return "", err
	}
	return clean, nil
}

// CheckTarget reports why target cannot be the target of a link named p, or nil: it
// must be relative, made of leading ".." components followed by normal ones, and stay
// inside the tree when resolved from the link's directory. With every link held to this
// rule and every parent a real directory, no link resolves outside the tree, whatever
// order entries come in.
func CheckTarget(p, target string, maxLen int) error {
	if maxLen <= 0 {
		maxLen = DefaultMaxNameLen
	}
	if target == "" || len(target) > maxLen || strings.ContainsRune(target, 0) {
		return fmt.Errorf("entry %q: symbolic link target %.64q is empty or too long: %w", p, target, ErrUnsafe)
	}
	if path.IsAbs(target) {
		return fmt.Errorf("entry %q: symbolic link to absolute path %q: %w", p, target, ErrUnsafe)
	}
	seenNormal := false
	for _, c := range strings.Split(target, "/") {
		switch c {
		case "", ".":
		case "..":
			if seenNormal {
				return fmt.Errorf("entry %q: symbolic link target %q has .. after a name: %w", p, target, ErrUnsafe)
			}
		default:
			seenNormal = true
		}
	}
	if !filepath.IsLocal(path.Join(path.Dir(p), target)) {
		return fmt.Errorf("entry %q: symbolic link to %q points outside the tree: %w", p, target, ErrUnsafe)
	}
	return nil
}

// Check reports why e cannot be stored or written, or nil.
func Check(e Entry, maxNameLen int) error {
	if err := CheckPath(e.Path, maxNameLen); err != nil {
		return err
	}
	if e.Mode&^fs.ModePerm != 0 {
		return fmt.Errorf("entry %q: mode %o has bits beyond 0777: %w", e.Path, uint32(e.Mode), ErrUnsafe)
	}
	switch e.Type {
	case Dir:
	case File:
		if e.Size < 0 {
			return fmt.Errorf("entry %q: negative size: %w", e.Path, ErrUnsafe)
		}
	case Symlink:
		return CheckTarget(e.Path, e.Target, maxNameLen)
	default:
		return fmt.Errorf("entry %q: %s is not stored: %w", e.Path, e.Type, ErrUnsafe)
	}
	return nil
}

// CleanTarget returns the lexically cleaned target of a link named p, and whether it is
// storable (CheckTarget accepts it).
func CleanTarget(p, target string) (string, bool) {
	if target == "" || path.IsAbs(target) {
		return "", false
	}
	clean := path.Clean(target)
	if CheckTarget(p, clean, 0) != nil {
		return "", false
	}
	return clean, true
}

// Skip is an entry a walk left out, and why.
type Skip struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// MaxReportedSkips bounds how many skips a walk names.
const MaxReportedSkips = 100
