//go:build linux

package session_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/session"
	"github.com/toolhost/toolhost/internal/testenv"
)

var errLeaseLost = errors.New("test: the project's lease is lost")

// fence is a session's Config.Fence that a test turns on.
type fence struct{ on atomic.Bool }

func (f *fence) check() error {
	if f.on.Load() {
		return errLeaseLost
	}
	return nil
}

// snapshotCount is how many snapshots of project the store holds.
func snapshotCount(t *testing.T, st store.Store, project string) int {
	t.Helper()
	objs, err := store.ListAll(context.Background(), st, "projects/"+project+"/snapshots/")
	if err != nil {
		t.Fatal(err)
	}
	return len(objs)
}

// Once the session is fenced off (its lease lost), every sandbox operation is refused
// with the fence's error, its sandbox's abilities are not handed out, and it neither
// saves, extends nor rotates: not when asked, not when its sandbox nears its end.
func TestFencedSessionActsNoMore(t *testing.T) {
	c := newClocked(t, time.Hour)
	snaps, st := snapshotsOn(t, nil)
	var f fence
	s := open(t, c.config(session.Config{
		ProjectID: "fenced", Snapshots: snaps, Fence: f.check,
		TTL: time.Hour, MaxLifetime: time.Hour, KeepaliveMargin: 10 * time.Minute, RetryInterval: 30 * time.Second,
	}))
	ctx := context.Background()
	if err := s.WriteFile(ctx, "/home/user/a.txt", []byte("mine")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, "before"); err != nil {
		t.Fatal(err)
	}
	if _, ok := sandbox.As[sandbox.PortLister](s); !ok {
		t.Fatal("the session's sandbox lists no ports before the fence: the check below would prove nothing")
	}
	first, ends := s.SandboxID(), s.EndsAt()

	f.on.Store(true)
	for name, op := range map[string]func() error{
		"exec":  func() error { _, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); return err },
		"read":  func() error { _, err := s.ReadFile(ctx, "/home/user/a.txt", 0); return err },
		"write": func() error { return s.WriteFile(ctx, "/home/user/b.txt", []byte("late")) },
		"start": func() error {
			_, err := s.Start(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "60"}})
			return err
		},
		"preview": func() error { _, err := s.PreviewURL(ctx, 8000); return err },
		"terminal": func() error {
			_, err := s.StartTerminal(ctx, sandbox.TerminalRequest{Argv: []string{"sh"}}, sandbox.TerminalWait{})
			return err
		},
		"commit": func() error { _, err := s.Commit(ctx, "after"); return err },
		"rotate": func() error { return s.Rotate(ctx) },
		"extend": func() error { return s.SetTimeout(ctx, 2*time.Hour) },
		"reload": func() error { return s.Reload(ctx, "test") },
	} {
		if err := op(); !errors.Is(err, errLeaseLost) {
			t.Errorf("%s once fenced: %v, want the fence's error", name, err)
		}
	}
	if _, ok := sandbox.As[sandbox.PortLister](s); ok {
		t.Error("the fenced session still hands out its sandbox's abilities")
	}
	// Past the keepalive margin, and past the sandbox's end: the keepalive says it is
	// fenced off, and does nothing.
	c.clock.Advance(55 * time.Minute)
	testenv.WaitFor(t, "the keepalive to notice the fence", func() bool { return strings.Contains(c.logs.String(), "session: fenced off") })
	c.clock.Advance(10 * time.Minute)
	if n := len(c.provider.Sandboxes()); n != 1 || s.SandboxID() != first || !s.EndsAt().Equal(ends) {
		t.Errorf("the fenced session made %d sandboxes, or moved on from %s (now %s, ends %s, was %s)", n, first, s.SandboxID(), s.EndsAt(), ends)
	}
	if n := snapshotCount(t, st, "fenced"); n != 1 {
		t.Errorf("%d snapshots, want the one from before the fence", n)
	}
	if err := s.Close(ctx); err != nil {
		t.Errorf("Close of a fenced session: %v", err)
	}
}

// fencingStore stands for a fenced store whose lease is lost during a save: the first
// write of a snapshot turns the session's fence on and is refused.
type fencingStore struct {
	store.Store
	f     *fence
	armed atomic.Bool
}

func (s *fencingStore) Put(ctx context.Context, key string, r io.Reader, o store.PutOptions) (store.ObjectInfo, error) {
	if s.armed.Load() {
		s.f.on.Store(true)
	}
	if s.f.on.Load() {
		return store.ObjectInfo{}, fmt.Errorf("%w: %w", store.ErrFenced, errLeaseLost)
	}
	return s.Store.Put(ctx, key, r, o)
}

// A rotation at the last call whose save is fenced off (the lease lost while it saved)
// makes no sandbox and hands nothing over: the last call would otherwise move the work
// without a snapshot.
func TestFenceDuringLastCallRotation(t *testing.T) {
	for _, restore := range []bool{false, true} {
		t.Run(map[bool]string{false: "handoff", true: "restore"}[restore], func(t *testing.T) {
			c := newClocked(t, time.Hour)
			var f fence
			var fs *fencingStore
			snaps, st := snapshotsOn(t, func(st store.Store) store.Store { fs = &fencingStore{Store: st, f: &f}; return fs })
			s := open(t, c.config(session.Config{
				ProjectID: "lastcall", Snapshots: snaps, Fence: f.check, RestoreOnRotate: restore,
				TTL: time.Hour, MaxLifetime: time.Hour, KeepaliveMargin: 10 * time.Minute, LastCallMargin: 2 * time.Minute,
				RetryInterval: 30 * time.Second,
			}))
			ctx := context.Background()
			if err := s.WriteFile(ctx, "/home/user/work.txt", []byte("unsaved")); err != nil {
				t.Fatal(err)
			}
			fs.armed.Store(true)
			c.clock.Advance(59 * time.Minute) // within the last call: the rotation must happen now
			_, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}})
			if !errors.Is(err, errLeaseLost) {
				t.Fatalf("the call that ran into the last call: %v, want the fence's error", err)
			}
			if n := len(c.provider.Sandboxes()); n != 1 || s.Rotations() != 0 {
				t.Errorf("%d sandboxes, %d rotations after a last call fenced off mid-save, want 1 and 0\n%s", n, s.Rotations(), c.logs)
			}
			if !strings.Contains(c.logs.String(), "rotation dropped") {
				t.Errorf("the log does not say the rotation was dropped:\n%s", c.logs)
			}
			if n := snapshotCount(t, st, "lastcall"); n != 0 {
				t.Errorf("%d snapshots stored", n)
			}
		})
	}
}
