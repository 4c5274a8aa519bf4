package snapshot

import (
	"context"
	"errors"
	"fmt"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/chunked"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// Damaged snapshots (see internal/chunked, "Damage"): whatever finds a chunked snapshot
// that does not read because of what the store holds (a wake, a save over it, a
// verification) has it examined, and a damaged one is set aside in the project's
// quarantine with every other snapshot of the project that needs what was found damaged.
// Wakes, saves and retention then pass it by; Quarantined lists it, Release puts it back
// once it verifies, Delete deletes it.

// Quarantined is a snapshot set aside as damaged.
type Quarantined = chunked.Quarantined

// QuarantineError: a snapshot did not verify, and was set aside.
type QuarantineError struct {
	// Key is the snapshot; Quarantine where it went.
	Key, Quarantine string
	// Others are the other snapshots of the project set aside with it (they need what was
	// found damaged).
	Others []Refusal
	Err    error
}

func (e *QuarantineError) Error() string {
	s := fmt.Sprintf("%v; it was set aside as %s", e.Err, e.Quarantine)
	if len(e.Others) > 0 {
		s += fmt.Sprintf(", with %d other snapshots of the project that need what is damaged", len(e.Others))
	}
	return s
}

func (e *QuarantineError) Unwrap() error { return e.Err }

// setAside examines the chunked snapshot key of the project after cause (the error a
// read of it gave) and, when it is damaged, sets it aside with every other snapshot of the
// project that needs a pack found damaged. It returns what it set aside, by key (key's own
// included when it went). Failures are logged: the caller goes on as it would have.
func (m *Manager) setAside(ctx context.Context, x *chunked.Examiner, projectID, key string, cause error) map[string]Refusal {
	out := map[string]Refusal{}
	d, err := x.Examine(ctx, key, cause)
	switch {
	case err != nil:
		m.log.Warn("snapshot: a snapshot that does not read could not be examined; it stays where it is", "project", projectID, "key", key, "err", err)
		return out
	case d.Gone:
		return out
	case !d.Damaged:
		if cause != nil {
			m.log.Warn("snapshot: a snapshot did not read, but all it needs verifies on a second read; it stays where it is",
				"project", projectID, "key", key, "err", cause)
		}
		return out
	}
	if q, ok := m.moveAside(ctx, projectID, key, d); ok {
		out[key] = Refusal{Key: key, Reason: d.Why, Quarantine: q}
	}
	damaged := x.Damaged()
	if len(damaged) == 0 {
		return out
	}
	keys, err := m.repo.ListManifests(ctx, projectID)
	if err != nil {
		m.log.Warn("snapshot: the other snapshots of the project could not be listed to look for the damage", "project", projectID, "err", err)
		return out
	}
	for _, k := range keys {
		if _, _, ok := chunked.ParseManifestKey(k); !ok || k == key {
			continue
		}
		man, err := m.repo.Manifest(ctx, k)
		if err != nil || !chunked.References(man, damaged) {
			continue // one that does not read is examined when it is reached
		}
		sd, err := x.Examine(ctx, k, nil)
		if err != nil || !sd.Damaged {
			continue
		}
		if q, ok := m.moveAside(ctx, projectID, k, sd); ok {
			out[k] = Refusal{Key: k, Reason: sd.Why, Quarantine: q}
		}
	}
	return out
}

// moveAside sets one damaged snapshot aside and says so in the log (a warning: what the
// operation did went on, as the Manager's warnings say; its errors are those it returns).
func (m *Manager) moveAside(ctx context.Context, projectID, key string, d chunked.Diagnosis) (string, bool) {
	q, err := m.repo.SetAside(ctx, key, d.Reason, d.Why, d.Packs)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return "", false
	case err != nil:
		m.log.Warn("snapshot: a damaged snapshot could not be set aside; it stays where it is, and wakes pass it by",
			"project", projectID, "key", key, "why", d.Why, "err", err)
		return "", false
	}
	m.log.Warn("snapshot set aside in quarantine: it is damaged", "project", projectID, "key", key, "quarantine", q,
		"reason", d.Reason, "why", d.Why)
	return q, true
}

// noteQuarantine says, when a project has no snapshot left, that some were set aside.
func (m *Manager) noteQuarantine(ctx context.Context, projectID string) {
	if q, err := m.repo.Quarantined(ctx, projectID); err == nil && len(q) > 0 {
		m.log.Warn("snapshot: the project has no snapshot to restore, but has snapshots set aside as damaged",
			"project", projectID, "quarantined", len(q), "newest", q[len(q)-1].Key, "why", q[len(q)-1].Why)
	}
}

// Quarantined lists the project's snapshots set aside as damaged, oldest first.
func (m *Manager) Quarantined(ctx context.Context, projectID string) ([]Quarantined, error) {
	if err := ValidProjectID(projectID); err != nil {
		return nil, err
	}
	return m.repo.Quarantined(ctx, projectID)
}

// Release puts the project's quarantined snapshot qkey back among its snapshots, under
// the key it had, once it verifies whole (chunked.ErrStillDamaged when it does not), and
// returns that key. It becomes the newest only if no snapshot was saved after it.
func (m *Manager) Release(ctx context.Context, projectID, qkey string) (string, error) {
	if err := m.checkQuarantineKey(projectID, qkey); err != nil {
		return "", err
	}
	if _, err := m.cfg.Store.Head(ctx, qkey); errors.Is(err, store.ErrNotFound) {
		return "", fmt.Errorf("%w: project %s has no quarantined snapshot %s", ErrNoSuchSnapshot, projectID, qkey)
	}
	key, err := m.repo.Release(ctx, qkey)
	if err != nil {
		return "", fmt.Errorf("release %s: %w", qkey, err)
	}
	m.log.Info("snapshot released from quarantine", "project", projectID, "from", qkey, "key", key)
	return key, nil
}

func (m *Manager) checkQuarantineKey(projectID, qkey string) error {
	if err := ValidProjectID(projectID); err != nil {
		return err
	}
	if p, _, _, _, ok := storekeys.ParseQuarantineKey(qkey); !ok || p != projectID {
		return fmt.Errorf("%w: %q is not a quarantined snapshot of project %s (snapshot verify lists them)", ErrNotSnapshotKey, qkey, projectID)
	}
	return nil
}

// examineSource refuses to copy a snapshot (a fork, a rewind) that needs a pack found
// damaged and is damaged: it is set aside instead.
func (m *Manager) examineSource(ctx context.Context, projectID string, man *chunked.Manifest) error {
	x := m.repo.NewExaminer()
	if suspect, err := x.Suspect(ctx, man); err != nil || !suspect {
		return err
	}
	if r, ok := m.setAside(ctx, x, projectID, man.Key, nil)[man.Key]; ok {
		return &QuarantineError{Key: man.Key, Quarantine: r.Quarantine,
			Err: fmt.Errorf("snapshot %s is damaged: %s: %w", man.Key, r.Reason, ErrCorrupt)}
	}
	return nil
}
