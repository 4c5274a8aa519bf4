package owner

import (
	"os"
	"testing"
)

// What this process makes is its own.
func TestOwnDirectory(t *testing.T) {
	dir := t.TempDir()
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if who, other := Other(dir, fi); other {
		t.Errorf("a directory this process made is reported as %s's", who)
	}
}
