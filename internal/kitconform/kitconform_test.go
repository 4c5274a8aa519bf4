package kitconform_test

import (
	"os"
	"testing"

	"github.com/toolhost/toolhost/internal/kitconform"
	"github.com/toolhost/toolhost/internal/testplugins"
)

// TestGoKit holds the Go kit's example (pdk/examples/notes) to the suite.
func TestGoKit(t *testing.T) {
	p, err := testplugins.Build("pdk/examples/notes")
	if err != nil {
		t.Fatal(err)
	}
	wasm, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	kitconform.Run(t, "notes-go", wasm)
}
