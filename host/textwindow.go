package host

import (
	"context"
	"encoding/json"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
)

// read_text exists because byte-by-byte work is slow inside a guest: with
// WithCloseOnContextDone every branch of Go-compiled wasm passes an exit check, so counting
// lines or sniffing for binary data costs tens of nanoseconds a byte in the plugin and
// next to nothing here. The plugin gets only the window it will show.

func (h *Host) readText(ctx context.Context, inst *instance, stack []uint64) {
	outPtr, outCap := uint32(stack[2]), uint32(stack[3])
	var req abi.ReadTextRequest
	if !inst.jsonArg(stack, "read_text", maxInputBytes, &req) {
		return
	}
	abs, err := sandbox.Resolve(req.Path)
	if err != nil {
		stack[0] = inst.resolveStatus(err)
		return
	}
	data, err := inst.sb.ReadFile(ctx, abs, h.cfg.MaxReadBytes)
	if err != nil {
		stack[0] = inst.fileStatus("read "+sandbox.Rel(abs), err)
		return
	}
	header, text := abi.TextWindow(data, req)
	hb, _ := json.Marshal(header)
	out := make([]byte, 0, len(hb)+1+len(text))
	stack[0] = inst.reply(outPtr, outCap, append(append(append(out, hb...), '\n'), text...))
}
