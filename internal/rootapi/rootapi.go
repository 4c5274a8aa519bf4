// Package rootapi is how package experimental reaches what the root package keeps
// unexported: the root package sets these functions in its init, and experimental calls
// them with the root package's own values (as any, since this package cannot import the
// root package that imports it). Nothing else uses it.
package rootapi

import (
	"context"
	"encoding/json"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/fleet"
	"github.com/toolhost/toolhost/internal/lease"
)

// FleetMember is what a *toolhost.Toolhost serving as a replica of a fleet (mcpserve)
// tells its leases: its instance and advertised address, written into every lease it
// takes, and how to tell that another holder is gone.
type FleetMember struct {
	// ID is the fleet's name (fleet.ID): the sandboxes of the replica's sessions carry it.
	ID             string
	Instance, Addr string
	// Probe tells whether the holder of a live lease is gone (lease.Config.Probe).
	Probe func(ctx context.Context, h lease.Holder) lease.Liveness
}

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
	// OneShot returns a toolhost.Option that compiles plugins only when asked for
	// (host.Config.OnDemand); Unsettled is the host's method of that name.
	OneShot   func() any
	Unsettled func(t any) []string
	// Store is a *toolhost.Toolhost's store (the one its leases and snapshots are in).
	Store func(t any) store.Store
	// Holds reports whether a *toolhost.Toolhost holds project's lease now.
	Holds func(t any, project string) bool
	// Handoff ends a *toolhost.Session on this process and leaves its work for another:
	// the workspace committed, a sandbox that lives apart from this process left running
	// (kept reports it), the project's lease released.
	Handoff func(ctx context.Context, s any) (kept bool, err error)
	// FleetSandboxes lists the sandboxes that the fleet named id started (their provider
	// a sandbox.Lister), each judged against its project's lease (fleet.Judge, with the
	// orphan bound after); nil when the provider cannot list.
	FleetSandboxes func(ctx context.Context, t any, id string, after time.Duration) ([]fleet.Sandbox, error)
	// ReapOrphans kills the orphans of the fleet a *toolhost.Toolhost is a replica of
	// (SetFleet): the sandboxes of projects nobody has held for longer than after. It
	// returns those it killed.
	ReapOrphans func(ctx context.Context, t any, after time.Duration) ([]fleet.Sandbox, error)
	// HoldFreeProject runs fn holding project's lease: the one the replica
	// *toolhost.Toolhost holds for its sessions, or one taken for fn when nobody holds the
	// project nor has for less than after; false when it did not run fn (another holds
	// the project, or a session of the replica is taking it). lost says why the lease is
	// no longer held (nil while it is).
	HoldFreeProject func(ctx context.Context, t any, project string, after time.Duration, fn func(ctx context.Context, lost func() error) error) (bool, error)
	// LeaseLost is why a *toolhost.Session may no longer act on its project (it lost the
	// project's lease), or nil.
	LeaseLost func(s any) error
	// SetFleet makes a *toolhost.Toolhost a replica of a fleet, before its first session.
	SetFleet func(t any, m FleetMember)
)
