// Package scan has the byte searches the plugins run over whole files, done eight bytes at
// a time. Under wazero with CloseOnContextDone every branch of Go guest code costs an
// interrupt check, so the standard library's byte-at-a-time loops (bytes.Count,
// strings.Index: wasm has no assembly versions) cost tens of nanoseconds per byte; here
// one 64-bit load and a few arithmetic operations cover eight.
package scan

import (
	"math/bits"
	"strings"
	"unsafe"
)

const (
	lo  = 0x0101010101010101
	b7f = 0x7f7f7f7f7f7f7f7f
)

// zeros has the high bit set in exactly the bytes of x that are zero.
func zeros(x uint64) uint64 {
	t := (x & b7f) + b7f
	return ^(t | x | b7f)
}

// load reads 8 bytes at s[i:] little-endian (wasm, amd64 and arm64 are little-endian);
// the caller guarantees i+8 <= len(s).
func load(s string, i int) uint64 {
	return *(*uint64)(unsafe.Add(unsafe.Pointer(unsafe.StringData(s)), i))
}

// Count counts the bytes c in s.
func Count(s string, c byte) int {
	n, i := 0, 0
	v := lo * uint64(c)
	for ; i+32 <= len(s); i += 32 { // four words per branch: branches are what cost
		n += bits.OnesCount64(zeros(load(s, i)^v)) + bits.OnesCount64(zeros(load(s, i+8)^v)) +
			bits.OnesCount64(zeros(load(s, i+16)^v)) + bits.OnesCount64(zeros(load(s, i+24)^v))
	}
	for ; i+8 <= len(s); i += 8 {
		n += bits.OnesCount64(zeros(load(s, i) ^ v))
	}
	for ; i < len(s); i++ {
		if s[i] == c {
			n++
		}
	}
	return n
}

// IndexByte returns the index of the first c in s, or -1.
func IndexByte(s string, c byte) int {
	i := 0
	v := lo * uint64(c)
	for ; i+32 <= len(s); i += 32 {
		z0, z1, z2, z3 := zeros(load(s, i)^v), zeros(load(s, i+8)^v), zeros(load(s, i+16)^v), zeros(load(s, i+24)^v)
		if z0|z1|z2|z3 != 0 {
			return i + firstSet(z0, z1, z2, z3)
		}
	}
	for ; i+8 <= len(s); i += 8 {
		if z := zeros(load(s, i) ^ v); z != 0 {
			return i + bits.TrailingZeros64(z)/8
		}
	}
	for ; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// firstSet is the byte index of the first marked byte in four consecutive zero masks.
func firstSet(z0, z1, z2, z3 uint64) int {
	switch {
	case z0 != 0:
		return bits.TrailingZeros64(z0) / 8
	case z1 != 0:
		return 8 + bits.TrailingZeros64(z1)/8
	case z2 != 0:
		return 16 + bits.TrailingZeros64(z2)/8
	}
	return 24 + bits.TrailingZeros64(z3)/8
}

// Index returns the index of the first sep in s, or -1. Candidates are the positions where
// both the first and the last byte of sep match, sixteen positions per branch; if they
// keep failing (a pathological input such as sep "aXa" in "aaaa...") it hands over to
// strings.Index, which is linear in the worst case.
func Index(s, sep string) int {
	n := len(sep)
	switch {
	case n == 0:
		return 0
	case n == 1:
		return IndexByte(s, sep[0])
	case n > len(s):
		return -1
	}
	first, last := lo*uint64(sep[0]), lo*uint64(sep[n-1])
	end := len(s) - n // the last position sep can start at
	fails, i := 0, 0
	for ; i+16 <= end+1; i += 16 { // loads stay within s: i+8+n-1+8 <= len(s)
		z0 := zeros(load(s, i)^first) & zeros(load(s, i+n-1)^last)
		z1 := zeros(load(s, i+8)^first) & zeros(load(s, i+8+n-1)^last)
		if z0|z1 == 0 {
			continue
		}
		for k, z := range [2]uint64{z0, z1} {
			for ; z != 0; z &= z - 1 {
				j := i + 8*k + bits.TrailingZeros64(z)/8
				if s[j+1:j+n-1] == sep[1:n-1] {
					return j
				}
				if fails++; fails > 16+j>>4 {
					if m := strings.Index(s[j+1:], sep); m >= 0 {
						return j + 1 + m
					}
					return -1
				}
			}
		}
	}
	for ; i <= end; i++ {
		if s[i] == sep[0] && s[i+n-1] == sep[n-1] && s[i:i+n] == sep {
			return i
		}
	}
	return -1
}

// CountString counts the non-overlapping occurrences of a non-empty sep in s.
func CountString(s, sep string) int {
	if len(sep) == 1 {
		return Count(s, sep[0])
	}
	n := 0
	for {
		i := Index(s, sep)
		if i < 0 {
			return n
		}
		n++
		s = s[i+len(sep):]
	}
}

// Replace returns s with the first n (all when n < 0) non-overlapping occurrences of a
// non-empty old replaced by new, as a new byte slice (ready to write without a copy).
func Replace(s, old, new string, n int) []byte {
	var b []byte
	for n != 0 {
		i := Index(s, old)
		if i < 0 {
			break
		}
		if b == nil {
			b = make([]byte, 0, len(s)+max(0, len(new)-len(old))*8)
		}
		b = append(append(b, s[:i]...), new...)
		s = s[i+len(old):]
		n--
	}
	return append(b, s...)
}

// PlainASCII returns the end of the run of whole 8-byte chunks of s, from i on, whose bytes
// are all printable ASCII (0x20 to 0x7f): callers skip those and look at the rest byte by
// byte.
func PlainASCII(s string, i int) int {
	for ; i+8 <= len(s); i += 8 {
		x := load(s, i)
		if (x-lo*0x20)&^x&hi|x&hi != 0 {
			break
		}
	}
	return i
}

const hi = 0x8080808080808080
