//go:build linux

package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/testenv"
)

// A handoff gives the workspace to the next sandbox only once no process of the old one
// can touch it again: a writer the old sandbox left running writes nothing after Handoff
// returns, though the old sandbox is killed on the provider's time (frozen first), and
// all of it is gone once its shutdown ends.
func TestHandoffStopsTheOldBeforeTheNew(t *testing.T) {
	p := newProvider(t, Config{})
	p.freezeWait = testenv.HangBound // the freeze path, however slow a loaded machine is
	dir := t.TempDir()
	old := newSandbox(t, p, sandbox.CreateOptions{Workspace: dir})
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	if _, err := old.Start(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", "while :; do date +%s%N > tick.new; mv tick.new tick; done"}}); err != nil {
		t.Fatal(err)
	}
	tick := filepath.Join(dir, "tick")
	if !testenv.Eventually(func() bool { _, err := os.Stat(tick); return err == nil }) {
		t.Fatal("the writer did not start")
	}
	initPID, bwrapPID := old.initPID, old.cmd.Process.Pid
	next, err := p.Handoff(ctx, old, sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { next.Close(context.Background()) })
	at, err := os.ReadFile(tick)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if now, _ := os.ReadFile(tick); string(now) != string(at) {
		t.Fatalf("the old sandbox wrote after the handoff: %q then %q", at, now)
	}
	if _, err := old.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("the old sandbox after the handoff: %v, want ErrClosed", err)
	}
	if old.cg != nil && !old.frozen.Load() {
		t.Error("the old sandbox has a cgroup but the handoff did not freeze it")
	}
	if got := out(t, next, "cat tick; echo new > n; cat n"); got != string(at)+"new" {
		t.Fatalf("the next sandbox reads %q, want the old one's last tick %q and its own file", got, at)
	}
	select {
	case <-old.closeDone:
	case <-ctx.Done():
		t.Fatal("the old sandbox's shutdown did not end")
	}
	for _, pid := range []int{initPID, bwrapPID} {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			st, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
			t.Errorf("process %d (init %d, bwrap %d) of the old sandbox after its shutdown: %v: %s", pid, initPID, bwrapPID, err, st)
		}
	}
	if now, _ := os.ReadFile(tick); string(now) != string(at) {
		t.Fatalf("the old sandbox wrote before it died: %q then %q", at, now)
	}
}
