package archive

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
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
	f := &filter{ctx: ctx, j: newJudge(opts.Strict, opts.MaxBytes, opts.MaxEntries, opts.MaxNameLen), buf: make([]byte, 256<<10)}
	for _, l := range opts.Links {
		if name, err := tree.CheckName(l, f.j.maxNameLen); err == nil && name != "." {
			f.j.kinds[name] = 'l'
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
	zw, err := newGzipWriter(cw, opts.Level, opts.Concurrency)
	if err != nil {
		return f.st, fmt.Errorf("archive: filter: %w", err)
	}
	f.tw = tar.NewWriter(zw)
	err = f.run(tar.NewReader(in))
	if err == nil {
		err = trailer(in, opts.Strict)
	}
	if err == nil {
		err = f.tw.Close()
	}
	if cerr := zw.Close(); err == nil && cerr != nil {
		err = cerr
	}
	f.st.Files, f.st.Dirs, f.st.Symlinks, f.st.Hardlinks = f.j.files, f.j.dirs, f.j.symlinks, f.j.hardlinks
	f.st.BytesOut = cw.n
	f.st.Duration = time.Since(start)
	if err != nil {
		return f.st, fmt.Errorf("archive: filter: %w", err)
	}
	return f.st, nil
}

type filter struct {
	ctx context.Context
	j   *judge
	tw  *tar.Writer
	st  FilterStats
	buf []byte
}

func (f *filter) run(tr *tar.Reader) error {
	for {
		if err := f.ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read archive after %d entries: %w", f.j.entries, err)
		}
		out, _, err := f.j.next(hdr)
		if err != nil {
			if f.j.strict {
				return err
			}
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

func (f *filter) skip(name string, why error) {
	f.st.Skipped++
	if len(f.st.Skips) < MaxReportedSkips {
		f.st.Skips = append(f.st.Skips, Skip{Path: truncName(name), Reason: why.Error()})
	}
}

func (f *filter) copy(hdr *tar.Header, r io.Reader) error {
	var written int64
	for written < hdr.Size {
		if err := f.ctx.Err(); err != nil {
			return err
		}
		n, rerr := r.Read(f.buf[:min(int64(len(f.buf)), hdr.Size-written)])
		if n > 0 {
			if _, err := f.tw.Write(f.buf[:n]); err != nil {
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
