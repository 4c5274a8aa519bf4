package host

import (
	"encoding/base64"
	"encoding/binary"
	"testing"

	"github.com/toolhost/toolhost/abi"
)

func TestParseFramed(t *testing.T) {
	frame := []byte(abi.FramedMagic)
	frame = append(frame, 1) // is_error
	frame = append(frame, 't')
	frame = binary.LittleEndian.AppendUint32(frame, 8)
	frame = append(frame, "a \"q\"\n\xffb"...)
	frame = append(frame, 'i', 10)
	frame = append(frame, "image/webp"...)
	frame = binary.LittleEndian.AppendUint32(frame, 3)
	frame = append(frame, 1, 2, 3)
	res, err := parseFramed(frame, &hostBuffers{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || len(res.Content) != 2 || res.Content[0].Text != "a \"q\"\n\uFFFDb" ||
		res.Content[1].Source.MediaType != "image/webp" || res.Content[1].Source.Data != base64.StdEncoding.EncodeToString([]byte{1, 2, 3}) {
		t.Fatalf("parsed %+v", res)
	}
	for _, bad := range [][]byte{frame[:6], frame[:10], frame[:len(frame)-1], append(append([]byte{}, frame[:6]...), 'z')} {
		if _, err := parseFramed(bad, &hostBuffers{}); err == nil && len(bad) > 6 {
			t.Errorf("parseFramed(%q) accepted a broken frame", bad)
		}
	}
}
