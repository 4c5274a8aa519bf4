package lease

import (
	"context"
	"time"

	"github.com/toolhost/toolhost/core/store"
)

// State is what a project's newest lease generation says, read without taking it.
type State struct {
	// Held: a holder has it, not released, not expired by this host's clock.
	Held    bool
	Holder  Holder
	Expires time.Time
	// Epoch is the holder's fencing token (0 for a record written before epochs).
	Epoch uint64
	// Generation is the newest generation's number (0: the project has no lease).
	Generation uint64
}

// Peek reads project's lease without taking it: who holds it, if anyone. A replica of a
// fleet uses it to find where a project's requests go; the answer may be stale by the
// time it is used, and the store stays the judge (Acquire).
func Peek(ctx context.Context, st store.Store, project string) (State, error) {
	l := &Lease{cfg: Config{Store: st}, project: project}
	if err := l.cfg.defaults(); err != nil {
		return State{}, err
	}
	n, rec, err := l.newest(ctx)
	if err != nil || rec == nil {
		return State{}, err
	}
	return State{Held: !rec.Released && l.cfg.now().Before(rec.Expires), Holder: rec.Holder,
		Expires: rec.Expires, Epoch: rec.Epoch, Generation: n}, nil
}
