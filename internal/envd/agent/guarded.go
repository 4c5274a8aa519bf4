//go:build linux

package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/tree"
)

// Guarded reads and writes (sandbox.FileGuard): what the host decided about a file is
// checked here, in the step that uses the path, so nothing can change between the two.
//
// NoLinks: the path is opened below a directory handle the agent holds (the workspace,
// or / for a path outside it) by the tree layer (tree.OpenBeneath: openat2 with
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS where the kernel has it, else one part at a time
// with O_NOFOLLOW), and its last part with O_NOFOLLOW (tree.OpenAt), so a link anywhere
// is refused whatever a process of the sandbox swaps in meanwhile: a swap either happens
// before the open of its part (refused) or after (the handle already held is the real
// directory).
//
// Versioned: the check of the file's version and the write run under flock on the file's
// directory. The lock is on the directory's inode, which every sandbox sharing a host
// directory sees (a bind mount is the same inode), so two agents of two host processes,
// or of two hosts sharing the directory, serialise too. The write itself is the same
// temporary file and rename as any upload (a reader never sees half a file), and the
// lock is held from the read to the rename. No lock file is left in the workspace.

// guardOf reads a FileGuard from a /files query.
func guardOf(q map[string][]string) (g sandbox.FileGuard, guarded bool) {
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	g.NoLinks = get(envd.QueryNoLinks) == "1"
	if v := get(envd.QueryIfVersion); v != "" {
		g.Versioned, g.Version = true, v
	}
	if get(envd.QueryIfAbsent) == "1" {
		g.Versioned, g.Version = true, ""
	}
	return g, g.NoLinks || g.Versioned
}

// dirHandle is a directory opened by the guarded walk, and the name of the last part.
type dirHandle struct {
	dir  *os.File
	base string
	abs  string // the path as the sandbox names it, for messages
}

// openParent opens the directory holding wh's last part. With noLinks every part is
// opened with O_NOFOLLOW from the workspace (or /) down; create makes missing
// directories as it goes. Without noLinks the directory is opened through s.root (links
// inside the workspace followed, none leading out).
func (s *Server) openParent(wh where, noLinks, create bool) (*dirHandle, error) {
	if wh.rel == "." || wh.abs == "/" {
		return nil, fmt.Errorf("path '%s' is a directory: %w", wh.abs, sandbox.ErrIsDir)
	}
	parent, base := wh.parent(), path.Base(wh.abs)
	if !noLinks {
		if create {
			if err := s.mkdirAll(parent); err != nil {
				if errors.Is(err, fs.ErrExist) {
					err = fmt.Errorf("%w: %w", err, sandbox.ErrNotDir)
				}
				return nil, fmt.Errorf("create parents of %s: %w", wh.abs, err)
			}
		}
		d, err := s.openFile(parent, os.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return nil, err
		}
		return &dirHandle{dir: d, base: base, abs: wh.abs}, nil
	}
	top, rest := s.cfg.Workspace, wh.rel
	shown := sandbox.WorkspaceRoot
	if wh.rel == "" { // outside the workspace: from /
		top, rest, shown = "/", strings.TrimPrefix(wh.abs, "/"), ""
	}
	d, err := os.OpenFile(top, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	under, err := tree.OpenBeneath(d, path.Dir(rest), create)
	if le := (*tree.LinkError)(nil); errors.As(err, &le) {
		return nil, s.linkOr(errIsLink, shown+"/"+le.Path)
	}
	if err != nil {
		return nil, err
	}
	return &dirHandle{dir: under, base: base, abs: wh.abs}, nil
}

// errIsLink: a link where the path may have none (the tree's).
var errIsLink = tree.ErrLink

// linkOr names the part that is a link in a refusal, or passes err on.
func (s *Server) linkOr(err error, shown string) error {
	if errors.Is(err, errIsLink) {
		return fmt.Errorf("%s is a symbolic link, and this path may not go through one: %w", shown, sandbox.ErrLink)
	}
	return err
}

// openFileAt opens the last part of h for reading, never through a link, never blocking
// on a FIFO.
func (s *Server) openFileAt(h *dirHandle) (*os.File, error) {
	f, fi, err := tree.OpenAt(h.dir, h.base)
	if err != nil {
		return nil, s.linkOr(err, h.abs)
	}
	switch {
	case fi.IsDir():
		f.Close()
		return nil, fmt.Errorf("path '%s' is a directory: %w", h.abs, sandbox.ErrIsDir)
	case !fi.Mode().IsRegular():
		f.Close()
		return nil, fmt.Errorf("read %s: it is a %s: %w", h.abs, fileKind(fi.Mode()), sandbox.ErrNotRegular)
	}
	return f, nil
}

// readGuarded reads wh with the guard g (only NoLinks applies to a read).
func (s *Server) readGuarded(wh where, g sandbox.FileGuard, maxBytes int64) ([]byte, error) {
	h, err := s.openParent(wh, g.NoLinks, false)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", wh.abs, err)
	}
	defer h.dir.Close()
	f, err := s.openFileAt(h)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", wh.abs, err)
	}
	defer f.Close()
	return readBounded(f, wh.abs, maxBytes)
}

func readBounded(f *os.File, abs string, maxBytes int64) ([]byte, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if maxBytes > 0 && fi.Size() > maxBytes {
		return nil, fmt.Errorf("path '%s' has %d bytes, more than %d: %w", abs, fi.Size(), maxBytes, sandbox.ErrTooLarge)
	}
	r := io.Reader(f)
	if maxBytes > 0 {
		r = io.LimitReader(f, maxBytes+1)
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(r); err != nil {
		return nil, fmt.Errorf("read %s: %w", abs, err)
	}
	if maxBytes > 0 && int64(buf.Len()) > maxBytes {
		return nil, fmt.Errorf("path '%s' has more than %d bytes: %w", abs, maxBytes, sandbox.ErrTooLarge)
	}
	return buf.Bytes(), nil
}

// maxVersionedBytes bounds the file a versioned write reads to compare (the host reads
// no more than its own read bound either).
const maxVersionedBytes = 256 << 20

// writeGuarded writes body to wh with the guard g. Without NoLinks a final link is
// followed as any upload does (writeTarget); with it a link anywhere is refused.
func (s *Server) writeGuarded(ctx context.Context, wh where, g sandbox.FileGuard, body io.Reader) error {
	target, mode := wh, fs.FileMode(0o644)
	if !g.NoLinks {
		t, m, err := s.writeTarget(wh)
		if err != nil {
			return err
		}
		target, mode = t, m
	}
	h, err := s.openParent(target, g.NoLinks, true)
	if err != nil {
		return err
	}
	defer h.dir.Close()
	if g.Versioned {
		unlock, err := lockDir(ctx, h.dir)
		if err != nil {
			return fmt.Errorf("lock the directory of %s: %w", h.abs, err)
		}
		defer unlock()
	}
	// What is there now: its version, its mode, and whether it is a link.
	var st unix.Stat_t
	err = unix.Fstatat(int(h.dir.Fd()), h.base, &st, unix.AT_SYMLINK_NOFOLLOW)
	exists := err == nil
	switch {
	case err != nil && !errors.Is(err, unix.ENOENT):
		return err
	case exists && st.Mode&unix.S_IFMT == unix.S_IFLNK:
		if g.NoLinks {
			return s.linkOr(errIsLink, h.abs)
		}
		// Without NoLinks writeTarget resolved links; one that appeared since is a change.
		return fmt.Errorf("%s became a symbolic link: %w", h.abs, sandbox.ErrChanged)
	case exists && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return fmt.Errorf("it is a directory: %w", sandbox.ErrIsDir)
	case exists && st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Errorf("it is a %s: %w", fileKind(modeType(st.Mode)), sandbox.ErrNotRegular)
	case exists:
		mode = fs.FileMode(st.Mode & 0o777)
	}
	if g.Versioned {
		if !exists && g.Version != "" {
			return fmt.Errorf("%s no longer exists: %w", h.abs, sandbox.ErrChanged)
		}
		if exists && g.Version == "" {
			return fmt.Errorf("%s was created meanwhile: %w", h.abs, sandbox.ErrChanged)
		}
		if exists {
			f, err := s.openFileAt(h)
			if err != nil {
				return err
			}
			cur, err := readBounded(f, h.abs, maxVersionedBytes)
			f.Close()
			if err != nil {
				return err
			}
			if sandbox.FileVersion(cur) != g.Version {
				return fmt.Errorf("%s: %w", h.abs, sandbox.ErrChanged)
			}
		}
	}
	return tree.ReplaceAt(h.dir, h.base, mode, body)
}

func modeType(m uint32) fs.FileMode {
	switch m & unix.S_IFMT {
	case unix.S_IFIFO:
		return fs.ModeNamedPipe
	case unix.S_IFSOCK:
		return fs.ModeSocket
	case unix.S_IFCHR:
		return fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		return fs.ModeDevice
	}
	return fs.ModeIrregular
}

// lockDir takes flock on d, waiting while another holds it until ctx ends: a holder in
// the sandbox could keep it forever, and the host never waits without a bound.
func lockDir(ctx context.Context, d *os.File) (unlock func(), err error) {
	wait := time.Millisecond
	for {
		err := unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { _ = unix.Flock(int(d.Fd()), unix.LOCK_UN) }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return nil, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("another writer holds it: %w", ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}
