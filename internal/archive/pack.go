// Package archive is the tar.gz codec of a file tree, hardened against archives crafted
// to escape the destination. It reads and writes no tree itself: the tree layer
// (internal/tree) walks, checks and writes, and this package turns its entries into a tar
// stream and back.
//
// Pack walks the tree with tree.Walk and compresses with parallel gzip
// (klauspost/pgzip); the output is a standard gzip stream that GNU tar and gzip read.
// Extract judges each entry by the tree's rules and the archive's own (hard links,
// duplicates, what lies below a link) and creates it with the tree's Writer, refusing
// anything that could reach outside the destination: .. components, absolute names,
// links that point out, device and fifo entries, over-long names, and archives bigger
// than a bound (a gzip bomb). Filter applies the same judge without a disk.
//
// The package imports nothing else of toolhost but internal/tree; the sandbox providers
// and internal/snapshot build on it.
package archive

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime"
	"time"

	"github.com/klauspost/pgzip"

	"github.com/toolhost/toolhost/internal/tree"
)

// DefaultExcludes are the base names Pack leaves out when PackOptions.Excludes is nil:
// the tree's (tree.DefaultExcludes), dependency trees, build output, version control and
// virtual environments, all of which can be recreated from the rest of the workspace.
var DefaultExcludes = tree.DefaultExcludes

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
	// MaxBytes, MaxEntries and MaxNameLen are the bounds of what Pack stores, the same as
	// Extract's (and with the same defaults), so that every archive Pack makes can be
	// extracted again: a file that would pass MaxBytes, an entry past MaxEntries and a
	// name longer than MaxNameLen are skipped and reported, never failing the whole pack.
	MaxBytes   int64
	MaxEntries int
	MaxNameLen int
	// Progress, when set, is called from Pack's goroutine after each chunk with the
	// uncompressed bytes read so far.
	Progress func(bytesIn int64)
}

// PackStats describe what Pack wrote.
type PackStats struct {
	Files    int // regular files
	Dirs     int // directories, the root included
	Symlinks int
	// Skipped counts entries left out: sockets, devices, fifos, symbolic links that are
	// absolute or point out of the tree (Extract would refuse them), entries that cannot
	// be read, and entries past a bound. Excluded names are not counted.
	Skipped int
	// Skips names the first MaxReportedSkips skipped entries and why.
	Skips []Skip
	// Changed counts files that shrank while being read; their missing tail is zeros.
	Changed  int
	BytesIn  int64 // file contents read
	BytesOut int64 // compressed bytes written to w
	Duration time.Duration
}

// Skip is an entry Pack left out, and why (the tree walk's).
type Skip = tree.Skip

// MaxReportedSkips bounds PackStats.Skips.
const MaxReportedSkips = tree.MaxReportedSkips

// Pack writes dir as a gzip-compressed tar stream to w.
//
// Entries are named relative to dir, with forward slashes, in sorted order (so the same
// tree gives the same archive). Directories, regular files and symbolic links are kept
// with their permission bits (no setuid, setgid or sticky bit) and modification times
// (to the second); symbolic links are stored as links and never followed. Hard-linked
// files are stored as separate copies. Owners are not recorded. Sockets, devices and
// fifos are skipped, as are symbolic links whose target is absolute or leaves the tree; a
// relative target is stored in its lexically cleaned form. Files that vanish during the
// walk are skipped.
//
// The tree may be changing under Pack, even maliciously (a sandbox swapping an entry
// between a file and a link to a host file while its snapshot is taken). Pack reads it
// with the tree's walk (tree.Walk), which never resolves a path below dir: every entry is
// opened relative to its parent with O_NOFOLLOW (os.Root on Windows), and a file's type
// is taken from the open descriptor, so an entry swapped for a link is refused at the
// open, and one swapped for a fifo or a device is seen as such and skipped without
// blocking. A file is stored with the size the walk bounded; one that shrank meanwhile is
// padded with zeros, one that grew is cut there.
//
// Pack does not close w. On error the output is incomplete and must be discarded.
func Pack(ctx context.Context, w io.Writer, dir string, opts PackOptions) (PackStats, error) {
	start := time.Now()
	var st PackStats
	root, err := os.Stat(dir)
	if err != nil {
		return st, fmt.Errorf("archive: pack %s: %w", dir, err)
	}
	if !root.IsDir() {
		return st, fmt.Errorf("archive: pack %s: not a directory", dir)
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultMaxEntries
	}
	cw := &countWriter{w: w}
	zw, err := newGzipWriter(cw, opts.Level, opts.Concurrency)
	if err != nil {
		return st, fmt.Errorf("archive: pack %s: %w", dir, err)
	}
	p := &packer{ctx: ctx, tw: tar.NewWriter(zw), st: &st, progress: opts.Progress, buf: make([]byte, 256<<10)}
	st.Dirs++
	err = p.header(tree.Entry{Path: ".", Type: tree.Dir, Mode: root.Mode().Perm(), MTime: root.ModTime().UnixNano()})
	if err == nil {
		err = p.walk(dir, opts)
	}
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
	st       *PackStats
	progress func(int64)
	buf      []byte
}

// walk writes every entry below dir, as the tree's walk finds them, within opts' bounds.
// The root's own entry counts against MaxEntries, as it does for Extract.
func (p *packer) walk(dir string, opts PackOptions) error {
	wst, err := tree.Walk(p.ctx, dir, tree.WalkOptions{Excludes: opts.Excludes, MaxEntries: opts.MaxEntries, MaxNameLen: opts.MaxNameLen, MaxBytes: opts.MaxBytes, Counted: 1}, p.entry)
	p.st.Skipped += wst.Skipped
	p.st.Skips = append(wst.Skips[:len(wst.Skips):len(wst.Skips)], p.st.Skips...)
	p.st.Skips = p.st.Skips[:min(len(p.st.Skips), MaxReportedSkips)]
	return err
}

// skip records an entry left out.
func (p *packer) skip(rel, reason string) {
	p.st.Skipped++
	if len(p.st.Skips) < MaxReportedSkips {
		p.st.Skips = append(p.st.Skips, Skip{Path: rel, Reason: reason})
	}
}

func (p *packer) entry(e tree.Entry, open tree.Opener) error {
	switch e.Type {
	case tree.Dir:
		p.st.Dirs++
	case tree.Symlink:
		p.st.Symlinks++
	case tree.File:
		return p.file(e, open)
	}
	return p.header(e)
}

// header writes e's tar header: permission bits, the time to the second, no owner.
func (p *packer) header(e tree.Entry) error {
	hdr := &tar.Header{
		Name:    e.Path,
		Mode:    int64(e.Mode.Perm()),
		ModTime: time.Unix(0, e.MTime).Truncate(time.Second),
		Format:  tar.FormatUnknown,
	}
	switch e.Type {
	case tree.Dir:
		hdr.Typeflag, hdr.Name = tar.TypeDir, e.Path+"/"
	case tree.Symlink:
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.Target
	default:
		hdr.Typeflag, hdr.Size = tar.TypeReg, e.Size
	}
	if err := p.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write header for %s: %w", e.Path, err)
	}
	return nil
}

// file writes the regular file e, opened by open, with the size the walk bounded.
func (p *packer) file(e tree.Entry, open tree.Opener) error {
	f, _, err := open()
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil // vanished during the walk
	case errors.Is(err, tree.ErrChanged):
		p.skip(e.Path, "it changed into a symbolic link or another type while being read")
		return nil
	case err != nil:
		p.skip(e.Path, "cannot be read: "+err.Error())
		return nil
	}
	defer f.Close()
	if err := p.header(e); err != nil {
		return err
	}
	p.st.Files++
	remain := e.Size
	for remain > 0 {
		if err := p.ctx.Err(); err != nil {
			return err
		}
		n, rerr := f.Read(p.buf[:min(int64(len(p.buf)), remain)])
		if n > 0 {
			if _, err := p.tw.Write(p.buf[:n]); err != nil {
				return fmt.Errorf("write %s: %w", e.Path, err)
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
			// Unreadable part way (an I/O error): keep the archive well formed.
			p.skip(e.Path, "read failed part way, the rest is zeros: "+rerr.Error())
			break
		}
	}
	if remain > 0 { // the file shrank after the walk saw it: keep the archive well formed
		p.st.Changed++
		clear(p.buf)
		for remain > 0 {
			n := min(int64(len(p.buf)), remain)
			if _, err := p.tw.Write(p.buf[:n]); err != nil {
				return fmt.Errorf("write %s: %w", e.Path, err)
			}
			remain -= n
		}
	}
	return nil
}

// newGzipWriter is the parallel gzip writer of Pack and Filter: level 0 means
// DefaultLevel, concurrency 0 GOMAXPROCS.
func newGzipWriter(w io.Writer, level, concurrency int) (*pgzip.Writer, error) {
	if level == 0 {
		level = DefaultLevel
	}
	if concurrency <= 0 {
		concurrency = runtime.GOMAXPROCS(0)
	}
	zw, err := pgzip.NewWriterLevel(w, level)
	if err != nil {
		return nil, err
	}
	// pgzip wants at least 2 blocks in flight to overlap reading and compressing.
	if err := zw.SetConcurrency(1<<20, max(concurrency, 2)); err != nil {
		return nil, err
	}
	return zw, nil
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
