package snapshot_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/toolhost/toolhost/internal/snapshot"
	dirstore "github.com/toolhost/toolhost/internal/store/dir"
)

// Save a workspace to the embedded directory store and restore it elsewhere.
func Example() {
	tmp, _ := os.MkdirTemp("", "snapshot-example-")
	defer os.RemoveAll(tmp)
	ws := filepath.Join(tmp, "workspace")
	os.MkdirAll(filepath.Join(ws, "node_modules", "dep"), 0o755)
	os.WriteFile(filepath.Join(ws, "main.go"), []byte("package main\n"), 0o644)

	st, err := dirstore.New(filepath.Join(tmp, "store"))
	if err != nil {
		panic(err)
	}
	defer st.Close()
	m, err := snapshot.New(snapshot.Config{Store: st, Keep: 5})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	info, pack, err := m.SaveDir(ctx, "demo", ws)
	if err != nil {
		panic(err) // errors.Is(err, snapshot.ErrSaveFailed): log it and carry on
	}
	fmt.Println("saved files:", pack.Files, "format:", info.Format)

	restored := filepath.Join(tmp, "restored")
	_, ex, err := m.RestoreDir(ctx, "demo", restored, false)
	if err != nil {
		panic(err)
	}
	b, _ := os.ReadFile(filepath.Join(restored, "main.go"))
	_, nmErr := os.Stat(filepath.Join(restored, "node_modules"))
	fmt.Printf("restored files: %d, main.go: %q, node_modules excluded: %v\n", ex.Files, b, os.IsNotExist(nmErr))
	// Output:
	// saved files: 1 format: chunked
	// restored files: 1, main.go: "package main\n", node_modules excluded: true
}
