//go:build linux

package session_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/session"
	"github.com/toolhost/toolhost/internal/snapshot"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/tree"
)

// The windows in which a call could meet an ended sandbox around a rotation
// (docs/SNAPSHOTS.md, "Calls during a rotation"), each held open on purpose.

// gatedSnapshots holds the first save (a rotation's save ahead) once it has saved,
// until release is closed, after saying so on entered: what is written meanwhile is not
// in that snapshot.
type gatedSnapshots struct {
	*snapshot.Manager
	entered, release chan struct{}
	open             func() // closes release, once
	gated            bool
}

// newGated makes the gate; call open (a failing test's cleanup does) to let the save go.
func newGated(t *testing.T) *gatedSnapshots {
	g := &gatedSnapshots{Manager: snapshots(t), entered: make(chan struct{}), release: make(chan struct{})}
	g.open = sync.OnceFunc(func() { close(g.release) })
	return g
}

func (g *gatedSnapshots) SaveTree(ctx context.Context, projectID, label string, src tree.Source, excludes []string) (snapshot.Info, error) {
	info, err := g.Manager.SaveTree(ctx, projectID, label, src, excludes)
	g.hold()
	return info, err
}

func (g *gatedSnapshots) SaveLabeled(ctx context.Context, projectID, label string, pack func(io.Writer) error) (snapshot.Info, error) {
	info, err := g.Manager.SaveLabeled(ctx, projectID, label, pack)
	g.hold()
	return info, err
}

// hold holds the first save. Only rotations save in these tests, one at a time (rotMu).
func (g *gatedSnapshots) hold() {
	if !g.gated {
		g.gated = true
		close(g.entered)
		<-g.release
	}
}

// endRaw ends the sandbox under s as its end time would (its workspace kept for a
// handoff), behind the session's back, and waits until it is gone.
func endRaw(t *testing.T, raw sandbox.Sandbox) {
	t.Helper()
	if err := raw.SetTimeout(context.Background(), time.Nanosecond); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the sandbox to end", func() bool {
		_, err := raw.Stat(context.Background(), sandbox.WorkspaceRoot)
		return errors.Is(err, sandbox.ErrClosed)
	})
}

// A sandbox that ends while a rotation saves ahead of its handoff (its end came sooner
// than the session knew): the calls that meet it wait for the rotation, then run on the
// sandbox that replaces it, a command included (it never started: the ended sandbox
// refused it). Before, the call's recovery returned at once (a rotation was under way)
// and its retry met the same ended sandbox.
func TestEndDuringSaveAheadIsWaitedFor(t *testing.T) {
	snaps := newGated(t)
	logs := &logBuf{}
	s := open(t, session.Config{Provider: provider(t), ProjectID: "ends-under-save", Snapshots: snaps,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	t.Cleanup(snaps.open) // before the session's Close, which waits for the rotation
	ctx := context.Background()
	if err := s.WriteFile(ctx, "a.txt", []byte("A")); err != nil {
		t.Fatal(err)
	}
	rotated := make(chan error, 1)
	go func() { rotated <- s.Rotate(ctx) }() // ends when the save is released
	<-snaps.entered
	raw := s.Unwrap()
	endRaw(t, raw)

	read := make(chan error, 1)
	ran := make(chan error, 1)
	go func() { // each ends once the rotation is released, or at once when it failed
		b, err := s.ReadFile(ctx, "a.txt", 0)
		if err == nil && string(b) != "A" {
			err = errors.New("read " + string(b))
		}
		read <- err
	}()
	go func() {
		res, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat", "a.txt"}, Timeout: 10 * time.Second})
		if err == nil && string(res.Stdout) != "A" {
			err = errors.New("cat printed " + string(res.Stdout))
		}
		ran <- err
	}()
	testenv.WaitFor(t, "both calls to meet the ended sandbox", func() bool {
		return strings.Count(logs.String(), "reported closed") >= 2
	})
	snaps.open()
	if err := <-read; err != nil {
		t.Errorf("read_file that met the ended sandbox during the save ahead: %v", err)
	}
	if err := <-ran; err != nil {
		t.Errorf("a command that met the ended sandbox during the save ahead: %v", err)
	}
	if err := <-rotated; err != nil {
		t.Errorf("the rotation: %v\n%s", err, logs)
	}
	if s.SandboxID() == raw.ID() {
		t.Errorf("the ended sandbox %s is still the session's", raw.ID())
	}
}

// A command is started only on a sandbox that will outlive it: one whose timeout would
// carry it past its sandbox's last call (when the session must take the sandbox from
// its calls) is run on a new sandbox instead, the rotation coming first; a short one
// runs where it is.
func TestCommandRunsOnlyOnASandboxThatOutlivesIt(t *testing.T) {
	c := newClocked(t, 10*time.Minute)
	s := open(t, c.config(session.Config{
		ProjectID: "outlive", Snapshots: snapshots(t),
		TTL: 10 * time.Minute, MaxLifetime: 10 * time.Minute, KeepaliveMargin: 2 * time.Minute, LastCallMargin: time.Minute,
	}))
	ctx := context.Background()
	first := s.SandboxID()
	c.clock.Advance(7 * time.Minute) // 3 minutes left, 2 to the last call: no care yet
	if _, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if s.Rotations() != 0 {
		t.Fatalf("a 10 s command 2 minutes before the last call rotated the sandbox")
	}
	res, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"echo", "ran"}, Timeout: 150 * time.Second})
	if err != nil || string(res.Stdout) != "ran\n" {
		t.Fatalf("the long command: %q %v", res.Stdout, err)
	}
	if s.Rotations() != 1 || s.SandboxID() == first {
		t.Fatalf("a command that may run 150 s, 2 minutes before its sandbox's last call, ran there (%d rotations)", s.Rotations())
	}
}

// refusingHandoff is a provider whose handoffs fail (the new sandbox did not start).
type refusingHandoff struct{ sandbox.Provider }

func (p refusingHandoff) Handoff(context.Context, sandbox.Sandbox, sandbox.CreateOptions) (sandbox.Sandbox, error) {
	return nil, errors.New("injected: the new sandbox did not start")
}

func (p refusingHandoff) CanHandoff(old sandbox.Sandbox) bool {
	return sandbox.CanHandoff(p.Provider, old)
}

// A snapshot saved ahead of a handoff is a checkpoint: calls went on after it. When the
// handoff then fails, restoring it would drop their work (and tell the agent its files
// were kept); the rotation is put off instead, and the work stays where it is.
func TestFailedHandoffKeepsWorkDoneDuringTheSave(t *testing.T) {
	snaps := newGated(t)
	s := open(t, session.Config{Provider: refusingHandoff{provider(t)}, ProjectID: "handoff-fails", Snapshots: snaps,
		Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(snaps.open)
	ctx := context.Background()
	if err := s.WriteFile(ctx, "a.txt", []byte("before the save")); err != nil {
		t.Fatal(err)
	}
	rotated := make(chan error, 1)
	go func() { rotated <- s.Rotate(ctx) }()
	<-snaps.entered
	if err := s.WriteFile(ctx, "b.txt", []byte("during the save")); err != nil {
		t.Fatal(err)
	}
	snaps.open()
	if err := <-rotated; err == nil {
		t.Errorf("the rotation whose handoff failed says it rotated")
	}
	b, err := s.ReadFile(ctx, "b.txt", 0)
	if err != nil || string(b) != "during the save" {
		t.Fatalf("a file written while the rotation saved ahead, after its handoff failed: %q %v", b, err)
	}
}

// A command that meets a sandbox that ended on its own between calls runs on the next
// one: the sandbox refused it before it started (sandbox.ErrNotRun), so running it there
// is safe. Before, it failed as a command cut short would (ErrReplaced).
func TestCommandOnAnEndedSandboxRunsOnTheNext(t *testing.T) {
	logs := &logBuf{}
	s := open(t, session.Config{Provider: provider(t), ProjectID: "ended-between", Snapshots: snapshots(t),
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	ctx := context.Background()
	if err := s.WriteFile(ctx, "a.txt", []byte("A")); err != nil {
		t.Fatal(err)
	}
	endRaw(t, s.Unwrap())
	res, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat", "a.txt"}, Timeout: 10 * time.Second})
	if err != nil || string(res.Stdout) != "A" {
		t.Fatalf("a command after the sandbox ended: %q %v", res.Stdout, err)
	}
	if !strings.Contains(logs.String(), "nothing lost") {
		t.Errorf("the workspace was not handed over:\n%s", logs)
	}
}
