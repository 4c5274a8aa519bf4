package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLeaseTwoProcesses: while one toolhost process has a project open (a long call),
// another one's call on the same project, on the same store, fails with one line naming
// the host and the process that has it; once the first ends, the second's call runs.
func TestLeaseTwoProcesses(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	trackSources()
	store := testStore(t)
	ws := t.TempDir()
	holder := exec.Command(toolBin, "call", "bash", `{"command":"touch started; sleep 60"}`, "--workspace", ws, "--project", "shared")
	holder.Env = append(os.Environ(), "TOOLHOST_DATA_DIR="+testDataDir, "TOOLHOST_STORE_DIR="+store)
	var stderr bytes.Buffer
	holder.Stderr = &stderr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		holder.Process.Signal(os.Interrupt)
		holder.Wait()
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(ws, "started")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the holder's command never started\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	host, _ := os.Hostname()
	r := runCLI(t, nil, "call", "bash", `{"command":"echo second"}`, "--project", "shared")
	oneLineError(t, r, 1, fmt.Sprintf("project shared is open on host %s (pid %d, since ", host, holder.Process.Pid))
	if !strings.Contains(r.stderr, "close it there or wait until ") {
		t.Errorf("the refusal does not say what to do: %s", r.stderr)
	}
	// Another project is free meanwhile.
	if r := runCLI(t, nil, "call", "bash", `{"command":"echo other"}`, "--project", "other"); r.code != 0 {
		t.Errorf("another project:\n%s", r)
	}
	holder.Process.Signal(os.Interrupt)
	holder.Wait()
	r = runCLI(t, nil, "call", "bash", `{"command":"echo second"}`, "--project", "shared")
	if r.code != 0 || !strings.Contains(decodeResult(t, r).Content[0].Text, "second") {
		t.Errorf("after the holder ended:\n%s", r)
	}
	// Leases off: the two would run together.
	r = runCLI(t, []string{"TOOLHOST_LEASE_ENABLED=false"}, "call", "bash", `{"command":"echo off"}`, "--project", "shared")
	if r.code != 0 {
		t.Errorf("with leases off:\n%s", r)
	}
}
