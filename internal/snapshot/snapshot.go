// Package snapshot saves a workspace to an object store, keeps the newest few per project,
// and restores the newest one that restores. Snapshots are stored in the chunked format:
// content-addressed chunks under a manifest (package chunked; chunked.go here), so a save
// stores what changed. Older versions could also store a snapshot as one tar.gz; those
// are still listed, restored, exported, verified and pruned, and converted to chunked by
// the first wake that restores one (Target.Convert). A tar.gz of any snapshot is what
// Export writes.
//
// Keys: projects/{project_id}/snapshots/{YYYYMMDDTHHMMSSZ}-{mmm}-{nonce}.snap, for example
// projects/shop/snapshots/20261121T093000Z-042-7f3a9c.snap: the UTC time, to the
// millisecond, at which the save stored its snapshot, and six random hex digits that keep
// two savers of the same millisecond apart (the tar.gz snapshots of older versions: the
// same name ending .tar.gz). Lexical order of the keys is the order of the saves, and the
// newest snapshot is the last key:
//
//   - A save's time is never earlier than the newest snapshot it can see in the store (it
//     takes one millisecond past it if its clock says otherwise), nor than any earlier save
//     of the same Manager, so a save sorts after every snapshot that existed when it took
//     its own, whatever retention deleted, in this process or any other, on any host.
//   - Saves that overlap (neither could see the other's snapshot; the project lease keeps
//     a fleet's hosts from it) are ordered by the moment each stored its manifest: the
//     one stored last sorts last and is what Restore returns. Across hosts that moment is
//     read from each host's clock.
//
// Keys written by older versions ({YYYYMMDDTHHMMSSZ}.tar.gz and _NN.tar.gz) are still
// listed, restored and pruned, and a new save sorts after them.
//
// Integrity: a chunked snapshot's chunks, files and tree are checked against their
// digests as it is restored, and the restored workspace against its manifest. A tar.gz
// snapshot has the SHA-256 of its archive in the object's metadata "sha256": Restore
// downloads it to a temp file, verifies size and SHA-256, and only then extracts.
//
// Every saved snapshot restores: a save applies the bounds a restore extracts with
// (entries, sizes, name lengths), and what it cannot store it skips and reports
// (Info.Skipped, Info.Skips, the log). A snapshot that is refused all the same (it does
// not verify, or extracting it fails: an older version's snapshot past a bound, a crafted
// entry) is skipped for the next older one; the result says which one was restored and
// why the newer ones were not (Info.Refused).
//
// Failure: the store is retried with one policy (store.Retry: a few attempts within a
// total deadline; the S3 backend makes a single attempt per request), so a store that is
// down fails a save in seconds with one log line per attempt. A Save that cannot store
// its snapshot returns an error wrapping ErrSaveFailed; the caller (a session) logs it
// and carries on, and the next Save tries again from scratch.
package snapshot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/archive"
	"github.com/toolhost/toolhost/internal/chunked"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// Errors callers branch on; test with errors.Is. Their messages are one line each, fit to
// print as they are.
var (
	// ErrSaveFailed: a Save did not store its snapshot. The wrapped cause says why.
	ErrSaveFailed = errors.New("snapshot save failed")
	// ErrNoSnapshot: the project has no snapshot to restore.
	ErrNoSnapshot = errors.New("no snapshot")
	// ErrCorrupt: the project has snapshots, and every one was refused (it did not verify
	// or could not be extracted); the message says why each was. RestoreKey returns it
	// for the one snapshot asked for.
	ErrCorrupt = errors.New("no snapshot of the project restores")
	// ErrInvalidProject: the project ID cannot be used in a key.
	ErrInvalidProject = storekeys.ErrInvalidProject
	// ErrNotSnapshotKey: a key given to RestoreKey or Delete is not a snapshot key of the
	// project.
	ErrNotSnapshotKey = errors.New("not a snapshot key")
	// ErrNoSuchSnapshot: the key given to RestoreKey or Delete names no stored snapshot.
	ErrNoSuchSnapshot = errors.New("no such snapshot")
	// ErrInvalidKeep: Prune was asked to keep fewer than one snapshot.
	ErrInvalidKeep = errors.New("invalid number of snapshots to keep")
)

// MetaSHA256 is the object metadata key holding a tar.gz snapshot's hex SHA-256.
const MetaSHA256 = "sha256"

// MetaTree is the object metadata key holding a tar.gz snapshot's content digest
// (Info.Tree), as older versions wrote it.
const MetaTree = "tree"

// Defaults applied by New to zero Config fields.
const (
	DefaultKeep           = 5
	DefaultRetries        = 3
	DefaultBackoff        = time.Second
	DefaultMaxBackoff     = store.DefaultRetryMaxBackoff
	DefaultRetryWindow    = store.DefaultRetryWindow
	DefaultAttemptTimeout = 15 * time.Minute
	MaxProjectIDLen       = storekeys.MaxProjectLen
)

// Config configures a Manager. Store is required.
type Config struct {
	Store store.Store
	// Keep is how many snapshots per project retention keeps (the newest); 0 means
	// DefaultKeep, a negative value keeps everything.
	Keep int
	// Excludes are the base names SaveDir leaves out; nil means archive.DefaultExcludes.
	Excludes []string
	// Retries is how many times a failed store operation (the upload of a save, the
	// download of a restore) is retried; 0 means DefaultRetries, a negative value none.
	Retries int
	// Backoff is the wait before the first retry, doubling for each next one up to
	// MaxBackoff, with jitter; 0 means DefaultBackoff / DefaultMaxBackoff.
	Backoff    time.Duration
	MaxBackoff time.Duration
	// RetryWindow is the total deadline of the retries of one operation: none starts
	// later than this after the first failure (store.Retry.Window); 0 means
	// DefaultRetryWindow.
	RetryWindow time.Duration
	// AttemptTimeout bounds one upload or download attempt; 0 means DefaultAttemptTimeout.
	AttemptTimeout time.Duration
	// MaxEntries, MaxNameLen and MaxBytes bound SaveDir's packs and RestoreDir's extracts
	// alike (so every snapshot SaveDir makes restores); zero means the archive package's
	// defaults, which sandboxes pack and extract with too.
	MaxEntries int
	MaxNameLen int
	MaxBytes   int64
	// TempDir holds a tar.gz snapshot between download and extract; empty means
	// os.TempDir().
	TempDir string
	// Logger receives a record for every save, failed attempt, retention delete and
	// restore; nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock naming snapshots; nil means time.Now.
	Now func() time.Time
	// Progress, when set, is called from the working goroutine as bytes move.
	Progress func(Progress)
	// Grace is how long chunks stay unreferenced before a collection deletes them
	// (chunked.Config.Grace); 0 means an hour.
	Grace time.Duration
}

// The formats a snapshot key can be of (Info.Format). New snapshots are chunked;
// FormatTarGz is that of the snapshots older versions wrote, still listed, restored,
// exported and pruned, and converted to chunked on the first wake (Target.Convert).
const (
	FormatChunked = "chunked"
	FormatTarGz   = "tar.gz"
)

// FormatOf says which format a snapshot key is of.
func FormatOf(key string) string {
	if strings.HasSuffix(key, chunked.Suffix) {
		return FormatChunked
	}
	return FormatTarGz
}

// Progress reports bytes moved by one phase of a Save or Restore.
type Progress struct {
	ProjectID string
	// Phase is "pack", "upload", "download" or "extract".
	Phase string
	Done  int64
	// Total is the phase's size in bytes, or -1 when unknown (pack).
	Total int64
}

// Info describes one snapshot, and what a Save or Restore did with it.
type Info struct {
	ProjectID string
	Key       string
	// Time is when the save took the snapshot, in UTC, from the key: to the millisecond
	// (to the second for keys written by older versions).
	Time time.Time
	Size int64
	// SHA256 is a tar.gz snapshot's hex digest, set by its restore; empty for chunked
	// snapshots (their chunks, files and tree are checked against their own digests).
	SHA256 string
	// Attempts is the number of store attempts made by the download of a tar.gz
	// snapshot restored.
	Attempts int
	// Unchanged (Save): the project's newest snapshot already held this content (Tree), so
	// nothing was uploaded and Key is that snapshot's.
	Unchanged bool
	// Pruned lists the keys retention deleted after this Save.
	Pruned []string
	// Skipped counts the entries the pack left out because a snapshot cannot hold them
	// (names too long, unreadable, special files, past a bound); Skips names the first
	// of them and why. SaveDir fills them in; internal/session does for sandboxes.
	Skipped int
	Skips   []archive.Skip
	// Refused (Restore) lists the newer snapshots that were not restored, newest first,
	// and why.
	Refused []Refusal
	// Transfer is what the operation really moved.
	Transfer Transfer
	// Format is FormatChunked or FormatTarGz.
	Format string
	// Label is the commit's label (chunked snapshots keep it; Checkpoints reads it).
	Label string
	// Tree is the hex digest of the snapshot's content (paths, types, modes, sizes, link
	// targets, file digests; never times): two snapshots with the same Tree hold the same
	// workspace. A save whose Tree equals the newest snapshot's stores nothing.
	Tree string
	// Origin is, for a fork or a rewind, the snapshot it copies; for a snapshot converted
	// from a tar.gz one, that one's key.
	Origin string
	// Converted (Restore into a Target with Convert) is the key of the chunked snapshot the
	// restored tar.gz snapshot was converted into; empty when there was none to convert or
	// the conversion did not happen (it is logged; the next wake tries again).
	Converted string
}

// Refusal is a snapshot Restore passed over, and why.
type Refusal struct {
	Key    string
	Reason string
	// Quarantine is where the snapshot was set aside, found damaged (empty when it was
	// not: a fault that did not last, an extraction refused).
	Quarantine string
}

// Manager saves, lists and restores snapshots. It is safe for concurrent use.
type Manager struct {
	cfg   Config
	log   *slog.Logger
	retry store.Retry

	*saves // shared by the views WithStore makes

	repo *chunked.Repo // the chunked format on the store
}

// saves is what a Manager and its views remember of their saves.
type saves struct {
	mu   sync.Mutex
	last map[string]time.Time // per project, the time of this Manager's latest save
}

// New checks cfg and applies defaults.
func New(cfg Config) (*Manager, error) {
	if cfg.Store == nil {
		return nil, errors.New("snapshot: Config.Store is required")
	}
	if cfg.Keep == 0 {
		cfg.Keep = DefaultKeep
	}
	if cfg.Retries == 0 {
		cfg.Retries = DefaultRetries
	} else if cfg.Retries < 0 {
		cfg.Retries = 0
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = max(DefaultMaxBackoff, cfg.Backoff)
	}
	if cfg.RetryWindow <= 0 {
		cfg.RetryWindow = DefaultRetryWindow
	}
	if cfg.AttemptTimeout <= 0 {
		cfg.AttemptTimeout = DefaultAttemptTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	retry := store.Retry{Attempts: cfg.Retries + 1, Backoff: cfg.Backoff, MaxBackoff: cfg.MaxBackoff,
		Window: cfg.RetryWindow, AttemptTimeout: cfg.AttemptTimeout}
	repo, err := chunked.New(chunked.Config{Store: cfg.Store, Retry: retry, Grace: cfg.Grace, TempDir: cfg.TempDir, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	return &Manager{
		repo: repo,
		cfg:  cfg,
		log:  cfg.Logger.With("component", "snapshot"),
		retry: store.Retry{Attempts: cfg.Retries + 1, Backoff: cfg.Backoff, MaxBackoff: cfg.MaxBackoff,
			Window: cfg.RetryWindow, AttemptTimeout: cfg.AttemptTimeout},
		saves: &saves{last: map[string]time.Time{}},
	}, nil
}

// WithStore is a view of m whose store calls go to st, a wrapper of m's store (the
// fenced store of a session's writes: lease.Fence). It shares m's order of saves and
// what m's chunked format learnt of the store, so its saves sort and dedupe as m's own.
func (m *Manager) WithStore(st store.Store) *Manager {
	v := *m
	v.cfg.Store = st
	v.repo = m.repo.WithStore(st)
	return &v
}

// ValidProjectID reports why id cannot name a project, or nil (storekeys.ValidProject:
// the store's key layout has one owner).
func ValidProjectID(id string) error { return storekeys.ValidProject(id) }

// Prefix is the folder of a project's snapshots, ending in "/".
func Prefix(projectID string) string { return storekeys.Snapshots(projectID) }

// Key names the snapshot of projectID taken at t (to the millisecond, in UTC), told
// apart from others of the same millisecond by nonce (see NewNonce).
func Key(projectID string, t time.Time, nonce string) string {
	return storekeys.SnapshotKey(projectID, t, nonce)
}

// NewNonce returns six random lower-case hex digits for Key.
func NewNonce() string { return storekeys.NewNonce() }

// ParseKey reads a snapshot key back: its project and time. ok is false for any other
// object. Keys of older versions ({YYYYMMDDTHHMMSSZ}.tar.gz, _NN.tar.gz) parse too,
// with a time to the second.
func ParseKey(key string) (projectID string, t time.Time, ok bool) {
	projectID, t, _, ok = parseKey(key)
	return projectID, t, ok
}

// parseKey also returns the earliest time a new key may take to sort after key.
func parseKey(key string) (projectID string, t, after time.Time, ok bool) {
	if strings.HasSuffix(key, chunked.Suffix) {
		projectID, t, ok = chunked.ParseManifestKey(key)
		if !ok || ValidProjectID(projectID) != nil {
			return "", time.Time{}, time.Time{}, false
		}
		return projectID, t, t.Add(time.Millisecond), true
	}
	return storekeys.ParseSnapshotKey(key)
}

// claim picks the time of a new snapshot of the project: now, but never before after
// (one millisecond past the newest snapshot in the store) nor at or before this
// Manager's previous save of the project.
func (m *Manager) claim(projectID string, after time.Time) time.Time {
	t := m.cfg.Now().UTC().Truncate(time.Millisecond)
	m.mu.Lock()
	defer m.mu.Unlock()
	if last, ok := m.last[projectID]; ok && !t.After(last) {
		t = last.Add(time.Millisecond)
	}
	if t.Before(after) {
		t = after
	}
	m.last[projectID] = t
	return t
}

// Save stores the tar.gz archive pack writes (a sandbox's Archive) as a new snapshot:
// the chunked format reads it as it comes and stores what its chunk store lacks, then
// retention is applied. When the project's newest snapshot holds the same content (its
// Tree), nothing is stored and Info.Unchanged is set.
//
// Any failure, the pack's included, returns an error wrapping ErrSaveFailed (and, for a
// bad project ID, ErrInvalidProject). Retention problems after a successful save are only
// logged: the snapshot is saved.
func (m *Manager) Save(ctx context.Context, projectID string, pack func(io.Writer) error) (Info, error) {
	return m.SaveLabeled(ctx, projectID, "", pack)
}

// SaveLabeled is Save with the commit's label.
func (m *Manager) SaveLabeled(ctx context.Context, projectID, label string, pack func(io.Writer) error) (Info, error) {
	return m.saveChunkedStream(ctx, projectID, label, pack)
}

// listed is a snapshot found in the store.
type listed struct {
	Info
	after time.Time // the earliest time of a key that sorts after this one
}

// newest returns the project's newest snapshot, or nil.
func (m *Manager) newest(ctx context.Context, projectID string) (*listed, error) {
	all, err := m.list(ctx, projectID)
	if err != nil || len(all) == 0 {
		return nil, err
	}
	return &all[0], nil
}

// Prune deletes all but the newest keep snapshots of the project (snapshot prune --keep
// N); keep must be at least 1. It returns the keys deleted, oldest last.
func (m *Manager) Prune(ctx context.Context, projectID string, keep int) ([]string, error) {
	if err := ValidProjectID(projectID); err != nil {
		return nil, err
	}
	if keep < 1 {
		return nil, fmt.Errorf("%w: keep at least 1 snapshot, not %d (delete the last ones by key)", ErrInvalidKeep, keep)
	}
	return m.prune(ctx, projectID, "", keep)
}

// prune deletes all but the newest keep snapshots of the project, and never exempt (the
// snapshot a Save just wrote): when savers overlap it can be older than the newest keep,
// written by others meanwhile; those stay, and so does it, until the next save.
func (m *Manager) prune(ctx context.Context, projectID, exempt string, keep int) ([]string, error) {
	if keep < 0 {
		return nil, nil
	}
	start := time.Now()
	all, err := m.list(ctx, projectID)
	if err != nil {
		return nil, err
	}
	var doomed []string
	for _, in := range all { // newest first
		switch {
		case keep > 0:
			keep--
		case in.Key == exempt:
		default:
			doomed = append(doomed, in.Key)
		}
	}
	if len(doomed) == 0 {
		return nil, nil
	}
	if err := m.cfg.Store.Delete(ctx, doomed...); err != nil {
		return nil, fmt.Errorf("delete %d old snapshots of project %s: %w", len(doomed), projectID, err)
	}
	for _, k := range doomed {
		m.log.Info("snapshot retention delete", "project", projectID, "key", k)
	}
	m.log.Info("snapshot retention", "project", projectID, "deleted", len(doomed), "ms", time.Since(start).Milliseconds())
	return doomed, nil
}

// Delete removes one snapshot of the project (snapshot delete KEY), or one it set aside
// as damaged (a key of its quarantine: a collection then takes the packs only it needed).
// A key that is neither gives ErrNotSnapshotKey, one that names nothing
// ErrNoSuchSnapshot.
func (m *Manager) Delete(ctx context.Context, projectID, key string) error {
	if err := m.checkKey(projectID, key); err != nil {
		if m.checkQuarantineKey(projectID, key) != nil {
			return err
		}
	}
	if _, err := m.cfg.Store.Head(ctx, key); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: project %s has no snapshot %s", ErrNoSuchSnapshot, projectID, key)
		}
		return fmt.Errorf("delete snapshot %s: %w", key, err)
	}
	if err := m.cfg.Store.Delete(ctx, key); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", key, err)
	}
	m.log.Info("snapshot deleted", "project", projectID, "key", key)
	return nil
}

func (m *Manager) checkKey(projectID, key string) error {
	if err := ValidProjectID(projectID); err != nil {
		return err
	}
	if pid, _, ok := ParseKey(key); !ok || pid != projectID {
		return fmt.Errorf("%w: %q is not a snapshot key of project %s (keys look like %s; snapshot list shows them)",
			ErrNotSnapshotKey, key, projectID, Key(projectID, time.Date(2026, 11, 21, 9, 30, 0, 42e6, time.UTC), "7f3a9c"))
	}
	return nil
}

// List returns the project's snapshots, newest first. Objects under the prefix that are
// not snapshot keys are ignored.
func (m *Manager) List(ctx context.Context, projectID string) ([]Info, error) {
	all, err := m.list(ctx, projectID)
	infos := make([]Info, len(all))
	for i, l := range all {
		infos[i] = l.Info
	}
	return infos, err
}

func (m *Manager) list(ctx context.Context, projectID string) ([]listed, error) {
	if err := ValidProjectID(projectID); err != nil {
		return nil, err
	}
	objs, err := store.ListAll(ctx, m.cfg.Store, Prefix(projectID))
	if err != nil {
		return nil, err // the store's error names the prefix listed
	}
	var all []listed
	for _, o := range objs {
		pid, t, after, ok := parseKey(o.Key)
		if !ok || pid != projectID {
			continue
		}
		all = append(all, listed{Info{ProjectID: pid, Key: o.Key, Time: t, Size: o.Size, Format: FormatOf(o.Key)}, after})
	}
	slices.SortFunc(all, func(a, b listed) int { return strings.Compare(b.Key, a.Key) })
	return all, nil
}

// Restore restores the project's newest snapshot that restores: it calls extract with
// the bytes of the newest snapshot that verifies (downloaded to a temp file and checked
// against its stored size and SHA-256 first), and when a snapshot does not verify or
// extract fails on it, logs why and goes on to the next older one. extract may thus be
// called more than once; each call must start from a clean destination (the caller
// discards what a failed call left behind). Info.Refused says which newer snapshots were
// passed over and why.
//
// A download that fails because the store does (not the snapshot) is retried, and then
// fails the Restore: an older snapshot is not silently restored because the store is
// unreachable. Nor is one when ctx ends.
//
// It returns ErrNoSnapshot when the project has none, ErrCorrupt when none restores.
func (m *Manager) Restore(ctx context.Context, projectID string, extract func(io.Reader) error) (Info, error) {
	return m.RestoreTo(ctx, projectID, Target{Extract: extract})
}

// Target is where a restore goes.
type Target struct {
	// Extract receives a snapshot as one tar.gz stream (a sandbox's Extract), whatever its
	// format: a chunked snapshot is streamed as one, every chunk and file checked against
	// its digest on the way (with no compression: the stream is the host's own).
	Extract func(io.Reader) error
	// List, when set, lists the restored workspace after a chunked snapshot was extracted,
	// and the restore checks it against the manifest (paths, types, modes, sizes): what
	// differs refuses the snapshot, as a failed extraction does, naming the paths.
	List func(ctx context.Context) ([]WorkspaceEntry, error)
	// Convert, when set, makes a restore whose snapshot is a tar.gz one (written by an
	// older version) and the project's newest convert it: a chunked snapshot of the same
	// content, whose origin and label name the tar.gz key, is saved as the newest, so the
	// next wake, rewinds, forks and diffs work from it. The tar.gz snapshot is left for
	// retention. Convert is called before anything is written and stops the conversion
	// with an error (a session that lost its project's lease); a conversion that fails
	// is logged and the restore still succeeds. Only a holder of the project (a session's
	// wake) sets it; RestoreKeyTo converts nothing.
	Convert func() error

	// dir restores a chunked snapshot straight into a host directory (RestoreDir).
	dir func(ctx context.Context, m *chunked.Manifest) error
}

// WorkspaceEntry is one entry of a restored workspace, as its sandbox lists it.
type WorkspaceEntry struct {
	Path string // relative to the workspace root, slash-separated
	Mode fs.FileMode
	Size int64
}

// RestoreTo is Restore into any Target.
func (m *Manager) RestoreTo(ctx context.Context, projectID string, t Target) (Info, error) {
	start := time.Now()
	if err := ValidProjectID(projectID); err != nil {
		return Info{ProjectID: projectID}, err
	}
	var all []listed
	_, err := m.retry.Do(ctx, func(ctx context.Context) error {
		var err error
		all, err = m.list(ctx, projectID)
		return err
	}, m.logAttempt("list", projectID))
	if err != nil {
		return Info{ProjectID: projectID}, fmt.Errorf("restore project %s: %w", projectID, err)
	}
	if len(all) == 0 {
		m.noteQuarantine(ctx, projectID)
		return Info{ProjectID: projectID}, fmt.Errorf("restore project %s: %w", projectID, ErrNoSnapshot)
	}
	f, err := os.CreateTemp(m.cfg.TempDir, "toolhost-restore-*.tar.gz")
	if err != nil {
		return Info{ProjectID: projectID}, fmt.Errorf("restore project %s: temp file: %w", projectID, err)
	}
	defer func() { f.Close(); os.Remove(f.Name()) }()

	var refused []Refusal
	var tr Transfer
	var x *chunked.Examiner
	aside := map[string]Refusal{} // set aside during this restore, not yet tried
	for _, l := range all {
		if r, ok := aside[l.Key]; ok {
			refused = append(refused, r)
			continue
		}
		in := l.Info
		in.Refused = refused
		why, cause, err := m.restoreOne(ctx, f, &in, &tr, t)
		if err != nil {
			in.Transfer = tr
			return in, err
		}
		if why != "" {
			r := Refusal{Key: in.Key, Reason: why}
			if cause != nil {
				if x == nil {
					x = m.repo.NewExaminer()
				}
				for k, a := range m.setAside(ctx, x, projectID, in.Key, cause) {
					if k == in.Key {
						r.Quarantine = a.Quarantine
					} else {
						aside[k] = a
					}
				}
			}
			m.log.Warn("snapshot refused, trying the next older one", "project", projectID, "key", in.Key, "why", why, "quarantine", r.Quarantine)
			refused = append(refused, r)
			continue
		}
		in.Refused, in.Transfer = refused, tr
		if t.Convert != nil && in.Format == FormatTarGz && len(refused) == 0 {
			m.convert(ctx, f, &in, t.Convert)
		}
		if len(refused) > 0 {
			m.log.Warn("snapshot restored an older snapshot: the newer ones were refused", "project", projectID,
				"key", in.Key, "refused", refusals(refused))
		}
		m.log.Info("snapshot restored", "project", projectID, "key", in.Key, "bytes", in.Size,
			"attempts", in.Attempts, "transfer", tr.String(), "total_ms", time.Since(start).Milliseconds())
		return in, nil
	}
	return Info{ProjectID: projectID, Refused: refused, Transfer: tr},
		fmt.Errorf("restore project %s: %w (%d tried: %s)", projectID, ErrCorrupt, len(all), refusals(refused))
}

// restoreOne downloads, verifies and extracts one snapshot. why is set when the snapshot
// was refused (Restore goes on to the next, RestoreKey fails), with cause when a chunked
// snapshot's stored data is at fault (see restoreChunked); err when the restore must stop.
func (m *Manager) restoreOne(ctx context.Context, f *os.File, in *Info, tr *Transfer, t Target) (why string, cause, err error) {
	if FormatOf(in.Key) == FormatChunked {
		return m.restoreChunked(ctx, in, tr, t)
	}
	extract := t.Extract
	why, err = m.download(ctx, f, in, tr)
	if err != nil {
		return "", nil, fmt.Errorf("restore %s: %w", in.Key, err)
	}
	if why != "" {
		return why, nil, nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", nil, fmt.Errorf("restore %s: %w", in.Key, err)
	}
	exStart := time.Now()
	pr := &progressFile{f: f, report: m.reporter(in.ProjectID, "extract", in.Size)}
	err = extract(pr)
	tr.add(Phase{Name: "extract", Bytes: pr.pos, Duration: time.Since(exStart)})
	if err != nil {
		if ctx.Err() != nil {
			return "", nil, fmt.Errorf("restore %s: extract: %w", in.Key, err)
		}
		return "extracting it failed: " + err.Error(), nil, nil
	}
	return "", nil, nil
}

func refusals(rs []Refusal) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = r.Key + ": " + r.Reason
	}
	return strings.Join(parts, "; ")
}

// RestoreKey restores the one snapshot key of the project (snapshot restore --key KEY),
// with no fallback: a key that is not one of the project's gives ErrNotSnapshotKey, a
// missing one ErrNoSuchSnapshot, one that does not verify ErrCorrupt, and extract's
// error is returned wrapped.
func (m *Manager) RestoreKey(ctx context.Context, projectID, key string, extract func(io.Reader) error) (Info, error) {
	return m.RestoreKeyTo(ctx, projectID, key, Target{Extract: extract})
}

// RestoreKeyTo is RestoreKey into any Target.
func (m *Manager) RestoreKeyTo(ctx context.Context, projectID, key string, t Target) (Info, error) {
	if err := m.checkKey(projectID, key); err != nil {
		return Info{ProjectID: projectID, Key: key}, err
	}
	_, kt, _ := ParseKey(key)
	in := Info{ProjectID: projectID, Key: key, Time: kt}
	f, err := os.CreateTemp(m.cfg.TempDir, "toolhost-restore-*.tar.gz")
	if err != nil {
		return in, fmt.Errorf("restore %s: temp file: %w", key, err)
	}
	defer func() { f.Close(); os.Remove(f.Name()) }()
	in.Format = FormatOf(key)
	why, cause, err := m.restoreOne(ctx, f, &in, &in.Transfer, t)
	switch {
	case err != nil:
		return in, err
	case why == gone:
		return in, fmt.Errorf("%w: project %s has no snapshot %s", ErrNoSuchSnapshot, projectID, key)
	case why != "":
		r := Refusal{Key: key, Reason: why}
		if cause != nil {
			r.Quarantine = m.setAside(ctx, m.repo.NewExaminer(), projectID, key, cause)[key].Quarantine
		}
		if r.Quarantine != "" {
			return in, fmt.Errorf("restore %s: %w: %s; it was set aside as %s", key, ErrCorrupt, why, r.Quarantine)
		}
		return in, fmt.Errorf("restore %s: %w: %s", key, ErrCorrupt, why)
	}
	m.log.Info("snapshot restored", "project", projectID, "key", key, "bytes", in.Size, "transfer", in.Transfer.String())
	return in, nil
}

const gone = "it was deleted before it could be downloaded"

// download fetches in.Key into f (truncated first) and verifies it, retrying failures
// of the store. why is set when the snapshot is gone or does not verify; err when the
// store keeps failing.
func (m *Manager) download(ctx context.Context, f *os.File, in *Info, tr *Transfer) (why string, err error) {
	var corrupt error // the store's own checksum failed: on every try, the bytes are bad
	dl := Phase{Name: "download"}
	n, err := m.retry.Do(ctx, func(ctx context.Context) error {
		why, corrupt = "", nil
		start := time.Now()
		w, err := m.downloadOnce(ctx, f, in)
		if errors.Is(err, store.ErrChecksum) {
			corrupt = err
		}
		dl.Bytes += in.Size
		dl.Duration += time.Since(start)
		why = w
		return err
	}, m.logAttempt("download "+in.Key, in.ProjectID))
	in.Attempts, dl.Attempts = n, n
	tr.add(dl)
	if err != nil && corrupt != nil && ctx.Err() == nil {
		return "the store's checksum of it fails on every read", nil
	}
	return why, err
}

func (m *Manager) downloadOnce(ctx context.Context, f *os.File, in *Info) (why string, err error) {
	in.Size = 0
	if err := f.Truncate(0); err != nil {
		return "", err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	rc, oi, err := m.cfg.Store.Get(ctx, in.Key)
	if errors.Is(err, store.ErrNotFound) {
		return gone, nil
	}
	if err != nil {
		return "", err
	}
	defer rc.Close()
	want := oi.Metadata[MetaSHA256]
	h := sha256.New()
	pw := &progressWriter{w: io.MultiWriter(f, h), report: m.reporter(in.ProjectID, "download", oi.Size)}
	if _, err := io.Copy(pw, ctxReader{ctx, rc}); err != nil {
		in.Size = pw.n
		return "", fmt.Errorf("download %s: %w", in.Key, err)
	}
	in.Size = pw.n
	in.SHA256 = hex.EncodeToString(h.Sum(nil))
	switch {
	case want == "":
		return "it has no checksum", nil
	case oi.Size > 0 && pw.n != oi.Size:
		return "", fmt.Errorf("download %s: got %d of %d bytes", in.Key, pw.n, oi.Size)
	case in.SHA256 != want:
		return fmt.Sprintf("its SHA-256 does not match (stored %.12s, got %.12s)", want, in.SHA256), nil
	}
	return "", nil
}

// logAttempt logs one line per failed store attempt.
func (m *Manager) logAttempt(what, projectID string) func(store.Attempt) {
	return func(a store.Attempt) {
		if a.Last {
			return // the caller reports the failure
		}
		m.log.Warn("snapshot "+what+": attempt failed, retrying", "project", projectID,
			"attempt", fmt.Sprintf("%d/%d", a.N, a.Of), "wait", a.Wait.Round(time.Millisecond), "err", a.Err)
	}
}

func (m *Manager) extractOptions() archive.ExtractOptions {
	return archive.ExtractOptions{MaxEntries: m.cfg.MaxEntries, MaxNameLen: m.cfg.MaxNameLen, MaxBytes: m.cfg.MaxBytes}
}

// SaveDir saves dir with the Manager's Excludes and bounds (those RestoreDir extracts
// with), reading only the files whose size or times changed since the project's newest
// snapshot. Entries the save leaves out are logged and reported in Info.Skipped and
// Info.Skips (and the stats).
func (m *Manager) SaveDir(ctx context.Context, projectID, dir string) (Info, archive.PackStats, error) {
	return m.saveChunkedDir(ctx, projectID, dir)
}

// LogSkips logs what a pack left out: one warning with the count and the first entries
// (quoted: names come from the workspace).
func LogSkips(log *slog.Logger, projectID string, skipped int, skips []archive.Skip) {
	if skipped == 0 {
		return
	}
	const show = 10
	names := make([]string, 0, min(len(skips), show))
	for _, s := range skips[:min(len(skips), show)] {
		names = append(names, strconv.Quote(clipName(s.Path))+" ("+s.Reason+")")
	}
	log.Warn("snapshot left out entries it cannot store", "project", projectID, "skipped", skipped,
		"first", strings.Join(names, "; "))
}

func clipName(s string) string {
	if len(s) > 120 {
		return s[:60] + "..." + s[len(s)-40:]
	}
	return s
}

// RestoreDir restores the newest snapshot that restores into dir with archive.Extract's
// checks and the Manager's bounds. Without replace dir must be empty or absent; a
// snapshot refused half way is cleared out of it (and dir removed if the restore made it)
// before the next older one is tried. With replace, dir may hold files: each snapshot is
// extracted next to dir and swapped in only when complete (archive.ExtractReplace), and
// dir's previous contents are moved to ExtractStats.Backup, never deleted.
func (m *Manager) RestoreDir(ctx context.Context, projectID, dir string, replace bool) (Info, archive.ExtractStats, error) {
	var st archive.ExtractStats
	if !replace {
		if err := emptyOrAbsent(dir); err != nil {
			return Info{ProjectID: projectID}, st, err
		}
	}
	info, err := m.RestoreTo(ctx, projectID, Target{Extract: func(r io.Reader) error {
		var err error
		st, err = m.extractDir(ctx, r, dir, replace)
		return err
	}, dir: func(ctx context.Context, man *chunked.Manifest) error {
		var err error
		st, err = m.restoreChunkedDir(ctx, man, dir, replace)
		return err
	}})
	return info, m.logBackup(projectID, dir, st), err
}

// RestoreDirKey is RestoreDir for the one snapshot key, with no fallback (RestoreKey).
func (m *Manager) RestoreDirKey(ctx context.Context, projectID, key, dir string, replace bool) (Info, archive.ExtractStats, error) {
	var st archive.ExtractStats
	if !replace {
		if err := emptyOrAbsent(dir); err != nil {
			return Info{ProjectID: projectID, Key: key}, st, err
		}
	}
	info, err := m.RestoreKeyTo(ctx, projectID, key, Target{Extract: func(r io.Reader) error {
		var err error
		st, err = m.extractDir(ctx, r, dir, replace)
		return err
	}, dir: func(ctx context.Context, man *chunked.Manifest) error {
		var err error
		st, err = m.restoreChunkedDir(ctx, man, dir, replace)
		return err
	}})
	return info, m.logBackup(projectID, dir, st), err
}

// extractDir extracts one snapshot into dir. Without replace (dir empty or absent), a
// failed extraction leaves dir as it was: emptied, or removed when this call made it.
func (m *Manager) extractDir(ctx context.Context, r io.Reader, dir string, replace bool) (archive.ExtractStats, error) {
	if replace {
		return archive.ExtractReplace(ctx, r, dir, m.extractOptions())
	}
	_, serr := os.Lstat(dir)
	made := errors.Is(serr, os.ErrNotExist)
	st, err := archive.Extract(ctx, r, dir, m.extractOptions())
	if err != nil {
		if made {
			os.RemoveAll(dir)
		} else {
			clearDir(dir)
		}
	}
	return st, err
}

// clearDir removes everything in dir (never through a link: RemoveAll removes a link, not
// its target).
func clearDir(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}

func (m *Manager) logBackup(projectID, dir string, st archive.ExtractStats) archive.ExtractStats {
	if st.Backup != "" {
		m.log.Info("snapshot restore moved the previous tree aside", "project", projectID, "dir", dir, "backup", st.Backup)
	}
	return st
}

// emptyOrAbsent refuses a dir that holds files (archive.ErrNotEmpty).
func emptyOrAbsent(dir string) error {
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("restore into %s: %w", dir, err)
	case len(ents) > 0:
		return fmt.Errorf("restore into %s: %w", dir, archive.ErrNotEmpty)
	}
	return nil
}

func (m *Manager) reporter(projectID, phase string, total int64) func(int64) {
	if m.cfg.Progress == nil {
		return nil
	}
	return func(done int64) {
		m.cfg.Progress(Progress{ProjectID: projectID, Phase: phase, Done: done, Total: total})
	}
}

type progressWriter struct {
	w      io.Writer
	n      int64
	report func(int64)
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.n += int64(n)
	if p.report != nil && n > 0 {
		p.report(p.n)
	}
	return n, err
}

// progressFile reads f from the start and reports the position reached; it can be
// rewound (Seek, ReadAt) for retries and checksums.
type progressFile struct {
	f      *os.File
	pos    int64
	report func(int64)
}

func (p *progressFile) Read(b []byte) (int, error) {
	n, err := p.f.ReadAt(b, p.pos)
	p.pos += int64(n)
	if p.report != nil && n > 0 {
		p.report(p.pos)
	}
	if err == nil && n < len(b) {
		err = io.EOF
	}
	return n, err
}

func (p *progressFile) ReadAt(b []byte, off int64) (int, error) {
	n, err := p.f.ReadAt(b, off)
	if p.report != nil && n > 0 {
		p.report(off + int64(n))
	}
	return n, err
}

func (p *progressFile) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		off += p.pos
	case io.SeekEnd:
		fi, err := p.f.Stat()
		if err != nil {
			return 0, err
		}
		off += fi.Size()
	}
	if off < 0 {
		return 0, errors.New("negative position")
	}
	p.pos = off
	return off, nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(b)
}
