package scan

import (
	"strings"
	"testing"
)

func check(t *testing.T, s, sep string) {
	t.Helper()
	if len(sep) > 0 {
		if got, want := Count(s, sep[0]), strings.Count(s, sep[:1]); got != want {
			t.Fatalf("Count(%q, %q) = %d, want %d", s, sep[0], got, want)
		}
		if got, want := IndexByte(s, sep[0]), strings.IndexByte(s, sep[0]); got != want {
			t.Fatalf("IndexByte(%q, %q) = %d, want %d", s, sep[0], got, want)
		}
		if got, want := CountString(s, sep), strings.Count(s, sep); got != want {
			t.Fatalf("CountString(%q, %q) = %d, want %d", s, sep, got, want)
		}
		if got, want := string(Replace(s, sep, "<X>", -1)), strings.ReplaceAll(s, sep, "<X>"); got != want {
			t.Fatalf("Replace all (%q, %q) = %q, want %q", s, sep, got, want)
		}
		if got, want := string(Replace(s, sep, "", 1)), strings.Replace(s, sep, "", 1); got != want {
			t.Fatalf("Replace 1 (%q, %q) = %q, want %q", s, sep, got, want)
		}
	}
	for i := 0; i <= len(s); i += 3 {
		j := PlainASCII(s, i)
		if (j-i)%8 != 0 || j > len(s) {
			t.Fatalf("PlainASCII(%q, %d) = %d", s, i, j)
		}
		for k := i; k < j; k++ {
			if s[k] < 0x20 || s[k] >= 0x80 {
				t.Fatalf("PlainASCII(%q, %d) = %d skips %q", s, i, j, s[k])
			}
		}
		if j+8 <= len(s) && !strings.ContainsFunc(s[j:j+8], func(r rune) bool { return r < 0x20 || r >= 0x80 }) {
			t.Fatalf("PlainASCII(%q, %d) = %d stops at a plain chunk", s, i, j)
		}
	}
	if got, want := Index(s, sep), strings.Index(s, sep); got != want {
		t.Fatalf("Index(%q, %q) = %d, want %d", s, sep, got, want)
	}
}

func TestScan(t *testing.T) {
	long := strings.Repeat("abcdefgh\n", 50) + "needle\x00\xff\x80" + strings.Repeat("a", 1000) + "b"
	for _, c := range [][2]string{
		{"", "a"}, {"a", "a"}, {"abc", ""}, {"\n\n\n\n\n\n\n\n\n", "\n"}, {"\x00\x00\x00\x00\x00\x00\x00\x00\x00x", "\x00"},
		{"\xff\xff\xff\xff\xff\xff\xff\xff\x7f", "\x7f"}, {"\x80\x80\x80\x80\x80\x80\x80\x80\x00", "\x80"},
		{long, "needle"}, {long, "\n"}, {long, "ab"}, {long, "aab"}, {long, strings.Repeat("a", 999) + "b"},
		{long, "missing"}, {long, "\xff\x80a"}, {"aaaa", "aa"}, {"abcabcabc", "cab"},
		{strings.Repeat("a", 5000) + "aXa", "aXa"}, {strings.Repeat("a", 5000), "aXa"}, {strings.Repeat("ab", 3000) + "abc", "abc"},
		{"0123456789abcdef", "ef"}, {"0123456789abcdef", "0123456789abcdef"}, {"0123456789abcdef", "9abcdef"},
	} {
		check(t, c[0], c[1])
	}
}

func FuzzScan(f *testing.F) {
	f.Add("hello world\nsecond line\n", "o")
	f.Add(strings.Repeat("ab", 40), "abab")
	f.Fuzz(func(t *testing.T, s, sep string) { check(t, s, sep) })
}
