//go:build linux

package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/lease"
	s3store "github.com/toolhost/toolhost/internal/store/s3"
	"github.com/toolhost/toolhost/internal/store/s3/s3test"
	"github.com/toolhost/toolhost/internal/testenv"
)

// TestLeaseFencedAfterPause: a toolhost process holding a project is stopped (SIGSTOP) in
// the middle of its commit's first store write, for longer than its lease's ttl; another
// process takes the project over and commits; the first is let go on (SIGCONT). Its
// write under way ends with its lease, its commit is refused as fenced off, and the store
// holds nothing it began to write after it woke; every object the two wrote names its
// writer's epoch.
func TestLeaseFencedAfterPause(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	trackSources()
	srv, err := s3test.Start(t.TempDir())
	if err != nil {
		t.Fatalf("starting the S3 server: %v", err)
	}
	defer srv.Close()
	ctx := t.Context()
	bucket, err := srv.NewBucket(ctx, "fence")
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := s3test.NewFaultProxy(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	// The holder's first write of a snapshot hangs in the proxy: the holder is inside a
	// store call, past every check made before it.
	proxy.InjectMatch(s3test.Hang, func(r *http.Request) bool {
		return r.Method == http.MethodPut && !strings.Contains(r.URL.Path, "/lease/") && !strings.Contains(r.URL.Path, "/lease-probe/")
	}, 1)
	env := func(endpoint string) []string {
		return []string{
			"AWS_ACCESS_KEY_ID=" + s3test.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3test.SecretKey,
			"AWS_REGION=" + s3test.Region, "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null",
			"AWS_EC2_METADATA_DISABLED=true",
			"TOOLHOST_STORE_KIND=s3", "TOOLHOST_STORE_S3_BUCKET=" + bucket, "TOOLHOST_STORE_S3_ENDPOINT=" + endpoint,
			"TOOLHOST_STORE_S3_PATH_STYLE=true",
			"TOOLHOST_LEASE_TTL=2s", "TOOLHOST_LEASE_RENEW=500ms",
		}
	}
	st, err := s3store.New(ctx, s3store.Config{Bucket: bucket, Endpoint: srv.Endpoint, PathStyle: true, Region: s3test.Region,
		AccessKeyID: s3test.AccessKey, SecretAccessKey: s3test.SecretKey, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}

	holder := exec.Command(toolBin, "call", "write_file", `{"path":"held.txt","content":"the holder's"}`, "--project", "shared")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TOOLHOST_") && !strings.HasPrefix(kv, "XDG_CONFIG_HOME=") {
			holder.Env = append(holder.Env, kv)
		}
	}
	holder.Env = append(holder.Env, "TOOLHOST_DATA_DIR="+testDataDir, "XDG_CONFIG_HOME="+t.TempDir())
	holder.Env = append(holder.Env, env(proxy.URL)...)
	awaitCompiles(t, holder.Env)
	var stderr bytes.Buffer
	holder.Stderr, holder.Stdout = &stderr, io.Discard
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- holder.Wait() }()
	defer func() {
		holder.Process.Signal(syscall.SIGCONT)
		holder.Process.Kill()
		<-exited
	}()
	if !testenv.Eventually(func() bool { return proxy.Faults() == 1 }) {
		t.Fatalf("the holder's commit never wrote\n%s", stderr.String())
	}
	epoch, err := holderEpoch(ctx, st, "shared", holder.Process.Pid)
	if err != nil {
		t.Fatalf("the holder's lease: %v\n%s", err, stderr.String())
	}
	if err := holder.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}

	// Another process takes the project over once the stopped holder's lease ran out.
	var taker runResult
	if !testenv.Eventually(func() bool {
		taker = runCLI(t, env(srv.Endpoint), "call", "write_file", `{"path":"taken.txt","content":"the taker's"}`, "--project", "shared")
		return taker.code == 0
	}) {
		t.Fatalf("no takeover while the holder was stopped:\n%s", taker)
	}
	woke := time.Now().UTC()
	if err := holder.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if !testenv.Eventually(func() bool { return proxy.Abandoned() == 1 }) {
		t.Errorf("the holder's write under way outlived its lease")
	}
	select {
	case err := <-exited:
		exited <- err
		// The write held may be the session's record or its commit's first: whichever,
		// what the holder does after it woke is refused as fenced off, and the call fails.
		if err == nil || !strings.Contains(stderr.String(), "writes fenced off") {
			t.Errorf("the holder after it woke: %v, want its writes refused as fenced off\n%s", err, stderr.String())
		}
	case <-time.After(testenv.HangBound):
		t.Fatalf("the holder did not end after it woke\n%s", stderr.String())
	}

	// Cut by its lease, the write failed as fenced off at once; a write that ran on until
	// the store client's own timeout would have failed otherwise first, and been retried.
	if strings.Contains(stderr.String(), "retrying") {
		t.Errorf("the holder's write under way was not cut by its lease: it failed otherwise, and was retried\n%s", stderr.String())
	}
	// What the store holds: each object names its writer; none of the holder's was begun
	// after it woke; the taker's are there, under a later epoch.
	objs, err := store.ListAll(ctx, st, "")
	if err != nil {
		t.Fatal(err)
	}
	takers := 0
	for _, o := range objs {
		if strings.HasPrefix(o.Key, lease.Prefix("shared")) {
			continue
		}
		oi, err := st.Head(ctx, o.Key)
		if err != nil {
			t.Fatal(err)
		}
		e, eerr := strconv.ParseUint(oi.Metadata[lease.MetaEpoch], 10, 64)
		at, terr := time.Parse(time.RFC3339Nano, oi.Metadata[lease.MetaTime])
		switch {
		case eerr != nil || terr != nil:
			t.Errorf("%s does not name its writer: %v", o.Key, oi.Metadata)
		case e == epoch && !at.Before(woke):
			t.Errorf("%s was written by the holder after it woke (at %s, woke %s)", o.Key, at, woke)
		case e > epoch:
			takers++
		}
	}
	if takers == 0 {
		t.Errorf("none of the %d objects is the taker's (epoch past %d)", len(objs), epoch)
	}
}

// holderEpoch reads the epoch of project's lease, held by the process pid.
func holderEpoch(ctx context.Context, st store.Store, project string, pid int) (uint64, error) {
	var epoch uint64
	var last error
	if !testenv.Eventually(func() bool { // a renewal may remove the generation listed
		objs, err := store.ListAll(ctx, st, lease.Prefix(project))
		if err != nil || len(objs) == 0 {
			last = errors.Join(err, errors.New("no lease generation"))
			return false
		}
		rc, _, err := st.Get(ctx, objs[len(objs)-1].Key)
		if err != nil {
			last = err
			return false
		}
		defer rc.Close()
		var rec struct {
			PID   int    `json:"pid"`
			Epoch uint64 `json:"epoch"`
		}
		if err := json.NewDecoder(rc).Decode(&rec); err != nil || rec.PID != pid || rec.Epoch == 0 {
			last = errors.Join(err, errors.New("the newest generation is not the holder's"))
			return false
		}
		epoch = rec.Epoch
		return true
	}) {
		return 0, last
	}
	return epoch, nil
}
