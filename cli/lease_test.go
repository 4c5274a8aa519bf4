package cli

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/internal/store/s3/s3test"
	"github.com/toolhost/toolhost/internal/testenv"
)

// TestLeaseTwoProcesses: while one toolhost process has a project open (a long call),
// another one's call on the same project, on the same store (a directory, S3), fails with
// one line naming the host and the process that has it; once the first ends, the
// second's call runs.
func TestLeaseTwoProcesses(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	trackSources()
	t.Run("dir", func(t *testing.T) {
		t.Parallel()
		leaseTwoProcesses(t, []string{"TOOLHOST_STORE_DIR=" + testStore(t)})
	})
	t.Run("s3", func(t *testing.T) {
		t.Parallel()
		srv, err := s3test.Start(t.TempDir())
		if err != nil {
			t.Fatalf("starting the S3 server: %v", err)
		}
		defer srv.Close()
		bucket, err := srv.NewBucket(t.Context(), "lease")
		if err != nil {
			t.Fatal(err)
		}
		leaseTwoProcesses(t, []string{
			"AWS_ACCESS_KEY_ID=" + s3test.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3test.SecretKey,
			"AWS_REGION=" + s3test.Region, "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null",
			"AWS_EC2_METADATA_DISABLED=true",
			"TOOLHOST_STORE_KIND=s3", "TOOLHOST_STORE_S3_BUCKET=" + bucket, "TOOLHOST_STORE_S3_ENDPOINT=" + srv.Endpoint,
			"TOOLHOST_STORE_S3_PATH_STYLE=true",
		})
	})
}

func leaseTwoProcesses(t *testing.T, env []string) {
	ws := t.TempDir()
	holder := exec.Command(toolBin, "call", "bash", `{"command":"touch started; sleep 60"}`, "--workspace", ws, "--project", "shared")
	holder.Env = append(os.Environ(), "TOOLHOST_DATA_DIR="+testDataDir)
	holder.Env = append(holder.Env, env...)
	awaitCompiles(t, holder.Env)
	var stderr bytes.Buffer
	holder.Stderr = &stderr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		holder.Process.Signal(os.Interrupt)
		holder.Wait()
	}()
	if !testenv.Eventually(func() bool { _, err := os.Stat(filepath.Join(ws, "started")); return err == nil }) {
		t.Fatalf("the holder's command never started\n%s", stderr.String())
	}
	host, _ := os.Hostname()
	r := runCLI(t, env, "call", "bash", `{"command":"echo second"}`, "--project", "shared")
	oneLineError(t, r, 1, fmt.Sprintf("project shared is open on host %s (pid %d, since ", host, holder.Process.Pid))
	if !strings.Contains(r.stderr, "close it there or wait until ") {
		t.Errorf("the refusal does not say what to do: %s", r.stderr)
	}
	// Another project is free meanwhile.
	if r := runCLI(t, env, "call", "bash", `{"command":"echo other"}`, "--project", "other"); r.code != 0 {
		t.Errorf("another project:\n%s", r)
	}
	holder.Process.Signal(os.Interrupt)
	holder.Wait()
	r = runCLI(t, env, "call", "bash", `{"command":"echo second"}`, "--project", "shared")
	if r.code != 0 || !strings.Contains(decodeResult(t, r).Content[0].Text, "second") {
		t.Errorf("after the holder ended:\n%s", r)
	}
	// With leases off the call takes none, and runs.
	r = runCLI(t, append(env, "TOOLHOST_LEASE_ENABLED=false"), "call", "bash", `{"command":"echo off"}`, "--project", "shared")
	if r.code != 0 {
		t.Errorf("with leases off:\n%s", r)
	}
}
