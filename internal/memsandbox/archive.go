package memsandbox

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/archive"
)

// Archive writes the workspace to w as one tar.gz stream, leaving out entries whose base
// name is in excludes (nil: archive.DefaultExcludes). Links are stored as links; what
// Extract would refuse is left out, as archive.Pack leaves it out: FIFOs, and links that
// are absolute or lead out of the workspace.
func (s *Sandbox) Archive(ctx context.Context, w io.Writer, excludes []string) error {
	if excludes == nil {
		excludes = archive.DefaultExcludes
	}
	s.mu.Lock()
	if err := s.closedErr(); err != nil {
		s.mu.Unlock()
		return err
	}
	type entry struct {
		rel string
		n   node
	}
	var entries []entry
	var skipped []string
	for _, p := range s.below(sandbox.WorkspaceRoot) {
		rel := strings.TrimPrefix(p, sandbox.WorkspaceRoot+"/")
		if slices.ContainsFunc(skipped, func(d string) bool { return strings.HasPrefix(rel, d+"/") }) {
			continue
		}
		if slices.Contains(excludes, path.Base(rel)) {
			skipped = append(skipped, rel)
			continue
		}
		n := *s.files[p]
		if n.fifo || n.link != "" && (path.IsAbs(n.link) || !within(path.Join(path.Dir(p), n.link))) {
			continue
		}
		n.data = slices.Clone(n.data)
		entries = append(entries, entry{rel, n})
	}
	s.mu.Unlock()

	zw := gzip.NewWriter(w)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr := &tar.Header{Name: e.rel, Mode: int64(e.n.mode.Perm()), ModTime: e.n.mod, Format: tar.FormatPAX}
		switch {
		case e.n.dir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, e.rel+"/"
		case e.n.link != "":
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, e.n.link, 0o777
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(e.n.data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("archive sandbox %s: %w", s.id, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(e.n.data); err != nil {
				return fmt.Errorf("archive sandbox %s: %w", s.id, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("archive sandbox %s: %w", s.id, err)
	}
	return zw.Close()
}

// Extract unpacks a tar.gz stream into the workspace, which must be empty. An entry that
// would land outside it (an absolute name, .., a link out), or that is neither a file, a
// directory nor a link, refuses the whole archive: nothing is extracted.
func (s *Sandbox) Extract(ctx context.Context, r io.Reader) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	zr, err := gzip.NewReader(r)
	if err != nil {
		return fmt.Errorf("extract into sandbox %s: %w", s.id, err)
	}
	tr := tar.NewReader(zr)
	staged := map[string]*node{}
	now := time.Now()
	refuse := func(name, why string) error {
		return fmt.Errorf("extract into sandbox %s: entry %q %s: %w", s.id, name, why, archive.ErrUnsafe)
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("extract into sandbox %s: %w", s.id, err)
		}
		name := strings.TrimPrefix(hdr.Name, "./")
		if name == "" || name == "/" {
			continue // the root itself
		}
		if path.IsAbs(name) || strings.Contains(name, "\x00") {
			return refuse(hdr.Name, "is absolute")
		}
		clean := path.Clean(name)
		if clean == ".." || strings.HasPrefix(clean, "../") {
			return refuse(hdr.Name, "leaves the workspace")
		}
		abs := path.Join(sandbox.WorkspaceRoot, clean)
		// An entry below a link the archive made would land where the link points, which
		// the staged names do not show: refused, as archive.Extract refuses it.
		for dir := path.Dir(abs); within(dir) && dir != sandbox.WorkspaceRoot; dir = path.Dir(dir) {
			if n := staged[dir]; n != nil && n.link != "" {
				return refuse(hdr.Name, "is below the link "+strings.TrimPrefix(dir, sandbox.WorkspaceRoot+"/"))
			}
		}
		mod := hdr.ModTime
		if mod.IsZero() {
			mod = now
		}
		perm := hdr.FileInfo().Mode().Perm()
		switch hdr.Typeflag {
		case tar.TypeDir:
			staged[abs] = &node{dir: true, mode: perm | 0o700, mod: mod}
		case tar.TypeReg:
			data, err := io.ReadAll(io.LimitReader(tr, archive.DefaultMaxBytes+1))
			if err != nil {
				return fmt.Errorf("extract into sandbox %s: %w", s.id, err)
			}
			staged[abs] = &node{data: data, mode: perm | 0o600, mod: mod}
		case tar.TypeSymlink:
			target := hdr.Linkname
			if path.IsAbs(target) || !within(path.Join(path.Dir(abs), target)) {
				return refuse(hdr.Name, "links out of the workspace or by an absolute name ("+target+")")
			}
			staged[abs] = &node{link: target, mode: 0o777, mod: mod}
		default:
			return refuse(hdr.Name, "is not a file, a directory or a link")
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.closedErr(); err != nil {
		return err
	}
	if len(s.below(sandbox.WorkspaceRoot)) > 0 {
		return fmt.Errorf("extract into sandbox %s: %w", s.id, archive.ErrNotEmpty)
	}
	for _, p := range slices.Sorted(maps.Keys(staged)) {
		if err := s.mkdirAll(path.Dir(p)); err != nil {
			return fmt.Errorf("extract into sandbox %s: %w", s.id, err)
		}
		s.files[p] = staged[p]
	}
	return nil
}
