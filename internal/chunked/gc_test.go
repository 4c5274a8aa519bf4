package chunked_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/chunked"
	"github.com/toolhost/toolhost/internal/chunked/chunkedtest"
	"github.com/toolhost/toolhost/internal/store/dir"
)

func TestMain(m *testing.M) {
	if d := os.Getenv("CHUNKED_TEST_SAVER"); d != "" {
		os.Exit(saverProcess(d))
	}
	os.Exit(m.Run())
}

// saverProcess is a child of TestCollectRacingSavers: it saves its project over and over
// (a changing tree, sharing files with the other savers' projects), keeping the newest two,
// until its deadline.
func saverProcess(storeDir string) int {
	project := os.Getenv("CHUNKED_TEST_PROJECT")
	until, _ := strconv.ParseInt(os.Getenv("CHUNKED_TEST_UNTIL"), 10, 64)
	st, err := dir.New(storeDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	r, err := chunked.New(chunked.Config{Store: st, Grace: time.Second, MaxSaveAge: 300 * time.Millisecond, Retry: store.Retry{Attempts: 3, Backoff: 5 * time.Millisecond}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx := context.Background()
	ws, _ := os.MkdirTemp("", "saver-")
	defer os.RemoveAll(ws)
	rnd := rand.New(rand.NewPCG(uint64(os.Getpid()), 1))
	saves, stale := 0, 0
	for i := 0; time.Now().UnixNano() < until; i++ {
		for j := range 6 {
			// Shared content (the same across projects) and content of this save only.
			body := fmt.Sprintf("shared %d\n", rnd.IntN(20))
			if j%2 == 0 {
				body = strings.Repeat(fmt.Sprintf("%s %d %d\n", project, i, j), 200+rnd.IntN(20000))
			}
			os.WriteFile(filepath.Join(ws, fmt.Sprintf("f%d", rnd.IntN(12))), []byte(body), 0o644)
		}
		var base *chunked.Manifest
		if k, err := r.Newest(ctx, project); err == nil && k != "" {
			base, _ = r.Manifest(ctx, k)
		}
		res, err := r.Build(ctx, chunked.DirSource{Dir: ws}, chunked.BuildOptions{Project: project, Base: base})
		if err == nil {
			err = r.Commit(ctx, res, chunked.ManifestKey(project, time.Now(), chunked.NewNonce()))
		}
		if errors.Is(err, chunked.ErrStale) {
			stale++
			continue
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			fmt.Fprintln(os.Stderr, "save:", err)
			return 1
		}
		if err == nil {
			saves++
		}
		if err := chunkedtest.KeepNewest(ctx, r, project, 2); err != nil {
			fmt.Fprintln(os.Stderr, "retention:", err)
			return 1
		}
	}
	fmt.Printf("%s saves=%d stale=%d\n", project, saves, stale)
	return 0
}

func TestCollectRacingSavers(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs for several seconds")
	}
	ctx := ctxOf(t)
	storeDir := t.TempDir()
	st, err := dir.New(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	until := time.Now().Add(8 * time.Second)
	var procs []*exec.Cmd
	var outs []*strings.Builder
	for i := range 4 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "CHUNKED_TEST_SAVER="+storeDir, fmt.Sprintf("CHUNKED_TEST_PROJECT=p%d", i),
			fmt.Sprintf("CHUNKED_TEST_UNTIL=%d", until.UnixNano()))
		out := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs, outs = append(procs, cmd), append(outs, out)
	}
	// The collector's clock is the wall clock until the savers are done; then it jumps a
	// grace period per round instead of the test sleeping through one.
	var skew atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	r, err := chunked.New(chunked.Config{Store: st, Grace: time.Second, MaxSaveAge: 300 * time.Millisecond, TempDir: t.TempDir(), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	var total chunked.CollectStats
	for time.Now().Before(until) {
		cs, err := r.Collect(ctx)
		if err != nil {
			t.Fatalf("collect: %v", err)
		}
		total.Deleted += cs.Deleted
		total.Marked += cs.Marked
		total.Kept += cs.Kept
		time.Sleep(150 * time.Millisecond)
	}
	for i, cmd := range procs {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("saver %d: %v\n%s", i, err, outs[i])
		}
		t.Logf("%s", strings.TrimSpace(outs[i].String()))
	}
	// Two more rounds a grace period apart (by the collector's clock), with no saver left:
	// everything unreferenced goes.
	for range 2 {
		skew.Add(int64(1100 * time.Millisecond))
		cs, err := r.Collect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		total.Deleted += cs.Deleted
	}
	t.Logf("collections: marked %d, deleted %d, kept (referenced again) %d", total.Marked, total.Deleted, total.Kept)
	if total.Deleted == 0 {
		t.Fatal("no pack was ever collected: the race was not exercised")
	}
	keys, err := r.ListManifests(ctx, "")
	if err != nil || len(keys) == 0 {
		t.Fatalf("manifests: %v %v", keys, err)
	}
	fresh := freshRepo(t, st)
	for _, k := range keys {
		m, err := fresh.Manifest(ctx, k)
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		if _, err := fresh.Verify(ctx, m); err != nil {
			t.Errorf("%s references what collection removed: %v", k, err)
		}
	}
}

func ctxOf(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func freshRepo(t *testing.T, st store.Store) *chunked.Repo {
	r, err := chunked.New(chunked.Config{Store: st, Retry: store.Retry{Attempts: 2, Backoff: 10 * time.Millisecond}, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A commit under a manifest key another writer took (other contents) fails with ErrTaken,
// which the snapshot manager matches to pick another key; the same contents are taken as
// stored (a retry that finds its own write).
func TestCommitKeyTaken(t *testing.T) {
	ctx := ctxOf(t)
	st, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r := freshRepo(t, st)
	ws := t.TempDir()
	build := func(body string) *chunked.BuildResult {
		t.Helper()
		if err := os.WriteFile(filepath.Join(ws, "f"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		res, err := r.Build(ctx, chunked.DirSource{Dir: ws}, chunked.BuildOptions{Project: "p"})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	key := chunked.ManifestKey("p", time.Now(), chunked.NewNonce())
	if err := r.Commit(ctx, build("one\n"), key); err != nil {
		t.Fatal(err)
	}
	if err := r.Commit(ctx, build("two\n"), key); !errors.Is(err, chunked.ErrTaken) {
		t.Fatalf("a commit over another manifest: %v, want ErrTaken", err)
	}
}
