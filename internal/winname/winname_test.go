package winname

import (
	"errors"
	"strings"
	"testing"
)

// These run on every platform: the Windows code of tree and archive refuses exactly what
// these functions refuse.
func TestComponent(t *testing.T) {
	good := []string{"a", "main.go", "CONFIG", "console.log", "COM", "COM10", "LPT", "nul_file",
		"con-tents", ".git", ".env", "a b", "ünïcödé", "x.tar.gz", strings.Repeat("x", MaxComponent),
		strings.Repeat("é", MaxComponent), "..a", "a..b"}
	for _, c := range good {
		if err := Component(c); err != nil {
			t.Errorf("Component(%q) = %v, want nil", c, err)
		}
	}
	bad := []string{"", ".", "..", `a\b`, `..\..\x`, "C:", "c:x", "a:b", "file.txt:stream",
		"file.txt::$DATA", "a/b", "x.", "x ", "...", ". .", "CON", "con", "Con.txt", "nul",
		"NUL.tar.gz", "aux", "prn", "COM1", "com9.log", "LPT1", "lpt3.txt", "COM0", "COM¹",
		"LPT³.x", "nul .txt", "CON ", "CONIN$", "conout$", "clock$", "a<b", "a>b", `a"b`, "a|b",
		"a?b", "a*b", "tab\there", "nl\nx", "nul\x00", strings.Repeat("x", MaxComponent+1),
		strings.Repeat("😀", MaxComponent/2+1)}
	for _, c := range bad {
		err := Component(c)
		if !errors.Is(err, ErrName) {
			t.Errorf("Component(%q) = %v, want ErrName", c, err)
		}
	}
}

func TestPath(t *testing.T) {
	for _, p := range []string{"a", "a/b/c.txt", "src/con-fig/x.go", ".github/workflows/ci.yml"} {
		if err := Path(p); err != nil {
			t.Errorf("Path(%q) = %v", p, err)
		}
	}
	for _, p := range []string{"", "/etc/passwd", "//host/share/x", "C:/Windows/x", "c:x", `a\..\..\x`,
		"a/../b", "a/./b", "a//b", "a/", "src/CON/x", "src/aux.c", "docs/notes.txt:hidden", "dir./x",
		"dir /x", "a/b/LPT2"} {
		if err := Path(p); !errors.Is(err, ErrName) {
			t.Errorf("Path(%q) = %v, want ErrName", p, err)
		}
	}
}

func TestTarget(t *testing.T) {
	for _, p := range []string{"a", "../a", "../../x/y", "./a", "b/c"} {
		if err := Target(p); err != nil {
			t.Errorf("Target(%q) = %v", p, err)
		}
	}
	for _, p := range []string{"", "/x", `..\..\Windows`, "C:/x", "c:", "../NUL", "a/b:c", "x."} {
		if err := Target(p); !errors.Is(err, ErrName) {
			t.Errorf("Target(%q) = %v, want ErrName", p, err)
		}
	}
}

// The message names the rule broken, for a model to act on.
func TestMessages(t *testing.T) {
	for c, want := range map[string]string{`a\b`: "backslash", "a:b": "alternate data stream",
		"CON.txt": "reserved", "x.": "trailing dot"} {
		if err := Component(c); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Component(%q) = %v, want a message with %q", c, err, want)
		}
	}
}
