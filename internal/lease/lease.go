// Package lease keeps two hosts that share a store from running one project at once: a
// project's lease is an object in the store that names its holder (host name, process,
// a random id) and an expiry, which the holder renews while it runs and gives up when it
// closes.
//
// # The scheme: generations created exclusively
//
// The lease is a sequence of generations, objects
// projects/{project}/lease/{generation, 20 digits}. The newest generation (the highest
// number, found by listing) says who holds the project and until when; older ones are
// removed as newer ones appear. Every change is the exclusive creation
// (store.PutOptions.IfNotExists: an O_EXCL-like hard link in the directory store, a PUT
// with If-None-Match: * on S3) of the generation after the newest one read:
//
//   - acquire: no generation, or the newest is released or expired: create newest+1;
//   - renew: the holder of generation n creates n+1 with a later expiry;
//   - release: the holder of n creates n+1 marked released.
//
// Two hosts taking over one expired lease both try to create the same next generation:
// the store lets exactly one of them; the other gets store.ErrExists, reads the winner's
// live generation and answers with a *HeldError. A renewal racing a takeover is the same
// race: if the taker wins, the holder's renewal fails and the holder knows it lost the
// lease. Since generations are removed only once a newer one exists, a generation
// number can be created again only when a higher one is already there; so after each
// creation the creator lists the generations and, when a higher one exists, has lost.
// The newest generation is never removed, but by the host that just created it when
// that listing fails (it cannot tell whether it won; no one holds the lease then, and
// the next host takes it).
//
// # A holder found dead, and fencing
//
// A host whose holder died would wait out the ttl. With Config.Probe it asks instead:
// when the newest generation is live but the probe answers Dead (in a fleet: nothing
// listens at the holder's advertised address, or another instance answers there), it
// creates the next generation at once, exclusively as always, so the store still judges
// a race with the holder's own renewal. Alive or Unknown: the *HeldError, as without a
// probe.
//
// A holder that stalled (a paused process, a machine that stopped) and wakes after
// another took over must not write what the new holder may be writing. Fence wraps the
// store of the holder's writes: each Put and Delete first checks the lease (Err: the loss
// the renewals found, and the expiry on this host's monotonic clock, which runs on while
// a process is stopped), is refused with an error matching ErrFenced when it is lost, and
// runs under a context that ends when the lease does (Context); what it stores carries
// the writer's instance, epoch and time as object metadata. What fencing cannot do is
// recall a write already handed to the store when the holder stalled: the store has no
// conditional write on another object's state. Such an object names its writer's epoch,
// lower than the new holder's.
//
// What the scheme assumes: the store's conditional create and listing are strongly
// consistent (both backends are, as storetest proves; AWS S3 lists consistently since
// 2020 and honours If-None-Match since 2024; Check finds out a store that ignores it),
// and the hosts' clocks
// agree to well within the lease's ttl (expiry is a wall-clock time written by the holder
// and judged by the taker). A holder treats its lease as lost once its last renewal's
// expiry passes without a newer one (Err), so a host that stalls stops acting on the
// project at the moment another may take over.
package lease

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// Defaults of Config.
const (
	DefaultTTL          = 30 * time.Second
	DefaultRenew        = 10 * time.Second
	DefaultProbeTimeout = time.Second
)

// ErrHeld matches a *HeldError: the project is open on another host.
var ErrHeld = errors.New("project is open on another host")

// ErrUnsupported: the store does not honour exclusive creation (Check).
var ErrUnsupported = errors.New("the store cannot keep project leases")

// ErrLost: the lease ran out before it could be renewed, or another host took it over.
var ErrLost = errors.New("project lease lost")

// ErrFenced: a write of a holder whose lease is lost was refused (Fence, Lease.Fence).
// It matches ErrLost and store.ErrFenced too (errors.Is).
var ErrFenced = fmt.Errorf("%w: %w", store.ErrFenced, ErrLost)

// Liveness is what a Config.Probe found of a lease's holder.
type Liveness int

const (
	// Unknown: the probe could not tell (no address to ask, no answer in time, an
	// answer it cannot read). The lease is honoured until it expires.
	Unknown Liveness = iota
	// Alive: the holder answered.
	Alive
	// Dead: the holder is gone (nothing listens at its address, or another instance
	// answers there): its lease may be taken over at once.
	Dead
)

func (v Liveness) String() string {
	switch v {
	case Alive:
		return "alive"
	case Dead:
		return "dead"
	}
	return "unknown"
}

// HeldError says who holds a project's lease. Its message is for people (and models):
// it names the host and process, never the fleet's instance or address, which Holder
// carries for a fleet to forward to the holder.
type HeldError struct {
	Project string
	Holder  Holder
	// Expires is when the holder's lease runs out unless it renews it.
	Expires time.Time
	// Liveness is what Config.Probe answered of the holder (Alive or Unknown; Unknown
	// when there is no probe).
	Liveness Liveness
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("project %s is open on host %s (pid %d, since %s); close it there or wait until %s",
		e.Project, e.Holder.Host, e.Holder.PID, e.Holder.Since.UTC().Format(time.RFC3339), e.Expires.UTC().Format(time.RFC3339))
}

// Is makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// Holder is who holds a lease.
type Holder struct {
	Host string `json:"host"`
	PID  int    `json:"pid"`
	// ID tells apart two holders in one process (and a restarted process with the same
	// pid): random, made per Acquire.
	ID string `json:"id"`
	// Since is when the holder acquired the lease.
	Since time.Time `json:"since"`
	// Instance names the holder's process in a fleet (random per start of a serve
	// replica; empty outside a fleet): a replica that answers at Addr with another
	// instance is not the holder.
	Instance string `json:"instance,omitempty"`
	// Addr is where the holder's fleet endpoint is advertised (empty outside a fleet).
	// Data from the store, like the rest of the record: never trusted as an address to
	// send a client's credentials to.
	Addr string `json:"addr,omitempty"`
}

// record is one generation's object.
type record struct {
	Holder
	Expires  time.Time `json:"expires"`
	Released bool      `json:"released,omitempty"`
	// Epoch is the generation the holder acquired the lease at: the same in every
	// renewal, higher for every later holder (a fencing token).
	Epoch uint64 `json:"epoch,omitempty"`
}

// maxRecord bounds what is read of a generation: the store is shared, its contents are
// not trusted to be small.
const maxRecord = 4 << 10

// Config is how leases are taken.
type Config struct {
	// Store holds the leases. Its Put must honour IfNotExists (see Check).
	Store store.Store
	// TTL is how long a lease lasts without renewal (DefaultTTL when 0).
	TTL time.Duration
	// Renew is how often the holder renews (DefaultRenew when 0); less than TTL.
	Renew time.Duration
	// CallTimeout bounds each store call (when 0, the larger of Renew and 5 s); a renewal
	// also ends at the lease's expiry.
	CallTimeout time.Duration
	// Host names this host in the record (os.Hostname when empty).
	Host string
	// Instance and Addr, in a fleet, name this replica and where it is reached
	// (Holder.Instance, Holder.Addr).
	Instance, Addr string
	// Logger receives renewals' failures, takeovers and the loss of a lease
	// (slog.Default when nil).
	Logger *slog.Logger
	// Prefix, when set, is the folder of the generations instead of the project's
	// (Prefix(project)): a lease on something other than a project, such as the chunk
	// store's collector. It ends in "/".
	Prefix string
	// OnLost, when set, is called once (from the renewing goroutine) when the lease is
	// lost; Err reports it too.
	OnLost func(error)
	// Probe, when set, asks whether the holder of a live lease is alive (ProbeWith
	// makes one from a fleet's hello call). Acquire takes the lease of a holder it finds
	// Dead at once, without waiting for its expiry. It is called with a context that ends
	// after ProbeTimeout, and must return by then. What the record says of the holder
	// (its Addr) is the store's data: a probe only asks there, it sends nothing else.
	Probe func(ctx context.Context, h Holder) Liveness
	// ProbeTimeout bounds a probe (DefaultProbeTimeout when 0).
	ProbeTimeout time.Duration

	// now is the clock (time.Now when nil): tests move it to expire leases.
	now func() time.Time
}

func (c *Config) defaults() error {
	if c.Store == nil {
		return errors.New("lease: no store")
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.Renew == 0 {
		c.Renew = DefaultRenew
	}
	if c.TTL <= 0 || c.Renew <= 0 || c.Renew >= c.TTL {
		return fmt.Errorf("lease: renew interval %s must be positive and less than the ttl %s", c.Renew, c.TTL)
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = max(c.Renew, 5*time.Second)
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = DefaultProbeTimeout
	}
	if c.Host == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			h = "unknown"
		}
		c.Host = h
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.now == nil {
		c.now = time.Now
	}
	return nil
}

// Prefix is where a project's lease generations live.
func Prefix(project string) string { return storekeys.Lease(project) }

func genKey(project string, n uint64) string { return storekeys.LeaseGeneration(project, n) }

func genKeyIn(prefix string, n uint64) string { return fmt.Sprintf("%s%020d", prefix, n) }

// prefix is the folder of this lease's generations.
func (l *Lease) prefix() string {
	if l.cfg.Prefix != "" {
		return l.cfg.Prefix
	}
	return Prefix(l.project)
}

// Lease is a held lease. Its renewing goroutine runs until Release.
type Lease struct {
	cfg     Config
	project string
	holder  Holder

	mu      sync.Mutex
	gen     uint64    // the newest generation this holder created
	epoch   uint64    // the generation it acquired the lease at (Epoch)
	expires time.Time // its expiry
	lost    error     // set once: ErrLost wrapped

	stop     chan struct{} // closed by Release: the renewing goroutine returns
	done     chan struct{} // closed by the renewing goroutine when it returns
	once     sync.Once
	lostc    chan struct{} // closed once lost is set (Done)
	lostOnce sync.Once
}

// Acquire takes project's lease, or answers a *HeldError naming the host that holds it.
// An expired or released lease is taken over. On success a goroutine renews the lease
// every cfg.Renew until Release (the Lease owns it; Release stops it).
func Acquire(ctx context.Context, cfg Config, project string) (*Lease, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	first := genKey(project, 0)
	if cfg.Prefix != "" {
		first = genKeyIn(cfg.Prefix, 0)
	}
	if err := store.ValidKey(first); err != nil {
		return nil, fmt.Errorf("lease of project %q: %w", project, err)
	}
	id := make([]byte, 8)
	rand.Read(id)
	l := &Lease{cfg: cfg, project: project,
		holder: Holder{Host: cfg.Host, PID: os.Getpid(), ID: hex.EncodeToString(id), Since: cfg.now().UTC(),
			Instance: cfg.Instance, Addr: cfg.Addr},
		stop: make(chan struct{}), done: make(chan struct{}), lostc: make(chan struct{})}
	// A holder is probed once per Acquire: probed names it, and the generation it was
	// probed at.
	var probed struct {
		id  string
		gen uint64
		lv  Liveness
	}
	// Each round reads the newest generation and tries to create the next; a round
	// is lost only to another host's creation, which the next round reads.
	for range 8 {
		n, cur, err := l.newest(ctx)
		if err != nil {
			return nil, err
		}
		live := cur != nil && !cur.Released && cfg.now().Before(cur.Expires)
		if live {
			switch {
			case probed.id == "" || probed.id != cur.ID:
				probed.id, probed.gen, probed.lv = cur.ID, n, l.probe(ctx, project, cur.Holder)
			case n > probed.gen:
				// Found dead, yet it renewed since (it won the race of our takeover):
				// it lives.
				probed.gen, probed.lv = n, Alive
			}
			if probed.lv != Dead {
				return nil, &HeldError{Project: project, Holder: cur.Holder, Expires: cur.Expires, Liveness: probed.lv}
			}
		}
		exp := cfg.now().Add(cfg.TTL)
		won, err := l.claim(ctx, n+1, record{Holder: l.holder, Expires: exp, Epoch: n + 1})
		if err != nil {
			return nil, err
		}
		if !won {
			continue
		}
		l.epoch = n + 1
		switch {
		case live:
			cfg.Logger.Warn("took over the project lease of a holder found dead, before its expiry", "project", project,
				"from_host", cur.Holder.Host, "from_pid", cur.Holder.PID, "from_instance", cur.Holder.Instance,
				"from_addr", cur.Holder.Addr, "expires", cur.Expires, "epoch", l.epoch)
		case cur != nil && !cur.Released:
			cfg.Logger.Warn("took over an expired project lease", "project", project,
				"from_host", cur.Holder.Host, "from_pid", cur.Holder.PID, "expired", cur.Expires, "epoch", l.epoch)
		}
		l.gen, l.expires = n+1, exp
		go l.renewLoop()
		return l, nil
	}
	return nil, fmt.Errorf("taking the lease of project %s: other hosts kept changing it; try again", project)
}

// probe asks cfg.Probe about the holder of a live lease, within ProbeTimeout; Unknown
// without a probe.
func (l *Lease) probe(ctx context.Context, project string, h Holder) Liveness {
	if l.cfg.Probe == nil {
		return Unknown
	}
	pctx, cancel := context.WithTimeout(ctx, l.cfg.ProbeTimeout)
	defer cancel()
	lv := l.cfg.Probe(pctx, h)
	if lv != Alive && lv != Dead {
		lv = Unknown
	}
	l.cfg.Logger.Info("probed the holder of a live project lease", "project", project, "holder_host", h.Host,
		"holder_pid", h.PID, "holder_instance", h.Instance, "holder_addr", h.Addr, "liveness", lv.String())
	return lv
}

// Holder is this lease's holder.
func (l *Lease) Holder() Holder { return l.holder }

// Epoch is the generation this holder acquired the lease at: constant while it holds the
// lease, and higher for every holder after it. It is the fencing token a holder's writes
// carry, so that a write of a holder that lost the lease can be told from the new one's.
func (l *Lease) Epoch() uint64 { return l.epoch }

// Expires is when the lease runs out unless renewed.
func (l *Lease) Expires() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expires
}

// Err is nil while the lease is held: an error matching ErrLost once it ran out before
// a renewal or another host took it over, and after Release.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != nil {
		return l.lost
	}
	if !l.cfg.now().Before(l.expires) {
		return fmt.Errorf("%w: project %s: not renewed before %s", ErrLost, l.project, l.expires.UTC().Format(time.RFC3339))
	}
	return nil
}

// Release stops the renewals and gives the lease up (a released generation), so another
// host can open the project at once. It waits for the store at most until ctx ends.
// Calling it again does nothing.
func (l *Lease) Release(ctx context.Context) error {
	var err error
	l.once.Do(func() {
		close(l.stop)
		<-l.done
		l.mu.Lock()
		lost, n := l.lost, l.gen
		if lost == nil {
			l.lost = fmt.Errorf("%w: project %s: released", ErrLost, l.project)
		}
		l.mu.Unlock()
		l.closeLost()
		if lost != nil {
			return // another host holds it now, or it ran out: nothing of ours to give up
		}
		_, err = l.claim(ctx, n+1, record{Holder: l.holder, Expires: l.cfg.now(), Released: true, Epoch: l.epoch})
		if err != nil {
			err = fmt.Errorf("releasing the lease of project %s: %w", l.project, err)
		}
	})
	return err
}

// renewLoop renews the lease every Renew (sooner after a failure) until Release or the
// loss of the lease. Started by Acquire; Release stops it and waits for it.
func (l *Lease) renewLoop() {
	defer close(l.done)
	wait := l.cfg.Renew
	for {
		t := time.NewTimer(wait)
		select {
		case <-l.stop:
			t.Stop()
			return
		case <-t.C:
		}
		if err := l.renew(); err != nil {
			if errors.Is(err, ErrLost) {
				l.setLost(err)
				return
			}
			l.cfg.Logger.Warn("renewing the project lease failed; trying again", "project", l.project, "err", err)
			wait = min(l.cfg.Renew, time.Second)
			continue
		}
		wait = l.cfg.Renew
	}
}

func (l *Lease) setLost(err error) {
	l.mu.Lock()
	first := l.lost == nil
	if first {
		l.lost = err
	}
	l.mu.Unlock()
	l.closeLost()
	if first {
		l.cfg.Logger.Error("the project lease is lost: another host may open the project", "project", l.project, "err", err)
		if l.cfg.OnLost != nil {
			l.cfg.OnLost(err)
		}
	}
}

// renew creates the next generation with a later expiry. ErrLost when it is too late
// or another host created that generation.
func (l *Lease) renew() error {
	if err := l.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	n := l.gen
	l.mu.Unlock()
	exp := l.cfg.now().Add(l.cfg.TTL)
	// A stalled renewal must not run past the lease's expiry: ctx ends there at the latest.
	ctx, cancel := context.WithDeadline(context.Background(), l.Expires())
	defer cancel()
	won, err := l.claim(ctx, n+1, record{Holder: l.holder, Expires: exp, Epoch: l.epoch})
	if err != nil {
		return err
	}
	if !won {
		return fmt.Errorf("%w: project %s: another host took it over", ErrLost, l.project)
	}
	l.mu.Lock()
	l.gen, l.expires = n+1, exp
	l.mu.Unlock()
	return nil
}

// newest lists the project's generations and reads the highest; (0, nil) when there is
// none. Older generations found are removed (best effort).
func (l *Lease) newest(ctx context.Context) (uint64, *record, error) {
	for range 8 {
		gens, err := l.list(ctx)
		if err != nil {
			return 0, nil, err
		}
		if len(gens) == 0 {
			return 0, nil, nil
		}
		n := gens[len(gens)-1]
		rec, err := l.read(ctx, n)
		if errors.Is(err, store.ErrNotFound) {
			continue // removed since the listing: a newer one exists
		}
		if err != nil {
			return 0, nil, err
		}
		return n, rec, nil
	}
	return 0, nil, fmt.Errorf("reading the lease of project %s: it kept changing; try again", l.project)
}

// claim creates generation n holding rec. It reports false when n exists, or when a
// higher generation exists after the creation (n had been removed: see the package doc),
// in which case the created object is removed again. On success the generations below
// n are removed (best effort).
func (l *Lease) claim(ctx context.Context, n uint64, rec record) (bool, error) {
	body, err := json.Marshal(rec)
	if err != nil {
		return false, err
	}
	key := genKeyIn(l.prefix(), n)
	cctx, cancel := context.WithTimeout(ctx, l.cfg.CallTimeout)
	_, err = l.cfg.Store.Put(cctx, key, bytes.NewReader(body), store.PutOptions{
		Size: int64(len(body)), ContentType: "application/json", IfNotExists: true})
	cancel()
	if errors.Is(err, store.ErrExists) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("writing the lease of project %s: %w", l.project, err)
	}
	gens, err := l.list(ctx)
	if err != nil {
		// Unverified, the generation cannot be trusted; left, it would keep the project
		// closed to others for a ttl with no one renewing it.
		l.remove(ctx, []uint64{n})
		return false, err
	}
	if len(gens) > 0 && gens[len(gens)-1] > n {
		l.remove(ctx, []uint64{n})
		return false, nil
	}
	var older []uint64
	for _, g := range gens {
		if g < n {
			older = append(older, g)
		}
	}
	l.remove(ctx, older)
	return true, nil
}

// list returns the project's generation numbers, in increasing order.
func (l *Lease) list(ctx context.Context) ([]uint64, error) {
	cctx, cancel := context.WithTimeout(ctx, l.cfg.CallTimeout)
	defer cancel()
	prefix := l.prefix()
	objs, err := store.ListAll(cctx, l.cfg.Store, prefix)
	if err != nil {
		return nil, fmt.Errorf("listing the lease of project %s: %w", l.project, err)
	}
	var gens []uint64
	for _, o := range objs {
		s := strings.TrimPrefix(o.Key, prefix)
		if len(s) != 20 {
			continue
		}
		if n, err := strconv.ParseUint(s, 10, 64); err == nil {
			gens = append(gens, n)
		}
	}
	slices.Sort(gens)
	return gens, nil
}

func (l *Lease) read(ctx context.Context, n uint64) (*record, error) {
	cctx, cancel := context.WithTimeout(ctx, l.cfg.CallTimeout)
	defer cancel()
	key := genKeyIn(l.prefix(), n)
	r, _, err := l.cfg.Store.Get(cctx, key)
	if err != nil {
		return nil, fmt.Errorf("reading the lease of project %s: %w", l.project, err)
	}
	defer r.Close()
	body, err := io.ReadAll(io.LimitReader(r, maxRecord+1))
	if err != nil {
		return nil, fmt.Errorf("reading the lease of project %s: %w", l.project, err)
	}
	var rec record
	if len(body) > maxRecord || json.Unmarshal(body, &rec) != nil || rec.Expires.IsZero() {
		// Not a lease this package wrote: it cannot be honoured, nor ignored (a newer
		// generation must still follow it). Treat it as expired.
		l.cfg.Logger.Warn("a project lease generation is unreadable; treating it as expired", "project", l.project, "key", key)
		return &record{Holder: Holder{Host: "unknown"}}, nil
	}
	return &rec, nil
}

func (l *Lease) remove(ctx context.Context, gens []uint64) {
	if len(gens) == 0 {
		return
	}
	keys := make([]string, len(gens))
	for i, g := range gens {
		keys[i] = genKeyIn(l.prefix(), g)
	}
	cctx, cancel := context.WithTimeout(ctx, l.cfg.CallTimeout)
	defer cancel()
	if err := l.cfg.Store.Delete(cctx, keys...); err != nil {
		l.cfg.Logger.Debug("removing old lease generations", "project", l.project, "err", err)
	}
}

// Check reports whether st honours exclusive creation (store.PutOptions.IfNotExists),
// which leases need: it creates a probe object twice and expects the second to fail with
// store.ErrExists, then removes it. An S3-compatible endpoint that ignores If-None-Match
// answers an error matching ErrUnsupported here. probeKey must be a key no one else uses.
func Check(ctx context.Context, st store.Store, probeKey string) error {
	put := func() error {
		_, err := st.Put(ctx, probeKey, strings.NewReader("probe"), store.PutOptions{Size: 5, IfNotExists: true})
		return err
	}
	if err := put(); err != nil {
		return fmt.Errorf("creating a probe object %s: %w", probeKey, err)
	}
	defer st.Delete(context.WithoutCancel(ctx), probeKey)
	switch err := put(); {
	case errors.Is(err, store.ErrExists):
		return nil
	case err == nil:
		return fmt.Errorf("%w: it replaced an object that a write asked not to replace (it ignores If-None-Match)", ErrUnsupported)
	default:
		return fmt.Errorf("creating a probe object %s again: %w", probeKey, err)
	}
}
