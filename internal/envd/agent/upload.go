//go:build linux

package agent

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"os"
	"path"
	"sync"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
)

// maxLinkHops bounds how many symbolic links a write follows to find the file it replaces.
const maxLinkHops = 16

// handleUpload writes a file atomically: the body goes to a new temporary file next to the
// target, which then replaces the target with one rename. A reader, a snapshot or a
// concurrent write never sees half a file, and a failed write (the disk limit, a client
// that went away) leaves the old contents in place. The replaced file's permission bits are
// kept; a new file gets 0644. A target that is a FIFO, socket or device is refused before
// anything is opened (opening a FIFO for writing would wait for a reader), as is a
// directory. When the target is a symbolic link, the file it points to is replaced (the
// link stays), as long as every hop stays in the workspace.
func (s *Server) handleUpload(w http.ResponseWriter, r *http.Request) {
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct != envd.ContentOctet {
		s.filesError(w, http.StatusBadRequest, envd.BadArg("unsupported content type %q (this agent takes %s)", ct, envd.ContentOctet))
		return
	}
	wh, err := s.resolve(r.URL.Query().Get("path"))
	if err != nil {
		s.filesError(w, http.StatusBadRequest, err)
		return
	}
	// Writes of one file queue behind each other; the rename makes each one whole anyway,
	// this keeps their temporary files from piling up.
	unlock := s.writes.lock(wh.abs)
	defer unlock()
	if g, ok := guardOf(r.URL.Query()); ok {
		if err := s.writeGuarded(r.Context(), wh, g, r.Body); err != nil {
			s.filesError(w, http.StatusBadRequest, fmt.Errorf("write %s: %w", wh.abs, err))
			return
		}
		w.Header().Set("Content-Type", envd.ContentJSON)
		_ = json.NewEncoder(w).Encode([]map[string]string{{"path": wh.abs, "name": path.Base(wh.abs), "type": "file"}})
		return
	}
	target, mode, err := s.writeTarget(wh)
	if err != nil {
		s.filesError(w, http.StatusBadRequest, fmt.Errorf("write %s: %w", wh.abs, err))
		return
	}
	if err := s.mkdirAll(target.parent()); err != nil {
		if errors.Is(err, fs.ErrExist) { // a file where a directory should be
			err = fmt.Errorf("%w: %w", err, sandbox.ErrNotDir)
		}
		s.filesError(w, http.StatusBadRequest, fmt.Errorf("create parents of %s: %w", target.abs, err))
		return
	}
	if err := s.replaceFile(target, mode, r.Body); err != nil {
		s.filesError(w, http.StatusInternalServerError, fmt.Errorf("write %s: %w", target.abs, err))
		return
	}
	w.Header().Set("Content-Type", envd.ContentJSON)
	_ = json.NewEncoder(w).Encode([]map[string]string{{"path": wh.abs, "name": path.Base(wh.abs), "type": "file"}})
}

// writeTarget finds the file a write to wh replaces, following symbolic links (each hop
// must stay in the workspace when wh is in it), and the permission bits to give the new
// file: the old one's, or 0644.
func (s *Server) writeTarget(wh where) (where, fs.FileMode, error) {
	for range maxLinkHops {
		fi, err := s.lstat(wh)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return wh, 0o644, nil
		case err != nil:
			return wh, 0, err
		case fi.Mode().IsRegular():
			return wh, fi.Mode().Perm(), nil
		case fi.IsDir():
			return wh, 0, fmt.Errorf("it is a directory: %w", sandbox.ErrIsDir)
		case fi.Mode()&fs.ModeSymlink == 0:
			return wh, 0, fmt.Errorf("it is a %s: %w", fileKind(fi.Mode()), sandbox.ErrNotRegular)
		}
		link, err := s.readlink(wh)
		if err != nil {
			return wh, 0, err
		}
		next := link
		if !path.IsAbs(next) {
			next = path.Join(path.Dir(wh.abs), next)
		}
		nw, err := s.resolve(next)
		if err != nil {
			return wh, 0, err
		}
		if wh.rel != "" && nw.rel == "" {
			return wh, 0, fmt.Errorf("symbolic link %s points to %s: %w", wh.abs, link, sandbox.ErrOutside)
		}
		wh = nw
	}
	return wh, 0, fmt.Errorf("more than %d symbolic links: %w", maxLinkHops, sandbox.ErrOutside)
}

func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "FIFO (named pipe)"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "block device"
	}
	return "special file"
}

// replaceFile writes body to a new file beside target and renames it over target.
func (s *Server) replaceFile(target where, mode fs.FileMode, body io.Reader) error {
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := target.parent().join("." + path.Base(target.abs) + ".toolhost-" + hex.EncodeToString(rnd[:]))
	f, err := s.openFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create a temporary file: %w", err)
	}
	_, err = io.Copy(f, body)
	if err == nil {
		err = f.Chmod(mode) // through the descriptor: not subject to the umask
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = s.rename(tmp, target)
	}
	if err != nil {
		_ = s.removeFile(tmp)
		return err
	}
	return nil
}

func (s *Server) rename(from, to where) error {
	if from.rel != "" && to.rel != "" {
		return s.root.Load().Rename(from.rel, to.rel)
	}
	return os.Rename(s.real(from), s.real(to))
}

func (s *Server) removeFile(w where) error {
	if w.rel != "" {
		return s.root.Load().Remove(w.rel)
	}
	return os.Remove(w.abs)
}

// pathLocks serialises work on the same path.
type pathLocks struct {
	mu    sync.Mutex
	locks map[string]*pathLock
}

type pathLock struct {
	mu   sync.Mutex
	refs int
}

// lock locks p and returns its unlock.
func (l *pathLocks) lock(p string) func() {
	l.mu.Lock()
	if l.locks == nil {
		l.locks = map[string]*pathLock{}
	}
	pl := l.locks[p]
	if pl == nil {
		pl = &pathLock{}
		l.locks[p] = pl
	}
	pl.refs++
	l.mu.Unlock()
	pl.mu.Lock()
	return func() {
		pl.mu.Unlock()
		l.mu.Lock()
		if pl.refs--; pl.refs == 0 {
			delete(l.locks, p)
		}
		l.mu.Unlock()
	}
}
