package host

import (
	"context"
	"regexp"
	"sync"

	"github.com/toolhost/toolhost/abi"
)

// Session state: plugins are stateless between calls (the host discards and replaces
// instances freely), yet a tool often needs to remember something for the rest of the
// session: the shell's working directory, the versions of the files the model has read,
// how much of a log it has shown. toolhost_session.get and .set keep a few bytes per key
// for the plugin in the host's Session, so they live exactly as long as the session,
// survive every rotation of its sandbox (the sandbox never sees them), and are never
// shared with another plugin or another session. They need no grant: they reach nothing
// but the plugin's own corner, which is bounded.

const (
	// maxStateValue bounds one value; maxStateBytes all of a plugin's values and keys in
	// one session; maxStateKeys their number.
	maxStateValue = 1 << 20
	maxStateBytes = 4 << 20
	maxStateKeys  = 4096
)

// stateKeyRE is compiled at first use: {1,512} compiles into 512 copies of the class
// (350 KB and milliseconds), which every process linking this package, the sandbox agent
// at every sandbox start included, would otherwise pay at init.
var stateKeyRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9._/:@+=-]{1,512}$`) })

// sessionState holds the state of every plugin of one session.
type sessionState struct {
	mu      sync.Mutex
	plugins map[string]*pluginState
}

type pluginState struct {
	vals  map[string][]byte
	bytes int
}

// get returns a copy of the plugin's value for key.
func (st *sessionState) get(plugin, key string) ([]byte, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	ps := st.plugins[plugin]
	if ps == nil {
		return nil, false
	}
	v, ok := ps.vals[key]
	return append([]byte(nil), v...), ok
}

// all returns a copy of every plugin's values.
func (st *sessionState) all() map[string]map[string][]byte {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := make(map[string]map[string][]byte, len(st.plugins))
	for plugin, ps := range st.plugins {
		vals := make(map[string][]byte, len(ps.vals))
		for k, v := range ps.vals {
			vals[k] = append([]byte(nil), v...)
		}
		out[plugin] = vals
	}
	return out
}

// set stores value under key for the plugin (an empty value deletes the key). It refuses,
// with what is over, a value or a total over the bounds.
func (st *sessionState) set(plugin, key string, value []byte) (abi.Status, string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.plugins == nil {
		st.plugins = map[string]*pluginState{}
	}
	ps := st.plugins[plugin]
	if ps == nil {
		ps = &pluginState{vals: map[string][]byte{}}
		st.plugins[plugin] = ps
	}
	old, had := ps.vals[key]
	if len(value) == 0 {
		if had {
			ps.bytes -= len(key) + len(old)
			delete(ps.vals, key)
		}
		return 0, ""
	}
	if len(value) > maxStateValue {
		return abi.StatusTooLarge, "a session value is at most 1 MiB"
	}
	grow := len(value) - len(old)
	if !had {
		grow += len(key)
		if len(ps.vals) >= maxStateKeys {
			return abi.StatusTooLarge, "a plugin keeps at most 4096 keys in a session; set some to empty to free them"
		}
	}
	if ps.bytes+grow > maxStateBytes {
		return abi.StatusTooLarge, "a plugin keeps at most 4 MiB in a session; set some keys to empty to free room"
	}
	ps.vals[key] = append([]byte(nil), value...)
	ps.bytes += grow
	return 0, ""
}

// decodeStateKey decodes the key argument in stack[0:2] of a session function.
func (h *Host) decodeStateKey(_ context.Context, inst *instance, stack []uint64, c *hostCall) bool {
	what := "session " + c.req.Op
	if inst.session == nil {
		stack[0] = inst.status(abi.StatusPermission, "%s: there is no session", what)
		return false
	}
	raw, s, msg := inst.guestBytes(uint32(stack[0]), uint32(stack[1]), 1024)
	if s != 0 {
		stack[0] = inst.status(s, "%s: key: %s", what, msg)
		return false
	}
	c.req.Key = string(raw)
	if !stateKeyRE().Match(raw) {
		stack[0] = inst.status(abi.StatusInvalid, "%s: key %q must be 1 to 512 letters, digits and . _ / : @ + = -", what, raw)
		return false
	}
	return true
}

// decodeStateGet decodes (key_ptr, key_len, out_ptr, out_cap).
func (h *Host) decodeStateGet(ctx context.Context, inst *instance, stack []uint64, c *hostCall) bool {
	c.outPtr, c.outCap = uint32(stack[2]), uint32(stack[3])
	return h.decodeStateKey(ctx, inst, stack, c)
}

// decodeStateSet decodes (key_ptr, key_len, data_ptr, data_len).
func (h *Host) decodeStateSet(ctx context.Context, inst *instance, stack []uint64, c *hostCall) bool {
	dataPtr, dataLen := uint32(stack[2]), uint32(stack[3])
	if !h.decodeStateKey(ctx, inst, stack, c) {
		return false
	}
	data, s, msg := inst.guestBytes(dataPtr, dataLen, maxStateValue)
	if s != 0 {
		stack[0] = inst.status(s, "session set %s: %s", c.req.Key, msg)
		return false
	}
	c.data, c.in = data, len(data)
	return true
}

func (h *Host) stateGet(_ context.Context, inst *instance, c *hostCall) uint64 {
	v, ok := inst.session.state.get(inst.p.name, c.req.Key)
	if !ok {
		return inst.status(abi.StatusNotFound, "session get %s: no such key", c.req.Key)
	}
	return inst.reply(c.outPtr, c.outCap, v)
}

func (h *Host) stateSet(_ context.Context, inst *instance, c *hostCall) uint64 {
	if s, msg := inst.session.state.set(inst.p.name, c.req.Key, c.data); s != 0 {
		return inst.status(s, "session set %s: %s", c.req.Key, msg)
	}
	return uint64(len(c.data))
}
