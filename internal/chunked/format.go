package chunked

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/klauspost/compress/zstd"
	"github.com/restic/chunker"
)

// Digest is the SHA-256 of a blob's (or a file's) uncompressed bytes.
type Digest [32]byte

func (d Digest) String() string { return hex.EncodeToString(d[:]) }

// ParseDigest reads a hex digest.
func ParseDigest(s string) (Digest, error) {
	var d Digest
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(d) {
		return d, fmt.Errorf("digest %q: want %d hex digits", s, 2*len(d))
	}
	copy(d[:], b)
	return d, nil
}

// PackID names a pack: random, so it is known before the pack is complete (a save puts
// its segments in the same pack as its last chunks). Blobs are verified by their own
// digests, the pack as a whole by the SHA-256 in its object's metadata.
type PackID [16]byte

func (p PackID) String() string { return hex.EncodeToString(p[:]) }

// ParsePackID reads a hex pack id.
func ParsePackID(s string) (PackID, error) {
	var p PackID
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(p) {
		return p, fmt.Errorf("pack id %q: want %d hex digits", s, 2*len(p))
	}
	copy(p[:], b)
	return p, nil
}

func newPackID() PackID {
	var p PackID
	rand.Read(p[:])
	return p
}

// Blob kinds.
const (
	KindData    byte = 1 // a chunk of a file
	KindSegment byte = 2 // a run of a manifest's entries
)

// Compression of a stored blob.
const (
	compNone byte = 0
	compZstd byte = 1
)

// Ref locates a blob: its digest, the pack that holds it and where.
type Ref struct {
	Digest Digest
	Pack   PackID
	Offset uint32
	Stored uint32 // bytes in the pack
	Raw    uint32 // bytes once decompressed
	Comp   byte
}

// Content-defined chunking: restic's Rabin fingerprint chunker (github.com/restic/chunker;
// the method is Rabin's "Fingerprinting by random polynomials", 1981, as in LBFS,
// Muthitacharoen et al., SOSP 2001). Files smaller than MinChunk are one chunk; larger
// ones are cut where the fingerprint of the last 64 bytes has its low AverageBits bits
// zero, between MinChunk and MaxChunk: an edit moves only the cuts near it, so a save
// after an edit stores the chunks around the edit and reuses the rest.
const (
	MinChunk    = 256 << 10
	MaxChunk    = 2 << 20
	AverageBits = 19 // cuts every 512 KiB on average, past the minimum
	// Polynomial is the chunker's irreducible polynomial, fixed for the format: chunk
	// boundaries (so deduplication) must agree across hosts and saves. (restic picks one
	// per repository to hide chunk sizes from whoever reads the store; here the store's
	// reader sees the data anyway.)
	Polynomial = chunker.Pol(0x3DA3358B4DC173)
)

// Pack layout: the blobs back to back, then the trailer, then the trailer's length
// (uint32, little endian) and packMagic. The trailer is, per blob: kind, compression,
// digest, stored length and raw length (uvarints); offsets follow from the lengths.
const (
	packMagic = "THPK"
	// PackTarget is the size at which a pack is sealed and uploaded: a few MB, so a save is
	// a few PUTs and a restore a few parallel GETs.
	PackTarget = 4 << 20
	// maxPackSize bounds what is read of a pack (a store is not trusted to be small).
	maxPackSize = 64 << 20
	// maxBlobRaw bounds a blob's decompressed size: a chunk, or a segment.
	maxBlobRaw = 8 << 20
)

// packBlob is one blob of a pack as its trailer lists it.
type packBlob struct {
	Kind byte
	Ref  Ref
}

// encodeTrailer appends the trailer of blobs.
func encodeTrailer(dst []byte, blobs []packBlob) []byte {
	start := len(dst)
	dst = binary.AppendUvarint(dst, uint64(len(blobs)))
	for _, b := range blobs {
		dst = append(dst, b.Kind, b.Ref.Comp)
		dst = append(dst, b.Ref.Digest[:]...)
		dst = binary.AppendUvarint(dst, uint64(b.Ref.Stored))
		dst = binary.AppendUvarint(dst, uint64(b.Ref.Raw))
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(dst)-start))
	return append(dst, packMagic...)
}

// ErrCorrupt: stored bytes do not decode or do not match their digest.
var ErrCorrupt = errors.New("corrupt snapshot data")

// PackError is a blob that could not be read from its pack because of what the store
// holds (the error is ErrCorrupt or ErrMissing): which pack, so that it can be checked
// whole (Examiner). Its message is the cause's, which names the pack.
type PackError struct {
	Pack PackID
	Err  error
}

func (e *PackError) Error() string { return e.Err.Error() }
func (e *PackError) Unwrap() error { return e.Err }

// packErr names the pack of a failure that the store's bytes caused (others pass as they
// are: a store that is down, a context that ended).
func packErr(p PackID, err error) error {
	var pe *PackError
	if err == nil || errors.As(err, &pe) || !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrMissing) {
		return err
	}
	return &PackError{Pack: p, Err: err}
}

// decodeTrailer lists the blobs of a whole pack.
func decodeTrailer(id PackID, pack []byte) ([]packBlob, error) {
	bad := func(why string) error { return fmt.Errorf("pack %s: %s: %w", id, why, ErrCorrupt) }
	if len(pack) < 8 || string(pack[len(pack)-4:]) != packMagic {
		return nil, bad("no pack trailer")
	}
	tl := int(binary.LittleEndian.Uint32(pack[len(pack)-8:]))
	if tl > len(pack)-8 {
		return nil, bad("trailer longer than the pack")
	}
	body, tr := pack[:len(pack)-8-tl], pack[len(pack)-8-tl:len(pack)-8]
	n, k := binary.Uvarint(tr)
	if k <= 0 || n > uint64(len(tr)) {
		return nil, bad("bad blob count")
	}
	tr = tr[k:]
	blobs := make([]packBlob, 0, n)
	var off uint64
	for range n {
		if len(tr) < 34 {
			return nil, bad("trailer cut short")
		}
		b := packBlob{Kind: tr[0]}
		b.Ref.Comp = tr[1]
		copy(b.Ref.Digest[:], tr[2:34])
		tr = tr[34:]
		stored, k1 := binary.Uvarint(tr)
		if k1 <= 0 {
			return nil, bad("trailer cut short")
		}
		raw, k2 := binary.Uvarint(tr[k1:])
		if k2 <= 0 {
			return nil, bad("trailer cut short")
		}
		tr = tr[k1+k2:]
		if stored > maxBlobRaw+1024 || raw > maxBlobRaw || off+stored > uint64(len(body)) {
			return nil, bad("blob out of bounds")
		}
		b.Ref.Pack, b.Ref.Offset, b.Ref.Stored, b.Ref.Raw = id, uint32(off), uint32(stored), uint32(raw)
		off += stored
		blobs = append(blobs, b)
	}
	return blobs, nil
}

var (
	encOnce sync.Once
	enc     *zstd.Encoder
	dec     *zstd.Decoder
)

// codecs are shared: EncodeAll and DecodeAll may run on many goroutines at once.
func codecs() (*zstd.Encoder, *zstd.Decoder) {
	encOnce.Do(func() {
		n := runtime.GOMAXPROCS(0)
		var err error
		enc, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(n),
			zstd.WithLowerEncoderMem(true), zstd.WithEncoderCRC(false))
		if err != nil {
			panic(err)
		}
		dec, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(n), zstd.WithDecoderMaxMemory(maxBlobRaw+1),
			zstd.WithDecoderMaxWindow(maxBlobRaw+1))
		if err != nil {
			panic(err)
		}
	})
	return enc, dec
}

// compress returns what to store for raw: zstd, or raw itself when that is no larger.
func compress(raw []byte) ([]byte, byte) {
	e, _ := codecs()
	out := e.EncodeAll(raw, make([]byte, 0, len(raw)/2+64))
	if len(out) >= len(raw) {
		return raw, compNone
	}
	return out, compZstd
}

// openBlob decompresses a stored blob and checks it against ref's digest and size.
func openBlob(ref Ref, stored []byte) ([]byte, error) {
	var raw []byte
	switch ref.Comp {
	case compNone:
		raw = stored
	case compZstd:
		_, d := codecs()
		var err error
		raw, err = d.DecodeAll(stored, make([]byte, 0, ref.Raw))
		if err != nil {
			return nil, fmt.Errorf("blob %.12s in pack %s: %v: %w", ref.Digest, ref.Pack, err, ErrCorrupt)
		}
	default:
		return nil, fmt.Errorf("blob %.12s in pack %s: unknown compression %d: %w", ref.Digest, ref.Pack, ref.Comp, ErrCorrupt)
	}
	if uint32(len(raw)) != ref.Raw || sha256.Sum256(raw) != ref.Digest {
		return nil, fmt.Errorf("blob %.12s in pack %s: its content does not match its digest: %w", ref.Digest.String(), ref.Pack, ErrCorrupt)
	}
	return raw, nil
}

// blobIn returns ref's stored bytes within its whole pack.
func blobIn(ref Ref, pack []byte) ([]byte, error) {
	end := uint64(ref.Offset) + uint64(ref.Stored)
	if end > uint64(len(pack)) {
		return nil, fmt.Errorf("blob %.12s: past the end of pack %s: %w", ref.Digest.String(), ref.Pack, ErrCorrupt)
	}
	return pack[ref.Offset:end], nil
}

var _ = bytes.MinRead
