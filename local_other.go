//go:build !linux

package toolhost

import (
	"context"
	"errors"
	"log/slog"
	"runtime"

	"github.com/toolhost/toolhost/core/sandbox"
)

// errLocalLinuxOnly is what the local provider answers on a system other than Linux.
var errLocalLinuxOnly = errors.New("the local sandbox provider (bubblewrap) runs on Linux only, not on " + runtime.GOOS +
	": set sandbox.provider to e2b (E2B's cloud, managed or self-hosted; see docs/E2B.md)")

// newLocalProvider is unavailable here: a list of providers goes on to the next one, and
// a configuration naming local alone fails with the reason.
func newLocalProvider(context.Context, providerEnv) (sandbox.Provider, error) {
	return unavailable{errLocalLinuxOnly}, nil
}

func bwrapHint() string { return "" }

// doctorLocal says the local provider is not available on this system.
func doctorLocal(context.Context, *Config, *slog.Logger) []Check {
	return []Check{{Name: "sandbox", Needed: true, Detail: errLocalLinuxOnly.Error()}}
}
