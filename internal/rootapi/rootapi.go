// Package rootapi is how package experimental reaches what the root package keeps
// unexported: the root package sets these functions in its init, and experimental calls
// them with the root package's own values (as any, since this package cannot import the
// root package that imports it). Nothing else uses it.
package rootapi

import (
	"context"
	"encoding/json"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
)

var (
	// SessionSandbox returns a *toolhost.Session's live sandbox view.
	SessionSandbox func(s any) sandbox.Sandbox
	// Rotations returns how many times a *toolhost.Session replaced its sandbox.
	Rotations func(s any) int
	// Rotate replaces a *toolhost.Session's sandbox now.
	Rotate func(ctx context.Context, s any) error
	// Dispatch runs a tool of a *toolhost.Toolhost's plugins in sb, outside any session.
	Dispatch func(ctx context.Context, t any, sb sandbox.Sandbox, tool string, input json.RawMessage) (abi.Result, error)
	// Prepare, Settle and CompilePlugins reach a *toolhost.Toolhost's plugin host (the
	// host's methods of the same names, Ready for CompilePlugins).
	Prepare        func(t any, tool string)
	Settle         func(ctx context.Context, t any) error
	CompilePlugins func(ctx context.Context, t any) error
)
