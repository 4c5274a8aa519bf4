package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/archive"
	"github.com/toolhost/toolhost/internal/chunked"
	"github.com/toolhost/toolhost/internal/tree"
)

// The chunked format's side of the Manager: saves that cost what changed, restores
// checked on every wake, and what content addressing makes cheap (verify, diff, export,
// fork, rewind, merge, collection). See internal/chunked for the format.

// Repo is the chunked format on the Manager's store.
func (m *Manager) Repo() *chunked.Repo { return m.repo }

func (m *Manager) walkOptions() tree.WalkOptions {
	return tree.WalkOptions{Excludes: m.cfg.Excludes, MaxEntries: m.cfg.MaxEntries, MaxNameLen: m.cfg.MaxNameLen, MaxBytes: m.cfg.MaxBytes}
}

// saveChunkedStream saves the tar.gz pack writes (a sandbox's archive) in the chunked
// format, reading it as it comes.
func (m *Manager) saveChunkedStream(ctx context.Context, projectID, label string, pack func(io.Writer) error) (Info, error) {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { // owned by this call: the pipe is closed from both ends and done waited on
		err := pack(pw)
		pw.CloseWithError(err)
		done <- err
	}()
	src := &chunked.TarSource{R: pr, Opts: m.walkOptions()}
	info, _, err := m.saveChunked(ctx, projectID, label, src, func() (uint32, int64) { return src.RootMode, src.RootMTime }, "")
	if err == nil {
		// The archive ended (its end marker was read), but its writer may not have: the
		// tar's last zero block and the gzip trailer may still be on their way, and a
		// pipe closed under them would fail a save that is whole. They are read to the
		// end, within a bound: a sandbox that writes on past it is cut off.
		cut := time.AfterFunc(trailerWait, func() { pr.CloseWithError(errStoppedReading) })
		io.Copy(io.Discard, io.LimitReader(pr, maxArchiveTrailer))
		cut.Stop()
	}
	pr.CloseWithError(errStoppedReading)
	if perr := <-done; perr != nil && err == nil && !errors.Is(perr, errStoppedReading) {
		err = fmt.Errorf("%w: project %s: pack: %w", ErrSaveFailed, projectID, perr)
	}
	return info, err
}

// errStoppedReading is what the writer of a sandbox's archive gets when the snapshot
// stops reading it: before its end, because the save failed; after it, because the
// sandbox wrote on past maxArchiveTrailer or trailerWait.
var errStoppedReading = errors.New("the snapshot stopped reading")

// maxArchiveTrailer and trailerWait bound what is read of an archive after its end
// marker (tar's padding to its record size, gzip's trailer), and how long it is waited for.
const (
	maxArchiveTrailer = 1 << 20
	trailerWait       = 5 * time.Second
)

// saveChunkedDir saves a host directory in the chunked format: only the files whose size
// or times changed since the project's newest snapshot are read.
func (m *Manager) saveChunkedDir(ctx context.Context, projectID, dir string) (Info, archive.PackStats, error) {
	src := chunked.DirSource{Dir: dir, Opts: m.walkOptions()}
	var info Info
	var res *chunked.BuildResult
	var err error
	for range 2 { // a save whose reused chunks were collected meanwhile is made again
		info, res, err = m.saveChunked(ctx, projectID, "", src, src.Root, "")
		if !errors.Is(err, chunked.ErrStale) {
			break
		}
	}
	var st archive.PackStats
	if res != nil {
		w := res.Stats.Walk
		st = archive.PackStats{Files: w.Files, Dirs: w.Dirs + 1, Symlinks: w.Symlinks, Skipped: w.Skipped,
			BytesIn: res.Stats.BytesRead, BytesOut: res.Stats.Uploaded, Duration: res.Stats.Duration}
		st.Skips = append(st.Skips, w.Skips...)
		info.Skipped, info.Skips = st.Skipped, st.Skips
		LogSkips(m.log, projectID, st.Skipped, st.Skips)
	}
	return info, st, err
}

// saveChunked builds a snapshot of src over the project's newest one and commits it under
// a new key that sorts after every snapshot the save could see.
//
// With convertFrom (a tar.gz key, see convert), src is that snapshot's content: it is
// stored whole, whatever the newest snapshot holds, with convertFrom as its origin, and
// only while convertFrom is still the project's newest (errNotNewest otherwise);
// retention is left to the next save.
func (m *Manager) saveChunked(ctx context.Context, projectID, label string, src any, root func() (uint32, int64), convertFrom string) (Info, *chunked.BuildResult, error) {
	info := Info{ProjectID: projectID, Format: FormatChunked, Label: label}
	if err := ValidProjectID(projectID); err != nil {
		return info, nil, fmt.Errorf("%w: %w", ErrSaveFailed, err)
	}
	fail := func(err error) (Info, *chunked.BuildResult, error) {
		m.log.Error("snapshot save failed", "project", projectID, "err", err)
		return info, nil, fmt.Errorf("%w: project %s: %w", ErrSaveFailed, projectID, err)
	}
	var all []listed
	n, err := m.retry.Do(ctx, func(ctx context.Context) error {
		var err error
		all, err = m.list(ctx, projectID)
		return err
	}, m.logAttempt("save", projectID))
	if err != nil {
		info.Attempts = n
		info.Transfer.add(Phase{Name: "pack"})
		info.Transfer.add(Phase{Name: "upload", Attempts: n, Failed: true})
		return fail(err)
	}
	var after time.Time
	if len(all) > 0 {
		after = all[0].after // past every snapshot seen, those set aside below included
	}
	if convertFrom != "" && (len(all) == 0 || all[0].Key != convertFrom) {
		return info, nil, errNotNewest
	}
	var x *chunked.Examiner
	examiner := func() *chunked.Examiner {
		if x == nil {
			x = m.repo.NewExaminer()
		}
		return x
	}
	packStart := time.Now()
	var res *chunked.BuildResult
	var newest *listed
	cands := all
	standing := false // a newer snapshot that does not read is still among the project's
	for round := 0; ; round++ {
		opts := chunked.BuildOptions{Project: projectID, Label: label, Origin: convertFrom}
		if round < 3 && convertFrom == "" {
			newest, cands = m.base(ctx, examiner, projectID, cands, &opts, &standing)
		} else {
			newest = nil // no base after three that did not read: read everything, store it all
		}
		if standing {
			// A wake would try that one first: a tree equal to an older one is stored.
			opts.Newest, newest = nil, nil
		}
		res, err = m.repo.Build(ctx, src, opts)
		if !errors.Is(err, chunked.ErrBase) {
			break
		}
		// The snapshot saved over does not read (Build read nothing of the tree yet): it is
		// examined, set aside when damaged, and the save is made over the next one.
		m.log.Warn("snapshot: the snapshot a save was to be made over does not read; saving over an older one", "project", projectID, "key", opts.Base.Key, "err", err)
		aside := m.setAside(ctx, examiner(), projectID, opts.Base.Key, err)
		if _, ok := aside[opts.Base.Key]; !ok {
			standing = true
		}
		cands = slices.DeleteFunc(cands, func(l listed) bool { _, gone := aside[l.Key]; return gone })
	}
	if err != nil {
		return fail(err)
	}
	st := res.Stats
	info.Skipped = st.Walk.Skipped
	info.Tree = res.Manifest.Tree.String()
	info.Transfer.add(Phase{Name: "pack", Bytes: st.BytesRead, Duration: time.Since(packStart)})
	if res.Unchanged {
		info.Key, info.Time, info.Unchanged = newest.Key, newest.Time, true
		info.Transfer.add(Phase{Name: "upload"})
		m.log.Info("snapshot unchanged: the newest snapshot holds this content", "project", projectID, "key", info.Key, "tree", info.Tree)
		return info, res, nil
	}
	if root != nil {
		res.Manifest.RootMode, res.Manifest.RootMTime = root()
	}
	upStart := time.Now()
	for range 3 {
		info.Time = m.claim(projectID, after)
		info.Key = chunked.ManifestKey(projectID, info.Time, NewNonce())
		err = m.repo.Commit(ctx, res, info.Key)
		if !errors.Is(err, chunked.ErrTaken) {
			break
		}
	}
	if err != nil {
		return fail(err)
	}
	info.Size = st.Uploaded
	info.Transfer.add(Phase{Name: "upload", Bytes: max(st.Uploaded, 1), Duration: time.Since(upStart), Attempts: 1})
	m.log.Info("snapshot saved", "project", projectID, "key", info.Key, "format", FormatChunked, "files", st.Files,
		"read", st.Read, "new_chunks", st.NewChunks, "new_bytes", st.NewBytes, "stored", st.Uploaded, "packs", st.Packs,
		"tree", info.Tree, "ms", st.Duration.Milliseconds())
	if convertFrom != "" {
		return info, res, nil
	}
	pruned, err := m.prune(ctx, projectID, info.Key, m.cfg.Keep)
	info.Pruned = pruned
	if err != nil {
		m.log.Warn("snapshot retention failed; will retry after the next save", "project", projectID, "err", err)
	}
	return info, res, nil
}

// errNotNewest: a conversion found that the tar.gz snapshot it converts is no longer the
// project's newest (another host saved, or converted it, meanwhile).
var errNotNewest = errors.New("the snapshot is no longer the project's newest")

// convert saves the tar.gz snapshot in, just restored from f (downloaded and verified),
// as a chunked snapshot of the same content (Target.Convert), and sets in.Converted. Two
// hosts converting at once store two snapshots of one content: its chunks once (content
// addressing), the two manifests alike. The tar.gz snapshot is never deleted here.
func (m *Manager) convert(ctx context.Context, f *os.File, in *Info, allow func() error) {
	log := m.log.With("project", in.ProjectID, "key", in.Key)
	if err := allow(); err != nil {
		log.Warn("snapshot: the tar.gz snapshot restored is not converted to chunked", "err", err)
		return
	}
	label := "converted from " + in.Key
	var info Info
	var err error
	for range 2 { // a save whose reused chunks were collected meanwhile is made again
		src := &chunked.TarSource{R: io.NewSectionReader(f, 0, in.Size), Opts: m.walkOptions()}
		info, _, err = m.saveChunked(ctx, in.ProjectID, label, src, func() (uint32, int64) { return src.RootMode, src.RootMTime }, in.Key)
		if !errors.Is(err, chunked.ErrStale) {
			break
		}
	}
	switch {
	case errors.Is(err, errNotNewest):
		log.Info("snapshot: not converting the tar.gz snapshot restored: a newer snapshot appeared meanwhile")
	case err != nil:
		log.Warn("snapshot: converting the tar.gz snapshot restored to chunked failed; the next wake tries again", "err", err)
	default:
		in.Converted = info.Key
		log.Info("snapshot: converted the tar.gz snapshot restored to chunked (the tar.gz one stays until retention prunes it)",
			"converted", info.Key, "tree", info.Tree)
	}
}

// base picks what a save is made over, from cands (the project's snapshots, newest
// first): the newest whose manifest reads (one that does not is set aside as damaged; one
// pruned meanwhile is passed over). A tar.gz snapshot is no base, but its content is
// what Unchanged compares with, as a chunked base's is. It returns the one picked (nil:
// none) and the older ones, and sets standing when one it passed over is still among the
// project's snapshots.
func (m *Manager) base(ctx context.Context, examiner func() *chunked.Examiner, projectID string, cands []listed, opts *chunked.BuildOptions, standing *bool) (*listed, []listed) {
	for i := range cands {
		l := &cands[i]
		if l.Format == FormatTarGz {
			if oi, err := m.cfg.Store.Head(ctx, l.Key); err == nil {
				if d, err := chunked.ParseDigest(oi.Metadata[MetaTree]); err == nil {
					opts.Newest = &d
				}
			}
			return l, cands[i+1:]
		}
		man, err := m.repo.Manifest(ctx, l.Key)
		switch {
		case err == nil:
			opts.Base, opts.Newest = man, &man.Tree
			return l, cands[i+1:]
		case errors.Is(err, store.ErrNotFound): // pruned meanwhile
		case errors.Is(err, chunked.ErrCorrupt):
			if _, ok := m.setAside(ctx, examiner(), projectID, l.Key, err)[l.Key]; !ok {
				*standing = true
			}
		default:
			// Not known to be damaged, nor known to be sound: read everything, and store
			// the tree even if it is that snapshot's.
			m.log.Warn("snapshot: the newest snapshot cannot be read; saving without it", "project", projectID, "key", l.Key, "err", err)
			*standing = true
			return nil, cands[i+1:]
		}
	}
	return nil, nil
}

// restoreChunked restores one chunked snapshot into t. why is set when the snapshot is
// refused (Restore goes on to an older one), with cause when what the store holds is at
// fault (the snapshot is then examined, and set aside when damaged); err when the store
// keeps failing.
func (m *Manager) restoreChunked(ctx context.Context, in *Info, tr *Transfer, t Target) (why string, cause, err error) {
	in.Format = FormatChunked
	dlStart := time.Now()
	man, err := m.repo.Manifest(ctx, in.Key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return gone, nil, nil
	case errors.Is(err, chunked.ErrCorrupt):
		return "its manifest does not verify: " + err.Error(), err, nil
	case err != nil:
		return "", nil, fmt.Errorf("restore %s: %w", in.Key, err)
	}
	in.Tree, in.Label, in.Origin = man.Tree.String(), man.Label, man.Origin
	var st chunked.RestoreStats
	var rerr error
	if t.dir != nil {
		rerr = t.dir(ctx, man)
	} else {
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() { // owned by this call, which waits on done
			var err error
			st, err = m.repo.ExportLevel(ctx, man, pw, 0)
			pw.CloseWithError(err)
			done <- err
		}()
		rerr = t.Extract(pr)
		pr.CloseWithError(errors.New("the restore stopped reading"))
		if xerr := <-done; xerr != nil && (rerr == nil || errors.Is(xerr, chunked.ErrCorrupt) || errors.Is(xerr, chunked.ErrMissing) || errors.Is(xerr, tree.ErrUnsafe)) {
			rerr = xerr
		}
	}
	tr.add(Phase{Name: "download", Bytes: st.Downloaded, Duration: time.Since(dlStart), Attempts: 1})
	in.Size = st.Downloaded
	switch {
	case rerr == nil:
	case errors.Is(rerr, chunked.ErrCorrupt) || errors.Is(rerr, chunked.ErrMissing):
		return "it does not verify: " + rerr.Error(), rerr, nil
	case ctx.Err() != nil:
		return "", nil, fmt.Errorf("restore %s: %w", in.Key, rerr)
	case errors.Is(rerr, store.ErrUnreachable) || errors.Is(rerr, store.ErrAccessDenied) || errors.Is(rerr, store.ErrNoCredentials):
		return "", nil, fmt.Errorf("restore %s: %w", in.Key, rerr)
	default:
		return "extracting it failed: " + rerr.Error(), nil, nil
	}
	if t.List != nil {
		if why, err := m.checkWorkspace(ctx, man, t.List); err != nil || why != "" {
			return why, nil, err
		}
	}
	return "", nil, nil
}

// checkWorkspace compares a restored workspace, as its sandbox lists it, with the
// manifest: every entry there with its type, permission bits and size, nothing else.
func (m *Manager) checkWorkspace(ctx context.Context, man *chunked.Manifest, list func(context.Context) ([]WorkspaceEntry, error)) (string, error) {
	entries, err := m.repo.Entries(ctx, man)
	if err != nil {
		return "its manifest does not verify: " + err.Error(), nil
	}
	got, err := list(ctx)
	if err != nil {
		return "the restored workspace could not be listed: " + err.Error(), nil
	}
	have := make(map[string]WorkspaceEntry, len(got))
	for _, g := range got {
		have[path.Clean(g.Path)] = g
	}
	var bad []string
	for _, e := range entries {
		g, ok := have[e.Path]
		delete(have, e.Path)
		switch {
		case !ok:
			bad = append(bad, e.Path+" (missing)")
		case e.Type == tree.Dir && !g.Mode.IsDir(), e.Type == tree.File && !g.Mode.IsRegular(),
			e.Type == tree.Symlink && g.Mode&fs.ModeSymlink == 0:
			bad = append(bad, e.Path+" (wrong type)")
		case e.Type == tree.File && g.Size != e.Size:
			bad = append(bad, fmt.Sprintf("%s (%d bytes, want %d)", e.Path, g.Size, e.Size))
		case e.Type != tree.Symlink && g.Mode.Perm() != e.Mode:
			bad = append(bad, fmt.Sprintf("%s (mode %o, want %o)", e.Path, g.Mode.Perm(), e.Mode))
		}
	}
	if len(have) > 0 {
		// A template's files (an E2B workspace starts with some) are not the snapshot's
		// business: said, not refused.
		extra := make([]string, 0, len(have))
		for p := range have {
			extra = append(extra, p)
		}
		slices.Sort(extra)
		m.log.Info("snapshot restore: the workspace holds entries the snapshot does not", "count", len(extra), "first", extra[:min(len(extra), 5)])
	}
	if len(bad) == 0 {
		return "", nil
	}
	slices.Sort(bad)
	if len(bad) > 10 {
		bad = append(bad[:10], fmt.Sprintf("and %d more", len(bad)-10))
	}
	return "the restored workspace differs from its manifest: " + strings.Join(bad, ", "), nil
}

// restoreChunkedDir restores a chunked snapshot into a host directory, files written in
// parallel; with replace dir may hold files (moved aside, never deleted).
func (m *Manager) restoreChunkedDir(ctx context.Context, man *chunked.Manifest, dir string, replace bool) (archive.ExtractStats, error) {
	var st chunked.RestoreStats
	fill := func(target string) error {
		var err error
		st, err = m.repo.RestoreDir(ctx, man, target, tree.WriterOptions{MaxEntries: m.cfg.MaxEntries, MaxNameLen: m.cfg.MaxNameLen, MaxBytes: m.cfg.MaxBytes})
		return err
	}
	var out archive.ExtractStats
	var err error
	if replace {
		out.Backup, err = tree.Replace(dir, fill)
	} else {
		err = fill(dir)
		if err != nil {
			clearDir(dir)
		}
	}
	out.Files, out.Dirs, out.Symlinks, out.Bytes, out.Duration = st.Files, st.Dirs+1, st.Symlinks, st.Bytes, st.Duration
	return out, err
}

// manifest reads the project's chunked snapshot key (checked to be the project's).
func (m *Manager) manifest(ctx context.Context, projectID, key string) (*chunked.Manifest, error) {
	if err := m.checkKey(projectID, key); err != nil {
		return nil, err
	}
	if FormatOf(key) != FormatChunked {
		return nil, fmt.Errorf("%s is a tar.gz snapshot, written by an older version; this works on chunked snapshots (the project's next wake converts its newest snapshot; or restore this one and save it)", key)
	}
	man, err := m.repo.Manifest(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: project %s has no snapshot %s", ErrNoSuchSnapshot, projectID, key)
	}
	return man, err
}

// Resolve names a snapshot of the project: a key, the part of one after the last "/"
// (with or without its suffix), or "" for the newest.
func (m *Manager) Resolve(ctx context.Context, projectID, ref string) (string, error) {
	all, err := m.list(ctx, projectID)
	if err != nil {
		return "", err
	}
	if len(all) == 0 {
		return "", fmt.Errorf("%w: project %s", ErrNoSnapshot, projectID)
	}
	if ref == "" {
		return all[0].Key, nil
	}
	for _, l := range all {
		if l.Key == ref || path.Base(l.Key) == ref || chunked.ShortKey(l.Key) == ref || strings.TrimSuffix(path.Base(l.Key), ".tar.gz") == ref {
			return l.Key, nil
		}
	}
	return "", fmt.Errorf("%w: project %s has no snapshot %q (snapshot list shows them)", ErrNoSuchSnapshot, projectID, ref)
}

// Checkpoint is a snapshot as the agent and its user see it: when, what label.
type Checkpoint struct {
	Key    string    `json:"key"`
	Time   time.Time `json:"time"`
	Label  string    `json:"label,omitempty"`
	Format string    `json:"format"`
	Files  int       `json:"files,omitempty"`
	Bytes  int64     `json:"bytes,omitempty"`
	Origin string    `json:"origin,omitempty"`
}

// Checkpoints lists the project's snapshots, newest first, with their labels.
func (m *Manager) Checkpoints(ctx context.Context, projectID string) ([]Checkpoint, error) {
	all, err := m.list(ctx, projectID)
	if err != nil {
		return nil, err
	}
	out := make([]Checkpoint, 0, len(all))
	for _, l := range all {
		c := Checkpoint{Key: l.Key, Time: l.Time, Format: l.Format, Bytes: l.Size}
		if l.Format == FormatChunked {
			if man, err := m.repo.Manifest(ctx, l.Key); err == nil {
				c.Label, c.Files, c.Bytes, c.Origin = man.Label, man.Files, man.Bytes, man.Origin
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// Verify checks one snapshot: every chunk, file and the tree against their digests (a
// tar.gz snapshot: its archive's SHA-256 and that it reads to the end).
func (m *Manager) Verify(ctx context.Context, projectID, key string) (chunked.RestoreStats, error) {
	if FormatOf(key) == FormatTarGz {
		_, err := m.RestoreKey(ctx, projectID, key, func(r io.Reader) error {
			_, err := chunked.TarTreeDigest(r)
			return err
		})
		return chunked.RestoreStats{}, err
	}
	man, err := m.manifest(ctx, projectID, key)
	var st chunked.RestoreStats
	if err == nil {
		st, err = m.repo.Verify(ctx, man)
	}
	if !errors.Is(err, chunked.ErrCorrupt) && !errors.Is(err, chunked.ErrMissing) {
		return st, err
	}
	// Damaged, or a passing fault: examined, and set aside when damaged.
	aside := m.setAside(ctx, m.repo.NewExaminer(), projectID, key, err)
	r, ok := aside[key]
	if !ok {
		return st, err
	}
	qe := &QuarantineError{Key: key, Quarantine: r.Quarantine, Err: err}
	for k, o := range aside {
		if k != key {
			qe.Others = append(qe.Others, o)
		}
	}
	slices.SortFunc(qe.Others, func(a, b Refusal) int { return strings.Compare(b.Key, a.Key) })
	return st, qe
}

// VerifyDir compares a directory (a live workspace) with a snapshot, reading every file:
// what changed since that snapshot.
func (m *Manager) VerifyDir(ctx context.Context, projectID, key, dir string) ([]chunked.Change, error) {
	man, err := m.manifest(ctx, projectID, key)
	if err != nil {
		return nil, err
	}
	want, err := m.repo.Entries(ctx, man)
	if err != nil {
		return nil, err
	}
	res, err := m.repo.Scan(ctx, chunked.DirSource{Dir: dir, Opts: m.walkOptions()})
	if err != nil {
		return nil, err
	}
	return chunked.DiffEntries(want, res), nil
}

// Diff compares two snapshots (of one project or two: a fork and its origin) and writes
// the listing and unified diffs of changed text files to w.
func (m *Manager) Diff(ctx context.Context, w io.Writer, projectA, keyA, projectB, keyB string) ([]chunked.Change, error) {
	a, err := m.manifest(ctx, projectA, keyA)
	if err != nil {
		return nil, err
	}
	b, err := m.manifest(ctx, projectB, keyB)
	if err != nil {
		return nil, err
	}
	ea, err := m.repo.Entries(ctx, a)
	if err != nil {
		return nil, err
	}
	eb, err := m.repo.Entries(ctx, b)
	if err != nil {
		return nil, err
	}
	changes := chunked.DiffEntries(ea, eb)
	if w != nil {
		err = m.repo.TextDiff(ctx, w, changes, "a", "b")
	}
	return changes, err
}

// Export writes one snapshot as a single tar.gz (the tar.gz format's own archive, byte
// for byte, when it is one).
func (m *Manager) Export(ctx context.Context, w io.Writer, projectID, key string) error {
	if FormatOf(key) == FormatTarGz {
		_, err := m.RestoreKey(ctx, projectID, key, func(r io.Reader) error {
			_, err := io.Copy(w, r)
			return err
		})
		return err
	}
	man, err := m.manifest(ctx, projectID, key)
	if err != nil {
		return err
	}
	_, err = m.repo.Export(ctx, man, w)
	return err
}

// Fork makes project to a new project whose first snapshot is from's snapshot key (the
// newest when empty): the manifest is copied, no chunk is. The origin is also kept under
// to's forks/ (the base of a later merge). The new project must have no snapshots.
func (m *Manager) Fork(ctx context.Context, from, key, to string) (Info, error) {
	if err := ValidProjectID(to); err != nil {
		return Info{}, err
	}
	if to == from {
		return Info{}, fmt.Errorf("fork: the new project must not be %s itself", from)
	}
	if existing, err := m.list(ctx, to); err != nil {
		return Info{}, err
	} else if len(existing) > 0 {
		return Info{}, fmt.Errorf("fork: project %s has snapshots already; fork into a new project", to)
	}
	key, err := m.Resolve(ctx, from, key)
	if err != nil {
		return Info{}, err
	}
	man, err := m.manifest(ctx, from, key)
	if err != nil {
		return Info{}, err
	}
	if err := m.examineSource(ctx, from, man); err != nil {
		return Info{}, fmt.Errorf("fork %s into %s: %w", key, to, err)
	}
	t := m.claim(to, time.Time{})
	nk := chunked.ManifestKey(to, t, NewNonce())
	if _, err := m.repo.Copy(ctx, man, chunked.OriginKey(to), "origin of the fork", key); err != nil {
		return Info{}, fmt.Errorf("fork %s into %s: %w", key, to, err)
	}
	n, err := m.repo.Copy(ctx, man, nk, "fork of "+from, key)
	if err != nil {
		return Info{}, fmt.Errorf("fork %s into %s: %w", key, to, err)
	}
	m.log.Info("snapshot forked", "from", key, "to", nk)
	return Info{ProjectID: to, Key: nk, Time: t, Format: FormatChunked, Label: n.Label, Tree: n.Tree.String(), Origin: key}, nil
}

// Rewind makes the project's snapshot key its newest again, so the next wake restores it,
// without losing the present: the present (the newest snapshot, which a live session
// saves first) stays, and the rewind is a new snapshot labelled with it, so rewinding to
// the present undoes it. It returns the new snapshot and the key that undoes it.
func (m *Manager) Rewind(ctx context.Context, projectID, key string) (info Info, undo string, err error) {
	key, err = m.Resolve(ctx, projectID, key)
	if err != nil {
		return Info{}, "", err
	}
	newest, err := m.newest(ctx, projectID)
	if err != nil {
		return Info{}, "", err
	}
	undo = newest.Key
	man, err := m.manifest(ctx, projectID, key)
	if err != nil {
		return Info{}, "", err
	}
	if err := m.examineSource(ctx, projectID, man); err != nil {
		return Info{}, "", fmt.Errorf("rewind project %s to %s: %w", projectID, key, err)
	}
	t := m.claim(projectID, newest.after)
	nk := chunked.ManifestKey(projectID, t, NewNonce())
	n, err := m.repo.Copy(ctx, man, nk, "rewind to "+chunked.ShortKey(key)+" (undo: rewind to "+chunked.ShortKey(undo)+")", key)
	if err != nil {
		return Info{}, "", fmt.Errorf("rewind project %s to %s: %w", projectID, key, err)
	}
	m.log.Info("snapshot rewound", "project", projectID, "to", key, "key", nk, "undo", undo)
	info = Info{ProjectID: projectID, Key: nk, Time: t, Format: FormatChunked, Label: n.Label, Tree: n.Tree.String(), Origin: key}
	info.Pruned, _ = m.prune(ctx, projectID, nk, max(m.cfg.Keep, 2))
	return info, undo, nil
}

// MergeFork merges what the fork project changed since it was forked into its origin's
// project, as a new snapshot of the origin; conflicts are returned and nothing is written.
func (m *Manager) MergeFork(ctx context.Context, fork string) (*chunked.MergeResult, Info, error) {
	base, err := m.repo.Manifest(ctx, chunked.OriginKey(fork))
	if err != nil {
		return nil, Info{}, fmt.Errorf("project %s is not a fork (no origin kept): %w", fork, err)
	}
	origin, _, ok := chunked.ParseManifestKey(base.Origin)
	if !ok {
		return nil, Info{}, fmt.Errorf("project %s: its origin %q is not a snapshot key", fork, base.Origin)
	}
	theirsKey, err := m.Resolve(ctx, fork, "")
	if err != nil {
		return nil, Info{}, err
	}
	oursKey, err := m.Resolve(ctx, origin, "")
	if err != nil {
		return nil, Info{}, err
	}
	theirs, err := m.manifest(ctx, fork, theirsKey)
	if err != nil {
		return nil, Info{}, err
	}
	ours, err := m.manifest(ctx, origin, oursKey)
	if err != nil {
		return nil, Info{}, err
	}
	res, err := m.repo.Merge(ctx, base, ours, theirs)
	if err != nil || len(res.Conflicts) > 0 {
		return res, Info{}, err
	}
	newest, err := m.newest(ctx, origin)
	if err != nil {
		return res, Info{}, err
	}
	t := m.claim(origin, newest.after)
	nk := chunked.ManifestKey(origin, t, NewNonce())
	n, err := m.repo.CommitMerge(ctx, res, ours, nk, "merge of "+fork)
	if err != nil {
		return res, Info{}, err
	}
	return res, Info{ProjectID: origin, Key: nk, Time: t, Format: FormatChunked, Label: n.Label, Tree: n.Tree.String()}, nil
}

// Collect removes the chunks no snapshot of any project references any more (see
// internal/chunked: mark, then sweep a grace period later).
func (m *Manager) Collect(ctx context.Context) (chunked.CollectStats, error) {
	return m.repo.Collect(ctx)
}

// SaveTree saves a sandbox's workspace listed and read by its agent (tree.Source) in the
// chunked format: only the files whose size or times changed since the project's newest
// snapshot are read.
func (m *Manager) SaveTree(ctx context.Context, projectID, label string, src tree.Source, excludes []string) (Info, error) {
	if excludes == nil {
		excludes = m.cfg.Excludes
	}
	l := treeLister{src: src, excludes: excludes}
	var info Info
	var res *chunked.BuildResult
	var err error
	for range 2 { // a save whose reused chunks were collected meanwhile is made again
		info, res, err = m.saveChunked(ctx, projectID, label, l, nil, "")
		if !errors.Is(err, chunked.ErrStale) {
			break
		}
	}
	if res != nil {
		info.Skips = append(info.Skips, res.Stats.Walk.Skips...)
	}
	return info, err
}

// treeLister is a tree.Source as a chunked.Lister.
type treeLister struct {
	src      tree.Source
	excludes []string
}

func (t treeLister) List(ctx context.Context) ([]tree.Entry, tree.WalkStats, error) {
	return t.src.TreeList(ctx, t.excludes)
}

func (t treeLister) Read(ctx context.Context, paths []string, fn func(tree.Entry, io.Reader) error) error {
	return t.src.TreeRead(ctx, paths, fn)
}
