package host

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxTextChars is the hard cap on one text block of a result. A longer text keeps its head
// and its tail, and a line in between says how many characters were cut.
const MaxTextChars = 50_000

// capText keeps the first and last MaxTextChars/2 characters of s.
func capText(s string) string {
	if len(s) <= MaxTextChars { // bytes >= characters, so no count needed
		return s
	}
	n := utf8.RuneCountInString(s)
	if n <= MaxTextChars {
		return s
	}
	half := MaxTextChars / 2
	head := s[:byteOffsetOfRune(s, half)]
	tail := s[byteOffsetOfRune(s, n-half):]
	return fmt.Sprintf("%s\n\n[... %d characters cut: the output was %d characters, over the %d limit; showing the first and last %d ...]\n\n%s",
		head, n-2*half, n, MaxTextChars, half, tail)
}

// byteOffsetOfRune returns the byte offset at which the i-th rune of s starts.
func byteOffsetOfRune(s string, i int) int {
	for off := range s {
		if i == 0 {
			return off
		}
		i--
	}
	return len(s)
}

// stripANSI removes terminal escape sequences: CSI (ESC [ ... final byte), OSC (ESC ] ...
// BEL or ESC \), other two-byte ESC sequences, and the 8-bit CSI introducer. The common case,
// no ESC at all, costs one scan and no allocation.
func stripANSI(s string) string {
	if strings.IndexByte(s, 0x1b) < 0 && !strings.Contains(s, "\u009b") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == 0x1b && i+1 < len(s) && s[i+1] == '[':
			i = skipCSI(s, i+2)
		case c == 0x1b && i+1 < len(s) && s[i+1] == ']':
			i = skipOSC(s, i+2)
		case c == 0x1b && i+1 < len(s):
			i += 2 // ESC plus one byte: charset selection, keypad modes and the like
		case c == 0x1b:
			i++
		case c == 0xc2 && i+1 < len(s) && s[i+1] == 0x9b: // U+009B, the 8-bit CSI
			i = skipCSI(s, i+2)
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String()
}

// skipCSI skips parameter and intermediate bytes up to and including the final byte.
func skipCSI(s string, i int) int {
	for i < len(s) {
		c := s[i]
		i++
		if c >= 0x40 && c <= 0x7e {
			break
		}
	}
	return i
}

// skipOSC skips up to and including BEL or ESC \.
func skipOSC(s string, i int) int {
	for i < len(s) {
		if s[i] == 0x07 {
			return i + 1
		}
		if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '\\' {
			return i + 2
		}
		i++
	}
	return i
}
