//go:build linux

package session_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/sandbox/local"
	"github.com/toolhost/toolhost/internal/session"
	"github.com/toolhost/toolhost/internal/testenv"
)

// On a real local sandbox: a background job takes every process its pids limit allows
// (a fork loop that retries, as bash's does: a dash loop exits at its first failed fork
// and frees a slot), so no command of the sandbox can start any more; the session's next
// command finds the sandbox stuck, replaces it with its files, runs there, and the loop
// is not started again on the new sandbox (the agent is told).
func TestStuckLocalSandboxIsReplaced(t *testing.T) {
	testenv.NeedBwrap(t)
	p, err := local.New(local.Config{RunDir: testenv.RunDir(t), MaxLifetime: time.Hour, Limits: local.Limits{Processes: 64}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	for _, e := range p.Enforcement() {
		if e.Resource == "processes" && e.Missing != "" {
			testenv.Skipf(t, "the processes limit is not enforced here: %s", e.Missing)
		}
	}
	ctx := context.Background()
	s := open(t, session.Config{Provider: p, ProjectID: "stuck-local", Snapshots: snapshots(t)})
	if err := s.WriteFile(ctx, "/home/user/work.txt", []byte("not committed")); err != nil {
		t.Fatal(err)
	}
	before := s.SandboxID()
	if _, err := s.Start(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", "while :; do sleep 1000 & done 2>/dev/null"}}); err != nil {
		t.Fatal(err)
	}
	// Until the loop has used the processes up, a command may still start.
	var res sandbox.ExecResult
	testenv.WaitFor(t, "the sandbox whose processes a fork loop took to be replaced", func() bool {
		res, err = s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat", "work.txt"}})
		return s.SandboxID() != before
	})
	if err != nil || string(res.Stdout) != "not committed" {
		t.Fatalf("the command on the new sandbox: %q, %v (want the file kept and the command run)", res.Stdout, err)
	}
	if n := s.Notice(); !strings.Contains(n, "NOT restarted") || !strings.Contains(n, "while :") {
		t.Errorf("the notice does not say the fork loop was left behind: %q", n)
	}
	// The new sandbox has its processes: the loop was not carried over.
	for i := range 3 {
		if res, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "sleep 0.2; echo alive"}}); err != nil || string(res.Stdout) != "alive\n" {
			t.Fatalf("command %d on the new sandbox: %q, %v", i, res.Stdout, err)
		}
	}
}
