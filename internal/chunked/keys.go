package chunked

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// The store keys of the chunked format, all in this one file (to fold into the store's
// key layout): what a snapshot key names lives under its project, what is shared by
// every project of the store lives under chunks/.
//
//	projects/{project}/snapshots/{YYYYMMDDTHHMMSSZ}-{mmm}-{nonce}.snap  a manifest (the tar.gz
//	                                                      format's keys, another suffix: both
//	                                                      sort together in save order)
//	projects/{project}/forks/origin.snap                  a fork's origin, kept for merges
//	chunks/packs/{id[0:2]}/{id}                           a pack: compressed blobs + a trailer
//	chunks/index/{YYYYMMDDTHHMMSSZ}-{nonce}               which blobs a save (or a compaction)
//	                                                      put in which packs
//	chunks/gc/doomed/{YYYYMMDDTHHMMSSZ}-{nonce}           packs a collection found unreferenced
//	chunks/gc/lease/{generation}                          the collector's lease (one at a time)
const (
	PrefixChunks = "chunks/"
	PrefixPacks  = "chunks/packs/"
	PrefixIndex  = "chunks/index/"
	PrefixDoomed = "chunks/gc/doomed/"
	PrefixGCLock = "chunks/gc/lease/"
	// PrefixProjects holds every project's objects; collection lists the manifests under it.
	PrefixProjects = "projects/"
	// Suffix ends every manifest key.
	Suffix = ".snap"
)

// SnapshotPrefix is the folder of a project's snapshots, ending in "/".
func SnapshotPrefix(project string) string { return PrefixProjects + project + "/snapshots/" }

// OriginKey is where a fork keeps the manifest it was made from (the base of a merge).
func OriginKey(project string) string { return PrefixProjects + project + "/forks/origin" + Suffix }

const timeLayout = "20060102T150405Z"

// ManifestKey names project's snapshot taken at t (to the millisecond), told apart from
// others of the same millisecond by nonce (six lower-case hex digits).
func ManifestKey(project string, t time.Time, nonce string) string {
	t = t.UTC()
	return fmt.Sprintf("%s%s-%03d-%s%s", SnapshotPrefix(project), t.Format(timeLayout), t.Nanosecond()/int(time.Millisecond), nonce, Suffix)
}

var manifestRE = regexp.MustCompile(`^(\d{8}T\d{6}Z)-(\d{3})-[0-9a-f]{6}\.snap$`)

// ParseManifestKey reads a snapshot key of this format back: its project and time.
func ParseManifestKey(key string) (project string, t time.Time, ok bool) {
	rest, found := strings.CutPrefix(key, PrefixProjects)
	if !found {
		return "", time.Time{}, false
	}
	project, name, found := strings.Cut(rest, "/snapshots/")
	if !found || project == "" || strings.Contains(project, "/") {
		return "", time.Time{}, false
	}
	m := manifestRE.FindStringSubmatch(name)
	if m == nil {
		return "", time.Time{}, false
	}
	t, err := time.Parse(timeLayout, m[1])
	if err != nil {
		return "", time.Time{}, false
	}
	ms, _ := strconv.Atoi(m[2])
	return project, t.Add(time.Duration(ms) * time.Millisecond), true
}

// IsManifestKey reports whether key names a manifest: a snapshot, or a fork's origin.
func IsManifestKey(key string) bool {
	return strings.HasPrefix(key, PrefixProjects) && strings.HasSuffix(key, Suffix)
}

// PackKey is where the pack id lives.
func PackKey(id PackID) string {
	h := id.String()
	return PrefixPacks + h[:2] + "/" + h
}

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
