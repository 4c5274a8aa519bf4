//go:build !linux

package local

import (
	"context"
	"errors"
	"runtime"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/module"
)

// The local provider is bubblewrap's, which is Linux's. Elsewhere its keys still exist (a
// configuration file works on every system) and it answers, clearly, that it is not here:
// in a list of providers the next one serves; alone, the error says what to set instead.

// defaultHostID is DefaultHostID's value (identity.go is Linux's).
const defaultHostID = 2100000000

// ErrLinuxOnly is what the local provider answers on a system other than Linux.
var ErrLinuxOnly = errors.New("the local sandbox provider (bubblewrap) runs on Linux only, not on " + runtime.GOOS +
	": set sandbox.provider to e2b (E2B's cloud, managed or self-hosted; see docs/E2B.md)")

func newFromSection(*Section, module.Env) (sandbox.Provider, error) { return nil, ErrLinuxOnly }

func doctor(context.Context, *Section, module.Env) []module.Check {
	return []module.Check{{Name: "sandbox", Needed: true, Detail: ErrLinuxOnly.Error()}}
}
