package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/fleet"
	"github.com/toolhost/toolhost/internal/rootapi"
)

func fleetStatusCommand() *command {
	cmd := &command{
		words:   []string{"fleet", "status"},
		summary: "the serve replicas sharing this store, and the projects each holds",
		help: `Reads the store the configuration names (the one a fleet of toolhost serve replicas
shares) and prints each replica of the fleet: its instance, advertised address, when it
last renewed its record (a replica that has not for three heartbeats is stale: killed,
or cut off), whether it is draining, and the projects whose lease it holds with their
epochs (the fencing token) and expiries. Projects held by a process outside the fleet (a
toolhost call, a replica gone without releasing) are listed apart. Then, where the
sandbox provider can list its sandboxes (E2B), each sandbox the fleet's replicas
started: its project, the lease epoch and replica it was started at, and whether its
project is held, waits for a replica to reconnect (and until when), or is an orphan
that the next replica to look kills (serve.fleet.orphan_after). With --format json, one
JSON document.

It lists the store's project folders to find the leases: on a store with very many
snapshots that takes a while.`,
		nargs:  [2]int{0, 0},
		report: true,
	}
	cmd.run = func(ctx context.Context, c *cli, _ []string) error {
		st, err := c.newStorage(ctx, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		s, err := fleet.ReadStatus(ctx, st.Store(), fleet.DefaultHeartbeat, time.Now())
		if err != nil {
			return fmt.Errorf("reading the fleet's records: %w", err)
		}
		if s.Sandboxes, err = c.fleetSandboxes(ctx, st); err != nil {
			return err
		}
		if c.json() {
			e := json.NewEncoder(c.stdout)
			e.SetIndent("", "  ")
			return e.Encode(s)
		}
		if len(s.Replicas) == 0 {
			fmt.Fprintln(c.stdout, "no replica has a record in this store (no serve runs with serve.fleet.advertise)")
		}
		now := time.Now()
		for _, r := range s.Replicas {
			state := "ready"
			switch {
			case !r.Fresh:
				state = "STALE"
			case r.Draining:
				state = "draining"
			}
			fmt.Fprintf(c.stdout, "replica %s  %s  %s  seen %s ago  up since %s\n", r.Instance, r.Addr, state,
				now.Sub(r.Seen).Round(time.Second), r.Started.UTC().Format(time.RFC3339))
			for _, h := range r.Projects {
				fmt.Fprintf(c.stdout, "  project %s  epoch %d  lease until %s\n", h.Project, h.Epoch, h.Expires.UTC().Format(time.RFC3339))
			}
		}
		printFleetSandboxes(c, s.Sandboxes, now)
		if len(s.Elsewhere) > 0 {
			fmt.Fprintln(c.stdout, "held outside the fleet:")
			for _, h := range s.Elsewhere {
				fmt.Fprintf(c.stdout, "  project %s  host %s  epoch %d  lease until %s\n", h.Project, h.Host, h.Epoch, h.Expires.UTC().Format(time.RFC3339))
			}
		}
		return nil
	}
	return cmd
}

// fleetSandboxes lists the sandboxes of the fleet sharing st, judged; nil when no replica
// named the fleet yet or the provider cannot list its sandboxes.
func (c *cli) fleetSandboxes(ctx context.Context, st *toolhost.Storage) ([]fleet.Sandbox, error) {
	id, err := fleet.ReadID(ctx, st.Store())
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	th, err := c.newToolhost(ctx)
	if err != nil {
		return nil, err
	}
	defer c.closeToolhost(ctx, th)
	sbs, err := rootapi.FleetSandboxes(ctx, th, id, c.cfg.Serve.Fleet.OrphanAfter)
	if err != nil {
		return nil, fmt.Errorf("listing the fleet's sandboxes: %w", err)
	}
	return sbs, nil
}

func printFleetSandboxes(c *cli, sbs []fleet.Sandbox, now time.Time) {
	if sbs == nil {
		return
	}
	fmt.Fprintf(c.stdout, "sandboxes: %d\n", len(sbs))
	for _, sb := range sbs {
		what := string(sb.Verdict)
		switch sb.Verdict {
		case fleet.Waiting:
			what = fmt.Sprintf("waiting for a replica (an orphan in %s)", sb.Until.Sub(now).Round(time.Second))
		case fleet.Orphan:
			what = "ORPHAN (the next replica to look kills it)"
		}
		fmt.Fprintf(c.stdout, "  sandbox %s  project %s  epoch %d  started by %s  %s\n", sb.ID, sb.Project, sb.Epoch, sb.Instance, what)
	}
}
