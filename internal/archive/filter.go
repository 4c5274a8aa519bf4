package archive

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"path"
	"runtime"
	"time"

	"github.com/klauspost/pgzip"

	"github.com/toolhost/toolhost/internal/tree"
)

// FilterOptions configure Filter. The zero value skips what Extract would refuse.
type FilterOptions struct {
	// Strict makes the first entry Extract would refuse fail the whole filter (with
	// ErrUnsafe or ErrTooLarge, as Extract would), instead of being skipped and reported.
	Strict bool
	// Level and Concurrency are the output's gzip level and parallelism, as for Pack.
	Level       int
	Concurrency int
	// MaxBytes, MaxEntries and MaxNameLen are Extract's bounds, with its defaults
	// (MaxBytes defaults to DefaultMaxBytes: Filter has no destination to measure).
	MaxBytes   int64
	MaxEntries int
	MaxNameLen int
	// Plain says r is an uncompressed tar stream (a remote sandbox's tar, sent as is so
	// that the host compresses it); otherwise r is gzip-compressed. The output is
	// gzip-compressed either way.
	Plain bool
	// Links names symbolic links already in the destination (clean, relative), for an
	// extraction into a directory that is not empty: an entry below one is judged as
	// Extract judges an entry below a link the archive made.
	Links []string
}

// FilterStats describe what Filter wrote.
type FilterStats struct {
	Files     int
	Dirs      int
	Symlinks  int
	Hardlinks int
	// Skipped counts the entries left out (never with Strict); Skips names the first
	// MaxReportedSkips of them and why.
	Skipped  int
	Skips    []Skip
	Bytes    int64 // file contents copied
	BytesOut int64 // compressed bytes written to w
	Duration time.Duration
}

// Filter reads a gzip-compressed tar stream (or, with Plain, an uncompressed one) from r, one that no one vouches for (a
// sandbox's own tar, a snapshot from a store), and writes to w a new gzip-compressed tar
// stream that Extract accepts whole into an empty directory, without touching any file
// system. Each entry is judged by Extract's rules (names, link targets, hard links,
// entry types, what lies below a link or file, directories replaced, and the bounds)
// against the entries before it, as Extract would find them on disk. With Strict, an
// entry Extract would refuse fails Filter with Extract's error; otherwise it is skipped
// and reported, and a symbolic link is first given its lexically cleaned target, as Pack
// stores it.
//
// What is written is rebuilt, never copied: entry names are cleaned, permission bits
// masked to 0777, modification times kept to the second, and owners, extended headers,
// the root's own entry and everything else of the input dropped. So a reader other than Extract (GNU tar in a
// remote sandbox) sees only plain entries, and cannot read the input differently from
// the way it was judged here.
//
// On error the output is incomplete and must be discarded. Filter does not close w.
func Filter(ctx context.Context, w io.Writer, r io.Reader, opts FilterOptions) (FilterStats, error) {
	start := time.Now()
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	level := opts.Level
	if level == 0 {
		level = DefaultLevel
	}
	blocks := opts.Concurrency
	if blocks <= 0 {
		blocks = runtime.GOMAXPROCS(0)
	}
	x := newExtractor(ctx, nil, ExtractOptions{MaxBytes: opts.MaxBytes, MaxEntries: opts.MaxEntries, MaxNameLen: opts.MaxNameLen})
	f := &filter{x: x, strict: opts.Strict, kinds: map[string]byte{".": 'd'}}
	for _, l := range opts.Links {
		if name, err := x.checkName(l); err == nil && name != "." {
			f.kinds[name] = 'l'
		}
	}

	in := r
	if !opts.Plain {
		zr, err := pgzip.NewReader(r)
		if err != nil {
			return f.st, fmt.Errorf("archive: filter: read gzip header: %w", err)
		}
		defer zr.Close() // stops pgzip's read-ahead goroutine
		in = zr
	}
	cw := &countWriter{w: w}
	zw, err := pgzip.NewWriterLevel(cw, level)
	if err != nil {
		return f.st, fmt.Errorf("archive: filter: %w", err)
	}
	if err := zw.SetConcurrency(1<<20, max(blocks, 2)); err != nil {
		return f.st, fmt.Errorf("archive: filter: %w", err)
	}
	f.tw = tar.NewWriter(zw)
	err = f.run(tar.NewReader(in))
	if err == nil {
		err = f.trailer(in)
	}
	if err == nil {
		err = f.tw.Close()
	}
	if cerr := zw.Close(); err == nil && cerr != nil {
		err = cerr
	}
	f.st.BytesOut = cw.n
	f.st.Duration = time.Since(start)
	if err != nil {
		return f.st, fmt.Errorf("archive: filter: %w", err)
	}
	return f.st, nil
}

type filter struct {
	x      *extractor // for its checks and bounds; it has no root and touches no file
	strict bool
	tw     *tar.Writer
	st     FilterStats
	// kinds says what Extract would have at each name so far: 'd' a directory, 'f' a
	// regular file, 'l' a symbolic link. x.files holds the valid hard link targets.
	kinds   map[string]byte
	entries int
}

func (f *filter) run(tr *tar.Reader) error {
	for {
		if err := f.x.ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read archive after %d entries: %w", f.entries, err)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		f.entries++
		if f.entries > f.x.opts.MaxEntries {
			err := fmt.Errorf("entry %q: more than %d entries: %w", hdr.Name, f.x.opts.MaxEntries, ErrTooLarge)
			if f.strict {
				return err
			}
			f.skip(hdr.Name, err)
			continue
		}
		out, err := f.judge(hdr)
		if err != nil {
			if f.strict {
				return err
			}
			f.entries--
			f.skip(hdr.Name, err)
			continue
		}
		if out == nil {
			continue // the root, or a hard link to itself: nothing to write
		}
		if err := f.tw.WriteHeader(out); err != nil {
			return fmt.Errorf("write header for %s: %w", out.Name, err)
		}
		if out.Typeflag == tar.TypeReg {
			if err := f.copy(out, tr); err != nil {
				return err
			}
		}
	}
}

// trailer reads what follows the tar end marker so gzip verifies its CRC and length; as
// in Extract, a little padding is normal and more is refused (with Strict) or dropped.
func (f *filter) trailer(zr io.Reader) error {
	n, err := io.CopyN(io.Discard, zr, 1<<20+1)
	if err != nil && err != io.EOF {
		return fmt.Errorf("read archive trailer: %w", err)
	}
	if n > 1<<20 && f.strict {
		return fmt.Errorf("%w: more than 1 MiB of data after the end of the archive", ErrUnsafe)
	}
	return nil
}

func (f *filter) skip(name string, why error) {
	f.st.Skipped++
	if len(f.st.Skips) < MaxReportedSkips {
		f.st.Skips = append(f.st.Skips, Skip{Path: truncName(name), Reason: why.Error()})
	}
}

// judge applies Extract's rules to hdr and returns the header to write (nil: nothing),
// updating what the destination would hold.
func (f *filter) judge(hdr *tar.Header) (*tar.Header, error) {
	x := f.x
	name, err := x.checkName(hdr.Name)
	if err != nil {
		return nil, err
	}
	out := &tar.Header{Mode: hdr.Mode & 0o777, ModTime: hdr.ModTime.Truncate(time.Second), Format: tar.FormatUnknown}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if name == "." {
			// The destination's own mode and times are the caller's (Extract changes
			// nothing for it): a root entry is not passed on.
			f.st.Dirs++
			return nil, nil
		}
		if err := f.parents(hdr.Name, name); err != nil {
			return nil, err
		}
		if k := f.kinds[name]; k == 'f' || k == 'l' {
			return nil, fmt.Errorf("entry %q: a link or file of that name exists: %w", hdr.Name, ErrUnsafe)
		}
		f.kinds[name] = 'd'
		f.st.Dirs++
		out.Typeflag, out.Name = tar.TypeDir, name+"/"
		return out, nil

	case tar.TypeReg, tar.TypeGNUSparse: // tar.Reader reports the old TypeRegA as TypeReg
		if name == "." {
			return nil, fmt.Errorf("entry %q: a file cannot be the root: %w", hdr.Name, ErrUnsafe)
		}
		if hdr.Size < 0 || hdr.Size > x.opts.MaxBytes-f.st.Bytes {
			return nil, fmt.Errorf("entry %q: %d bytes would pass the limit of %d: %w", hdr.Name, hdr.Size, x.opts.MaxBytes, ErrTooLarge)
		}
		if err := f.parents(hdr.Name, name); err != nil {
			return nil, err
		}
		if err := f.clearSpot(hdr.Name, name); err != nil {
			return nil, err
		}
		f.kinds[name] = 'f'
		x.files[name] = true
		f.st.Files++
		out.Typeflag, out.Name, out.Size = tar.TypeReg, name, hdr.Size
		return out, nil

	case tar.TypeSymlink:
		if name == "." {
			return nil, fmt.Errorf("entry %q: a link cannot be the root: %w", hdr.Name, ErrUnsafe)
		}
		link := *hdr
		if !f.strict {
			if clean, ok := tree.CleanTarget(name, hdr.Linkname); ok {
				link.Linkname = clean
			}
		}
		if err := x.checkLinkTarget(&link, name); err != nil {
			return nil, err
		}
		if err := f.parents(hdr.Name, name); err != nil {
			return nil, err
		}
		if err := f.clearSpot(hdr.Name, name); err != nil {
			return nil, err
		}
		f.kinds[name] = 'l'
		f.st.Symlinks++
		out.Typeflag, out.Name, out.Linkname, out.Mode = tar.TypeSymlink, name, link.Linkname, 0o777
		return out, nil

	case tar.TypeLink:
		if name == "." {
			return nil, fmt.Errorf("entry %q: a link cannot be the root: %w", hdr.Name, ErrUnsafe)
		}
		target, err := x.checkName(hdr.Linkname)
		if err != nil {
			return nil, fmt.Errorf("entry %q: hard link target %q refused: %w", hdr.Name, hdr.Linkname, ErrUnsafe)
		}
		if !x.files[target] {
			return nil, fmt.Errorf("entry %q: hard link to %q, which is not a regular file extracted earlier from this archive: %w", hdr.Name, hdr.Linkname, ErrUnsafe)
		}
		if err := f.parents(hdr.Name, name); err != nil {
			return nil, err
		}
		if name == target {
			return nil, nil
		}
		if err := f.clearSpot(hdr.Name, name); err != nil {
			return nil, err
		}
		f.kinds[name] = 'f'
		x.files[name] = true
		f.st.Hardlinks++
		out.Typeflag, out.Name, out.Linkname = tar.TypeLink, name, target
		return out, nil

	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return nil, fmt.Errorf("entry %q: device or fifo entries are not extracted: %w", hdr.Name, ErrUnsafe)
	default:
		return nil, fmt.Errorf("entry %q: unsupported entry type %q: %w", hdr.Name, hdr.Typeflag, ErrUnsafe)
	}
}

// parents is Extract's checkParents without a disk: every directory above name must be
// a directory (or missing: Extract creates it), never a link or a file.
func (f *filter) parents(entry, name string) error {
	var missing []string
	for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
		k := f.kinds[dir]
		if k == 'd' {
			break // its own parents were checked when it was made, and a directory stays one
		}
		if k == 'f' || k == 'l' {
			return fmt.Errorf("entry %q: %s is not a directory (a link or file), refusing to write below it: %w", entry, dir, ErrUnsafe)
		}
		missing = append(missing, dir)
	}
	for _, d := range missing {
		f.kinds[d] = 'd'
	}
	return nil
}

// clearSpot is Extract's: a directory is never replaced; a file or link is.
func (f *filter) clearSpot(entry, name string) error {
	if f.kinds[name] == 'd' {
		return fmt.Errorf("entry %q: would replace a directory: %w", entry, ErrUnsafe)
	}
	delete(f.x.files, name)
	return nil
}

func (f *filter) copy(hdr *tar.Header, r io.Reader) error {
	x := f.x
	var written int64
	for written < hdr.Size {
		if err := x.ctx.Err(); err != nil {
			return err
		}
		n, rerr := r.Read(x.buf[:min(int64(len(x.buf)), hdr.Size-written)])
		if n > 0 {
			if _, err := f.tw.Write(x.buf[:n]); err != nil {
				return fmt.Errorf("write %s: %w", hdr.Name, err)
			}
			written += int64(n)
			f.st.Bytes += int64(n)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return fmt.Errorf("read entry %q: %w", hdr.Name, rerr)
		}
	}
	if written != hdr.Size {
		return fmt.Errorf("read entry %q: %d of %d bytes: %w", hdr.Name, written, hdr.Size, io.ErrUnexpectedEOF)
	}
	return nil
}

func truncName(s string) string {
	if len(s) <= 200 {
		return s
	}
	return s[:200] + "..."
}
