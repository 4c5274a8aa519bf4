package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/toolhost/toolhost/internal/memsandbox"
)

// TestSameWork: both hosts give the same answers for every case, and load again from
// their warm caches (make duel checks the same before it times anything).
func TestSameWork(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	sb := memsandbox.New()
	sb.Put("f.txt", fourK)
	var rts []runtime
	for _, g := range []string{"toolhost", "extism"} {
		p := filepath.Join(dir, g+".wasm")
		if err := buildGuest(ctx, "./guests/"+g, p); err != nil {
			t.Fatal(err)
		}
		wasm, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var rt runtime
		if g == "toolhost" {
			rt, err = newToolhost(ctx, filepath.Join(dir, g+"-cache"), wasm, sb)
		} else {
			rt, err = newExtism(ctx, filepath.Join(dir, g+"-cache"), wasm, sb)
		}
		if err != nil {
			t.Fatalf("%s: %v", g, err)
		}
		t.Cleanup(func() { rt.close(ctx) })
		if err := rt.load(ctx); err != nil {
			t.Fatalf("%s: load: %v", g, err)
		}
		rts = append(rts, rt)
	}
	if err := sameAnswers(ctx, rts[0], rts[1]); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkLoad: the duel's load in a running process, one host after the other (not
// interleaved: make duel's table is the ratio): a new host given the module's bytes, its
// first call, Close; the compilation cache warm, toolhost's record saying so.
//
//	go test -run '^$' -bench Load -benchtime 20x -count 3 .
func BenchmarkLoad(b *testing.B) {
	ctx := context.Background()
	dir := b.TempDir()
	sb := memsandbox.New()
	sb.Put("f.txt", fourK)
	for _, g := range []string{"toolhost", "extism"} {
		p := filepath.Join(dir, g+".wasm")
		if err := buildGuest(ctx, "./guests/"+g, p); err != nil {
			b.Fatal(err)
		}
		wasm, err := os.ReadFile(p)
		if err != nil {
			b.Fatal(err)
		}
		var rt runtime
		if g == "toolhost" {
			th, err := newToolhost(ctx, filepath.Join(dir, g+"-cache"), wasm, sb)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := th.call(ctx, "noop"); err != nil {
				b.Fatal(err)
			}
			if err := th.h.Settle(ctx); err != nil {
				b.Fatal(err)
			}
			rt = th
		} else if rt, err = newExtism(ctx, filepath.Join(dir, g+"-cache"), wasm, sb); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { rt.close(ctx) })
		b.Run(g, func(b *testing.B) {
			for b.Loop() {
				if err := rt.load(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
