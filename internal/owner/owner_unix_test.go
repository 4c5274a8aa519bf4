//go:build !windows

package owner

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A directory of another user is reported as theirs: as root, one chowned to nobody; as
// anyone else, the root directory (root's).
func TestOtherUsersDirectory(t *testing.T) {
	dir := "/"
	if os.Geteuid() == 0 {
		dir = filepath.Join(t.TempDir(), "theirs")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	who, other := Other(dir, fi)
	if !other || !strings.HasPrefix(who, "uid ") {
		t.Errorf("Other(%s) = %q, %v; want another uid", dir, who, other)
	}
}
