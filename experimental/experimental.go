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

// A plugin that was never compiled on this machine answers its first calls in wazero's
// interpreter while its machine code is built in the background; one compiled before
// loads from the compilation cache in the data dir. These three steer that.

// Prepare starts readying the plugin of tool for a call that is coming, without waiting:
// a program that knows its first call before it has a sandbox (the CLI's call) prepares
// the tool first, so the plugin gets ready while the sandbox starts.
func Prepare(t *toolhost.Toolhost, tool string) { rootapi.Prepare(t, tool) }

// Settle waits until every plugin that has served a call is compiled into the cache, so
// that the next start of a program that made a few calls and exits does not interpret
// them again.
func Settle(ctx context.Context, t *toolhost.Toolhost) error { return rootapi.Settle(ctx, t) }

// OneShot is an option for a program that makes one call and exits (the CLI's call): New
// then compiles no plugin ahead, and a call compiles only its own plugin (a cache hit
// when it was compiled before, its interpreted form otherwise). Settle, or a later
// CompilePlugins, still fills the cache for the next start.
func OneShot() toolhost.Option { return rootapi.OneShot().(toolhost.Option) }

// Unsettled names the plugins that have served a call and are not yet compiled into the
// cache: what Settle would wait for. A program that would rather exit at once can leave
// them to another process (toolhost tools --warm).
func Unsettled(t *toolhost.Toolhost) []string { return rootapi.Unsettled(t) }

// CompilePlugins compiles every plugin into the compilation cache and waits for it (what
// toolhost tools --warm and make build do), so that no first call is interpreted.
func CompilePlugins(ctx context.Context, t *toolhost.Toolhost) error {
	return rootapi.CompilePlugins(ctx, t)
}
