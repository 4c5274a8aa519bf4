package lease

import (
	"context"
	"errors"
	"io"
	"maps"
	"strconv"
	"syscall"
	"time"

	"github.com/toolhost/toolhost/core/store"
)

// Object metadata Fence writes on every object it stores: who wrote it, under which
// lease, and when the write began.
const (
	// MetaInstance is the writer's fleet instance (Holder.Instance; absent outside a
	// fleet).
	MetaInstance = "writer-instance"
	// MetaHolder is the writer's holder id (Holder.ID).
	MetaHolder = "writer-holder"
	// MetaEpoch is the writer's fencing token (Lease.Epoch), in decimal.
	MetaEpoch = "writer-epoch"
	// MetaTime is when the write began, on the writer's clock (RFC 3339, UTC, to the
	// nanosecond).
	MetaTime = "writer-time"
)

// fencedError is a write refused because the lease is lost: it matches ErrFenced (so
// store.ErrFenced and ErrLost) and unwraps to the loss.
type fencedError struct{ lost error }

func (e *fencedError) Error() string        { return store.ErrFenced.Error() + ": " + e.lost.Error() }
func (e *fencedError) Is(target error) bool { return target == ErrFenced || target == store.ErrFenced }
func (e *fencedError) Unwrap() error        { return e.lost }

// Fence is nil while the lease is held, and an error matching ErrFenced (and ErrLost)
// once it is lost (Err): what a holder's writes, and its sandbox's operations, are
// refused with.
func (l *Lease) Fence() error {
	if err := l.Err(); err != nil {
		return &fencedError{lost: err}
	}
	return nil
}

// Done is closed when the lease is lost: another host took it over, a renewal came too
// late, or Release. (Its expiry passing unseen by a renewal shows in Err at once, and
// closes Done when the renewing goroutine next looks.)
func (l *Lease) Done() <-chan struct{} { return l.lostc }

func (l *Lease) closeLost() {
	if l.lostc != nil {
		l.lostOnce.Do(func() { close(l.lostc) })
	}
}

// Context returns a context that ends with parent or with the lease: when Done is
// closed, or when this host's clock passes the lease's expiry with no renewal having
// moved it (a write started just before a stall ends there, never later). Its cause
// (context.Cause) is then an error matching ErrFenced. Call cancel when done with it:
// it stops the goroutine that watches the lease.
func (l *Lease) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	if err := l.Fence(); err != nil {
		cancel(err)
		return ctx, func() {}
	}
	go func() { // owned by the returned cancel (or parent's end)
		for {
			t := time.NewTimer(max(l.Expires().Sub(l.cfg.now()), 0))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-l.lostc:
				t.Stop()
				cancel(l.Fence())
				return
			case <-t.C:
				if err := l.Fence(); err != nil {
					cancel(err)
					return
				}
			}
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// Fence wraps st for the writes of l's holder: every Put and Delete is refused with an
// error matching ErrFenced, writing nothing, once l is lost; it runs under l.Context, so
// a write cut short by the loss fails with ErrFenced too; and every object it stores
// carries the writer's MetaInstance, MetaHolder, MetaEpoch and MetaTime. Reads pass
// through. With a nil l it returns st. The wrapper keeps st's URLer.
func Fence(st store.Store, l *Lease) store.Store {
	if l == nil {
		return st
	}
	f := &fenced{Store: st, l: l}
	if u, ok := st.(store.URLer); ok {
		return &fencedURLer{fenced: f, u: u}
	}
	return f
}

type fenced struct {
	store.Store
	l *Lease
}

type fencedURLer struct {
	*fenced
	u store.URLer
}

var _ store.URLer = (*fencedURLer)(nil)

func (f *fencedURLer) URL(ctx context.Context, key string, ttl time.Duration) (string, error) {
	return f.u.URL(ctx, key, ttl)
}

func (f *fenced) Put(ctx context.Context, key string, r io.Reader, opts store.PutOptions) (store.ObjectInfo, error) {
	if err := f.l.Fence(); err != nil {
		return store.ObjectInfo{}, err
	}
	md := make(map[string]string, len(opts.Metadata)+4)
	maps.Copy(md, opts.Metadata)
	h := f.l.Holder()
	if h.Instance != "" {
		md[MetaInstance] = h.Instance
	}
	md[MetaHolder] = h.ID
	md[MetaEpoch] = strconv.FormatUint(f.l.Epoch(), 10)
	md[MetaTime] = time.Now().UTC().Format(time.RFC3339Nano)
	opts.Metadata = md
	wctx, cancel := f.l.Context(ctx)
	defer cancel()
	info, err := f.Store.Put(wctx, key, r, opts)
	return info, f.cut(ctx, wctx, err)
}

func (f *fenced) Delete(ctx context.Context, keys ...string) error {
	if err := f.l.Fence(); err != nil {
		return err
	}
	wctx, cancel := f.l.Context(ctx)
	defer cancel()
	return f.cut(ctx, wctx, f.Store.Delete(wctx, keys...))
}

// cut turns the failure of a write whose context the lease ended into the loss.
func (f *fenced) cut(parent, wctx context.Context, err error) error {
	if err == nil || parent.Err() != nil {
		return err
	}
	if cause := context.Cause(wctx); errors.Is(cause, ErrFenced) {
		return cause
	}
	return err
}

// Hello asks the fleet endpoint at addr which instance answers there. An address where
// nothing listens fails with an error matching syscall.ECONNREFUSED (as net.Dial's do).
type Hello func(ctx context.Context, addr string) (instance string, err error)

// ProbeWith makes a Config.Probe of a fleet's hello call: a holder is Dead when its
// address refuses the connection or another instance answers there, Alive when it
// answers itself, Unknown otherwise (no address or instance in its record, no answer in
// time, any other failure).
func ProbeWith(hello Hello) func(context.Context, Holder) Liveness {
	return func(ctx context.Context, h Holder) Liveness {
		if h.Addr == "" || h.Instance == "" {
			return Unknown
		}
		inst, err := hello(ctx, h.Addr)
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			return Dead
		case err != nil || inst == "":
			return Unknown
		case inst == h.Instance:
			return Alive
		default:
			return Dead
		}
	}
}
