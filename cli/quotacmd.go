package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/internal/module"
	"github.com/toolhost/toolhost/internal/sandbox/e2b"
)

func quotaCommand() *command {
	cmd := &command{
		words:   []string{"quota"},
		args:    "[--live]",
		summary: "E2B usage this month, as toolhost counted it",
		help: `E2B has no billing API, so toolhost counts every E2B sandbox it creates (project,
template, CPUs, start, end) in a ledger: data_dir/quota, or the store when store.kind
is s3 (hosts that share the bucket add up their figures). This prints the calendar
month's figures (UTC): sandboxes created and CPU minutes (lifetime times CPUs), per
day and project; the sandboxes running now and those created in the last 10 s; and
a WARNING for each limit of the plan (e2b.plan, e2b.monthly_cpu_minutes) at 80% or
more: monthly CPU minutes, concurrent sandboxes, creation rate. Creating a sandbox
logs the same warnings.

With --live it also asks E2B how many sandboxes of the API key's team run now (every
host and project, whoever made them).`,
		flags: func(fs *pflag.FlagSet) {
			fs.Bool("live", false, "also ask E2B how many of the team's sandboxes run now")
		},
		nargs:  [2]int{0, 0},
		report: true,
	}
	cmd.run = func(ctx context.Context, c *cli, _ []string) error {
		live, _ := c.flags.GetBool("live")
		st, err := c.newStorage(ctx, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		sec, ok := toolhost.ModuleConfig[e2b.Section](&c.cfg.Config, "e2b")
		if !ok {
			return errors.New("this build of toolhost has no e2b provider: quota counts E2B usage")
		}
		u, err := e2b.UsageOf(ctx, sec, module.Env{DataDir: c.cfg.DataDir, Store: st.Store(), StoreShared: st.Shared()}, time.Now())
		if err != nil {
			return fmt.Errorf("reading the E2B usage ledger: %w", err)
		}
		if !slices.Contains(toolhost.ProviderNamesOf(c.cfg.Sandbox.Provider), "e2b") {
			fmt.Fprintf(c.stderr, "note: sandbox.provider is %q: this configuration creates no E2B sandboxes\n", c.cfg.Sandbox.Provider)
		}
		if c.json() {
			type day struct {
				Day        string  `json:"day"`
				Project    string  `json:"project"`
				Creations  int     `json:"creations"`
				CPUMinutes float64 `json:"cpu_minutes"`
			}
			out := struct {
				Month             string   `json:"month"`
				Plan              string   `json:"plan"`
				Creations         int      `json:"creations"`
				CPUMinutes        float64  `json:"cpu_minutes"`
				MonthlyCPUMinutes float64  `json:"monthly_cpu_minutes,omitempty"`
				Running           int      `json:"running"`
				MaxRunning        int      `json:"max_running"`
				RecentCreations   int      `json:"recent_creations"`
				RateWindowSeconds float64  `json:"rate_window_seconds"`
				Days              []day    `json:"days"`
				Warnings          []string `json:"warnings"`
				UnreadableObjects int      `json:"unreadable_objects,omitempty"`
				LiveRunning       *int     `json:"live_running,omitempty"`
			}{Month: u.Month, Plan: u.Plan.Name, Creations: u.Creations, CPUMinutes: u.CPUMinutes,
				MonthlyCPUMinutes: u.Plan.MonthlyCPUMinutes, Running: u.Running, MaxRunning: u.Plan.ConcurrentSandboxes,
				RecentCreations: u.RecentCreations, RateWindowSeconds: u.RateWindow.Seconds(), Days: []day{},
				Warnings: append([]string{}, u.Warnings...), UnreadableObjects: u.UnreadableObjects}
			for _, d := range u.Days {
				out.Days = append(out.Days, day{d.Day, d.Project, d.Creations, d.CPUMinutes})
			}
			if live {
				lctx, cancel := context.WithTimeout(ctx, sec.RequestTimeout)
				defer cancel()
				n, err := e2b.RunningOf(lctx, sec)
				if err != nil {
					return fmt.Errorf("asking E2B how many sandboxes run: %w", err)
				}
				out.LiveRunning = &n
			}
			return writeJSON(c.stdout, out, true)
		}
		if err := u.WriteText(c.stdout); err != nil {
			return err
		}
		if live {
			lctx, cancel := context.WithTimeout(ctx, sec.RequestTimeout)
			defer cancel()
			n, err := e2b.RunningOf(lctx, sec)
			if err != nil {
				return fmt.Errorf("asking E2B how many sandboxes run: %w", err)
			}
			fmt.Fprintf(c.stdout, "\nrunning now at E2B (the team's, every host): %d\n", n)
		}
		return nil
	}
	return cmd
}
