package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost/audit"
)

func auditCommand() *command {
	cmd := &command{
		words:   []string{"audit"},
		args:    "[FILE]",
		summary: "show the audit of what plugins did, filtered",
		help: `Reads the audit (FILE, default audit.file: one JSON line per host call a plugin made
and one per tool call) and prints the records the filters select, as they are
(--format jsonl) or as a table (--format text).

--since and --until take a time (2026-11-21T10:00:00Z, or 2026-11-21) or a duration
before now (90m, 24h).

Examples:
  toolhost audit --decision deny                 # every refused host call
  toolhost audit --plugin editfile --since 1h --format text`,
		flags: func(fs *pflag.FlagSet) {
			fs.String("plugin", "", "only this plugin's records")
			fs.String("tool", "", "only the records of this tool's calls")
			fs.String("cap", "", "only this capability (sandbox_files, sandbox_exec, store, capture, or tool for the tool calls)")
			fs.String("decision", "", "only this decision: allow, deny or invalid")
			fs.String("since", "", "only records at or after this time, or this long ago")
			fs.String("until", "", "only records before this time, or this long ago")
			fs.String("format", "jsonl", "output: jsonl (the lines as they are) or text (a table)")
		},
		nargs: [2]int{0, 1},
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		var f audit.Filter
		f.Plugin, _ = c.flags.GetString("plugin")
		f.Tool, _ = c.flags.GetString("tool")
		f.Cap, _ = c.flags.GetString("cap")
		f.Decision, _ = c.flags.GetString("decision")
		switch f.Decision {
		case "", audit.Allow, audit.Deny, audit.Invalid:
		default:
			return usagef(cmd, "--decision must be allow, deny or invalid, got %q", f.Decision)
		}
		now := time.Now()
		for _, b := range []struct {
			flag string
			t    *time.Time
		}{{"since", &f.Since}, {"until", &f.Until}} {
			v, _ := c.flags.GetString(b.flag)
			if v == "" {
				continue
			}
			t, err := parseWhen(v, now)
			if err != nil {
				return usagef(cmd, "--%s: %v", b.flag, err)
			}
			*b.t = t
		}
		format, _ := c.flags.GetString("format")
		if format != "jsonl" && format != "text" {
			return usagef(cmd, "--format must be jsonl or text, got %q", format)
		}
		path := c.cfg.Audit.File
		if len(args) == 1 {
			path = args[0]
		}
		if path == "" {
			return usagef(cmd, "no audit file: name one, or set audit.file (--audit-file, TOOLHOST_AUDIT_FILE)")
		}
		file, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("reading the audit: %w", err)
		}
		defer file.Close()
		out := bufio.NewWriter(c.stdout)
		defer out.Flush()
		if format == "jsonl" {
			return audit.Read(file, f, func(_ *audit.Record, line []byte) error {
				out.Write(line)
				return out.WriteByte('\n')
			})
		}
		return printAuditTable(out, file, f)
	}
	return cmd
}

// parseWhen reads a time (RFC 3339, or a date) or a duration before now.
func parseWhen(v string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(v); err == nil {
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.Parse(layout, v); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is neither a time (2026-11-21T10:00:00Z, 2026-11-21) nor a duration (90m)", v)
}

// printAuditTable prints the selected records as a table: time, plugin, tool, capability
// and operation, decision, what the call acted on, its duration, and its status or why.
func printAuditTable(w io.Writer, r io.Reader, f audit.Filter) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tPLUGIN\tTOOL\tCALL\tDECISION\tON\tµs\tRESULT")
	err := audit.Read(r, f, func(rec *audit.Record, _ []byte) error {
		on := rec.Path
		switch {
		case len(rec.Argv) > 0:
			on = strings.Join(rec.Argv, " ")
		case rec.Port != 0:
			on = "port " + strconv.Itoa(rec.Port)
		case rec.Key != "":
			on = rec.Key
		}
		result := "ok"
		switch {
		case rec.Status != 0:
			result = fmt.Sprintf("%d: %s", rec.Status, rec.Error)
		case rec.Error != "":
			result = rec.Error
		case rec.IsError:
			result = "is_error"
		}
		if rec.Decision != audit.Allow {
			result += " (" + rec.Why + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s.%s\t%s\t%s\t%d\t%s\n", rec.Time.Local().Format("2006-01-02 15:04:05.000"),
			printable(rec.Plugin), printable(rec.Tool), printable(rec.Cap), printable(rec.Op), printable(rec.Decision),
			firstLine(printable(on), 60), rec.Micros, firstLine(printable(result), 100))
		return nil
	})
	tw.Flush()
	return err
}
