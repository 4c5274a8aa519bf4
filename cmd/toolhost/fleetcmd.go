package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/toolhost/toolhost/internal/fleet"
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
toolhost call, a replica gone without releasing) are listed apart. With --format json,
one JSON document.

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
