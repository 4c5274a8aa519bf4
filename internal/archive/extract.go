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
	"sync"
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

	freeReserve = 64 << 20 // left free on the destination's file system by default
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
// Every filesystem call goes through os.Root on dir, and each entry is checked first. An
// entry is refused (ErrUnsafe, the message names it) when its name is absolute, has a ..
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
	if err := prepareDest(dir); err != nil {
		return ExtractStats{}, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return ExtractStats{}, fmt.Errorf("archive: extract into %s: %w", dir, err)
	}
	defer root.Close()
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
		if free, ok := freeBytes(dir); ok {
			opts.MaxBytes = min(opts.MaxBytes, max(free-freeReserve, 0))
		}
	}
	x := newExtractor(ctx, root, opts)
	err = x.run(r)
	x.st.Duration = time.Since(start)
	if err != nil {
		return x.st, fmt.Errorf("archive: extract into %s: %w", dir, err)
	}
	return x.st, nil
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
	backup, err := Replace(dir, func(tmp string) error {
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

// Replace fills a new sibling of dir (made empty, mode 0755) with fill, and only when fill
// succeeds swaps it in: a non-empty dir is renamed to "<dir>.before-restore-<UTC time>"
// (the backup returned), never deleted; an empty dir is replaced. On error dir is
// untouched and the partial tree removed. Any restore into a directory that may hold
// work goes through it (ExtractReplace, a chunked snapshot's restore).
func Replace(dir string, fill func(tmp string) error) (backup string, err error) {
	dir = filepath.Clean(dir)
	parent, base := filepath.Split(dir)
	if parent == "" {
		parent = "."
	}
	tmp, err := os.MkdirTemp(parent, "."+base+".restore-")
	if err != nil {
		return "", err
	}
	// MkdirTemp made tmp 0700; an archive with a root entry ("./") sets its own mode.
	if err := os.Chmod(tmp, 0o755); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	if err := fill(tmp); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	if fi, serr := os.Lstat(dir); serr == nil {
		if !fi.IsDir() {
			os.RemoveAll(tmp)
			return "", fmt.Errorf("restore into %s: not a directory", dir)
		}
		if rerr := os.Remove(dir); rerr != nil { // fails unless dir is empty
			backup = fmt.Sprintf("%s.before-restore-%s", dir, time.Now().UTC().Format("20060102T150405.000000000Z"))
			if err := os.Rename(dir, backup); err != nil {
				os.RemoveAll(tmp)
				return "", fmt.Errorf("restore into %s: move the old tree aside: %w", dir, err)
			}
		}
	} else if !errors.Is(serr, fs.ErrNotExist) {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("restore into %s: %w", dir, serr)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if backup != "" {
			os.Rename(backup, dir)
			backup = ""
		}
		os.RemoveAll(tmp)
		return "", fmt.Errorf("restore into %s: swap in the restored tree: %w", dir, err)
	}
	return backup, nil
}

func prepareDest(dir string) error {
	f, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return fmt.Errorf("archive: extract into %s: %w", dir, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("archive: extract into %s: %w", dir, err)
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if err != nil && err != io.EOF {
		return fmt.Errorf("archive: extract into %s: %w", dir, err)
	}
	if len(names) > 0 {
		return fmt.Errorf("archive: extract into %s: %w", dir, ErrNotEmpty)
	}
	return nil
}

type dirMeta struct {
	name  string
	mode  fs.FileMode
	mtime time.Time
}

type extractor struct {
	ctx  context.Context
	root *os.Root
	opts ExtractOptions
	st   ExtractStats
	// realDirs are directories this extraction created or checked: real directories, not
	// links, which are never removed or replaced afterwards.
	realDirs map[string]bool
	// files are regular files extracted so far, the only valid hard link targets.
	files map[string]bool
	// taken are the non-directories created so far. The destination starts empty, so any
	// other spot is free and needs no Lstat (O_EXCL still refuses a planted file).
	taken map[string]bool
	dirs  []dirMeta
	buf   []byte

	jobs    chan xjob
	workers sync.WaitGroup // the writers; stop closes jobs and waits
	pending sync.WaitGroup // files handed to them and not yet written
	errMu   sync.Mutex
	werr    error
}

func newExtractor(ctx context.Context, root *os.Root, opts ExtractOptions) *extractor {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultMaxEntries
	}
	if opts.MaxNameLen <= 0 {
		opts.MaxNameLen = DefaultMaxNameLen
	}
	return &extractor{
		ctx: ctx, root: root, opts: opts,
		realDirs: map[string]bool{".": true},
		files:    map[string]bool{},
		taken:    map[string]bool{},
		buf:      make([]byte, 256<<10),
	}
}

// flushErr returns a worker's failure without waiting.
func (x *extractor) flushErr() error {
	x.errMu.Lock()
	defer x.errMu.Unlock()
	return x.werr
}

func (x *extractor) run(r io.Reader) error {
	x.startWorkers()
	defer x.stop()
	zr, err := pgzip.NewReader(r)
	if err != nil {
		return fmt.Errorf("read gzip header: %w", err)
	}
	defer zr.Close() // stops pgzip's read-ahead goroutine
	tr := tar.NewReader(zr)
	entries := 0
	for {
		if err := x.ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read archive after %d entries: %w", entries, err)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		entries++
		if entries > x.opts.MaxEntries {
			return fmt.Errorf("entry %q: more than %d entries: %w", hdr.Name, x.opts.MaxEntries, ErrTooLarge)
		}
		if err := x.entry(hdr, tr); err != nil {
			return err
		}
	}
	// Read what follows the tar end marker so gzip verifies its CRC and length; a little
	// padding is normal, more is not.
	n, err := io.CopyN(io.Discard, zr, 1<<20+1)
	if err != nil && err != io.EOF {
		return fmt.Errorf("read archive trailer: %w", err)
	}
	if n > 1<<20 {
		return fmt.Errorf("%w: more than 1 MiB of data after the end of the archive", ErrUnsafe)
	}
	if err := x.flush(); err != nil {
		return err
	}
	return x.finishDirs()
}

// checkName validates an entry name and returns it cleaned ("." for the root): the
// tree's rule (tree.CheckName) within this extraction's bound.
func (x *extractor) checkName(name string) (string, error) {
	return tree.CheckName(name, x.opts.MaxNameLen)
}

// checkParents makes sure every directory above name exists as a real directory,
// creating missing ones; an existing link or file on the way is refused.
func (x *extractor) checkParents(entry, name string) error {
	dir := path.Dir(name)
	if x.realDirs[dir] {
		return nil
	}
	if err := x.checkParents(entry, dir); err != nil {
		return err
	}
	if x.taken[dir] {
		// A file or link of this archive holds the name; a file may still be queued for
		// a writer and not on disk yet, so the disk alone cannot say.
		return fmt.Errorf("entry %q: %s is not a directory (a link or file), refusing to write below it: %w", entry, dir, ErrUnsafe)
	}
	fi, err := x.root.Lstat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := x.root.Mkdir(dir, 0o755); err != nil {
			return fmt.Errorf("entry %q: create directory %s: %w", entry, dir, err)
		}
	case err != nil:
		return fmt.Errorf("entry %q: %w", entry, err)
	case !fi.IsDir():
		return fmt.Errorf("entry %q: %s is not a directory (a link or file), refusing to write below it: %w", entry, dir, ErrUnsafe)
	}
	x.realDirs[dir] = true
	return nil
}

// clearSpot removes a non-directory already at name, so that the new entry is created
// with O_EXCL and never written through an existing link. A directory is not replaced.
func (x *extractor) clearSpot(entry, name string) error {
	if !x.taken[name] && !x.realDirs[name] {
		x.taken[name] = true
		return nil
	}
	if err := x.flush(); err != nil { // the name may be a file still being written
		return err
	}
	fi, err := x.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("entry %q: %w", entry, err)
	}
	if fi.IsDir() {
		return fmt.Errorf("entry %q: would replace a directory: %w", entry, ErrUnsafe)
	}
	delete(x.files, name)
	if err := x.root.Remove(name); err != nil {
		return fmt.Errorf("entry %q: remove the existing file: %w", entry, err)
	}
	return nil
}

func (x *extractor) entry(hdr *tar.Header, r io.Reader) error {
	name, err := x.checkName(hdr.Name)
	if err != nil {
		return err
	}
	mode := fs.FileMode(hdr.Mode) & fs.ModePerm
	switch hdr.Typeflag {
	case tar.TypeDir:
		if name == "." {
			// The destination's own mode, owner and times are the caller's: an archive
			// must not open the root to others (0777) or shut its owner out, and a
			// sandbox's agent, which does not own its workspace root, cannot chmod it.
			x.st.Dirs++
			return nil
		}
		if err := x.checkParents(hdr.Name, name); err != nil {
			return err
		}
		if x.taken[name] { // a file of this archive, perhaps still queued for a writer
			return fmt.Errorf("entry %q: a link or file of that name exists: %w", hdr.Name, ErrUnsafe)
		}
		if !x.realDirs[name] {
			fi, err := x.root.Lstat(name)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				if err := x.root.Mkdir(name, 0o700); err != nil {
					return fmt.Errorf("entry %q: %w", hdr.Name, err)
				}
			case err != nil:
				return fmt.Errorf("entry %q: %w", hdr.Name, err)
			case !fi.IsDir():
				return fmt.Errorf("entry %q: a link or file of that name exists: %w", hdr.Name, ErrUnsafe)
			}
			x.realDirs[name] = true
		}
		// Keep the owner able to fill the directory; the real mode is set at the end.
		if err := x.root.Chmod(name, 0o700); err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
		x.dirs = append(x.dirs, dirMeta{name: name, mode: mode, mtime: hdr.ModTime})
		x.st.Dirs++
		return nil

	case tar.TypeReg, tar.TypeGNUSparse: // tar.Reader reports the old TypeRegA as TypeReg
		if name == "." {
			return fmt.Errorf("entry %q: a file cannot be the root: %w", hdr.Name, ErrUnsafe)
		}
		if hdr.Size < 0 || hdr.Size > x.opts.MaxBytes-x.st.Bytes {
			return fmt.Errorf("entry %q: %d bytes would pass the limit of %d: %w", hdr.Name, hdr.Size, x.opts.MaxBytes, ErrTooLarge)
		}
		if err := x.checkParents(hdr.Name, name); err != nil {
			return err
		}
		if err := x.clearSpot(hdr.Name, name); err != nil {
			return err
		}
		if err := x.writeFile(hdr, name, mode, r); err != nil {
			return err
		}
		x.files[name] = true
		x.st.Files++
		return nil

	case tar.TypeSymlink:
		if name == "." {
			return fmt.Errorf("entry %q: a link cannot be the root: %w", hdr.Name, ErrUnsafe)
		}
		if err := x.checkLinkTarget(hdr, name); err != nil {
			return err
		}
		if err := x.checkParents(hdr.Name, name); err != nil {
			return err
		}
		if err := x.clearSpot(hdr.Name, name); err != nil {
			return err
		}
		if err := x.root.Symlink(linkTarget(hdr.Linkname), name); err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
		x.st.Symlinks++
		return nil

	case tar.TypeLink:
		if err := x.flush(); err != nil { // its target may still be being written
			return err
		}
		if name == "." {
			return fmt.Errorf("entry %q: a link cannot be the root: %w", hdr.Name, ErrUnsafe)
		}
		target, err := x.checkName(hdr.Linkname)
		if err != nil {
			return fmt.Errorf("entry %q: hard link target %q refused: %w", hdr.Name, hdr.Linkname, ErrUnsafe)
		}
		if !x.files[target] {
			return fmt.Errorf("entry %q: hard link to %q, which is not a regular file extracted earlier from this archive: %w", hdr.Name, hdr.Linkname, ErrUnsafe)
		}
		if err := x.checkParents(hdr.Name, name); err != nil {
			return err
		}
		if name == target {
			return nil
		}
		if err := x.clearSpot(hdr.Name, name); err != nil {
			return err
		}
		if err := x.root.Link(target, name); err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
		x.files[name] = true
		x.st.Hardlinks++
		return nil

	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return fmt.Errorf("entry %q: device or fifo entries are not extracted: %w", hdr.Name, ErrUnsafe)
	default:
		return fmt.Errorf("entry %q: unsupported entry type %q: %w", hdr.Name, hdr.Typeflag, ErrUnsafe)
	}
}

// checkLinkTarget holds a symbolic link's target to the tree's rule (tree.CheckTarget
// and, on Windows, tree.CheckPlatform): relative, leading .. components only, staying
// inside the root when resolved from the link's directory. With the link's parents being
// real directories (checkParents) and every other link held to the same rule, such a
// target cannot resolve outside the root, whatever order the entries come in.
func (x *extractor) checkLinkTarget(hdr *tar.Header, name string) error {
	if err := tree.CheckTarget(name, hdr.Linkname, x.opts.MaxNameLen); err != nil {
		return err
	}
	return tree.CheckPlatform(name, hdr.Linkname)
}

// Files are written on several goroutines (restore at the disk's pace, not one file at a
// time): a file of at most parallelMax bytes is read whole from the archive and handed to
// a worker, which creates, fills, chmods and dates it through the Root; larger files are
// written inline. Nothing is synced. Before anything that needs earlier files on disk (a
// hard link to one, a duplicate name, the directories' modes at the end) the writes are
// flushed.
const parallelMax = 1 << 20

type xjob struct {
	entry, name string
	mode        fs.FileMode
	mtime       time.Time
	data        []byte
}

func (x *extractor) startWorkers() {
	n := max(runtime.GOMAXPROCS(0), 2)
	x.jobs = make(chan xjob, 4*n)
	for range n {
		x.workers.Go(func() { // owned by the extractor: stop closes jobs and waits
			for j := range x.jobs {
				if err := x.writeData(j); err != nil {
					x.fail(err)
				}
				x.pending.Done()
			}
		})
	}
}

func (x *extractor) stop() {
	if x.jobs != nil {
		close(x.jobs)
		x.workers.Wait()
		x.jobs = nil
	}
}

func (x *extractor) fail(err error) {
	x.errMu.Lock()
	defer x.errMu.Unlock()
	if x.werr == nil {
		x.werr = err
	}
}

// flush waits for the files handed to the workers and returns their first failure.
func (x *extractor) flush() error {
	x.pending.Wait()
	x.errMu.Lock()
	defer x.errMu.Unlock()
	return x.werr
}

func (x *extractor) writeData(j xjob) error {
	f, err := x.root.OpenFile(j.name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("entry %q: %w", j.entry, err)
	}
	_, werr := f.Write(j.data)
	if werr == nil {
		werr = f.Chmod(j.mode)
	}
	if werr == nil && !j.mtime.IsZero() {
		werr = futimes(f, j.mtime)
	}
	if cerr := f.Close(); werr == nil && cerr != nil {
		werr = cerr
	}
	if werr != nil {
		return fmt.Errorf("entry %q: %w", j.entry, werr)
	}
	return nil
}

func (x *extractor) writeFile(hdr *tar.Header, name string, mode fs.FileMode, r io.Reader) error {
	if x.jobs != nil && hdr.Size <= parallelMax {
		data := make([]byte, hdr.Size)
		if _, err := io.ReadFull(r, data); err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
		if n, _ := r.Read(make([]byte, 1)); n > 0 { // the tar reader never does this; belt and braces
			return fmt.Errorf("entry %q: more data than the declared %d bytes: %w", hdr.Name, hdr.Size, ErrTooLarge)
		}
		x.st.Bytes += hdr.Size
		if x.opts.Progress != nil {
			x.opts.Progress(x.st.Bytes)
		}
		if err := x.flushErr(); err != nil {
			return err
		}
		x.pending.Add(1)
		select {
		case x.jobs <- xjob{entry: hdr.Name, name: name, mode: mode, mtime: hdr.ModTime, data: data}:
			return nil
		case <-x.ctx.Done():
			x.pending.Done()
			return x.ctx.Err()
		}
	}
	f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("entry %q: %w", hdr.Name, err)
	}
	werr := x.copy(f, r, hdr)
	if werr == nil {
		werr = f.Chmod(mode)
	}
	if werr == nil && !hdr.ModTime.IsZero() {
		werr = futimes(f, hdr.ModTime)
	}
	if cerr := f.Close(); werr == nil && cerr != nil {
		werr = cerr
	}
	if werr != nil {
		return fmt.Errorf("entry %q: %w", hdr.Name, werr)
	}
	return nil
}

func (x *extractor) copy(f *os.File, r io.Reader, hdr *tar.Header) error {
	var written int64
	for {
		if err := x.ctx.Err(); err != nil {
			return err
		}
		n, rerr := r.Read(x.buf)
		if n > 0 {
			written += int64(n)
			if written > hdr.Size { // the tar reader never does this; belt and braces
				return fmt.Errorf("more data than the declared %d bytes: %w", hdr.Size, ErrTooLarge)
			}
			if _, err := f.Write(x.buf[:n]); err != nil {
				return err
			}
			x.st.Bytes += int64(n)
			if x.opts.Progress != nil {
				x.opts.Progress(x.st.Bytes)
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// finishDirs applies directory modes and times, deepest first, so that setting a parent's
// time is not undone by creating its children.
func (x *extractor) finishDirs() error {
	slices.SortStableFunc(x.dirs, func(a, b dirMeta) int { return strings.Compare(b.name, a.name) })
	for _, d := range x.dirs {
		if err := x.finishDir(d); err != nil {
			return fmt.Errorf("entry %q: %w", d.name, err)
		}
	}
	return nil
}
