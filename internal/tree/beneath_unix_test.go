//go:build !windows

package tree

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// OpenBeneath never goes through a link at any part, names the part that is one, makes
// missing parts only below real directories; in one openat2 and part by part alike.
func TestOpenBeneathRefusesLinks(t *testing.T) {
	for _, openat2 := range []bool{true, false} {
		t.Run(map[bool]string{true: "openat2", false: "part-by-part"}[openat2], func(t *testing.T) {
			useOpenat2 = openat2
			defer func() { useOpenat2 = true }()
			base := t.TempDir()
			root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
			for _, d := range []string{filepath.Join(root, "a", "b"), outside} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for link, target := range map[string]string{"l": "a", "a/m": "b", "out": outside} {
				if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
					t.Fatal(err)
				}
			}
			d, err := os.Open(root)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			for _, ok := range []string{"", "a", "a/b"} {
				f, err := OpenBeneath(d, ok, false)
				if err != nil {
					t.Errorf("OpenBeneath(%q): %v", ok, err)
					continue
				}
				f.Close()
			}
			for rel, part := range map[string]string{"l": "l", "l/b": "l", "a/m": "a/m", "a/m/x/y": "a/m", "out/new": "out"} {
				for _, create := range []bool{false, true} {
					_, err := OpenBeneath(d, rel, create)
					var le *LinkError
					if !errors.As(err, &le) || !errors.Is(err, ErrLink) || le.Path != part {
						t.Errorf("OpenBeneath(%q, create %v): %v, want a link at %q", rel, create, err, part)
					}
				}
			}
			f, err := OpenBeneath(d, "a/new/deeper", true)
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			f.Close()
			if fi, err := os.Lstat(filepath.Join(root, "a", "new", "deeper")); err != nil || !fi.IsDir() {
				t.Errorf("a/new/deeper not made: %v", err)
			}
			if names, _ := os.ReadDir(outside); len(names) != 0 || fileExists(filepath.Join(root, "a", "b", "x")) {
				t.Errorf("something was made through a link: %v", names)
			}
		})
	}
}

// OpenBeneath never leaves the directory it starts from by a ".." part, whichever way it
// opens: openat2 refuses one that climbs out, and the part-by-part walk, where openat2
// failed or is not there, must refuse it too rather than open the parent.
func TestOpenBeneathRefusesDotDot(t *testing.T) {
	for _, openat2 := range []bool{true, false} {
		t.Run(map[bool]string{true: "openat2", false: "part-by-part"}[openat2], func(t *testing.T) {
			useOpenat2 = openat2
			defer func() { useOpenat2 = true }()
			base := t.TempDir()
			root := filepath.Join(base, "root")
			if err := os.MkdirAll(filepath.Join(root, "a"), 0o755); err != nil {
				t.Fatal(err)
			}
			d, err := os.Open(root)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			for _, rel := range []string{"..", "../root", "a/../..", "a/../../made", "/etc", "a//b", "./a"} {
				for _, create := range []bool{false, true} {
					f, err := OpenBeneath(d, rel, create)
					if err == nil {
						f.Close()
						t.Errorf("OpenBeneath(%q, create %v) opened it", rel, create)
					} else if !errors.Is(err, ErrUnsafe) {
						t.Errorf("OpenBeneath(%q, create %v): %v, want ErrUnsafe", rel, create, err)
					}
				}
			}
			for _, name := range []string{"..", ".", "", "a/b", "../x"} {
				if f, _, err := OpenAt(d, name); !errors.Is(err, ErrUnsafe) {
					if f != nil {
						f.Close()
					}
					t.Errorf("OpenAt(%q): %v, want ErrUnsafe", name, err)
				}
				if f, err := OpenDirAt(d, name, true); !errors.Is(err, ErrUnsafe) {
					if f != nil {
						f.Close()
					}
					t.Errorf("OpenDirAt(%q): %v, want ErrUnsafe", name, err)
				}
				if err := ReplaceAt(d, name, 0o644, strings.NewReader("x")); !errors.Is(err, ErrUnsafe) {
					t.Errorf("ReplaceAt(%q): %v, want ErrUnsafe", name, err)
				}
			}
			if fileExists(filepath.Join(base, "made")) || fileExists(filepath.Join(base, "x")) {
				t.Error("a directory was made beside the root")
			}
		})
	}
}

func fileExists(p string) bool { _, err := os.Lstat(p); return err == nil }

// ReplaceAt replaces a link at the name with the file, never writing through it.
func TestReplaceAtReplacesALinkNotItsTarget(t *testing.T) {
	base := t.TempDir()
	secret := filepath.Join(base, "secret")
	if err := os.WriteFile(secret, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(base, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(ws, "f")); err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(ws)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := ReplaceAt(d, "f", 0o644, strings.NewReader("new")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "host" {
		t.Errorf("the link's target was written: %q", b)
	}
	fi, err := os.Lstat(filepath.Join(ws, "f"))
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
		t.Errorf("f is %v (%v), want a regular file 0644", fi.Mode(), err)
	}
	if _, _, err := OpenAt(d, "f"); err != nil {
		t.Errorf("OpenAt of the new file: %v", err)
	}
	if err := os.Symlink(secret, filepath.Join(ws, "g")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := OpenAt(d, "g"); !errors.Is(err, ErrLink) {
		t.Errorf("OpenAt of a link: %v, want ErrLink", err)
	}
}
