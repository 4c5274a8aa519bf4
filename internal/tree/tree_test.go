//go:build !windows

package tree

import (
	"context"
	"crypto/sha256"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestWalkSkipsWhatCannotBeStored(t *testing.T) {
	root := t.TempDir()
	ws := filepath.Join(root, "ws")
	os.MkdirAll(filepath.Join(ws, "d", "node_modules"), 0o755)
	os.WriteFile(filepath.Join(root, "secret"), []byte("host secret"), 0o600)
	os.WriteFile(filepath.Join(ws, "d", "f.txt"), []byte("hi"), 0o640)
	os.Symlink("../secret", filepath.Join(ws, "out"))   // leads out
	os.Symlink("/etc/passwd", filepath.Join(ws, "abs")) // absolute
	os.Symlink("d/f.txt", filepath.Join(ws, "in"))      // fine
	syscall.Mkfifo(filepath.Join(ws, "fifo"), 0o600)    // special
	os.WriteFile(filepath.Join(ws, "d", "node_modules", "x"), []byte("x"), 0o644)
	got := map[string]Entry{}
	st, err := Walk(context.Background(), ws, WalkOptions{}, func(e Entry, open Opener) error {
		got[e.Path] = e
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"d", "d/f.txt", "in"} {
		if _, ok := got[p]; !ok {
			t.Errorf("%s missing", p)
		}
	}
	for _, p := range []string{"out", "abs", "fifo", "d/node_modules", "d/node_modules/x"} {
		if _, ok := got[p]; ok {
			t.Errorf("%s walked", p)
		}
	}
	if st.Skipped != 3 || got["in"].Target != "d/f.txt" || got["d/f.txt"].Mode != 0o640 {
		t.Errorf("stats %+v, in %+v", st, got["in"])
	}
}

// A file swapped for a link between the walk and the read is refused, never followed.
func TestReaderNeverFollowsALink(t *testing.T) {
	root := t.TempDir()
	ws := filepath.Join(root, "ws")
	os.MkdirAll(filepath.Join(ws, "d"), 0o755)
	os.WriteFile(filepath.Join(root, "secret"), []byte("host secret"), 0o600)
	os.Symlink("../../secret", filepath.Join(ws, "d", "f"))
	os.Symlink("..", filepath.Join(ws, "up"))
	r, err := NewReader(ws)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, p := range []string{"d/f", "up/secret"} {
		if f, _, err := r.Open(p); err == nil || !errors.Is(err, ErrChanged) {
			if f != nil {
				f.Close()
			}
			t.Errorf("open %s through a link: %v", p, err)
		}
	}
	if _, _, err := r.Open("../secret"); !errors.Is(err, ErrUnsafe) {
		t.Errorf("open ../secret: %v", err)
	}
}

func TestWriterRefusesEscapes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []Entry
		want    error
	}{
		{"dotdot", []Entry{{Path: "../x", Type: File}}, ErrUnsafe},
		{"absolute", []Entry{{Path: "/tmp/x", Type: File}}, ErrUnsafe},
		{"unclean", []Entry{{Path: "a//b", Type: File}}, ErrUnsafe},
		{"nul", []Entry{{Path: "a\x00b", Type: File}}, ErrUnsafe},
		{"link out", []Entry{{Path: "l", Type: Symlink, Target: "../out"}}, ErrUnsafe},
		{"absolute link", []Entry{{Path: "l", Type: Symlink, Target: "/etc"}}, ErrUnsafe},
		{"dotdot after a name", []Entry{{Path: "l", Type: Symlink, Target: "a/../../x"}}, ErrUnsafe},
		{"file below a link", []Entry{{Path: "d", Type: Dir, Mode: 0o755}, {Path: "l", Type: Symlink, Target: "d"}, {Path: "l/x", Type: File}}, ErrUnsafe},
		{"file below a file", []Entry{{Path: "f", Type: File}, {Path: "f/x", Type: File}}, ErrUnsafe},
		{"duplicate", []Entry{{Path: "f", Type: File}, {Path: "f", Type: File}}, ErrUnsafe},
		{"setuid", []Entry{{Path: "f", Type: File, Mode: fs.ModeSetuid | 0o755}}, ErrUnsafe},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dst := filepath.Join(root, "dst")
			w, err := NewWriter(context.Background(), dst, WriterOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var werr error
			for _, e := range tc.entries {
				switch e.Type {
				case Dir:
					werr = w.Dir(e)
				case Symlink:
					werr = w.Symlink(e)
				default:
					werr = w.File(e, nil, nil)
				}
				if werr != nil {
					break
				}
			}
			if _, cerr := w.Close(); werr == nil {
				werr = cerr
			}
			if !errors.Is(werr, tc.want) {
				t.Errorf("got %v, want %v", werr, tc.want)
			}
			ents, _ := os.ReadDir(root)
			if len(ents) != 1 {
				t.Errorf("something was written beside the destination: %v", ents)
			}
		})
	}
}

func TestWriterRoundTripAndDigests(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "dst")
	w, err := NewWriter(context.Background(), dst, WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	good := []byte("hello\n")
	sum := sha256.Sum256(good)
	w.Dir(Entry{Path: "a", Type: Dir, Mode: 0o750, MTime: 1e18})
	w.File(Entry{Path: "a/f", Type: File, Mode: 0o600, Size: int64(len(good)), MTime: 1e18 + 5}, good, &sum)
	w.Symlink(Entry{Path: "a/l", Type: Symlink, Target: "f"})
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dst, "a", "f"))
	if err != nil || fi.Mode().Perm() != 0o600 || fi.ModTime().UnixNano() != 1e18+5 {
		t.Errorf("a/f: %v %v", fi, err)
	}
	if fi, _ := os.Stat(filepath.Join(dst, "a")); fi.Mode().Perm() != 0o750 || fi.ModTime().UnixNano() != 1e18 {
		t.Errorf("a: %v %v", fi.Mode(), fi.ModTime())
	}
	if l, _ := os.Readlink(filepath.Join(dst, "a", "l")); l != "f" {
		t.Errorf("link %q", l)
	}
	// What was written is checked against its digest.
	w, err = NewWriter(context.Background(), filepath.Join(t.TempDir(), "d2"), WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.File(Entry{Path: "b/implicit", Type: File, Mode: 0o644, Size: 3}, []byte("bad"), &sum)
	_, err = w.Close()
	var dm *DigestMismatch
	if !errors.As(err, &dm) || len(dm.Paths) != 1 || dm.Paths[0] != "b/implicit" {
		t.Fatalf("close: %v", err)
	}
	// A destination that holds files is refused.
	if _, err := NewWriter(context.Background(), dst, WriterOptions{}); !errors.Is(err, ErrNotEmpty) {
		t.Errorf("non-empty destination: %v", err)
	}
	_ = strings.Contains
}
