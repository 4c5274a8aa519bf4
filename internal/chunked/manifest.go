package chunked

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash"
	"hash/fnv"
	"io/fs"
	"strings"
	"time"

	"github.com/toolhost/toolhost/internal/tree"
)

// Entry is one entry of a snapshot: a tree entry, and for a file its digest and chunks.
type Entry struct {
	tree.Entry
	// Digest is a file's SHA-256 (of its whole content).
	Digest Digest
	// Chunks are a file's pieces, in order; none for an empty file.
	Chunks []Ref
}

// Manifest is what a snapshot key names: the snapshot's entries, by reference to its
// segments (runs of entries, stored as blobs), the packs those and the files' chunks live
// in, and the digest of the whole tree. It is stored as zstd-compressed JSON; its
// segments are binary.
type Manifest struct {
	Format  int    `json:"format"`
	Project string `json:"project"`
	// Key is the manifest's own key (not stored: the key names it).
	Key string `json:"-"`
	// Time is when the save took the snapshot (the key says the same, to the ms).
	Time time.Time `json:"time"`
	// ScanTime is when the walk began (Unix ns): a file modified at or after it may have
	// changed again within the same tick, so a later save reads it whatever its times say.
	ScanTime int64 `json:"scan_time_ns"`
	// Label is the commit's label ("rotation", a phase name, "before rewind to ...").
	Label string `json:"label,omitempty"`
	// Parent is the snapshot this one was saved over (whose unchanged files it reused).
	Parent string `json:"parent,omitempty"`
	// Origin is, for a fork or a rewind, the snapshot it copies; for a later save of a
	// fork, the fork's origin (the base of a merge) carried on.
	Origin string `json:"origin,omitempty"`
	// Tree is the digest of the whole tree's content: paths, types, modes, sizes, link
	// targets and file digests, in order; never times. Two snapshots of the same content
	// have the same Tree, whenever and however they were taken.
	Tree Digest `json:"-"`
	// RootMode and RootMTime are the root directory's, for an export that equals a tar.gz
	// save; the root's own mode and times are never restored.
	RootMode  uint32 `json:"root_mode"`
	RootMTime int64  `json:"root_mtime_ns"`

	Files    int   `json:"files"`
	Dirs     int   `json:"dirs"`
	Symlinks int   `json:"symlinks"`
	Bytes    int64 `json:"bytes"`
	// Skipped counts what the save left out because a snapshot cannot hold it.
	Skipped int         `json:"skipped,omitempty"`
	Skips   []tree.Skip `json:"skips,omitempty"`

	// Packs lists every pack the snapshot needs (its segments' and its chunks'):
	// collection reads only this.
	Packs    []PackID `json:"-"`
	Segments []SegRef `json:"-"`
}

// SegRef is a segment of a manifest: where its blob is and how many entries it holds.
type SegRef struct {
	Ref
	Entries int
}

const formatVersion = 1

type manifestJSON struct {
	*Manifest
	TreeHex string    `json:"tree"`
	Packs   []string  `json:"packs"`
	Segs    []segJSON `json:"segments"`
}

type segJSON struct {
	Digest  string `json:"d"`
	Pack    int    `json:"p"` // index into packs
	Offset  uint32 `json:"o"`
	Stored  uint32 `json:"s"`
	Raw     uint32 `json:"r"`
	Comp    byte   `json:"c"`
	Entries int    `json:"n"`
}

func (m *Manifest) marshal() ([]byte, error) {
	j := manifestJSON{Manifest: m, TreeHex: m.Tree.String()}
	idx := map[PackID]int{}
	for i, p := range m.Packs {
		j.Packs = append(j.Packs, p.String())
		idx[p] = i
	}
	for _, s := range m.Segments {
		i, ok := idx[s.Pack]
		if !ok {
			return nil, fmt.Errorf("manifest: segment %s in pack %s, which is not in its pack table", s.Digest, s.Pack)
		}
		j.Segs = append(j.Segs, segJSON{Digest: s.Digest.String(), Pack: i, Offset: s.Offset, Stored: s.Stored, Raw: s.Raw, Comp: s.Comp, Entries: s.Entries})
	}
	return json.Marshal(j)
}

func unmarshalManifest(key string, b []byte) (*Manifest, error) {
	m := &Manifest{}
	j := manifestJSON{Manifest: m}
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, fmt.Errorf("manifest %s: %v: %w", key, err, ErrCorrupt)
	}
	if m.Format != formatVersion {
		return nil, fmt.Errorf("manifest %s: format %d, this version reads %d: %w", key, m.Format, formatVersion, ErrCorrupt)
	}
	var err error
	if m.Tree, err = ParseDigest(j.TreeHex); err != nil {
		return nil, fmt.Errorf("manifest %s: %v: %w", key, err, ErrCorrupt)
	}
	for _, p := range j.Packs {
		id, err := ParsePackID(p)
		if err != nil {
			return nil, fmt.Errorf("manifest %s: %v: %w", key, err, ErrCorrupt)
		}
		m.Packs = append(m.Packs, id)
	}
	for _, s := range j.Segs {
		d, err := ParseDigest(s.Digest)
		if err != nil || s.Pack < 0 || s.Pack >= len(m.Packs) || s.Entries < 0 {
			return nil, fmt.Errorf("manifest %s: bad segment: %w", key, ErrCorrupt)
		}
		m.Segments = append(m.Segments, SegRef{Ref: Ref{Digest: d, Pack: m.Packs[s.Pack], Offset: s.Offset, Stored: s.Stored, Raw: s.Raw, Comp: s.Comp}, Entries: s.Entries})
	}
	m.Key = key
	return m, nil
}

// Less orders paths as a walk meets them: component by component, so a directory's
// entries follow it directly ("a", "a/b", "a.c"), the order of a tar.gz save.
func Less(a, b string) bool { return compare(a, b) < 0 }

func compare(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		ca, cb := a[i], b[i]
		if ca == cb {
			continue
		}
		if ca == '/' {
			return -1
		}
		if cb == '/' {
			return 1
		}
		if ca < cb {
			return -1
		}
		return 1
	}
	return len(a) - len(b)
}

// Segmenting: a segment ends after an entry whose path hashes to 0 modulo segmentEvery
// (so boundaries depend on the paths alone and an edit changes one segment), or at
// segmentMax entries.
const (
	segmentEvery = 64
	segmentMax   = 1024
	segMagic     = "THSG"
)

func segmentEnds(p string) bool {
	h := fnv.New64a()
	h.Write([]byte(p))
	return h.Sum64()%segmentEvery == segmentEvery-1
}

// splitSegments cuts entries (in order) into runs.
func splitSegments(entries []Entry) [][]Entry {
	var out [][]Entry
	start := 0
	for i := range entries {
		if segmentEnds(entries[i].Path) || i+1-start >= segmentMax {
			out = append(out, entries[start:i+1])
			start = i + 1
		}
	}
	if start < len(entries) {
		out = append(out, entries[start:])
	}
	return out
}

// encodeSegment writes a run of entries: a table of the packs their chunks are in, then
// each entry with its path front-coded against the one before.
func encodeSegment(entries []Entry) []byte {
	idx := map[PackID]int{}
	var packs []PackID
	for _, e := range entries {
		for _, c := range e.Chunks {
			if _, ok := idx[c.Pack]; !ok {
				idx[c.Pack] = len(packs)
				packs = append(packs, c.Pack)
			}
		}
	}
	b := make([]byte, 0, 64+len(entries)*64)
	b = append(b, segMagic...)
	b = binary.AppendUvarint(b, uint64(len(packs)))
	for _, p := range packs {
		b = append(b, p[:]...)
	}
	b = binary.AppendUvarint(b, uint64(len(entries)))
	prev := ""
	for _, e := range entries {
		n := 0
		for n < len(prev) && n < len(e.Path) && prev[n] == e.Path[n] {
			n++
		}
		b = binary.AppendUvarint(b, uint64(n))
		b = binary.AppendUvarint(b, uint64(len(e.Path)-n))
		b = append(b, e.Path[n:]...)
		prev = e.Path
		b = append(b, byte(e.Type))
		b = binary.AppendUvarint(b, uint64(e.Mode))
		b = binary.AppendVarint(b, e.MTime)
		switch e.Type {
		case tree.Symlink:
			b = binary.AppendUvarint(b, uint64(len(e.Target)))
			b = append(b, e.Target...)
		case tree.File:
			b = binary.AppendUvarint(b, uint64(e.Size))
			b = append(b, e.Digest[:]...)
			b = binary.AppendUvarint(b, uint64(len(e.Chunks)))
			single := len(e.Chunks) == 1 && e.Chunks[0].Digest == e.Digest
			if single {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
			for _, c := range e.Chunks {
				b = binary.AppendUvarint(b, uint64(idx[c.Pack]))
				b = binary.AppendUvarint(b, uint64(c.Offset))
				b = binary.AppendUvarint(b, uint64(c.Stored))
				b = binary.AppendUvarint(b, uint64(c.Raw))
				b = append(b, c.Comp)
				if !single {
					b = append(b, c.Digest[:]...)
				}
			}
		}
	}
	return b
}

type segReader struct {
	b   []byte
	err error
}

func (r *segReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("segment cut short: %w", ErrCorrupt)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *segReader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("segment cut short: %w", ErrCorrupt)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *segReader) bytes(n uint64) []byte {
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = fmt.Errorf("segment cut short: %w", ErrCorrupt)
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// decodeSegment reads a segment back, checking every entry as a restore would.
func decodeSegment(b []byte) ([]Entry, error) {
	if len(b) < len(segMagic) || string(b[:len(segMagic)]) != segMagic {
		return nil, fmt.Errorf("not a segment: %w", ErrCorrupt)
	}
	r := &segReader{b: b[len(segMagic):]}
	np := r.uvarint()
	if np > uint64(len(r.b))/16 {
		return nil, fmt.Errorf("segment pack table: %w", ErrCorrupt)
	}
	packs := make([]PackID, np)
	for i := range packs {
		copy(packs[i][:], r.bytes(16))
	}
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		return nil, fmt.Errorf("segment entry count: %w", ErrCorrupt)
	}
	entries := make([]Entry, 0, n)
	prev := ""
	for range n {
		shared, suffix := r.uvarint(), r.uvarint()
		if shared > uint64(len(prev)) {
			return nil, fmt.Errorf("segment path: %w", ErrCorrupt)
		}
		p := prev[:shared] + string(r.bytes(suffix))
		prev = p
		var e Entry
		e.Path = p
		t := r.bytes(1)
		if t == nil {
			break
		}
		e.Type = tree.Type(t[0])
		e.Mode = fs.FileMode(r.uvarint())
		e.MTime = r.varint()
		switch e.Type {
		case tree.Symlink:
			e.Target = string(r.bytes(r.uvarint()))
		case tree.File:
			e.Size = int64(r.uvarint())
			copy(e.Digest[:], r.bytes(32))
			nc := r.uvarint()
			flag := r.bytes(1)
			if r.err != nil || nc > uint64(len(r.b)) || e.Size < 0 {
				return nil, fmt.Errorf("segment chunks: %w", ErrCorrupt)
			}
			single := flag[0] == 1
			if single && nc != 1 {
				return nil, fmt.Errorf("segment chunks: %w", ErrCorrupt)
			}
			var total int64
			for range nc {
				pi := r.uvarint()
				if pi >= uint64(len(packs)) {
					return nil, fmt.Errorf("segment chunk pack: %w", ErrCorrupt)
				}
				c := Ref{Pack: packs[pi], Offset: uint32(r.uvarint()), Stored: uint32(r.uvarint()), Raw: uint32(r.uvarint())}
				if cb := r.bytes(1); cb != nil {
					c.Comp = cb[0]
				}
				if single {
					c.Digest = e.Digest
				} else {
					copy(c.Digest[:], r.bytes(32))
				}
				total += int64(c.Raw)
				e.Chunks = append(e.Chunks, c)
			}
			if r.err == nil && total != e.Size {
				return nil, fmt.Errorf("entry %q: chunks of %d bytes for a file of %d: %w", e.Path, total, e.Size, ErrCorrupt)
			}
		}
		if r.err != nil {
			return nil, r.err
		}
		if err := tree.Check(e.Entry, 0); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		entries = append(entries, e)
	}
	if r.err != nil {
		return nil, r.err
	}
	return entries, nil
}

// treeHash hashes the content of entries in order (see Manifest.Tree).
type treeHash struct{ h hash.Hash }

func newTreeHash() *treeHash { return &treeHash{h: sha256.New()} }

func (t *treeHash) add(e *Entry) {
	var b [64]byte
	buf := append(b[:0], byte(e.Type))
	t.h.Write(buf)
	t.h.Write([]byte(e.Path))
	buf = binary.BigEndian.AppendUint32(b[:0], 0)
	buf = binary.BigEndian.AppendUint32(buf, uint32(e.Mode))
	t.h.Write(buf[3:])
	switch e.Type {
	case tree.File:
		buf = binary.BigEndian.AppendUint64(b[:0], uint64(e.Size))
		t.h.Write(buf)
		t.h.Write(e.Digest[:])
	case tree.Symlink:
		t.h.Write([]byte(e.Target))
		t.h.Write([]byte{0})
	}
}

func (t *treeHash) sum() Digest {
	var d Digest
	t.h.Sum(d[:0])
	return d
}

// TreeDigest is the content digest of entries (in order).
func TreeDigest(entries []Entry) Digest {
	th := newTreeHash()
	for i := range entries {
		th.add(&entries[i])
	}
	return th.sum()
}

// ShortKey is the part of a snapshot key people read: its time and nonce.
func ShortKey(key string) string {
	i := strings.LastIndexByte(key, '/')
	return strings.TrimSuffix(key[i+1:], Suffix)
}
