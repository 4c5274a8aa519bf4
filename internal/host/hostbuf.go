package host

import (
	"fmt"

	"github.com/toolhost/toolhost/abi"
)

// Host buffers (ABI.md section 5.1): bytes a host call kept on the host instead of
// writing them into the guest (read_text with hold), named by an id the call's result
// may use in a text block, so the host answers from its own bytes and the guest never
// copies them in or out. A buffer belongs to the call that made it and is gone when the
// call ends. Ids count up over an instance's life and are never reused, so an id of an
// earlier call is told apart from one never given.
type hostBuffers struct {
	base  uint32            // the first id of the current call
	next  uint32            // the last id given
	bufs  map[uint32][]byte // this call's buffers
	bytes int               // what they hold together
}

// begin starts a call: the buffers of the one before are dropped.
func (b *hostBuffers) begin() { b.base, b.bufs, b.bytes = b.next+1, nil, 0 }

// hold keeps data as a buffer of the call and returns its id; a negative status when the
// call holds as many buffers, or as many bytes, as it may.
func (inst *instance) hold(op string, data []byte) (uint32, uint64) {
	b := &inst.bufs
	if len(b.bufs) >= abi.MaxHostBuffers || b.bytes+len(data) > abi.MaxHeldBytes {
		return 0, inst.status(abi.StatusTooLarge, "%s: the call holds %d host buffers of %d bytes, the most it may (name them in the result, or read without hold)",
			op, len(b.bufs), b.bytes)
	}
	if b.bufs == nil {
		b.bufs = make(map[uint32][]byte, 1)
	}
	b.next++
	b.bufs[b.next] = data
	b.bytes += len(data)
	return b.next, 0
}

// takeBuffers ends the call's hold on its buffers: it returns them, for its result to
// name, and forgets them.
func (inst *instance) takeBuffers() hostBuffers {
	b := inst.bufs
	inst.bufs.bufs, inst.bufs.bytes = nil, 0
	inst.bufs.base = inst.bufs.next + 1
	return b
}

// get is the buffer a result names, or why the name is wrong.
func (b *hostBuffers) get(id uint32) ([]byte, error) {
	if b == nil {
		b = &hostBuffers{}
	}
	if data, ok := b.bufs[id]; ok {
		return data, nil
	}
	switch {
	case id == 0:
		return nil, fmt.Errorf("host buffer 0 does not exist (ids start at 1)")
	case id < b.base:
		return nil, fmt.Errorf("host buffer %d was held by an earlier call and is gone (a buffer lasts until its call ends)", id)
	default:
		return nil, fmt.Errorf("host buffer %d was never given to this call", id)
	}
}
