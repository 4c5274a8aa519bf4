package fleet

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/lease"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// TestID: the first replica names the fleet, every later one (and one joining at the
// same time) reads the same name, and a record that is not a name is refused, never
// replaced.
func TestID(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	if _, err := ReadID(ctx, st); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("ReadID of a new store: %v, want ErrNotFound", err)
	}
	ids := make([]string, 8)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			id, err := ID(ctx, st)
			if err != nil {
				t.Error(err)
			}
			ids[i] = id
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] || !validID(id) {
			t.Fatalf("replicas joining at once named the fleet %q", ids)
		}
	}
	if got, err := ReadID(ctx, st); err != nil || got != ids[0] {
		t.Fatalf("ReadID = %q, %v; want %q", got, err, ids[0])
	}
	bad := newStore(t)
	b := []byte("../../not-a-name")
	if _, err := bad.Put(ctx, storekeys.FleetID, bytes.NewReader(b), store.PutOptions{Size: int64(len(b))}); err != nil {
		t.Fatal(err)
	}
	if id, err := ID(ctx, bad); err == nil {
		t.Fatalf("ID over a record that is no name = %q, want an error", id)
	}
}

// TestJudge: a sandbox of a held project is held; one of a project free since less than
// the bound waits, with when it stops waiting; free for longer, or never leased, an
// orphan; a project whose lease cannot be read leaves its sandboxes held.
func TestJudge(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	const after = 10 * time.Minute
	leases := map[string]lease.State{
		"held":   {Held: true, Expires: now.Add(time.Minute), Generation: 4, Epoch: 4},
		"recent": {Expires: now.Add(-time.Minute), Generation: 3},
		"old":    {Expires: now.Add(-after - time.Second), Generation: 7},
		"never":  {},
		"broken": {},
	}
	peeks := map[string]int{}
	peek := func(_ context.Context, p string) (lease.State, error) {
		peeks[p]++
		if p == "broken" {
			return lease.State{}, errors.New("the store did not answer")
		}
		return leases[p], nil
	}
	sbs := []Sandbox{{ID: "a", Project: "held"}, {ID: "b", Project: "recent"}, {ID: "c", Project: "old"},
		{ID: "d", Project: "never"}, {ID: "e", Project: "broken"}, {ID: "f", Project: "old"}}
	Judge(context.Background(), sbs, peek, now, after)
	want := map[string]Verdict{"a": Held, "b": Waiting, "c": Orphan, "d": Orphan, "e": Held, "f": Orphan}
	for _, sb := range sbs {
		if sb.Verdict != want[sb.ID] {
			t.Errorf("sandbox %s of project %s: %s, want %s", sb.ID, sb.Project, sb.Verdict, want[sb.ID])
		}
	}
	if u := sbs[1].Until; !u.Equal(now.Add(-time.Minute).Add(after)) {
		t.Errorf("the waiting sandbox waits until %v", u)
	}
	if peeks["old"] != 1 {
		t.Errorf("project old's lease was read %d times for its two sandboxes, want once", peeks["old"])
	}
}
