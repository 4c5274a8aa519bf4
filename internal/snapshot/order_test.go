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
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/snapshot"
	dirstore "github.com/toolhost/toolhost/internal/store/dir"
	s3store "github.com/toolhost/toolhost/internal/store/s3"
	"github.com/toolhost/toolhost/internal/store/s3/s3test"
)

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
