//go:build !wasip1

package pdk

import (
	"bytes"
	"strconv"
	"unicode/utf8"

	"github.com/toolhost/toolhost/abi"
)

// textWindow is the native stand-in for the host's read_text (ABI.md section 3.3): it cuts
// lines [Offset, Offset+Limit) out of a file, so plugins using ReadText run under go test.
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
		limit = 2000
	}
	maxLine, maxBytes := req.MaxLineChars, req.MaxBytes
	if maxLine <= 0 {
		maxLine = 2000
	}
	if maxBytes <= 0 {
		maxBytes = 48_000
	}
	if offset > h.TotalLines {
		return h, nil
	}
	rest := data
	for n := 1; n < offset; n++ {
		rest = rest[bytes.IndexByte(rest, '\n')+1:]
	}
	var out []byte
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
			d := strconv.Itoa(line)
			for i := len(d); i < 6; i++ {
				out = append(out, ' ')
			}
			out = append(append(out, d...), '\t')
		}
		cut := false
		if n := utf8.RuneCount(text); n > maxLine {
			i, k := 0, 0
			for i = range string(text) {
				if k == maxLine {
					break
				}
				k++
			}
			out = append(out, text[:i]...)
			out = append(out, " [... line cut: "+strconv.Itoa(n-maxLine)+" more characters]"...)
			cut = true
		} else {
			out = append(out, text...)
		}
		out = append(out, '\n')
		if cut {
			h.CutLines++
		}
		if len(out) > maxBytes && line > offset {
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

// looksBinary: a NUL in the first 8 KB, or more than a tenth of them invalid UTF-8 or
// control characters text does not use.
func looksBinary(data []byte) bool {
	sample := data[:min(len(data), 8<<10)]
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
				break
			}
			odd++
		}
		i += n
	}
	return odd*10 > len(sample)
}
