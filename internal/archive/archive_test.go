//go:build !windows

package archive

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// treeState describes every entry below dir (type, mode, size, content hash or link
// target, mtime) so two trees, or one tree before and after, can be compared.
func treeState(t *testing.T, dir string, withTimes bool) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		desc := fi.Mode().String()
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			desc += fmt.Sprintf(" %d %x", len(b), sum[:6])
		}
		if withTimes && fi.Mode()&fs.ModeSymlink == 0 && rel != "." {
			desc += " " + fi.ModTime().UTC().Format(time.RFC3339)
		}
		m[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func diffStates(a, b map[string]string) string {
	var out []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			out = append(out, "only in first: "+k+" "+v)
		} else if v != w {
			out = append(out, "differs: "+k+": "+v+" vs "+w)
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok {
			out = append(out, "only in second: "+k+" "+v)
		}
	}
	return strings.Join(out, "\n")
}

func write(t *testing.T, p string, data string, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// sampleTree builds a workspace with files, modes, empty dirs, symlinks (inner, dangling,
// escaping, absolute), excluded dirs, a socket and a fifo.
func sampleTree(t *testing.T) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "ws")
	write(t, filepath.Join(src, "README.md"), "# hello\n", 0o644)
	write(t, filepath.Join(src, "bin/run.sh"), "#!/bin/sh\necho hi\n", 0o755)
	write(t, filepath.Join(src, "src/app/main.go"), strings.Repeat("package main\n", 500), 0o600)
	write(t, filepath.Join(src, "src/app/empty.txt"), "", 0o644)
	write(t, filepath.Join(src, "node_modules/left-pad/index.js"), "module.exports=1", 0o644)
	write(t, filepath.Join(src, "src/node_modules/x.js"), "x", 0o644)
	write(t, filepath.Join(src, ".git/HEAD"), "ref: refs/heads/main\n", 0o644)
	write(t, filepath.Join(src, "web/.next/cache"), "c", 0o644)
	write(t, filepath.Join(src, "py/__pycache__/m.pyc"), "c", 0o644)
	write(t, filepath.Join(src, "py/.venv/bin/python"), "c", 0o755)
	write(t, filepath.Join(src, "dist"), "a file named dist is excluded too", 0o644)
	for _, d := range []string{"empty", "deep/empty/dir", "locked"} {
		if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(src, "locked/inside.txt"), "in a read-only dir", 0o444)
	if err := os.Chmod(filepath.Join(src, "locked"), 0o555); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(src, "locked"), 0o755) })
	links := map[string]string{
		"link-to-readme":  "README.md",
		"src/app/up":      "../../bin/run.sh",
		"src/app/self":    ".",
		"dangling":        "does-not-exist",
		"src/dirlink":     "app",
		"escape":          "../outside",          // skipped by Pack
		"abs":             "/etc/passwd",         // skipped by Pack
		"src/app/cleaned": "x/../../app/main.go", // stored cleaned as ../app/main.go
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(src, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(src, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A unix socket path must be short; listen from inside the directory.
	ln, err := net.Listen("unix", filepath.Join(src, "s.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	old := time.Date(2024, 2, 29, 12, 34, 56, 0, time.UTC)
	for _, p := range []string{"README.md", "src/app/main.go", "empty", "src"} {
		if err := os.Chtimes(filepath.Join(src, p), old, old); err != nil {
			t.Fatal(err)
		}
	}
	return src
}

func packToBytes(t *testing.T, dir string, opts PackOptions) ([]byte, PackStats) {
	t.Helper()
	var buf bytes.Buffer
	st, err := Pack(context.Background(), &buf, dir, opts)
	if err != nil {
		t.Fatalf("Pack: %v", err)
	}
	return buf.Bytes(), st
}

func TestRoundTrip(t *testing.T) {
	src := sampleTree(t)
	data, pst := packToBytes(t, src, PackOptions{})
	if pst.BytesOut != int64(len(data)) {
		t.Errorf("BytesOut %d, wrote %d", pst.BytesOut, len(data))
	}
	// Skipped: fifo, socket, escaping link, absolute link.
	if pst.Skipped != 4 {
		t.Errorf("Skipped = %d, want 4 (fifo, socket, 2 unsafe links)", pst.Skipped)
	}
	dst := filepath.Join(t.TempDir(), "restored")
	est, err := Extract(context.Background(), bytes.NewReader(data), dst, ExtractOptions{})
	if err != nil {
		t.Fatalf("Extract: %v", err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(dst, "locked"), 0o755) })
	if est.Files != pst.Files || est.Symlinks != pst.Symlinks || est.Dirs != pst.Dirs || est.Bytes != pst.BytesIn {
		t.Errorf("pack stats %+v, extract stats %+v", pst, est)
	}

	want := treeState(t, src, true)
	for k := range want {
		for _, ex := range DefaultExcludes {
			if k == ex || strings.HasPrefix(k, ex+"/") || strings.Contains(k, "/"+ex) {
				delete(want, k)
			}
		}
	}
	for _, k := range []string{"fifo", "s.sock", "escape", "abs"} {
		delete(want, k)
	}
	want["src/app/cleaned"] = strings.Replace(want["src/app/cleaned"], "x/../../app/main.go", "../app/main.go", 1)
	got := treeState(t, dst, true)
	// Directory mtimes of dirs whose children we removed from src differ legitimately
	// only if the restore did not set them; compare everything.
	if d := diffStates(want, got); d != "" {
		t.Errorf("restored tree differs from the source:\n%s", d)
	}
	for _, gone := range []string{"node_modules", "src/node_modules", ".git", "web/.next", "py/__pycache__", "py/.venv", "dist", "fifo", "s.sock", "escape", "abs"} {
		if _, err := os.Lstat(filepath.Join(dst, gone)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s should be absent from the restore, Lstat: %v", gone, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(dst, "empty")); err != nil || !fi.IsDir() {
		t.Errorf("empty dir not restored: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "README.md")); err != nil || !fi.ModTime().Equal(time.Date(2024, 2, 29, 12, 34, 56, 0, time.UTC)) {
		t.Errorf("mtime not kept: %v %v", fi.ModTime(), err)
	}
}

func TestPackExcludes(t *testing.T) {
	src := sampleTree(t)
	data, _ := packToBytes(t, src, PackOptions{Excludes: []string{"src"}})
	names := listNames(t, data)
	if !names["node_modules/left-pad/index.js"] || !names[".git/HEAD"] {
		t.Errorf("custom Excludes should replace the defaults; names: %v", names)
	}
	for n := range names {
		if n == "src/" || strings.HasPrefix(n, "src/") {
			t.Errorf("excluded %s present", n)
		}
	}
	data, _ = packToBytes(t, src, PackOptions{Excludes: []string{}})
	if names := listNames(t, data); !names["dist"] {
		t.Errorf("empty Excludes should exclude nothing")
	}
}

func listNames(t *testing.T, data []byte) map[string]bool {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	names := map[string]bool{}
	var prev string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[h.Name] = true
		if h.Name < prev && !strings.HasPrefix(prev, strings.TrimSuffix(h.Name, "/")) {
			// Depth-first sorted order: a name may only sort lower than its predecessor
			// when leaving a directory.
			_ = prev
		}
		prev = h.Name
	}
	return names
}

func TestPackDeterministic(t *testing.T) {
	src := sampleTree(t)
	a, _ := packToBytes(t, src, PackOptions{})
	b, _ := packToBytes(t, src, PackOptions{})
	if !bytes.Equal(a, b) {
		t.Errorf("two packs of the same tree differ (%d vs %d bytes)", len(a), len(b))
	}
}

func TestPackCancelled(t *testing.T) {
	src := sampleTree(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Pack(ctx, io.Discard, src, PackOptions{})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Pack with a cancelled context: %v", err)
	}
}

// GNU tar reads what Pack writes, and Extract reads what GNU tar writes.
func TestGNUTarCompat(t *testing.T) {
	if _, err := exec.LookPath("tar"); err != nil {
		t.Fatalf("GNU tar is needed for this test: %v", err)
	}
	src := sampleTree(t)
	data, _ := packToBytes(t, src, PackOptions{})
	tmp := t.TempDir()
	arch := filepath.Join(tmp, "ours.tar.gz")
	if err := os.WriteFile(arch, data, 0o644); err != nil {
		t.Fatal(err)
	}
	byTar := filepath.Join(tmp, "by-tar")
	os.Mkdir(byTar, 0o755)
	if out, err := exec.Command("tar", "xzf", arch, "-C", byTar).CombinedOutput(); err != nil {
		t.Fatalf("tar xzf of Pack output: %v\n%s", err, out)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(byTar, "locked"), 0o755) })
	ours := filepath.Join(tmp, "by-extract")
	if _, err := Extract(context.Background(), bytes.NewReader(data), ours, ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(ours, "locked"), 0o755) })
	if d := diffStates(treeState(t, byTar, true), treeState(t, ours, true)); d != "" {
		t.Errorf("GNU tar and Extract disagree on the same archive:\n%s", d)
	}

	// The other way: GNU tar's archive (with ./ prefixes) through Extract.
	gnu := filepath.Join(tmp, "gnu.tar.gz")
	if out, err := exec.Command("tar", "czf", gnu, "-C", ours, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar czf: %v\n%s", err, out)
	}
	f, err := os.Open(gnu)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	again := filepath.Join(tmp, "again")
	if _, err := Extract(context.Background(), f, again, ExtractOptions{}); err != nil {
		t.Fatalf("Extract of a GNU tar archive: %v", err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(again, "locked"), 0o755) })
	if d := diffStates(treeState(t, ours, true), treeState(t, again, true)); d != "" {
		t.Errorf("GNU tar archive restored differently:\n%s", d)
	}
}

// entry is one member of a crafted archive.
type entry struct {
	name     string
	typ      byte
	link     string
	body     string
	mode     int64
	zeroFill int64 // write this many zero bytes as the body
}

func craft(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, ModTime: time.Unix(1700000000, 0)}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body)) + e.zeroFill
		}
		if e.typ == tar.TypeChar || e.typ == tar.TypeBlock {
			h.Devmajor, h.Devminor = 1, 3
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("craft %q: %v", e.name, err)
		}
		if e.body != "" {
			tw.Write([]byte(e.body))
		}
		for n := e.zeroFill; n > 0; {
			k := min(n, 1<<20)
			tw.Write(make([]byte, k))
			n -= k
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	return buf.Bytes()
}

// The tar-slip corpus: every archive must be refused with an error naming the entry,
// and nothing next to the destination may change.
func TestExtractRefusesEscapes(t *testing.T) {
	reg := func(name, body string) entry { return entry{name: name, typ: tar.TypeReg, body: body} }
	sym := func(name, target string) entry { return entry{name: name, typ: tar.TypeSymlink, link: target} }
	hard := func(name, target string) entry { return entry{name: name, typ: tar.TypeLink, link: target} }
	dir := func(name string) entry { return entry{name: name, typ: tar.TypeDir, mode: 0o755} }

	cases := []struct {
		name    string
		entries func(outside string) []entry
		entry   string // must appear in the error
		limits  ExtractOptions
		wantErr error
	}{
		{"dotdot", func(string) []entry { return []entry{reg("ok.txt", "fine"), reg("../outside/evil1.txt", "x")} }, "../outside/evil1.txt", ExtractOptions{}, ErrUnsafe},
		{"dotdot-inner", func(string) []entry { return []entry{dir("a/"), reg("a/../../outside/evil.txt", "x")} }, "a/../../outside/evil.txt", ExtractOptions{}, ErrUnsafe},
		{"dotdot-harmless-still-refused", func(string) []entry { return []entry{reg("a/../b.txt", "x")} }, "a/../b.txt", ExtractOptions{}, ErrUnsafe},
		{"absolute", func(o string) []entry { return []entry{reg(filepath.Join(o, "evil2.txt"), "x")} }, "evil2.txt", ExtractOptions{}, ErrUnsafe},
		{"symlink-dir-out", func(string) []entry { return []entry{sym("lnk", "../outside"), reg("lnk/evil3.txt", "x")} }, "lnk", ExtractOptions{}, ErrUnsafe},
		{"symlink-absolute", func(o string) []entry { return []entry{sym("abslnk", o), reg("abslnk/evil4.txt", "x")} }, "abslnk", ExtractOptions{}, ErrUnsafe},
		{"symlink-then-file", func(string) []entry {
			return []entry{sym("victim", "../outside/secret.txt"), reg("victim", "overwritten")}
		}, "victim", ExtractOptions{}, ErrUnsafe},
		{"symlink-deep-out", func(string) []entry { return []entry{dir("a/"), dir("a/b/"), sym("a/b/l", "../../../outside")} }, "a/b/l", ExtractOptions{}, ErrUnsafe},
		{"symlink-dotdot-after-name", func(string) []entry {
			// d1/d2/l1 -> ../.. is the root; l2 -> d1/d2/l1/.. would then be the root's parent.
			return []entry{dir("d1/"), dir("d1/d2/"), sym("d1/d2/l1", "../.."), sym("l2", "d1/d2/l1/.."), reg("l2/outside/evil.txt", "x")}
		}, "l2", ExtractOptions{}, ErrUnsafe},
		{"entry-below-symlink", func(string) []entry {
			// s -> . makes s/s/s/l physically at the root, lexically three deep.
			return []entry{sym("s", "."), sym("s/s/s/l", "../../.."), reg("s/s/s/l/outside/evil.txt", "x")}
		}, "s/s/s/l", ExtractOptions{}, ErrUnsafe},
		{"hardlink-out", func(string) []entry { return []entry{hard("hl", "../outside/secret.txt"), reg("hl", "overwritten")} }, "hl", ExtractOptions{}, ErrUnsafe},
		{"hardlink-absolute", func(o string) []entry { return []entry{hard("hl", filepath.Join(o, "secret.txt"))} }, "hl", ExtractOptions{}, ErrUnsafe},
		{"hardlink-not-yet-extracted", func(string) []entry { return []entry{hard("hl", "later.txt"), reg("later.txt", "x")} }, "hl", ExtractOptions{}, ErrUnsafe},
		{"hardlink-to-symlink", func(string) []entry {
			return []entry{sym("in", "a.txt"), reg("a.txt", "x"), hard("hl", "in")}
		}, "hl", ExtractOptions{}, ErrUnsafe},
		{"char-device", func(string) []entry { return []entry{{name: "null", typ: tar.TypeChar}} }, "null", ExtractOptions{}, ErrUnsafe},
		{"block-device", func(string) []entry { return []entry{{name: "sda", typ: tar.TypeBlock}} }, "sda", ExtractOptions{}, ErrUnsafe},
		{"fifo", func(string) []entry { return []entry{{name: "pipe", typ: tar.TypeFifo}} }, "pipe", ExtractOptions{}, ErrUnsafe},
		{"long-name", func(string) []entry { return []entry{reg(strings.Repeat("n", 300)+"/f", "x")} }, "nnnn", ExtractOptions{MaxNameLen: 255}, ErrUnsafe},
		{"dir-replaced-by-symlink", func(string) []entry { return []entry{dir("d/"), sym("d", "x")} }, "d", ExtractOptions{}, ErrUnsafe},
		{"dir-replaced-by-file", func(string) []entry { return []entry{dir("d/"), reg("d/f", "x"), reg("d", "x")} }, "d", ExtractOptions{}, ErrUnsafe},
		{"too-many-entries", func(string) []entry {
			var es []entry
			for i := range 20 {
				es = append(es, reg(fmt.Sprintf("f%02d", i), "x"))
			}
			return es
		}, "f10", ExtractOptions{MaxEntries: 10}, ErrTooLarge},
		{"gzip-bomb", func(string) []entry {
			// 64 MiB of zeros compress to ~64 KiB; the bound is 8 MiB.
			return []entry{reg("small", "x"), {name: "bomb", typ: tar.TypeReg, zeroFill: 64 << 20}}
		}, "bomb", ExtractOptions{MaxBytes: 8 << 20}, ErrTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			outside := filepath.Join(base, "outside")
			write(t, filepath.Join(outside, "secret.txt"), "secret", 0o644)
			dest := filepath.Join(base, "dest")
			before := treeState(t, base, true)

			data := craft(t, tc.entries(outside)...)
			_, err := Extract(context.Background(), bytes.NewReader(data), dest, tc.limits)
			if err == nil {
				t.Fatalf("crafted archive was extracted without error")
			}
			t.Logf("refused: %v", err)
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("error %v, want %v", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.entry) {
				t.Errorf("error %q does not name the entry %q", err, tc.entry)
			}
			after := treeState(t, base, true)
			for k := range after {
				if k == "dest" || strings.HasPrefix(k, "dest/") {
					delete(after, k)
				}
			}
			delete(before, ".")
			delete(after, ".")
			if d := diffStates(before, after); d != "" {
				t.Errorf("something outside dest changed:\n%s", d)
			}
			// Nothing inside dest points out of it either.
			filepath.WalkDir(dest, func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.Type()&fs.ModeSymlink != 0 {
					target, _ := os.Readlink(p)
					resolved, rerr := filepath.EvalSymlinks(p)
					if rerr == nil && !strings.HasPrefix(resolved, dest) {
						t.Errorf("escaping link left in dest: %s -> %s", p, target)
					}
				}
				return nil
			})
		})
	}
}

func TestExtractAcceptsInnerLinks(t *testing.T) {
	data := craft(t,
		entry{name: "a/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "a/b/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "a/b/file.txt", typ: tar.TypeReg, body: "content"},
		entry{name: "a/b/up", typ: tar.TypeSymlink, link: "../../a/b/file.txt"},
		entry{name: "top", typ: tar.TypeSymlink, link: "a/b"},
		entry{name: "a/b/root", typ: tar.TypeSymlink, link: "../.."},
		entry{name: "hl", typ: tar.TypeLink, link: "a/b/file.txt"},
		entry{name: "dup.txt", typ: tar.TypeReg, body: "first"},
		entry{name: "dup.txt", typ: tar.TypeReg, body: "second"},
	)
	dst := filepath.Join(t.TempDir(), "d")
	st, err := Extract(context.Background(), bytes.NewReader(data), dst, ExtractOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Hardlinks != 1 || st.Symlinks != 3 {
		t.Errorf("stats %+v", st)
	}
	for p, want := range map[string]string{"a/b/up": "content", "top/file.txt": "content", "hl": "content", "a/b/root/top/file.txt": "content", "dup.txt": "second"} {
		b, err := os.ReadFile(filepath.Join(dst, p))
		if err != nil || string(b) != want {
			t.Errorf("%s: %q, %v", p, b, err)
		}
	}
	a, _ := os.Stat(filepath.Join(dst, "hl"))
	b, _ := os.Stat(filepath.Join(dst, "a/b/file.txt"))
	if !os.SameFile(a, b) {
		t.Errorf("hl is not a hard link of a/b/file.txt")
	}
}

func TestExtractNoSetuid(t *testing.T) {
	data := craft(t, entry{name: "suid", typ: tar.TypeReg, body: "x", mode: 0o4755})
	dst := filepath.Join(t.TempDir(), "d")
	if _, err := Extract(context.Background(), bytes.NewReader(data), dst, ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dst, "suid"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&fs.ModeSetuid != 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("mode %v, want -rwxr-xr-x", fi.Mode())
	}
}

func TestExtractCorruptGzip(t *testing.T) {
	src := sampleTree(t)
	data, _ := packToBytes(t, src, PackOptions{})
	data[len(data)-6] ^= 0xff // inside the CRC32 trailer
	_, err := Extract(context.Background(), bytes.NewReader(data), filepath.Join(t.TempDir(), "d"), ExtractOptions{})
	if err == nil {
		t.Fatal("a corrupt gzip stream was accepted")
	}
}

func TestExtractRefusesNonEmpty(t *testing.T) {
	src := sampleTree(t)
	data, _ := packToBytes(t, src, PackOptions{})
	dst := t.TempDir()
	write(t, filepath.Join(dst, "keep.txt"), "mine", 0o644)
	_, err := Extract(context.Background(), bytes.NewReader(data), dst, ExtractOptions{})
	if !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("Extract into a non-empty dir: %v, want ErrNotEmpty", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "keep.txt")); string(b) != "mine" {
		t.Errorf("existing file changed")
	}
	if ents, _ := os.ReadDir(dst); len(ents) != 1 {
		t.Errorf("Extract wrote into a non-empty dir: %v", ents)
	}
}

func TestExtractReplace(t *testing.T) {
	src := sampleTree(t)
	data, _ := packToBytes(t, src, PackOptions{})
	parent := t.TempDir()
	dst := filepath.Join(parent, "ws")
	write(t, filepath.Join(dst, "old.txt"), "previous work", 0o644)

	// A bad archive leaves dst exactly as it was and no temp dirs behind.
	bad := craft(t, entry{name: "ok.txt", typ: tar.TypeReg, body: "x"}, entry{name: "../evil", typ: tar.TypeReg, body: "x"})
	if _, err := ExtractReplace(context.Background(), bytes.NewReader(bad), dst, ExtractOptions{}); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("ExtractReplace of a bad archive: %v", err)
	}
	if ents, _ := os.ReadDir(parent); len(ents) != 1 {
		t.Errorf("leftovers next to dst: %v", ents)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "old.txt")); string(b) != "previous work" {
		t.Errorf("dst changed by a failed replace")
	}

	st, err := ExtractReplace(context.Background(), bytes.NewReader(data), dst, ExtractOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(dst, "locked"), 0o755) })
	if st.Backup == "" {
		t.Fatal("no backup reported for a non-empty destination")
	}
	if b, _ := os.ReadFile(filepath.Join(st.Backup, "old.txt")); string(b) != "previous work" {
		t.Errorf("previous work not in the backup %s", st.Backup)
	}
	if _, err := os.Stat(filepath.Join(dst, "old.txt")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("old file still in the restored tree")
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "README.md")); string(b) != "# hello\n" {
		t.Errorf("restored tree incomplete")
	}

	// An empty destination is simply replaced.
	empty := filepath.Join(parent, "empty")
	os.Mkdir(empty, 0o755)
	st, err = ExtractReplace(context.Background(), bytes.NewReader(data), empty, ExtractOptions{})
	if err != nil || st.Backup != "" {
		t.Fatalf("replace of an empty dir: backup %q, %v", st.Backup, err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(empty, "locked"), 0o755) })
}
