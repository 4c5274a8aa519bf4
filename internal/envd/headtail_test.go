package envd

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

func TestHeadTail(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		limit := 2 + r.IntN(64)
		h := NewHeadTail(limit)
		var all, forwarded []byte
		for range r.IntN(20) {
			p := make([]byte, r.IntN(3*limit))
			for i := range p {
				p[i] = byte(r.IntN(256))
			}
			all = append(all, p...)
			forwarded = append(forwarded, h.Write(p)...)
		}
		hn := min(len(all), limit/2)
		tn := min(len(all)-hn, limit-limit/2)
		if !bytes.Equal(h.Head(), all[:hn]) || !bytes.Equal(forwarded, all[:hn]) {
			t.Fatalf("head wrong (limit %d, %d bytes)", limit, len(all))
		}
		if !bytes.Equal(h.Tail(), all[len(all)-tn:]) {
			t.Fatalf("tail wrong (limit %d, %d bytes): %x vs %x", limit, len(all), h.Tail(), all[len(all)-tn:])
		}
		if h.Dropped() != int64(len(all)-hn-tn) {
			t.Fatalf("dropped %d, want %d", h.Dropped(), len(all)-hn-tn)
		}
	}
}
