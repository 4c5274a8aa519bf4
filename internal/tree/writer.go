package tree

import (
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
	"sync"
	"time"
)

// WriterOptions configure a Writer. The zero value is ready to use.
type WriterOptions struct {
	// MaxEntries, MaxNameLen and MaxBytes bound what is written; zero means the defaults,
	// and for MaxBytes no more than the free space of the destination less 64 MiB.
	MaxEntries int
	MaxNameLen int
	MaxBytes   int64
	// Workers is how many files are written at once; 0 means GOMAXPROCS, at least 2
	// (a write waits on the disk as often as on the CPU).
	Workers int
}

// WriteStats describe what a Writer created.
type WriteStats struct {
	Files, Dirs, Symlinks int
	Bytes                 int64
	Duration              time.Duration
}

// Writer recreates a tree in an empty directory, writing files on several goroutines.
//
// Every name and link target is checked (Check) before anything is created, and every
// call is made relative to a descriptor of a directory this Writer created (opened with
// O_NOFOLLOW), so nothing is ever written through a link: a file is created with
// O_CREAT|O_EXCL|O_NOFOLLOW, a name below a link or a file is refused. Modes are masked to
// 0777; owners are not set; nothing is synced (a restore is made again from its snapshot
// if the machine fails, so a per-file fsync would buy nothing but time).
//
// Add* are called from one goroutine, parents before children (path order does it);
// Close waits for the writes and sets directory modes and times, deepest first.
type Writer struct {
	ctx   context.Context
	opts  WriterOptions
	start time.Time

	mu    sync.Mutex
	dirs  map[string]*dirHandle // every directory made, "" is the root
	open  int                   // descriptors open in dirs
	taken map[string]bool       // non-directories made: true a regular file, false a link
	st    WriteStats
	err   error // the first failure of a worker
	bad   []string

	entries int
	bytes   int64 // promised to workers (bounded before the write)
	meta    []dirMeta
	jobs    chan job
	wg      sync.WaitGroup
	pending sync.WaitGroup // files handed to the workers and not yet written
	closed  bool
}

type dirHandle struct {
	path string
	fd   dirFD // noDir when closed (reopened on demand)
	refs int
}

type dirMeta struct {
	path  string
	mode  uint32
	mtime int64
}

type job struct {
	dir  *dirHandle
	name string
	e    Entry
	data []byte
	want *[32]byte
}

// maxOpenDirs bounds the directory descriptors a Writer keeps; an agent's RLIMIT_NOFILE
// may be as low as 1,024.
const maxOpenDirs = 128

// freeReserve is left free on the destination's file system by default.
const freeReserve = 64 << 20

// ErrNotEmpty: the destination holds files.
var ErrNotEmpty = errors.New("destination directory is not empty")

// NewWriter prepares dir, which must be empty or absent (its parent must exist).
func NewWriter(ctx context.Context, dir string, opts WriterOptions) (*Writer, error) {
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultMaxEntries
	}
	if opts.MaxNameLen <= 0 {
		opts.MaxNameLen = DefaultMaxNameLen
	}
	if opts.Workers <= 0 {
		opts.Workers = max(runtime.GOMAXPROCS(0), 2)
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("restore into %s: %w", dir, err)
	}
	fd, err := openRootDir(dir)
	if err != nil {
		return nil, fmt.Errorf("restore into %s: %w", dir, err)
	}
	names, err := dirNames(fd)
	if err != nil || len(names) > 0 {
		closeDir(fd)
		if err == nil {
			err = ErrNotEmpty
		}
		return nil, fmt.Errorf("restore into %s: %w", dir, err)
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
		if free, ok := freeBytes(fd); ok {
			opts.MaxBytes = min(opts.MaxBytes, max(free-freeReserve, 0))
		}
	}
	w := &Writer{ctx: ctx, opts: opts, start: time.Now(),
		dirs:  map[string]*dirHandle{"": {path: "", fd: fd}},
		open:  1,
		taken: map[string]bool{},
		jobs:  make(chan job, opts.Workers*4),
	}
	for range opts.Workers {
		w.wg.Go(w.worker) // owned by the Writer: Close closes jobs and waits
	}
	return w, nil
}

func (w *Writer) admit(e Entry) error {
	if err := w.ctx.Err(); err != nil {
		return err
	}
	if w.closed {
		return errors.New("tree: write after Close")
	}
	if err := w.failed(); err != nil {
		return err
	}
	if err := Check(e, w.opts.MaxNameLen); err != nil {
		return err
	}
	if w.entries++; w.entries > w.opts.MaxEntries {
		return fmt.Errorf("entry %q: more than %d entries: %w", e.Path, w.opts.MaxEntries, ErrTooLarge)
	}
	return nil
}

func (w *Writer) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// parent returns the handle of p's parent directory (referenced: release it), making
// missing parents (mode 0755) on the way. A parent that is a link or a file is refused.
func (w *Writer) parent(p string) (*dirHandle, string, error) {
	dir, name := path.Split(p)
	dir = strings.TrimSuffix(dir, "/")
	h, err := w.dir(dir, p)
	return h, name, err
}

// dir returns the handle of the directory d (referenced), making it if missing.
func (w *Writer) dir(d, entry string) (*dirHandle, error) {
	w.mu.Lock()
	h := w.dirs[d]
	w.mu.Unlock()
	if h == nil {
		if _, taken := w.taken[d]; taken {
			return nil, fmt.Errorf("entry %q: %s is a file or link, refusing to write below it: %w", entry, d, ErrUnsafe)
		}
		ph, name, err := w.parent(d)
		if err != nil {
			return nil, err
		}
		err = w.mkdir(ph, name, d, 0o755, 0)
		w.release(ph)
		if err != nil {
			return nil, fmt.Errorf("entry %q: %w", entry, err)
		}
		w.mu.Lock()
		h = w.dirs[d]
		w.mu.Unlock()
	}
	return h, w.acquire(h)
}

// acquire references h, reopening its descriptor if it was closed.
func (w *Writer) acquire(h *dirHandle) error {
	w.mu.Lock()
	if h.fd != noDir {
		h.refs++
		w.mu.Unlock()
		return nil
	}
	w.mu.Unlock()
	ph, name, err := w.parent(h.path)
	if err != nil {
		return err
	}
	fd, err := openSubDir(ph.fd, name)
	w.release(ph)
	if err != nil {
		return fmt.Errorf("reopen directory %q: %w", h.path, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if h.fd != noDir { // reopened meanwhile (never by workers, but be safe)
		closeDir(fd)
	} else {
		h.fd = fd
		w.open++
	}
	h.refs++
	return nil
}

func (w *Writer) release(h *dirHandle) {
	w.mu.Lock()
	h.refs--
	w.mu.Unlock()
}

// trim closes unreferenced directory descriptors once too many are open.
func (w *Writer) trim() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.open <= maxOpenDirs {
		return
	}
	for _, h := range w.dirs {
		if h.refs == 0 && h.path != "" && h.fd != noDir {
			closeDir(h.fd)
			h.fd = noDir
			w.open--
		}
	}
}

func (w *Writer) mkdir(ph *dirHandle, name, p string, mode uint32, mtime int64) error {
	if err := mkdirAt(ph.fd, name); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s exists already (a file or link of that name came first): %w", p, ErrUnsafe)
		}
		return fmt.Errorf("create directory %s: %w", p, err)
	}
	fd, err := openSubDir(ph.fd, name)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", p, err)
	}
	w.mu.Lock()
	w.dirs[p] = &dirHandle{path: p, fd: fd}
	w.open++
	w.st.Dirs++
	w.mu.Unlock()
	w.meta = append(w.meta, dirMeta{path: p, mode: mode, mtime: mtime})
	w.trim()
	return nil
}

// Dir creates a directory entry.
func (w *Writer) Dir(e Entry) error {
	if e.Type != Dir {
		return fmt.Errorf("entry %q: Dir given a %s", e.Path, e.Type)
	}
	if err := w.admit(e); err != nil {
		return err
	}
	w.mu.Lock()
	h := w.dirs[e.Path]
	w.mu.Unlock()
	if h != nil { // made implicitly for an earlier child: now its real mode and time
		for i := range w.meta {
			if w.meta[i].path == e.Path {
				w.meta[i].mode, w.meta[i].mtime = uint32(e.Mode), e.MTime
			}
		}
		return nil
	}
	if _, taken := w.taken[e.Path]; taken {
		return fmt.Errorf("entry %q: a file or link of that name came first: %w", e.Path, ErrUnsafe)
	}
	ph, name, err := w.parent(e.Path)
	if err != nil {
		return err
	}
	defer w.release(ph)
	if err := w.mkdir(ph, name, e.Path, uint32(e.Mode), e.MTime); err != nil {
		return fmt.Errorf("entry %q: %w", e.Path, err)
	}
	return nil
}

// Symlink creates a symbolic link entry.
func (w *Writer) Symlink(e Entry) error {
	if e.Type != Symlink {
		return fmt.Errorf("entry %q: Symlink given a %s", e.Path, e.Type)
	}
	if err := w.admit(e); err != nil {
		return err
	}
	if err := w.claim(e.Path, false); err != nil {
		return err
	}
	ph, name, err := w.parent(e.Path)
	if err != nil {
		return err
	}
	defer w.release(ph)
	if err := symlinkAt(e.Target, ph.fd, name, e.MTime); err != nil {
		return fmt.Errorf("entry %q: %w", e.Path, err)
	}
	w.mu.Lock()
	w.st.Symlinks++
	w.mu.Unlock()
	return nil
}

// claim takes the name p for a regular file or a link.
func (w *Writer) claim(p string, regular bool) error {
	w.mu.Lock()
	isDir := w.dirs[p] != nil
	w.mu.Unlock()
	if _, taken := w.taken[p]; isDir || taken {
		return fmt.Errorf("entry %q: the name is taken by an earlier entry: %w", p, ErrUnsafe)
	}
	w.taken[p] = regular
	return nil
}

// flush waits for the files handed to the workers and returns their first failure.
func (w *Writer) flush() error {
	w.pending.Wait()
	return w.failed()
}

// Remove removes the regular file or link p this Writer made earlier, so that a later
// entry of the name (an archive may hold one) is created afresh, never written through
// the earlier one. A directory is never removed, nor anything this Writer did not make.
func (w *Writer) Remove(p string) error {
	if err := w.flush(); err != nil { // p may be a file still being written
		return err
	}
	if _, taken := w.taken[p]; !taken {
		return fmt.Errorf("entry %q: not a file or link of this restore, refusing to remove it: %w", p, ErrUnsafe)
	}
	ph, name, err := w.parent(p)
	if err != nil {
		return err
	}
	defer w.release(ph)
	if err := removeAt(ph.fd, name); err != nil {
		return fmt.Errorf("entry %q: remove the earlier entry: %w", p, err)
	}
	delete(w.taken, p)
	return nil
}

// Link makes e.Path a hard link to target, a regular file this Writer made earlier (and
// has not removed): never to a link, a directory or anything else on the disk.
func (w *Writer) Link(e Entry, target string) error {
	if e.Type != File {
		return fmt.Errorf("entry %q: Link given a %s", e.Path, e.Type)
	}
	e.Size = 0
	if err := w.admit(e); err != nil {
		return err
	}
	if err := w.flush(); err != nil { // the target may still be being written
		return err
	}
	if regular, taken := w.taken[target]; !taken || !regular {
		return fmt.Errorf("entry %q: hard link to %q, which is not a regular file of this restore: %w", e.Path, target, ErrUnsafe)
	}
	if err := w.claim(e.Path, true); err != nil {
		return err
	}
	if err := w.link(target, e.Path); err != nil {
		return fmt.Errorf("entry %q: %w", e.Path, err)
	}
	return nil
}

func (w *Writer) reserve(e Entry) error {
	if e.Size > w.opts.MaxBytes-w.bytes {
		return fmt.Errorf("entry %q: %d bytes would pass the limit of %d: %w", e.Path, e.Size, w.opts.MaxBytes, ErrTooLarge)
	}
	w.bytes += e.Size
	return nil
}

// File writes a regular file whose contents are data (len(data) must be e.Size), on a
// worker. When want is set, the worker compares the SHA-256 of what it wrote with it and
// a mismatch fails the Writer (Close names the files).
func (w *Writer) File(e Entry, data []byte, want *[32]byte) error {
	if e.Type != File || int64(len(data)) != e.Size {
		return fmt.Errorf("entry %q: File given a %s of %d bytes for %d", e.Path, e.Type, len(data), e.Size)
	}
	ph, name, err := w.prepareFile(e)
	if err != nil {
		return err
	}
	w.pending.Add(1)
	select {
	case w.jobs <- job{dir: ph, name: name, e: e, data: data, want: want}:
		return nil
	case <-w.ctx.Done():
		w.pending.Done()
		w.release(ph)
		return w.ctx.Err()
	}
}

// FileFrom writes a regular file of e.Size bytes read from r, on the caller's goroutine
// (for files too large to hold in memory). want is as for File.
func (w *Writer) FileFrom(e Entry, r io.Reader, want *[32]byte) error {
	if e.Type != File {
		return fmt.Errorf("entry %q: FileFrom given a %s", e.Path, e.Type)
	}
	ph, name, err := w.prepareFile(e)
	if err != nil {
		return err
	}
	defer w.release(ph)
	return w.write(ph, name, e, r, want)
}

// prepareFile admits the regular file e, reserves its bytes, claims its name and returns
// its parent's handle (referenced: release it) and its base name.
func (w *Writer) prepareFile(e Entry) (*dirHandle, string, error) {
	if err := w.admit(e); err != nil {
		return nil, "", err
	}
	if err := w.reserve(e); err != nil {
		return nil, "", err
	}
	if err := w.claim(e.Path, true); err != nil {
		return nil, "", err
	}
	return w.parent(e.Path)
}

func (w *Writer) worker() {
	for j := range w.jobs {
		err := w.write(j.dir, j.name, j.e, nil, j.want, j.data...)
		w.release(j.dir)
		if err != nil {
			w.fail(err)
		}
		w.pending.Done()
	}
}

func (w *Writer) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if errors.Is(err, errDigest) {
		if len(w.bad) < 20 {
			w.bad = append(w.bad, strings.TrimPrefix(err.Error(), errDigest.Error()+": "))
		}
		if w.err == nil {
			w.err = errDigest
		}
		return
	}
	if w.err == nil {
		w.err = err
	}
}

var errDigest = errors.New("content differs from its digest")

// write creates name in ph and fills it from r, or from data when r is nil.
func (w *Writer) write(ph *dirHandle, name string, e Entry, r io.Reader, want *[32]byte, data ...byte) error {
	f, err := createAt(ph.fd, name, e.Path)
	if err != nil {
		return fmt.Errorf("entry %q: %w", e.Path, err)
	}
	defer f.Close()
	var n int64
	var sum [32]byte
	if r == nil {
		if _, err := f.Write(data); err != nil {
			return fmt.Errorf("entry %q: %w", e.Path, err)
		}
		n = int64(len(data))
		if want != nil {
			sum = sha256.Sum256(data)
		}
	} else {
		h := sha256.New()
		dst := io.Writer(f)
		if want != nil {
			dst = io.MultiWriter(f, h)
		}
		n, err = io.Copy(dst, io.LimitReader(ctxReader{w.ctx, r}, e.Size+1))
		if err != nil {
			return fmt.Errorf("entry %q: %w", e.Path, err)
		}
		if want != nil {
			h.Sum(sum[:0])
		}
	}
	if n != e.Size {
		return fmt.Errorf("entry %q: got %d bytes for %d: %w", e.Path, n, e.Size, ErrUnsafe)
	}
	if want != nil && sum != *want {
		return fmt.Errorf("%w: %s", errDigest, e.Path)
	}
	if err := setFileMeta(f, uint32(e.Mode), e.MTime); err != nil {
		return fmt.Errorf("entry %q: %w", e.Path, err)
	}
	w.mu.Lock()
	w.st.Files++
	w.st.Bytes += n
	w.mu.Unlock()
	return nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(b)
}

// DigestMismatch reports the files whose written contents differed from their digests.
type DigestMismatch struct{ Paths []string }

func (d *DigestMismatch) Error() string {
	return fmt.Sprintf("%d restored files differ from their digests: %s", len(d.Paths), strings.Join(d.Paths, ", "))
}

// Close waits for every write, then sets the directories' modes and times (deepest
// first, so making children does not move a parent's time) and releases the
// descriptors. It returns the first failure; files whose contents did not match their
// digests fail it with a *DigestMismatch.
func (w *Writer) Close() (WriteStats, error) {
	if !w.closed {
		w.closed = true
		close(w.jobs)
	}
	w.wg.Wait()
	err := w.err
	if errors.Is(err, errDigest) {
		err = &DigestMismatch{Paths: slices.Clone(w.bad)}
	}
	if err == nil {
		err = w.ctx.Err()
	}
	if err == nil {
		slices.SortStableFunc(w.meta, func(a, b dirMeta) int { return strings.Compare(b.path, a.path) })
		for _, m := range w.meta {
			if err = w.finishDir(m); err != nil {
				break
			}
		}
	}
	for _, h := range w.dirs {
		if h.fd != noDir {
			closeDir(h.fd)
			h.fd = noDir
		}
	}
	w.st.Duration = time.Since(w.start)
	return w.st, err
}

func (w *Writer) finishDir(m dirMeta) error {
	h := w.dirs[m.path]
	if err := w.acquire(h); err != nil {
		return err
	}
	defer w.release(h)
	if err := setDirMeta(h.fd, m.mode&0o777, m.mtime); err != nil {
		return fmt.Errorf("entry %q: %w", m.path, err)
	}
	return nil
}
