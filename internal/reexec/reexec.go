// Package reexec is how a toolhost binary becomes one of its own helpers: the local
// sandbox's agent, the screenshot sandbox's wrapper and forwarder. A package with a helper
// registers it in its init (registering never exits); the program's main calls Main first
// (embedders: toolhost.Reexec), which runs the helper whose variable is set, and exits with
// its status, or returns at once when none is. This is docker's "reexec" pattern with the
// entry point explicit: importing a package never takes over a process.
package reexec

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
)

// helper is a program this binary runs as when started with env set.
type helper struct {
	env  string
	main func(value string) int
}

var (
	mu      sync.Mutex
	helpers []helper
	entered atomic.Bool
)

// Register adds the helper run when the environment variable env is set: main gets its
// value and returns the exit status. Call it from an init function.
func Register(env string, main func(value string) int) {
	mu.Lock()
	defer mu.Unlock()
	for _, h := range helpers {
		if h.env == env {
			panic("reexec: " + env + " registered twice")
		}
	}
	helpers = append(helpers, helper{env: env, main: main})
}

// Main runs this process as the registered helper whose variable is set and exits with
// its status; it returns when none is set. Call it first in main and in TestMain, before
// anything else runs (flags, goroutines, files).
func Main() {
	entered.Store(true)
	if code, ok := run(os.LookupEnv); ok {
		os.Exit(code)
	}
}

// run runs the first registered helper whose variable lookup finds.
func run(lookup func(string) (string, bool)) (int, bool) {
	mu.Lock()
	hs := append([]helper(nil), helpers...)
	mu.Unlock()
	for _, h := range hs {
		if v, ok := lookup(h.env); ok {
			return h.main(v), true
		}
	}
	return 0, false
}

// ErrNotEntered is Check's error: the program's main did not call Main (toolhost.Reexec).
var ErrNotEntered = errors.New("this program's main does not call toolhost.Reexec first (docs/LIBRARY.md), so it cannot be re-executed as toolhost's helper")

// Check returns ErrNotEntered unless Main has been called in this process. A package that
// re-executes this binary checks it before it does: without Main, the program's own main
// would run in the helper's place.
func Check() error {
	if !entered.Load() {
		return ErrNotEntered
	}
	return nil
}
