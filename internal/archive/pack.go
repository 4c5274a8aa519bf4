// Package archive writes a directory tree as one tar.gz and extracts such an archive back,
// hardened against archives crafted to escape the destination.
//
// Pack compresses with parallel gzip (klauspost/pgzip); the output is a standard gzip
// stream that GNU tar and gzip read. Extract does every filesystem call through an
// os.Root opened on the destination and refuses, entry by entry, anything that could
// reach outside it: .. components, absolute names, links that point out, device and fifo
// entries, over-long names, and archives bigger than a bound (a gzip bomb).
//
// The package imports nothing else of toolhost; the sandbox providers and internal/snapshot
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
	"runtime"
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

// Skip is an entry Pack left out, and why.
type Skip struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// MaxReportedSkips bounds PackStats.Skips.
const MaxReportedSkips = 100

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
// between a file and a link to a host file while its snapshot is taken). So below dir
// Pack never resolves a path: every entry is opened relative to its parent's descriptor
// with O_NOFOLLOW, and its type is taken from the open descriptor (fstat), so an entry
// swapped for a link is refused by the kernel at the open, and one swapped for a fifo or
// a device is seen as such and skipped without blocking.
//
// Pack does not close w. On error the output is incomplete and must be discarded.
func Pack(ctx context.Context, w io.Writer, dir string, opts PackOptions) (PackStats, error) {
	start := time.Now()
	var st PackStats
	root, err := openPackRoot(dir)
	if err != nil {
		return st, fmt.Errorf("archive: pack %s: %w", dir, err)
	}
	defer root.Close()
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
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultMaxEntries
	}
	if opts.MaxNameLen <= 0 {
		opts.MaxNameLen = DefaultMaxNameLen
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
	// entries starts at 1: the root's own entry counts, as it does for Extract.
	p := &packer{ctx: ctx, tw: tar.NewWriter(zw), excludes: excludes, opts: opts, st: &st, entries: 1, progress: opts.Progress, buf: make([]byte, 256<<10)}
	err = p.dir(root, ".")
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

// errVanished: a directory was removed while Pack read it; it is left out, silently.
var errVanished = errors.New("vanished")

type packer struct {
	ctx      context.Context
	tw       *tar.Writer
	excludes []string
	opts     PackOptions
	st       *PackStats
	entries  int
	progress func(int64)
	buf      []byte
}

// skip records an entry left out.
func (p *packer) skip(rel, reason string) {
	p.st.Skipped++
	if len(p.st.Skips) < MaxReportedSkips {
		p.st.Skips = append(p.st.Skips, Skip{Path: rel, Reason: reason})
	}
}

// admit counts an entry against MaxEntries and MaxNameLen; false means skip it.
func (p *packer) admit(rel string) bool {
	if len(rel)+1 > p.opts.MaxNameLen { // +1: directories are stored with a trailing '/'
		p.skip(truncName(rel), fmt.Sprintf("its path is longer than %d bytes", p.opts.MaxNameLen))
		return false
	}
	if p.entries >= p.opts.MaxEntries {
		p.skip(rel, fmt.Sprintf("the archive already holds %d entries, the most a restore accepts", p.opts.MaxEntries))
		return false
	}
	p.entries++
	return true
}

func truncName(s string) string {
	if len(s) <= 200 {
		return s
	}
	return s[:200] + "..."
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

// linkInfo is the fs.FileInfo writeHeader needs for a symbolic link.
type linkInfo struct {
	name  string
	mtime time.Time
}

func (l linkInfo) Name() string       { return l.name }
func (l linkInfo) Size() int64        { return 0 }
func (l linkInfo) Mode() fs.FileMode  { return fs.ModeSymlink | 0o777 }
func (l linkInfo) ModTime() time.Time { return l.mtime }
func (l linkInfo) IsDir() bool        { return false }
func (l linkInfo) Sys() any           { return nil }

// fileBody writes the open regular file f (fi its Stat) as the entry rel.
func (p *packer) fileBody(f *os.File, fi fs.FileInfo, rel string) error {
	if fi.Size() > p.opts.MaxBytes-p.st.BytesIn {
		p.entries--
		p.skip(rel, fmt.Sprintf("its %d bytes would take the archive past %d bytes, the most a restore accepts", fi.Size(), p.opts.MaxBytes))
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
			// Unreadable part way (an I/O error): keep the archive well formed.
			p.skip(rel, "read failed part way, the rest is zeros: "+rerr.Error())
			break
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

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}
