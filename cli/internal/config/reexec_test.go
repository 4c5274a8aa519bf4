package config

import (
	"os"
	"testing"

	"github.com/toolhost/toolhost/internal/reexec"
)

// TestMain starts with reexec.Main: the local sandbox's agent and the browser sandbox's
// wrapper are this test binary, re-executed.
func TestMain(m *testing.M) {
	reexec.Main()
	os.Exit(m.Run())
}
