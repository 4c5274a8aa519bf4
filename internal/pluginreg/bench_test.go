package pluginreg

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/testplugins"
)

// BenchmarkAdd is `plugin add` of the wc test plugin (about 2 MB) from a registry on
// loopback: pull, digest check, signature, inspection, config and lock written.
func BenchmarkAdd(b *testing.B) {
	ctx := context.Background()
	reg := startRegistry(b)
	key, pub := newKey(b)
	wasm := wasmOf(b, "internal/pluginreg/testdata/wc1")
	ref := reg.host + "/team/wc:0.1.0"
	push(b, ref, wasm, key)
	keys, err := ReadPublicKeys([]string{pub})
	if err != nil {
		b.Fatal(err)
	}
	grants, _ := ParseGrants([]string{"sandbox_files"})
	b.SetBytes(int64(len(wasm)))
	for b.Loop() {
		b.StopTimer()
		dir := b.TempDir()
		in := &Installer{ConfigFile: filepath.Join(dir, "toolhost.yaml"), DataDir: filepath.Join(dir, "data"),
			Current: toolhost.DefaultConfig().Plugins, Keys: keys}
		b.StartTimer()
		if _, err := in.Add(ctx, ref, grants); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLoad loads a configuration of one plugin by path, and the same with the
// plugin pinned in a lock (the lock's check included), compilation cached; it reports
// both and how much more the locked load costs (locked-%-over). ns/op is the pair.
func BenchmarkLoad(b *testing.B) {
	wasm := wasmOf(b, "internal/pluginreg/testdata/wc1")
	dir := b.TempDir()
	data := filepath.Join(dir, "data")
	os.MkdirAll(data, 0o700)
	if err := testplugins.LinkCache(data); err != nil {
		b.Fatal(err)
	}
	path, err := CachePut(data, wasm)
	if err != nil {
		b.Fatal(err)
	}
	lock := &Lock{Version: 1, Plugins: []LockedPlugin{{Name: "wc", Path: path, Wasm: Digest(wasm)}}}
	cfg := toolhost.DefaultConfig()
	cfg.DataDir = data
	cfg.Plugins = []toolhost.Plugin{{Path: path, Grants: []abi.Capability{abi.CapSandboxFiles}}}
	cfg.Screenshot.Enabled = false
	ctx := context.Background()
	load := func(b *testing.B, locked bool) time.Duration {
		start := time.Now()
		if locked {
			if err := lock.Check([]string{path}, StampDir(data)); err != nil {
				b.Fatal(err)
			}
		}
		th, err := toolhost.New(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		th.Close(ctx)
		return time.Since(start)
	}
	// A stamp is trusted only for a file unchanged for a second (stampOf).
	time.Sleep(1100 * time.Millisecond)
	load(b, true) // warm the compilation cache and take the stamp
	// The two loads alternate, so that the machine's load weighs on both alike.
	var byPath, locked time.Duration
	for b.Loop() {
		byPath += load(b, false)
		locked += load(b, true)
	}
	b.ReportMetric(float64(byPath.Nanoseconds())/float64(b.N), "path-ns/load")
	b.ReportMetric(float64(locked.Nanoseconds())/float64(b.N), "locked-ns/load")
	b.ReportMetric(100*(float64(locked)/float64(byPath)-1), "locked-%-over")
}

// BenchmarkLockCheck is the lock's check of one 2.75 MB module alone: with its stamp
// (what a load pays) and reading and hashing it (the first load after a change).
func BenchmarkLockCheck(b *testing.B) {
	dir := b.TempDir()
	wasm := make([]byte, 2750000)
	path, err := CachePut(dir, wasm)
	if err != nil {
		b.Fatal(err)
	}
	lock := &Lock{Version: 1, Plugins: []LockedPlugin{{Name: "m", Path: path, Wasm: Digest(wasm)}}}
	time.Sleep(1100 * time.Millisecond) // a stamp is taken of a file unchanged for a second
	for _, c := range []struct{ name, stamps string }{{"stamped", StampDir(dir)}, {"hashed", ""}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if err := lock.Check([]string{path}, c.stamps); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
