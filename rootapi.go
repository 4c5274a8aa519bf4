package toolhost

import (
	"context"
	"encoding/json"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/fleet"
	"github.com/toolhost/toolhost/internal/rootapi"
)

// What package experimental reaches (see internal/rootapi).
func init() {
	rootapi.SessionSandbox = func(s any) sandbox.Sandbox { return s.(*Session).live }
	rootapi.Rotations = func(s any) int { return s.(*Session).live.Rotations() }
	rootapi.Rotate = func(ctx context.Context, s any) error { return s.(*Session).live.Rotate(ctx) }
	rootapi.Dispatch = func(ctx context.Context, t any, sb sandbox.Sandbox, tool string, input json.RawMessage) (abi.Result, error) {
		return t.(*Toolhost).host.OpenSession(sb).Dispatch(ctx, tool, input)
	}
	rootapi.Prepare = func(t any, tool string) { t.(*Toolhost).host.Prepare(tool) }
	rootapi.Settle = func(ctx context.Context, t any) error { return t.(*Toolhost).host.Settle(ctx) }
	rootapi.OneShot = func() any { return Option(func(o *options) { o.onDemand = true }) }
	rootapi.Unsettled = func(t any) []string { return t.(*Toolhost).host.Unsettled() }
	rootapi.CompilePlugins = func(ctx context.Context, t any) error { return t.(*Toolhost).host.Ready(ctx) }
	rootapi.Store = func(t any) store.Store { return t.(*Toolhost).storage.store }
	rootapi.Holds = func(t any, project string) bool {
		th := t.(*Toolhost)
		th.leaseMu.Lock()
		e := th.leases[project]
		th.leaseMu.Unlock()
		if e == nil {
			return false
		}
		select {
		case <-e.ready:
		default:
			return true // being taken here: the session that takes it serves
		}
		return e.l != nil && e.l.Err() == nil
	}
	rootapi.Handoff = func(ctx context.Context, s any) (bool, error) { return s.(*Session).handoff(ctx) }
	rootapi.FleetSandboxes = func(ctx context.Context, t any, id string, after time.Duration) ([]fleet.Sandbox, error) {
		return t.(*Toolhost).fleetSandboxes(ctx, id, after)
	}
	rootapi.ReapOrphans = func(ctx context.Context, t any, after time.Duration) ([]fleet.Sandbox, error) {
		return t.(*Toolhost).reapOrphans(ctx, after)
	}
	rootapi.HoldFreeProject = func(ctx context.Context, t any, project string, after time.Duration, fn func(ctx context.Context, lost func() error) error) (bool, error) {
		return t.(*Toolhost).holdFreeProjectHook(ctx, project, after, fn)
	}
	rootapi.LeaseLost = func(s any) error { return s.(*Session).leaseErr() }
	rootapi.SetFleet = func(t any, m rootapi.FleetMember) {
		th := t.(*Toolhost)
		th.leaseMu.Lock()
		th.fleet = &m
		// The replica's instance names its sessions' records and sandboxes too, so a
		// record's writer is the replica a fleet's status lists.
		th.instance = m.Instance
		th.leaseMu.Unlock()
	}
}
