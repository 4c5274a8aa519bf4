package toolhost

import (
	"context"
	"time"

	"github.com/toolhost/toolhost/internal/archive"
	"github.com/toolhost/toolhost/internal/screenshot"
	"github.com/toolhost/toolhost/internal/snapshot"
)

// What the root package says of snapshots, screenshots and plugins, in types of its own:
// the packages that do the work are internal, so their types can change without breaking
// a program that embeds toolhost.

// Errors callers branch on (test with errors.Is).
var (
	// ErrNotSnapshotKey: a key given to RestoreDir or DeleteSnapshot is not one of the
	// project's snapshot keys.
	ErrNotSnapshotKey = snapshot.ErrNotSnapshotKey
	// ErrInvalidKeep: PruneSnapshots was asked to keep fewer than one snapshot.
	ErrInvalidKeep = snapshot.ErrInvalidKeep
	// ErrNoSnapshot: the project has no snapshot to restore.
	ErrNoSnapshot = snapshot.ErrNoSnapshot
	// ErrNoSuchSnapshot: a snapshot asked for by key (a rewind's checkpoint) is not the
	// project's.
	ErrNoSuchSnapshot = snapshot.ErrNoSuchSnapshot
)

// SnapshotInfo describes one snapshot of a project's workspace, and what a save or a
// restore did with it.
type SnapshotInfo struct {
	Project string
	// Key names the snapshot in the store (docs/SNAPSHOTS.md says how keys are formed).
	Key string
	// Time is when the save took the snapshot, in UTC.
	Time time.Time
	// Size is the stored size in bytes.
	Size int64
	// SHA256 is the stored archive's hex digest, when known (a listing leaves it empty).
	SHA256 string
	// Unchanged (a save): the project's newest snapshot already held this workspace, so
	// nothing was stored and Key is that snapshot's.
	Unchanged bool
	// Pruned lists the keys retention deleted after a save.
	Pruned []string
	// Skipped counts the entries a save left out because a snapshot cannot hold them
	// (names too long, unreadable, special files, past a bound); Skips names the first.
	Skipped int
	Skips   []SkippedEntry
	// Refused (a restore) lists the newer snapshots that were not restored, newest first,
	// and why.
	Refused []RefusedSnapshot
	// Transfer is what the operation really moved, phase by phase; TransferSummary says it
	// in one line (each phase's bytes, time and rate).
	Transfer        []TransferPhase
	TransferSummary string
}

// SkippedEntry is an entry a save left out, and why. Path is the workspace's own name for
// it, data the sandbox wrote: quote it wherever it is shown.
type SkippedEntry struct {
	Path, Reason string
}

// RefusedSnapshot is a snapshot a restore passed over, and why.
type RefusedSnapshot struct {
	Key, Reason string
	// Quarantine is where the snapshot was set aside, found damaged (empty when it was not);
	// QuarantinedSnapshots lists it.
	Quarantine string
}

// QuarantinedSnapshot is a snapshot set aside because it is damaged (docs/SNAPSHOTS.md,
// "Damaged snapshots"): wakes, saves and retention pass it by, and the chunks it needs are
// kept until it is deleted.
type QuarantinedSnapshot struct {
	// Key is where it is now (DeleteSnapshot and ReleaseSnapshot take it); Snapshot is the
	// key it had.
	Key, Snapshot string
	// Time is when it was set aside; Reason is why in a word ("damaged-pack",
	// "missing-pack", "corrupt-manifest", "corrupt-snapshot") and Why in a line (read from
	// the store: quote it wherever it is shown).
	Time        time.Time
	Reason, Why string
}

// TransferPhase is one step of a save or a restore.
type TransferPhase struct {
	// Name is "pack", "upload", "download" or "extract".
	Name     string
	Bytes    int64
	Duration time.Duration
	// Attempts made by the store phases.
	Attempts int
	// Failed: the phase did not complete.
	Failed bool
}

// TreeStats counts what a save read from a directory or a restore wrote into one.
type TreeStats struct {
	Files, Dirs, Symlinks int
	// Bytes of file contents read or written.
	Bytes    int64
	Duration time.Duration
	// Backup (RestoreDir with replace): where the directory's previous contents were moved.
	Backup string
}

func snapshotInfo(in snapshot.Info) SnapshotInfo {
	out := SnapshotInfo{Project: in.ProjectID, Key: in.Key, Time: in.Time, Size: in.Size, SHA256: in.SHA256,
		Unchanged: in.Unchanged, Pruned: in.Pruned, Skipped: in.Skipped, TransferSummary: in.Transfer.String()}
	for _, s := range in.Skips {
		out.Skips = append(out.Skips, SkippedEntry{Path: s.Path, Reason: s.Reason})
	}
	for _, r := range in.Refused {
		out.Refused = append(out.Refused, RefusedSnapshot{Key: r.Key, Reason: r.Reason, Quarantine: r.Quarantine})
	}
	for _, p := range in.Transfer.Phases {
		out.Transfer = append(out.Transfer, TransferPhase{Name: p.Name, Bytes: p.Bytes, Duration: p.Duration, Attempts: p.Attempts, Failed: p.Failed})
	}
	return out
}

// Snapshots lists a project's snapshots, oldest first.
func (s *Storage) Snapshots(ctx context.Context, project string) ([]SnapshotInfo, error) {
	infos, err := s.snaps.List(ctx, project)
	out := make([]SnapshotInfo, len(infos))
	for i, in := range infos {
		out[i] = snapshotInfo(in)
	}
	return out, err
}

// SaveDir saves a host directory as the project's newest snapshot (snapshot.excludes
// left out), then applies retention (snapshot.keep).
func (s *Storage) SaveDir(ctx context.Context, project, dir string) (SnapshotInfo, TreeStats, error) {
	in, st, err := s.snaps.SaveDir(ctx, project, dir)
	return snapshotInfo(in), TreeStats{Files: st.Files, Dirs: st.Dirs, Symlinks: st.Symlinks, Bytes: st.BytesIn, Duration: st.Duration}, err
}

// RestoreDir restores a snapshot of the project into dir: the one key names, or, when key
// is empty, the newest that restores (older ones are tried in turn; Refused says why the
// newer were not). dir must be empty or missing; with replace, a non-empty dir is moved
// aside first (TreeStats.Backup says where).
func (s *Storage) RestoreDir(ctx context.Context, project, key, dir string, replace bool) (SnapshotInfo, TreeStats, error) {
	var (
		in  snapshot.Info
		st  archive.ExtractStats
		err error
	)
	if key == "" {
		in, st, err = s.snaps.RestoreDir(ctx, project, dir, replace)
	} else {
		in, st, err = s.snaps.RestoreDirKey(ctx, project, key, dir, replace)
	}
	return snapshotInfo(in), TreeStats{Files: st.Files, Dirs: st.Dirs, Symlinks: st.Symlinks, Bytes: st.Bytes, Duration: st.Duration, Backup: st.Backup}, err
}

// DeleteSnapshot deletes one of the project's snapshots, or one of those set aside as
// damaged (a key QuarantinedSnapshots lists).
func (s *Storage) DeleteSnapshot(ctx context.Context, project, key string) error {
	return s.snaps.Delete(ctx, project, key)
}

// QuarantinedSnapshots lists the project's snapshots set aside as damaged, oldest first.
func (s *Storage) QuarantinedSnapshots(ctx context.Context, project string) ([]QuarantinedSnapshot, error) {
	qs, err := s.snaps.Quarantined(ctx, project)
	out := make([]QuarantinedSnapshot, len(qs))
	for i, q := range qs {
		out[i] = QuarantinedSnapshot{Key: q.Key, Snapshot: q.Snapshot, Time: q.Time, Reason: q.Reason, Why: q.Why}
	}
	return out, err
}

// ReleaseSnapshot puts a snapshot set aside as damaged back among the project's
// snapshots, under the key it had, once it verifies whole (every chunk, file and the
// tree); it returns that key. One that still does not verify stays set aside (the error
// says why).
func (s *Storage) ReleaseSnapshot(ctx context.Context, project, key string) (string, error) {
	return s.snaps.Release(ctx, project, key)
}

// PruneSnapshots deletes all but the project's newest keep snapshots and returns the keys
// it deleted.
func (s *Storage) PruneSnapshots(ctx context.Context, project string, keep int) ([]string, error) {
	return s.snaps.Prune(ctx, project, keep)
}

// Kinds of stored screenshots.
const (
	// ScreenshotsAgent are those take_screenshot took.
	ScreenshotsAgent = screenshot.KindAgent
	// ScreenshotsAuto are those a session took on its own (a dev server starting, a
	// commit).
	ScreenshotsAuto = screenshot.KindAuto
)

// Screenshot is one stored screenshot.
type Screenshot struct {
	Key string
	// Viewport is "desktop" or "mobile"; Kind ScreenshotsAgent or ScreenshotsAuto.
	Viewport, Kind string
	Time           time.Time
	Size           int64
	// URL is where a person (or a later tool) can fetch it: store.public_base + key, else a
	// presigned URL, else the directory store's file path.
	URL string
}

// Screenshots lists a project's stored screenshots of one kind (ScreenshotsAgent,
// ScreenshotsAuto, or "" for both), newest first.
func (s *Storage) Screenshots(ctx context.Context, project, kind string) ([]Screenshot, error) {
	stored, err := s.rec.List(ctx, project, kind)
	out := make([]Screenshot, len(stored))
	for i, st := range stored {
		out[i] = Screenshot{Key: st.Key, Viewport: st.Viewport, Kind: st.Kind, Time: st.Time, Size: st.Size, URL: st.URL}
	}
	return out, err
}
