package chunked

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// Damage: what is done when a snapshot does not read because of what the store holds.
//
// A pack that does not verify (missing, cut short, its bytes or its blobs not matching
// their digests, or not holding what the index says it holds) gets a damage record,
// chunks/damaged/{id}: no save reuses a chunk from it any more (a file whose chunks were
// there is read again and stored anew), and no save reads a base's listing from it.
//
// A snapshot that needs a part of the store that does not verify (a damaged blob, a
// missing pack, a manifest that does not read, a listing that does not match its data)
// is set aside: its manifest is moved, bytes and metadata as they are, to the project's
// quarantine (storekeys.QuarantineKey: when, why and the name it had), where wakes, saves
// and retention no longer see it. A collection still keeps every pack a quarantined
// manifest that reads references; one that does not read cannot say what it needs, and
// keeps nothing. Release puts a snapshot back once it verifies again; deleting it lets a
// collection take the packs only it needed.
//
// Whether a snapshot is damaged is decided by an Examiner, from a fresh read of each
// suspect pack whole: a passing fault of the store sets nothing aside, and a pack only
// part of which is damaged does not condemn the snapshots that need only its sound part.

// Damage codes: why a snapshot was set aside (the middle of its quarantine key).
const (
	// DamagedPack: it needs a blob of a pack that does not verify.
	DamagedPack = "damaged-pack"
	// MissingPack: it needs a pack the store does not hold.
	MissingPack = "missing-pack"
	// CorruptManifest: its manifest does not read.
	CorruptManifest = "corrupt-manifest"
	// CorruptSnapshot: what it needs reads, but it does not: its listing and its data
	// disagree.
	CorruptSnapshot = "corrupt-snapshot"
)

// Metadata of a quarantined manifest (besides the original object's own).
const (
	metaFrom   = "quarantined-from"
	metaAt     = "quarantined-at"
	metaWhy    = "quarantine-why"
	metaPacks  = "damaged-packs"
	maxWhy     = 800
	maxPacksMD = 8
)

// packCheck is what a fresh read of a whole pack found.
type packCheck struct {
	// damage is nil when every blob of the pack verifies and the index lists none it does
	// not hold; else why not (ErrCorrupt or ErrMissing).
	damage error
	// sound holds the blobs that verify, as their refs; nil when the pack does not read.
	sound map[Ref]bool
}

// checkPack reads the pack id whole, bypassing every cache, and checks each blob of its
// trailer against its digest, and the index's record of it against the trailer. err is a
// failure to read (the store down): nothing is known of the pack.
func (r *Repo) checkPack(ctx context.Context, id PackID) (*packCheck, error) {
	b, _, err := r.getAll(ctx, PackKey(id), maxPackSize)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return &packCheck{damage: fmt.Errorf("pack %s: %w", id, ErrMissing)}, nil
	case errors.Is(err, ErrCorrupt):
		return &packCheck{damage: fmt.Errorf("pack %s: %w", id, err)}, nil
	case err != nil:
		return nil, fmt.Errorf("check pack %s: %w", id, err)
	}
	blobs, err := decodeTrailer(id, b)
	if err != nil {
		return &packCheck{damage: err}, nil
	}
	c := &packCheck{sound: make(map[Ref]bool, len(blobs))}
	bad := 0
	var first error
	for _, x := range blobs {
		stored, err := blobIn(x.Ref, b)
		if err == nil {
			_, err = openBlob(x.Ref, stored)
		}
		if err != nil {
			bad++
			if first == nil {
				first = err
			}
			continue
		}
		c.sound[x.Ref] = true
	}
	unheld := 0
	r.mu.Lock()
	for _, obj := range r.index {
		for _, x := range obj.packs[id] {
			if !c.sound[x.Ref] {
				unheld++
			}
		}
	}
	r.mu.Unlock()
	switch {
	case bad > 0:
		c.damage = fmt.Errorf("pack %s: %d of its %d blobs do not verify: %w", id, bad, len(blobs), first)
	case unheld > 0:
		c.damage = fmt.Errorf("pack %s: the index lists %d blobs in it that it does not hold: %w", id, unheld, ErrCorrupt)
	}
	return c, nil
}

// damageRecord is the body of a damage record.
type damageRecord struct {
	Pack string    `json:"pack"`
	At   time.Time `json:"at"`
	Why  string    `json:"why"`
	// Found is the snapshot whose examination found it.
	Found string `json:"found,omitempty"`
}

// markDamaged writes the damage record of the pack id (kept if there is one already).
func (r *Repo) markDamaged(ctx context.Context, id PackID, why, found string) error {
	body, _ := json.Marshal(damageRecord{Pack: id.String(), At: r.cfg.Now().UTC(), Why: clip(why, 2000), Found: found})
	err := r.do(ctx, "write "+DamagedKey(id), func(ctx context.Context) error {
		_, err := r.st.Put(ctx, DamagedKey(id), bytes.NewReader(body), store.PutOptions{Size: int64(len(body)),
			ContentType: "application/json", IfNotExists: true})
		if errors.Is(err, store.ErrExists) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("record pack %s as damaged: %w", id, err)
	}
	return nil
}

// An Examiner decides whether snapshots are damaged (see Damage above). It reads each pack
// it suspects once, whole, and marks or clears the pack's damage record by what it finds.
// One examiner serves one operation (a wake, a save, a verification): what it found of a
// pack is not read again.
type Examiner struct {
	r      *Repo
	v      *view
	checks map[PackID]*packCheck
}

// NewExaminer returns an examiner.
func (r *Repo) NewExaminer() *Examiner { return &Examiner{r: r, checks: map[PackID]*packCheck{}} }

// Diagnosis is what an examination found of a snapshot.
type Diagnosis struct {
	// Damaged: the snapshot cannot be restored as it is; Reason (a damage code) and Why
	// (one line) say why.
	Damaged bool
	Reason  string
	Why     string
	// Packs are the damaged packs the snapshot needs.
	Packs []PackID
	// Gone: the snapshot is no longer in the store.
	Gone bool
}

func (x *Examiner) init(ctx context.Context) error {
	if x.v != nil {
		return nil
	}
	v, err := x.r.refresh(ctx)
	if err != nil {
		return err
	}
	x.v = v
	return nil
}

// check reads the pack whole once, and writes its damage record, or drops a record
// that a fresh read shows stale.
func (x *Examiner) check(ctx context.Context, p PackID, found string) (*packCheck, error) {
	if c := x.checks[p]; c != nil {
		return c, nil
	}
	c, err := x.r.checkPack(ctx, p)
	if err != nil {
		return nil, err
	}
	x.checks[p] = c
	switch {
	case c.damage != nil && !x.v.damaged[p]:
		x.r.log.Warn("snapshot: a pack was found damaged; no save reuses it", "pack", p.String(), "found_in", found, "err", c.damage)
		if err := x.r.markDamaged(ctx, p, c.damage.Error(), found); err != nil {
			return nil, err
		}
		x.v.damaged[p] = true
	case c.damage == nil && x.v.damaged[p]:
		x.r.log.Info("snapshot: a pack recorded as damaged verifies whole now; its record is dropped", "pack", p.String())
		if err := x.r.do(ctx, "delete "+DamagedKey(p), func(ctx context.Context) error { return x.r.st.Delete(ctx, DamagedKey(p)) }); err != nil {
			return nil, err
		}
		delete(x.v.damaged, p)
	}
	return c, nil
}

// Suspect reports whether m needs a pack that a damage record names or this examiner found
// damaged (after Examine found m sound, it may still: m needs only the sound part).
func (x *Examiner) Suspect(ctx context.Context, m *Manifest) (bool, error) {
	if err := x.init(ctx); err != nil {
		return false, err
	}
	for _, p := range m.Packs {
		if x.v.damaged[p] {
			return true, nil
		}
	}
	return false, nil
}

// Examine decides whether the snapshot key is damaged. cause is the error a read of it
// gave (nil: it is examined because it references a pack found damaged); a cause that
// names a pack (PackError) has that pack checked, as are the snapshot's packs that damage
// records name. A snapshot is damaged when it needs a blob that does not verify on the
// fresh read, or when what it needs verifies but the snapshot itself does not. err is a
// failure of the store: nothing was decided.
func (x *Examiner) Examine(ctx context.Context, key string, cause error) (Diagnosis, error) {
	if err := x.init(ctx); err != nil {
		return Diagnosis{}, err
	}
	man, err := x.r.Manifest(ctx, key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return Diagnosis{Gone: true}, nil
	case errors.Is(err, ErrCorrupt):
		return Diagnosis{Damaged: true, Reason: CorruptManifest, Why: "its manifest does not read: " + err.Error()}, nil
	case err != nil:
		return Diagnosis{}, err
	}
	var me *manifestError
	if errors.As(cause, &me) {
		cause = nil // it reads now: that failure passed
	}
	var suspects []PackID
	var pe *PackError
	if errors.As(cause, &pe) {
		suspects = append(suspects, pe.Pack)
	}
	for _, p := range man.Packs {
		if x.v.damaged[p] || x.checks[p] != nil && x.checks[p].damage != nil {
			suspects = append(suspects, p)
		}
	}
	if cause == nil && len(suspects) == 0 {
		return Diagnosis{}, nil
	}
	for _, p := range suspects {
		if _, err := x.check(ctx, p, key); err != nil {
			return Diagnosis{}, err
		}
	}
	// The listing first: never read from a part that does not verify.
	for _, s := range man.Segments {
		if d, bad := x.needs(s.Ref, "its listing"); bad {
			return d, nil
		}
	}
	entries, err := x.r.Entries(ctx, man)
	if errors.As(err, &pe) && x.checks[pe.Pack] == nil {
		// A pack nothing pointed at before: check it, and look again.
		if _, cerr := x.check(ctx, pe.Pack, key); cerr != nil {
			return Diagnosis{}, cerr
		}
		for _, s := range man.Segments {
			if d, bad := x.needs(s.Ref, "its listing"); bad {
				return d, nil
			}
		}
		entries, err = x.r.Entries(ctx, man)
	}
	switch {
	case errors.As(err, &pe):
		// What it needs verified on a fresh read; this read failed: a passing fault.
		return Diagnosis{}, nil
	case errors.Is(err, ErrCorrupt) || errors.Is(err, ErrMissing):
		return Diagnosis{Damaged: true, Reason: CorruptSnapshot, Why: "its listing does not read: " + err.Error()}, nil
	case err != nil:
		return Diagnosis{}, err
	}
	for i := range entries {
		for _, c := range entries[i].Chunks {
			if d, bad := x.needs(c, fmt.Sprintf("file %q", entries[i].Path)); bad {
				return d, nil
			}
		}
	}
	if cause != nil && !errors.As(cause, &pe) && (errors.Is(cause, ErrCorrupt) || errors.Is(cause, ErrMissing)) {
		// Every blob it needs that was read verifies, yet the snapshot does not (a file,
		// the tree, its entries): the listing and the data disagree, and will again.
		return Diagnosis{Damaged: true, Reason: CorruptSnapshot, Why: cause.Error()}, nil
	}
	return Diagnosis{}, nil
}

// needs reports whether ref lies in a pack checked here and is not among its sound blobs.
func (x *Examiner) needs(ref Ref, what string) (Diagnosis, bool) {
	c := x.checks[ref.Pack]
	if c == nil || c.sound[ref] {
		return Diagnosis{}, false
	}
	d := Diagnosis{Damaged: true, Reason: DamagedPack}
	switch {
	case c.damage == nil:
		// The pack verifies whole, but does not hold what the snapshot says it holds.
		d.Reason = CorruptSnapshot
		d.Why = fmt.Sprintf("%s points into pack %s at a blob it does not hold", what, ref.Pack)
		return d, true
	case errors.Is(c.damage, ErrMissing):
		d.Reason = MissingPack
	}
	d.Packs = []PackID{ref.Pack}
	d.Why = fmt.Sprintf("%s needs pack %s, which is damaged: %v", what, ref.Pack, c.damage)
	return d, true
}

// Damaged lists the packs this examiner found damaged.
func (x *Examiner) Damaged() []PackID {
	var out []PackID
	for p, c := range x.checks {
		if c.damage != nil {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b PackID) int { return compareBytes(a[:], b[:]) })
	return out
}

// References reports whether m references one of packs.
func References(m *Manifest, packs []PackID) bool {
	for _, p := range m.Packs {
		if slices.Contains(packs, p) {
			return true
		}
	}
	return false
}

// Quarantined is a snapshot set aside.
type Quarantined struct {
	// Key is where it is now; Snapshot the key it had.
	Key, Snapshot string
	// Time is when it was set aside (to the second); Reason the damage code and Why the
	// examination's one line (store data: show it escaped).
	Time        time.Time
	Reason, Why string
	// Packs are the damaged packs it needs, when that is known (up to eight).
	Packs []string
	Size  int64
}

// SetAside moves the snapshot key (a manifest under its project's snapshots) to the
// project's quarantine, bytes and metadata as they are (a manifest that does not read is
// moved all the same), with when, why and the damaged packs added to its metadata, and
// returns where it went. A snapshot set aside already (by another process) is not set
// aside twice: where it is is returned. store.ErrNotFound: it is in neither place.
func (r *Repo) SetAside(ctx context.Context, key, reason, why string, packs []PackID) (string, error) {
	project, _, ok := ParseManifestKey(key)
	if !ok {
		return "", fmt.Errorf("%q is not a snapshot key of the chunked format", key)
	}
	there, err := r.quarantineKeys(ctx, project)
	if err != nil {
		return "", err
	}
	qkey := ""
	for _, q := range there {
		if q.Snapshot == key {
			qkey = q.Key
		}
	}
	if qkey == "" {
		b, oi, err := r.getRaw(ctx, key)
		if err != nil {
			return "", err
		}
		at := r.cfg.Now().UTC()
		qkey = storekeys.QuarantineKey(project, at, reason, key)
		md := map[string]string{}
		for k, v := range oi.Metadata {
			md[k] = v
		}
		if store.ValidMetadata(md) != nil {
			md = map[string]string{}
		}
		md[metaFrom], md[metaAt], md[metaWhy] = key, at.Format(time.RFC3339), clip(why, maxWhy)
		var ids []string
		for _, p := range packs[:min(len(packs), maxPacksMD)] {
			ids = append(ids, p.String())
		}
		if len(ids) > 0 {
			md[metaPacks] = strings.Join(ids, ",")
		}
		err = r.do(ctx, "write "+qkey, func(ctx context.Context) error {
			_, err := r.st.Put(ctx, qkey, bytes.NewReader(b), store.PutOptions{Size: int64(len(b)), ContentType: oi.ContentType,
				Metadata: md, IfNotExists: true})
			if errors.Is(err, store.ErrExists) { // set aside in the same second by another process
				return nil
			}
			return err
		})
		if err != nil {
			return "", fmt.Errorf("set %s aside: %w", key, err)
		}
	}
	if err := r.do(ctx, "delete "+key, func(ctx context.Context) error { return r.st.Delete(ctx, key) }); err != nil {
		return "", fmt.Errorf("set %s aside (its copy is %s): %w", key, qkey, err)
	}
	r.forget(project, key)
	return qkey, nil
}

// getRaw reads a manifest's bytes as the store holds them, even when they do not match
// their checksum.
func (r *Repo) getRaw(ctx context.Context, key string) ([]byte, store.ObjectInfo, error) {
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
		b, err = io.ReadAll(io.LimitReader(rc, 64<<20))
		if err != nil && !errors.Is(err, store.ErrChecksum) {
			return err
		}
		oi = info
		return nil
	})
	return b, oi, unwrapPermanent(err)
}

// forget drops what the Repo remembers of a manifest that left its key.
func (r *Repo) forget(project, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.manifests, key)
	if sc := r.scans[project]; sc != nil && sc.key == key {
		delete(r.scans, project)
	}
}

// quarantineKeys lists the project's quarantine as its keys say (no metadata).
func (r *Repo) quarantineKeys(ctx context.Context, project string) ([]Quarantined, error) {
	var objs []store.ObjectInfo
	err := r.do(ctx, "list", func(ctx context.Context) error {
		var err error
		objs, err = store.ListAll(ctx, r.st, storekeys.Quarantine(project))
		return err
	})
	if err != nil {
		return nil, err
	}
	var out []Quarantined
	for _, o := range objs {
		p, t, reason, from, ok := storekeys.ParseQuarantineKey(o.Key)
		if !ok || p != project {
			continue
		}
		out = append(out, Quarantined{Key: o.Key, Snapshot: from, Time: t, Reason: reason, Size: o.Size})
	}
	return out, nil
}

// Quarantined lists the project's snapshots set aside, oldest first, with why; keys
// under the quarantine that are not of its form are left out.
func (r *Repo) Quarantined(ctx context.Context, project string) ([]Quarantined, error) {
	out, err := r.quarantineKeys(ctx, project)
	if err != nil {
		return nil, err
	}
	for i := range out {
		q := &out[i]
		if oi, err := r.st.Head(ctx, q.Key); err == nil {
			q.Why = oi.Metadata[metaWhy]
			if ps := oi.Metadata[metaPacks]; ps != "" {
				q.Packs = strings.Split(ps, ",")
			}
		}
	}
	return out, nil
}

// ErrStillDamaged: a quarantined snapshot to release does not verify yet.
var ErrStillDamaged = errors.New("the snapshot still does not verify")

// Release puts the quarantined snapshot qkey back under the key it had, once it verifies
// whole (every chunk, file and the tree), and drops the damage records of its packs that
// verify whole now. It returns that key.
func (r *Repo) Release(ctx context.Context, qkey string) (string, error) {
	project, _, _, key, ok := storekeys.ParseQuarantineKey(qkey)
	if !ok || !strings.HasSuffix(key, Suffix) {
		return "", fmt.Errorf("%q is not a quarantined snapshot", qkey)
	}
	m, err := r.Manifest(ctx, qkey)
	if err != nil {
		if errors.Is(err, ErrCorrupt) {
			return "", fmt.Errorf("%w: %v", ErrStillDamaged, err)
		}
		return "", err
	}
	if _, err := r.Verify(ctx, m); err != nil {
		if errors.Is(err, ErrCorrupt) || errors.Is(err, ErrMissing) {
			return "", fmt.Errorf("%w: %v", ErrStillDamaged, err)
		}
		return "", err
	}
	x := r.NewExaminer()
	if err := x.init(ctx); err != nil {
		return "", err
	}
	for _, p := range m.Packs {
		if x.v.damaged[p] {
			if _, err := x.check(ctx, p, qkey); err != nil {
				return "", err
			}
		}
	}
	b, oi, err := r.getRaw(ctx, qkey)
	if err != nil {
		return "", err
	}
	md := maps.Clone(oi.Metadata)
	for _, k := range []string{metaFrom, metaAt, metaWhy, metaPacks} {
		delete(md, k)
	}
	err = r.do(ctx, "write "+key, func(ctx context.Context) error {
		_, err := r.st.Put(ctx, key, bytes.NewReader(b), store.PutOptions{Size: int64(len(b)), ContentType: oi.ContentType,
			Metadata: md, IfNotExists: true})
		if errors.Is(err, store.ErrExists) {
			if h, herr := r.st.Head(ctx, key); herr == nil && h.Metadata["sha256"] == md["sha256"] {
				return nil // put back already
			}
			return &permanent{fmt.Errorf("%s holds another snapshot", key)}
		}
		return err
	})
	if err != nil {
		return "", fmt.Errorf("put %s back: %w", qkey, unwrapPermanent(err))
	}
	if err := r.do(ctx, "delete "+qkey, func(ctx context.Context) error { return r.st.Delete(ctx, qkey) }); err != nil {
		return "", fmt.Errorf("put %s back (it is at %s again; delete the quarantined copy by hand): %w", qkey, key, err)
	}
	r.forget(project, qkey)
	return key, nil
}

// clip keeps s printable ASCII (store metadata) and at most n bytes.
func clip(s string, n int) string {
	var b strings.Builder
	for _, c := range s {
		if b.Len() >= n {
			break
		}
		if c < 0x20 || c > 0x7e {
			c = '?'
		}
		b.WriteRune(c)
	}
	return b.String()
}
