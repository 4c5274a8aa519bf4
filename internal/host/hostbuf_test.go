package host

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/memsandbox"
	"github.com/toolhost/toolhost/internal/testenv"
)

// heldFrame is a framed result of one text block naming host buffer id, then tail.
func heldFrame(id uint32, tail string) []byte {
	b := append([]byte(abi.FramedMagic), 0, abi.FramedHeld)
	b = binary.LittleEndian.AppendUint32(b, id)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(tail)))
	return append(b, tail...)
}

// TestHostBuffersLastOneCall: a buffer is the call's; when the call ends it is dropped, and
// a result of a later call that names it is refused as an earlier call's, never served
// from the bytes of another call.
func TestHostBuffersLastOneCall(t *testing.T) {
	inst := &instance{}
	inst.bufs.begin()
	id, st := inst.hold("read_text a.txt", []byte("first call\n"))
	if st != 0 || id == 0 {
		t.Fatalf("hold = %d, status %d", id, st)
	}
	first := inst.takeBuffers()
	if inst.bufs.bufs != nil || inst.bufs.bytes != 0 {
		t.Fatalf("the instance still holds %d buffers after its call", len(inst.bufs.bufs))
	}
	res, err := parseFramed(heldFrame(id, "[end]"), &first)
	if err != nil || res.Content[0].Text != "first call\n[end]" {
		t.Fatalf("the call's own buffer: %+v, %v", res, err)
	}

	inst.bufs.begin() // the next call
	id2, _ := inst.hold("read_text b.txt", []byte("second call\n"))
	second := inst.takeBuffers()
	if id2 == id {
		t.Fatalf("the second call was given id %d again", id)
	}
	for _, c := range []struct {
		id   uint32
		want string
	}{{id, "earlier call"}, {id2 + 1, "never given"}, {0, "does not exist"}} {
		if _, err := parseFramed(heldFrame(c.id, ""), &second); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("a result naming buffer %d: %v; want an error saying %q", c.id, err, c.want)
		}
	}
	if _, err := parseFramed(heldFrame(id, ""), nil); err == nil {
		t.Error("a result naming a buffer of a call without buffers was accepted")
	}
}

// TestHostBuffersThroughAPlugin: a plugin written against ABI.md alone (the probe) reads a
// file with read_text's hold and names the buffer in its result; the host answers with
// its own bytes, post-processed like any text (escape sequences removed), and refuses
// every name the call was not given, each with an error that says which.
func TestHostBuffersThroughAPlugin(t *testing.T) {
	h := newProbeHost(t, func(c *Config) { c.PoolSize = 1 })
	sb := memsandbox.New()
	sb.Put("f.txt", "one\n\x1b[31mtwo\x1b[0m\n")
	long := strings.Repeat(strings.Repeat("y", 999)+"\n", 60) // a window of ~48 KB
	sb.Put("long.txt", long)
	s := h.OpenSession(sb)

	res, err := dispatch(t, s, "held", `{"path":"f.txt","mode":"ok"}`)
	if err != nil || res.IsError || testenv.ResultText(res) != "one\ntwo\n[end]" {
		t.Fatalf("held ok = %q (error %v), %v", testenv.ResultText(res), res.IsError, err)
	}

	for _, c := range []struct{ mode, want string }{
		{"unknown", "was never given to this call"},
		{"zero", "host buffer 0 does not exist"},
	} {
		res, err := dispatch(t, s, "held", fmt.Sprintf(`{"path":"f.txt","mode":%q}`, c.mode))
		if !errors.Is(err, ErrPluginFailed) || !res.IsError || !strings.Contains(err.Error(), c.want) {
			t.Errorf("held %s: %q, %v; want ErrPluginFailed saying %q", c.mode, testenv.ResultText(res), err, c.want)
		}
	}

	// A buffer of the instance's earlier call. The pool has one instance; should the
	// call land on a fresh one (its compiled form replacing the quick one), try again.
	for i := 0; ; i++ {
		if _, err := dispatch(t, s, "held", `{"path":"f.txt","mode":"ok"}`); err != nil {
			t.Fatal(err)
		}
		res, err := dispatch(t, s, "held", `{"mode":"stale"}`)
		if err == nil && res.IsError && strings.Contains(testenv.ResultText(res), "no earlier buffer") && i < 10 {
			continue
		}
		if !errors.Is(err, ErrPluginFailed) || !strings.Contains(err.Error(), "held by an earlier call and is gone") {
			t.Errorf("held stale: %q, %v; want ErrPluginFailed saying the buffer was an earlier call's", testenv.ResultText(res), err)
		}
		break
	}

	// One buffer named again and again may not blow the result past its limit.
	res, err = dispatch(t, s, "held", `{"path":"long.txt","mode":"many","n":2000}`)
	if !errors.Is(err, ErrPluginFailed) || !strings.Contains(err.Error(), "result limit") {
		t.Errorf("a buffer named 2,000 times: a result of %d bytes, %v; want ErrPluginFailed over the result limit", len(testenv.ResultText(res)), err)
	}

	// A call holds at most abi.MaxHostBuffers buffers: read_text with hold then says -27.
	res, err = dispatch(t, s, "held", fmt.Sprintf(`{"path":"f.txt","mode":"ok","n":%d}`, abi.MaxHostBuffers+1))
	if err != nil || !res.IsError || !strings.Contains(testenv.ResultText(res), "status -27") ||
		!strings.Contains(testenv.ResultText(res), "host buffers") {
		t.Errorf("%d buffers in one call: %q, %v; want status -27", abi.MaxHostBuffers+1, testenv.ResultText(res), err)
	}
	res, err = dispatch(t, s, "held", fmt.Sprintf(`{"path":"f.txt","mode":"ok","n":%d}`, abi.MaxHostBuffers))
	if err != nil || res.IsError {
		t.Errorf("%d buffers in one call: %q, %v", abi.MaxHostBuffers, testenv.ResultText(res), err)
	}
}
