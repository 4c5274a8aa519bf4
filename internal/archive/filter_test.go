//go:build !windows

package archive

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// filterCorpus is the tar-slip corpus of TestExtractRefusesEscapes plus archives Extract
// accepts, some of them tricky (inner links, duplicates, hard links).
func filterCorpus() map[string][]entry {
	reg := func(name, body string) entry { return entry{name: name, typ: tar.TypeReg, body: body} }
	sym := func(name, target string) entry { return entry{name: name, typ: tar.TypeSymlink, link: target} }
	hard := func(name, target string) entry { return entry{name: name, typ: tar.TypeLink, link: target} }
	dir := func(name string) entry { return entry{name: name, typ: tar.TypeDir, mode: 0o755} }
	many := func(n int) []entry {
		var es []entry
		for i := range n {
			es = append(es, reg(fmt.Sprintf("f%02d", i), "x"))
		}
		return es
	}
	return map[string][]entry{
		"dotdot":                        {reg("ok.txt", "fine"), reg("../outside/evil1.txt", "x")},
		"dotdot-inner":                  {dir("a/"), reg("a/../../outside/evil.txt", "x")},
		"dotdot-harmless-still-refused": {reg("a/../b.txt", "x")},
		"absolute":                      {reg("/tmp/outside/evil2.txt", "x")},
		"symlink-dir-out":               {sym("lnk", "../outside"), reg("lnk/evil3.txt", "x")},
		"symlink-absolute":              {sym("abslnk", "/etc"), reg("abslnk/evil4.txt", "x")},
		"symlink-then-file":             {sym("victim", "../outside/secret.txt"), reg("victim", "overwritten")},
		"symlink-deep-out":              {dir("a/"), dir("a/b/"), sym("a/b/l", "../../../outside")},
		"symlink-dotdot-after-name":     {dir("d1/"), dir("d1/d2/"), sym("d1/d2/l1", "../.."), sym("l2", "d1/d2/l1/.."), reg("l2/outside/evil.txt", "x")},
		"entry-below-symlink":           {sym("s", "."), sym("s/s/s/l", "../../.."), reg("s/s/s/l/outside/evil.txt", "x")},
		"entry-below-inner-symlink":     {dir("d/"), sym("l", "d"), reg("l/f", "x")},
		"entry-below-file":              {reg("f", "x"), reg("f/g", "y")},
		"hardlink-out":                  {hard("hl", "../outside/secret.txt"), reg("hl", "overwritten")},
		"hardlink-absolute":             {hard("hl", "/etc/passwd")},
		"hardlink-not-yet-extracted":    {hard("hl", "later.txt"), reg("later.txt", "x")},
		"hardlink-to-symlink":           {sym("in", "a.txt"), reg("a.txt", "x"), hard("hl", "in")},
		"hardlink-to-replaced":          {reg("a.txt", "x"), sym("a.txt", "b"), hard("hl", "a.txt")},
		"char-device":                   {{name: "null", typ: tar.TypeChar}},
		"block-device":                  {{name: "sda", typ: tar.TypeBlock}},
		"fifo":                          {{name: "pipe", typ: tar.TypeFifo}},
		"long-name":                     {reg(strings.Repeat("n", 5000)+"/f", "x")},
		"dir-replaced-by-symlink":       {dir("d/"), sym("d", "x")},
		"dir-replaced-by-file":          {dir("d/"), reg("d/f", "x"), reg("d", "x")},
		"implicit-dir-replaced":         {reg("d/f", "x"), reg("d", "x")},
		"too-many-entries":              many(DefaultMaxEntries/100000 + 20),

		"ok-inner-links": {dir("a/"), dir("a/b/"), reg("a/b/file.txt", "content"), sym("a/b/up", "../../a/b/file.txt"),
			sym("top", "a/b"), sym("a/b/root", "../.."), hard("hl", "a/b/file.txt"), reg("dup.txt", "first"), reg("dup.txt", "second")},
		"ok-root-entry":       {dir("./"), reg("./x.txt", "x"), dir("./sub/"), reg("./sub/y", "y")},
		"ok-link-replaced":    {sym("l", "a"), reg("l", "now a file"), sym("l", "b")},
		"ok-hardlink-to-self": {reg("a", "x"), hard("a", "a")},
		"ok-implicit-parents": {reg("deep/er/est/f", "x"), sym("deep/l", "er/est/f")},
		"ok-setuid-masked":    {{name: "suid", typ: tar.TypeReg, body: "x", mode: 0o4755}},
	}
}

// Filter in strict mode refuses exactly what Extract refuses, with the same kind of error,
// and what it lets through extracts to the same tree as the original.
func TestFilterStrictAgreesWithExtract(t *testing.T) {
	ctx := context.Background()
	limits := ExtractOptions{MaxEntries: 20}
	for name, entries := range filterCorpus() {
		t.Run(name, eachInput(func(t *testing.T, plain bool) {
			data := craft(t, entries...)
			direct := filepath.Join(t.TempDir(), "direct")
			_, xerr := Extract(ctx, bytes.NewReader(data), direct, limits)
			var out bytes.Buffer
			_, ferr := Filter(ctx, &out, bytes.NewReader(filterInput(t, data, plain)), FilterOptions{Strict: true, MaxEntries: limits.MaxEntries, Plain: plain})
			if (xerr == nil) != (ferr == nil) {
				t.Fatalf("Extract: %v; Filter: %v", xerr, ferr)
			}
			if xerr != nil {
				for _, sentinel := range []error{ErrUnsafe, ErrTooLarge} {
					if errors.Is(xerr, sentinel) != errors.Is(ferr, sentinel) {
						t.Errorf("Extract: %v; Filter: %v (different kinds)", xerr, ferr)
					}
				}
				return
			}
			filtered := filepath.Join(t.TempDir(), "filtered")
			if _, err := Extract(ctx, &out, filtered, limits); err != nil {
				t.Fatalf("Extract of Filter's output: %v", err)
			}
			if d := diffStates(namedTimes(treeState(t, direct, true), entries), namedTimes(treeState(t, filtered, true), entries)); d != "" {
				t.Errorf("the filtered archive extracts differently:\n%s", d)
			}
		}))
	}
}

// eachInput runs fn on the gzip-compressed archive and on the same archive uncompressed
// (FilterOptions.Plain): the rules are the same whatever the input's encoding.
func eachInput(fn func(t *testing.T, plain bool)) func(t *testing.T) {
	return func(t *testing.T) {
		t.Run("gzip", func(t *testing.T) { fn(t, false) })
		t.Run("plain", func(t *testing.T) { fn(t, true) })
	}
}

// filterInput is data (a tar.gz) as Filter reads it: uncompressed when plain.
func filterInput(t *testing.T, data []byte, plain bool) []byte {
	t.Helper()
	if !plain {
		return data
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// Without Strict, Filter keeps what Extract accepts and skips the rest, so its output
// always extracts, with Extract and with GNU tar alike, and nothing in it leaves the tree.
func TestFilterSkipsWhatExtractRefuses(t *testing.T) {
	if _, err := exec.LookPath("tar"); err != nil {
		t.Fatalf("GNU tar is needed for this test: %v", err)
	}
	ctx := context.Background()
	for name, entries := range filterCorpus() {
		t.Run(name, eachInput(func(t *testing.T, plain bool) {
			data := craft(t, entries...)
			var out bytes.Buffer
			st, err := Filter(ctx, &out, bytes.NewReader(filterInput(t, data, plain)), FilterOptions{MaxEntries: 20, Plain: plain})
			if err != nil {
				t.Fatalf("Filter: %v", err)
			}
			if strings.HasPrefix(name, "ok-") && st.Skipped != 0 {
				t.Errorf("an acceptable archive lost entries: %+v", st.Skips)
			}
			if !strings.HasPrefix(name, "ok-") && st.Skipped == 0 {
				t.Errorf("nothing was skipped from a hostile archive")
			}
			base := t.TempDir()
			ours := filepath.Join(base, "extract")
			if _, err := Extract(ctx, bytes.NewReader(out.Bytes()), ours, ExtractOptions{}); err != nil {
				t.Fatalf("Extract of the filtered archive: %v", err)
			}
			arch := filepath.Join(base, "f.tar.gz")
			if err := os.WriteFile(arch, out.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			byTar := filepath.Join(base, "tar")
			os.Mkdir(byTar, 0o755)
			if b, err := exec.Command("tar", "-x", "-z", "-f", arch, "-C", byTar, "--no-same-owner").CombinedOutput(); err != nil {
				t.Fatalf("GNU tar refused the filtered archive: %v\n%s", err, b)
			}
			if d := diffStates(namedTimes(treeState(t, ours, true), entries), namedTimes(treeState(t, byTar, true), entries)); d != "" {
				t.Errorf("GNU tar and Extract disagree on the filtered archive:\n%s", d)
			}
		}))
	}
}

// A GNU tar archive of a tree with what Pack would skip (an absolute link, a link out, a
// fifo, a socket) filters to one that Extract takes whole.
func TestFilterGNUTarArchive(t *testing.T) {
	src := sampleTree(t)
	arch := filepath.Join(t.TempDir(), "gnu.tar.gz")
	if b, err := exec.Command("tar", "-c", "-z", "-f", arch, "-C", src, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar -c: %v\n%s", err, b)
	}
	f, err := os.Open(arch)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out bytes.Buffer
	st, err := Filter(context.Background(), &out, f, FilterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Skipped != 3 {
		t.Errorf("skipped %d (%+v), want the two links out and the fifo", st.Skipped, st.Skips)
	}
	dst := filepath.Join(t.TempDir(), "d")
	if _, err := Extract(context.Background(), &out, dst, ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(dst, "locked"), 0o755) })
	// What Filter leaves out (GNU tar itself ignores the socket), and the link it cleans.
	for _, n := range []string{"abs", "escape", "fifo", "s.sock", "src/app/cleaned"} {
		os.Remove(filepath.Join(src, n))
	}
	if err := os.Symlink("../app/main.go", filepath.Join(src, "src/app/cleaned")); err != nil {
		t.Fatal(err)
	}
	want, got := treeState(t, src, false), treeState(t, dst, false)
	if d := diffStates(want, got); d != "" {
		t.Errorf("filtered GNU tar archive restored differently:\n%s", d)
	}
}

// A link already in the destination is a link the archive must not write below.
func TestFilterKnowsExistingLinks(t *testing.T) {
	data := craft(t, entry{name: "keep.txt", typ: tar.TypeReg, body: "x"}, entry{name: "lib/evil.so", typ: tar.TypeReg, body: "x"})
	var out bytes.Buffer
	_, err := Filter(context.Background(), &out, bytes.NewReader(data), FilterOptions{Strict: true, Links: []string{"lib"}})
	if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "lib/evil.so") {
		t.Fatalf("entry below an existing link: %v", err)
	}
	out.Reset()
	st, err := Filter(context.Background(), &out, bytes.NewReader(data), FilterOptions{Links: []string{"other"}})
	if err != nil || st.Files != 2 {
		t.Fatalf("unrelated link: %+v %v", st, err)
	}
}

// namedTimes drops the times of the directories an archive of entries does not name: a
// parent made implicitly gets the time it was made (Extract and GNU tar alike), which two
// extractions a second apart on a loaded machine do not share. The times of what the
// archive names are kept and compared.
func namedTimes(state map[string]string, entries []entry) map[string]string {
	// Only a directory entry gives a directory its time: one made implicitly (for the
	// entries below it, or where a skipped link or file was) has the time it was made,
	// which differs between two extractions on a loaded machine.
	named := map[string]bool{}
	for _, e := range entries {
		if e.typ == tar.TypeDir {
			named[path.Clean(strings.TrimPrefix(e.name, "./"))] = true
		}
	}
	out := make(map[string]string, len(state))
	for rel, desc := range state {
		if !named[filepath.ToSlash(rel)] && strings.HasPrefix(desc, "d") {
			if i := strings.LastIndexByte(desc, ' '); i > 0 {
				desc = desc[:i]
			}
		}
		out[rel] = desc
	}
	return out
}

// An uncompressed input has no gzip trailer to end it: what follows the tar end marker is
// read up to 1 MiB, and more is refused with Strict (a sandbox that keeps writing after
// its archive cannot hold the filter), dropped without.
func TestFilterPlainTrailer(t *testing.T) {
	raw := filterInput(t, craft(t, entry{name: "a.txt", typ: tar.TypeReg, body: "x"}), true)
	junk := io.MultiReader(bytes.NewReader(raw), io.LimitReader(neverEnding('x'), 64<<20))
	_, err := Filter(context.Background(), io.Discard, junk, FilterOptions{Strict: true, Plain: true})
	if !errors.Is(err, ErrUnsafe) {
		t.Fatalf("64 MiB after the end marker, strict: %v", err)
	}
	junk = io.MultiReader(bytes.NewReader(raw), io.LimitReader(neverEnding('x'), 64<<20))
	var out bytes.Buffer
	st, err := Filter(context.Background(), &out, junk, FilterOptions{Plain: true})
	if err != nil || st.Files != 1 {
		t.Fatalf("64 MiB after the end marker: %+v %v", st, err)
	}
	// A plain stream is not taken for gzip, nor gzip for plain.
	if _, err := Filter(context.Background(), io.Discard, bytes.NewReader(raw), FilterOptions{}); err == nil {
		t.Error("a plain tar was read as gzip")
	}
	if _, err := Filter(context.Background(), io.Discard, bytes.NewReader(craft(t, entry{name: "a", typ: tar.TypeReg, body: "x"})), FilterOptions{Plain: true}); err == nil {
		t.Error("a tar.gz was read as a plain tar")
	}
}

type neverEnding byte

func (b neverEnding) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}
