package toolhost

import (
	"context"
	"errors"
	"io"
	"strings"

	"github.com/toolhost/toolhost/internal/chunked"
	"github.com/toolhost/toolhost/internal/snapshot"
)

// What content-addressed (chunked) snapshots make cheap, on a Storage: verify, diff,
// export, fork, rewind, merge and collect (docs/SNAPSHOTS.md, "The chunked format").

// Change is one path that differs between two snapshots (or a snapshot and a directory).
type Change struct {
	Path string
	// Kind is "added", "removed" or "changed".
	Kind string
	// What changed: "type", "content", "mode", "target".
	What []string
}

func changes(cs []chunked.Change) []Change {
	out := make([]Change, len(cs))
	for i, c := range cs {
		out[i] = Change{Path: c.Path, Kind: c.Kind, What: c.What}
	}
	return out
}

// VerifyStats say what a verification read.
type VerifyStats struct {
	Files, Dirs, Symlinks int
	Bytes                 int64
	Packs                 int
	// Quarantine is where a snapshot that does not verify was set aside, found damaged
	// (with the others of its project that need what is damaged: QuarantinedSnapshots).
	Quarantine string
}

// ResolveSnapshot names a snapshot: a key (its project from the key), the part of a key
// after the last "/", "PROJECT:KEY", or "PROJECT:" or "" for that project's newest.
func (s *Storage) ResolveSnapshot(ctx context.Context, project, ref string) (string, string, error) {
	if p, _, ok := snapshot.ParseKey(ref); ok {
		return p, ref, nil
	}
	if p, k, ok := strings.Cut(ref, ":"); ok {
		project, ref = p, k
	}
	key, err := s.snaps.Resolve(ctx, project, ref)
	return project, key, err
}

// VerifySnapshot reads every chunk of a snapshot and checks each chunk, file and the
// tree against their digests (a tar.gz snapshot: its SHA-256, read to its end). A chunked
// snapshot found damaged is set aside (VerifyStats.Quarantine).
func (s *Storage) VerifySnapshot(ctx context.Context, project, key string) (VerifyStats, error) {
	st, err := s.snaps.Verify(ctx, project, key)
	vs := VerifyStats{Files: st.Files, Dirs: st.Dirs, Symlinks: st.Symlinks, Bytes: st.Bytes, Packs: st.Packs}
	var qe *snapshot.QuarantineError
	if errors.As(err, &qe) {
		vs.Quarantine = qe.Quarantine
	}
	return vs, err
}

// VerifyDir compares a directory (a live workspace) with a snapshot, reading every file.
func (s *Storage) VerifyDir(ctx context.Context, project, key, dir string) ([]Change, error) {
	cs, err := s.snaps.VerifyDir(ctx, project, key, dir)
	return changes(cs), err
}

// DiffSnapshots compares two snapshots (of one project or two) and, when w is set,
// writes the listing and unified diffs of changed text files to it.
func (s *Storage) DiffSnapshots(ctx context.Context, w io.Writer, projectA, keyA, projectB, keyB string) ([]Change, error) {
	cs, err := s.snaps.Diff(ctx, w, projectA, keyA, projectB, keyB)
	return changes(cs), err
}

// ExportSnapshot writes a snapshot as one tar.gz.
func (s *Storage) ExportSnapshot(ctx context.Context, w io.Writer, project, key string) error {
	return s.snaps.Export(ctx, w, project, key)
}

// ImportSnapshot stores the tar.gz r reads (one ExportSnapshot wrote, or any archive of a
// workspace) as the project's newest snapshot, labelled label, with a save's bounds and
// checks: what a snapshot cannot hold is left out and reported (SnapshotInfo.Skipped).
func (s *Storage) ImportSnapshot(ctx context.Context, project, label string, r io.Reader) (SnapshotInfo, error) {
	in, err := s.snaps.SaveLabeled(ctx, project, label, func(w io.Writer) error {
		_, err := io.Copy(w, r)
		return err
	})
	return snapshotInfo(in), err
}

// Fork makes project to a new project whose first snapshot is from's key (the newest
// when empty); only the manifest is copied. It returns the new snapshot and the one it
// copies.
func (s *Storage) Fork(ctx context.Context, from, key, to string) (SnapshotInfo, string, error) {
	in, err := s.snaps.Fork(ctx, from, key, to)
	return snapshotInfo(in), in.Origin, err
}

// Rewind makes the project's snapshot key its newest again (the next session wakes in it)
// without losing the present: it returns the new snapshot, the snapshot it copies and the
// key whose rewind undoes it.
func (s *Storage) Rewind(ctx context.Context, project, key string) (SnapshotInfo, string, string, error) {
	in, undo, err := s.snaps.Rewind(ctx, project, key)
	return snapshotInfo(in), in.Origin, undo, err
}

// MergeReport is what a merge of a fork did, or would not do.
type MergeReport struct {
	// Conflicts are the paths both sides changed in ways that cannot be merged; when there
	// are any, nothing was written.
	Conflicts []MergeConflict
	// Taken are the paths whose fork version was taken; Merged those merged line by line.
	Taken, Merged []string
	// Snapshot is the origin's new snapshot (empty Key with conflicts).
	Snapshot SnapshotInfo
}

// MergeConflict is one path a merge could not decide.
type MergeConflict struct{ Path, Why string }

// MergeFork merges what fork changed since it was forked into its origin project.
func (s *Storage) MergeFork(ctx context.Context, fork string) (MergeReport, error) {
	res, in, err := s.snaps.MergeFork(ctx, fork)
	var rep MergeReport
	if res != nil {
		rep.Taken, rep.Merged = res.Taken, res.Merged
		for _, c := range res.Conflicts {
			rep.Conflicts = append(rep.Conflicts, MergeConflict{Path: c.Path, Why: c.Why})
		}
	}
	rep.Snapshot = snapshotInfo(in)
	return rep, err
}

// CollectStats say what a collection of unreferenced chunks did.
type CollectStats struct {
	Manifests, Packs, Deleted, Marked, Kept int
	Freed                                   int64
}

// CollectChunks deletes the chunks no snapshot of any project references any more, a
// snapshot.grace after an earlier run found them unreferenced, then marks what is
// unreferenced now.
func (s *Storage) CollectChunks(ctx context.Context) (CollectStats, error) {
	cs, err := s.snaps.Collect(ctx)
	return CollectStats{Manifests: cs.Manifests, Packs: cs.Packs, Deleted: cs.Deleted, Marked: cs.Marked, Kept: cs.Kept, Freed: cs.Freed}, err
}
