//go:build !wasip1

package pdk

import (
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/abi"
)

// TestReadTextHeaderForms: every header the host writes (encoding/json's shape, with and
// without a version and a buffer) decodes as it was made, through the fast reader or the
// general one; a header that only looks like it is not misread.
func TestReadTextHeaderForms(t *testing.T) {
	v := strings.Repeat("ab12", 16)
	for _, h := range []abi.ReadTextHeader{
		{Size: 10, TotalLines: 2, First: 1, Last: 2},
		{Size: 10, TotalLines: 2, First: 1, Last: 2, Version: v},
		{Size: 10, TotalLines: 2, First: 1, Last: 2, Buffer: 7},
		{Size: 1 << 40, TotalLines: 9, First: 3, Last: 9, Binary: true, CutLines: 1, Full: true, Version: v, Buffer: 4294967295},
	} {
		hb, _ := json.Marshal(h)
		got, text, ok := decodeReadText(append(hb, "\nbody"...))
		if !ok || got != h || text != "body" {
			t.Errorf("%s: decoded %+v %q %v", hb, got, text, ok)
		}
	}
	for _, bad := range []string{
		`{"size":1,"total_lines":1,"first":1,"last":1,"binary":false,"cut_lines":0,"full":false,"buffer":-3}`,
		`{"size":1,"total_lines":1,"first":1,"last":1,"binary":false,"cut_lines":0,"full":false,"buffer":4294967296}`,
	} {
		if h, _, ok := decodeReadText([]byte(bad + "\n")); ok && h.Buffer != 0 {
			t.Errorf("%s: buffer %d", bad, h.Buffer)
		}
	}
	quoted := `{"size":1,"total_lines":1,"first":1,"last":1,"binary":false,"cut_lines":0,"full":false,"version":"` +
		strings.Repeat("a", 62) + `\"x"}`
	if h, _, ok := decodeReadText([]byte(quoted + "\n")); !ok || h.Version != strings.Repeat("a", 62)+`"x` {
		t.Errorf("an escaped version: %+v %v", h, ok)
	}
}

// TestHeldTextBlock: a held text becomes a framed 'h' block naming its buffer, with the
// text after it; from a host that sent the text, the text itself.
func TestHeldTextBlock(t *testing.T) {
	res := abi.Result{Content: []abi.Content{HeldText{id: 5}.Block("[note]\n")}}
	b := appendFramed(nil, res)
	want := append([]byte(abi.FramedMagic), 0, 'h')
	want = binary.LittleEndian.AppendUint32(want, 5)
	want = binary.LittleEndian.AppendUint32(want, 7)
	want = append(want, "[note]\n"...)
	if string(b) != string(want) {
		t.Errorf("framed %q, want %q", b, want)
	}
	if c := (HeldText{text: "lines\n"}).Block("[note]\n"); c.Held != 0 || c.Text != "lines\n[note]\n" {
		t.Errorf("a text the host sent: %+v", c)
	}

	// The native host sends the text (it predates nothing, but holds nothing either).
	h := &fakeHost{files: map[string][]byte{"a.txt": []byte("x\ny\n")}}
	old := SetHost(h)
	defer SetHost(old)
	hdr, held, err := ReadTextHeld(abi.ReadTextRequest{Path: "a.txt"})
	if err != nil || hdr.Buffer != 0 || held.Block("").Text != "x\ny\n" {
		t.Errorf("ReadTextHeld natively: %+v %+v %v", hdr, held, err)
	}
}
