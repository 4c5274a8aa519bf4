// Package archive writes a directory tree as one tar.gz and extracts such an archive back,
// hardened against archives crafted to escape the destination.
//
// Pack compresses with parallel gzip (klauspost/pgzip); the output is a standard gzip
// stream that GNU tar and gzip read. Extract does every filesystem call through an
// os.Root opened on the destination and refuses, entry by entry, anything that could
// reach outside it: .. components, absolute names, links that point out, device and fifo
// entries, over-long names, and archives bigger than a bound (a gzip bomb).
//
// The package imports nothing else of toolhost; the sandbox providers and core/snapshot
// build on it.
package archive

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/klauspost/pgzip"
)

// DefaultExcludes are the base names Pack leaves out when PackOptions.Excludes is nil:
// dependency trees, build output, version control and virtual environments, all of which
// can be recreated from the rest of the workspace.
var DefaultExcludes = []string{"node_modules", ".next", "dist", "build", ".git", "__pycache__", ".venv"}

// DefaultLevel is the gzip level Pack uses when PackOptions.Level is zero.
const DefaultLevel = pgzip.DefaultCompression

// PackOptions configure Pack. The zero value is ready to use.
type PackOptions struct {
	// Excludes lists base names of files and directories to leave out, at any depth.
	// A nil slice means DefaultExcludes; an empty non-nil slice excludes nothing.
	Excludes []string
	// Level is the gzip level, 1 (fastest) to 9 (smallest); 0 means DefaultLevel.
	Level int
	// Concurrency is how many gzip blocks are compressed at once; 0 means GOMAXPROCS.
	Concurrency int
	// Progress, when set, is called from Pack's goroutine after each chunk with the
	// uncompressed bytes read so far.
	Progress func(bytesIn int64)
}

// PackStats describe what Pack wrote.
type PackStats struct {
	Files    int // regular files
	Dirs     int // directories, the root included
	Symlinks int
	// Skipped counts entries left out because they cannot be archived safely: sockets,
	// devices, fifos, and symbolic links that are absolute or point out of the tree
	// (Extract would refuse them). Excluded names are not counted.
	Skipped int
	// Changed counts files that shrank while being read; their missing tail is zeros.
	Changed  int
	BytesIn  int64 // file contents read
	BytesOut int64 // compressed bytes written to w
	Duration time.Duration
}

// Pack writes dir as a gzip-compressed tar stream to w.
//
// Entries are named relative to dir, with forward slashes, in sorted order (so the same
// tree gives the same archive). Directories, regular files and symbolic links are kept
// with their permission bits and modification times (to the second); symbolic links are
// stored as links and never followed. Hard-linked files are stored as separate copies.
// Owners are not recorded. Sockets, devices and fifos are skipped, as are symbolic links
// whose target is absolute or leaves the tree; a relative target is stored in its
// lexically cleaned form. Files that vanish during the walk are skipped.
//
// Pack does not close w. On error the output is incomplete and must be discarded.
func Pack(ctx context.Context, w io.Writer, dir string, opts PackOptions) (PackStats, error) {
	start := time.Now()
	var st PackStats
	info, err := os.Stat(dir)
	if err != nil {
		return st, fmt.Errorf("archive: pack %s: %w", dir, err)
	}
	if !info.IsDir() {
		return st, fmt.Errorf("archive: pack %s: not a directory", dir)
	}
	excludes := opts.Excludes
	if excludes == nil {
		excludes = DefaultExcludes
	}
	level := opts.Level
	if level == 0 {
		level = DefaultLevel
	}
	blocks := opts.Concurrency
	if blocks <= 0 {
		blocks = runtime.GOMAXPROCS(0)
	}

	cw := &countWriter{w: w}
	zw, err := pgzip.NewWriterLevel(cw, level)
	if err != nil {
		return st, fmt.Errorf("archive: pack %s: %w", dir, err)
	}
	// pgzip wants at least 2 blocks in flight to overlap reading and compressing.
	if err := zw.SetConcurrency(1<<20, max(blocks, 2)); err != nil {
		return st, fmt.Errorf("archive: pack %s: %w", dir, err)
	}
	p := &packer{ctx: ctx, tw: tar.NewWriter(zw), root: dir, excludes: excludes, st: &st, progress: opts.Progress, buf: make([]byte, 256<<10)}
	err = p.walk(".")
	if err == nil {
		err = p.tw.Close()
	}
	if cerr := zw.Close(); err == nil && cerr != nil {
		err = cerr
	}
	st.BytesOut = cw.n
	st.Duration = time.Since(start)
	if err != nil {
		return st, fmt.Errorf("archive: pack %s: %w", dir, err)
	}
	return st, nil
}

type packer struct {
	ctx      context.Context
	tw       *tar.Writer
	root     string
	excludes []string
	st       *PackStats
	progress func(int64)
	buf      []byte
}

// walk writes the directory rel (relative to the root, "." for the root) and everything
// below it, depth first, entries sorted by name.
func (p *packer) walk(rel string) error {
	if err := p.ctx.Err(); err != nil {
		return err
	}
	abs := filepath.Join(p.root, rel)
	f, err := os.Open(abs)
	if err != nil {
		if rel != "." && errors.Is(err, fs.ErrNotExist) {
			return nil // vanished during the walk
		}
		return err
	}
	ents, err := f.ReadDir(-1)
	fi, serr := f.Stat()
	f.Close()
	if err != nil {
		return fmt.Errorf("read directory %s: %w", rel, err)
	}
	if serr != nil {
		return serr
	}
	if err := p.writeHeader(rel, fi, ""); err != nil {
		return err
	}
	p.st.Dirs++
	slices.SortFunc(ents, func(a, b os.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	for _, e := range ents {
		name := e.Name()
		if slices.Contains(p.excludes, name) {
			continue
		}
		child := name
		if rel != "." {
			child = rel + "/" + name
		}
		switch t := e.Type(); {
		case t.IsDir():
			if err := p.walk(child); err != nil {
				return err
			}
		case t.IsRegular():
			if err := p.file(child); err != nil {
				return err
			}
		case t&fs.ModeSymlink != 0:
			if err := p.symlink(child); err != nil {
				return err
			}
		default: // sockets, devices, fifos, anything else
			p.st.Skipped++
		}
	}
	return nil
}

func (p *packer) writeHeader(rel string, fi fs.FileInfo, link string) error {
	hdr := &tar.Header{
		Name:    rel,
		Mode:    int64(fi.Mode().Perm()),
		ModTime: fi.ModTime().Truncate(time.Second),
		Format:  tar.FormatUnknown,
	}
	switch {
	case fi.IsDir():
		hdr.Typeflag = tar.TypeDir
		if rel == "." {
			hdr.Name = "./"
		} else {
			hdr.Name = rel + "/"
		}
	case fi.Mode()&fs.ModeSymlink != 0:
		hdr.Typeflag = tar.TypeSymlink
		hdr.Linkname = link
	default:
		hdr.Typeflag = tar.TypeReg
		hdr.Size = fi.Size()
	}
	if err := p.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write header for %s: %w", rel, err)
	}
	return nil
}

func (p *packer) symlink(rel string) error {
	abs := filepath.Join(p.root, rel)
	target, err := os.Readlink(abs)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	clean, ok := cleanLinkTarget(rel, target)
	if !ok {
		p.st.Skipped++
		return nil
	}
	fi, err := os.Lstat(abs)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	p.st.Symlinks++
	return p.writeHeader(rel, fi, clean)
}

func (p *packer) file(rel string) error {
	f, err := os.Open(filepath.Join(p.root, rel))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() { // replaced by something else since the ReadDir
		p.st.Skipped++
		return nil
	}
	if err := p.writeHeader(rel, fi, ""); err != nil {
		return err
	}
	p.st.Files++
	remain := fi.Size()
	for remain > 0 {
		if err := p.ctx.Err(); err != nil {
			return err
		}
		n, rerr := f.Read(p.buf[:min(int64(len(p.buf)), remain)])
		if n > 0 {
			if _, err := p.tw.Write(p.buf[:n]); err != nil {
				return fmt.Errorf("write %s: %w", rel, err)
			}
			remain -= int64(n)
			p.st.BytesIn += int64(n)
			if p.progress != nil {
				p.progress(p.st.BytesIn)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return fmt.Errorf("read %s: %w", rel, rerr)
		}
	}
	if remain > 0 { // the file shrank after the Stat: keep the archive well formed
		p.st.Changed++
		clear(p.buf)
		for remain > 0 {
			n := min(int64(len(p.buf)), remain)
			if _, err := p.tw.Write(p.buf[:n]); err != nil {
				return fmt.Errorf("write %s: %w", rel, err)
			}
			remain -= n
		}
	}
	return nil
}

// cleanLinkTarget returns the lexically cleaned target of a symbolic link named rel and
// whether it is safe to archive: relative, and staying inside the tree when resolved from
// the link's directory. The cleaned form has .. components only at its start, which is
// what Extract accepts.
func cleanLinkTarget(rel, target string) (string, bool) {
	if target == "" || path.IsAbs(target) {
		return "", false
	}
	clean := path.Clean(target)
	if !filepath.IsLocal(path.Join(path.Dir(rel), clean)) {
		return "", false
	}
	return clean, true
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}
