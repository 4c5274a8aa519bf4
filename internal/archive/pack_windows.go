//go:build windows

package archive

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/windows"

	"github.com/toolhost/toolhost/internal/winname"

	"github.com/toolhost/toolhost/internal/tree"
)

// On Windows, Pack reads through os.Root: each directory is a Root opened from its
// parent's by one name and checked (os.SameFile) to be the directory Lstat saw, so a
// directory swapped for a link or junction is refused, never followed; a file is opened
// with FILE_FLAG_OPEN_REPARSE_POINT, so a link is opened as itself and refused.

// errLinked: an entry was a link or reparse point, or changed into one.
var errLinked = errors.New("a symbolic link or reparse point, or changed into one")

// openPackRoot opens the directory Pack reads (following a link there: it is the
// caller's).
func openPackRoot(dir string) (*os.Root, error) { return os.OpenRoot(dir) }

// openSubRoot opens the directory name of parent as a Root of its own, refusing a link.
func openSubRoot(parent *os.Root, name string) (*os.Root, error) {
	fi, err := parent.Lstat(name)
	if err != nil {
		return nil, err
	}
	if fi.Mode().Type() != fs.ModeDir {
		return nil, &fs.PathError{Op: "open", Path: name, Err: errLinked}
	}
	sub, err := parent.OpenRoot(name)
	if err != nil {
		return nil, err
	}
	got, err := sub.Stat(".")
	if err != nil || !os.SameFile(fi, got) {
		sub.Close()
		return nil, &fs.PathError{Op: "open", Path: name, Err: errLinked}
	}
	return sub, nil
}

// dir writes the directory d (rel to the root, "." for the root) and everything below it,
// depth first, entries sorted by name.
func (p *packer) dir(d *os.Root, rel string) error {
	if err := p.ctx.Err(); err != nil {
		return err
	}
	fi, err := d.Stat(".")
	if err != nil {
		return err
	}
	df, err := d.Open(".")
	if err != nil {
		return err
	}
	names, err := df.Readdirnames(-1)
	df.Close()
	if err != nil {
		if rel != "." && errors.Is(err, fs.ErrNotExist) {
			return errVanished // removed while being read
		}
		return fmt.Errorf("read directory %s: %w", rel, err)
	}
	if err := p.writeHeader(rel, fi, ""); err != nil {
		return err
	}
	p.st.Dirs++
	slices.Sort(names)
	for _, name := range names {
		if slices.Contains(p.excludes, name) {
			continue
		}
		child := name
		if rel != "." {
			child = rel + "/" + name
		}
		if err := winname.Component(name); err != nil {
			p.skip(child, "its name cannot be restored as it is: "+err.Error())
			continue
		}
		fi, err := d.Lstat(name)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				p.skip(child, "cannot be examined: "+err.Error())
			}
			continue
		}
		switch fi.Mode().Type() {
		case fs.ModeDir:
			if !p.admit(child) {
				continue
			}
			sub, err := openSubRoot(d, name)
			if err != nil {
				p.entries--
				p.vanishedOr(child, err)
				continue
			}
			err = p.dir(sub, child)
			sub.Close()
			if errors.Is(err, errVanished) {
				p.entries--
				continue
			}
			if err != nil {
				return err
			}
		case 0:
			if !p.admit(child) {
				continue
			}
			if err := p.file(d, name, child); err != nil {
				return err
			}
		case fs.ModeSymlink:
			if !p.admit(child) {
				continue
			}
			if err := p.symlink(d, name, child, fi); err != nil {
				return err
			}
		default: // junctions and other reparse points, devices
			p.skip(child, "not a regular file, directory or symbolic link (a junction or other reparse point?)")
		}
	}
	return nil
}

// vanishedOr skips an entry that could not be opened: silently when it is gone, else with
// the reason.
func (p *packer) vanishedOr(rel string, err error) {
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case errors.Is(err, errLinked):
		p.skip(rel, "it changed into a symbolic link or another type while being archived")
	default:
		p.skip(rel, "cannot be read: "+err.Error())
	}
}

func (p *packer) symlink(d *os.Root, name, rel string, fi fs.FileInfo) error {
	target, err := d.Readlink(name)
	if err != nil {
		p.entries--
		if !errors.Is(err, fs.ErrNotExist) {
			p.skip(rel, "cannot be read: "+err.Error())
		}
		return nil
	}
	clean, ok := tree.CleanTarget(rel, filepath.ToSlash(target))
	if !ok || winname.Target(clean) != nil {
		p.entries--
		p.skip(rel, "symbolic link to an absolute path or out of the tree")
		return nil
	}
	p.st.Symlinks++
	return p.writeHeader(rel, linkInfo{name: name, mtime: fi.ModTime()}, clean)
}

func (p *packer) file(d *os.Root, name, rel string) error {
	f, err := d.OpenFile(name, os.O_RDONLY|windows.O_FILE_FLAG_OPEN_REPARSE_POINT, 0)
	if err != nil {
		p.entries--
		p.vanishedOr(rel, err)
		return nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() { // replaced by a link or something else since the Lstat
		p.entries--
		p.skip(rel, "it changed type while being archived")
		return nil
	}
	return p.fileBody(f, fi, rel)
}
