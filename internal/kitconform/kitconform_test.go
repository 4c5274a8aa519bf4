package kitconform_test

import (
	"errors"
	"os"
	"testing"

	"github.com/toolhost/toolhost/internal/kitconform"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testplugins"
)

// kit runs the suite on a kit's example, built by build; a machine without the kit's
// toolchain skips (fails on CI).
func kit(t *testing.T, name string, build func() (string, error)) {
	p, err := build()
	if errors.Is(err, testplugins.ErrNoToolchain) {
		testenv.Skipf(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	wasm, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	kitconform.Run(t, name, wasm)
}

// TestGoKit holds the Go kit's example (pdk/examples/notes) to the suite.
func TestGoKit(t *testing.T) {
	kit(t, "notes-go", func() (string, error) { return testplugins.Build("pdk/examples/notes") })
}

// TestRustKit holds the Rust kit's example (pdk/rust/examples/notes.rs), built with
// Debian's rustc for wasm32-wasi, to the suite.
func TestRustKit(t *testing.T) {
	kit(t, "notes-rust", func() (string, error) { return testplugins.BuildRust("notes") })
}

// TestAssemblyScriptKit holds the AssemblyScript kit's example
// (pdk/assemblyscript/example/notes.ts), built with the assemblyscript compiler that
// package-lock.json pins, to the suite.
func TestAssemblyScriptKit(t *testing.T) {
	kit(t, "notes-as", func() (string, error) { return testplugins.BuildAssemblyScript("notes") })
}
