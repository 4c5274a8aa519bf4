//go:build windows

package archive

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func tarGz(t *testing.T, hdrs ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

// Names Windows would read as another file are refused before anything is created.
func TestExtractRefusesWindowsNames(t *testing.T) {
	for _, name := range []string{"a:b", "f.txt:stream", "CON", "nul.txt", "d/AUX", "x.", "x ", `a\..\..\x`, "C:x", "COM1"} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			dst := filepath.Join(root, "dst")
			data := tarGz(t, &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
			_, err := Extract(context.Background(), bytes.NewReader(data), dst, ExtractOptions{})
			if !errors.Is(err, ErrUnsafe) {
				t.Errorf("%q: got %v, want ErrUnsafe", name, err)
			}
			ents, _ := os.ReadDir(dst)
			if len(ents) != 0 {
				t.Errorf("%q: written: %v", name, ents)
			}
			if ents, _ := os.ReadDir(root); len(ents) > 1 {
				t.Errorf("%q: written beside the destination: %v", name, ents)
			}
		})
	}
}

// A link target Windows would read as a drive, a stream or a device is refused too.
func TestExtractRefusesWindowsLinkTargets(t *testing.T) {
	for _, target := range []string{"C:/Windows", `..\..\x`, "NUL", "f:stream"} {
		data := tarGz(t, &tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: target})
		_, err := Extract(context.Background(), bytes.NewReader(data), filepath.Join(t.TempDir(), "dst"), ExtractOptions{})
		if !errors.Is(err, ErrUnsafe) {
			t.Errorf("target %q: got %v, want ErrUnsafe", target, err)
		}
	}
}

// Pack and Extract round trip a tree on Windows.
func TestWindowsRoundTrip(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "a", "b"), 0o755)
	os.WriteFile(filepath.Join(src, "a", "b", "f.txt"), []byte("hello"), 0o644)
	var buf bytes.Buffer
	if _, err := Pack(context.Background(), &buf, src, PackOptions{}); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "dst")
	if _, err := Extract(context.Background(), &buf, dst, ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "a", "b", "f.txt")); string(b) != "hello" {
		t.Errorf("got %q, %v", b, err)
	}
}
