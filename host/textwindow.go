package host

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/tetratelabs/wazero/api"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
)

// read_text exists because byte-by-byte work is slow inside a guest: with
// WithCloseOnContextDone every branch of Go-compiled wasm passes an exit check, so counting
// lines or sniffing for binary data costs tens of nanoseconds a byte in the plugin and
// next to nothing here. The plugin gets only the window it will show.

const (
	defaultTextLimit    = 2000
	defaultMaxLineChars = 2000
	defaultTextBytes    = 48_000
	binarySniffBytes    = 8 << 10
)

func (h *Host) readText(ctx context.Context, _ api.Module, stack []uint64) {
	inst := enter(ctx)
	if inst == nil {
		noCall(stack)
		return
	}
	defer inst.leave()
	outPtr, outCap := uint32(stack[2]), uint32(stack[3])
	raw, s, msg := inst.guestBytes(uint32(stack[0]), uint32(stack[1]), maxInputBytes)
	if s != 0 {
		stack[0] = inst.status(s, "read_text: %s", msg)
		return
	}
	var req abi.ReadTextRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		stack[0] = inst.status(abi.StatusInvalid, "read_text: request is not valid JSON: %v", err)
		return
	}
	abs, err := sandbox.Resolve(req.Path)
	if err != nil {
		stack[0] = inst.fileStatus("", err)
		return
	}
	data, err := inst.sb.ReadFile(ctx, abs, h.cfg.MaxReadBytes)
	if err != nil {
		stack[0] = inst.fileStatus("read "+sandbox.Rel(abs), err)
		return
	}
	header, text := textWindow(data, req)
	hb, _ := json.Marshal(header)
	out := make([]byte, 0, len(hb)+1+len(text))
	stack[0] = inst.reply(outPtr, outCap, append(append(append(out, hb...), '\n'), text...))
}

// textWindow cuts lines [Offset, Offset+Limit) out of data, as ReadTextRequest describes.
func textWindow(data []byte, req abi.ReadTextRequest) (abi.ReadTextHeader, []byte) {
	h := abi.ReadTextHeader{Size: int64(len(data))}
	if len(data) == 0 {
		return h, nil
	}
	if looksBinary(data) {
		h.Binary = true
		return h, nil
	}
	h.TotalLines = bytes.Count(data, []byte{'\n'})
	if data[len(data)-1] != '\n' {
		h.TotalLines++
	}
	offset, limit := max(req.Offset, 1), req.Limit
	if limit <= 0 {
		limit = defaultTextLimit
	}
	maxLine, maxBytes := req.MaxLineChars, req.MaxBytes
	if maxLine <= 0 {
		maxLine = defaultMaxLineChars
	}
	if maxBytes <= 0 {
		maxBytes = defaultTextBytes
	}
	if offset > h.TotalLines {
		return h, nil
	}
	rest := data
	for n := 1; n < offset; n++ {
		rest = rest[bytes.IndexByte(rest, '\n')+1:]
	}
	out := make([]byte, 0, min(len(rest)+len(rest)/8+64, maxBytes+4096))
	line := offset
	for ; line < offset+limit && len(rest) > 0; line++ {
		var text []byte
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			text, rest = rest[:i], rest[i+1:]
		} else {
			text, rest = rest, nil
		}
		text = bytes.TrimSuffix(text, []byte{'\r'})
		start := len(out)
		if req.Number {
			out = appendLineNumber(out, line)
		}
		var cut bool
		out, cut = appendCutLine(out, text, maxLine)
		out = append(out, '\n')
		if cut {
			h.CutLines++
		}
		if len(out) > maxBytes && line > offset { // always keep one line
			out, h.Full = out[:start], true
			if cut {
				h.CutLines--
			}
			break
		}
	}
	h.First, h.Last = offset, line-1
	return h, out
}

// looksBinary says a file is binary when its first 8 KB hold a NUL byte, or when more than
// a tenth of them are invalid UTF-8 or control characters text does not use. Text in a
// legacy encoding, with an accent here and there, still reads as text.
func looksBinary(data []byte) bool {
	sample := data[:min(len(data), binarySniffBytes)]
	if bytes.IndexByte(sample, 0) >= 0 {
		return true
	}
	odd := 0
	for i := 0; i < len(sample); {
		c := sample[i]
		if c < utf8.RuneSelf {
			if c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v' && c != '\b' && c != 0x1b {
				odd++
			}
			i++
			continue
		}
		r, n := utf8.DecodeRune(sample[i:])
		if r == utf8.RuneError && n == 1 {
			if len(sample) < len(data) && !utf8.FullRune(sample[i:]) {
				break // a character cut by the end of the sample
			}
			odd++
		}
		i += n
	}
	return odd*10 > len(sample)
}

// appendLineNumber right-aligns n in six columns and adds a tab, as cat -n does.
func appendLineNumber(b []byte, n int) []byte {
	var digits [20]byte
	d := strconv.AppendInt(digits[:0], int64(n), 10)
	for i := len(d); i < 6; i++ {
		b = append(b, ' ')
	}
	return append(append(b, d...), '\t')
}

// appendCutLine appends a line, cut after max characters with a marker saying how many
// characters were left out.
func appendCutLine(b, text []byte, max int) ([]byte, bool) {
	if len(text) <= max { // bytes >= characters: nothing to cut
		return append(b, text...), false
	}
	chars, cutAt := 0, -1
	for i := range string(text) {
		if chars == max {
			cutAt = i
		}
		chars++
	}
	if cutAt < 0 {
		return append(b, text...), false
	}
	b = append(b, text[:cutAt]...)
	b = append(b, " [... line cut: "...)
	b = strconv.AppendInt(b, int64(chars-max), 10)
	return append(b, " more characters]"...), true
}
