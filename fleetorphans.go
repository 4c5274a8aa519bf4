package toolhost

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/fleet"
	"github.com/toolhost/toolhost/internal/lease"
	"github.com/toolhost/toolhost/internal/rootapi"
	"github.com/toolhost/toolhost/internal/session"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// The sandboxes of a fleet (internal/fleet): those its replicas' sessions started carry
// the fleet's name (session.LabelFleet), their project and their lease epoch. A sandbox
// whose project nobody has held for longer than serve.fleet.orphan_after is an orphan:
// its holder died or handed it over and no request for the project came since. Any
// replica that finds one kills it, holding the project's lease while it does, so that no
// other replica reconnects to it meanwhile.

// fleetSandboxes lists the sandboxes labelled with the fleet named id, judged against
// their projects' leases; nil, nil when the provider cannot list its sandboxes. A
// sandbox whose labels do not name a valid project and epoch is left out: not the
// fleet's to judge.
func (t *Toolhost) fleetSandboxes(ctx context.Context, id string, after time.Duration) ([]fleet.Sandbox, error) {
	p, err := t.Provider(ctx)
	if err != nil {
		return nil, err
	}
	l, ok := sandbox.ProviderAs[sandbox.Lister](p)
	if !ok {
		return nil, nil
	}
	infos, err := l.List(ctx, map[string]string{session.LabelFleet: id})
	if err != nil {
		return nil, fmt.Errorf("listing the fleet's sandboxes: %w", err)
	}
	out := []fleet.Sandbox{}
	for _, in := range infos {
		if sb, ok := fleetSandbox(in, id); ok {
			out = append(out, sb)
		}
	}
	st := t.storage.store
	fleet.Judge(ctx, out, func(ctx context.Context, project string) (lease.State, error) {
		return lease.Peek(ctx, st, project)
	}, time.Now(), after)
	return out, nil
}

// fleetSandbox reads a listed sandbox's labels; false when they are not the fleet's.
func fleetSandbox(in sandbox.SandboxInfo, id string) (fleet.Sandbox, bool) {
	project := in.Labels[session.LabelProject]
	epoch, err := strconv.ParseUint(in.Labels[session.LabelEpoch], 10, 64)
	if in.Labels[session.LabelFleet] != id || storekeys.ValidProject(project) != nil || err != nil {
		return fleet.Sandbox{}, false
	}
	return fleet.Sandbox{ID: in.ID, Project: project, Epoch: epoch, Instance: in.Labels[session.LabelInstance],
		Session: in.Labels[session.LabelSession], State: in.State, StartedAt: in.StartedAt, EndsAt: in.EndsAt}, true
}

// reapOrphans kills the orphans of this replica's fleet (after: the orphan bound). For
// each project with orphans it takes the project's lease (a project taken meanwhile is
// left to its new holder), lists the project's sandboxes again and kills those of an
// earlier epoch than its own, which is all of them, and releases the lease.
func (t *Toolhost) reapOrphans(ctx context.Context, after time.Duration) ([]fleet.Sandbox, error) {
	m := t.fleetMember()
	if m == nil || m.ID == "" {
		return nil, errors.New("reaping orphans: this process is no replica of a fleet")
	}
	sbs, err := t.fleetSandboxes(ctx, m.ID, after)
	if err != nil || sbs == nil {
		return nil, err
	}
	p, err := t.Provider(ctx)
	if err != nil {
		return nil, err
	}
	k, ok := sandbox.ProviderAs[sandbox.Killer](p)
	if !ok {
		return nil, nil
	}
	l, _ := sandbox.ProviderAs[sandbox.Lister](p)
	var killed []fleet.Sandbox
	var errs []error
	done := map[string]bool{}
	for _, sb := range sbs {
		if sb.Verdict != fleet.Orphan || done[sb.Project] {
			continue
		}
		done[sb.Project] = true
		k, err := t.reapProject(ctx, m, l, k, sb.Project, after)
		killed = append(killed, k...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return killed, errors.Join(errs...)
}

// reapProject holds project's lease while it kills the project's orphans.
func (t *Toolhost) reapProject(ctx context.Context, m *rootapi.FleetMember, l sandbox.Lister, k sandbox.Killer, project string, after time.Duration) ([]fleet.Sandbox, error) {
	var killed []fleet.Sandbox
	_, err := t.holdFreeProject(ctx, m, project, after, func(ls *lease.Lease, st lease.State) error {
		var err error
		killed, err = t.killOrphans(ctx, m, l, k, project, ls, st)
		return err
	})
	if err != nil {
		err = fmt.Errorf("reaping the orphans of project %s: %w", project, err)
	}
	return killed, err
}

// holdFreeProject runs fn holding project's lease, taken for it when nobody holds the
// project nor has for less than after (the lease judged again as it is taken), and no
// session of this process is taking it; false when it did not run fn: the project is
// another's, or was taken meanwhile. The lease is released when fn returns.
func (t *Toolhost) holdFreeProject(ctx context.Context, m *rootapi.FleetMember, project string, after time.Duration, fn func(ls *lease.Lease, st lease.State) error) (bool, error) {
	t.leaseMu.Lock()
	mine := t.leases[project] != nil
	t.leaseMu.Unlock()
	if mine {
		return false, nil // a session of this process is taking it: the session judges
	}
	st, err := lease.Peek(ctx, t.storage.store, project)
	if err != nil || st.Held || st.Generation > 0 && time.Since(st.Expires) < after {
		return false, err
	}
	ls, err := lease.Acquire(ctx, lease.Config{Store: t.storage.store, TTL: t.cfg.Lease.TTL, Renew: t.cfg.Lease.Renew,
		Host: hostName(), Instance: m.Instance, Addr: m.Addr, Logger: t.opts.log}, project)
	if err != nil {
		var held *lease.HeldError
		if errors.As(err, &held) {
			return false, nil // taken meanwhile
		}
		return false, err
	}
	defer ls.Release(context.WithoutCancel(ctx))
	return true, fn(ls, st)
}

// holdFreeProjectHook is rootapi.HoldFreeProject: for a replica of a fleet, fn runs
// under the lease this process holds for a session of its own (not one it is taking), or
// under holdFreeProject's.
func (t *Toolhost) holdFreeProjectHook(ctx context.Context, project string, after time.Duration, fn func(ctx context.Context, lost func() error) error) (bool, error) {
	m := t.fleetMember()
	if m == nil || m.ID == "" {
		return false, errors.New("this process is no replica of a fleet")
	}
	t.leaseMu.Lock()
	e := t.leases[project]
	t.leaseMu.Unlock()
	if e != nil {
		select {
		case <-e.ready:
		default:
			return false, nil // being taken here: another replica may hold it yet
		}
		if e.l == nil || e.l.Err() != nil {
			return false, nil
		}
		return true, fn(ctx, e.l.Err) // Err: lost, or released when its sessions ended
	}
	return t.holdFreeProject(ctx, m, project, after, func(ls *lease.Lease, _ lease.State) error { return fn(ctx, ls.Err) })
}

// killOrphans kills project's orphans, holding ls, taken after st.
func (t *Toolhost) killOrphans(ctx context.Context, m *rootapi.FleetMember, l sandbox.Lister, k sandbox.Killer, project string, ls *lease.Lease, st lease.State) ([]fleet.Sandbox, error) {
	infos, err := l.List(ctx, map[string]string{session.LabelFleet: m.ID, session.LabelProject: project})
	if err != nil {
		return nil, err
	}
	var killed []fleet.Sandbox
	var errs []error
	for _, in := range infos {
		sb, ok := fleetSandbox(in, m.ID)
		if !ok || sb.Project != project || sb.Epoch >= ls.Epoch() {
			continue
		}
		if err := ls.Err(); err != nil {
			errs = append(errs, err)
			break // lost the lease: another replica judges now
		}
		if err := k.Kill(ctx, sb.ID); err != nil {
			errs = append(errs, fmt.Errorf("killing orphan sandbox %s: %w", sb.ID, err))
			continue
		}
		sb.Verdict = fleet.Orphan
		killed = append(killed, sb)
		t.opts.log.Warn("fleet: killed an orphan sandbox: nobody held its project for longer than serve.fleet.orphan_after",
			"project", project, "sandbox", sb.ID, "sandbox_epoch", sb.Epoch, "started_by", sb.Instance,
			"lease_free_since", st.Expires, "epoch", ls.Epoch())
	}
	return killed, errors.Join(errs...)
}
