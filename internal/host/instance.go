package host

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero/api"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
)

// instance is one instantiated plugin module. Exports run one at a time per instance; the
// pool hands an instance to one caller at a time, so the per-call fields need no lock.
type instance struct {
	p      *plugin
	t      *tier // the form it is an instance of
	mod    api.Module
	mem    api.Memory
	stderr *boundedBuffer

	fnVersion, fnDescribe, fnInput, fnCall api.Function
	stack                                  []uint64
	inPtr, inCap                           uint32 // the guest's input buffer, cached
	calls                                  int

	// State of the call in progress, read by host functions.
	session *Dispatcher
	sb      sandbox.Sandbox
	budget  *budget
	parked  []byte // a reply waiting for toolhost.take
	lastErr string // message of the last negative status
	// refused is what the egress gateway refused to the call's commands (one sentence
	// each, for the result's note); dispatch takes it after the call.
	refused []string
	// stored is what the call's host functions stored for a client to read back (a
	// screenshot's images); dispatch takes it after the call.
	stored []abi.StoredObject
	// bufs are the host buffers of the call (hostbuf.go); dispatch takes them for the
	// result.
	bufs hostBuffers
}

// newCommandTag names one foreground command uniquely (sandbox.ExecRequest.Tag).
func newCommandTag() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "cmd-" + hex.EncodeToString(b[:])
}

// takeStored returns and forgets what the last call stored.
func (inst *instance) takeStored() []abi.StoredObject {
	s := inst.stored
	inst.stored = nil
	return s
}

// takeRefused returns and forgets what the last call's commands were refused.
func (inst *instance) takeRefused() []string {
	r := inst.refused
	inst.refused = nil
	return r
}

type instanceKey struct{}

// hostKey carries the Host whose instance is starting or describing itself, outside any
// call, for the log function (the only one that serves there).
type hostKey struct{}

func hostFrom(ctx context.Context) *Host {
	h, _ := ctx.Value(hostKey{}).(*Host)
	return h
}

// instanceFrom returns the instance whose call is running, as host functions see it.
func instanceFrom(ctx context.Context) *instance {
	inst, _ := ctx.Value(instanceKey{}).(*instance)
	return inst
}

// loadTimeout bounds making an instance (the guest runtime's initialisation) and asking it
// for its manifest. It is a hang bound, not a budget: this is loading, not a tool's work,
// and on a loaded machine, or in the interpreter, it takes far longer than a call's budget
// might allow; a plugin whose instance fails to start fails its calls until the host is
// made anew.
const loadTimeout = time.Minute

func newInstance(ctx context.Context, p *plugin, t *tier) (*instance, error) {
	ctx, cancel := context.WithTimeout(context.WithValue(ctx, hostKey{}, p.h), max(p.h.cfg.CallTimeout, loadTimeout))
	defer cancel()
	stderr := &boundedBuffer{max: 8 << 10}
	mod, err := t.rt.InstantiateModule(p.memoryContext(ctx), t.compiled, p.modCfg.WithStderr(stderr))
	if err != nil {
		return nil, fmt.Errorf("instantiate: %w%s", err, stderr.note())
	}
	inst := &instance{
		p: p, t: t, mod: mod, mem: mod.Memory(), stderr: stderr,
		fnVersion:  mod.ExportedFunction(abi.ExportVersion),
		fnDescribe: mod.ExportedFunction(abi.ExportDescribe),
		fnInput:    mod.ExportedFunction(abi.ExportInput),
		fnCall:     mod.ExportedFunction(abi.ExportCall),
		stack:      make([]uint64, 2),
	}
	if err := inst.growInput(ctx, initialInputCapacity); err != nil {
		mod.Close(context.Background())
		return nil, err
	}
	return inst, nil
}

// growInput asks the guest for an input buffer of at least size bytes.
func (inst *instance) growInput(ctx context.Context, size uint32) error {
	inst.stack[0] = uint64(size)
	if err := inst.fnInput.CallWithStack(ctx, inst.stack); err != nil {
		return fmt.Errorf("%s(%d): %w", abi.ExportInput, size, err)
	}
	ptr := uint32(inst.stack[0])
	if end := uint64(ptr) + uint64(size); ptr == 0 || end > uint64(inst.mem.Size()) {
		return fmt.Errorf("%w: %s(%d) returned %#x, outside its memory", ErrPluginFailed, abi.ExportInput, size, ptr)
	}
	inst.inPtr, inst.inCap = ptr, size
	return nil
}

// call runs one request through the call export and returns a copy of the result bytes.
// Any error leaves the instance unusable: the caller must discard it.
func (inst *instance) call(ctx context.Context, req []byte, sess *Dispatcher, budgetDur time.Duration) ([]byte, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	inst.calls++
	if uint32(len(req)) > inst.inCap {
		if err := inst.growInput(ctx, uint32(len(req))); err != nil {
			return nil, err
		}
	}
	if !inst.mem.Write(inst.inPtr, req) {
		return nil, fmt.Errorf("%w: input buffer at %#x lies outside its memory", ErrPluginFailed, inst.inPtr)
	}

	b := &budget{remaining: inst.t.budget(budgetDur), cancel: cancel}
	inst.session, inst.budget, inst.lastErr = sess, b, ""
	inst.bufs.begin()
	if sess != nil {
		inst.sb = sess.sb
	}
	defer func() { inst.session, inst.sb, inst.budget, inst.parked = nil, nil, nil, nil }()

	inst.stack[0] = uint64(len(req))
	b.start()
	err := inst.fnCall.CallWithStack(context.WithValue(ctx, instanceKey{}, inst), inst.stack)
	b.stop()
	if err != nil {
		return nil, inst.callError(ctx, err, budgetDur)
	}
	return inst.readPacked(inst.stack[0])
}

func (inst *instance) callError(ctx context.Context, err error, budgetDur time.Duration) error {
	cause := context.Cause(ctx)
	switch {
	case errors.Is(cause, errBudget):
		return fmt.Errorf("%w: plugin %s used more than its %s of work", ErrPluginTimeout, inst.p, budgetDur)
	case cause != nil:
		return fmt.Errorf("plugin %s: call stopped: %w", inst.p, cause)
	}
	msg, _, _ := strings.Cut(err.Error(), "\n") // the wasm stack trace is for debugging, not for the model
	inst.p.h.log.Debug("plugin trapped", "plugin", inst.p.name, "err", err)
	return fmt.Errorf("%w: plugin %s: %s%s", ErrPluginFailed, inst.p, msg, inst.stderr.note())
}

// readPacked copies out the bytes a packed ptr/len names.
func (inst *instance) readPacked(v uint64) ([]byte, error) {
	ptr, n := abi.Unpack(v)
	if n > maxResultBytes {
		return nil, fmt.Errorf("%w: result of %d bytes is over the %d limit", ErrPluginFailed, n, maxResultBytes)
	}
	buf, ok := inst.mem.Read(ptr, n)
	if !ok {
		return nil, fmt.Errorf("%w: result at %#x+%d lies outside its memory", ErrPluginFailed, ptr, n)
	}
	return bytes.Clone(buf), nil
}

var errBudget = errors.New("plugin time budget used up")

// budget is d for the compiled form, and quickBudgetFactor times d for the quick one.
func (t *tier) budget(d time.Duration) time.Duration {
	if t.quick {
		return d * quickBudgetFactor
	}
	return d
}

// budget counts the time a call spends in guest code. Host functions pause it, so a long
// command does not eat a plugin's budget, while a guest spinning in a loop is stopped.
type budget struct {
	remaining time.Duration
	resumed   time.Time
	timer     *time.Timer
	cancel    context.CancelCauseFunc
}

func (b *budget) start() {
	b.resumed = time.Now()
	b.timer = time.AfterFunc(b.remaining, func() { b.cancel(errBudget) })
}

func (b *budget) pause() {
	if b.timer.Stop() {
		b.remaining -= time.Since(b.resumed)
	}
}

func (b *budget) resume() {
	if b.remaining <= 0 {
		b.cancel(errBudget)
		return
	}
	b.resumed = time.Now()
	b.timer.Reset(b.remaining)
}

func (b *budget) stop() { b.timer.Stop() }

// pool is a bounded set of instances of one plugin. slots counts live instances, which
// live lists: the runtime is shared (engine.go) and outlives the host, so close ends them
// all itself, those serving calls too (their calls fail), as closing a runtime would.
type pool struct {
	p      *plugin
	idle   chan *instance
	slots  chan struct{}
	closed atomic.Bool
	mu     sync.Mutex
	live   map[*instance]struct{}
}

func newPool(p *plugin, size int) *pool {
	return &pool{p: p, idle: make(chan *instance, size), slots: make(chan struct{}, size), live: map[*instance]struct{}{}}
}

// acquire returns an idle instance, creates one of t while under the bound, or waits. An
// idle instance of the quick form is retired once the compiled form is in.
func (pl *pool) acquire(ctx context.Context, t *tier) (*instance, error) {
	for {
		if pl.closed.Load() {
			return nil, ErrClosed
		}
		var inst *instance
		select {
		case inst = <-pl.idle:
		default:
			select {
			case inst = <-pl.idle:
			case pl.slots <- struct{}{}:
				inst, err := newInstance(ctx, pl.p, t)
				if err != nil {
					<-pl.slots
					return nil, err
				}
				if !pl.track(inst) {
					pl.discard(ctx, inst)
					return nil, ErrClosed
				}
				return inst, nil
			case <-ctx.Done():
				return nil, fmt.Errorf("waiting for an instance of plugin %s: %w", pl.p, ctx.Err())
			}
		}
		if pl.retired(inst) {
			pl.discard(ctx, inst)
			continue
		}
		return inst, nil
	}
}

// track adds a new instance to live, unless the pool closed meanwhile.
func (pl *pool) track(inst *instance) bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.closed.Load() {
		return false
	}
	pl.live[inst] = struct{}{}
	return true
}

// retired: inst is of the quick form, and the compiled form is in.
func (pl *pool) retired(inst *instance) bool {
	if !inst.t.quick {
		return false
	}
	t, err, ok := pl.p.compiledTier()
	return ok && err == nil && t != nil
}

// release returns a healthy instance, or retires one that has served long or grown large
// (wasm memory never shrinks), or one of the quick form once the compiled form is in.
func (pl *pool) release(ctx context.Context, inst *instance) {
	limit := uint32(pl.p.memoryLimitMiB()) << 20
	if pl.closed.Load() || inst.calls >= maxCallsPerInstance || inst.mem.Size() > limit/2 || pl.retired(inst) {
		pl.discard(ctx, inst)
		return
	}
	pl.idle <- inst
	if pl.closed.Load() { // close may have drained idle just before
		pl.drain(ctx)
	}
}

// discard closes an instance; after any error its state is undefined.
func (pl *pool) discard(ctx context.Context, inst *instance) {
	inst.mod.Close(context.WithoutCancel(ctx))
	pl.mu.Lock()
	delete(pl.live, inst)
	pl.mu.Unlock()
	<-pl.slots
}

// close ends every instance: the idle ones, and those serving calls (which then fail and
// are discarded by their callers).
func (pl *pool) close(ctx context.Context) {
	pl.mu.Lock()
	pl.closed.Store(true)
	live := make([]*instance, 0, len(pl.live))
	for inst := range pl.live {
		live = append(live, inst)
	}
	pl.mu.Unlock()
	for _, inst := range live {
		inst.mod.Close(context.WithoutCancel(ctx))
	}
	pl.drain(ctx)
}

func (pl *pool) drain(ctx context.Context) {
	for {
		select {
		case inst := <-pl.idle:
			pl.discard(ctx, inst)
		default:
			return
		}
	}
}

// boundedBuffer keeps the first max bytes written to a guest's stderr, where the Go
// runtime writes the reason it died.
type boundedBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - len(b.buf); room > 0 {
		b.buf = append(b.buf, p[:min(len(p), room)]...)
	}
	return len(p), nil
}

// note returns the first lines of stderr for an error message, or "".
func (b *boundedBuffer) note() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := strings.TrimSpace(string(b.buf))
	if s == "" {
		return ""
	}
	lines := strings.SplitN(s, "\n", 4)
	return " (plugin stderr: " + strings.Join(lines[:min(len(lines), 3)], " | ") + ")"
}
