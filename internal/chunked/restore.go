package chunked

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"time"

	"github.com/toolhost/toolhost/internal/tree"
)

// Sink receives a snapshot's entries in order (parents before children). tree.Writer is
// one (through DirSink); the in-sandbox agent's client and the tar exporter are others.
type Sink interface {
	Dir(e tree.Entry) error
	Symlink(e tree.Entry) error
	// File gets a file's whole contents, already checked against digest (the sink may
	// check what it wrote against it too).
	File(e tree.Entry, data []byte, digest *[32]byte) error
	// FileFrom gets a large file's contents as a stream, checked chunk by chunk.
	FileFrom(e tree.Entry, r io.Reader, digest *[32]byte) error
}

// RestoreStats say what a restore moved.
type RestoreStats struct {
	Files, Dirs, Symlinks int
	Bytes                 int64 // file contents
	Downloaded            int64 // bytes of packs fetched
	Packs                 int
	Duration              time.Duration
}

// streamAbove: files larger than this are streamed chunk by chunk instead of held whole.
const streamAbove = 32 << 20

// restoreBudget bounds the file contents decoded ahead of the sink.
const restoreBudget = 128 << 20

type future struct {
	i    int
	done chan struct{}
	data []byte
	err  error
}

// Restore sends every entry of m to sink, in order, fetching packs in parallel ahead of
// their use and decoding files on several goroutines while the sink writes. Every chunk is
// checked against its digest and every file against its own; a mismatch or a missing pack
// fails the restore (ErrCorrupt, ErrMissing) naming the file.
func (r *Repo) Restore(ctx context.Context, m *Manifest, sink Sink) (RestoreStats, error) {
	start := time.Now()
	var st RestoreStats
	entries, err := r.Entries(ctx, m)
	if err != nil {
		return st, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	uses := map[PackID]int{}
	var order []PackID
	for _, e := range entries {
		for _, c := range e.Chunks {
			if uses[c.Pack] == 0 {
				order = append(order, c.Pack)
			}
			uses[c.Pack]++
		}
	}
	var dlMu sync.Mutex
	f := r.newFetcher(ctx, order, func(_ PackID, n int64) {
		dlMu.Lock()
		st.Downloaded += n
		st.Packs++
		dlMu.Unlock()
	})
	defer f.close()
	var useMu sync.Mutex
	used := func(p PackID) {
		useMu.Lock()
		uses[p]--
		last := uses[p] == 0
		useMu.Unlock()
		if last {
			f.release(p)
		}
	}

	budget := newByteSem(restoreBudget)
	jobs := make(chan *future, 64)
	ordered := make(chan *future, 4096)
	var wg sync.WaitGroup
	for range max(runtime.GOMAXPROCS(0), 2) {
		wg.Go(func() { // owned by Restore: jobs is closed and the workers waited on below
			for fu := range jobs {
				fu.data, fu.err = r.assemble(f, &entries[fu.i], used)
				close(fu.done)
			}
		})
	}
	// The producer decodes ahead within the budget; the emitter (this goroutine) hands
	// entries to the sink in order.
	prodErr := make(chan error, 1)
	go func() { // owned by Restore, which drains ordered until it is closed
		defer close(ordered)
		defer close(jobs)
		for i := range entries {
			e := &entries[i]
			fu := &future{i: i, done: make(chan struct{})}
			if e.Type == tree.File && e.Size > 0 && e.Size <= streamAbove {
				if err := budget.acquire(ctx, e.Size); err != nil {
					prodErr <- err
					return
				}
				select {
				case jobs <- fu:
				case <-ctx.Done():
					prodErr <- ctx.Err()
					return
				}
			} else {
				close(fu.done)
			}
			select {
			case ordered <- fu:
			case <-ctx.Done():
				prodErr <- ctx.Err()
				return
			}
		}
		prodErr <- nil
	}()
	var emitErr error
	for fu := range ordered {
		if emitErr != nil {
			continue // drain
		}
		e := &entries[fu.i]
		<-fu.done
		switch {
		case fu.err != nil:
			emitErr = fu.err
		case e.Type == tree.Dir:
			emitErr = sink.Dir(e.Entry)
			st.Dirs++
		case e.Type == tree.Symlink:
			emitErr = sink.Symlink(e.Entry)
			st.Symlinks++
		case e.Size > streamAbove:
			cr := &chunkReader{r: r, f: f, e: e, used: used, h: sha256.New()}
			emitErr = sink.FileFrom(e.Entry, cr, (*[32]byte)(&e.Digest))
			if emitErr == nil {
				emitErr = cr.check()
			}
			st.Files++
			st.Bytes += e.Size
		default:
			data := fu.data
			if data == nil {
				data = []byte{}
			}
			emitErr = sink.File(e.Entry, data, (*[32]byte)(&e.Digest))
			budget.release(e.Size)
			st.Files++
			st.Bytes += e.Size
		}
		if emitErr != nil {
			cancel()
		}
	}
	wg.Wait()
	if err := <-prodErr; emitErr == nil && err != nil {
		emitErr = err
	}
	f.close() // the downloads are over: their counts can be read
	dlMu.Lock()
	st.Duration = time.Since(start)
	dlMu.Unlock()
	if emitErr != nil {
		return st, emitErr
	}
	return st, nil
}

// assemble decodes a file's chunks and checks it against its digest.
func (r *Repo) assemble(f *fetcher, e *Entry, used func(PackID)) ([]byte, error) {
	if len(e.Chunks) == 1 {
		c := e.Chunks[0]
		raw, err := r.chunk(f, c, e.Path)
		used(c.Pack)
		if err != nil {
			return nil, err
		}
		if c.Digest != e.Digest {
			return nil, fmt.Errorf("file %q: its content does not match its digest: %w", e.Path, ErrCorrupt)
		}
		return raw, nil
	}
	data := make([]byte, 0, e.Size)
	for _, c := range e.Chunks {
		raw, err := r.chunk(f, c, e.Path)
		used(c.Pack)
		if err != nil {
			return nil, err
		}
		data = append(data, raw...)
	}
	if int64(len(data)) != e.Size || Digest(sha256.Sum256(data)) != e.Digest {
		return nil, fmt.Errorf("file %q: its content does not match its digest: %w", e.Path, ErrCorrupt)
	}
	return data, nil
}

func (r *Repo) chunk(f *fetcher, c Ref, p string) ([]byte, error) {
	pk, err := f.wait(c.Pack)
	if err != nil {
		return nil, fmt.Errorf("file %q: %w", p, packErr(c.Pack, err))
	}
	stored, err := pk.blob(c)
	if err != nil {
		return nil, fmt.Errorf("file %q: %w", p, packErr(c.Pack, err))
	}
	raw, err := openBlob(c, stored)
	if err != nil {
		return nil, fmt.Errorf("file %q: %w", p, packErr(c.Pack, err))
	}
	return raw, nil
}

// chunkReader streams a large file chunk by chunk.
type chunkReader struct {
	r    *Repo
	f    *fetcher
	e    *Entry
	used func(PackID)
	i    int
	buf  []byte
	h    interface {
		io.Writer
		Sum([]byte) []byte
	}
	n int64
}

func (c *chunkReader) Read(p []byte) (int, error) {
	for len(c.buf) == 0 {
		if c.i >= len(c.e.Chunks) {
			return 0, io.EOF
		}
		ch := c.e.Chunks[c.i]
		c.i++
		raw, err := c.r.chunk(c.f, ch, c.e.Path)
		c.used(ch.Pack)
		if err != nil {
			return 0, err
		}
		c.h.Write(raw)
		c.n += int64(len(raw))
		c.buf = raw
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

func (c *chunkReader) check() error {
	for c.i < len(c.e.Chunks) { // the sink stopped early
		c.used(c.e.Chunks[c.i].Pack)
		c.i++
	}
	if c.n != c.e.Size || Digest(c.h.Sum(nil)) != c.e.Digest {
		return fmt.Errorf("file %q: its content does not match its digest: %w", c.e.Path, ErrCorrupt)
	}
	return nil
}

type byteSem struct {
	mu    sync.Mutex
	cond  *sync.Cond
	avail int64
	max   int64
}

func newByteSem(n int64) *byteSem {
	s := &byteSem{avail: n, max: n}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func (s *byteSem) acquire(ctx context.Context, n int64) error {
	n = min(n, s.max)
	stop := context.AfterFunc(ctx, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.avail < n {
		if err := ctx.Err(); err != nil {
			return err
		}
		s.cond.Wait()
	}
	s.avail -= n
	return nil
}

func (s *byteSem) release(n int64) {
	n = min(n, s.max)
	s.mu.Lock()
	s.avail += n
	s.cond.Broadcast()
	s.mu.Unlock()
}

// DirSink writes a snapshot into a directory through a tree.Writer (contents are checked
// before they reach it, so it does not hash them again).
type DirSink struct{ W *tree.Writer }

func (d DirSink) Dir(e tree.Entry) error     { return d.W.Dir(e) }
func (d DirSink) Symlink(e tree.Entry) error { return d.W.Symlink(e) }
func (d DirSink) File(e tree.Entry, data []byte, _ *[32]byte) error {
	return d.W.File(e, data, nil)
}
func (d DirSink) FileFrom(e tree.Entry, r io.Reader, _ *[32]byte) error {
	return d.W.FileFrom(e, r, nil)
}

// RestoreDir restores m into dir (empty or absent) and returns what was written.
func (r *Repo) RestoreDir(ctx context.Context, m *Manifest, dir string, opts tree.WriterOptions) (RestoreStats, error) {
	w, err := tree.NewWriter(ctx, dir, opts)
	if err != nil {
		return RestoreStats{}, err
	}
	st, err := r.Restore(ctx, m, DirSink{w})
	_, cerr := w.Close()
	if err == nil {
		err = cerr
	}
	return st, err
}

// discard is a Sink that only counts (Verify).
type discard struct{}

func (discard) Dir(tree.Entry) error                     { return nil }
func (discard) Symlink(tree.Entry) error                 { return nil }
func (discard) File(tree.Entry, []byte, *[32]byte) error { return nil }
func (discard) FileFrom(_ tree.Entry, r io.Reader, _ *[32]byte) error {
	_, err := io.Copy(io.Discard, r)
	return err
}

// Verify reads every blob m needs and checks every digest: segments, chunks, files and
// the tree's. It fails with ErrCorrupt or ErrMissing naming what is wrong.
func (r *Repo) Verify(ctx context.Context, m *Manifest) (RestoreStats, error) {
	return r.Restore(ctx, m, discard{})
}

var _ = errors.New
