// Package snapshot saves a workspace to an object store as one tar.gz per sync, keeps the
// newest few per project, and restores the newest one that verifies.
//
// Keys: projects/{project_id}/snapshots/{YYYYMMDDTHHMMSSZ}.tar.gz, the UTC time the save
// started. A second save in the same second gets the key with "_01" before ".tar.gz",
// then "_02" and so on up to "_99": '_' sorts after '.', so lexical order of the keys is
// still the order of the saves, and the newest snapshot is the last key. The PUT is
// conditional (If-None-Match: *), so two savers racing for the same key cannot overwrite
// each other either.
//
// Integrity: the SHA-256 of the archive, computed while packing, is stored as the object's
// metadata "sha256" in the same PUT. Restore downloads to a temp file, verifies size and
// SHA-256, and only then extracts; a snapshot that does not verify is skipped (and
// logged) for the previous one.
//
// Failure: a Save that cannot store its snapshot after Retries retries returns an error
// wrapping ErrSaveFailed. The caller (a session) logs it and carries on; the next Save
// tries again from scratch.
package snapshot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/toolhost/toolhost/core/archive"
	"github.com/toolhost/toolhost/core/store"
)

// Errors callers branch on; test with errors.Is.
var (
	// ErrSaveFailed: a Save did not store its snapshot. The wrapped cause says why.
	ErrSaveFailed = errors.New("snapshot save failed")
	// ErrNoSnapshot: the project has no snapshot to restore.
	ErrNoSnapshot = errors.New("no snapshot")
	// ErrCorrupt: every snapshot of the project failed verification.
	ErrCorrupt = errors.New("no snapshot verifies")
	// ErrInvalidProject: the project ID cannot be used in a key.
	ErrInvalidProject = errors.New("invalid project id")
)

// MetaSHA256 is the object metadata key holding the archive's hex SHA-256.
const MetaSHA256 = "sha256"

// Defaults applied by New to zero Config fields.
const (
	DefaultKeep           = 5
	DefaultRetries        = 3
	DefaultBackoff        = time.Second
	DefaultMaxBackoff     = 30 * time.Second
	DefaultAttemptTimeout = 15 * time.Minute
	MaxProjectIDLen       = 128
)

// Config configures a Manager. Store is required.
type Config struct {
	Store store.Store
	// Keep is how many snapshots per project retention keeps (the newest); 0 means
	// DefaultKeep, a negative value keeps everything.
	Keep int
	// Excludes are the base names SaveDir leaves out; nil means archive.DefaultExcludes.
	Excludes []string
	// Retries is how many times a failed upload (or download) is retried; 0 means
	// DefaultRetries, a negative value means none.
	Retries int
	// Backoff is the wait before the first retry, doubling for each next one up to
	// MaxBackoff, with jitter; 0 means DefaultBackoff / DefaultMaxBackoff.
	Backoff    time.Duration
	MaxBackoff time.Duration
	// AttemptTimeout bounds one upload or download attempt; 0 means DefaultAttemptTimeout.
	AttemptTimeout time.Duration
	// TempDir holds the archive between packing and upload (and download and extract);
	// empty means os.TempDir().
	TempDir string
	// Logger receives a record for every save, retry, retention delete and restore;
	// nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock naming snapshots; nil means time.Now.
	Now func() time.Time
	// Progress, when set, is called from the working goroutine as bytes move.
	Progress func(Progress)
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

// Info describes one snapshot.
type Info struct {
	ProjectID string
	Key       string
	// Time is the UTC second the save started, from the key.
	Time time.Time
	// Seq tells apart saves within the same second (0 for the first).
	Seq  int
	Size int64
	// SHA256 is the archive's hex digest; List leaves it empty (it needs a HEAD each).
	SHA256 string
	// Attempts is the number of upload (Save) or download (Restore) attempts made.
	Attempts int
	// Pruned lists the keys retention deleted after this Save.
	Pruned []string
}

// Manager saves, lists and restores snapshots. It is safe for concurrent use.
type Manager struct {
	cfg Config
	log *slog.Logger
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
	if cfg.AttemptTimeout <= 0 {
		cfg.AttemptTimeout = DefaultAttemptTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Manager{cfg: cfg, log: cfg.Logger.With("component", "snapshot")}, nil
}

var projectRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// ValidProjectID reports why id cannot name a project, or nil: 1 to 128 characters of
// letters, digits, '.', '_' and '-', starting with a letter or digit, without "..".
func ValidProjectID(id string) error {
	if len(id) == 0 || len(id) > MaxProjectIDLen || !projectRE.MatchString(id) || strings.Contains(id, "..") {
		return fmt.Errorf("%w %q: use 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit", ErrInvalidProject, id, MaxProjectIDLen)
	}
	return nil
}

// Prefix is the folder of a project's snapshots, ending in "/".
func Prefix(projectID string) string { return "projects/" + projectID + "/snapshots/" }

const timeLayout = "20060102T150405Z"

// Key names the snapshot of projectID started at t (seq > 0 for later saves in the
// same second).
func Key(projectID string, t time.Time, seq int) string {
	k := Prefix(projectID) + t.UTC().Format(timeLayout)
	if seq > 0 {
		k += fmt.Sprintf("_%02d", seq)
	}
	return k + ".tar.gz"
}

var keyRE = regexp.MustCompile(`^(\d{8}T\d{6}Z)(?:_(\d{2}))?\.tar\.gz$`)

// ParseKey reads a snapshot key back; ok is false for any other object.
func ParseKey(key string) (projectID string, t time.Time, seq int, ok bool) {
	rest, found := strings.CutPrefix(key, "projects/")
	if !found {
		return "", time.Time{}, 0, false
	}
	projectID, name, found := strings.Cut(rest, "/snapshots/")
	if !found || ValidProjectID(projectID) != nil {
		return "", time.Time{}, 0, false
	}
	m := keyRE.FindStringSubmatch(name)
	if m == nil {
		return "", time.Time{}, 0, false
	}
	t, err := time.Parse(timeLayout, m[1])
	if err != nil {
		return "", time.Time{}, 0, false
	}
	if m[2] != "" {
		seq, _ = strconv.Atoi(m[2])
		if seq == 0 { // "_00" is never written
			return "", time.Time{}, 0, false
		}
	}
	return projectID, t, seq, true
}

const maxSeq = 99

// Save packs a snapshot by calling pack with a writer, then stores it with one PUT,
// retrying failures with backoff, and applies retention. The archive goes through a temp
// file, hashed on the way, so the upload can be rewound and verified later.
//
// Any failure, the pack's included, returns an error wrapping ErrSaveFailed (and, for a
// bad project ID, ErrInvalidProject). Retention problems after a successful PUT are only
// logged: the snapshot is saved.
func (m *Manager) Save(ctx context.Context, projectID string, pack func(io.Writer) error) (Info, error) {
	info := Info{ProjectID: projectID}
	if err := ValidProjectID(projectID); err != nil {
		return info, fmt.Errorf("%w: %w", ErrSaveFailed, err)
	}
	start := m.cfg.Now().UTC().Truncate(time.Second)
	info.Time = start
	fail := func(err error) (Info, error) {
		m.log.Error("snapshot save failed", "project", projectID, "attempts", info.Attempts, "err", err)
		return info, fmt.Errorf("%w: project %s: %w", ErrSaveFailed, projectID, err)
	}

	f, err := os.CreateTemp(m.cfg.TempDir, "toolhost-snapshot-*.tar.gz")
	if err != nil {
		return fail(fmt.Errorf("temp file: %w", err))
	}
	defer func() { f.Close(); os.Remove(f.Name()) }()
	packStart := time.Now()
	h := sha256.New()
	pw := &progressWriter{w: io.MultiWriter(f, h), report: m.reporter(projectID, "pack", -1)}
	if err := pack(pw); err != nil {
		return fail(fmt.Errorf("pack: %w", err))
	}
	packDur := time.Since(packStart)
	info.Size = pw.n
	info.SHA256 = hex.EncodeToString(h.Sum(nil))

	uploadStart := time.Now()
	for attempt := 0; ; attempt++ {
		info.Attempts = attempt + 1
		key, err := m.upload(ctx, f, &info)
		if err == nil {
			info.Key = key
			_, _, info.Seq, _ = ParseKey(key)
			break
		}
		if attempt >= m.cfg.Retries || ctx.Err() != nil {
			return fail(err)
		}
		wait := m.backoff(attempt)
		m.log.Warn("snapshot upload failed, retrying", "project", projectID, "attempt", info.Attempts,
			"of", m.cfg.Retries+1, "backoff_ms", wait.Milliseconds(), "err", err)
		if err := sleep(ctx, wait); err != nil {
			return fail(err)
		}
	}
	m.log.Info("snapshot saved", "project", projectID, "key", info.Key, "bytes", info.Size,
		"sha256", info.SHA256, "attempts", info.Attempts,
		"pack_ms", packDur.Milliseconds(), "upload_ms", time.Since(uploadStart).Milliseconds())

	pruned, err := m.prune(ctx, projectID, info.Key)
	info.Pruned = pruned
	if err != nil {
		m.log.Warn("snapshot retention failed; will retry after the next save", "project", projectID, "err", err)
	}
	return info, nil
}

// upload stores the archive in f under the first free key for info.Time, and returns it.
func (m *Manager) upload(ctx context.Context, f *os.File, info *Info) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.AttemptTimeout)
	defer cancel()
	for seq := 0; seq <= maxSeq; seq++ {
		key := Key(info.ProjectID, info.Time, seq)
		// A HEAD first: some S3-compatible stores ignore If-None-Match.
		oi, err := m.cfg.Store.Head(ctx, key)
		if err == nil {
			if oi.Metadata[MetaSHA256] == info.SHA256 && oi.Size == info.Size {
				return key, nil // our own earlier attempt landed, its answer was lost
			}
			continue
		}
		if !errors.Is(err, store.ErrNotFound) {
			return "", fmt.Errorf("check %s: %w", key, err)
		}
		body := &progressFile{f: f, report: m.reporter(info.ProjectID, "upload", info.Size)}
		_, err = m.cfg.Store.Put(ctx, key, body, store.PutOptions{
			Size:        info.Size,
			ContentType: "application/gzip",
			Metadata:    map[string]string{MetaSHA256: info.SHA256},
			IfNotExists: true,
		})
		if errors.Is(err, store.ErrExists) {
			// Someone else's snapshot, or ours from a try whose answer was lost.
			if oi, herr := m.cfg.Store.Head(ctx, key); herr == nil && oi.Metadata[MetaSHA256] == info.SHA256 && oi.Size == info.Size {
				return key, nil
			}
			continue
		}
		if err != nil {
			return "", err
		}
		return key, nil
	}
	return "", fmt.Errorf("more than %d snapshots in the second %s", maxSeq+1, info.Time.Format(timeLayout))
}

// prune deletes all but the newest Keep snapshots of the project, never keep.
func (m *Manager) prune(ctx context.Context, projectID, keep string) ([]string, error) {
	if m.cfg.Keep < 0 {
		return nil, nil
	}
	start := time.Now()
	infos, err := m.List(ctx, projectID)
	if err != nil {
		return nil, err
	}
	// The snapshot just written always stays and counts towards Keep, even when it is
	// not the newest (a clock that went back).
	budget := m.cfg.Keep
	if slices.ContainsFunc(infos, func(i Info) bool { return i.Key == keep }) {
		budget--
	}
	var doomed []string
	for _, in := range infos { // newest first
		if in.Key == keep {
			continue
		}
		if budget > 0 {
			budget--
			continue
		}
		doomed = append(doomed, in.Key)
	}
	if len(doomed) == 0 {
		return nil, nil
	}
	if err := m.cfg.Store.Delete(ctx, doomed...); err != nil {
		return nil, fmt.Errorf("delete %d old snapshots: %w", len(doomed), err)
	}
	for _, k := range doomed {
		m.log.Info("snapshot retention delete", "project", projectID, "key", k)
	}
	m.log.Info("snapshot retention", "project", projectID, "kept", m.cfg.Keep, "deleted", len(doomed),
		"ms", time.Since(start).Milliseconds())
	return doomed, nil
}

// List returns the project's snapshots, newest first. Objects under the prefix that are
// not snapshot keys are ignored.
func (m *Manager) List(ctx context.Context, projectID string) ([]Info, error) {
	if err := ValidProjectID(projectID); err != nil {
		return nil, err
	}
	objs, err := store.ListAll(ctx, m.cfg.Store, Prefix(projectID))
	if err != nil {
		return nil, fmt.Errorf("list snapshots of %s: %w", projectID, err)
	}
	var infos []Info
	for _, o := range objs {
		pid, t, seq, ok := ParseKey(o.Key)
		if !ok || pid != projectID {
			continue
		}
		infos = append(infos, Info{ProjectID: pid, Key: o.Key, Time: t, Seq: seq, Size: o.Size})
	}
	slices.SortFunc(infos, func(a, b Info) int { return strings.Compare(b.Key, a.Key) })
	return infos, nil
}

// Restore finds the newest snapshot of the project that verifies, and calls extract
// with its bytes. Snapshots are downloaded to a temp file and checked against their
// stored size and SHA-256 first; one that does not verify (or has no checksum) is logged
// and skipped for the previous one. A download that fails for other reasons is retried
// like an upload, and then fails the Restore: an older snapshot is not silently restored
// because the store is unreachable.
//
// It returns ErrNoSnapshot when the project has none, ErrCorrupt when none verifies.
// extract's error is returned as is, wrapped; extract is called at most once.
func (m *Manager) Restore(ctx context.Context, projectID string, extract func(io.Reader) error) (Info, error) {
	start := time.Now()
	if err := ValidProjectID(projectID); err != nil {
		return Info{ProjectID: projectID}, err
	}
	var infos []Info
	err := m.retry(ctx, "list", projectID, func(ctx context.Context) error {
		var err error
		infos, err = m.List(ctx, projectID)
		return err
	})
	if err != nil {
		return Info{ProjectID: projectID}, fmt.Errorf("restore %s: %w", projectID, err)
	}
	if len(infos) == 0 {
		return Info{ProjectID: projectID}, fmt.Errorf("restore %s: %w", projectID, ErrNoSnapshot)
	}
	f, err := os.CreateTemp(m.cfg.TempDir, "toolhost-restore-*.tar.gz")
	if err != nil {
		return Info{ProjectID: projectID}, fmt.Errorf("restore %s: temp file: %w", projectID, err)
	}
	defer func() { f.Close(); os.Remove(f.Name()) }()

	for _, in := range infos {
		dlStart := time.Now()
		ok, err := m.download(ctx, f, &in)
		if err != nil {
			return in, fmt.Errorf("restore %s: %w", in.Key, err)
		}
		if !ok {
			continue
		}
		dlDur := time.Since(dlStart)
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return in, fmt.Errorf("restore %s: %w", in.Key, err)
		}
		exStart := time.Now()
		pr := &progressFile{f: f, report: m.reporter(projectID, "extract", in.Size)}
		if err := extract(pr); err != nil {
			m.log.Error("snapshot extract failed", "project", projectID, "key", in.Key, "err", err)
			return in, fmt.Errorf("restore %s: extract: %w", in.Key, err)
		}
		m.log.Info("snapshot restored", "project", projectID, "key", in.Key, "bytes", in.Size,
			"attempts", in.Attempts, "download_ms", dlDur.Milliseconds(),
			"extract_ms", time.Since(exStart).Milliseconds(), "total_ms", time.Since(start).Milliseconds())
		return in, nil
	}
	return Info{ProjectID: projectID}, fmt.Errorf("restore %s: %w (%d tried)", projectID, ErrCorrupt, len(infos))
}

// download fetches in.Key into f (truncated first) and verifies it. ok is false when the
// snapshot is gone or does not verify; err is set when the store keeps failing.
func (m *Manager) download(ctx context.Context, f *os.File, in *Info) (ok bool, err error) {
	for attempt := 0; ; attempt++ {
		in.Attempts = attempt + 1
		ok, retry, err := m.downloadOnce(ctx, f, in)
		if err == nil || !retry {
			return ok, err
		}
		if attempt >= m.cfg.Retries || ctx.Err() != nil {
			if errors.Is(err, store.ErrChecksum) && ctx.Err() == nil {
				// The store's own checksum fails on every read: the stored bytes are bad.
				m.log.Warn("snapshot is corrupt (store checksum mismatch on every try), falling back to the previous one",
					"project", in.ProjectID, "key", in.Key, "attempts", in.Attempts, "err", err)
				return false, nil
			}
			return false, err
		}
		wait := m.backoff(attempt)
		m.log.Warn("snapshot download failed, retrying", "project", in.ProjectID, "key", in.Key,
			"attempt", in.Attempts, "backoff_ms", wait.Milliseconds(), "err", err)
		if err := sleep(ctx, wait); err != nil {
			return false, err
		}
	}
}

func (m *Manager) downloadOnce(ctx context.Context, f *os.File, in *Info) (ok, retry bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.AttemptTimeout)
	defer cancel()
	if err := f.Truncate(0); err != nil {
		return false, false, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return false, false, err
	}
	rc, oi, err := m.cfg.Store.Get(ctx, in.Key)
	if errors.Is(err, store.ErrNotFound) {
		m.log.Warn("snapshot vanished before download (retention?), trying the previous one", "project", in.ProjectID, "key", in.Key)
		return false, false, nil
	}
	if err != nil {
		return false, true, err
	}
	defer rc.Close()
	want := oi.Metadata[MetaSHA256]
	h := sha256.New()
	pw := &progressWriter{w: io.MultiWriter(f, h), report: m.reporter(in.ProjectID, "download", oi.Size)}
	if _, err := io.Copy(pw, ctxReader{ctx, rc}); err != nil {
		return false, true, fmt.Errorf("download: %w", err)
	}
	in.Size = pw.n
	in.SHA256 = hex.EncodeToString(h.Sum(nil))
	switch {
	case want == "":
		m.log.Warn("snapshot has no checksum, skipping it for the previous one", "project", in.ProjectID, "key", in.Key)
		return false, false, nil
	case oi.Size > 0 && pw.n != oi.Size:
		return false, true, fmt.Errorf("download: got %d of %d bytes", pw.n, oi.Size)
	case in.SHA256 != want:
		m.log.Warn("snapshot is corrupt (SHA-256 mismatch), falling back to the previous one", "project", in.ProjectID,
			"key", in.Key, "want", want, "got", in.SHA256, "bytes", pw.n)
		return false, false, nil
	}
	return true, false, nil
}

// SaveDir saves dir with archive.Pack and the Manager's Excludes.
func (m *Manager) SaveDir(ctx context.Context, projectID, dir string) (Info, archive.PackStats, error) {
	var st archive.PackStats
	info, err := m.Save(ctx, projectID, func(w io.Writer) error {
		var err error
		st, err = archive.Pack(ctx, w, dir, archive.PackOptions{Excludes: m.cfg.Excludes})
		return err
	})
	if err == nil {
		m.log.Info("snapshot packed", "project", projectID, "dir", dir, "files", st.Files, "dirs", st.Dirs,
			"symlinks", st.Symlinks, "skipped", st.Skipped, "bytes_in", st.BytesIn, "bytes_out", st.BytesOut,
			"pack_ms", st.Duration.Milliseconds())
	}
	return info, st, err
}

// RestoreDir restores the newest good snapshot into dir with archive.Extract, which wants
// dir empty or absent. With replace, archive.ExtractReplace is used instead: dir may hold
// files, which are moved aside to ExtractStats.Backup (never deleted) once the new tree
// is complete.
func (m *Manager) RestoreDir(ctx context.Context, projectID, dir string, replace bool) (Info, archive.ExtractStats, error) {
	var st archive.ExtractStats
	info, err := m.Restore(ctx, projectID, func(r io.Reader) error {
		var err error
		if replace {
			st, err = archive.ExtractReplace(ctx, r, dir, archive.ExtractOptions{})
		} else {
			st, err = archive.Extract(ctx, r, dir, archive.ExtractOptions{})
		}
		return err
	})
	if err == nil && st.Backup != "" {
		m.log.Info("snapshot restore moved the previous tree aside", "project", projectID, "dir", dir, "backup", st.Backup)
	}
	return info, st, err
}

// retry runs fn with the Manager's retries and backoff, each try bounded by
// AttemptTimeout.
func (m *Manager) retry(ctx context.Context, what, projectID string, fn func(context.Context) error) error {
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, m.cfg.AttemptTimeout)
		err := fn(actx)
		cancel()
		if err == nil {
			return nil
		}
		if attempt >= m.cfg.Retries || ctx.Err() != nil {
			return err
		}
		wait := m.backoff(attempt)
		m.log.Warn("snapshot "+what+" failed, retrying", "project", projectID, "attempt", attempt+1,
			"backoff_ms", wait.Milliseconds(), "err", err)
		if err := sleep(ctx, wait); err != nil {
			return err
		}
	}
}

func (m *Manager) backoff(attempt int) time.Duration {
	d := m.cfg.Backoff << min(attempt, 20)
	if d <= 0 || d > m.cfg.MaxBackoff {
		d = m.cfg.MaxBackoff
	}
	// Equal jitter: between half and all of d.
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
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
