package abi

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTextWindow(t *testing.T) {
	var lines []string
	for i := 1; i <= 10; i++ {
		lines = append(lines, "line "+strings.Repeat("x", i))
	}
	data := []byte(strings.Join(lines, "\r\n")) // CRLF, no final newline

	h, text := TextWindow(data, ReadTextRequest{Number: true})
	if h.TotalLines != 10 || h.First != 1 || h.Last != 10 || h.Full || h.Binary {
		t.Fatalf("whole file: header %+v", h)
	}
	if !strings.HasPrefix(string(text), "     1\tline x\n     2\tline xx\n") || strings.Contains(string(text), "\r") {
		t.Fatalf("whole file: text %q", text)
	}

	h, text = TextWindow(data, ReadTextRequest{Offset: 9, Limit: 5})
	if h.First != 9 || h.Last != 10 || string(text) != "line xxxxxxxxx\nline xxxxxxxxxx\n" {
		t.Fatalf("tail window: %+v %q", h, text)
	}
	h, text = TextWindow(data, ReadTextRequest{Offset: 11})
	if h.TotalLines != 10 || h.First != 0 || len(text) != 0 {
		t.Fatalf("offset past the end: %+v %q", h, text)
	}
	h, text = TextWindow(data, ReadTextRequest{MaxBytes: 20})
	if !h.Full || h.Last != 2 {
		t.Fatalf("byte bound: %+v %q", h, text)
	}
	h, text = TextWindow([]byte(strings.Repeat("é", 30)+"\n"), ReadTextRequest{MaxLineChars: 10})
	if h.CutLines != 1 || string(text) != strings.Repeat("é", 10)+" [... line cut: 20 more characters]\n" {
		t.Fatalf("long line: %+v %q", h, text)
	}
	for _, bin := range []string{"ELF\x00\x01", strings.Repeat("\x01\x02\x03 ", 100), string([]byte{0xff, 0xfe, 0xfd, 0xfc, 0xfb})} {
		if h, _ := TextWindow([]byte(bin), ReadTextRequest{}); !h.Binary {
			t.Errorf("%q not seen as binary", bin)
		}
	}
	if h, _ := TextWindow([]byte("caf\xe9 au lait, cr\xe8me br\xfbl\xe9e, and a long tail of plain ascii text"), ReadTextRequest{}); h.Binary {
		t.Error("Latin-1 text with a few accents seen as binary")
	}
}

// looksBinarySlow is LooksBinary byte by byte, as it was before its eight-byte fast path.
func looksBinarySlow(data []byte) bool {
	sample := data[:min(len(data), binarySniffBytes)]
	if strings.IndexByte(string(sample), 0) >= 0 {
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

func TestLooksBinaryFastPathAgrees(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "b", " ", "\n", "\t", "\x01", "\x7f", "é", "日本", "\xff", "\xc3", "\x1b[0m", "0123456789abcdef"}
	for range 2000 {
		var b strings.Builder
		n := rng.IntN(12000)
		for b.Len() < n {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		data := []byte(b.String())
		if got, want := LooksBinary(data), looksBinarySlow(data); got != want {
			t.Fatalf("LooksBinary = %v, byte by byte %v, for %q", got, want, data[:min(len(data), 200)])
		}
	}
}
