package e2b

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/store/dir"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// Quota tracking. E2B bills sandbox time by size and limits concurrency and creation
// rate per plan; its API has no billing figures. So the provider counts for itself: every
// sandbox it creates is a Record (project, template, CPUs, start, end, close) in a Ledger,
// kept in a store so that the figures survive the process and add up across hosts.
//
// Layout: one object per day and writer, {prefix}{YYYY-MM-DD}/{writer}.json, holding that
// writer's records of the sandboxes started that day (UTC). A writer is one process
// (host name and a random suffix), so hosts sharing one store (S3) never write the same
// object and need no locking; a report reads them all.

// Record is one sandbox as the ledger knows it.
type Record struct {
	ID        string     `json:"id"`
	Project   string     `json:"project,omitempty"`
	Template  string     `json:"template"`
	CPUs      int        `json:"cpus"`
	MemoryMB  int        `json:"memory_mb,omitempty"`
	StartedAt time.Time  `json:"started_at"`
	EndAt     time.Time  `json:"end_at"`
	ClosedAt  *time.Time `json:"closed_at,omitempty"`
}

// CPUMinutes is the compute the sandbox used up to now: its lifetime (until it was
// closed, or its end time, or now while it runs) times its CPU count.
func (r Record) CPUMinutes(now time.Time) float64 {
	end := r.EndAt
	if r.ClosedAt != nil && r.ClosedAt.Before(end) {
		end = *r.ClosedAt
	}
	if now.Before(end) {
		end = now
	}
	if !end.After(r.StartedAt) {
		return 0
	}
	return end.Sub(r.StartedAt).Minutes() * float64(max(r.CPUs, 1))
}

// Running reports whether the sandbox is alive at now.
func (r Record) Running(now time.Time) bool {
	return r.ClosedAt == nil && now.Before(r.EndAt) && !now.Before(r.StartedAt)
}

type dayObject struct {
	Writer    string    `json:"writer"`
	Sandboxes []*Record `json:"sandboxes"`
}

// Ledger records sandboxes. It is safe for concurrent use; a failure to write it is
// logged, never returned (counting must not stop a sandbox).
type Ledger struct {
	st     store.Store
	prefix string
	writer string
	now    func() time.Time

	mu     sync.Mutex
	days   map[string]map[string]*Record // day -> id -> this writer's records
	dayOf  map[string]string             // id -> day
	warned map[string]time.Time          // warning kind -> when last logged
}

// DefaultQuotaPrefix is where a shared store keeps the ledger.
var DefaultQuotaPrefix = storekeys.Quota("e2b")

// NewLedger keeps records in st under prefix (DefaultQuotaPrefix when empty).
func NewLedger(st store.Store, prefix string) *Ledger {
	if prefix == "" {
		prefix = DefaultQuotaPrefix
	}
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return '_'
	}, host)
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &Ledger{st: st, prefix: prefix, writer: host + "-" + hex.EncodeToString(b[:]), now: time.Now,
		days: map[string]map[string]*Record{}, dayOf: map[string]string{}, warned: map[string]time.Time{}}
}

// OpenLedger keeps the ledger in the data directory, under quota/.
func OpenLedger(dataDir string) (*Ledger, error) {
	st, err := dir.New(filepath.Join(dataDir, "quota"))
	if err != nil {
		return nil, fmt.Errorf("open the quota ledger: %w", err)
	}
	return NewLedger(st, "e2b/"), nil
}

func day(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// Created records a new sandbox and warns when the plan's limits come near.
func (l *Ledger) Created(ctx context.Context, r Record, plan Plan, log *slog.Logger) {
	l.mu.Lock()
	d := day(r.StartedAt)
	if l.days[d] == nil {
		l.days[d] = map[string]*Record{}
	}
	rec := r
	l.days[d][r.ID] = &rec
	l.dayOf[r.ID] = d
	err := l.persist(ctx, d)
	l.mu.Unlock()
	if err != nil {
		log.Warn("quota ledger: could not record a sandbox", "sandbox", r.ID, "err", err)
	}
	u, err := l.Usage(ctx, plan)
	if err != nil {
		log.Warn("quota ledger: could not read usage", "err", err)
		return
	}
	for _, w := range u.Warnings {
		kind, _, _ := strings.Cut(w, ":")
		l.mu.Lock()
		quiet := l.now().Sub(l.warned[kind]) < 5*time.Minute
		if !quiet {
			l.warned[kind] = l.now()
		}
		l.mu.Unlock()
		if !quiet {
			log.Warn("E2B quota: "+w, "plan", plan.Name)
		}
	}
}

// Extended records a new end time.
func (l *Ledger) Extended(ctx context.Context, id string, end time.Time, log *slog.Logger) {
	l.update(ctx, id, log, func(r *Record) { r.EndAt = end })
}

// Closed records that a sandbox was closed at at.
func (l *Ledger) Closed(ctx context.Context, id string, at time.Time, log *slog.Logger) {
	l.update(ctx, id, log, func(r *Record) {
		if r.ClosedAt == nil {
			r.ClosedAt = &at
		}
	})
}

func (l *Ledger) update(ctx context.Context, id string, log *slog.Logger, fn func(*Record)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d, ok := l.dayOf[id]
	if !ok {
		return
	}
	fn(l.days[d][id])
	if err := l.persist(ctx, d); err != nil {
		log.Warn("quota ledger: could not update a sandbox", "sandbox", id, "err", err)
	}
}

// persist writes this writer's object of day d. Called with mu held.
func (l *Ledger) persist(ctx context.Context, d string) error {
	obj := dayObject{Writer: l.writer}
	for _, id := range slices.Sorted(maps.Keys(l.days[d])) {
		obj.Sandboxes = append(obj.Sandboxes, l.days[d][id])
	}
	b, err := json.MarshalIndent(obj, "", "\t")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_, err = l.st.Put(ctx, l.prefix+d+"/"+l.writer+".json", bytes.NewReader(b), store.PutOptions{Size: int64(len(b)), ContentType: "application/json"})
	return err
}

// Usage is what the ledger says about the calendar month (UTC) of its time.
type Usage struct {
	At    time.Time
	Plan  Plan
	Month string // YYYY-MM
	// Days holds the figures per day and project, in order.
	Days []DayUsage
	// Month totals, over every project and host.
	Creations  int
	CPUMinutes float64
	// Running sandboxes now, and creations in the last RateWindow.
	Running           int
	RecentCreations   int
	RateWindow        time.Duration
	Warnings          []string
	UnreadableObjects int
}

// DayUsage is one project's figures on one day (UTC).
type DayUsage struct {
	Day        string
	Project    string
	Creations  int
	CPUMinutes float64
}

// RateWindow is the window the creation rate is measured over.
const RateWindow = 10 * time.Second

// Usage reads every writer's records of the current month.
func (l *Ledger) Usage(ctx context.Context, plan Plan) (Usage, error) {
	return ReadUsage(ctx, l.st, l.prefix, plan, l.now())
}

// ReadUsage reads the ledger in st under prefix (DefaultQuotaPrefix when empty) for the
// month of now, and sets the warnings of plan.
func ReadUsage(ctx context.Context, st store.Store, prefix string, plan Plan, now time.Time) (Usage, error) {
	if prefix == "" {
		prefix = DefaultQuotaPrefix
	}
	if plan.WarnAt <= 0 || plan.WarnAt > 1 {
		plan.WarnAt = 0.8
	}
	month := now.UTC().Format("2006-01")
	u := Usage{At: now, Plan: plan, Month: month, RateWindow: RateWindow}
	objs, err := store.ListAll(ctx, st, prefix+month)
	if err != nil {
		return u, fmt.Errorf("read the quota ledger: %w", err)
	}
	type key struct{ day, project string }
	per := map[key]*DayUsage{}
	for _, o := range objs {
		d, _, _ := strings.Cut(strings.TrimPrefix(o.Key, prefix), "/")
		var obj dayObject
		rc, _, err := st.Get(ctx, o.Key)
		if err == nil {
			err = json.NewDecoder(io.LimitReader(rc, 64<<20)).Decode(&obj)
			rc.Close()
		}
		if err != nil {
			u.UnreadableObjects++
			continue
		}
		for _, r := range obj.Sandboxes {
			if r == nil {
				continue
			}
			k := key{d, r.Project}
			if per[k] == nil {
				per[k] = &DayUsage{Day: d, Project: r.Project}
			}
			m := r.CPUMinutes(now)
			per[k].Creations++
			per[k].CPUMinutes += m
			u.Creations++
			u.CPUMinutes += m
			if r.Running(now) {
				u.Running++
			}
			if !r.StartedAt.After(now) && now.Sub(r.StartedAt) < RateWindow {
				u.RecentCreations++
			}
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(per), func(a, b key) int {
		if c := strings.Compare(a.day, b.day); c != 0 {
			return c
		}
		return strings.Compare(a.project, b.project)
	}) {
		u.Days = append(u.Days, *per[k])
	}
	u.Warnings = warnings(u, plan)
	return u, nil
}

// warnings names each limit the usage has reached WarnAt of; each starts with its kind
// and a colon.
func warnings(u Usage, plan Plan) []string {
	var w []string
	if l := plan.MonthlyCPUMinutes; l > 0 && u.CPUMinutes >= plan.WarnAt*l {
		w = append(w, fmt.Sprintf("monthly minutes: %.0f of %.0f CPU minutes used in %s (%.0f%%)", u.CPUMinutes, l, u.Month, 100*u.CPUMinutes/l))
	}
	if l := plan.ConcurrentSandboxes; l > 0 && float64(u.Running) >= plan.WarnAt*float64(l) {
		w = append(w, fmt.Sprintf("concurrent sandboxes: %d running of the plan's %d", u.Running, l))
	}
	if l := plan.CreationsPerSecond; l > 0 {
		rate := float64(u.RecentCreations) / u.RateWindow.Seconds()
		if rate >= plan.WarnAt*l {
			w = append(w, fmt.Sprintf("creation rate: %.1f sandboxes per second over the last %s, the plan allows %g", rate, u.RateWindow, l))
		}
	}
	return w
}

// QuotaReport reads the ledger kept in a data directory (OpenLedger's) for the month of
// now: what `toolhost quota` shows.
func QuotaReport(ctx context.Context, dataDir string, plan Plan, now time.Time) (Usage, error) {
	st, err := dir.New(filepath.Join(dataDir, "quota"))
	if err != nil {
		return Usage{}, fmt.Errorf("open the quota ledger: %w", err)
	}
	return ReadUsage(ctx, st, "e2b/", plan, now)
}

// WriteText writes the report as `toolhost quota` prints it.
func (u Usage) WriteText(w io.Writer) error {
	var b bytes.Buffer
	plan := u.Plan.Name
	if plan == "" {
		plan = "custom"
	}
	fmt.Fprintf(&b, "E2B usage in %s (UTC), plan %s, as counted by toolhost:\n", u.Month, plan)
	fmt.Fprintf(&b, "  sandboxes created  %d\n", u.Creations)
	if u.Plan.MonthlyCPUMinutes > 0 {
		fmt.Fprintf(&b, "  CPU minutes        %.2f of %.0f (%.0f%%)\n", u.CPUMinutes, u.Plan.MonthlyCPUMinutes, 100*u.CPUMinutes/u.Plan.MonthlyCPUMinutes)
	} else {
		fmt.Fprintf(&b, "  CPU minutes        %.2f\n", u.CPUMinutes)
	}
	if u.Plan.ConcurrentSandboxes > 0 {
		fmt.Fprintf(&b, "  running now        %d of %d\n", u.Running, u.Plan.ConcurrentSandboxes)
	} else {
		fmt.Fprintf(&b, "  running now        %d\n", u.Running)
	}
	fmt.Fprintf(&b, "  created in the last %s  %d\n", u.RateWindow, u.RecentCreations)
	if len(u.Days) > 0 {
		b.WriteString("\n")
		tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "day\tproject\tsandboxes\tCPU minutes\t")
		for _, d := range u.Days {
			p := d.Project
			if p == "" {
				p = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f\t\n", d.Day, p, d.Creations, d.CPUMinutes)
		}
		tw.Flush()
	}
	if u.UnreadableObjects > 0 {
		fmt.Fprintf(&b, "\n(%d ledger objects could not be read and are not counted)\n", u.UnreadableObjects)
	}
	for _, w := range u.Warnings {
		fmt.Fprintf(&b, "\nWARNING: %s\n", w)
	}
	_, err := w.Write(b.Bytes())
	return err
}
