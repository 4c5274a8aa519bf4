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
