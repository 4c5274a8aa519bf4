// Package testenv is how a test says it needs a capability of the machine: bubblewrap,
// the browser, cgroups, root. Without it the test skips, saying which capability and how
// to get it; on CI (CI=true) it fails instead, so CI never hides a missing capability.
package testenv

import (
	"fmt"
	"os"
	"testing"
)

// CI reports whether the tests run on CI, where a missing capability is a failure.
func CI() bool { return os.Getenv("CI") == "true" }

// Skipf skips t with the reason, or fails it on CI. The reason names the capability that
// is missing and how to install it.
func Skipf(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if CI() {
		t.Fatalf("CI=true, and a capability this test needs is missing: %s", msg)
	}
	t.Skip(msg)
}

// Require skips t (fails it on CI) when err, the result of checking a capability, is not
// nil.
func Require(t testing.TB, capability string, err error) {
	t.Helper()
	if err != nil {
		Skipf(t, "%s: %v", capability, err)
	}
}

// BwrapPath is bubblewrap, which the local sandbox provider runs.
const BwrapPath = "/usr/bin/bwrap"

// NeedBwrap skips t (fails it on CI) when bubblewrap is not installed.
func NeedBwrap(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(BwrapPath); err != nil {
		Skipf(t, "bubblewrap is not installed at %s (make test installs it; Debian package bubblewrap): %v", BwrapPath, err)
	}
}
