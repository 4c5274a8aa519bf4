package fleet

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/lease"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// Holding is a project's lease as the fleet's status shows it.
type Holding struct {
	Project  string    `json:"project"`
	Instance string    `json:"instance,omitempty"` // empty: a holder outside the fleet
	Host     string    `json:"host"`
	Addr     string    `json:"addr,omitempty"`
	Epoch    uint64    `json:"epoch"`
	Expires  time.Time `json:"expires"`
}

// Status is the fleet as the store records it.
type Status struct {
	Replicas []ReplicaStatus `json:"replicas"`
	// Elsewhere are projects held by holders that are no replica of the registry (a CLI,
	// a replica that left without removing its lease).
	Elsewhere []Holding `json:"held_elsewhere"`
	// Sandboxes are the sandboxes the fleet's replicas started, judged (see Judge); nil
	// (null in JSON) when the provider cannot list its sandboxes.
	Sandboxes []Sandbox `json:"sandboxes"`
}

// ReplicaStatus is a replica and the projects it holds.
type ReplicaStatus struct {
	Replica
	Fresh    bool      `json:"fresh"`
	Projects []Holding `json:"projects"`
}

// ReadStatus reads the registry and every project's lease from st.
func ReadStatus(ctx context.Context, st store.Store, heartbeat time.Duration, now time.Time) (Status, error) {
	if heartbeat <= 0 {
		heartbeat = DefaultHeartbeat
	}
	rs, err := ListReplicas(ctx, st)
	if err != nil {
		return Status{}, err
	}
	out := Status{Replicas: []ReplicaStatus{}, Elsewhere: []Holding{}}
	byInst := map[string]int{}
	for _, r := range rs {
		byInst[r.Instance] = len(out.Replicas)
		out.Replicas = append(out.Replicas, ReplicaStatus{Replica: r, Fresh: r.Fresh(now, heartbeat), Projects: []Holding{}})
	}
	projects, err := leasedProjects(ctx, st)
	if err != nil {
		return out, err
	}
	for _, p := range projects {
		s, err := lease.Peek(ctx, st, p)
		if err != nil {
			return out, fmt.Errorf("reading the lease of project %s: %w", p, err)
		}
		if !s.Held {
			continue
		}
		h := Holding{Project: p, Instance: s.Holder.Instance, Host: s.Holder.Host, Addr: s.Holder.Addr, Epoch: s.Epoch, Expires: s.Expires}
		if i, ok := byInst[h.Instance]; ok && h.Instance != "" {
			out.Replicas[i].Projects = append(out.Replicas[i].Projects, h)
		} else {
			out.Elsewhere = append(out.Elsewhere, h)
		}
	}
	return out, nil
}

// leasedProjects lists the projects that have lease generations.
func leasedProjects(ctx context.Context, st store.Store) ([]string, error) {
	objs, err := store.ListAll(ctx, st, storekeys.Projects)
	if err != nil {
		return nil, fmt.Errorf("listing the projects: %w", err)
	}
	var out []string
	for _, o := range objs {
		rest := strings.TrimPrefix(o.Key, storekeys.Projects)
		p, tail, ok := strings.Cut(rest, "/")
		if !ok || !strings.HasPrefix(tail, "lease/") || storekeys.ValidProject(p) != nil {
			continue
		}
		if len(out) == 0 || out[len(out)-1] != p {
			out = append(out, p)
		}
	}
	return slices.Compact(out), nil
}

// Sandbox is a sandbox the fleet's replicas started (it carries the fleet's name), as
// its labels and the provider describe it: data from the provider and from whoever
// created it, judged against the store's leases, never trusted to name a holder.
type Sandbox struct {
	ID        string    `json:"id"`
	Project   string    `json:"project"`
	Epoch     uint64    `json:"epoch"`
	Instance  string    `json:"instance,omitempty"`
	Session   string    `json:"session,omitempty"`
	State     string    `json:"state,omitempty"`
	StartedAt time.Time `json:"started_at,omitzero"`
	EndsAt    time.Time `json:"ends_at,omitzero"`
	// Verdict is what the sandbox is (Held, Waiting, Orphan).
	Verdict Verdict `json:"verdict"`
	// Until is, for a Waiting sandbox, when it becomes an orphan.
	Until time.Time `json:"until,omitzero"`
}

// Verdict says what a sandbox of the fleet is.
type Verdict string

const (
	// Held: its project's lease is held; its holder keeps it, or kills it as an orphan
	// of an earlier epoch when a session of the project opens.
	Held Verdict = "held"
	// Waiting: nobody holds its project since less than the orphan bound: the next
	// request for the project, on any replica, reconnects to it.
	Waiting Verdict = "waiting"
	// Orphan: nobody has held its project for longer than the bound: any replica that
	// finds it kills it.
	Orphan Verdict = "orphan"
)

// Judge gives each of sbs its Verdict from its project's lease as peek reads it: a
// project nobody holds since more than after ago makes its sandboxes orphans. A project
// whose lease cannot be read leaves its sandboxes Held: nothing is killed on a guess.
func Judge(ctx context.Context, sbs []Sandbox, peek func(ctx context.Context, project string) (lease.State, error), now time.Time, after time.Duration) {
	leases := map[string]*lease.State{}
	for i := range sbs {
		sb := &sbs[i]
		s, ok := leases[sb.Project]
		if !ok {
			st, err := peek(ctx, sb.Project)
			if err == nil {
				s = &st
			}
			leases[sb.Project] = s
		}
		switch {
		case s == nil || s.Held:
			sb.Verdict = Held
		case s.Generation == 0 || now.Sub(s.Expires) >= after:
			// Free for longer than the bound, or never leased in this store.
			sb.Verdict = Orphan
		default:
			sb.Verdict, sb.Until = Waiting, s.Expires.Add(after)
		}
	}
}
