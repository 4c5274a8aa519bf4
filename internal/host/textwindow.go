package host

import (
	"context"
	"encoding/json"

	"github.com/toolhost/toolhost/abi"
)

// read_text exists because byte-by-byte work is slow inside a guest: with
// WithCloseOnContextDone every branch of Go-compiled wasm passes an exit check, so counting
// lines or sniffing for binary data costs tens of nanoseconds a byte in the plugin and
// next to nothing here. The plugin gets only the window it will show.

func (h *Host) decodeReadText(_ context.Context, inst *instance, stack []uint64, c *hostCall) bool {
	c.outPtr, c.outCap = uint32(stack[2]), uint32(stack[3])
	if !inst.jsonArg(stack, c, "read_text", maxInputBytes, &c.text) {
		return false
	}
	return inst.resolvePath(c.text.Path, c, stack)
}

func (h *Host) readText(ctx context.Context, inst *instance, c *hostCall) uint64 {
	data, err := inst.sbRead(ctx, c, h.cfg.MaxReadBytes)
	if err != nil {
		return inst.fileStatus("read "+c.req.Path, err)
	}
	header, text := abi.TextWindow(data, c.text)
	if c.text.Version {
		header.Version = fileVersion(data)
	}
	if c.text.Hold { // the text stays here: the reply is the header
		id, st := inst.hold("read_text "+c.req.Path, text)
		if st != 0 {
			return st
		}
		header.Buffer = id
		text = nil
	}
	hb, _ := json.Marshal(header)
	out := make([]byte, 0, len(hb)+1+len(text))
	return inst.reply(c.outPtr, c.outCap, append(append(append(out, hb...), '\n'), text...))
}
