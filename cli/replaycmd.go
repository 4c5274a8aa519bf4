package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost/cli/internal/config"
	"github.com/toolhost/toolhost/internal/builtins"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/policyreplay"
)

func policyReplayCommand() *command {
	cmd := &command{
		words:   []string{"policy", "replay"},
		summary: "list the recorded host calls another configuration would decide otherwise",
		help: `Reads the audit file (audit.file) a session recorded and decides each host call
in it again under the plugins, grants and scopes of another configuration file: lists
each call whose decision would change (allowed then, refused now, or the reverse),
with the rule that decides it now (--config names that configuration), so that a tightened policy shows what it breaks
before it breaks. Exits 1 when any would change. Symbolic links are not looked at
again (the sandbox is gone); a path the audit cut is decided as cut.`,
		nargs:  [2]int{0, 0},
		report: true,
		flags: func(fs *pflag.FlagSet) {
			fs.String("audit", "", "the audit file to replay")
		},
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		auditFile, _ := c.flags.GetString("audit")
		l := c.cfg
		cfgFile := l.File
		if auditFile == "" || cfgFile == "" {
			return usagef(cmd, "--audit FILE and --config FILE (the configuration whose policy decides) are both required")
		}
		plugins := map[string]policyreplay.Plugin{}
		for i, p := range l.Plugins {
			wasm, err := pluginBytes(l, p.Path)
			if err != nil {
				return fmt.Errorf("%s: plugins[%d]: %w", cfgFile, i, err)
			}
			in, err := host.Inspect(ctx, wasm)
			if err != nil {
				return fmt.Errorf("%s: plugins[%d] (%s): %w", cfgFile, i, p.Path, err)
			}
			plugins[in.Manifest.Name] = policyreplay.Plugin{Grants: p.Grants, Scope: p.Scope}
		}
		f, err := os.Open(auditFile)
		if err != nil {
			return err
		}
		defer f.Close()
		changed, st, err := policyreplay.Replay(f, plugins)
		if err != nil {
			return fmt.Errorf("%s: %w", auditFile, err)
		}
		if c.json() {
			if changed == nil {
				changed = []policyreplay.Changed{}
			}
			if err := writeJSON(c.stdout, struct {
				Changed []policyreplay.Changed `json:"changed"`
				Stats   policyreplay.Stats     `json:"stats"`
			}{changed, st}, true); err != nil {
				return err
			}
		} else {
			for _, ch := range changed {
				r := ch.Record
				fmt.Fprintf(c.stdout, "line %d: %s %s %s.%s %s: %s -> %s (%s)\n", ch.Line, r.Plugin, r.Tool, r.Cap, r.Op,
					callTarget(r.Path, r.Argv, r.Port, r.Key), r.Decision, ch.Now, ch.Why)
			}
			fmt.Fprintf(c.stdout, "%d of %d host calls would be decided otherwise (%d records skipped)\n", st.Changed, st.Calls, st.Skipped)
		}
		if st.Changed > 0 {
			return fmt.Errorf("%d recorded calls would be decided otherwise under %s", st.Changed, cfgFile)
		}
		return nil
	}
	return cmd
}

func callTarget(path string, argv []string, port int, key string) string {
	switch {
	case len(argv) > 0:
		return strings.Join(argv, " ")
	case port != 0:
		return fmt.Sprintf("port %d", port)
	case key != "":
		return key
	}
	return path
}

// pluginBytes reads a configured plugin's module: a file, or a built-in.
func pluginBytes(l *config.Loaded, path string) ([]byte, error) {
	switch {
	case filepath.IsAbs(path):
	case l.PluginsDir != "":
		path = filepath.Join(l.PluginsDir, path)
	default:
		return builtins.Wasm(path)
	}
	return os.ReadFile(path)
}
