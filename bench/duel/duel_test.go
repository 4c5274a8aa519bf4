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
