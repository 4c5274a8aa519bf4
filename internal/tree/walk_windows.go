//go:build windows

package tree

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/toolhost/toolhost/internal/winname"
)

// Walk calls fn for every entry below dir, depth first, each directory's names in
// sorted order (so a parent always comes before its children). For a regular file, open
// reads it; fn need not call it. Below dir no path is ever resolved: each directory is
// opened as an os.Root from its parent's by one name and checked to be the directory
// Lstat saw, links and reparse points (junctions included) are never followed, so the
// tree may change under the walk without the walk ever leaving it. Entries that vanish
// are left out silently; what a snapshot cannot hold is skipped and reported.
//
// An error from fn stops the walk and is returned.
func Walk(ctx context.Context, dir string, opts WalkOptions, fn func(e Entry, open Opener) error) (WalkStats, error) {
	opts.defaults()
	var st WalkStats
	root, err := os.OpenRoot(dir)
	if err != nil {
		return st, fmt.Errorf("walk %s: %w", dir, err)
	}
	defer root.Close()
	w := &walker{ctx: ctx, opts: opts, st: &st, fn: fn, entries: opts.Counted}
	if err := w.dir(root, ""); err != nil {
		return st, err
	}
	return st, nil
}

// dir walks the directory open as d, whose path is rel ("" for the root).
func (w *walker) dir(d *os.Root, rel string) error {
	if err := w.ctx.Err(); err != nil {
		return err
	}
	names, err := rootNames(d)
	if err != nil {
		if rel != "" && errors.Is(err, fs.ErrNotExist) {
			return nil // removed while being read
		}
		return fmt.Errorf("read directory %q: %w", rel, err)
	}
	slices.Sort(names)
	for _, name := range names {
		if slices.Contains(w.opts.Excludes, name) {
			continue
		}
		child := name
		if rel != "" {
			child = rel + "/" + name
		}
		if err := winname.Component(name); err != nil {
			w.st.skip(child, "its name cannot be restored as it is: "+err.Error())
			continue
		}
		fi, err := d.Lstat(name)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				w.st.skip(child, "cannot be examined: "+err.Error())
			}
			continue
		}
		e := infoEntry(child, fi)
		switch fi.Mode().Type() {
		case fs.ModeDir:
			if !w.admit(child) {
				continue
			}
			sub, err := openSubRoot(d, name)
			if err != nil {
				w.entries--
				w.vanishedOr(child, err)
				continue
			}
			w.st.Dirs++
			err = w.fn(e, nil)
			if err == nil {
				err = w.dir(sub, child)
			}
			sub.Close()
			if err != nil {
				return err
			}
		case 0:
			if !w.admit(child) {
				continue
			}
			if e.Size > w.opts.MaxBytes-w.st.Bytes {
				w.entries--
				w.st.skip(child, fmt.Sprintf("its %d bytes would take the snapshot past %d bytes, the most a restore accepts", e.Size, w.opts.MaxBytes))
				continue
			}
			w.st.Files++
			w.st.Bytes += e.Size
			if err := w.fn(e, func() (*os.File, Entry, error) { return openFile(d, name, child) }); err != nil {
				return err
			}
		case fs.ModeSymlink:
			if !w.admit(child) {
				continue
			}
			target, err := d.Readlink(name)
			if err != nil {
				w.entries--
				if !errors.Is(err, fs.ErrNotExist) {
					w.st.skip(child, "cannot be read: "+err.Error())
				}
				continue
			}
			target = filepath.ToSlash(target)
			clean, ok := CleanTarget(child, target)
			if !ok || winname.Target(clean) != nil {
				w.entries--
				w.st.skip(child, "symbolic link to an absolute path or out of the tree")
				continue
			}
			e.Target = clean
			w.st.Symlinks++
			if err := w.fn(e, nil); err != nil {
				return err
			}
		default: // junctions and other reparse points, devices
			w.st.skip(child, "not a regular file, directory or symbolic link (a junction or other reparse point?)")
		}
	}
	return nil
}

func (w *walker) vanishedOr(rel string, err error) {
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case errors.Is(err, errLinked):
		w.st.skip(rel, "it changed into a symbolic link or another type while being read")
	default:
		w.st.skip(rel, "cannot be read: "+err.Error())
	}
}

func openFile(d *os.Root, name, rel string) (*os.File, Entry, error) {
	f, fi, err := openRegular(d, name)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errLinked) {
			return nil, Entry{}, fmt.Errorf("open %q: %w (%w)", rel, ErrChanged, err)
		}
		return nil, Entry{}, fmt.Errorf("open %q: %w", rel, err)
	}
	return f, infoEntry(rel, fi), nil
}

// Reader opens files of a tree by path after a walk: each parent directory is opened
// from the one above it (openSubRoot), never through a link. It keeps the last parent
// open, since files are asked for in path order. Not safe for concurrent use.
type Reader struct {
	root    *os.Root
	lastDir string
	last    *os.Root
}

// NewReader opens dir as the root of the files to read.
func NewReader(dir string) (*Reader, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	return &Reader{root: root}, nil
}

// Open opens the regular file p (a path as Check accepts); see Opener.
func (r *Reader) Open(p string) (*os.File, Entry, error) {
	if err := CheckPath(p, 0); err != nil {
		return nil, Entry{}, err
	}
	if err := windowsName(p); err != nil {
		return nil, Entry{}, err
	}
	dir, name := path.Split(p)
	dir = strings.TrimSuffix(dir, "/")
	d, err := r.dirRoot(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errLinked) {
			return nil, Entry{}, fmt.Errorf("open %q: %w (%w)", p, ErrChanged, err)
		}
		return nil, Entry{}, fmt.Errorf("open %q: %w", p, err)
	}
	return openFile(d, name, p)
}

func (r *Reader) dirRoot(dir string) (*os.Root, error) {
	if dir == "" {
		return r.root, nil
	}
	if r.last != nil && r.lastDir == dir {
		return r.last, nil
	}
	if r.last != nil {
		r.last.Close()
		r.last = nil
	}
	d := r.root
	for c := range strings.SplitSeq(dir, "/") {
		next, err := openSubRoot(d, c)
		if d != r.root {
			d.Close()
		}
		if err != nil {
			return nil, err
		}
		d = next
	}
	r.lastDir, r.last = dir, d
	return d, nil
}

// Close releases the handles.
func (r *Reader) Close() error {
	if r.last != nil {
		r.last.Close()
		r.last = nil
	}
	return r.root.Close()
}
