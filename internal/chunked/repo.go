// Package chunked is toolhost's content-addressed snapshot format: files cut into chunks
// by content-defined chunking, each chunk stored once per store under its SHA-256,
// compressed, in packs of a few MB; a manifest per snapshot lists the tree's entries
// (paths, modes, sizes, link targets, chunk lists) and the digest of the whole. A save
// costs what changed: it reads the files whose size or times changed since the snapshot
// it saves over, and uploads the chunks no pack holds yet.
//
// # Sharing a store with other hosts, and collecting garbage
//
// Retention deletes manifests; packs no manifest references are then garbage, and a
// collection (Collect) removes them, in two passes at least a grace period apart, while
// other hosts keep saving:
//
//   - mark: list every pack and every manifest; the packs older than the grace period that
//     no manifest references are written down as doomed (chunks/gc/doomed/...);
//   - sweep, a grace period later: list the manifests again; the doomed packs still
//     unreferenced are deleted, the index is rewritten without them, and only then is the
//     doomed list removed.
//
// A save reuses a chunk only from a pack that is in the index and in no doomed list, as
// seen by listing both (doomed lists first) at most MaxSaveAge before its manifest is
// written; past that it looks again, and a pack that became doomed meanwhile fails the
// save (it is made again from scratch, and uploads what it needs anew). With MaxSaveAge
// well under the grace period, no manifest can ever reference a deleted pack:
//
//   - a manifest written before a sweep lists the manifests is seen by it: what it
//     references is kept (taken back from the doomed list);
//   - one written after must have been decided less than MaxSaveAge before; had its
//     packs been doomed then, the save would have seen it; they were doomed later, so
//     the sweep is at least a grace period after its decision, and after its write;
//   - a pack a save is still filling is younger than the grace period, so never doomed;
//   - a host that dies mid-save leaves packs no manifest references: collected later.
//
// What this assumes: the store lists and creates consistently (S3 and the directory
// store do), the hosts' clocks agree to well within the grace period, and one collection
// runs at a time (it holds a lease: chunks/gc/lease/).
package chunked

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/store"
)

// Config configures a Repo. Store is required.
type Config struct {
	Store store.Store
	// Retry is the policy of every store call's retries.
	Retry store.Retry
	// Grace is how long a pack must stay unreferenced, from the mark that doomed it, before
	// a sweep deletes it; also how old a pack must be before it can be doomed. Default 1h.
	Grace time.Duration
	// MaxSaveAge bounds the time between a save's look at the index and the write of its
	// manifest; default Grace/4. It must stay well under Grace (see the package doc).
	MaxSaveAge time.Duration
	// Uploads and Downloads are how many packs move at once (default 4 and 6).
	Uploads   int
	Downloads int
	// MemoryBudget is how many bytes of packs a restore holds in memory before it keeps
	// them in temp files (default 256 MiB).
	MemoryBudget int64
	TempDir      string
	Logger       *slog.Logger
	// Now is the wall clock of marks and sweeps (time.Now when nil).
	Now func() time.Time
}

// Repo is the chunked format on one store: it caches what it learnt of the store's index
// (immutable objects, so a cache is never stale, only incomplete). Safe for concurrent use.
type Repo struct {
	cfg Config
	st  store.Store
	log *slog.Logger

	*cache // shared by the views WithStore makes
}

// cache is what a Repo learnt of its store, shared with the Repo's views (WithStore).
type cache struct {
	mu        sync.Mutex
	index     map[string]*indexObj  // key → contents
	badIndex  map[string]bool       // index objects that do not read (skipped: their packs are not reused)
	doomed    map[string][]PackID   // key → packs
	blobs     map[Digest]Ref        // every data blob the index lists
	packs     map[PackID]bool       // every pack the index lists
	manifests map[string]*Manifest  // key → manifest (immutable)
	scans     map[string]*scanCache // project → the last save's entries
	segments  map[Digest][]Entry    // decoded segments of recent manifests
}

// New makes a Repo.
func New(cfg Config) (*Repo, error) {
	if cfg.Store == nil {
		return nil, errors.New("chunked: Config.Store is required")
	}
	if cfg.Grace <= 0 {
		cfg.Grace = time.Hour
	}
	if cfg.MaxSaveAge <= 0 {
		cfg.MaxSaveAge = cfg.Grace / 4
	}
	if cfg.MaxSaveAge >= cfg.Grace {
		return nil, fmt.Errorf("chunked: MaxSaveAge %s must be less than Grace %s", cfg.MaxSaveAge, cfg.Grace)
	}
	if cfg.Uploads <= 0 {
		cfg.Uploads = 4
	}
	if cfg.Downloads <= 0 {
		cfg.Downloads = 6
	}
	if cfg.MemoryBudget <= 0 {
		cfg.MemoryBudget = 256 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Repo{cfg: cfg, st: cfg.Store, log: cfg.Logger.With("component", "snapshot"),
		cache: &cache{index: map[string]*indexObj{}, badIndex: map[string]bool{}, doomed: map[string][]PackID{}, blobs: map[Digest]Ref{},
			packs: map[PackID]bool{}, manifests: map[string]*Manifest{}, scans: map[string]*scanCache{},
			segments: map[Digest][]Entry{}}}, nil
}

// Store is the Repo's store.
func (r *Repo) Store() store.Store { return r.st }

// WithStore is a view of r that goes to st instead, a wrapper of r's store (one that
// fences a holder's writes off, say): it shares what r learnt of the store, and what it
// learns, since both see the same objects.
func (r *Repo) WithStore(st store.Store) *Repo {
	v := *r
	v.st, v.cfg.Store = st, st
	return &v
}

// do runs fn with the retry policy.
func (r *Repo) do(ctx context.Context, what string, fn func(context.Context) error) error {
	_, err := r.cfg.Retry.Do(ctx, fn, func(a store.Attempt) {
		if !a.Last {
			r.log.Warn("snapshot "+what+": attempt failed, retrying", "attempt", fmt.Sprintf("%d/%d", a.N, a.Of), "wait", a.Wait.Round(time.Millisecond), "err", a.Err)
		}
	})
	return err
}

// getAll reads a whole object of at most limit bytes, checking the SHA-256 in its
// metadata when there is one.
func (r *Repo) getAll(ctx context.Context, key string, limit int64) ([]byte, store.ObjectInfo, error) {
	var b []byte
	var oi store.ObjectInfo
	err := r.do(ctx, "read "+key, func(ctx context.Context) error {
		rc, info, err := r.st.Get(ctx, key)
		if err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return &permanent{err}
			}
			return err
		}
		defer rc.Close()
		b, err = io.ReadAll(io.LimitReader(rc, limit+1))
		if err != nil {
			if errors.Is(err, store.ErrChecksum) {
				return &permanent{fmt.Errorf("%s: %w: %w", key, ErrCorrupt, err)}
			}
			return err
		}
		oi = info
		return nil
	})
	var p *permanent
	if errors.As(err, &p) {
		err = p.err
	}
	if err != nil {
		return nil, oi, err
	}
	if int64(len(b)) > limit {
		return nil, oi, fmt.Errorf("%s: larger than %d bytes: %w", key, limit, ErrCorrupt)
	}
	if want := oi.Metadata["sha256"]; want != "" {
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != want {
			return nil, oi, fmt.Errorf("%s: its bytes do not match the SHA-256 stored with it: %w", key, ErrCorrupt)
		}
	}
	return b, oi, nil
}

// permanent stops the retries (an object that is not there will not appear).
type permanent struct{ err error }

func (p *permanent) Error() string   { return p.err.Error() }
func (p *permanent) Unwrap() []error { return []error{p.err, store.ErrInvalidKey} } // store.Permanent: no retry

// put stores b under key (IfNotExists), with its SHA-256 as metadata; a retry that finds
// its own object there takes it as stored.
func (r *Repo) put(ctx context.Context, key string, b []byte, ct string, md map[string]string, check func() error) error {
	sum := sha256.Sum256(b)
	h := hex.EncodeToString(sum[:])
	meta := map[string]string{"sha256": h}
	maps.Copy(meta, md)
	return r.do(ctx, "write "+key, func(ctx context.Context) error {
		if check != nil {
			if err := check(); err != nil {
				return &permanent{err}
			}
		}
		_, err := r.st.Put(ctx, key, bytes.NewReader(b), store.PutOptions{Size: int64(len(b)), ContentType: ct, Metadata: meta, IfNotExists: true})
		if errors.Is(err, store.ErrExists) {
			if oi, herr := r.st.Head(ctx, key); herr == nil && oi.Metadata["sha256"] == h {
				return nil
			}
			return &permanent{fmt.Errorf("%s %w", key, ErrTaken)}
		}
		return err
	})
}

// ErrTaken is a write whose key holds another object already: a save that picked a
// manifest key another writer took picks another.
var ErrTaken = errors.New("exists already with other contents")

func unwrapPermanent(err error) error {
	var p *permanent
	if errors.As(err, &p) {
		return p.err
	}
	return err
}

// indexObj is one index object: the packs a save (or a compaction) wrote and their blobs.
type indexObj struct {
	packs map[PackID][]packBlob
}

const indexMagic = "THIX"

func encodeIndex(packs map[PackID][]packBlob) []byte {
	b := []byte(indexMagic)
	b = binary.AppendUvarint(b, uint64(len(packs)))
	for id, blobs := range packs {
		b = append(b, id[:]...)
		b = binary.AppendUvarint(b, uint64(len(blobs)))
		for _, x := range blobs {
			b = append(b, x.Kind, x.Ref.Comp)
			b = append(b, x.Ref.Digest[:]...)
			b = binary.AppendUvarint(b, uint64(x.Ref.Offset))
			b = binary.AppendUvarint(b, uint64(x.Ref.Stored))
			b = binary.AppendUvarint(b, uint64(x.Ref.Raw))
		}
	}
	e, _ := codecs()
	return e.EncodeAll(b, nil)
}

func decodeIndex(key string, z []byte) (*indexObj, error) {
	_, d := codecs()
	b, err := d.DecodeAll(z, nil)
	if err != nil || len(b) < 4 || string(b[:4]) != indexMagic {
		return nil, fmt.Errorf("index %s: %w", key, ErrCorrupt)
	}
	r := &segReader{b: b[4:]}
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		return nil, fmt.Errorf("index %s: %w", key, ErrCorrupt)
	}
	obj := &indexObj{packs: map[PackID][]packBlob{}}
	for range n {
		var id PackID
		copy(id[:], r.bytes(16))
		nb := r.uvarint()
		if nb > uint64(len(r.b)) {
			return nil, fmt.Errorf("index %s: %w", key, ErrCorrupt)
		}
		blobs := make([]packBlob, 0, nb)
		for range nb {
			kc := r.bytes(2)
			var x packBlob
			if kc != nil {
				x.Kind, x.Ref.Comp = kc[0], kc[1]
			}
			copy(x.Ref.Digest[:], r.bytes(32))
			x.Ref.Pack = id
			x.Ref.Offset, x.Ref.Stored, x.Ref.Raw = uint32(r.uvarint()), uint32(r.uvarint()), uint32(r.uvarint())
			blobs = append(blobs, x)
		}
		obj.packs[id] = blobs
	}
	if r.err != nil {
		return nil, fmt.Errorf("index %s: %w", key, r.err)
	}
	return obj, nil
}

const doomMagic = "THDM"

func encodeDoomed(ids []PackID) []byte {
	b := []byte(doomMagic)
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		b = append(b, id[:]...)
	}
	return b
}

func decodeDoomed(key string, b []byte) ([]PackID, error) {
	if len(b) < 4 || string(b[:4]) != doomMagic {
		return nil, fmt.Errorf("doomed list %s: %w", key, ErrCorrupt)
	}
	r := &segReader{b: b[4:]}
	n := r.uvarint()
	if n > uint64(len(r.b))/16 {
		return nil, fmt.Errorf("doomed list %s: %w", key, ErrCorrupt)
	}
	ids := make([]PackID, n)
	for i := range ids {
		copy(ids[i][:], r.bytes(16))
	}
	return ids, r.err
}

// view is what a save may reuse: the packs the index lists and no doomed list names nor
// damage record, as seen at a moment (monotonic), and the packs the save wrote itself.
type view struct {
	at      time.Time
	live    map[PackID]bool
	blobs   map[Digest]Ref
	doomed  map[PackID]bool
	damaged map[PackID]bool
	// blind: a doomed list did not read, so any pack may be doomed: nothing in the store
	// is reused (the save stores what it needs anew, in packs too young to be doomed).
	blind bool
	fresh map[PackID]bool // written by the save this view is for
	copy  bool            // for a Copy, which reuses no chunk: damage records do not refuse it
}

func (v *view) ok(p PackID) bool {
	return v.fresh[p] || !v.blind && v.live[p] && !v.doomed[p] && !v.damaged[p]
}

// refresh lists the doomed lists, then the index (that order: see the package doc) and
// the damage records, reads what it has not read yet, and returns the view. An index
// object that does not read is skipped (its packs are not reused); a doomed list that
// does not read makes the view blind (nothing is reused until a collection drops it).
func (r *Repo) refresh(ctx context.Context) (*view, error) {
	at := time.Now()
	var doomedKeys, indexKeys, damagedKeys []store.ObjectInfo
	err := r.do(ctx, "list", func(ctx context.Context) error {
		var err error
		if doomedKeys, err = store.ListAll(ctx, r.st, PrefixDoomed); err != nil {
			return err
		}
		if indexKeys, err = store.ListAll(ctx, r.st, PrefixIndex); err != nil {
			return err
		}
		damagedKeys, err = store.ListAll(ctx, r.st, PrefixDamaged)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list the chunk index: %w", err)
	}
	blind := false
	dk := map[string]bool{}
	for _, o := range doomedKeys {
		dk[o.Key] = true
		r.mu.Lock()
		_, have := r.doomed[o.Key]
		r.mu.Unlock()
		if have {
			continue
		}
		b, _, err := r.getAll(ctx, o.Key, 64<<20)
		if errors.Is(err, store.ErrNotFound) {
			delete(dk, o.Key)
			continue
		}
		var ids []PackID
		if err == nil {
			ids, err = decodeDoomed(o.Key, b)
		}
		if errors.Is(err, ErrCorrupt) {
			r.log.Warn("snapshot: a list of doomed packs does not read; this save reuses no stored chunk until a collection drops it", "key", o.Key, "err", err)
			blind = true
			delete(dk, o.Key)
			continue
		}
		if err != nil {
			return nil, err
		}
		r.mu.Lock()
		r.doomed[o.Key] = ids
		r.mu.Unlock()
	}
	ik := map[string]bool{}
	for _, o := range indexKeys {
		ik[o.Key] = true
		r.mu.Lock()
		_, have := r.index[o.Key]
		bad := r.badIndex[o.Key]
		r.mu.Unlock()
		if have || bad {
			continue
		}
		b, _, err := r.getAll(ctx, o.Key, 256<<20)
		if errors.Is(err, store.ErrNotFound) { // compacted away meanwhile: its packs are in another
			delete(ik, o.Key)
			continue
		}
		var obj *indexObj
		if err == nil {
			obj, err = decodeIndex(o.Key, b)
		}
		if errors.Is(err, ErrCorrupt) {
			r.log.Warn("snapshot: an index object does not read; the chunks it lists are not reused", "key", o.Key, "err", err)
			r.mu.Lock()
			r.badIndex[o.Key] = true
			r.mu.Unlock()
			continue
		}
		if err != nil {
			return nil, err
		}
		r.mu.Lock()
		r.index[o.Key] = obj
		for id, blobs := range obj.packs {
			r.packs[id] = true
			for _, x := range blobs {
				if x.Kind == KindData {
					r.blobs[x.Ref.Digest] = x.Ref
				}
			}
		}
		r.mu.Unlock()
	}
	damaged := map[PackID]bool{}
	for _, o := range damagedKeys {
		if id, err := ParsePackID(strings.TrimPrefix(o.Key, PrefixDamaged)); err == nil {
			damaged[id] = true
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.doomed {
		if !dk[k] {
			delete(r.doomed, k)
		}
	}
	dropped := false
	for k := range r.index {
		if !ik[k] {
			delete(r.index, k)
			dropped = true
		}
	}
	if dropped { // rebuild from what is left
		r.packs, r.blobs = map[PackID]bool{}, map[Digest]Ref{}
		for _, obj := range r.index {
			for id, blobs := range obj.packs {
				r.packs[id] = true
				for _, x := range blobs {
					if x.Kind == KindData {
						r.blobs[x.Ref.Digest] = x.Ref
					}
				}
			}
		}
	}
	v := &view{at: at, live: maps.Clone(r.packs), blobs: r.blobs, doomed: map[PackID]bool{}, damaged: damaged, blind: blind}
	for _, ids := range r.doomed {
		for _, id := range ids {
			v.doomed[id] = true
		}
	}
	r.blobs = maps.Clone(r.blobs) // the view keeps the old map; later writes go to a copy
	return v, nil
}

// writeIndex stores an index object for packs.
func (r *Repo) writeIndex(ctx context.Context, packs map[PackID][]packBlob) error {
	if len(packs) == 0 {
		return nil
	}
	key := stampKey(PrefixIndex, r.cfg.Now())
	if err := r.put(ctx, key, encodeIndex(packs), "application/octet-stream", nil, nil); err != nil {
		return fmt.Errorf("write the chunk index: %w", unwrapPermanent(err))
	}
	return nil
}

// ErrStale: the packs a save meant to reuse became doomed (or vanished) before its
// manifest could be written; the save is made again from scratch.
var ErrStale = errors.New("chunks a save reused were collected meanwhile")

// putManifest validates m's packs (against a fresh view when v is older than half of
// MaxSaveAge) and stores m under key. Each attempt starts within MaxSaveAge of the view it
// was checked against.
func (r *Repo) putManifest(ctx context.Context, v *view, m *Manifest, key string) error {
	b, err := m.marshal()
	if err != nil {
		return err
	}
	e, _ := codecs()
	z := e.EncodeAll(b, nil)
	check := func() error {
		if v == nil || time.Since(v.at) > r.cfg.MaxSaveAge/2 {
			nv, err := r.refresh(ctx)
			if err != nil {
				return err
			}
			if v != nil {
				nv.fresh, nv.copy = v.fresh, v.copy
			}
			v = nv
		}
		for _, p := range m.Packs {
			switch {
			case v.fresh[p]:
			case v.damaged[p] && !v.copy:
				return fmt.Errorf("%w: pack %s was found damaged", ErrStale, p)
			case v.blind:
				return fmt.Errorf("%w: a doomed list does not read, so pack %s may be doomed (a collection drops the list)", ErrStale, p)
			case !v.live[p] || v.doomed[p]:
				return fmt.Errorf("%w: pack %s", ErrStale, p)
			}
		}
		return nil
	}
	if err := r.put(ctx, key, z, "application/zstd", map[string]string{"tree": m.Tree.String()}, check); err != nil {
		return fmt.Errorf("write manifest %s: %w", key, unwrapPermanent(err))
	}
	m.Key = key
	r.mu.Lock()
	r.manifests[key] = m
	r.mu.Unlock()
	return nil
}

// manifestError is a manifest that did not read (an Examiner reads it again: a read that
// failed once and not twice condemns nothing).
type manifestError struct{ error }

func (e *manifestError) Unwrap() error { return e.error }

// Manifest reads the manifest key (cached: manifests never change).
func (r *Repo) Manifest(ctx context.Context, key string) (*Manifest, error) {
	r.mu.Lock()
	m := r.manifests[key]
	r.mu.Unlock()
	if m != nil {
		return m, nil
	}
	z, _, err := r.getAll(ctx, key, 64<<20)
	if err != nil {
		return nil, &manifestError{err}
	}
	_, d := codecs()
	b, err := d.DecodeAll(z, nil)
	if err != nil {
		return nil, &manifestError{fmt.Errorf("manifest %s: %v: %w", key, err, ErrCorrupt)}
	}
	m, err = unmarshalManifest(key, b)
	if err != nil {
		return nil, &manifestError{err}
	}
	r.mu.Lock()
	r.manifests[key] = m
	r.mu.Unlock()
	return m, nil
}

// ListManifests lists every manifest key of the store (every project's snapshots and
// fork origins), or of one project when project is not empty.
func (r *Repo) ListManifests(ctx context.Context, project string) ([]string, error) {
	prefix := PrefixProjects
	if project != "" {
		prefix = SnapshotPrefix(project)
	}
	var objs []store.ObjectInfo
	err := r.do(ctx, "list", func(ctx context.Context) error {
		var err error
		objs, err = store.ListAll(ctx, r.st, prefix)
		return err
	})
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, o := range objs {
		if IsManifestKey(o.Key) {
			keys = append(keys, o.Key)
		}
	}
	return keys, nil
}

// Newest returns the project's newest manifest key, or "" (the tar.gz format's keys are
// the caller's business).
func (r *Repo) Newest(ctx context.Context, project string) (string, error) {
	keys, err := r.ListManifests(ctx, project)
	if err != nil || len(keys) == 0 {
		return "", err
	}
	newest := ""
	for _, k := range keys {
		if _, _, ok := ParseManifestKey(k); ok && k > newest {
			newest = k
		}
	}
	return newest, nil
}

// Delete removes manifests (retention). Their packs go when a collection finds them
// unreferenced.
func (r *Repo) Delete(ctx context.Context, keys ...string) error {
	for _, k := range keys {
		if !IsManifestKey(k) {
			return fmt.Errorf("%q is not a manifest key", k)
		}
	}
	err := r.do(ctx, "delete", func(ctx context.Context) error { return r.st.Delete(ctx, keys...) })
	if err == nil {
		r.mu.Lock()
		for _, k := range keys {
			delete(r.manifests, k)
		}
		r.mu.Unlock()
	}
	return err
}

// projectOf returns the project of a manifest key.
func projectOf(key string) string {
	rest := strings.TrimPrefix(key, PrefixProjects)
	p, _, _ := strings.Cut(rest, "/")
	return p
}
