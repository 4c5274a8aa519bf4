package chunked

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/klauspost/pgzip"

	"github.com/toolhost/toolhost/internal/tree"
)

// DirSource is a directory on this host as a Lister: a walk that never follows a link
// (tree.Walk), then reads through descriptors opened the same way (tree.Reader).
type DirSource struct {
	Dir  string
	Opts tree.WalkOptions
}

// List walks the directory.
func (d DirSource) List(ctx context.Context) ([]tree.Entry, tree.WalkStats, error) {
	var out []tree.Entry
	st, err := tree.Walk(ctx, d.Dir, d.Opts, func(e tree.Entry, _ tree.Opener) error {
		out = append(out, e)
		return nil
	})
	return out, st, err
}

// Read reads the files named.
func (d DirSource) Read(ctx context.Context, paths []string, fn func(tree.Entry, io.Reader) error) error {
	if len(paths) == 0 {
		return nil
	}
	rd, err := tree.NewReader(d.Dir)
	if err != nil {
		return err
	}
	defer rd.Close()
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return err
		}
		f, e, err := rd.Open(p)
		if errors.Is(err, tree.ErrChanged) {
			continue
		}
		if err != nil {
			return err
		}
		err = fn(e, io.LimitReader(f, e.Size))
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// Root describes the directory itself (its mode and modification time).
func (d DirSource) Root() (uint32, int64) {
	fi, err := os.Stat(d.Dir)
	if err != nil {
		return 0o755, 0
	}
	return uint32(fi.Mode().Perm()), fi.ModTime().UnixNano()
}

// TarSource is a gzip-compressed tar stream as a Streamer: what a sandbox without an
// agent (E2B) sends. Every entry is the sandbox's word: names and link targets are
// checked by tree.Check, devices and fifos are skipped and reported, bounds apply.
type TarSource struct {
	R    io.Reader
	Opts tree.WalkOptions
	// RootMode and RootMTime are filled in from the archive's "./" entry.
	RootMode  uint32
	RootMTime int64
}

// Stream reads the archive.
func (t *TarSource) Stream(ctx context.Context, fn func(tree.Entry, io.Reader) error) (tree.WalkStats, error) {
	var st tree.WalkStats
	maxEntries, maxBytes := t.Opts.MaxEntries, t.Opts.MaxBytes
	if maxEntries <= 0 {
		maxEntries = tree.DefaultMaxEntries
	}
	if maxBytes <= 0 {
		maxBytes = tree.DefaultMaxBytes
	}
	zr, err := pgzip.NewReader(t.R)
	if err != nil {
		return st, fmt.Errorf("read the archive: %w", err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	entries := 0
	for {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return st, fmt.Errorf("read the archive after %d entries: %w", entries, err)
		}
		if h.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		name := strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		if name == "" || name == "." {
			t.RootMode, t.RootMTime = uint32(h.Mode)&0o777, h.ModTime.UnixNano()
			continue
		}
		if entries++; entries > maxEntries {
			return st, fmt.Errorf("entry %q: more than %d entries: %w", h.Name, maxEntries, tree.ErrTooLarge)
		}
		e := tree.Entry{Path: name, Mode: fs.FileMode(h.Mode) & fs.ModePerm, MTime: h.ModTime.UnixNano()}
		var rd io.Reader
		switch h.Typeflag {
		case tar.TypeDir:
			e.Type = tree.Dir
			st.Dirs++
		case tar.TypeReg: // the reader turns the legacy TypeRegA into TypeReg (or TypeDir)
			e.Type, e.Size = tree.File, h.Size
			if h.Size < 0 || h.Size > maxBytes-st.Bytes {
				return st, fmt.Errorf("entry %q: %d bytes pass the limit of %d: %w", h.Name, h.Size, maxBytes, tree.ErrTooLarge)
			}
			st.Files++
			st.Bytes += h.Size
			rd = tr
		case tar.TypeSymlink:
			e.Type, e.Mode, e.Target = tree.Symlink, 0o777, path.Clean(h.Linkname)
			st.Symlinks++
		case tar.TypeLink:
			// A hard link: stored as a copy (the format has no links between files), so
			// its target's entry is given again under this name with the same contents.
			e.Type = tree.File
			e.Target = path.Clean(strings.TrimPrefix(h.Linkname, "./"))
			if err := tree.CheckPath(e.Target, 0); err != nil {
				return st, err
			}
			st.Files++
			rd = hardLink{}
		default:
			st.Skipped++
			if len(st.Skips) < tree.MaxReportedSkips {
				st.Skips = append(st.Skips, tree.Skip{Path: name, Reason: "not a regular file, directory or symbolic link"})
			}
			continue
		}
		if err := tree.Check(e, t.Opts.MaxNameLen); err != nil {
			// The sandbox's packer leaves these out itself; one that sends them anyway
			// loses them, not its snapshot.
			st.Skipped++
			if len(st.Skips) < tree.MaxReportedSkips {
				st.Skips = append(st.Skips, tree.Skip{Path: name, Reason: strings.TrimSuffix(err.Error(), ": "+tree.ErrUnsafe.Error())})
			}
			continue
		}
		if err := fn(e, rd); err != nil {
			return st, err
		}
	}
	return st, nil
}

// hardLink marks a hard link entry for Build (its Target names the file it repeats).
type hardLink struct{}

func (hardLink) Read([]byte) (int, error) { return 0, io.EOF }

// TarSink writes a snapshot as one gzip-compressed tar stream, entry for entry what
// archive.Pack writes for the same tree (the tar.gz format): so an export is a tar.gz
// snapshot, and GNU tar reads it.
type TarSink struct {
	tw *tar.Writer
	zw *pgzip.Writer
}

// NewTarSink starts the stream on w with the root's entry, compressed at gzip's default
// level (an export: archive.Pack's); NewTarSinkLevel picks the level (0 stores: a stream
// between the host and a sandbox costs no compression).
func NewTarSink(w io.Writer, rootMode uint32, rootMTime int64) (*TarSink, error) {
	return NewTarSinkLevel(w, rootMode, rootMTime, pgzip.DefaultCompression)
}

// NewTarSinkLevel is NewTarSink with a gzip level.
func NewTarSinkLevel(w io.Writer, rootMode uint32, rootMTime int64, level int) (*TarSink, error) {
	zw, err := pgzip.NewWriterLevel(w, level)
	if err != nil {
		return nil, err
	}
	if err := zw.SetConcurrency(1<<20, max(runtime.GOMAXPROCS(0), 2)); err != nil {
		return nil, err
	}
	t := &TarSink{tw: tar.NewWriter(zw), zw: zw}
	if rootMode == 0 {
		rootMode = 0o755
	}
	err = t.tw.WriteHeader(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: int64(rootMode), ModTime: secs(rootMTime), Format: tar.FormatUnknown})
	return t, err
}

func secs(ns int64) time.Time { return time.Unix(0, ns).Truncate(time.Second) }

func (t *TarSink) Dir(e tree.Entry) error {
	return t.tw.WriteHeader(&tar.Header{Name: e.Path + "/", Typeflag: tar.TypeDir, Mode: int64(e.Mode), ModTime: secs(e.MTime), Format: tar.FormatUnknown})
}

func (t *TarSink) Symlink(e tree.Entry) error {
	return t.tw.WriteHeader(&tar.Header{Name: e.Path, Typeflag: tar.TypeSymlink, Linkname: e.Target, Mode: 0o777, ModTime: secs(e.MTime), Format: tar.FormatUnknown})
}

func (t *TarSink) File(e tree.Entry, data []byte, _ *[32]byte) error {
	if err := t.tw.WriteHeader(&tar.Header{Name: e.Path, Typeflag: tar.TypeReg, Size: e.Size, Mode: int64(e.Mode), ModTime: secs(e.MTime), Format: tar.FormatUnknown}); err != nil {
		return err
	}
	_, err := t.tw.Write(data)
	return err
}

func (t *TarSink) FileFrom(e tree.Entry, r io.Reader, _ *[32]byte) error {
	if err := t.tw.WriteHeader(&tar.Header{Name: e.Path, Typeflag: tar.TypeReg, Size: e.Size, Mode: int64(e.Mode), ModTime: secs(e.MTime), Format: tar.FormatUnknown}); err != nil {
		return err
	}
	_, err := io.Copy(t.tw, r)
	return err
}

// Close ends the stream (it does not close the writer under it).
func (t *TarSink) Close() error {
	err := t.tw.Close()
	if cerr := t.zw.Close(); err == nil {
		err = cerr
	}
	return err
}

// Export writes m as one tar.gz to w.
func (r *Repo) Export(ctx context.Context, m *Manifest, w io.Writer) (RestoreStats, error) {
	return r.ExportLevel(ctx, m, w, pgzip.DefaultCompression)
}

// ExportLevel is Export at a gzip level (0: stored, for a stream to a sandbox's extract).
func (r *Repo) ExportLevel(ctx context.Context, m *Manifest, w io.Writer, level int) (RestoreStats, error) {
	rootMTime := m.RootMTime
	if rootMTime == 0 { // a sandbox's listing does not include its root
		rootMTime = m.Time.UnixNano()
	}
	ts, err := NewTarSinkLevel(w, m.RootMode, rootMTime, level)
	if err != nil {
		return RestoreStats{}, err
	}
	st, err := r.Restore(ctx, m, ts)
	if cerr := ts.Close(); err == nil {
		err = cerr
	}
	return st, err
}

// TarTreeDigest reads a tar.gz stream and returns the content digest of its tree
// (Manifest.Tree): what a tar.gz snapshot is compared by, so "unchanged" means the same
// content whatever the archive's times.
func TarTreeDigest(r io.Reader) (Digest, error) {
	ts := &TarSource{R: r}
	var entries []Entry
	byPath := map[string]Entry{}
	buf := make([]byte, 256<<10)
	_, err := ts.Stream(context.Background(), func(e tree.Entry, rd io.Reader) error {
		n := Entry{Entry: e}
		if e.Type == tree.File {
			if _, ok := rd.(hardLink); ok {
				t, ok := byPath[e.Target]
				if !ok {
					return fmt.Errorf("entry %q: hard link to %q: %w", e.Path, e.Target, tree.ErrUnsafe)
				}
				n.Target, n.Size, n.Digest = "", t.Size, t.Digest
			} else {
				h := sha256.New()
				k, err := io.CopyBuffer(h, rd, buf)
				if err != nil {
					return err
				}
				n.Size = k
				h.Sum(n.Digest[:0])
			}
		}
		entries = append(entries, n)
		byPath[n.Path] = n
		return nil
	})
	if err != nil {
		return Digest{}, err
	}
	slices.SortFunc(entries, func(a, b Entry) int { return compare(a.Path, b.Path) })
	return TreeDigest(entries), nil
}

var _ = os.ErrNotExist
