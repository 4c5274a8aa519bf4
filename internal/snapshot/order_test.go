package snapshot_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/snapshot"
	dirstore "github.com/toolhost/toolhost/internal/store/dir"
	s3store "github.com/toolhost/toolhost/internal/store/s3"
	"github.com/toolhost/toolhost/internal/store/s3/s3test"
	"github.com/toolhost/toolhost/internal/testenv"
)

// slowStore holds back the Put of chosen keys until released: an upload that is slower
// than the others.
type slowStore struct {
	store.Store
	hold func(key string) <-chan struct{}
	puts *atomic.Int32 // Puts begun: a saver calls Put right after it took its key
}

func (s slowStore) Put(ctx context.Context, key string, r io.Reader, opts store.PutOptions) (store.ObjectInfo, error) {
	s.puts.Add(1)
	if c := s.hold(key); c != nil {
		select {
		case <-c:
		case <-ctx.Done():
			return store.ObjectInfo{}, ctx.Err()
		}
	}
	return s.Store.Put(ctx, key, r, opts)
}

// Four savers of one project at once, on a real clock. "Last" is the save that took its
// snapshot last (its archive was complete last: it holds the newest state of the
// workspace): its key sorts last and restore returns it, even when its upload ends first
// and an older snapshot's upload ends after it, and retention (keep 2) never deletes it.
func TestConcurrentSaversTheLastTakenWins(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			const n = 4
			release := make(chan struct{})
			var firstKey sync.Once
			var held string
			var puts atomic.Int32
			slow := slowStore{Store: b.s, puts: &puts, hold: func(key string) <-chan struct{} {
				// The first snapshot taken uploads last.
				firstKey.Do(func() { held = key })
				if key == held {
					return release
				}
				return nil
			}}
			m, err := snapshot.New(snapshot.Config{Store: slow, Keep: 2, Backoff: time.Millisecond,
				TempDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			// Saver i's archive is complete only after saver i-1 took its key: the order in
			// which they took their snapshots is 0, 1, 2, 3.
			took := make([]chan struct{}, n+1)
			for i := range took {
				took[i] = make(chan struct{})
			}
			close(took[0])
			infos := make([]snapshot.Info, n)
			errs := make([]error, n)
			finished := make(chan int, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					data := tarGz(t, "note.txt", fmt.Sprintf("saver %d", i))
					infos[i], errs[i] = m.Save(context.Background(), "four", func(w io.Writer) error {
						<-took[i]
						_, err := w.Write(data)
						return err
					})
					finished <- i
				})
			}
			// Let each next saver finish packing once the previous one has taken its key
			// (and begun its upload).
			for i := range n {
				testenv.Eventually(func() bool { return int(puts.Load()) > i })
				close(took[i+1])
			}
			var order []int
			for range n - 1 {
				order = append(order, <-finished)
			}
			close(release) // now the first snapshot's upload ends, last of all
			order = append(order, <-finished)
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("saver %d: %v", i, err)
				}
			}
			if order[n-1] != 0 {
				t.Fatalf("saver 0 was meant to finish last, order %v", order)
			}
			for i := 1; i < n; i++ {
				if infos[i].Key <= infos[i-1].Key {
					t.Errorf("saver %d took its snapshot after saver %d, but its key %s does not sort after %s", i, i-1, infos[i].Key, infos[i-1].Key)
				}
			}
			_, got, err := restoreContent(t, m, "four")
			if err != nil || got != fmt.Sprintf("saver %d", n-1) {
				t.Errorf("restore: %q %v; want the last snapshot taken, saver %d's (uploads ended in order %v)", got, err, n-1, order)
			}
		})
	}
}

// Four processes save one project at once, through one directory store and through the
// S3 server: every snapshot lands under its own key, and restore returns the one with the
// greatest key, which is the one taken last (by the time each process took it), with
// retention (keep 2) running in every process.
func TestFourProcessesSaveOneProject(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("in a child process")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	bucket, err := srv.NewBucket(ctx, "procs")
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"dir", "s3"} {
		t.Run(kind, func(t *testing.T) {
			where := filepath.Join(t.TempDir(), "store")
			if kind == "s3" {
				where = srv.Endpoint + " " + bucket
			}
			for round := range 3 {
				project := fmt.Sprintf("procs-%d", round)
				type result struct {
					Key  string
					Time time.Time
					Text string
					Err  string
				}
				results := make([]result, 4)
				var starts []io.WriteCloser
				var wg sync.WaitGroup
				for i := range 4 {
					cmd := exec.Command(exe, "-test.run=^TestSaveChild$", "-test.count=1")
					cmd.Env = append(os.Environ(), childEnv+"=1", "SNAP_CHILD_KIND="+kind, "SNAP_CHILD_WHERE="+where,
						"SNAP_CHILD_PROJECT="+project, "SNAP_CHILD_TEXT="+fmt.Sprintf("process %d round %d", i, round))
					stdin, _ := cmd.StdinPipe()
					stdout, _ := cmd.StdoutPipe()
					cmd.Stderr = os.Stderr
					if err := cmd.Start(); err != nil {
						t.Fatal(err)
					}
					starts = append(starts, stdin)
					wg.Go(func() {
						sc := bufio.NewScanner(stdout)
						for sc.Scan() {
							if line, ok := strings.CutPrefix(sc.Text(), "RESULT "); ok {
								json.Unmarshal([]byte(line), &results[i])
							}
						}
						cmd.Wait()
					})
				}
				for _, w := range starts { // all at once
					w.Close()
				}
				wg.Wait()
				last := -1
				seen := map[string]bool{}
				for i, r := range results {
					if r.Err != "" || r.Key == "" {
						t.Fatalf("round %d, process %d: %+v", round, i, r)
					}
					if seen[r.Key] {
						t.Errorf("two processes saved under %s", r.Key)
					}
					seen[r.Key] = true
					if last < 0 || r.Key > results[last].Key {
						last = i
					}
				}
				for i, r := range results {
					if i != last && r.Time.After(results[last].Time) {
						t.Errorf("process %d took its snapshot at %v, after the greatest key's %v", i, r.Time, results[last].Time)
					}
				}
				m := childManager(t, kind, where)
				if _, got, err := restoreContent(t, m, project); err != nil || got != results[last].Text {
					t.Errorf("round %d: restored %q (%v); the last snapshot taken is %q under %s", round, got, err, results[last].Text, results[last].Key)
				}
			}
		})
	}
}

const childEnv = "SNAP_TEST_CHILD"

// TestSaveChild is the body of one process of TestFourProcessesSaveOneProject.
func TestSaveChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("run by TestFourProcessesSaveOneProject in a child process")
	}
	m := childManager(t, os.Getenv("SNAP_CHILD_KIND"), os.Getenv("SNAP_CHILD_WHERE"))
	text := os.Getenv("SNAP_CHILD_TEXT")
	data := tarGz(t, "note.txt", text)
	io.Copy(io.Discard, os.Stdin) // the start signal: stdin closes
	info, err := m.Save(context.Background(), os.Getenv("SNAP_CHILD_PROJECT"), func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
	res := map[string]any{"Key": info.Key, "Time": info.Time, "Text": text}
	if err != nil {
		res["Err"] = err.Error()
	}
	b, _ := json.Marshal(res)
	fmt.Printf("RESULT %s\n", b)
}

func childManager(t *testing.T, kind, where string) *snapshot.Manager {
	t.Helper()
	var st store.Store
	if kind == "dir" {
		d, err := dirstore.New(where)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		st = d
	} else {
		endpoint, bucket, _ := strings.Cut(where, " ")
		s, err := s3store.New(context.Background(), s3store.Config{Bucket: bucket, Endpoint: endpoint, PathStyle: true,
			Region: s3test.Region, AccessKeyID: s3test.AccessKey, SecretAccessKey: s3test.SecretKey})
		if err != nil {
			t.Fatal(err)
		}
		st = s
	}
	m, err := snapshot.New(snapshot.Config{Store: st, Keep: 2, Backoff: 10 * time.Millisecond, TempDir: t.TempDir(),
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return m
}
