//go:build linux

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/tree"
)

// Stat, list and remove of a path decided as one step with its use (FileGuard.NoLinks):
// the same walk from a held directory handle as the guarded read and write
// (guarded.go), so a link swapped in after the host's look cannot move them.
//
// A listing is walked from directory handles too, whether or not it is guarded: each
// directory below the listed one is opened relative to its parent with O_NOFOLLOW, so a
// directory swapped for a link during the walk is listed as it was seen and not entered.
// The listing is streamed (envd.ListDirResponse): entries go out as they are found and
// are flushed often, so a listing of a hundred thousand entries on a loaded machine keeps
// the client's progress bound fed, and it stops, saying so, before the reply would pass
// the client's frame bound.

// statNoLinks describes w without going through a link at any part of its path.
func (s *Server) statNoLinks(w where) (fs.FileInfo, error) {
	if w.rel == "." || w.abs == "/" {
		return s.lstat(w)
	}
	h, err := s.openParent(w, true, false)
	if err != nil {
		return nil, err
	}
	defer h.dir.Close()
	fi, err := statAt(h.dir, h.base)
	if err != nil {
		return nil, err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return nil, s.linkOr(errIsLink, h.abs)
	}
	return fi, nil
}

// removeOne removes the entry w names if it is not a directory, never recursively: the
// check and the unlink are one unlinkat in the directory held (a directory swapped in
// meanwhile makes it fail with EISDIR). With noLinks no part of the path may be a link.
func (s *Server) removeOne(w where, noLinks bool) error {
	if w.rel == "." || w.abs == "/" {
		return envd.BadArg("refusing to remove the workspace root or /")
	}
	h, err := s.openParent(w, noLinks, false)
	if err != nil {
		return err
	}
	defer h.dir.Close()
	fi, err := statAt(h.dir, h.base)
	switch {
	case err != nil:
		return err
	case fi.IsDir():
		return fmt.Errorf("%s is a directory: %w", h.abs, sandbox.ErrIsDir)
	case noLinks && fi.Mode()&fs.ModeSymlink != 0:
		return s.linkOr(errIsLink, h.abs)
	}
	// Swapped for a link after the look: unlinkat removes the link itself, in the
	// directory held, and follows nothing.
	if err := unix.Unlinkat(int(h.dir.Fd()), h.base, 0); err != nil {
		if errors.Is(err, unix.EISDIR) {
			return fmt.Errorf("%s is a directory: %w", h.abs, sandbox.ErrIsDir)
		}
		return err
	}
	return nil
}

// statInfo is an fs.FileInfo of an fstatat.
type statInfo struct {
	name string
	st   unix.Stat_t
}

func statAt(d *os.File, name string) (fs.FileInfo, error) {
	fi := &statInfo{name: name}
	if err := unix.Fstatat(int(d.Fd()), name, &fi.st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, err
	}
	return fi, nil
}

func (fi *statInfo) Name() string       { return fi.name }
func (fi *statInfo) Size() int64        { return fi.st.Size }
func (fi *statInfo) ModTime() time.Time { return time.Unix(fi.st.Mtim.Unix()) }
func (fi *statInfo) IsDir() bool        { return fi.st.Mode&unix.S_IFMT == unix.S_IFDIR }
func (fi *statInfo) Sys() any           { return &fi.st }
func (fi *statInfo) Mode() fs.FileMode {
	m := fs.FileMode(fi.st.Mode & 0o777)
	switch fi.st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		m |= fs.ModeDir
	case unix.S_IFLNK:
		m |= fs.ModeSymlink
	case unix.S_IFREG:
	default:
		m |= modeType(fi.st.Mode)
	}
	if fi.st.Mode&unix.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if fi.st.Mode&unix.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if fi.st.Mode&unix.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// openListed opens the directory a listing starts from. With noLinks no part of its path
// may be a link; without, links inside the workspace are followed to it (never out).
func (s *Server) openListed(w where, noLinks bool) (*os.File, error) {
	if !noLinks || w.rel == "." || w.abs == "/" {
		fi, err := s.statFollow(w)
		if err != nil {
			return nil, err
		}
		if !fi.IsDir() {
			return nil, sandbox.ErrNotDir
		}
		return s.openFile(w, os.O_RDONLY|unix.O_DIRECTORY, 0)
	}
	h, err := s.openParent(w, true, false)
	if err != nil {
		return nil, err
	}
	defer h.dir.Close()
	d, err := tree.OpenDirAt(h.dir, h.base, false)
	if err != nil {
		if errors.Is(err, unix.ENOTDIR) {
			return nil, fmt.Errorf("%w: %w", err, sandbox.ErrNotDir)
		}
		return nil, s.linkOr(err, h.abs)
	}
	return d, nil
}

// listReplyBudget is how many bytes of encoded entries one listing may carry: the
// client's frame bound less room for the rest of the reply.
var listReplyBudget = envd.MaxEnvelope - 64<<10

// listFlush is how often a listing in progress is flushed to the client: at this many
// bytes, or this long after the last flush.
const (
	listFlushBytes = 256 << 10
	listFlushEvery = 250 * time.Millisecond
)

// handleListDir answers ListDir by streaming (see the top of this file). Errors found
// before the first byte is sent are a Connect error as for any unary call.
func (s *Server) handleListDir(w http.ResponseWriter, r *http.Request) {
	var req envd.ListDirRequest
	if !decodeUnary(w, r, &req) {
		return
	}
	wh, err := s.resolve(req.Path)
	if err == nil {
		var d *os.File
		d, err = s.openListed(wh, req.ToolhostNoLinks)
		if err == nil {
			defer d.Close()
			lw := &listWriter{w: w, rc: http.NewResponseController(w), last: time.Now()}
			lw.begin()
			l := &lister{s: s, req: &req, out: lw, used: 64}
			l.depth = req.Depth
			if l.depth == 0 {
				l.depth = 1
			}
			err := l.walk(r.Context(), d, wh, 1)
			lw.end(l.truncated, err)
			return
		}
	}
	if wh.abs != "" {
		req.Path = wh.abs
	}
	err = fmt.Errorf("list %s: %w", req.Path, err)
	code, kind := envd.Classify(err)
	writeUnaryError(w, code, err.Error(), kind)
}

// lister walks one listing.
type lister struct {
	s         *Server
	req       *envd.ListDirRequest
	out       *listWriter
	depth     uint32
	n         int // entries sent
	used      int // bytes sent
	truncated bool
}

// walk lists the directory d (named dir) depth-first, each directory's entries by name,
// until the limit or the frame budget.
func (l *lister) walk(ctx context.Context, d *os.File, dir where, level uint32) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("read directory %s: %w", dir.abs, err)
	}
	slices.Sort(names)
	for _, name := range names {
		if limit := int(l.req.ToolhostLimit); limit > 0 && l.n >= limit {
			l.truncated = true
			return nil
		}
		fi, err := statAt(d, name)
		if err != nil {
			continue // vanished meanwhile
		}
		child := dir.join(name)
		e := l.s.entry(child, fi)
		if fi.Mode()&fs.ModeSymlink != 0 {
			e.SymlinkTarget = nil
			if t, err := readlinkAt(d, name); err == nil {
				e.SymlinkTarget = &t
			}
		}
		b, err := json.Marshal(e)
		if err != nil {
			continue
		}
		if l.used += len(b) + 1; l.used > listReplyBudget {
			l.truncated = true
			return nil
		}
		if err := l.out.add(b); err != nil {
			return err
		}
		l.n++
		if !fi.IsDir() || level >= l.depth || slices.Contains(l.req.ToolhostSkip, name) {
			continue
		}
		sub, err := tree.OpenDirAt(d, name, false)
		switch {
		case errors.Is(err, errIsLink), errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
			continue // swapped or gone since it was seen: listed, not entered
		case err != nil:
			return fmt.Errorf("open directory %s: %w", child.abs, err)
		}
		err = l.walk(ctx, sub, child, level+1)
		sub.Close()
		if err != nil || l.truncated {
			return err
		}
	}
	return nil
}

func readlinkAt(d *os.File, name string) (string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(int(d.Fd()), name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// listWriter writes an envd.ListDirResponse as its entries come.
type listWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	some    bool
	pending int
	last    time.Time
	failed  error
}

func (lw *listWriter) begin() {
	lw.w.Header().Set("Content-Type", envd.ContentJSON)
	lw.w.WriteHeader(http.StatusOK)
	lw.write([]byte(`{"entries":[`))
	lw.flush()
}

func (lw *listWriter) write(b []byte) {
	if lw.failed != nil {
		return
	}
	if _, err := lw.w.Write(b); err != nil {
		lw.failed = err
	}
	lw.pending += len(b)
}

func (lw *listWriter) flush() {
	if lw.failed == nil {
		if err := lw.rc.Flush(); err != nil {
			lw.failed = err
		}
	}
	lw.pending, lw.last = 0, time.Now()
}

// add writes one encoded entry; an error means the client is gone.
func (lw *listWriter) add(b []byte) error {
	if lw.some {
		lw.write([]byte{','})
	}
	lw.some = true
	lw.write(b)
	if lw.pending >= listFlushBytes || time.Since(lw.last) >= listFlushEvery {
		lw.flush()
	}
	return lw.failed
}

// end closes the response, saying whether it was truncated and what ended it early.
func (lw *listWriter) end(truncated bool, err error) {
	var tail strings.Builder
	tail.WriteString("]")
	if truncated {
		tail.WriteString(`,"toolhostTruncated":true`)
	}
	if err != nil {
		code, kind := envd.Classify(err)
		b, _ := json.Marshal(envd.ConnectError{Code: code, Message: err.Error(), ToolhostKind: kind})
		tail.WriteString(`,"toolhostError":`)
		tail.Write(b)
	}
	tail.WriteString("}")
	lw.write([]byte(tail.String()))
}
