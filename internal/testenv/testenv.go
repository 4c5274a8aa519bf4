// Package testenv is how a test says it needs a capability of the machine: bubblewrap,
// the browser, cgroups, root. Without it the test skips, saying which capability and how
// to get it; on CI (CI=true) it fails instead, so CI never hides a missing capability.
package testenv

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/abi"
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

// HangBound is how long a test waits for something before it calls it broken: a liveness
// bound, far above what a working system takes even on a loaded machine, never a
// performance assertion (a test that must be fast is a benchmark).
const HangBound = 2 * time.Minute

// Eventually polls cond until it holds, and reports whether it did before HangBound. The
// polls start 10 ms apart and back off to 250 ms, so a quick condition costs little and a
// slow one does not spin.
func Eventually(cond func() bool) bool {
	deadline := time.Now().Add(HangBound)
	wait := 10 * time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(wait)
		wait = min(wait*2, 250*time.Millisecond)
	}
	return true
}

// WaitFor is Eventually that fails t, saying what it waited for, when cond never held.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !Eventually(cond) {
		t.Fatalf("gave up after %s waiting for %s", HangBound, what)
	}
}

// ResultText is a tool result's text blocks joined, images left out: what a model reads of
// it, and what tests look into.
func ResultText(r abi.Result) string {
	var b strings.Builder
	for _, c := range r.Content {
		if c.Type == abi.ContentText || c.Type == "" {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// RunDir is a directory for a test's sandboxes (sandbox.run_dir), removed when t ends.
// Their agents' unix sockets live in it, and a socket's path may be at most 107 bytes:
// t.TempDir's names (the test's name, then digits) under a TMPDIR longer than /tmp pass
// that with the sandbox's own part of the path, so this is a short name under TMPDIR, or
// under /tmp when TMPDIR itself is long.
func RunDir(t testing.TB) string {
	t.Helper()
	parent := os.TempDir()
	if len(parent) > 32 {
		parent = "/tmp"
	}
	d, err := os.MkdirTemp(parent, "th-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}
