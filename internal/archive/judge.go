package archive

import (
	"archive/tar"
	"fmt"
	"path"
	"time"

	"github.com/toolhost/toolhost/internal/tree"
)

// judge holds each entry of a tar stream to the archive's rules against the entries
// before it, without a disk: names and link targets by the tree's rules (tree.CheckName,
// CheckTarget, CheckPlatform), hard links to a regular file of the same archive only,
// nothing below a link or a file, no directory replaced, no device or fifo, and the
// bounds. Extract creates what it passes (through the tree's Writer); Filter writes it
// to a new archive. One judge, so the two cannot disagree.
type judge struct {
	strict                           bool
	maxBytes                         int64
	maxEntries, maxNameLen           int
	entries                          int   // headers counted against maxEntries
	bytes                            int64 // file contents passed
	files, dirs, symlinks, hardlinks int
	// kinds says what the destination holds at each name so far: 'd' a directory, 'f' a
	// regular file, 'l' a symbolic link. regular holds the valid hard link targets.
	kinds   map[string]byte
	regular map[string]bool
}

func newJudge(strict bool, maxBytes int64, maxEntries, maxNameLen int) *judge {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	if maxEntries <= 0 {
		maxEntries = DefaultMaxEntries
	}
	if maxNameLen <= 0 {
		maxNameLen = DefaultMaxNameLen
	}
	return &judge{strict: strict, maxBytes: maxBytes, maxEntries: maxEntries, maxNameLen: maxNameLen,
		kinds: map[string]byte{".": 'd'}, regular: map[string]bool{}}
}

// next counts hdr against the bound of entries and judges it: the header to write (nil:
// nothing, the root or a hard link to itself) and whether it replaces an earlier file or
// link of that name.
func (j *judge) next(hdr *tar.Header) (out *tar.Header, replaces bool, err error) {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil, false, nil
	}
	j.entries++
	if j.entries > j.maxEntries {
		return nil, false, fmt.Errorf("entry %q: more than %d entries: %w", hdr.Name, j.maxEntries, ErrTooLarge)
	}
	out, replaces, err = j.entry(hdr)
	if err != nil {
		j.entries--
	}
	return out, replaces, err
}

func (j *judge) entry(hdr *tar.Header) (*tar.Header, bool, error) {
	name, err := tree.CheckName(hdr.Name, j.maxNameLen)
	if err != nil {
		return nil, false, err
	}
	out := &tar.Header{Mode: hdr.Mode & 0o777, ModTime: hdr.ModTime.Truncate(time.Second), Format: tar.FormatUnknown}
	if name == "." {
		if hdr.Typeflag == tar.TypeDir {
			// The destination's own mode, owner and times are the caller's: an archive
			// must not open the root to others (0777) or shut its owner out, and a
			// sandbox's agent, which does not own its workspace root, cannot chmod it.
			j.dirs++
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("entry %q: only a directory can be the root: %w", hdr.Name, ErrUnsafe)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := j.parents(hdr.Name, name); err != nil {
			return nil, false, err
		}
		if k := j.kinds[name]; k == 'f' || k == 'l' {
			return nil, false, fmt.Errorf("entry %q: a link or file of that name exists: %w", hdr.Name, ErrUnsafe)
		}
		j.kinds[name] = 'd'
		j.dirs++
		out.Typeflag, out.Name = tar.TypeDir, name+"/"
		return out, false, nil

	case tar.TypeReg, tar.TypeGNUSparse: // tar.Reader reports the old TypeRegA as TypeReg
		if hdr.Size < 0 || hdr.Size > j.maxBytes-j.bytes {
			return nil, false, fmt.Errorf("entry %q: %d bytes would pass the limit of %d: %w", hdr.Name, hdr.Size, j.maxBytes, ErrTooLarge)
		}
		replaces, err := j.place(hdr.Name, name)
		if err != nil {
			return nil, false, err
		}
		j.kinds[name], j.regular[name] = 'f', true
		j.files++
		j.bytes += hdr.Size
		out.Typeflag, out.Name, out.Size = tar.TypeReg, name, hdr.Size
		return out, replaces, nil

	case tar.TypeSymlink:
		target := hdr.Linkname
		if !j.strict {
			if clean, ok := tree.CleanTarget(name, target); ok {
				target = clean
			}
		}
		if err := tree.CheckTarget(name, target, j.maxNameLen); err != nil {
			return nil, false, err
		}
		if err := tree.CheckPlatform(name, target); err != nil {
			return nil, false, err
		}
		replaces, err := j.place(hdr.Name, name)
		if err != nil {
			return nil, false, err
		}
		j.kinds[name] = 'l'
		j.symlinks++
		out.Typeflag, out.Name, out.Linkname, out.Mode = tar.TypeSymlink, name, target, 0o777
		return out, replaces, nil

	case tar.TypeLink:
		target, err := tree.CheckName(hdr.Linkname, j.maxNameLen)
		if err != nil {
			return nil, false, fmt.Errorf("entry %q: hard link target %q refused: %w", hdr.Name, hdr.Linkname, ErrUnsafe)
		}
		if !j.regular[target] {
			return nil, false, fmt.Errorf("entry %q: hard link to %q, which is not a regular file extracted earlier from this archive: %w", hdr.Name, hdr.Linkname, ErrUnsafe)
		}
		if err := j.parents(hdr.Name, name); err != nil {
			return nil, false, err
		}
		if name == target {
			return nil, false, nil
		}
		replaces, err := j.place(hdr.Name, name)
		if err != nil {
			return nil, false, err
		}
		j.kinds[name], j.regular[name] = 'f', true
		j.hardlinks++
		out.Typeflag, out.Name, out.Linkname = tar.TypeLink, name, target
		return out, replaces, nil

	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return nil, false, fmt.Errorf("entry %q: device or fifo entries are not extracted: %w", hdr.Name, ErrUnsafe)
	default:
		return nil, false, fmt.Errorf("entry %q: unsupported entry type %q: %w", hdr.Name, hdr.Typeflag, ErrUnsafe)
	}
}

// place makes way for a non-directory at name: its parents must be directories (or
// missing: they are made), a directory is never replaced, an earlier file or link of
// the name is (replaces).
func (j *judge) place(entry, name string) (replaces bool, err error) {
	if err := j.parents(entry, name); err != nil {
		return false, err
	}
	switch j.kinds[name] {
	case 'd':
		return false, fmt.Errorf("entry %q: would replace a directory: %w", entry, ErrUnsafe)
	case 'f', 'l':
		delete(j.regular, name)
		return true, nil
	}
	return false, nil
}

// parents checks that every directory above name is a directory (or missing: it is made),
// never a link or a file.
func (j *judge) parents(entry, name string) error {
	var missing []string
	for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
		k := j.kinds[dir]
		if k == 'd' {
			break // its own parents were checked when it was made, and a directory stays one
		}
		if k == 'f' || k == 'l' {
			return fmt.Errorf("entry %q: %s is not a directory (a link or file), refusing to write below it: %w", entry, dir, ErrUnsafe)
		}
		missing = append(missing, dir)
	}
	for _, d := range missing {
		j.kinds[d] = 'd'
	}
	return nil
}
