package archive

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"time"

	"github.com/klauspost/pgzip"

	"github.com/toolhost/toolhost/internal/tree"
)

// Limits Extract applies when ExtractOptions leaves them zero: the tree's (internal/tree),
// so that a tree one format stores the other restores.
const (
	DefaultMaxBytes   = tree.DefaultMaxBytes   // 16 GiB of file contents
	DefaultMaxEntries = tree.DefaultMaxEntries // the root's own entry included
	DefaultMaxNameLen = tree.DefaultMaxNameLen // bytes, for entry names and link targets (PATH_MAX)
)

// Errors callers branch on; test with errors.Is. They are the tree's (internal/tree):
// the rules an archive is held to are the tree's, whichever format carries it.
var (
	// ErrUnsafe: the archive holds an entry that could reach outside the destination or
	// that Extract does not create (device, fifo); the message names the entry.
	ErrUnsafe = tree.ErrUnsafe
	// ErrTooLarge: the archive exceeds ExtractOptions.MaxBytes or MaxEntries.
	ErrTooLarge = tree.ErrTooLarge
	// ErrNotEmpty: Extract's destination already holds files.
	ErrNotEmpty = tree.ErrNotEmpty
)

// ExtractOptions configure Extract. The zero value is ready to use.
type ExtractOptions struct {
	// MaxBytes bounds the total size of the file contents written; 0 means
	// DefaultMaxBytes or the free space of the destination's file system (less a 64 MiB
	// reserve), whichever is smaller. An entry that would pass the bound is refused
	// before its bytes land, so a gzip bomb cannot fill the disk.
	MaxBytes int64
	// MaxEntries bounds the number of entries; 0 means DefaultMaxEntries.
	MaxEntries int
	// MaxNameLen bounds the length of entry names and link targets; 0 means
	// DefaultMaxNameLen.
	MaxNameLen int
	// Progress, when set, is called from Extract's goroutine after each chunk with the
	// uncompressed bytes written so far.
	Progress func(bytesOut int64)
}

// ExtractStats describe what Extract created.
type ExtractStats struct {
	Files     int
	Dirs      int
	Symlinks  int
	Hardlinks int
	Bytes     int64 // file contents written
	Duration  time.Duration
	// Backup is set by ExtractReplace when it moved a non-empty destination aside:
	// the path the previous contents now live at.
	Backup string
}

// Extract reads a gzip-compressed tar stream from r and recreates it under dir.
//
// dir must be empty or not exist yet (its parent must); Extract never merges an archive
// into existing files, so nothing already there can be lost or reached through a link.
// A non-empty dir gives ErrNotEmpty: use ExtractReplace to restore over existing work.
//
// Each entry is judged first (the rules below, shared with Filter), then created by the
// tree's Writer (tree.NewWriter), which makes every filesystem call relative to a
// directory it made itself, never through a link. An entry is refused (ErrUnsafe, the message names it) when its name is absolute, has a ..
// component, is longer than MaxNameLen or lies below a symbolic link; when it is a
// symbolic link whose target is absolute, leaves dir, or has a .. after a normal
// component; when it is a hard link to anything but a regular file extracted earlier from
// the same archive; when it would replace a directory; or when it is a device, fifo or
// any other special type. Permission bits are kept (masked to 0777, so no setuid), as are
// modification times of files and directories; owners are not restored. The root entry
// ("./") changes nothing: dir keeps its own mode and times.
//
// On error, what was extracted so far stays in dir (never outside it); the caller
// discards dir. Nothing outside dir is created or changed.
func Extract(ctx context.Context, r io.Reader, dir string, opts ExtractOptions) (ExtractStats, error) {
	start := time.Now()
	w, err := tree.NewWriter(ctx, dir, tree.WriterOptions{MaxEntries: opts.MaxEntries, MaxNameLen: opts.MaxNameLen, MaxBytes: opts.MaxBytes})
	if err != nil {
		return ExtractStats{}, fmt.Errorf("archive: extract: %w", err)
	}
	x := &extractor{ctx: ctx, w: w, progress: opts.Progress,
		j: newJudge(true, opts.MaxBytes, opts.MaxEntries, opts.MaxNameLen)}
	err = x.run(r)
	ws, cerr := w.Close()
	if err == nil {
		err = cerr
	}
	st := ExtractStats{Files: x.j.files, Dirs: x.j.dirs, Symlinks: x.j.symlinks, Hardlinks: x.j.hardlinks, Bytes: ws.Bytes, Duration: time.Since(start)}
	if err != nil {
		return st, fmt.Errorf("archive: extract into %s: %w", dir, err)
	}
	return st, nil
}

// ExtractReplace extracts like Extract, but dir may hold files: the archive is extracted
// into a new sibling directory first, and only when that succeeds is it swapped in. A
// non-empty dir is renamed to "<dir>.before-restore-<UTC time>" (reported in
// ExtractStats.Backup), never deleted, so nothing is lost; an empty dir is replaced. On
// error dir is untouched and the partial extraction is removed.
//
// The swap is two renames in dir's parent; a process holding dir open (or a bind mount of
// it) keeps seeing the old tree.
func ExtractReplace(ctx context.Context, r io.Reader, dir string, opts ExtractOptions) (ExtractStats, error) {
	var st ExtractStats
	extracting := false // Extract's errors say "archive: extract into" already
	backup, err := tree.Replace(dir, func(tmp string) error {
		var err error
		st, err = Extract(ctx, r, tmp, opts)
		extracting = err != nil
		return err
	})
	st.Backup = backup
	if err != nil && !extracting {
		err = fmt.Errorf("archive: extract into %s: %w", dir, err)
	}
	return st, err
}

// extractor feeds the entries of a tar stream, each judged by the archive's rules (judge),
// to the tree's Writer, which creates them: every filesystem call goes through it.
type extractor struct {
	ctx      context.Context
	w        *tree.Writer
	j        *judge
	progress func(int64)
	bytes    int64
}

func (x *extractor) run(r io.Reader) error {
	zr, err := pgzip.NewReader(r)
	if err != nil {
		return fmt.Errorf("read gzip header: %w", err)
	}
	defer zr.Close() // stops pgzip's read-ahead goroutine
	tr := tar.NewReader(zr)
	for {
		if err := x.ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read archive after %d entries: %w", x.j.entries, err)
		}
		out, replaces, err := x.j.next(hdr)
		if err != nil {
			return err
		}
		if out == nil {
			continue
		}
		if err := x.entry(hdr, out, replaces, tr); err != nil {
			return err
		}
	}
	return trailer(zr, true)
}

// Files are written on the Writer's goroutines (restore at the disk's pace, not one file
// at a time): a file of at most parallelMax bytes is read whole from the archive and
// handed over; larger files are written on this goroutine, as they are read.
const parallelMax = 1 << 20

// entry creates the judged entry out (hdr as the archive gave it; r its contents).
func (x *extractor) entry(hdr, out *tar.Header, replaces bool, r io.Reader) error {
	e := tree.Entry{Path: strings.TrimSuffix(out.Name, "/"), Mode: fs.FileMode(out.Mode) & fs.ModePerm}
	if !hdr.ModTime.IsZero() {
		e.MTime = hdr.ModTime.UnixNano()
	}
	if replaces {
		if err := x.w.Remove(e.Path); err != nil {
			return err
		}
	}
	switch out.Typeflag {
	case tar.TypeDir:
		e.Type = tree.Dir
		return x.w.Dir(e)
	case tar.TypeSymlink:
		e.Type, e.Target, e.MTime = tree.Symlink, out.Linkname, 0
		return x.w.Symlink(e)
	case tar.TypeLink:
		e.Type = tree.File
		return x.w.Link(e, out.Linkname)
	}
	e.Type, e.Size = tree.File, out.Size
	if e.Size > parallelMax {
		return x.w.FileFrom(e, progressReader{r, x}, nil)
	}
	data := make([]byte, e.Size)
	if _, err := io.ReadFull(r, data); err != nil {
		return fmt.Errorf("entry %q: %w", hdr.Name, err)
	}
	x.add(len(data))
	return x.w.File(e, data, nil)
}

func (x *extractor) add(n int) {
	x.bytes += int64(n)
	if x.progress != nil {
		x.progress(x.bytes)
	}
}

// progressReader reports what is read through it to the extractor's Progress.
type progressReader struct {
	r io.Reader
	x *extractor
}

func (p progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.x.add(n)
	return n, err
}

// trailer reads what follows the tar end marker so gzip verifies its CRC and length; a
// little padding is normal, more is refused (strict) or dropped.
func trailer(zr io.Reader, strict bool) error {
	n, err := io.CopyN(io.Discard, zr, 1<<20+1)
	if err != nil && err != io.EOF {
		return fmt.Errorf("read archive trailer: %w", err)
	}
	if n > 1<<20 && strict {
		return fmt.Errorf("%w: more than 1 MiB of data after the end of the archive", ErrUnsafe)
	}
	return nil
}
