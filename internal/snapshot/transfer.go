package snapshot

import (
	"fmt"
	"strings"
	"time"
)

// Transfer is what a Save or a Restore really moved, phase by phase, for the summary a
// user reads ("transfer: pack 38.2 MiB in 1.52 s (25.1 MiB/s), upload 38.2 MiB in
// 0.40 s (95.5 MiB/s)"). Rates are over the bytes that moved and the time they took: an
// upload counts only the attempt that stored the snapshot, and a save that stored
// nothing says so instead of a rate.
type Transfer struct {
	Phases []Phase
}

// Phase is one step of a transfer.
type Phase struct {
	// Name is "pack", "upload", "download" or "extract".
	Name string
	// Bytes is what the phase moved: the archive written (pack), stored (upload: 0 when
	// nothing was), downloaded (every snapshot tried) or read back (extract).
	Bytes int64
	// Duration is the phase's time: for an upload, that of the attempt that stored the
	// snapshot.
	Duration time.Duration
	// Attempts made by the store phases.
	Attempts int
	// Failed: the phase did not complete.
	Failed bool
}

// add appends p, merging it into a phase of the same name already last (a restore that
// tries several snapshots downloads and extracts more than once).
func (t *Transfer) add(p Phase) {
	if n := len(t.Phases); n > 0 && t.Phases[n-1].Name == p.Name {
		q := &t.Phases[n-1]
		q.Bytes += p.Bytes
		q.Duration += p.Duration
		q.Attempts += p.Attempts
		q.Failed = p.Failed
		return
	}
	t.Phases = append(t.Phases, p)
}

// Phase returns the phase with the name, and whether there is one.
func (t Transfer) Phase(name string) (Phase, bool) {
	for _, p := range t.Phases {
		if p.Name == name {
			return p, true
		}
	}
	return Phase{}, false
}

// String is the one-line summary: each phase's bytes, time and rate.
func (t Transfer) String() string {
	parts := make([]string, 0, len(t.Phases))
	for _, p := range t.Phases {
		parts = append(parts, p.String())
	}
	return strings.Join(parts, ", ")
}

func (p Phase) String() string {
	var notes []string
	if p.Attempts > 1 {
		notes = append(notes, fmt.Sprintf("%d attempts", p.Attempts))
	}
	switch {
	case p.Failed:
		return fmt.Sprintf("%s failed after %d %s, nothing stored", p.Name, p.Attempts, plural(p.Attempts, "attempt"))
	case p.Name == "upload" && p.Bytes == 0:
		notes = append([]string{"unchanged: the newest snapshot holds this content"}, notes...)
		return "upload none (" + strings.Join(notes, "; ") + ")"
	}
	if p.Duration >= time.Millisecond {
		notes = append([]string{HumanBytes(int64(float64(p.Bytes)/p.Duration.Seconds())) + "/s"}, notes...)
	}
	s := fmt.Sprintf("%s %s in %s", p.Name, HumanBytes(p.Bytes), humanDuration(p.Duration))
	if len(notes) > 0 {
		s += " (" + strings.Join(notes, "; ") + ")"
	}
	return s
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// HumanBytes formats a size in binary units: 512 B, 3.4 KiB, 38.2 MiB, 1.5 GiB.
func HumanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func humanDuration(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%d µs", d.Microseconds())
}
