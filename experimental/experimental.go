// Package experimental holds what a program embedding toolhost may need beyond the root
// package, with no compatibility promise: a name here may change or go in any release,
// and moves to the root package once it has earned a stable form (wazero's rule).
package experimental

import (
	"context"
	"encoding/json"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/rootapi"
)

// Sandbox is the sandbox a session's tools act in, as a view that follows the session
// across rotations: it implements sandbox.Wrapper, whose Unwrap is the sandbox of the
// moment (so sandbox.As finds the provider's abilities, and Unwrap().ID() names it).
// Closing it ends the session's sandbox without saving: close the Session instead.
func Sandbox(s *toolhost.Session) sandbox.Sandbox { return rootapi.SessionSandbox(s) }

// Rotations is how many times the session replaced its sandbox (before an end it could
// not extend, or after the sandbox died).
func Rotations(s *toolhost.Session) int { return rootapi.Rotations(s) }

// Rotate replaces the session's sandbox now, as it does before an end it cannot extend:
// it saves, starts a new sandbox, moves the work and restarts the background processes.
func Rotate(ctx context.Context, s *toolhost.Session) error { return rootapi.Rotate(ctx, s) }

// Dispatch runs one tool call of t's plugins in sb, a sandbox of the caller's, outside any
// session: no lease, no snapshot, no rotation (what `toolhost policy test` does to prove a
// policy against a sandbox it made).
func Dispatch(ctx context.Context, t *toolhost.Toolhost, sb sandbox.Sandbox, tool string, input json.RawMessage) (abi.Result, error) {
	return rootapi.Dispatch(ctx, t, sb, tool, input)
}
