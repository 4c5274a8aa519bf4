//go:build linux

package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/testenv"
)

// The case with whole hosts: 4 processes, each its own host with its own local
// sandbox on one shared host directory, make 16 edit_file calls on one file (read_file,
// then edit_file, as a model does, with the built-in guard on). None is lost, and a host
// whose read is stale by the time it edits is told to read the file again (it does, and
// edits again). Each process is this test binary running TestHelperEditHost.
func TestEditFileFromFourHostsNoneLost(t *testing.T) {
	testenv.NeedBwrap(t)
	shared := t.TempDir()
	if err := os.WriteFile(filepath.Join(shared, "notes.txt"), []byte("end\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	barrier := t.TempDir() // each host says here it is ready; all edit at once
	ctx, cancel := context.WithTimeout(t.Context(), 5*testenv.HangBound)
	defer cancel()
	var wg sync.WaitGroup
	outs := make([]string, 4)
	for p := range 4 {
		wg.Go(func() {
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperEditHost$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), "TOOLHOST_TEST_EDITHOST="+shared, "TOOLHOST_TEST_EDITHOST_ID="+strconv.Itoa(p), "TOOLHOST_TEST_EDITHOST_BARRIER="+barrier)
			cmd.WaitDelay = 10 * time.Second
			out, err := cmd.CombinedOutput()
			outs[p] = string(out)
			if err != nil {
				t.Errorf("host %d: %v\n%s", p, err, out)
			}
		})
	}
	wg.Wait()
	got, err := os.ReadFile(filepath.Join(shared, "notes.txt"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(got), "\n"), "\n")
	seen := map[string]bool{}
	for _, l := range lines {
		seen[l] = true
	}
	for p := range 4 {
		for e := range 4 {
			if l := fmt.Sprintf("edit %d of host %d", e, p); !seen[l] {
				t.Errorf("lost: %q", l)
			}
		}
	}
	if len(lines) != 17 || lines[16] != "end" {
		t.Errorf("%d lines, want 16 edits and the end:\n%s", len(lines), got)
	}
	rereads := 0
	for _, o := range outs {
		rereads += strings.Count(o, "told to read again")
	}
	t.Logf("16 edit_file calls from 4 hosts: %d stale edits told to read again, all redone", rereads)
}

// TestHelperEditHost is one host of TestEditFileFromFourHostsNoneLost.
func TestHelperEditHost(t *testing.T) {
	shared := os.Getenv("TOOLHOST_TEST_EDITHOST")
	if shared == "" {
		t.Skip("run by TestEditFileFromFourHostsNoneLost in a child process")
	}
	id := os.Getenv("TOOLHOST_TEST_EDITHOST_ID")
	p := newProvider(t)
	sb, err := p.Create(context.Background(), sandbox.CreateOptions{Workspace: shared})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	// The built-in plugins with editfile's guard on (builtinPlugins turns it off).
	var specs []host.PluginSpec
	for _, s := range builtinPlugins(t) {
		s.Env = nil
		specs = append(specs, s)
	}
	h, err := host.New(context.Background(), host.Config{DataDir: e2eDataDir, Plugins: specs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	// Four hosts compile the plugins at once on a loaded machine (under -race that took
	// more than a minute): wait for them with a hang bound before the first call.
	rctx, cancel := context.WithTimeout(context.Background(), 3*testenv.HangBound)
	defer cancel()
	if err := h.Ready(rctx); err != nil {
		t.Fatal(err)
	}
	s := h.OpenSession(sb)
	call := func(tool, input string) abi.Result {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
		defer cancel()
		res, err := s.Dispatch(ctx, tool, json.RawMessage(input))
		if err != nil {
			t.Fatalf("%s %s: host error %v", tool, input, err)
		}
		return res
	}
	if res := call("read_file", `{"path":"notes.txt"}`); res.IsError {
		t.Fatalf("read_file: %s", testenv.ResultText(res))
	}
	barrier := os.Getenv("TOOLHOST_TEST_EDITHOST_BARRIER")
	if err := os.WriteFile(filepath.Join(barrier, id), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the other hosts to be ready", func() bool {
		ents, _ := os.ReadDir(barrier)
		return len(ents) == 4
	})
	for n := range 4 {
		edit := fmt.Sprintf(`{"path":"notes.txt","old_string":"end\n","new_string":"edit %d of host %s\nend\n"}`, n, id)
		for attempt := 0; ; attempt++ {
			if attempt == 50 {
				t.Fatalf("edit %d: still stale after 50 reads", n)
			}
			if res := call("read_file", `{"path":"notes.txt"}`); res.IsError {
				t.Fatalf("read_file: %s", testenv.ResultText(res))
			}
			res := call("edit_file", edit)
			text := testenv.ResultText(res)
			if !res.IsError {
				break
			}
			if !strings.Contains(text, "read it again") {
				t.Fatalf("edit %d: %s (want done, or told to read the file again)", n, text)
			}
			t.Logf("edit %d: told to read again: %s", n, text)
		}
	}
}
