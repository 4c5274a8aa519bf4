//go:build windows

package tree

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/toolhost/toolhost/internal/testenv"
)

// What Windows would read as another name (a stream, a device, a separator, a dropped
// trailing dot) is refused before anything is created, and nothing lands beside the
// destination.
func TestWriterRefusesWindowsNames(t *testing.T) {
	for _, p := range []string{"a:b", "f.txt:hidden", "CON", "aux.c", "d/NUL", "x.", "x ", `a\b`, "COM1.log"} {
		t.Run(p, func(t *testing.T) {
			root := t.TempDir()
			w, err := NewWriter(context.Background(), filepath.Join(root, "dst"), WriterOptions{})
			if err != nil {
				t.Fatal(err)
			}
			werr := w.File(Entry{Path: p, Type: File, Mode: 0o644, Size: 1}, []byte("x"), nil)
			if _, cerr := w.Close(); werr == nil {
				werr = cerr
			}
			if !errors.Is(werr, ErrUnsafe) {
				t.Errorf("%q: got %v, want ErrUnsafe", p, werr)
			}
			ents, _ := os.ReadDir(filepath.Join(root, "dst"))
			if len(ents) != 0 {
				t.Errorf("%q: written: %v", p, ents)
			}
		})
	}
}

// A round trip through Walk and the Writer keeps files, directories and times.
func TestWindowsRoundTrip(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "d", "e"), 0o755)
	os.WriteFile(filepath.Join(src, "d", "e", "f.txt"), []byte("hello"), 0o644)
	dst := filepath.Join(t.TempDir(), "dst")
	w, err := NewWriter(context.Background(), dst, WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Walk(context.Background(), src, WalkOptions{}, func(e Entry, open Opener) error {
		switch e.Type {
		case Dir:
			return w.Dir(e)
		case File:
			f, fe, err := open()
			if err != nil {
				return err
			}
			defer f.Close()
			return w.FileFrom(fe, f, nil)
		}
		return nil
	})
	if _, cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "d", "e", "f.txt")); string(b) != "hello" {
		t.Errorf("got %q, %v", b, err)
	}
}

// A directory link (a symbolic link or a junction) is never walked into or read through.
func TestWindowsReaderRefusesLinks(t *testing.T) {
	root := t.TempDir()
	ws := filepath.Join(root, "ws")
	os.MkdirAll(filepath.Join(root, "outside"), 0o755)
	os.WriteFile(filepath.Join(root, "outside", "secret"), []byte("s"), 0o600)
	os.MkdirAll(ws, 0o755)
	if err := os.Symlink(filepath.Join(root, "outside"), filepath.Join(ws, "l")); err != nil {
		testenv.Skipf(t, "creating symbolic links needs Developer Mode or the Create symbolic links privilege: %v", err)
	}
	r, err := NewReader(ws)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if f, _, err := r.Open("l/secret"); err == nil {
		f.Close()
		t.Fatal("read through a link")
	}
	st, err := Walk(context.Background(), ws, WalkOptions{}, func(e Entry, _ Opener) error {
		if e.Path != "l" {
			t.Errorf("walked %s", e.Path)
		}
		return nil
	})
	if err != nil || st.Skipped != 1 {
		t.Errorf("walk: %+v %v", st, err)
	}
}
