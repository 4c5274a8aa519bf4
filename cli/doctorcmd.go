package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/toolhost/toolhost"
)

func doctorCommand() *command {
	cmd := &command{
		words:   []string{"doctor"},
		summary: "what is installed and usable here, one line each",
		help: `Checks, for real, what this configuration needs on this machine, one line each:
ok, FAIL (needed: the command exits 1) or warn (the rest works without it), with what
was found or what to do:
  plugins   loads and compiles them (filling the compilation cache)
  sandbox   starts a tiny local sandbox (bubblewrap, user namespaces) and runs a command
  limits    how each sandbox limit is enforced here (cgroup v1 or v2, tmpfs, volumes)
  python3   in the sandbox, for the demo's dev server
  owners    as root: whether host directories keep their owners (idmapped mounts on the
            workspace dir and the current directory), or need --adopt
  browser   Chromium and the Playwright driver, for screenshots
  store     writes, reads and deletes a probe object (credentials, bucket, endpoint)
  lease     whether the store keeps project leases (conditional writes)
  e2b       whether E2B accepts the API key (only when sandbox.provider names e2b)
The sandbox lines appear when sandbox.provider names local.`,
		nargs:  [2]int{0, 0},
		report: true,
	}
	cmd.run = func(ctx context.Context, c *cli, _ []string) error {
		checks := toolhost.Doctor(ctx, c.cfg.Config, c.options()...)
		if c.json() {
			type check struct {
				Name   string `json:"name"`
				Status string `json:"status"` // ok, warn or fail
				Needed bool   `json:"needed"`
				Detail string `json:"detail"`
			}
			out := struct {
				OK     bool    `json:"ok"`
				Checks []check `json:"checks"`
			}{OK: true, Checks: []check{}}
			for _, ch := range checks {
				st := "ok"
				switch {
				case !ch.OK && ch.Needed:
					st, out.OK = "fail", false
				case !ch.OK:
					st = "warn"
				}
				out.Checks = append(out.Checks, check{ch.Name, st, ch.Needed, ch.Detail})
			}
			if err := writeJSON(c.stdout, out, true); err != nil {
				return err
			}
			if !out.OK {
				return errors.New("a needed check failed (see the JSON)")
			}
			return nil
		}
		tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
		var failed []string
		for _, ch := range checks {
			status := "ok"
			switch {
			case !ch.OK && ch.Needed:
				status = "FAIL"
				failed = append(failed, ch.Name)
			case !ch.OK:
				status = "warn"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", status, ch.Name, printable(ch.Detail))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if len(failed) > 0 {
			return fmt.Errorf("%s: needed and not usable (the lines above say what to do)", strings.Join(failed, ", "))
		}
		return nil
	}
	return cmd
}
