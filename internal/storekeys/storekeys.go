// Package storekeys owns the layout of the object store: every prefix toolhost writes
// under, what a project id may be, and how the keys that carry meaning are formed and read
// back. Nothing else in the module spells a prefix; a store written by an earlier version
// reads the same, because the layout below is that version's, and keys it parses include
// the older forms.
//
//	projects/{project}/snapshots/{YYYYMMDDTHHMMSSZ}-{mmm}-{nonce}.tar.gz   a snapshot, tar.gz
//	                            (older: {YYYYMMDDTHHMMSSZ}.tar.gz, _NN.tar.gz)
//	projects/{project}/snapshots/{YYYYMMDDTHHMMSSZ}-{mmm}-{nonce}.snap     a snapshot, chunked:
//	                            its manifest (both formats sort together in save order)
//	projects/{project}/forks/origin.snap                                a fork's origin
//	projects/{project}/quarantine/{YYYYMMDDTHHMMSSZ}-{why}-{snapshot}    a damaged snapshot set aside:
//	                            when, why ("damaged-pack"...) and the name it had under snapshots/
//	projects/{project}/lease/{generation, 20 digits}                    the project lease
//	projects/{project}/sessions/{session}.json                          a live session's record
//	chunks/packs/{id[0:2]}/{id}                                         a pack of chunks
//	chunks/index/{YYYYMMDDTHHMMSSZ}-{nonce}                             which chunks a save packed where
//	chunks/gc/doomed/{YYYYMMDDTHHMMSSZ}-{nonce}                         packs a collection found unreferenced
//	chunks/gc/lease/{generation}                                        the collector's lease
//	chunks/damaged/{id}                                                 a pack found damaged: no save reuses it
//	screenshots/{project}/{agent|auto}/{YYYYMMDDTHHMMSSZ}_{viewport}.webp  screenshots
//	plugins/{plugin}/{key}                                              a plugin's own store
//	quota/{provider}/{...}                                              a provider's ledger (e2b)
//	doctor/{probe}                                                      toolhost doctor's probes
//	fleet/replicas/{instance}, fleet/sessions/{id}                      a serve fleet's records (fleet.go)
//
// Project ids and plugin names are single path segments by construction (ValidProject and
// the host's plugin names), so one project's prefix never covers another's: "projects/1/"
// is not a prefix of "projects/10/".
package storekeys

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// ErrInvalidProject: a project id cannot be used in a key.
var ErrInvalidProject = errors.New("invalid project id")

// MaxProjectLen is the longest project id.
const MaxProjectLen = 128

var projectRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// ValidProject reports why id cannot name a project, or nil: 1 to 128 characters of
// letters, digits, '.', '_' and '-', starting with a letter or digit, without "..".
func ValidProject(id string) error {
	if len(id) == 0 || len(id) > MaxProjectLen || !projectRE.MatchString(id) || strings.Contains(id, "..") {
		return fmt.Errorf("%w %q: use 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit", ErrInvalidProject, id, MaxProjectLen)
	}
	return nil
}

// The top-level prefixes.
const (
	projectsRoot    = "projects/"
	screenshotsRoot = "screenshots/"
	pluginsRoot     = "plugins/"
	quotaRoot       = "quota/"
	doctorRoot      = "doctor/"
)

// The store-wide folders of the chunked snapshot format (shared by every project).
const (
	Chunks       = "chunks/"
	ChunkPacks   = "chunks/packs/"
	ChunkIndex   = "chunks/index/"
	ChunksDoomed = "chunks/gc/doomed/"
	ChunksGCLock = "chunks/gc/lease/"
	// ChunksDamaged holds one record per pack found damaged (its key ends in the pack's id).
	ChunksDamaged = "chunks/damaged/"
	// Projects holds every project's objects.
	Projects = projectsRoot
	// ManifestSuffix ends the key of every chunked snapshot's manifest.
	ManifestSuffix = ".snap"
)

// ChunkPack is where the pack with the hex id lives (a fan-out by its first two digits).
func ChunkPack(hexID string) string { return ChunkPacks + hexID[:2] + "/" + hexID }

// DamagedPack is the record of the pack with the hex id found damaged.
func DamagedPack(hexID string) string { return ChunksDamaged + hexID }

// ForkOrigin is where a fork keeps the manifest it was made from (the base of a merge).
func ForkOrigin(project string) string { return Project(project) + "forks/origin" + ManifestSuffix }

// ManifestKey names project's chunked snapshot taken at t (to the millisecond), told apart
// from others of the same millisecond by nonce: the tar.gz key's form with another suffix.
func ManifestKey(project string, t time.Time, nonce string) string {
	return strings.TrimSuffix(SnapshotKey(project, t, nonce), ".tar.gz") + ManifestSuffix
}

var manifestRE = regexp.MustCompile(`^(\d{8}T\d{6}Z)-(\d{3})-[0-9a-f]{6}\.snap$`)

// ParseManifestKey reads a chunked snapshot's key back: its project and time.
func ParseManifestKey(key string) (project string, t time.Time, ok bool) {
	rest, found := strings.CutPrefix(key, projectsRoot)
	if !found {
		return "", time.Time{}, false
	}
	project, name, found := strings.Cut(rest, "/snapshots/")
	if !found || ValidProject(project) != nil {
		return "", time.Time{}, false
	}
	m := manifestRE.FindStringSubmatch(name)
	if m == nil {
		return "", time.Time{}, false
	}
	t, err := time.Parse(snapshotTime, m[1])
	if err != nil {
		return "", time.Time{}, false
	}
	ms, _ := strconv.Atoi(m[2])
	return project, t.Add(time.Duration(ms) * time.Millisecond), true
}

// Project is everything of one project (snapshots, lease), ending in "/".
func Project(project string) string { return projectsRoot + project + "/" }

// Snapshots is the folder of a project's snapshots, ending in "/".
func Snapshots(project string) string { return Project(project) + "snapshots/" }

// Quarantine is the folder of a project's snapshots set aside as damaged, ending in "/".
func Quarantine(project string) string { return Project(project) + "quarantine/" }

var reasonRE = regexp.MustCompile(`^[a-z]+(?:-[a-z]+)*$`)

// QuarantineKey is where project's snapshot key (under Snapshots(project)) goes when it is
// set aside at t (to the second) for reason, a few lower-case words joined by '-' such as
// "damaged-pack" ("damaged" when reason is not of that form): the snapshot's own name
// follows, so the key says when, why and what, and sorts by when.
func QuarantineKey(project string, t time.Time, reason, snapshotKey string) string {
	if !reasonRE.MatchString(reason) {
		reason = "damaged"
	}
	name := snapshotKey[strings.LastIndexByte(snapshotKey, '/')+1:]
	return Quarantine(project) + t.UTC().Format(snapshotTime) + "-" + reason + "-" + name
}

var quarantineRE = regexp.MustCompile(`^(\d{8}T\d{6}Z)-([a-z]+(?:-[a-z]+)*)-(\d{8}T\d{6}Z[^/]*)$`)

// ParseQuarantineKey reads a quarantine key back: the project, when the snapshot was set
// aside, why, and the key it had. ok is false for any other key, and for one whose
// snapshot name is not a snapshot key of the project.
func ParseQuarantineKey(key string) (project string, t time.Time, reason, snapshotKey string, ok bool) {
	rest, found := strings.CutPrefix(key, projectsRoot)
	if !found {
		return "", time.Time{}, "", "", false
	}
	project, name, found := strings.Cut(rest, "/quarantine/")
	if !found || ValidProject(project) != nil {
		return "", time.Time{}, "", "", false
	}
	m := quarantineRE.FindStringSubmatch(name)
	if m == nil {
		return "", time.Time{}, "", "", false
	}
	t, err := time.Parse(snapshotTime, m[1])
	if err != nil {
		return "", time.Time{}, "", "", false
	}
	snapshotKey = Snapshots(project) + m[3]
	if p, _, ok := ParseManifestKey(snapshotKey); !ok || p != project {
		if p, _, _, ok := ParseSnapshotKey(snapshotKey); !ok || p != project {
			return "", time.Time{}, "", "", false
		}
	}
	return project, t, m[2], snapshotKey, true
}

// Lease is the folder of a project's lease generations, ending in "/".
func Lease(project string) string { return Project(project) + "lease/" }

// SessionStates is the folder of the records of a project's live sessions, ending in "/".
func SessionStates(project string) string { return Project(project) + "sessions/" }

// SessionState is the key of the record of one live session of project (its sandbox, its
// background processes, who wrote it): what the next holder of the project takes over
// from when the session's process died without closing it. Session ids are single path
// segments (internal/sessionstate checks them).
func SessionState(project, session string) string {
	return SessionStates(project) + session + sessionStateSuffix
}

const sessionStateSuffix = ".json"

// ParseSessionState reads a session record's key back: its session id, when key is one of
// project's records.
func ParseSessionState(project, key string) (session string, ok bool) {
	rest, found := strings.CutPrefix(key, SessionStates(project))
	if !found {
		return "", false
	}
	session, found = strings.CutSuffix(rest, sessionStateSuffix)
	if !found || session == "" || strings.Contains(session, "/") {
		return "", false
	}
	return session, true
}

// LeaseGeneration is the key of a lease's generation n: zero-padded, so keys sort in
// generation order.
func LeaseGeneration(project string, n uint64) string {
	return fmt.Sprintf("%s%020d", Lease(project), n)
}

// Screenshots is the folder of a project's screenshots of one kind ("agent", "auto").
func Screenshots(project, kind string) string {
	return screenshotsRoot + project + "/" + kind + "/"
}

// Plugin is a plugin's own corner of the store, ending in "/".
func Plugin(name string) string { return pluginsRoot + name + "/" }

// Quota is a provider's ledger, ending in "/" ("quota/e2b/").
func Quota(provider string) string { return quotaRoot + provider + "/" }

// DoctorProbe is the key of a probe object of toolhost doctor: unique to host, process and
// call (n distinguishes probes of one process), so two doctors never touch one key.
func DoctorProbe(host string, pid int, n int64) string {
	return fmt.Sprintf("%sprobe-%s-%d-%d-%s", doctorRoot, host, pid, n, NewNonce())
}

// Snapshot key format.
const (
	snapshotTime = "20060102T150405Z"
	nonceLen     = 6
)

// SnapshotKey names the snapshot of project taken at t (to the millisecond, in UTC), told
// apart from others of the same millisecond by nonce (six lower-case hex digits; see
// NewNonce).
func SnapshotKey(project string, t time.Time, nonce string) string {
	t = t.UTC()
	return fmt.Sprintf("%s%s-%03d-%s.tar.gz", Snapshots(project), t.Format(snapshotTime), t.Nanosecond()/int(time.Millisecond), nonce)
}

// NewNonce returns six random lower-case hex digits.
func NewNonce() string {
	var b [nonceLen / 2]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

var snapshotRE = regexp.MustCompile(`^(\d{8}T\d{6}Z)(?:-(\d{3})-[0-9a-f]{6}|_(\d{2}))?\.tar\.gz$`)

// ParseSnapshotKey reads a snapshot key back: its project, its time, and the earliest time
// a new key may take to sort after it (the next millisecond; the next second for keys of
// older versions, which hold the whole second). ok is false for any other key.
func ParseSnapshotKey(key string) (project string, t, after time.Time, ok bool) {
	rest, found := strings.CutPrefix(key, projectsRoot)
	if !found {
		return "", time.Time{}, time.Time{}, false
	}
	project, name, found := strings.Cut(rest, "/snapshots/")
	if !found || ValidProject(project) != nil {
		return "", time.Time{}, time.Time{}, false
	}
	m := snapshotRE.FindStringSubmatch(name)
	if m == nil {
		return "", time.Time{}, time.Time{}, false
	}
	t, err := time.Parse(snapshotTime, m[1])
	if err != nil {
		return "", time.Time{}, time.Time{}, false
	}
	switch {
	case m[2] != "":
		ms, _ := strconv.Atoi(m[2])
		t = t.Add(time.Duration(ms) * time.Millisecond)
		return project, t, t.Add(time.Millisecond), true
	case m[3] == "00": // "_00" was never written
		return "", time.Time{}, time.Time{}, false
	}
	return project, t, t.Add(time.Second), true
}
