package chunked

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/restic/chunker"

	"github.com/toolhost/toolhost/internal/tree"
)

// Lister is a tree that is listed first and read after: the saver reads only the files
// that changed since the snapshot it saves over. A directory (DirSource) and the
// in-sandbox agent are Listers.
type Lister interface {
	// List returns every entry (files without their contents).
	List(ctx context.Context) ([]tree.Entry, tree.WalkStats, error)
	// Read calls fn, in order, for each of paths that is still a regular file, with the
	// entry as opened (its size and times now) and its contents (at most e.Size bytes).
	// Files that vanished or changed type are left out (fn is not called).
	Read(ctx context.Context, paths []string, fn func(e tree.Entry, r io.Reader) error) error
}

// Streamer is a tree read in one pass, contents and all (a tar stream).
type Streamer interface {
	Stream(ctx context.Context, fn func(e tree.Entry, r io.Reader) error) (tree.WalkStats, error)
}

// BuildOptions describe a save.
type BuildOptions struct {
	Project string
	Label   string
	// Base is the snapshot the save is made over: its unchanged files are not read and its
	// chunks are reused. Nil: none (every file is read; chunks are still stored once).
	Base *Manifest
	// Newest is the content digest of the project's newest snapshot, in any format: a
	// tree with the same content is not stored (BuildResult.Unchanged).
	Newest *Digest
	// Origin is carried into the manifest (a fork's origin); empty means Base's.
	Origin string
	// RootMode and RootMTime describe the root directory, when the source knows them.
	RootMode  uint32
	RootMTime int64
}

// SaveStats say what a save did.
type SaveStats struct {
	Files, Dirs, Symlinks int
	Bytes                 int64 // the tree's file contents
	Read                  int   // files read (the others were unchanged)
	BytesRead             int64
	NewChunks             int   // chunks no pack held
	NewBytes              int64 // their raw bytes
	Uploaded              int64 // bytes of packs, index and manifest stored
	Packs                 int   // packs stored
	Duration              time.Duration
	Walk                  tree.WalkStats
}

// BuildResult is a save before its manifest is stored (Commit).
type BuildResult struct {
	Manifest *Manifest
	// Unchanged: the tree's content equals Newest; nothing was stored.
	Unchanged bool
	Stats     SaveStats

	entries []Entry
	view    *view
}

// scanCache is the last save's entries of a project, with the walk's view of each file
// (inode, change time): a file whose size and times are all the same is not read again.
type scanCache struct {
	key    string
	byPath map[string]*Entry
	// entries and segs are the snapshot's entries and the segments they were stored
	// in (finish reuses a segment whose entries are the same without encoding it)
	entries []Entry
	segs    []SegRef
}

type fileRec struct {
	e     Entry
	slots []*Ref
	multi bool     // the file digest was computed while chunking
	fixed bool     // e is whole (Digest, Chunks): a file reused from the base
	alias *fileRec // a hard link of a tar stream: the same contents as this file
}

type chunkJob struct {
	rec    *fileRec
	slot   *Ref
	data   []byte
	pooled bool
	single bool
}

type pending struct {
	done chan struct{}
	ref  Ref
	err  error
}

type builder struct {
	r    *Repo
	ctx  context.Context
	opts BuildOptions
	v    *view

	base map[string]*Entry // the base's files by path (read only)
	// extra: the base's reusable chunks the index does not offer (lookup)
	extra     map[Digest]Ref
	extraOnce sync.Once
	scan      *scanCache // the project's scan cache, when it is the base's
	// okPacks: the packs whose chunks a save may reuse (view.ok of each, once)
	okPacks map[PackID]bool
	// suspect: the base needs a pack found damaged, so it may not restore: a tree equal
	// to it is stored all the same (never Unchanged against it).
	suspect bool

	mu    sync.Mutex
	seen  map[Digest]*pending
	err   error
	stats SaveStats

	pk   *packer
	jobs chan chunkJob
	wg   sync.WaitGroup
	recs []*fileRec
	// listed: how many of recs a Lister's listing gave (the rest were read after); -1
	// for the other sources.
	listed int
	files  map[string]*fileRec
	other  []Entry
	ch     *chunker.Chunker
}

var chunkPool = sync.Pool{New: func() any { b := make([]byte, MaxChunk); return &b }}

// racy: a file whose modification time is this close to (or after) the start of the scan
// that saw it is read again, whatever its times say now: a write in the same clock tick
// as an earlier one leaves the times unchanged (file systems' clocks tick coarsely; this is
// git's "racily clean" rule, with room for second-granular file systems).
const racy = time.Second

// Build saves a tree's chunks: it lists src (a Lister or a Streamer), reads what changed
// since opts.Base, stores the chunks no pack holds (in packs of PackTarget bytes, uploaded
// in parallel) and the index of those packs, and returns the manifest, ready for Commit.
// A tree whose content equals opts.Newest stores nothing and is Unchanged.
func (r *Repo) Build(ctx context.Context, src any, opts BuildOptions) (*BuildResult, error) {
	start := time.Now()
	v, err := r.refresh(ctx)
	if err != nil {
		return nil, err
	}
	b := &builder{r: r, ctx: ctx, opts: opts, v: v, listed: -1, seen: map[Digest]*pending{}}
	b.okPacks = make(map[PackID]bool, len(v.live))
	for p := range v.live {
		if v.ok(p) {
			b.okPacks[p] = true
		}
	}
	if err := b.loadBase(ctx); err != nil {
		return nil, err
	}
	b.pk = newPacker(ctx, r)
	workers := max(runtime.GOMAXPROCS(0), 2)
	b.jobs = make(chan chunkJob, workers*4)
	for range workers {
		b.wg.Go(b.worker) // owned by Build: the jobs channel is closed and waited on below
	}
	scanStart := time.Now().UnixNano()
	var walk tree.WalkStats
	var runErr error
	switch s := src.(type) {
	case *prebuilt:
		runErr = b.fromPrebuilt(s)
	case Lister:
		walk, runErr = b.fromLister(ctx, s)
	case Streamer:
		walk, runErr = s.Stream(ctx, func(e tree.Entry, rd io.Reader) error { return b.add(e, rd) })
	default:
		runErr = fmt.Errorf("chunked: source %T is neither a Lister nor a Streamer", src)
	}
	close(b.jobs)
	b.wg.Wait()
	if runErr == nil {
		runErr = b.err
	}
	if runErr != nil {
		b.pk.abort()
		return nil, runErr
	}
	// The entries come in runs, each in walk order as a Lister gives them (the
	// directories and links; the files listed unchanged; the files read after): merged,
	// not sorted, when they are (sorting 20,000 entries was a tenth of a second save).
	files := make([]Entry, 0, len(b.recs))
	var read, aliases []Entry
	for i, rec := range b.recs {
		if rec.alias != nil {
			continue
		}
		if i == b.listed {
			read = make([]Entry, 0, len(b.recs)-i)
		}
		if !rec.fixed {
			rec.e.Chunks = make([]Ref, len(rec.slots))
			for i, s := range rec.slots {
				rec.e.Chunks[i] = *s
			}
			if !rec.multi && len(rec.slots) == 1 {
				rec.e.Digest = rec.slots[0].Digest
			} else if len(rec.slots) == 0 {
				rec.e.Digest = sha256.Sum256(nil)
			}
		}
		if read != nil {
			read = append(read, rec.e)
		} else {
			files = append(files, rec.e)
		}
	}
	for _, rec := range b.recs {
		if a := rec.alias; a != nil {
			for a.alias != nil {
				a = a.alias
			}
			rec.e.Size, rec.e.Digest, rec.e.Chunks = a.e.Size, a.e.Digest, a.e.Chunks
			b.stats.Bytes += rec.e.Size
			aliases = append(aliases, rec.e)
		}
	}
	entries := mergeRuns(b.other, files, read, aliases)
	for i := 1; i < len(entries); i++ {
		if entries[i].Path == entries[i-1].Path {
			return nil, fmt.Errorf("entry %q appears twice: %w", entries[i].Path, tree.ErrUnsafe)
		}
	}
	res, err := b.finish(ctx, entries, scanStart, walk)
	if err != nil {
		return nil, err
	}
	res.Stats.Duration = time.Since(start)
	return res, nil
}

// ErrBase: the snapshot a save was to be made over cannot be its base: its listing does
// not read (the error is also ErrCorrupt or ErrMissing, and a PackError when a pack is at
// fault). Build fails with it before it reads anything of the tree being saved, so the
// caller can examine that snapshot and build again over another, or over none.
var ErrBase = errors.New("the snapshot saved over does not read")

// loadBase indexes the base's entries by path (the project's scan cache itself when it is
// the base's), and notes which of their chunks the index does not offer for reuse. An
// entry whose chunks are not all in live packs no damage record names is not reused
// (unchanged checks). The base's listing is never read from a pack found damaged.
func (b *builder) loadBase(ctx context.Context) error {
	m := b.opts.Base
	if m == nil {
		return nil
	}
	for _, p := range m.Packs {
		if b.v.damaged[p] {
			b.suspect = true
		}
	}
	b.r.mu.Lock()
	sc := b.r.scans[b.opts.Project]
	b.r.mu.Unlock()
	if sc != nil && sc.key == m.Key {
		b.base = sc.byPath // read only: a reused entry is copied (fromLister)
		b.scan = sc
		return nil
	}
	for _, s := range m.Segments {
		if b.v.damaged[s.Pack] {
			return fmt.Errorf("%w: %s: %w", ErrBase, m.Key,
				&PackError{Pack: s.Pack, Err: fmt.Errorf("its listing is in pack %s, found damaged: %w", s.Pack, ErrCorrupt)})
		}
	}
	all, err := b.r.Entries(ctx, m)
	if errors.Is(err, ErrCorrupt) || errors.Is(err, ErrMissing) {
		return fmt.Errorf("%w: %s: %w", ErrBase, m.Key, err)
	}
	if err != nil {
		return fmt.Errorf("read the snapshot saved over (%s): %w", m.Key, err)
	}
	b.base = make(map[string]*Entry, len(all))
	for i := range all {
		if all[i].Type == tree.File {
			b.base[all[i].Path] = &all[i]
		}
	}
	return nil
}

// reusable reports whether every chunk of a base entry is in a pack a save may reuse.
func (b *builder) reusable(e *Entry) bool {
	for _, c := range e.Chunks {
		if !b.okPacks[c.Pack] {
			return false
		}
	}
	return true
}

// lookup finds a chunk a save may reuse: in the index (its pack live, not doomed, not
// damaged), else among the base's chunks (those are looked at once, on the first chunk
// the index does not offer).
func (b *builder) lookup(d Digest) (Ref, bool) {
	if ref, ok := b.v.blobs[d]; ok && b.okPacks[ref.Pack] {
		return ref, true
	}
	b.extraOnce.Do(func() {
		if len(b.v.doomed) == 0 && len(b.v.damaged) == 0 {
			// Every pack the index lists is reusable, and so is each chunk it lists: a
			// base's chunk in such a pack is among them (or, if an index object left it
			// out, is stored again: a copy, never a wrong reference).
			return
		}
		for _, e := range b.base {
			if !b.reusable(e) {
				continue
			}
			for _, c := range e.Chunks {
				if ref, ok := b.v.blobs[c.Digest]; ok && b.okPacks[ref.Pack] {
					continue
				}
				if b.extra == nil {
					b.extra = map[Digest]Ref{}
				}
				b.extra[c.Digest] = c
			}
		}
	})
	ref, ok := b.extra[d]
	return ref, ok
}

// unchanged returns the base's entry for a file that needs no reading.
func (b *builder) unchanged(e tree.Entry) *Entry {
	old := b.base[e.Path]
	if old == nil || old.Size != e.Size || old.MTime != e.MTime {
		return nil
	}
	if old.Ino != 0 && e.Ino != 0 && (old.Ino != e.Ino || old.CTime != e.CTime) {
		return nil
	}
	if b.opts.Base != nil && e.MTime >= b.opts.Base.ScanTime-int64(racy) {
		return nil
	}
	if !b.reusable(old) {
		return nil
	}
	return old
}

func (b *builder) fromLister(ctx context.Context, l Lister) (tree.WalkStats, error) {
	list, walk, err := l.List(ctx)
	if err != nil {
		return walk, err
	}
	var need []string
	for _, e := range list {
		if e.Type != tree.File {
			if err := b.add(e, nil); err != nil {
				return walk, err
			}
			continue
		}
		if old := b.unchanged(e); old != nil {
			n := *old
			n.Entry = e // the new times, mode and stat cache; the old content (chunks shared, never written)
			b.recs = append(b.recs, &fileRec{e: n, fixed: true})
			b.stats.Files++
			b.stats.Bytes += e.Size
			continue
		}
		need = append(need, e.Path)
	}
	b.listed = len(b.recs)
	err = l.Read(ctx, need, func(e tree.Entry, rd io.Reader) error { return b.add(e, rd) })
	return walk, err
}

func (b *builder) fromPrebuilt(p *prebuilt) error {
	for _, e := range p.entries {
		if e.Type != tree.File {
			if err := b.add(e.Entry, nil); err != nil {
				return err
			}
			continue
		}
		if data, ok := p.data[e.Path]; ok {
			e.Size = int64(len(data))
			if err := b.add(e.Entry, bytes.NewReader(data)); err != nil {
				return err
			}
			continue
		}
		b.recs = append(b.recs, &fileRec{e: e, slots: refs(e.Chunks), multi: true})
		b.stats.Files++
		b.stats.Bytes += e.Size
	}
	return nil
}

// mergeRuns merges runs of entries, each sorted by path, into one; runs that are not
// sorted are sorted together instead.
func mergeRuns(runs ...[]Entry) []Entry {
	n := 0
	sorted := true
	for _, r := range runs {
		n += len(r)
		sorted = sorted && slices.IsSortedFunc(r, func(a, b Entry) int { return compare(a.Path, b.Path) })
	}
	out := make([]Entry, 0, n)
	if !sorted {
		for _, r := range runs {
			out = append(out, r...)
		}
		slices.SortFunc(out, func(a, b Entry) int { return compare(a.Path, b.Path) })
		return out
	}
	for _, r := range runs {
		if len(r) == 0 {
			continue
		}
		if len(out) == 0 || compare(out[len(out)-1].Path, r[0].Path) < 0 {
			out = append(out, r...)
			continue
		}
		// Merge r into out from the back, in place.
		i, j := len(out)-1, len(r)-1
		out = append(out, r...)
		for k := len(out) - 1; j >= 0; k-- {
			if i >= 0 && compare(out[i].Path, r[j].Path) > 0 {
				out[k] = out[i]
				i--
			} else {
				out[k] = r[j]
				j--
			}
		}
	}
	return out
}

func refs(cs []Ref) []*Ref {
	out := make([]*Ref, len(cs))
	for i := range cs {
		c := cs[i]
		out[i] = &c
	}
	return out
}

// add takes one entry; a file's contents are read from rd (at most e.Size bytes) and
// cut into chunks, which the workers hash, look up and store.
func (b *builder) add(e tree.Entry, rd io.Reader) error {
	if err := b.ctx.Err(); err != nil {
		return err
	}
	if err := b.failed(); err != nil {
		return err
	}
	if err := tree.Check(e, 0); err != nil {
		return err
	}
	switch e.Type {
	case tree.Dir:
		b.stats.Dirs++
		b.other = append(b.other, Entry{Entry: e})
		return nil
	case tree.Symlink:
		b.stats.Symlinks++
		b.other = append(b.other, Entry{Entry: e})
		return nil
	}
	if _, ok := rd.(hardLink); ok {
		target := b.files[e.Target]
		if target == nil {
			return fmt.Errorf("entry %q: hard link to %q, which is not a file that came before it: %w", e.Path, e.Target, tree.ErrUnsafe)
		}
		e.Target = ""
		rec := &fileRec{e: Entry{Entry: e}, alias: target}
		b.recs = append(b.recs, rec)
		b.files[e.Path] = rec
		b.stats.Files++
		return nil
	}
	rec := &fileRec{e: Entry{Entry: e}}
	b.recs = append(b.recs, rec)
	if b.files == nil {
		b.files = map[string]*fileRec{}
	}
	b.files[e.Path] = rec
	b.stats.Files++
	b.stats.Read++
	if rd == nil {
		rd = eofReader{}
	}
	if e.Size < MinChunk {
		data := make([]byte, e.Size)
		n, err := io.ReadFull(rd, data)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read %q: %w", e.Path, err)
		}
		rec.e.Size = int64(n) // a file that shrank while read is stored as read
		b.stats.Bytes += int64(n)
		b.stats.BytesRead += int64(n)
		if n == 0 {
			return nil
		}
		slot := new(Ref)
		rec.slots = append(rec.slots, slot)
		return b.send(chunkJob{rec: rec, slot: slot, data: data[:n], single: true})
	}
	h := sha256.New()
	lr := io.TeeReader(io.LimitReader(rd, e.Size), h)
	if b.ch == nil {
		b.ch = chunker.NewWithBoundaries(lr, Polynomial, MinChunk, MaxChunk)
	} else {
		b.ch.ResetWithBoundaries(lr, Polynomial, MinChunk, MaxChunk)
	}
	b.ch.SetAverageBits(AverageBits)
	var total int64
	for {
		bufp := chunkPool.Get().(*[]byte)
		c, err := b.ch.Next(*bufp)
		if err == io.EOF {
			chunkPool.Put(bufp)
			break
		}
		if err != nil {
			chunkPool.Put(bufp)
			return fmt.Errorf("read %q: %w", e.Path, err)
		}
		total += int64(c.Length)
		slot := new(Ref)
		rec.slots = append(rec.slots, slot)
		if err := b.send(chunkJob{rec: rec, slot: slot, data: c.Data, pooled: true}); err != nil {
			return err
		}
	}
	rec.multi = true
	h.Sum(rec.e.Digest[:0])
	rec.e.Size = total
	b.stats.Bytes += total
	b.stats.BytesRead += total
	return nil
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

func (b *builder) send(j chunkJob) error {
	select {
	case b.jobs <- j:
		return nil
	case <-b.ctx.Done():
		return b.ctx.Err()
	}
}

func (b *builder) failed() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

func (b *builder) fail(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err == nil {
		b.err = err
	}
}

func (b *builder) worker() {
	for j := range b.jobs {
		ref, err := b.store(j)
		if j.pooled {
			buf := j.data[:cap(j.data)]
			chunkPool.Put(&buf)
		}
		if err != nil {
			b.fail(err)
			continue
		}
		*j.slot = ref
	}
}

// store finds a chunk in the store, or compresses it into a pack.
func (b *builder) store(j chunkJob) (Ref, error) {
	d := Digest(sha256.Sum256(j.data))
	if ref, ok := b.lookup(d); ok {
		return ref, nil
	}
	b.mu.Lock()
	if p := b.seen[d]; p != nil {
		b.mu.Unlock()
		<-p.done
		return p.ref, p.err
	}
	p := &pending{done: make(chan struct{})}
	b.seen[d] = p
	b.mu.Unlock()
	stored, comp := compress(j.data)
	p.ref, p.err = b.pk.add(KindData, d, stored, comp, len(j.data))
	close(p.done)
	if p.err == nil {
		b.mu.Lock()
		b.stats.NewChunks++
		b.stats.NewBytes += int64(len(j.data))
		b.mu.Unlock()
	}
	return p.ref, p.err
}

// finish segments the entries, stores the new segments, seals the packs, writes the index.
func (b *builder) finish(ctx context.Context, entries []Entry, scanStart int64, walk tree.WalkStats) (*BuildResult, error) {
	m := &Manifest{Format: formatVersion, Project: b.opts.Project, ScanTime: scanStart, Label: b.opts.Label,
		Files: b.stats.Files, Dirs: b.stats.Dirs, Symlinks: b.stats.Symlinks, Bytes: b.stats.Bytes,
		RootMode: b.opts.RootMode, RootMTime: b.opts.RootMTime, Origin: b.opts.Origin,
		Skipped: walk.Skipped, Skips: walk.Skips}
	if len(m.Skips) > 20 {
		m.Skips = m.Skips[:20]
	}
	if b.opts.Base != nil {
		m.Parent = b.opts.Base.Key
		if m.Origin == "" {
			m.Origin = b.opts.Base.Origin
		}
	}
	m.Tree = TreeDigest(entries)
	b.stats.Walk = walk
	res := &BuildResult{Manifest: m, entries: entries, view: b.v}
	if b.opts.Newest != nil && *b.opts.Newest == m.Tree && !b.suspect {
		b.pk.abort() // holds nothing a manifest could need: the content is all stored
		res.Unchanged = true
		res.Stats = b.stats
		return res, nil
	}
	baseSegs := map[Digest]Ref{}
	if b.opts.Base != nil {
		for _, s := range b.opts.Base.Segments {
			if b.v.ok(s.Pack) {
				baseSegs[s.Digest] = s.Ref
			}
		}
	}
	packs := map[PackID]bool{}
	var prev []Entry // the base's entries from segment si on (scan cache)
	var prevSegs []SegRef
	if b.scan != nil && len(b.scan.segs) == len(b.opts.Base.Segments) {
		prev, prevSegs = b.scan.entries, b.scan.segs
	}
	for si, seg := range splitSegments(entries) {
		var ref Ref
		ok := false
		if si < len(prevSegs) {
			// The base's segment at the same place holds the same entries: it is this
			// segment, byte for byte (an edit changes the one segment holding it).
			ps := prevSegs[si]
			if ps.Entries == len(seg) && ps.Entries <= len(prev) && sameEntries(seg, prev[:ps.Entries]) {
				ref, ok = baseSegs[ps.Digest]
			}
			prev = prev[min(ps.Entries, len(prev)):]
		}
		if !ok {
			raw := encodeSegment(seg)
			d := Digest(sha256.Sum256(raw))
			if ref, ok = baseSegs[d]; !ok {
				stored, comp := compress(raw)
				var err error
				if ref, err = b.pk.add(KindSegment, d, stored, comp, len(raw)); err != nil {
					return nil, err
				}
				baseSegs[d] = ref
			}
		}
		m.Segments = append(m.Segments, SegRef{Ref: ref, Entries: len(seg)})
		packs[ref.Pack] = true
		for _, e := range seg {
			for _, c := range e.Chunks {
				packs[c.Pack] = true
			}
		}
	}
	for p := range packs {
		m.Packs = append(m.Packs, p)
	}
	slices.SortFunc(m.Packs, func(a, b PackID) int { return compareBytes(a[:], b[:]) })
	written, err := b.pk.finish()
	if err != nil {
		return nil, err
	}
	if err := b.r.writeIndex(ctx, written); err != nil {
		return nil, err
	}
	// The packs just written are this save's own: a later check must not refuse them.
	if len(written) > 0 {
		fresh := make(map[PackID]bool, len(written))
		for p := range written {
			fresh[p] = true
		}
		nv := *b.v
		nv.fresh = fresh
		res.view = &nv
	}
	b.stats.Packs = len(written)
	b.stats.Uploaded = b.pk.bytes
	res.Stats = b.stats
	return res, nil
}

func compareBytes(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return int(a[i]) - int(b[i])
		}
	}
	return 0
}

// Commit stores a built snapshot's manifest under key (a key of ManifestKey's form that
// sorts after the project's newest snapshot: the caller's choice), after checking that
// every pack it needs is still live, and remembers its entries for the project's next save.
func (r *Repo) Commit(ctx context.Context, res *BuildResult, key string) error {
	if res.Unchanged {
		return errors.New("chunked: an unchanged snapshot has nothing to commit")
	}
	m := res.Manifest
	if _, t, ok := ParseManifestKey(key); ok {
		m.Time = t
	}
	if err := r.putManifest(ctx, res.view, m, key); err != nil {
		return err
	}
	r.Remember(m.Project, key, res.entries)
	r.mu.Lock()
	if sc := r.scans[m.Project]; sc != nil && sc.key == key {
		sc.entries, sc.segs = res.entries, m.Segments
	}
	r.mu.Unlock()
	return nil
}

// sameEntries reports whether two runs of entries encode alike (encodeSegment): every
// field but the stat cache.
func sameEntries(a, b []Entry) bool {
	for i := range a {
		x, y := &a[i], &b[i]
		if x.Path != y.Path || x.Type != y.Type || x.Mode != y.Mode || x.MTime != y.MTime || x.Target != y.Target ||
			x.Size != y.Size || x.Digest != y.Digest || !slices.Equal(x.Chunks, y.Chunks) {
			return false
		}
	}
	return true
}

// Remember makes entries the project's scan cache for saves over key.
func (r *Repo) Remember(project, key string, entries []Entry) {
	sc := &scanCache{key: key, byPath: make(map[string]*Entry, len(entries))}
	for i := range entries {
		if entries[i].Type == tree.File {
			sc.byPath[entries[i].Path] = &entries[i]
		}
	}
	r.mu.Lock()
	r.scans[project] = sc
	r.mu.Unlock()
}

// Entries returns a manifest's entries, in order (its segments read from their packs).
func (r *Repo) Entries(ctx context.Context, m *Manifest) ([]Entry, error) {
	r.mu.Lock()
	sc := r.scans[m.Project]
	r.mu.Unlock()
	_ = sc
	need := map[PackID][]SegRef{}
	segs := make([][]Entry, len(m.Segments))
	for i, s := range m.Segments {
		r.mu.Lock()
		cached, ok := r.segments[s.Digest]
		r.mu.Unlock()
		if ok {
			segs[i] = cached
			continue
		}
		need[s.Pack] = append(need[s.Pack], s)
	}
	if len(need) > 0 {
		var order []PackID
		for p := range need {
			order = append(order, p)
		}
		f := r.newFetcher(ctx, order, nil)
		defer f.close()
		for _, p := range order {
			pk, err := f.wait(p)
			if err != nil {
				return nil, packErr(p, err)
			}
			for _, s := range need[p] {
				stored, err := pk.blob(s.Ref)
				if err != nil {
					return nil, packErr(p, err)
				}
				raw, err := openBlob(s.Ref, stored)
				if err != nil {
					return nil, packErr(p, err)
				}
				ents, err := decodeSegment(raw)
				if err != nil {
					return nil, fmt.Errorf("manifest %s: %w", m.Key, err)
				}
				if len(ents) != s.Entries {
					return nil, fmt.Errorf("manifest %s: a segment of %d entries for %d: %w", m.Key, len(ents), s.Entries, ErrCorrupt)
				}
				r.mu.Lock()
				if len(r.segments) > 4096 {
					clear(r.segments)
				}
				r.segments[s.Digest] = ents
				r.mu.Unlock()
			}
		}
		for i, s := range m.Segments {
			if segs[i] == nil {
				r.mu.Lock()
				segs[i] = r.segments[s.Digest]
				r.mu.Unlock()
			}
		}
	}
	var out []Entry
	for _, s := range segs {
		out = append(out, s...)
	}
	for i := 1; i < len(out); i++ {
		if compare(out[i-1].Path, out[i].Path) >= 0 {
			return nil, fmt.Errorf("manifest %s: entries out of order at %q: %w", m.Key, out[i].Path, ErrCorrupt)
		}
	}
	if TreeDigest(out) != m.Tree {
		return nil, fmt.Errorf("manifest %s: its entries do not match its tree digest: %w", m.Key, ErrCorrupt)
	}
	return out, nil
}
