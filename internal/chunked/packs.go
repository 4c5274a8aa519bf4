package chunked

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/toolhost/toolhost/core/store"
)

// packer fills packs with blobs and uploads each as it fills, a few at once.
type packer struct {
	r   *Repo
	ctx context.Context

	mu      sync.Mutex
	cur     *openPack
	err     error
	written map[PackID][]packBlob
	bytes   int64

	sem chan struct{}  // bounds the uploads in flight (and so the packs held in memory)
	wg  sync.WaitGroup // the uploads; owned by finish and abort, which wait on it
}

type openPack struct {
	id    PackID
	buf   []byte
	blobs []packBlob
}

func newPacker(ctx context.Context, r *Repo) *packer {
	return &packer{r: r, ctx: ctx, written: map[PackID][]packBlob{}, sem: make(chan struct{}, r.cfg.Uploads)}
}

// add appends a blob to the open pack and returns where it will be.
func (p *packer) add(kind byte, d Digest, stored []byte, comp byte, raw int) (Ref, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return Ref{}, p.err
	}
	if p.cur == nil {
		p.cur = &openPack{id: newPackID(), buf: make([]byte, 0, PackTarget+MaxChunk)}
	}
	c := p.cur
	ref := Ref{Digest: d, Pack: c.id, Offset: uint32(len(c.buf)), Stored: uint32(len(stored)), Raw: uint32(raw), Comp: comp}
	c.buf = append(c.buf, stored...)
	c.blobs = append(c.blobs, packBlob{Kind: kind, Ref: ref})
	if len(c.buf) >= PackTarget {
		p.seal()
	}
	return ref, nil
}

// seal uploads the open pack; called with mu held. It waits for a free upload slot, which
// holds back the workers while the store is slower than they are.
func (p *packer) seal() {
	c := p.cur
	p.cur = nil
	if c == nil || len(c.blobs) == 0 {
		return
	}
	body := encodeTrailer(c.buf, c.blobs)
	p.written[c.id] = c.blobs
	select {
	case p.sem <- struct{}{}:
	case <-p.ctx.Done():
		p.err = p.ctx.Err()
		return
	}
	p.wg.Go(func() {
		defer func() { <-p.sem }()
		err := p.r.put(p.ctx, PackKey(c.id), body, "application/octet-stream", nil, nil)
		p.mu.Lock()
		defer p.mu.Unlock()
		if err != nil && p.err == nil {
			p.err = fmt.Errorf("upload pack %s: %w", c.id, unwrapPermanent(err))
		}
		if err == nil {
			p.bytes += int64(len(body))
		}
	})
}

// finish seals the last pack, waits for every upload and returns what was written.
func (p *packer) finish() (map[PackID][]packBlob, error) {
	p.mu.Lock()
	if p.err == nil {
		p.seal()
	}
	p.mu.Unlock()
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.written, p.err
}

// abort drops the open pack and waits for the uploads in flight (what they stored is
// unreferenced: a collection removes it).
func (p *packer) abort() {
	p.mu.Lock()
	p.cur = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// packData is a downloaded pack: in memory, or in a temp file past the memory budget.
type packData struct {
	id   PackID
	mem  []byte
	file *os.File
	size int64
}

// blob returns a blob's stored bytes.
func (d *packData) blob(ref Ref) ([]byte, error) {
	if ref.Pack != d.id {
		return nil, fmt.Errorf("blob %.12s: asked of pack %s, it is in %s", ref.Digest.String(), d.id, ref.Pack)
	}
	if d.mem != nil {
		return blobIn(ref, d.mem)
	}
	end := int64(ref.Offset) + int64(ref.Stored)
	if end > d.size {
		return nil, fmt.Errorf("blob %.12s: past the end of pack %s: %w", ref.Digest.String(), ref.Pack, ErrCorrupt)
	}
	b := make([]byte, ref.Stored)
	if _, err := d.file.ReadAt(b, int64(ref.Offset)); err != nil {
		return nil, fmt.Errorf("read pack %s: %w", ref.Pack, err)
	}
	return b, nil
}

func (d *packData) drop() {
	d.mem = nil
	if d.file != nil {
		d.file.Close()
		os.Remove(d.file.Name())
		d.file = nil
	}
}

// ErrMissing: a pack a snapshot needs is not in the store.
var ErrMissing = errors.New("snapshot data missing from the store")

// fetcher downloads packs in the order given, a few at once, ahead of their use.
type fetcher struct {
	r      *Repo
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	ready  map[PackID]chan struct{}
	data   map[PackID]*packData
	errs   map[PackID]error
	inMem  int64
	wg     sync.WaitGroup // the downloaders; owned by close
	onDone func(PackID, int64)
}

func (r *Repo) newFetcher(ctx context.Context, order []PackID, onDone func(PackID, int64)) *fetcher {
	ctx, cancel := context.WithCancel(ctx)
	f := &fetcher{r: r, ctx: ctx, cancel: cancel, ready: map[PackID]chan struct{}{}, data: map[PackID]*packData{},
		errs: map[PackID]error{}, onDone: onDone}
	queue := make(chan PackID, len(order))
	for _, p := range order {
		if _, dup := f.ready[p]; dup {
			continue
		}
		f.ready[p] = make(chan struct{})
		queue <- p
	}
	close(queue)
	for range r.cfg.Downloads {
		f.wg.Go(func() {
			for p := range queue {
				if ctx.Err() != nil {
					f.finish(p, nil, ctx.Err())
					continue
				}
				d, err := f.download(p)
				f.finish(p, d, err)
			}
		})
	}
	return f
}

func (f *fetcher) finish(p PackID, d *packData, err error) {
	f.mu.Lock()
	f.data[p], f.errs[p] = d, err
	ch := f.ready[p]
	f.mu.Unlock()
	close(ch)
	if err == nil && f.onDone != nil {
		f.onDone(p, d.size)
	}
}

func (f *fetcher) download(p PackID) (*packData, error) {
	b, _, err := f.r.getAll(f.ctx, PackKey(p), maxPackSize)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("pack %s: %w", p, ErrMissing)
		}
		return nil, fmt.Errorf("download pack %s: %w", p, err)
	}
	if _, err := decodeTrailer(p, b); err != nil {
		return nil, err
	}
	d := &packData{id: p, size: int64(len(b))}
	f.mu.Lock()
	fits := f.inMem+d.size <= f.r.cfg.MemoryBudget
	if fits {
		f.inMem += d.size
	}
	f.mu.Unlock()
	if fits {
		d.mem = b
		return d, nil
	}
	tmp, err := os.CreateTemp(f.r.cfg.TempDir, "toolhost-pack-*")
	if err != nil {
		return nil, fmt.Errorf("pack %s: temp file: %w", p, err)
	}
	os.Remove(tmp.Name()) // unlinked: gone when closed, whatever happens
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("pack %s: temp file: %w", p, err)
	}
	d.file = tmp
	return d, nil
}

// wait returns the pack once downloaded.
func (f *fetcher) wait(p PackID) (*packData, error) {
	f.mu.Lock()
	ch := f.ready[p]
	f.mu.Unlock()
	if ch == nil {
		return nil, fmt.Errorf("pack %s was not asked for", p)
	}
	select {
	case <-ch:
	case <-f.ctx.Done():
		return nil, f.ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.data[p], f.errs[p]
}

// release frees a pack no longer needed.
func (f *fetcher) release(p PackID) {
	f.mu.Lock()
	d := f.data[p]
	delete(f.data, p)
	if d != nil && d.mem != nil {
		f.inMem -= d.size
	}
	f.mu.Unlock()
	if d != nil {
		d.drop()
	}
}

// close stops the downloads and frees every pack.
func (f *fetcher) close() {
	f.cancel()
	f.wg.Wait()
	f.mu.Lock()
	ds := f.data
	f.data = map[PackID]*packData{}
	f.mu.Unlock()
	for _, d := range ds {
		if d != nil {
			d.drop()
		}
	}
}
