package snapshot_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/snapshot"
	s3store "github.com/toolhost/toolhost/internal/store/s3"
	"github.com/toolhost/toolhost/internal/store/s3/s3test"
)

// downResult is what a save against a store that is down did.
type downResult struct {
	Err      string
	Unreach  bool // errors.Is store.ErrUnreachable
	Failed   bool // errors.Is snapshot.ErrSaveFailed
	Elapsed  time.Duration
	Attempts int
	Log      []string
	Transfer string
}

// saveDown saves through st with the Manager's default retry policy and reports.
func saveDown(st store.Store, tmp string) downResult {
	logs := &logBuf{}
	m, err := snapshot.New(snapshot.Config{Store: st, TempDir: tmp,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return downResult{Err: err.Error()}
	}
	start := time.Now()
	data := tarGzOf("note.txt", "a save against a store that may be down")
	info, err := m.Save(context.Background(), "down", func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
	r := downResult{Elapsed: time.Since(start), Attempts: info.Attempts, Transfer: info.Transfer.String(),
		Log: strings.Split(strings.TrimSpace(logs.String()), "\n")}
	if err != nil {
		r.Err = err.Error()
		r.Unreach = errors.Is(err, store.ErrUnreachable)
		r.Failed = errors.Is(err, snapshot.ErrSaveFailed)
	}
	return r
}

func checkDown(t *testing.T, r downResult, bucket, endpoint string) {
	t.Helper()
	t.Logf("failed in %s: %s", r.Elapsed.Round(time.Millisecond), r.Err)
	for _, l := range r.Log {
		t.Logf("log: %s", l)
	}
	if !r.Failed || !r.Unreach {
		t.Errorf("want ErrSaveFailed wrapping store.ErrUnreachable: %q", r.Err)
	}
	// The bound: a refused connection fails a save within 10 s (4 attempts with the
	// default backoff of 1 s doubling, under the 8 s retry window).
	if r.Elapsed >= 10*time.Second || r.Attempts != snapshot.DefaultRetries+1 {
		t.Errorf("failed after %s and %d attempts, want under 10 s and %d", r.Elapsed, r.Attempts, snapshot.DefaultRetries+1)
	}
	if strings.Contains(r.Err, "\n") || len(r.Err) > 300 || !strings.Contains(r.Err, "bucket "+bucket) ||
		!strings.Contains(r.Err, endpoint) || !strings.Contains(r.Err, "cannot reach the store") {
		t.Errorf("not one clear line naming the bucket and %s: %q", endpoint, r.Err)
	}
	// One line per attempt: 3 retries announced, then the failure.
	if len(r.Log) != r.Attempts || strings.Count(strings.Join(r.Log, "\n"), "attempt failed, retrying") != r.Attempts-1 {
		t.Errorf("want %d log lines, one per attempt: %q", r.Attempts, r.Log)
	}
	for _, l := range r.Log {
		if len(l) > 400 || strings.Contains(l, "RequestID") || strings.Contains(l, "operation error") {
			t.Errorf("a log line of %d bytes with SDK internals: %s", len(l), l)
		}
	}
	if !strings.Contains(r.Transfer, "upload failed after 4 attempts, nothing stored") {
		t.Errorf("transfer summary of a failed save: %q", r.Transfer)
	}
}

// S3 down: a port where nothing listens, and the real S3 server stopped. The save fails
// within 10 s with one clear line and one log line per attempt.
func TestSaveWithTheStoreDown(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("in a child process")
	}
	t.Run("nothing listens", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		endpoint := "http://" + ln.Addr().String()
		ln.Close()
		st, err := s3store.New(context.Background(), s3store.Config{Bucket: "snapshots", Endpoint: endpoint, PathStyle: true,
			Region: s3test.Region, AccessKeyID: s3test.AccessKey, SecretAccessKey: s3test.SecretKey})
		if err != nil {
			t.Fatal(err)
		}
		checkDown(t, saveDown(st, t.TempDir()), "snapshots", endpoint)
	})
	t.Run("server stopped", func(t *testing.T) {
		// VersityGW runs once per process: a child process starts its own, saves, stops
		// it and saves again.
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(exe, "-test.run=^TestStoppedServerChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), childEnv+"=stopped")
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		var res struct {
			downResult
			Bucket, Endpoint string
		}
		sc := bufio.NewScanner(strings.NewReader(string(out)))
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "RESULT "); ok {
				json.Unmarshal([]byte(line), &res)
			}
		}
		if res.Bucket == "" {
			t.Fatalf("child reported nothing:\n%s", out)
		}
		checkDown(t, res.downResult, res.Bucket, res.Endpoint)
	})
}

// TestStoppedServerChild is the body of the child of TestSaveWithTheStoreDown.
func TestStoppedServerChild(t *testing.T) {
	if os.Getenv(childEnv) != "stopped" {
		t.Skip("run by TestSaveWithTheStoreDown in a child process")
	}
	own, err := s3test.Start("")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	bucket, err := own.NewBucket(ctx, "stopped")
	if err != nil {
		t.Fatal(err)
	}
	st, err := s3store.New(ctx, s3store.Config{Bucket: bucket, Endpoint: own.Endpoint, PathStyle: true,
		Region: s3test.Region, AccessKeyID: s3test.AccessKey, SecretAccessKey: s3test.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	if r := saveDown(st, t.TempDir()); r.Err != "" {
		t.Fatalf("save with the server up: %s", r.Err)
	}
	if err := own.Close(); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(struct {
		downResult
		Bucket, Endpoint string
	}{saveDown(st, t.TempDir()), bucket, own.Endpoint})
	fmt.Printf("RESULT %s\n", b)
}
