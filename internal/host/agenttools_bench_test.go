//go:build linux

package host_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/memsandbox"
)

// BenchmarkPatchVersusEdits: the same change to 10 files of a local sandbox, as one
// apply_patch call and as 10 edit_file calls, in one run (docs/BENCHMARKS.md).
func BenchmarkPatchVersusEdits(b *testing.B) {
	sb, _ := newSandbox(b, newProvider(b))
	s := newHost(b).OpenSession(sb)
	ctx := context.Background()
	for i := range 10 {
		body := fmt.Sprintf("package f%d\n\n// file %d\nconst value = 0\n\nfunc f() int { return value }\n", i, i)
		if err := sb.WriteFile(ctx, fmt.Sprintf("/home/user/src/f%d.go", i), []byte(body)); err != nil {
			b.Fatal(err)
		}
	}
	patch := func(from, to int) json.RawMessage {
		var p strings.Builder
		p.WriteString("*** Begin Patch\n")
		for i := range 10 {
			fmt.Fprintf(&p, "*** Update File: src/f%d.go\n@@\n // file %d\n-const value = %d\n+const value = %d\n", i, i, from, to)
		}
		p.WriteString("*** End Patch\n")
		in, _ := json.Marshal(map[string]string{"input": p.String()})
		return in
	}
	call := func(b *testing.B, tool string, in json.RawMessage) {
		res, err := s.Dispatch(ctx, tool, in)
		if err != nil || res.IsError {
			b.Fatalf("%s: %v %+v", tool, err, res)
		}
	}
	n := 0
	b.Run("apply_patch_10_files", func(b *testing.B) {
		for b.Loop() {
			call(b, "apply_patch", patch(n, n+1))
			n++
		}
	})
	b.Run("edit_file_10_calls", func(b *testing.B) {
		for b.Loop() {
			for i := range 10 {
				in, _ := json.Marshal(map[string]string{"path": fmt.Sprintf("src/f%d.go", i),
					"old_string": fmt.Sprintf("const value = %d", n), "new_string": fmt.Sprintf("const value = %d", n+1)})
				call(b, "edit_file", in)
			}
			n++
		}
	})
}

// BenchmarkTerminalRoundTrip: write one line to cat on a terminal of a local sandbox and
// collect its echo (the terminal's and cat's), quiet after 1 ms; reports the median.
func BenchmarkTerminalRoundTrip(b *testing.B) {
	sb, _ := newSandbox(b, newProvider(b))
	terms, ok := sandbox.As[sandbox.Terminals](sb)
	if !ok {
		b.Fatal("the local sandbox has no terminals")
	}
	ctx := context.Background()
	out, err := terms.StartTerminal(ctx, sandbox.TerminalRequest{Argv: []string{"cat"}}, sandbox.TerminalWait{Wait: 2 * time.Second, Quiet: 100 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	w := sandbox.TerminalWait{Wait: 10 * time.Second, Quiet: time.Millisecond}
	var took []time.Duration
	for b.Loop() {
		start := time.Now()
		got := ""
		for !strings.Contains(got, "ping\r\nping\r\n") {
			input := []byte(nil)
			if got == "" {
				input = []byte("ping\n")
			}
			o, err := terms.TerminalIO(ctx, out.ID, input, "", w)
			if err != nil {
				b.Fatal(err)
			}
			got += string(o.Output)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(took[len(took)*9/10].Microseconds())/1000, "p90-ms")
}

// noisyPNG encodes a w x h image of noise, which compresses badly: about 3 bytes a pixel.
func noisyPNG(b *testing.B, w, h int) []byte {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(img.Pix); i += 4 {
		img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = uint8(r.Uint32()), uint8(r.Uint32()), uint8(r.Uint32()), 255
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

// BenchmarkReadFilePNG: read_file of a 1 MB PNG from an in-memory sandbox: one within the
// 1568-pixel bound, passed through as it is, and one larger, decoded, scaled and
// re-encoded in the plugin.
func BenchmarkReadFilePNG(b *testing.B) {
	h := newHost(b)
	sb := memsandbox.New()
	for _, c := range []struct {
		name string
		w, h int
	}{{"1MB_within_bounds", 580, 580}, {"1MB_scaled", 1800, 190}} {
		data := noisyPNG(b, c.w, c.h)
		sb.Put(c.name+".png", string(data))
		b.Run(c.name, func(b *testing.B) {
			s := h.OpenSession(sb)
			in := json.RawMessage(`{"path":"` + c.name + `.png"}`)
			b.ReportMetric(float64(len(data))/1e6, "MB")
			for b.Loop() {
				res, err := s.Dispatch(context.Background(), "read_file", in)
				if err != nil || res.IsError || len(res.Content) != 2 {
					b.Fatalf("%v %+v", err, res)
				}
			}
		})
	}
}
