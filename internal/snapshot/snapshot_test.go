package snapshot_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/archive"
	"github.com/toolhost/toolhost/internal/snapshot"
	dirstore "github.com/toolhost/toolhost/internal/store/dir"
	s3store "github.com/toolhost/toolhost/internal/store/s3"
	"github.com/toolhost/toolhost/internal/store/s3/s3test"
)

var srv *s3test.Server

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" { // a saver process of TestFourProcessesSaveOneProject
		os.Exit(m.Run())
	}
	for _, k := range []string{"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_REGION", "AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION"} {
		os.Unsetenv(k)
	}
	var err error
	srv, err = s3test.Start("")
	if err != nil {
		log.Fatalf("start versitygw: %v", err)
	}
	code := m.Run()
	cleanupBench()
	if err := srv.Close(); err != nil {
		log.Printf("stop versitygw: %v", err)
	}
	os.Exit(code)
}

// backend is a store under test plus a way to reach an object's bytes on disk.
type backend struct {
	name string
	s    store.Store
	file func(key string) string
}

func newS3(t *testing.T, endpoint string, mod func(*s3store.Config)) backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bucket, err := srv.NewBucket(ctx, "snap")
	if err != nil {
		t.Fatal(err)
	}
	cfg := s3store.Config{
		Bucket: bucket, Endpoint: endpoint, PathStyle: true, Region: s3test.Region,
		AccessKeyID: s3test.AccessKey, SecretAccessKey: s3test.SecretKey,
		MaxBackoff: 5 * time.Millisecond, TempDir: t.TempDir(),
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := s3store.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return backend{"s3", s, func(key string) string { return srv.ObjectPath(bucket, key) }}
}

func newDir(t *testing.T) backend {
	t.Helper()
	s, err := dirstore.New(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return backend{"dir", s, func(key string) string { return filepath.Join(s.Dir(), "data", filepath.FromSlash(key)) }}
}

func backends(t *testing.T) []backend {
	return []backend{newS3(t, srv.Endpoint, nil), newDir(t)}
}

// clock is a settable fake clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// logBuf collects slog records as text.
type logBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}
func (l *logBuf) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.buf.String() }

func newManager(t *testing.T, s store.Store, mod func(*snapshot.Config)) (*snapshot.Manager, *clock, *logBuf) {
	t.Helper()
	clk := &clock{t: time.Date(2026, 11, 21, 9, 30, 0, 0, time.UTC)}
	logs := &logBuf{}
	cfg := snapshot.Config{
		Store: s, Now: clk.Now, Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		TempDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mod != nil {
		mod(&cfg)
	}
	m, err := snapshot.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", logs.String())
		}
	})
	return m, clk, logs
}

// tarGz returns a tar.gz holding one file with the given content.
func tarGz(t *testing.T, name, content string) []byte {
	t.Helper()
	return tarGzOf(name, content)
}

func tarGzOf(name, content string) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(content)), ModTime: time.Unix(1700000000, 0)})
	tw.Write([]byte(content))
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

func saveContent(t *testing.T, m *snapshot.Manager, project, content string) snapshot.Info {
	t.Helper()
	data := tarGz(t, "note.txt", content)
	info, err := m.Save(context.Background(), project, func(w io.Writer) error { _, err := w.Write(data); return err })
	if err != nil {
		t.Fatalf("Save %s: %v", project, err)
	}
	return info
}

// saveOld stores a tar.gz snapshot holding note.txt with content, as an older version
// did (putTarGz), taken at the clock's time.
func saveOld(t *testing.T, st store.Store, clk *clock, project, content string) snapshot.Info {
	t.Helper()
	return putTarGz(t, st, project, clk.Now(), tarGz(t, "note.txt", content))
}

// restoreContent restores the project and returns note.txt's content.
func restoreContent(t *testing.T, m *snapshot.Manager, project string) (snapshot.Info, string, error) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ws")
	info, _, err := m.RestoreDir(context.Background(), project, dir, false)
	if err != nil {
		return info, "", err
	}
	b, err := os.ReadFile(filepath.Join(dir, "note.txt"))
	return info, string(b), err
}

func keysOf(infos []snapshot.Info) []string {
	var ks []string
	for _, i := range infos {
		ks = append(ks, strings.TrimPrefix(i.Key, "projects/"))
	}
	return ks
}

func TestKeys(t *testing.T) {
	ts := time.Date(2026, 1, 2, 3, 4, 5, 42_999_999, time.FixedZone("X", 3600))
	k := snapshot.Key("p", ts, "7f3a9c")
	if k != "projects/p/snapshots/20260102T020405Z-042-7f3a9c.tar.gz" {
		t.Errorf("key %q", k)
	}
	pid, pt, ok := snapshot.ParseKey(k)
	if !ok || pid != "p" || !pt.Equal(ts.Truncate(time.Millisecond)) {
		t.Errorf("ParseKey(%q) = %q %v %v", k, pid, pt, ok)
	}
	// Keys sort in time order, to the millisecond, across seconds and with any nonce.
	keys := []string{
		snapshot.Key("p", ts, "ffffff"), snapshot.Key("p", ts.Add(time.Millisecond), "000000"),
		snapshot.Key("p", ts.Add(957*time.Millisecond), "abcdef"), snapshot.Key("p", ts.Add(958*time.Millisecond), "000001"),
		snapshot.Key("p", ts.Add(time.Hour), snapshot.NewNonce()),
	}
	for i := 1; i < len(keys); i++ {
		if keys[i-1] >= keys[i] {
			t.Errorf("%q does not sort before %q", keys[i-1], keys[i])
		}
	}
	// Keys of older versions still parse, to the second.
	for _, old := range []string{"projects/p/snapshots/20260102T020405Z.tar.gz", "projects/p/snapshots/20260102T020405Z_07.tar.gz"} {
		if pid, pt, ok := snapshot.ParseKey(old); !ok || pid != "p" || !pt.Equal(ts.Truncate(time.Second)) {
			t.Errorf("ParseKey(%q) = %q %v %v", old, pid, pt, ok)
		}
	}
	for _, k := range []string{"projects/p/snapshots/README", "projects/p/snapshots/20260102T020405Z_00.tar.gz",
		"projects/p/snapshots/2026.tar.gz", "projects/a/b/snapshots/20260102T020405Z.tar.gz",
		"other/p/snapshots/20260102T020405Z.tar.gz", "projects/p/snapshots/20260102T020405Z-042-7F3A9C.tar.gz",
		"projects/p/snapshots/20260102T020405Z-42-7f3a9c.tar.gz", "projects/p/snapshots/20260102T020405Z-042-7f3a9c.tar.gz.tmp"} {
		if _, _, ok := snapshot.ParseKey(k); ok {
			t.Errorf("ParseKey(%q) accepted a foreign key", k)
		}
	}
	for _, id := range []string{"", "a/b", "..", ".", "../x", "a..b", "-x", strings.Repeat("a", 129), "a b", "ü"} {
		if err := snapshot.ValidProjectID(id); !errors.Is(err, snapshot.ErrInvalidProject) {
			t.Errorf("project %q accepted", id)
		}
	}
	for _, id := range []string{"1", "10", "p-1", "my_app.v2", strings.Repeat("a", 128)} {
		if err := snapshot.ValidProjectID(id); err != nil {
			t.Errorf("project %q refused: %v", id, err)
		}
	}
}

func TestInvalidProject(t *testing.T) {
	m, _, _ := newManager(t, newDir(t).s, nil)
	_, err := m.Save(context.Background(), "../other", func(io.Writer) error { return nil })
	if !errors.Is(err, snapshot.ErrSaveFailed) || !errors.Is(err, snapshot.ErrInvalidProject) {
		t.Errorf("Save with a bad project: %v", err)
	}
	if _, err := m.List(context.Background(), "a/b"); !errors.Is(err, snapshot.ErrInvalidProject) {
		t.Errorf("List with a bad project: %v", err)
	}
	if _, err := m.Restore(context.Background(), "..", func(io.Reader) error { return nil }); !errors.Is(err, snapshot.ErrInvalidProject) {
		t.Errorf("Restore with a bad project: %v", err)
	}
}

// keep+2 saves in one millisecond (the clock stands still), for keep 1 to 5: each gets
// a key past the one before, retention keeps the newest, and restore returns the last.
// (The freed keys of the first saves are never taken again.)
func TestKeepPlusTwoSavesInOneMillisecond(t *testing.T) {
	for _, b := range backends(t) {
		for keep := 1; keep <= 5; keep++ {
			t.Run(fmt.Sprintf("%s/keep-%d", b.name, keep), func(t *testing.T) {
				project := fmt.Sprintf("k%d", keep)
				m, _, _ := newManager(t, b.s, func(c *snapshot.Config) { c.Keep = keep })
				var infos []snapshot.Info
				for i := range keep + 2 {
					infos = append(infos, saveContent(t, m, project, fmt.Sprintf("save %d", i)))
					if i > 0 && infos[i].Key <= infos[i-1].Key {
						t.Errorf("save %d: key %s does not sort after %s", i, infos[i].Key, infos[i-1].Key)
					}
				}
				list, err := m.List(context.Background(), project)
				if err != nil {
					t.Fatal(err)
				}
				if len(list) != keep || list[0].Key != infos[keep+1].Key {
					t.Errorf("kept %q, want the newest %d", keysOf(list), keep)
				}
				if _, got, err := restoreContent(t, m, project); err != nil || got != fmt.Sprintf("save %d", keep+1) {
					t.Errorf("Restore got %q, %v; want the last save", got, err)
				}
			})
		}
	}
}

// A, B, A within one millisecond: the third save is not "unchanged" (that compares with
// the newest snapshot only) and restore returns A. Saving the newest again is unchanged.
func TestABA(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			m, _, _ := newManager(t, b.s, nil)
			a1 := saveContent(t, m, "aba", "A")
			bb := saveContent(t, m, "aba", "B")
			a2 := saveContent(t, m, "aba", "A")
			if a2.Unchanged || a2.Key == a1.Key || a2.Key <= bb.Key {
				t.Errorf("A after B deduplicated onto %s (B is %s): %+v", a1.Key, bb.Key, a2)
			}
			if _, got, err := restoreContent(t, m, "aba"); err != nil || got != "A" {
				t.Errorf("restore after A-B-A: %q %v", got, err)
			}
			a3 := saveContent(t, m, "aba", "A")
			if !a3.Unchanged || a3.Key != a2.Key {
				t.Errorf("saving the newest snapshot's archive again: %+v", a3)
			}
			if p, ok := a3.Transfer.Phase("upload"); !ok || p.Bytes != 0 || !strings.Contains(a3.Transfer.String(), "upload none (unchanged") {
				t.Errorf("an unchanged save's transfer: %s", a3.Transfer)
			}
			list, _ := m.List(context.Background(), "aba")
			if len(list) != 3 {
				t.Errorf("%d snapshots, want 3: %q", len(list), keysOf(list))
			}
		})
	}
}

// Concurrent saves racing for the same second never overwrite each other: each lands
// under its own key, holding what its saver meant.
func TestConcurrentSavesSameSecond(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			m, _, _ := newManager(t, b.s, func(c *snapshot.Config) { c.Keep = -1 })
			const n = 6
			var wg sync.WaitGroup
			infos := make([]snapshot.Info, n)
			errs := make([]error, n)
			for i := range n {
				wg.Go(func() {
					data := tarGz(t, "note.txt", fmt.Sprintf("writer %d", i))
					infos[i], errs[i] = m.Save(context.Background(), "race", func(w io.Writer) error { _, err := w.Write(data); return err })
				})
			}
			wg.Wait()
			seen := map[string]bool{}
			for i := range n {
				if errs[i] != nil {
					t.Fatalf("save %d: %v", i, errs[i])
				}
				if seen[infos[i].Key] {
					t.Errorf("two saves got key %s", infos[i].Key)
				}
				seen[infos[i].Key] = true
			}
			list, _ := m.List(context.Background(), "race")
			if len(list) != n {
				t.Errorf("%d snapshots stored, want %d: %q", len(list), n, keysOf(list))
			}
			// Every stored snapshot is the one its saver meant (nothing overwritten).
			for i, in := range infos {
				dst := filepath.Join(t.TempDir(), "ws")
				_, _, err := m.RestoreDirKey(context.Background(), "race", in.Key, dst, false)
				got, _ := os.ReadFile(filepath.Join(dst, "note.txt"))
				if err != nil || string(got) != fmt.Sprintf("writer %d", i) {
					t.Errorf("%s holds %q (%v), want writer %d's", in.Key, got, err, i)
				}
			}
		})
	}
}

func TestRetention7To5AndPrefixIsolation(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			m, clk, logs := newManager(t, b.s, nil)
			var p1 []snapshot.Info
			for i := range 3 {
				saveContent(t, m, "10", fmt.Sprintf("ten %d", i))
				clk.Add(time.Minute)
			}
			for i := range 7 {
				p1 = append(p1, saveContent(t, m, "1", fmt.Sprintf("one %d", i)))
				clk.Add(time.Minute)
			}
			if len(p1[5].Pruned) != 1 || p1[5].Pruned[0] != p1[0].Key || len(p1[6].Pruned) != 1 || p1[6].Pruned[0] != p1[1].Key {
				t.Errorf("pruned by save 6: %q, by save 7: %q", p1[5].Pruned, p1[6].Pruned)
			}
			list, err := m.List(context.Background(), "1")
			if err != nil {
				t.Fatal(err)
			}
			if len(list) != 5 {
				t.Fatalf("project 1 has %d snapshots, want 5: %q", len(list), keysOf(list))
			}
			for i, in := range list {
				if in.Key != p1[6-i].Key {
					t.Errorf("kept[%d] = %s, want %s", i, in.Key, p1[6-i].Key)
				}
			}
			ten, err := m.List(context.Background(), "10")
			if err != nil || len(ten) != 3 {
				t.Errorf("project 10 has %d snapshots (%v), want its 3 untouched", len(ten), err)
			}
			if !strings.Contains(logs.String(), "snapshot retention delete") {
				t.Errorf("retention deletes not logged")
			}
			if _, got, err := restoreContent(t, m, "10"); err != nil || got != "ten 2" {
				t.Errorf("project 10 restore %q %v", got, err)
			}
		})
	}
}

// Retention pages through more than 1,000 objects and leaves foreign objects alone.
func TestRetentionPast1000(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			m, clk, _ := newManager(t, b.s, nil)
			ctx := context.Background()
			base := clk.Now().Add(-48 * time.Hour)
			const n = 1003
			work := make(chan int)
			errs := make(chan error, n)
			var wg sync.WaitGroup
			for range 16 {
				wg.Go(func() {
					for i := range work {
						k := snapshot.Key("big", base.Add(time.Duration(i)*time.Minute), "000000")
						if _, err := b.s.Put(ctx, k, strings.NewReader("old"), store.PutOptions{Size: 3}); err != nil {
							errs <- err
						}
					}
				})
			}
			for i := range n {
				work <- i
			}
			close(work)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			foreign := snapshot.Prefix("big") + "README.txt"
			if _, err := b.s.Put(ctx, foreign, strings.NewReader("not a snapshot"), store.PutOptions{}); err != nil {
				t.Fatal(err)
			}
			info := saveContent(t, m, "big", "newest")
			if len(info.Pruned) != n-4 {
				t.Errorf("pruned %d, want %d", len(info.Pruned), n-4)
			}
			list, err := m.List(ctx, "big")
			if err != nil {
				t.Fatal(err)
			}
			if len(list) != 5 || list[0].Key != info.Key || list[1].Key != snapshot.Key("big", base.Add((n-1)*time.Minute), "000000") {
				t.Errorf("after retention: %q", keysOf(list))
			}
			if _, err := b.s.Head(ctx, foreign); err != nil {
				t.Errorf("retention touched a foreign object: %v", err)
			}
		})
	}
}

// A host whose clock is behind (snapshots from the future are in the store) still saves
// a snapshot that sorts after them, and that restore returns.
func TestSaveSortsAfterNewestWhateverTheClock(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			m, clk, _ := newManager(t, b.s, nil)
			for i := range 3 {
				k := snapshot.Key("p", clk.Now().Add(time.Duration(i+1)*time.Hour), "0000a"+strconv.Itoa(i))
				if _, err := b.s.Put(context.Background(), k, strings.NewReader("future"), store.PutOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			// and one of an older version's format, in the same second as the newest
			legacy := snapshot.Prefix("p") + clk.Now().Add(3*time.Hour).UTC().Format("20060102T150405Z") + "_05.tar.gz"
			if _, err := b.s.Put(context.Background(), legacy, strings.NewReader("old format"), store.PutOptions{}); err != nil {
				t.Fatal(err)
			}
			info := saveContent(t, m, "p", "now")
			list, _ := m.List(context.Background(), "p")
			if len(list) != 5 || list[0].Key != info.Key || !info.Time.After(clk.Now().Add(3*time.Hour)) {
				t.Errorf("saved %s at %v; list %q", info.Key, info.Time, keysOf(list))
			}
			if _, got, err := restoreContent(t, m, "p"); err != nil || got != "now" {
				t.Errorf("restore: %q %v", got, err)
			}
		})
	}
}

// Faults injected between the client and the server: Save retries a write 3 times (4
// PUTs, the SDK's own retries disabled so the count is the Manager's), returns
// ErrSaveFailed, and the next Save succeeds once the proxy heals.
func TestSaveFaults(t *testing.T) {
	proxy, err := s3test.NewFaultProxy(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	b := newS3(t, proxy.URL, func(c *s3store.Config) {
		c.MaxAttempts = 1
		c.ResponseHeaderTimeout = 300 * time.Millisecond
	})
	m, clk, logs := newManager(t, b.s, nil)
	for _, f := range []s3test.Fault{s3test.Error500, s3test.Hang, s3test.Drop} {
		t.Run(f.String(), func(t *testing.T) {
			proxy.Reset()
			proxy.Inject(f, http.MethodPut, -1)
			clk.Add(time.Minute)
			logged := strings.Count(logs.String(), "attempt failed, retrying")
			data := tarGz(t, "note.txt", "lost "+f.String())
			_, err := m.Save(context.Background(), "faulty", func(w io.Writer) error { _, err := w.Write(data); return err })
			if !errors.Is(err, snapshot.ErrSaveFailed) {
				t.Fatalf("Save through a failing store: %v, want ErrSaveFailed", err)
			}
			t.Logf("Save error: %v", err)
			if got := proxy.Count(http.MethodPut); got != 4 {
				t.Errorf("%d PUTs reached the proxy; want 4 (1 + 3 retries)", got)
			}
			if n := strings.Count(logs.String(), "attempt failed, retrying") - logged; n != 3 {
				t.Errorf("%d retries logged", n)
			}
			if !strings.Contains(logs.String(), "snapshot save failed") {
				t.Errorf("failure not logged")
			}
			proxy.Heal()
			clk.Add(time.Minute)
			saveContent(t, m, "faulty", "kept "+f.String())
			if _, got, err := restoreContent(t, m, "faulty"); err != nil || got != "kept "+f.String() {
				t.Errorf("restore after heal: %q %v", got, err)
			}
		})
	}
	t.Run("transient", func(t *testing.T) {
		proxy.Reset()
		proxy.Inject(s3test.Error500, http.MethodPut, 2)
		clk.Add(time.Minute)
		info := saveContent(t, m, "faulty", "third time lucky")
		if proxy.Faults() != 2 {
			t.Errorf("%d faults injected, want 2", proxy.Faults())
		}
		// The summary says what really was stored.
		up, ok := info.Transfer.Phase("upload")
		if !ok || up.Bytes != info.Size || up.Failed ||
			!strings.Contains(info.Transfer.String(), "upload "+snapshot.HumanBytes(info.Size)+" in ") {
			t.Errorf("transfer after 2 failed attempts: %+v %s", up, info.Transfer)
		}
		if _, got, err := restoreContent(t, m, "faulty"); err != nil || got != "third time lucky" {
			t.Errorf("restore: %q %v", got, err)
		}
	})
	// Failed saves leave nothing behind: every snapshot listed restores.
	list, _ := m.List(context.Background(), "faulty")
	if len(list) != 4 {
		t.Errorf("%d snapshots after 3 failed and 4 good saves, want 4: %q", len(list), keysOf(list))
	}
}

// A PUT that landed but whose answer was lost: the retry stores it again or takes it as
// stored, and the save is one snapshot, never a duplicate (nor a failure on 412).
func TestSaveLostAnswerNotDuplicated(t *testing.T) {
	proxy, err := s3test.NewFaultProxy(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	for _, sdkAttempts := range []int{1, 4} {
		t.Run(fmt.Sprintf("sdk-attempts-%d", sdkAttempts), func(t *testing.T) {
			b := newS3(t, proxy.URL, func(c *s3store.Config) { c.MaxAttempts = sdkAttempts })
			m, _, _ := newManager(t, b.s, nil)
			proxy.Reset()
			proxy.Inject(s3test.DropAnswer, http.MethodPut, 1)
			info := saveContent(t, m, "p", "once")
			if proxy.Faults() != 1 {
				t.Fatalf("fault not injected")
			}
			list, _ := m.List(context.Background(), "p")
			if len(list) != 1 || list[0].Key != info.Key {
				t.Errorf("after a lost answer: %q (saved as %s)", keysOf(list), info.Key)
			}
		})
	}
}

// A tar.gz snapshot (an older version's) that does not verify against its stored SHA-256
// is passed over for the next older one. (Chunked snapshots: quarantine_test.go.)
func TestRestoreFallsBackFromCorrupt(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			m, clk, logs := newManager(t, b.s, nil)
			var infos []snapshot.Info
			for i := range 3 {
				infos = append(infos, saveOld(t, b.s, clk, "p", fmt.Sprintf("version %d", i)))
				clk.Add(time.Minute)
			}
			flip := func(key string) {
				p := b.file(key)
				data, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				data[len(data)/2] ^= 0xff
				if err := os.WriteFile(p, data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			flip(infos[2].Key)
			info, got, err := restoreContent(t, m, "p")
			if err != nil {
				t.Fatalf("Restore: %v", err)
			}
			if info.Key != infos[1].Key || got != "version 1" {
				t.Errorf("restored %s (%q), want the previous snapshot %s", info.Key, got, infos[1].Key)
			}
			if len(info.Refused) != 1 || info.Refused[0].Key != infos[2].Key || !strings.Contains(info.Refused[0].Reason, "SHA-256") && !strings.Contains(info.Refused[0].Reason, "checksum") {
				t.Errorf("the result does not say why %s was passed over: %+v", infos[2].Key, info.Refused)
			}
			if !strings.Contains(logs.String(), "snapshot refused") || !strings.Contains(logs.String(), infos[2].Key) {
				t.Errorf("fallback not logged:\n%s", logs.String())
			}
			flip(infos[1].Key)
			flip(infos[0].Key)
			if _, _, err := restoreContent(t, m, "p"); !errors.Is(err, snapshot.ErrCorrupt) {
				t.Errorf("all corrupt: %v, want ErrCorrupt", err)
			}
			if _, _, err := restoreContent(t, m, "nothing-here"); !errors.Is(err, snapshot.ErrNoSnapshot) {
				t.Errorf("no snapshot: %v, want ErrNoSnapshot", err)
			}
		})
	}
}

// A download of a tar.gz snapshot that keeps failing is retried and then fails the
// restore; it does not fall back to an older snapshot.
func TestRestoreDownloadFaults(t *testing.T) {
	proxy, err := s3test.NewFaultProxy(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	b := newS3(t, proxy.URL, func(c *s3store.Config) { c.MaxAttempts = 1 })
	m, clk, _ := newManager(t, b.s, nil)
	saveOld(t, b.s, clk, "p", "old")
	clk.Add(time.Minute)
	saveOld(t, b.s, clk, "p", "new")

	isDownload := func(r *http.Request) bool {
		return r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, ".tar.gz")
	}
	isList := func(r *http.Request) bool { return r.Method == http.MethodGet && r.URL.Query().Has("list-type") }
	proxy.Reset()
	proxy.InjectMatch(s3test.Error500, isList, 1)
	if _, got, err := restoreContent(t, m, "p"); err != nil || got != "new" {
		t.Fatalf("restore through a failed listing: %q %v", got, err)
	}
	proxy.InjectMatch(s3test.Error500, isDownload, 2)
	info, got, err := restoreContent(t, m, "p")
	if err != nil || got != "new" {
		t.Fatalf("restore through 2 failed downloads: %q %v", got, err)
	}
	if info.Attempts != 3 {
		t.Errorf("download attempts %d, want 3", info.Attempts)
	}
	// Dropped connections (net/http itself may resend an idempotent GET once).
	proxy.InjectMatch(s3test.Drop, isDownload, 3)
	if _, got, err := restoreContent(t, m, "p"); err != nil || got != "new" {
		t.Fatalf("restore through 3 dropped downloads: %q %v", got, err)
	}

	proxy.Inject(s3test.Error500, http.MethodGet, -1)
	_, _, err = restoreContent(t, m, "p")
	proxy.Heal()
	if err == nil || errors.Is(err, snapshot.ErrCorrupt) {
		t.Errorf("restore with the store down: %v", err)
	}
}

func TestSaveDirRestoreDir(t *testing.T) {
	b := newS3(t, srv.Endpoint, nil)
	var events []snapshot.Progress
	var mu sync.Mutex
	m, _, _ := newManager(t, b.s, func(c *snapshot.Config) {
		c.Progress = func(p snapshot.Progress) { mu.Lock(); events = append(events, p); mu.Unlock() }
	})
	src := t.TempDir()
	files := map[string]string{"main.go": "package main\n", "pkg/a/a.go": strings.Repeat("a", 100_000), "node_modules/x/y.js": "dep", ".git/HEAD": "ref"}
	for p, c := range files {
		os.MkdirAll(filepath.Join(src, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(src, p), []byte(c), 0o644)
	}
	os.Mkdir(filepath.Join(src, "empty"), 0o750)
	os.Symlink("pkg/a/a.go", filepath.Join(src, "link"))

	info, pst, err := m.SaveDir(context.Background(), "ws", src)
	if err != nil {
		t.Fatal(err)
	}
	if pst.Files != 2 || pst.Symlinks != 1 || info.Size != pst.BytesOut {
		t.Errorf("pack stats %+v, info %+v", pst, info)
	}
	dst := filepath.Join(t.TempDir(), "restored")
	rinfo, est, err := m.RestoreDir(context.Background(), "ws", dst, false)
	if err != nil {
		t.Fatal(err)
	}
	if rinfo.Key != info.Key || rinfo.SHA256 != info.SHA256 || est.Files != 2 {
		t.Errorf("restore info %+v, stats %+v", rinfo, est)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "link")); len(b) != 100_000 {
		t.Errorf("link not restored")
	}
	for _, gone := range []string{"node_modules", ".git"} {
		if _, err := os.Stat(filepath.Join(dst, gone)); err == nil {
			t.Errorf("%s restored", gone)
		}
	}
	if fi, err := os.Stat(filepath.Join(dst, "empty")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("empty dir: %v %v", fi, err)
	}
	// Restoring over existing work needs replace, which keeps the old tree.
	if _, _, err := m.RestoreDir(context.Background(), "ws", dst, false); !errors.Is(err, archive.ErrNotEmpty) {
		t.Errorf("restore into a non-empty dir: %v", err)
	}
	os.WriteFile(filepath.Join(dst, "unsaved.txt"), []byte("work"), 0o644)
	_, est, err = m.RestoreDir(context.Background(), "ws", dst, true)
	if err != nil || est.Backup == "" {
		t.Fatalf("replace: %v, backup %q", err, est.Backup)
	}
	if b, _ := os.ReadFile(filepath.Join(est.Backup, "unsaved.txt")); string(b) != "work" {
		t.Errorf("unsaved work lost")
	}

	// A tar.gz snapshot (an older version's) reports its download and extraction.
	var arc bytes.Buffer
	if _, err := archive.Pack(context.Background(), &arc, src, archive.PackOptions{}); err != nil {
		t.Fatal(err)
	}
	old := putTarGz(t, b.s, "old", time.Now(), arc.Bytes())
	if _, est, err := m.RestoreDir(context.Background(), "old", filepath.Join(t.TempDir(), "old"), false); err != nil || est.Files != 2 {
		t.Fatalf("restore of a tar.gz snapshot: %v %+v", err, est)
	}
	final := map[string]snapshot.Progress{}
	mu.Lock()
	for _, e := range events {
		final[e.Phase] = e
	}
	mu.Unlock()
	if p := final["download"]; p.Done != old.Size || p.ProjectID != "old" {
		t.Errorf("download progress ended at %+v, size %d", p, old.Size)
	}
	if p := final["extract"]; p.Done != old.Size {
		t.Errorf("extract progress ended at %+v, size %d", p, old.Size)
	}
}

// A tar.gz snapshot crafted to escape (in a store older versions wrote to) is refused on
// restore and nothing outside changes.
func TestRestoreRefusesCraftedSnapshot(t *testing.T) {
	b := newS3(t, srv.Endpoint, nil)
	m, _, _ := newManager(t, b.s, nil)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Name: "ok.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2})
	tw.Write([]byte("ok"))
	tw.WriteHeader(&tar.Header{Name: "lnk", Typeflag: tar.TypeSymlink, Linkname: "../outside"})
	tw.WriteHeader(&tar.Header{Name: "lnk/evil.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4})
	tw.Write([]byte("evil"))
	tw.Close()
	zw.Close()
	putTarGz(t, b.s, "p", time.Now(), buf.Bytes())
	base := t.TempDir()
	os.Mkdir(filepath.Join(base, "outside"), 0o755)
	_, _, err := m.RestoreDir(context.Background(), "p", filepath.Join(base, "ws"), false)
	if !errors.Is(err, snapshot.ErrCorrupt) || !strings.Contains(err.Error(), `"lnk"`) {
		t.Fatalf("restore of a crafted snapshot: %v", err)
	}
	if _, err := os.Stat(filepath.Join(base, "ws")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused restore left its destination behind: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(base, "outside")); len(ents) != 0 {
		t.Errorf("written outside: %v", ents)
	}
}
