//go:build linux

package toolhost

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/fleet"
	"github.com/toolhost/toolhost/internal/rootapi"
	"github.com/toolhost/toolhost/internal/sandbox/e2b/e2bfake"
	"github.com/toolhost/toolhost/internal/session"
	"github.com/toolhost/toolhost/internal/testenv"
)

// TestFleetReapsOrphans: a replica's sandboxes carry the fleet's name. One handed over at
// a drain waits for a replica while the orphan bound runs, then any replica kills it;
// the sandbox of a project some replica holds is never killed, nor one another
// deployment (another fleet's name) started on the same account. The project's next
// session wakes from the commit the handoff made.
func TestFleetReapsOrphans(t *testing.T) {
	testenv.NeedBwrap(t)
	ctx := context.Background()
	f := e2bfake.Start(t, e2bfake.Config{Logger: slog.New(slog.DiscardHandler)})
	cfg := e2bConfig(t, "e2b", f)
	cfg.Lease.TTL, cfg.Lease.Renew = 3*time.Second, time.Second
	a := newToolhost(t, cfg)
	id, err := fleet.ID(ctx, a.storage.store)
	if err != nil {
		t.Fatal(err)
	}
	rootapi.SetFleet(a, rootapi.FleetMember{ID: id, Instance: "replicaA", Addr: "http://127.0.0.1:1"})

	gone := open(t, a, SessionOptions{Project: "gone"})
	expect(t, gone, "write_file", `{"path":"kept.txt","content":"committed at the handoff\n"}`, false)
	goneID := gone.live.SandboxID()
	busy := open(t, a, SessionOptions{Project: "busy"})
	expect(t, busy, "bash", `{"command":"true"}`, false)
	busyID := busy.live.SandboxID()
	// Another deployment's sandbox on the same account, labelled like ours but for its
	// own fleet.
	p, err := a.Provider(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := p.Create(ctx, sandbox.CreateOptions{Labels: map[string]string{
		session.LabelFleet: strings.Repeat("0", 32), session.LabelProject: "stranger", session.LabelEpoch: "1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close(ctx)
	if kept, err := gone.handoff(ctx); err != nil || !kept {
		t.Fatalf("handoff: kept %v, %v", kept, err)
	}

	b := newToolhost(t, cfg)
	rootapi.SetFleet(b, rootapi.FleetMember{ID: id, Instance: "replicaB", Addr: "http://127.0.0.1:2"})
	sbs, err := b.fleetSandboxes(ctx, id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	verdicts := map[string]fleet.Verdict{}
	for _, sb := range sbs {
		verdicts[sb.ID] = sb.Verdict
	}
	want := map[string]fleet.Verdict{goneID: fleet.Waiting, busyID: fleet.Held}
	if len(verdicts) != len(want) || verdicts[goneID] != want[goneID] || verdicts[busyID] != want[busyID] {
		t.Fatalf("the fleet's sandboxes: %+v, want %v", sbs, want)
	}
	if killed, err := b.reapOrphans(ctx, time.Hour); err != nil || len(killed) != 0 {
		t.Fatalf("reaping within the bound killed %+v, %v", killed, err)
	}
	killed, err := b.reapOrphans(ctx, time.Millisecond)
	if err != nil || len(killed) != 1 || killed[0].ID != goneID {
		t.Fatalf("reaping past the bound killed %+v, %v; want only %s", killed, err, goneID)
	}
	alive := f.SandboxIDs()
	if slices.Contains(alive, goneID) || !slices.Contains(alive, busyID) || !slices.Contains(alive, stranger.ID()) {
		t.Fatalf("after the reaping the fake has %v: want %s gone, %s (held) and %s (another fleet's) alive", alive, goneID, busyID, stranger.ID())
	}
	// The project's next session finds its sandbox gone and wakes from the handoff's commit.
	next := open(t, b, SessionOptions{Project: "gone"})
	expect(t, next, "read_file", `{"path":"kept.txt"}`, false, "committed at the handoff")
	if next.live.SandboxID() == goneID {
		t.Fatal("the next session runs in the killed sandbox")
	}
}
