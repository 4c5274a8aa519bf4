// Package winname says whether a name can be created on Windows as exactly the file it
// names. Windows reads more into a name than Linux does: a backslash is a separator, a
// colon starts a drive letter or an alternate data stream ("a:b" is a hidden stream of
// file a), trailing dots and spaces are dropped (so "x." is "x"), and CON, NUL, COM1 and
// the other DOS device names are devices in every directory. A name from a sandbox or a
// snapshot that means any of these is refused before it reaches the disk.
//
// The checks are pure functions, so the tests that prove them run on every platform; the
// Windows code of internal/tree and internal/archive calls them on every entry.
package winname

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf16"
)

// ErrName: a name cannot be created on Windows as the name it is (the message says why).
var ErrName = errors.New("not a valid file name on Windows")

// MaxComponent is the longest component NTFS takes, in UTF-16 code units.
const MaxComponent = 255

// reserved are the DOS device names, reserved in every directory with any extension
// ("CON.txt" is the console on Windows 10; Windows 11 frees it, but a name must mean the
// same file on both).
var reserved = map[string]bool{
	"CON": true, "PRN": true, "AUX": true, "NUL": true, "CONIN$": true, "CONOUT$": true,
	"CLOCK$": true,
}

// Component reports why c, one component of a path (no separator), cannot be created on
// Windows, or nil. "." and ".." are refused: they are not names of entries.
func Component(c string) error {
	if c == "" || c == "." || c == ".." {
		return fmt.Errorf("%q: empty or a dot name: %w", c, ErrName)
	}
	for _, r := range c {
		switch {
		case r < 0x20:
			return fmt.Errorf("%q: a control character: %w", c, ErrName)
		case r == '\\':
			return fmt.Errorf("%q: a backslash, which Windows reads as a separator: %w", c, ErrName)
		case r == '/':
			return fmt.Errorf("%q: a slash, which is a separator: %w", c, ErrName)
		case r == ':':
			return fmt.Errorf("%q: a colon, which Windows reads as a drive letter or an alternate data stream: %w", c, ErrName)
		case strings.ContainsRune(`<>"|?*`, r):
			return fmt.Errorf("%q: the character %q, which Windows does not allow in names: %w", c, r, ErrName)
		}
	}
	if last := c[len(c)-1]; last == '.' || last == ' ' {
		return fmt.Errorf("%q: a trailing dot or space, which Windows drops (it would name another file): %w", c, ErrName)
	}
	if isReserved(c) {
		return fmt.Errorf("%q: a device name reserved by Windows (CON, PRN, AUX, NUL, COM1-9, LPT1-9): %w", c, ErrName)
	}
	if n := len(utf16.Encode([]rune(c))); n > MaxComponent {
		return fmt.Errorf("%.32q...: %d UTF-16 units, more than the %d Windows takes: %w", c, n, MaxComponent, ErrName)
	}
	return nil
}

// isReserved reports whether c is a DOS device name, with or without an extension, in
// any case, with trailing spaces before the extension ("nul .txt"), and with the
// superscript digits Windows counts as digits (COM¹).
func isReserved(c string) bool {
	base, _, _ := strings.Cut(c, ".")
	base = strings.ToUpper(strings.TrimRight(base, " "))
	if reserved[base] {
		return true
	}
	if len(base) < 4 || (base[:3] != "COM" && base[:3] != "LPT") {
		return false
	}
	switch base[3:] {
	case "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "¹", "²", "³":
		return true
	}
	return false
}

// Path reports why the slash-separated relative path p cannot be created on Windows, or
// nil: every component must pass Component. A drive letter ("C:/x"), a UNC or rooted
// name ("//host/share", "/x") and any backslash are refused.
func Path(p string) error {
	if p == "" {
		return fmt.Errorf("%q: an empty path: %w", p, ErrName)
	}
	if strings.HasPrefix(p, "/") {
		return fmt.Errorf("%q: a rooted path: %w", p, ErrName)
	}
	for c := range strings.SplitSeq(p, "/") {
		if err := Component(c); err != nil {
			return fmt.Errorf("path %q: %w", p, err)
		}
	}
	return nil
}

// Target reports why the slash-separated link target t cannot be written as a link's
// target on Windows, or nil: leading ".." components are allowed (whether the target
// stays inside the tree is the caller's rule), "." components are ignored, every other
// component must pass Component.
func Target(t string) error {
	if t == "" || strings.HasPrefix(t, "/") {
		return fmt.Errorf("link target %q: empty or rooted: %w", t, ErrName)
	}
	for c := range strings.SplitSeq(t, "/") {
		if c == "." || c == ".." {
			continue
		}
		if err := Component(c); err != nil {
			return fmt.Errorf("link target %q: %w", t, err)
		}
	}
	return nil
}
