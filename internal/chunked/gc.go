package chunked

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/lease"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// CollectStats say what a collection did.
type CollectStats struct {
	Manifests int // manifests read (every project's)
	Packs     int // packs in the store
	Marked    int // packs found unreferenced and doomed by this pass
	Deleted   int // doomed packs deleted (a grace period after their mark)
	Kept      int // doomed packs a manifest written since their mark references again
	Freed     int64
	Index     int // index objects compacted into one
	Duration  time.Duration
}

// ErrCollecting: another host holds the collector's lease.
var ErrCollecting = errors.New("another host is collecting unreferenced chunks")

// Collect removes packs no manifest references (see the package doc): it sweeps the
// doomed lists older than the grace period, then marks what is unreferenced now. It holds
// the collector's lease while it runs; ErrCollecting when another host holds it.
func (r *Repo) Collect(ctx context.Context) (CollectStats, error) {
	start := time.Now()
	var st CollectStats
	l, err := lease.Acquire(ctx, lease.Config{Store: r.st, Prefix: PrefixGCLock, TTL: time.Minute, Renew: 20 * time.Second, Logger: r.log}, "collector")
	if err != nil {
		if errors.Is(err, lease.ErrHeld) {
			return st, fmt.Errorf("%w: %v", ErrCollecting, err)
		}
		return st, fmt.Errorf("take the collector's lease: %w", err)
	}
	defer l.Release(context.WithoutCancel(ctx))
	if err := r.sweep(ctx, &st, l); err != nil {
		return st, err
	}
	if err := r.mark(ctx, &st, l); err != nil {
		return st, err
	}
	st.Duration = time.Since(start)
	r.log.Info("snapshot collection", "manifests", st.Manifests, "packs", st.Packs, "marked", st.Marked,
		"deleted", st.Deleted, "kept", st.Kept, "freed", st.Freed, "index_compacted", st.Index, "ms", st.Duration.Milliseconds())
	return st, nil
}

// referenced lists every manifest now and returns the packs they reference.
func (r *Repo) referenced(ctx context.Context, st *CollectStats) (map[PackID]bool, error) {
	keys, err := r.ListManifests(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("list the manifests: %w", err)
	}
	refs := map[PackID]bool{}
	st.Manifests = 0
	for _, k := range keys {
		m, err := r.Manifest(ctx, k)
		if errors.Is(err, store.ErrNotFound) {
			continue // deleted meanwhile: what it alone referenced goes next time
		}
		if _, _, _, _, aside := storekeys.ParseQuarantineKey(k); aside && errors.Is(err, ErrCorrupt) {
			// Set aside as damaged, and unreadable: what it needed cannot be known, so it
			// keeps nothing (its own bytes stay for inspection).
			r.log.Warn("snapshot collection: a quarantined manifest does not read; it keeps no pack", "key", k, "err", err)
			continue
		}
		if err != nil {
			// An unreadable manifest may reference anything: collect nothing.
			return nil, fmt.Errorf("read manifest %s (nothing is collected while one cannot be read; a wake that reaches it, or a verification of it, sets it aside): %w", k, err)
		}
		st.Manifests++
		for _, p := range m.Packs {
			refs[p] = true
		}
	}
	return refs, nil
}

func (r *Repo) sweep(ctx context.Context, st *CollectStats, l *lease.Lease) error {
	lists, err := store.ListAll(ctx, r.st, PrefixDoomed)
	if err != nil {
		return fmt.Errorf("list the doomed packs: %w", err)
	}
	now := r.cfg.Now()
	var due []store.ObjectInfo
	for _, o := range lists {
		if t, ok := stampTime(PrefixDoomed, o.Key); ok && !t.After(now.Add(-r.cfg.Grace)) {
			due = append(due, o)
		}
	}
	if len(due) == 0 {
		return r.compact(ctx, st, nil)
	}
	refs, err := r.referenced(ctx, st)
	if err != nil {
		return err
	}
	deleted := map[PackID]bool{}
	for _, o := range due {
		if err := l.Err(); err != nil {
			return err
		}
		b, _, err := r.getAll(ctx, o.Key, 64<<20)
		var ids []PackID
		if err == nil {
			ids, err = decodeDoomed(o.Key, b)
		}
		if errors.Is(err, ErrCorrupt) || errors.Is(err, store.ErrNotFound) {
			// Which packs it doomed cannot be known: none is deleted, and the list goes
			// below (unreferenced packs are marked again).
			r.log.Warn("snapshot collection: a doomed list does not read; it is dropped", "key", o.Key, "err", err)
			continue
		}
		if err != nil {
			return err
		}
		var keys []string
		for _, id := range ids {
			if refs[id] {
				st.Kept++
				continue
			}
			if !deleted[id] {
				deleted[id] = true
				keys = append(keys, PackKey(id))
			}
		}
		for i := 0; i < len(keys); i += store.MaxListKeys {
			batch := keys[i:min(i+store.MaxListKeys, len(keys))]
			for _, k := range batch {
				if oi, err := r.st.Head(ctx, k); err == nil {
					st.Freed += oi.Size
				}
			}
			if err := r.do(ctx, "delete packs", func(ctx context.Context) error { return r.st.Delete(ctx, batch...) }); err != nil {
				return fmt.Errorf("delete unreferenced packs: %w", err)
			}
			st.Deleted += len(batch)
		}
	}
	// The index forgets the deleted packs before their doomed lists go: a save that no
	// longer sees a list must no longer see the packs in the index.
	if err := r.compact(ctx, st, deleted); err != nil {
		return err
	}
	// A damaged pack deleted: its record goes too.
	var records []string
	for id := range deleted {
		records = append(records, DamagedKey(id))
	}
	for i := 0; i < len(records); i += store.MaxListKeys {
		batch := records[i:min(i+store.MaxListKeys, len(records))]
		if err := r.do(ctx, "delete damage records", func(ctx context.Context) error { return r.st.Delete(ctx, batch...) }); err != nil {
			return err
		}
	}
	for _, o := range due {
		if err := r.do(ctx, "delete doomed list", func(ctx context.Context) error { return r.st.Delete(ctx, o.Key) }); err != nil {
			return err
		}
	}
	return nil
}

// compact rewrites the index without the deleted packs (and into one object when it has
// grown to many): the new object is written before the old ones are deleted, so a
// listing always sees every live pack.
func (r *Repo) compact(ctx context.Context, st *CollectStats, deleted map[PackID]bool) error {
	if _, err := r.refresh(ctx); err != nil {
		return err
	}
	r.mu.Lock()
	keys := make([]string, 0, len(r.index))
	touches := false
	merged := map[PackID][]packBlob{}
	for k, obj := range r.index {
		keys = append(keys, k)
		for id, blobs := range obj.packs {
			if deleted[id] {
				touches = true
				continue
			}
			merged[id] = blobs
		}
	}
	r.mu.Unlock()
	if !touches && len(keys) < 32 {
		return nil
	}
	if len(merged) > 0 {
		if err := r.writeIndex(ctx, merged); err != nil {
			return err
		}
	}
	for i := 0; i < len(keys); i += store.MaxListKeys {
		batch := keys[i:min(i+store.MaxListKeys, len(keys))]
		if err := r.do(ctx, "delete index", func(ctx context.Context) error { return r.st.Delete(ctx, batch...) }); err != nil {
			return fmt.Errorf("compact the index: %w", err)
		}
	}
	st.Index = len(keys)
	_, err := r.refresh(ctx)
	return err
}

func (r *Repo) mark(ctx context.Context, st *CollectStats, l *lease.Lease) error {
	now := r.cfg.Now()
	// Packs first, manifests second: a pack old enough to be a candidate was written more
	// than a grace period ago, so the manifest of any save that meant to use it was
	// written before this listing of manifests began.
	var packs []store.ObjectInfo
	err := r.do(ctx, "list packs", func(ctx context.Context) error {
		var err error
		packs, err = store.ListAll(ctx, r.st, PrefixPacks)
		return err
	})
	if err != nil {
		return fmt.Errorf("list the packs: %w", err)
	}
	st.Packs = len(packs)
	refs, err := r.referenced(ctx, st)
	if err != nil {
		return err
	}
	already := map[PackID]bool{}
	lists, err := store.ListAll(ctx, r.st, PrefixDoomed)
	if err != nil {
		return err
	}
	for _, o := range lists {
		b, _, err := r.getAll(ctx, o.Key, 64<<20)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		var ids []PackID
		if err == nil {
			ids, err = decodeDoomed(o.Key, b)
		}
		if errors.Is(err, ErrCorrupt) {
			// It dooms packs no one can name, and blinds every save meanwhile (they reuse
			// nothing): dropping it dooms nothing, and what is unreferenced is marked again.
			r.log.Warn("snapshot collection: a doomed list does not read; it is dropped", "key", o.Key, "err", err)
			if err := r.do(ctx, "delete doomed list", func(ctx context.Context) error { return r.st.Delete(ctx, o.Key) }); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		for _, id := range ids {
			already[id] = true
		}
	}
	var doomed []PackID
	for _, o := range packs {
		id, ok := ParsePackKey(o.Key)
		if !ok || refs[id] || already[id] || o.LastModified.After(now.Add(-r.cfg.Grace)) {
			continue
		}
		doomed = append(doomed, id)
	}
	if len(doomed) == 0 {
		return nil
	}
	if err := l.Err(); err != nil {
		return err
	}
	key := stampKey(PrefixDoomed, now)
	if err := r.put(ctx, key, encodeDoomed(doomed), "application/octet-stream", nil, nil); err != nil {
		return fmt.Errorf("write the doomed list: %w", unwrapPermanent(err))
	}
	st.Marked = len(doomed)
	return nil
}

var _ = strings.HasPrefix
