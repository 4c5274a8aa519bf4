package chunked

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"time"

	"github.com/toolhost/toolhost/internal/storekeys"
)

// The store keys of the chunked format are internal/storekeys's (the one owner of the
// store's layout, whose doc comment draws it); these are this package's names for them.
const (
	PrefixChunks   = storekeys.Chunks
	PrefixPacks    = storekeys.ChunkPacks
	PrefixIndex    = storekeys.ChunkIndex
	PrefixDoomed   = storekeys.ChunksDoomed
	PrefixGCLock   = storekeys.ChunksGCLock
	PrefixDamaged  = storekeys.ChunksDamaged
	PrefixProjects = storekeys.Projects
	Suffix         = storekeys.ManifestSuffix
)

// SnapshotPrefix is the folder of a project's snapshots, ending in "/".
func SnapshotPrefix(project string) string { return storekeys.Snapshots(project) }

// OriginKey is where a fork keeps the manifest it was made from (the base of a merge).
func OriginKey(project string) string { return storekeys.ForkOrigin(project) }

const timeLayout = "20060102T150405Z"

// ManifestKey names project's snapshot taken at t (to the millisecond), told apart from
// others of the same millisecond by nonce (six lower-case hex digits).
func ManifestKey(project string, t time.Time, nonce string) string {
	return storekeys.ManifestKey(project, t, nonce)
}

// ParseManifestKey reads a snapshot key of this format back: its project and time.
func ParseManifestKey(key string) (project string, t time.Time, ok bool) {
	return storekeys.ParseManifestKey(key)
}

// IsManifestKey reports whether key names a manifest: a snapshot, or a fork's origin.
func IsManifestKey(key string) bool {
	return strings.HasPrefix(key, PrefixProjects) && strings.HasSuffix(key, Suffix)
}

// PackKey is where the pack id lives.
func PackKey(id PackID) string { return storekeys.ChunkPack(id.String()) }

// DamagedKey is the record of the pack id found damaged.
func DamagedKey(id PackID) string { return storekeys.DamagedPack(id.String()) }

// ParsePackKey reads a pack key back.
func ParsePackKey(key string) (PackID, bool) {
	rest, ok := strings.CutPrefix(key, PrefixPacks)
	if !ok || len(rest) != 3+2*len(PackID{}) || rest[2] != '/' || rest[:2] != rest[3:5] {
		return PackID{}, false
	}
	id, err := ParsePackID(rest[3:])
	return id, err == nil
}

// stampKey is a key under prefix that sorts by time and never collides.
func stampKey(prefix string, t time.Time) string {
	return prefix + t.UTC().Format(timeLayout) + "-" + nonce(8)
}

// stampTime reads the time back from a stampKey.
func stampTime(prefix, key string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok || len(rest) < len(timeLayout) {
		return time.Time{}, false
	}
	t, err := time.Parse(timeLayout, rest[:len(timeLayout)])
	return t, err == nil
}

// nonce returns n random lower-case hex digits.
func nonce(n int) string {
	b := make([]byte, (n+1)/2)
	rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

// NewNonce returns six random hex digits for ManifestKey.
func NewNonce() string { return nonce(6) }
