package pdk

import (
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// This file is a small JSON scanner and encoder. The per-call path (request envelope,
// tool input, result, host replies) avoids encoding/json: reflection is branchy code, and
// branchy Go guest code is about six times slower under wazero's CloseOnContextDone.

// maxDepth bounds nesting so a hostile document cannot exhaust the stack.
const maxDepth = 1000

func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// skipValue returns the index just past the JSON value that starts at or after b[i]
// (leading whitespace skipped), or -1 if it is not valid JSON.
func skipValue(b []byte, i int) int { return skipValueDepth(b, i, 0) }

func skipValueDepth(b []byte, i, depth int) int {
	i = skipWS(b, i)
	if i >= len(b) || depth > maxDepth {
		return -1
	}
	switch c := b[i]; c {
	case '"':
		end, _ := scanString(b, i)
		return end
	case '{':
		i = skipWS(b, i+1)
		if i < len(b) && b[i] == '}' {
			return i + 1
		}
		for {
			i = skipWS(b, i)
			if i >= len(b) || b[i] != '"' {
				return -1
			}
			if i, _ = scanString(b, i); i < 0 {
				return -1
			}
			if i = skipWS(b, i); i >= len(b) || b[i] != ':' {
				return -1
			}
			if i = skipValueDepth(b, i+1, depth+1); i < 0 {
				return -1
			}
			if i = skipWS(b, i); i >= len(b) {
				return -1
			}
			switch b[i] {
			case ',':
				i++
			case '}':
				return i + 1
			default:
				return -1
			}
		}
	case '[':
		i = skipWS(b, i+1)
		if i < len(b) && b[i] == ']' {
			return i + 1
		}
		for {
			if i = skipValueDepth(b, i, depth+1); i < 0 {
				return -1
			}
			if i = skipWS(b, i); i >= len(b) {
				return -1
			}
			switch b[i] {
			case ',':
				i++
			case ']':
				return i + 1
			default:
				return -1
			}
		}
	case 't':
		return literal(b, i, "true")
	case 'f':
		return literal(b, i, "false")
	case 'n':
		return literal(b, i, "null")
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			return scanNumber(b, i)
		}
		return -1
	}
}

func literal(b []byte, i int, lit string) int {
	if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
		return i + len(lit)
	}
	return -1
}

// scanNumber checks the JSON number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func scanNumber(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		i++
		start := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == start {
			return -1
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		start := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == start {
			return -1
		}
	}
	return i
}

// scanString checks the string starting at b[i] == '"' and returns the index just past its
// closing quote (-1 if invalid) and whether it contains escapes.
func scanString(b []byte, i int) (end int, escaped bool) {
	i++
	for i < len(b) {
		if i+8 <= len(b) && !special8(load8(unsafe.Pointer(&b[i])), false) {
			i += 8 // eight bytes with nothing to look at
			continue
		}
		c := b[i]
		switch {
		case c == '"':
			return i + 1, escaped
		case c == '\\':
			escaped = true
			if i+1 >= len(b) {
				return -1, escaped
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || hex4(b[i+2:i+6]) < 0 {
					return -1, escaped
				}
				i += 6
			default:
				return -1, escaped
			}
		case c < 0x20:
			return -1, escaped
		default:
			i++
		}
	}
	return -1, escaped
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return -1
		}
	}
	return r
}

// unquote decodes a scanned string token (quotes included). Invalid escapes cannot reach
// here (scanString refused them); a lone surrogate becomes U+FFFD, as in encoding/json.
// Raw bytes are kept as they are, so a non-UTF-8 file name survives the trip.
func unquote(tok []byte, escaped bool) string {
	s := tok[1 : len(tok)-1]
	if !escaped {
		return string(s)
	}
	return string(unescape(make([]byte, 0, len(s)), s))
}

func unescape(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		if s[i] != '\\' {
			j := i + 1
			for j < len(s) && s[j] != '\\' {
				if j+8 <= len(s) && !special8(load8(unsafe.Pointer(&s[j])), false) {
					j += 8
					continue
				}
				j++
			}
			dst = append(dst, s[i:j]...) // one bulk copy per run
			i = j
			continue
		}
		switch s[i+1] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := hex4(s[i+2:])
			i += 6
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
					r2 = hex4(s[i+2:])
				}
				if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
					i += 6
					r = dec
				} else {
					r = utf8.RuneError
				}
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default: // '"', '\\', '/'
			dst = append(dst, s[i+1])
		}
		i += 2
	}
	return dst
}

// field is one member of a JSON object: its decoded key and its raw value, or (str set,
// from a framed input) the decoded bytes of a string value.
type field struct {
	key []byte
	val []byte
	str bool
}

// objectFields appends the members of the object b (surrounding whitespace allowed) to
// dst. ok is false if b is not a valid JSON object.
func objectFields(dst []field, b []byte) ([]field, bool) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return dst, false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return dst, skipWS(b, i+1) == len(b)
	}
	for {
		i = skipWS(b, i)
		if i >= len(b) || b[i] != '"' {
			return dst, false
		}
		end, esc := scanString(b, i)
		if end < 0 {
			return dst, false
		}
		key := b[i+1 : end-1]
		if esc {
			key = unescape(nil, key)
		}
		i = skipWS(b, end)
		if i >= len(b) || b[i] != ':' {
			return dst, false
		}
		vstart := skipWS(b, i+1)
		vend := skipValueDepth(b, vstart, 1)
		if vend < 0 {
			return dst, false
		}
		dst = append(dst, field{key: key, val: b[vstart:vend]})
		i = skipWS(b, vend)
		if i >= len(b) {
			return dst, false
		}
		switch b[i] {
		case ',':
			i++
		case '}':
			return dst, skipWS(b, i+1) == len(b)
		default:
			return dst, false
		}
	}
}

// arrayElems calls fn with each raw element of the array b; false if b is not an array.
func arrayElems(b []byte, fn func(elem []byte) bool) bool {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '[' {
		return false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return true
	}
	for {
		start := skipWS(b, i)
		end := skipValueDepth(b, start, 1)
		if end < 0 || !fn(b[start:end]) {
			return false
		}
		i = skipWS(b, end)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i++
		case ']':
			return true
		default:
			return false
		}
	}
}

// jsonString decodes a raw value that must be a JSON string.
func jsonString(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	end, esc := scanString(v, 0)
	if end != len(v) {
		return "", false
	}
	return unquote(v, esc), true
}

// jsonInt decodes a raw number value as an integer; 3.0 and 1e3 count, 3.5 does not.
func jsonInt(v []byte) (int64, bool) {
	if len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
		return 0, false
	}
	neg := v[0] == '-'
	i := 0
	if neg {
		i = 1
	}
	var n int64
	for ; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' || n > (1<<63-1)/10-1 {
			// Fractions, exponents and huge values take the slow path.
			f, err := strconv.ParseFloat(string(v), 64)
			if err != nil || f != float64(int64(f)) {
				return 0, false
			}
			return int64(f), true
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// safeASCII marks the ASCII bytes a JSON string may hold unescaped.
var safeASCII = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return
}()

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string: quotes, backslashes and control characters
// escaped, invalid UTF-8 replaced by U+FFFD, U+2028/U+2029 escaped as encoding/json does.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if i+8 <= len(s) && !special8(load8(unsafe.Add(unsafe.Pointer(unsafe.StringData(s)), i)), true) {
			i += 8
			continue
		}
		c := s[i]
		if c < utf8.RuneSelf {
			if safeASCII[c] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// Word-at-a-time checks. Under wazero's CloseOnContextDone every branch of Go guest code
// pays an interrupt check, so a byte loop costs tens of nanoseconds per byte; testing eight
// bytes with one 64-bit load and a few arithmetic operations is several times cheaper.

const (
	lo8 = 0x0101010101010101
	hi8 = 0x8080808080808080
)

// load8 reads 8 bytes little-endian (wasm, amd64 and arm64 are little-endian); the caller
// guarantees they are in bounds.
func load8(p unsafe.Pointer) uint64 { return *(*uint64)(p) }

// hasZero8 reports whether some byte of y is zero.
func hasZero8(y uint64) bool { return (y-lo8)&^y&hi8 != 0 }

// special8 reports whether any of the 8 bytes in x is a quote, a backslash or a control
// character, or (when nonASCII) has its high bit set: the bytes a JSON string scanner or
// encoder must look at one by one. It may not report false negatives; (y-lo)&^y&hi is
// non-zero exactly when some byte of y is zero (or below n for y-lo*n, n <= 0x80).
func special8(x uint64, nonASCII bool) bool {
	q := x ^ (lo8 * '"')
	bs := x ^ (lo8 * '\\')
	m := (x-lo8*0x20)&^x | (q-lo8)&^q | (bs-lo8)&^bs
	if nonASCII {
		m |= x
	}
	return m&hi8 != 0
}
