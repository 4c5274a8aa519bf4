package abi

import (
	"bytes"
	"encoding/binary"
	"strconv"
	"unicode/utf8"
)

// Defaults of ReadTextRequest.
const (
	DefaultTextLimit    = 2000
	DefaultMaxLineChars = 2000
	DefaultTextBytes    = 48_000
	binarySniffBytes    = 8 << 10
)

// TextWindow is what toolhost_sandbox_files.read_text returns for a file's data: the
// header, and the text of lines [Offset, Offset+Limit) as ReadTextRequest describes. The
// host uses it, and so does the Go plugin kit's native test host.
func TextWindow(data []byte, req ReadTextRequest) (ReadTextHeader, []byte) {
	h := ReadTextHeader{Size: int64(len(data))}
	if len(data) == 0 {
		return h, nil
	}
	if LooksBinary(data) {
		h.Binary = true
		return h, nil
	}
	h.TotalLines = bytes.Count(data, []byte{'\n'})
	if data[len(data)-1] != '\n' {
		h.TotalLines++
	}
	offset, limit := max(req.Offset, 1), req.Limit
	if limit <= 0 {
		limit = DefaultTextLimit
	}
	maxLine, maxBytes := req.MaxLineChars, req.MaxBytes
	if maxLine <= 0 {
		maxLine = DefaultMaxLineChars
	}
	if maxBytes <= 0 {
		maxBytes = DefaultTextBytes
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

// LooksBinary says a file is binary when its first 8 KB hold a NUL byte, or when more than
// a tenth of them are invalid UTF-8 or control characters text does not use. Text in a
// legacy encoding, with an accent here and there, still reads as text.
func LooksBinary(data []byte) bool {
	sample := data[:min(len(data), binarySniffBytes)]
	if bytes.IndexByte(sample, 0) >= 0 {
		return true
	}
	odd := 0
	slow := 0 // bytes below it are looked at one by one
	for i := 0; i < len(sample); {
		if i >= slow && i+8 <= len(sample) {
			// Eight printable ASCII bytes at a time: the common case, several times
			// faster than decoding byte by byte. Eight with something else in them
			// (a newline, a tab, a multi-byte character) go one by one.
			x := binary.LittleEndian.Uint64(sample[i:])
			const lo, hi = 0x0101010101010101, 0x8080808080808080
			if x&hi == 0 && (x-lo*0x20)&^x&hi == 0 {
				i += 8
				continue
			}
			slow = i + 8
		}
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
