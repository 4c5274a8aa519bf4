//go:build !windows

package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/klauspost/pgzip"
)

// contents returns every regular file's bytes in an archive, by name.
func contents(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	zr, err := pgzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	out := map[string][]byte{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			out[hdr.Name] = b
		}
	}
}

// A tree that changes under Pack cannot make it read anything outside: an entry swapped
// thousands of times between a regular file and a symbolic link to a secret outside the tree
// (and a directory swapped for a link to a secret directory) never brings a byte of the
// secret into an archive.
func TestPackNeverFollowsALinkSwappedIn(t *testing.T) {
	outside := t.TempDir()
	secret := "HOST-SECRET-" + strings.Repeat("s", 64)
	if err := os.WriteFile(filepath.Join(outside, "shadow"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(outside, "secretdir"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "secretdir", "key"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "keep.txt"), []byte("ordinary\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var swaps atomic.Int64
	swapper := func(name string, asLink func(string) error, asReal func(string) error) {
		defer wg.Done()
		p := filepath.Join(ws, name)
		tmp := p + ".tmp"
		for i := 0; ctx.Err() == nil; i++ {
			os.RemoveAll(tmp)
			var err error
			if i%2 == 0 {
				err = asLink(tmp)
			} else {
				err = asReal(tmp)
			}
			if err == nil && os.Rename(tmp, p) == nil {
				swaps.Add(1)
			} else if i%2 == 0 {
				os.RemoveAll(p) // a directory cannot be renamed over: clear the spot
			}
		}
	}
	wg.Add(2)
	go swapper("entry",
		func(p string) error { return os.Symlink(filepath.Join(outside, "shadow"), p) },
		func(p string) error { return os.WriteFile(p, []byte("decoy file\n"), 0o644) })
	go swapper("dir",
		func(p string) error { return os.Symlink(filepath.Join(outside, "secretdir"), p) },
		func(p string) error {
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(p, "key"), []byte("decoy key\n"), 0o644)
		})

	packs := 300
	if testing.Short() {
		packs = 50
	}
	for i := 0; i < packs; i++ {
		var buf bytes.Buffer
		if _, err := Pack(context.Background(), &buf, ws, PackOptions{}); err != nil {
			cancel()
			wg.Wait()
			t.Fatalf("pack %d: %v", i, err)
		}
		if bytes.Contains(buf.Bytes(), []byte("HOST-SECRET")) { // compressed: check contents too
			t.Fatalf("pack %d: the secret's bytes are in the archive", i)
		}
		for name, b := range contents(t, buf.Bytes()) {
			if bytes.Contains(b, []byte("HOST-SECRET")) {
				cancel()
				wg.Wait()
				t.Fatalf("pack %d: %s holds the host's secret", i, name)
			}
		}
	}
	cancel()
	wg.Wait()
	if swaps.Load() < int64(packs) {
		t.Fatalf("only %d swaps happened during %d packs: the race was not exercised", swaps.Load(), packs)
	}
	t.Logf("%d packs during %d swaps", packs, swaps.Load())
}

// What Pack cannot store it skips and reports, and the archive still extracts: a name
// longer than Extract accepts, a file past the size bound, entries past the entry bound.
func TestPackEnforcesExtractBounds(t *testing.T) {
	ws := t.TempDir()
	long := ws
	for len(long)-len(ws) < 300 {
		long = filepath.Join(long, strings.Repeat("d", 50))
	}
	if err := os.MkdirAll(long, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(long, "deep.txt"), []byte("deep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "big.bin"), bytes.Repeat([]byte("x"), 5000), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := os.WriteFile(filepath.Join(ws, "f"+string(rune('a'+i))), []byte("small"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	st, err := Pack(context.Background(), &buf, ws, PackOptions{MaxNameLen: 200, MaxBytes: 4000, MaxEntries: 8})
	if err != nil {
		t.Fatal(err)
	}
	if st.Skipped == 0 || len(st.Skips) == 0 {
		t.Fatalf("nothing skipped: %+v", st)
	}
	reasons := ""
	for _, s := range st.Skips {
		reasons += s.Path + ": " + s.Reason + "\n"
	}
	for _, want := range []string{"longer than 200 bytes", "would take the snapshot past 4000 bytes", "already holds 8 entries"} {
		if !strings.Contains(reasons, want) {
			t.Errorf("no skip says %q:\n%s", want, reasons)
		}
	}
	// The same bounds at extraction accept everything Pack wrote.
	dst := filepath.Join(t.TempDir(), "out")
	if _, err := Extract(context.Background(), &buf, dst, ExtractOptions{MaxNameLen: 200, MaxBytes: 4000, MaxEntries: 8}); err != nil {
		t.Fatalf("extract of what Pack stored within the same bounds: %v", err)
	}
}
