// Package cli is the toolhost command: its subcommands, its configuration loader and its
// MCP server, which runs an AI coding agent's tools as WebAssembly plugins inside
// sandboxes. cmd/toolhost is a main that calls Main; a custom build is another such main
// that imports its own modules beside it (docs/ARCHITECTURE.md, "A custom build").
//
//	toolhost tools [--format anthropic|openai|mcp|json] print the tool definitions
//	toolhost call TOOL 'JSON' [--workspace DIR]       run one tool call in the project's sandbox
//	toolhost session start|list|stop|commit           sessions held between calls (call --session ID)
//	toolhost demo                                     run a short scripted agent session
//	toolhost snapshot save|list|restore|delete|prune  workspace snapshots of a project
//	toolhost screenshot list                          a project's stored screenshots
//	toolhost quota [--live]                           E2B usage this month, as toolhost counted it
//	toolhost plugin inspect FILE.wasm                 show a plugin's manifest, imports and needs
//	toolhost plugin push|sign|add|upgrade|verify      publish, sign, install, upgrade plugins (OCI)
//	toolhost policy test CASES.yaml                   prove a tool policy holds
//	toolhost policy replay --audit FILE --config NEW  the recorded calls another policy decides otherwise
//	toolhost audit [FILE]                             show the audit of what plugins did
//	toolhost mcp [--workspace DIR]                    serve the tools to one MCP client on stdio
//	toolhost mcp config CLIENT                        the MCP configuration of Claude Code, Desktop, Cursor
//	toolhost serve [--listen ADDR]                    serve the tools over MCP (streamable HTTP)
//	toolhost doctor                                   what is installed and usable here, one line each
//	toolhost version                                  print the version (also --version)
//
// Configuration comes from built-in defaults, then a YAML file (--config, $TOOLHOST_CONFIG
// or ~/.config/toolhost/toolhost.yaml, never one in the working directory), then TOOLHOST_
// environment variables, then flags; see
// docs/CONFIG.md and toolhost.example.yaml at the repository root. Flags may come before or after the
// positional arguments.
//
// Everything the commands run is package toolhost (the module's root), which a program
// can embed instead; the built-in plugins are inside the binary.
package cli

import (
	stdcmp "cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/cli/internal/config"
	"github.com/toolhost/toolhost/internal/telemetry"
)

// traceFlushBound bounds the export of the last spans at exit.
const traceFlushBound = 5 * time.Second

// Exit codes.
const (
	exitOK          = 0
	exitFailure     = 1 // the host could not do what was asked
	exitUsage       = 2 // the command line or the configuration is wrong
	exitInterrupted = 130
)

// Main runs the toolhost command with the process's arguments and standard streams, and
// exits with its status: 0, 1 when the host could not do what was asked, 2 for a wrong
// command line or configuration, 130 when interrupted. It first calls toolhost.Reexec (the
// sandbox agent and the browser's wrapper are this binary, re-executed), so a main calls
// Main first and does nothing else. The providers and stores the command offers are those
// registered when it runs: cmd/toolhost imports modules/standard for the built-in ones.
func Main() {
	toolhost.Reexec()
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// command is one subcommand.
type command struct {
	words   []string // "tools", or "plugin", "inspect"
	args    string   // positional arguments, for the usage line
	summary string   // one line for the command list
	help    string   // more, for --help
	flags   func(fs *pflag.FlagSet)
	nargs   [2]int // min and max positional arguments
	// noConfig commands run without loading the configuration.
	noConfig bool
	// report: the command lists or reports, and takes --format text|json (json: one JSON
	// document on stdout, for scripts).
	report bool
	// traces: the command runs tool calls, traced when the OTEL_* environment asks for it
	// (package telemetry).
	traces bool
	run    func(ctx context.Context, c *cli, args []string) error
}

func (cmd *command) name() string { return strings.Join(cmd.words, " ") }

// addFlags adds the command's own flags to fs (--format for a report).
func (cmd *command) addFlags(fs *pflag.FlagSet) {
	if cmd.flags != nil {
		cmd.flags(fs)
	}
	if cmd.report && fs.Lookup("format") == nil {
		fs.String("format", "text", "output: text or json")
	}
}

func (cmd *command) usage() string {
	u := "toolhost " + cmd.name()
	if cmd.args != "" {
		u += " " + cmd.args
	}
	return u
}

func commands() []*command {
	return []*command{toolsCommand(), callCommand(), demoCommand(),
		snapshotSaveCommand(), snapshotListCommand(), snapshotRestoreCommand(), snapshotDeleteCommand(),
		snapshotPruneCommand(), snapshotVerifyCommand(), snapshotReleaseCommand(), snapshotDiffCommand(), snapshotExportCommand(), snapshotImportCommand(),
		snapshotForkCommand(), snapshotRewindCommand(), snapshotMergeCommand(), snapshotGCCommand(),
		screenshotListCommand(), quotaCommand(), fleetStatusCommand(),
		inspectCommand(), pluginPushCommand(), pluginSignCommand(), pluginAddCommand(), pluginUpgradeCommand(), pluginVerifyCommand(),
		policyTestCommand(), policyReplayCommand(), auditCommand(), versionCommand(),
		mcpConfigCommand(), mcpCommand(), serveCommand(),
		sessionStartCommand(), sessionListCommand(), sessionStopCommand(), sessionCommitCommand(),
		doctorCommand(), completionCommand()}
}

// json reports whether the command was asked for JSON (--format json).
func (c *cli) json() bool {
	f, _ := c.flags.GetString("format")
	return f == "json"
}

// cli is what a command runs with.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	flags          *pflag.FlagSet
	cfg            *config.Loaded
	log            *slog.Logger
	// noDaemon: a plain call found no session daemon on this user's socket (none runs),
	// so it may start one once it has answered (settleOneShot).
	noDaemon bool
}

// usageError is a mistake on the command line: exit 2 and a pointer to --help.
type usageError struct {
	cmd string
	msg string
}

func (e *usageError) Error() string { return e.msg }

func usagef(cmd *command, format string, args ...any) error {
	return &usageError{cmd: cmd.name(), msg: fmt.Sprintf(format, args...)}
}

// run is main without the process: it returns the exit code.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "__complete" {
		return runComplete(args[1:], stdout)
	}
	cmds := commands()

	// First pass: a flag set that knows every flag of every command, only to tell flags
	// and their values from the positional arguments that name the command.
	all := pflag.NewFlagSet("toolhost", pflag.ContinueOnError)
	all.SetOutput(io.Discard)
	all.Usage = func() {}
	globalFlags(all)
	for _, cmd := range cmds {
		fs := pflag.NewFlagSet("", pflag.ContinueOnError)
		cmd.addFlags(fs)
		fs.VisitAll(func(f *pflag.Flag) {
			if all.Lookup(f.Name) == nil {
				all.AddFlag(f)
			}
		})
	}
	if err := all.Parse(args); err != nil {
		fmt.Fprintf(stderr, "toolhost: %v%s (see toolhost --help)\n", err, flagHint(err, all))
		return exitUsage
	}
	pos := all.Args()
	wantHelp, _ := all.GetBool("help")
	if v, _ := all.GetBool("version"); v && !wantHelp {
		printVersion(stdout)
		return exitOK
	}

	if len(pos) == 0 {
		if wantHelp {
			mainUsage(stdout, cmds)
			return exitOK
		}
		mainUsage(stderr, cmds)
		return exitUsage
	}
	if pos[0] == "help" {
		if len(pos) == 1 {
			mainUsage(stdout, cmds)
			return exitOK
		}
		if len(pos) == 2 && pos[1] == "flags" {
			flagsUsage(stdout)
			return exitOK
		}
		pos, wantHelp = pos[1:], true
	}
	cmd, err := findCommand(cmds, pos)
	if err != nil {
		if group := groupOf(cmds, pos[0]); wantHelp && len(pos) == 1 && len(group) > 0 {
			groupUsage(stdout, pos[0], group)
			return exitOK
		}
		fmt.Fprintf(stderr, "toolhost: %v (see toolhost --help)\n", err)
		return exitUsage
	}

	// Second pass: only this command's flags and the global ones.
	fs := pflag.NewFlagSet("toolhost "+cmd.name(), pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	globalFlags(fs)
	cmd.addFlags(fs)
	if err := fs.Parse(args); err != nil {
		fmt.Fprintf(stderr, "toolhost %s: %v%s (see toolhost %s --help)\n", cmd.name(), err, flagHint(err, fs), cmd.name())
		return exitUsage
	}
	if h, _ := fs.GetBool("help"); h || wantHelp {
		commandUsage(stdout, cmd)
		return exitOK
	}
	rest := fs.Args()
	if rest[0] == "help" {
		rest = rest[1:]
	}
	rest = rest[len(cmd.words):]
	if len(rest) < cmd.nargs[0] || len(rest) > cmd.nargs[1] {
		fmt.Fprintf(stderr, "toolhost %s: %s (usage: %s)\n", cmd.name(), argCountMessage(cmd, rest), cmd.usage())
		return exitUsage
	}

	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr, flags: fs}
	if cmd.report {
		if f, _ := fs.GetString("format"); f != "text" && f != "json" {
			fmt.Fprintf(stderr, "toolhost %s: --format must be text or json, got %q (see toolhost %s --help)\n", cmd.name(), f, cmd.name())
			return exitUsage
		}
	}
	if !cmd.noConfig {
		l, err := config.Load(config.Sources{Flags: fs})
		if err != nil {
			fmt.Fprintf(stderr, "toolhost: %s\n", oneLine(err))
			return exitUsage
		}
		c.cfg = l
		// The plugin commands report a module that differs from the lock themselves.
		if cmd.words[0] != "plugin" {
			if err := checkLock(l); err != nil {
				fmt.Fprintf(stderr, "toolhost %s: %s\n", cmd.name(), oneLine(err))
				return exitFailure
			}
		}
		c.log = slog.New(logHandler(stderr, l.LogFormat, l.Level()))
		slog.SetDefault(c.log)
		if l.File != "" {
			c.log.Debug("config file", "path", l.File)
		}
	} else {
		c.log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// After the first signal, cleanup runs (bounded); a second one kills the process.
	context.AfterFunc(ctx, stop)
	if cmd.traces {
		tr, err := telemetry.Start(ctx, telemetry.Service{Version: toolhost.ReadBuildInfo().Version}, c.log)
		if err != nil {
			fmt.Fprintf(stderr, "toolhost %s: %s\n", cmd.name(), oneLine(err))
			return exitUsage
		}
		defer func() {
			// The spans not yet sent go before the process does, waiting at most this long
			// for a collector that does not answer.
			sctx, cancel := context.WithTimeout(context.Background(), traceFlushBound)
			defer cancel()
			if err := tr.Shutdown(sctx); err != nil {
				c.log.Warn("traces: the last spans could not be exported", "err", err)
			}
		}()
	}
	err = cmd.run(ctx, c, rest)
	switch {
	case err == nil:
		return exitOK
	case ctx.Err() != nil:
		fmt.Fprintf(stderr, "toolhost %s: interrupted\n", cmd.name())
		return exitInterrupted
	}
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "toolhost %s: %s (see toolhost %s --help)\n", ue.cmd, oneLine(ue), ue.cmd)
		return exitUsage
	}
	fmt.Fprintf(stderr, "toolhost %s: %s\n", cmd.name(), oneLine(err))
	return exitFailure
}

func argCountMessage(cmd *command, rest []string) string {
	if len(rest) > cmd.nargs[1] {
		return fmt.Sprintf("unexpected argument %q", rest[cmd.nargs[1]])
	}
	if cmd.args != "" {
		return "missing arguments"
	}
	return "missing argument"
}

// findCommand picks the command named by the leading positional arguments.
func findCommand(cmds []*command, pos []string) (*command, error) {
	var names, family []string
	for _, cmd := range cmds {
		if len(pos) >= len(cmd.words) && equalWords(cmd.words, pos[:len(cmd.words)]) {
			return cmd, nil
		}
		if cmd.words[0] == pos[0] { // "plugin" alone, or "plugin frobnicate"
			family = append(family, cmd.name())
		}
		names = append(names, cmd.name())
	}
	switch {
	case len(family) > 0 && len(pos) == 1:
		return nil, fmt.Errorf("%q needs a subcommand: %s", pos[0], strings.Join(family, ", "))
	case len(family) == 1:
		return nil, fmt.Errorf("unknown command %q (did you mean %q?)", strings.Join(pos[:2], " "), family[0])
	case len(family) > 1:
		var subs []string
		for _, f := range family {
			subs = append(subs, strings.TrimPrefix(f, pos[0]+" "))
		}
		if near := closest(pos[1], subs); len(near) > 0 {
			return nil, fmt.Errorf("unknown command %q (did you mean %q?)", strings.Join(pos[:2], " "), pos[0]+" "+near[0])
		}
		return nil, fmt.Errorf("unknown command %q (%s commands: %s)", strings.Join(pos[:2], " "), pos[0], strings.Join(family, ", "))
	}
	var first []string
	for _, cmd := range cmds {
		if !slices.Contains(first, cmd.words[0]) {
			first = append(first, cmd.words[0])
		}
	}
	if near := closest(pos[0], first); len(near) > 0 {
		return nil, fmt.Errorf("unknown command %q (did you mean %s?)", pos[0], quoteOr(near))
	}
	return nil, fmt.Errorf("unknown command %q (commands: %s)", pos[0], strings.Join(names, ", "))
}

// groupOf is the commands whose first word is word: "snapshot save", "snapshot list"...
func groupOf(cmds []*command, word string) []*command {
	var out []*command
	for _, cmd := range cmds {
		if len(cmd.words) > 1 && cmd.words[0] == word {
			out = append(out, cmd)
		}
	}
	return out
}

// groupUsage is the help of a command group: its commands, one line each.
func groupUsage(w io.Writer, word string, group []*command) {
	fmt.Fprintf(w, "Usage: toolhost %s COMMAND [ARGS] [FLAGS]\n\nCommands:\n", word)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, cmd := range group {
		fmt.Fprintf(tw, "  %s\t%s\n", strings.TrimPrefix(cmd.usage(), "toolhost "), cmd.summary)
	}
	tw.Flush()
	fmt.Fprintf(w, "\n\"toolhost %s COMMAND --help\" shows a command's flags.\n", word)
}

func equalWords(a, b []string) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// globalFlags are accepted by every command: --help, --version and the configuration's
// flags.
func globalFlags(fs *pflag.FlagSet) {
	fs.BoolP("help", "h", false, "show help")
	fs.Bool("version", false, "print the version and exit")
	config.RegisterFlags(fs)
}

func mainUsage(w io.Writer, cmds []*command) {
	fmt.Fprintf(w, `toolhost runs an AI coding agent's tools as WebAssembly plugins inside sandboxes.

Usage:
  toolhost COMMAND [ARGS] [FLAGS]

Commands:
`)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, cmd := range cmds {
		fmt.Fprintf(tw, "  %s\t%s\n", strings.TrimPrefix(cmd.usage(), "toolhost "), cmd.summary)
	}
	tw.Flush()
	fmt.Fprintf(w, `
Flags may come before or after the arguments. "toolhost COMMAND --help" shows a
command's flags; "toolhost help flags" the global ones (every configuration key has
one); "toolhost completion bash|zsh|fish" prints a shell completion script.

Configuration: defaults < YAML file (--config, $TOOLHOST_CONFIG, else
~/.config/toolhost/toolhost.yaml; never ./toolhost.yaml: a directory the CLI mounts as
a workspace is the sandbox's to write) < TOOLHOST_ environment variables < flags.
Every key is described in docs/CONFIG.md and toolhost.example.yaml.
`)
}

// flagsUsage is toolhost help flags: the flags every command takes.
func flagsUsage(w io.Writer) {
	fmt.Fprintf(w, `Global flags, taken by every command: --help, --version, --config FILE, and one
flag per configuration key (its variable is TOOLHOST_ and the key in upper case, dots
as underscores; docs/CONFIG.md has them all).

%s`, globalUsage())
}

func globalUsage() string {
	fs := pflag.NewFlagSet("", pflag.ContinueOnError)
	globalFlags(fs)
	return fs.FlagUsages()
}

func commandUsage(w io.Writer, cmd *command) {
	fmt.Fprintf(w, "Usage: %s [FLAGS]\n\n%s\n", cmd.usage(), cmd.summary)
	if cmd.help != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(cmd.help))
	}
	fs := pflag.NewFlagSet("", pflag.ContinueOnError)
	cmd.addFlags(fs)
	if fs.HasFlags() {
		fmt.Fprintf(w, "\nFlags:\n%s", fs.FlagUsages())
	}
	if !cmd.noConfig {
		fmt.Fprintf(w, "\nGlobal flags (--config FILE, --project ID, --log-level, and one per configuration key):\n  toolhost help flags\n")
	}
}

// logHandler writes records at level and above to w as text or JSON lines.
func logHandler(w io.Writer, format string, level slog.Level) slog.Handler {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.NewJSONHandler(w, opts)
	}
	return slog.NewTextHandler(w, opts)
}

// oneLine folds a message onto one line, for errors on stderr.
func oneLine(err error) string {
	return printable(strings.Join(strings.Fields(err.Error()), " "))
}

// printable escapes what a terminal would act on (escape sequences, other control
// characters) in text that may carry names from a workspace or a store, as Go escapes
// them in a quoted string.
func printable(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if unicode.IsPrint(r) {
			b.WriteRune(r)
			continue
		}
		q := strconv.QuoteRune(r)
		b.WriteString(q[1 : len(q)-1])
	}
	return b.String()
}

func versionCommand() *command {
	return &command{
		words:    []string{"version"},
		summary:  "print the version",
		noConfig: true,
		help: `Prints the module version (v1.2.3 for go install ...@v1.2.3; a pseudo-version, or
(devel), for a build from a clone), the VCS revision the binary was built from when the
build recorded it, the plugin ABI version and the Go toolchain.`,
		report: true,
		run: func(_ context.Context, c *cli, _ []string) error {
			if c.json() {
				bi := toolhost.ReadBuildInfo()
				return writeJSON(c.stdout, struct {
					Version  string `json:"version"`
					Revision string `json:"revision,omitempty"`
					Modified bool   `json:"modified,omitempty"`
					ABI      int    `json:"abi"`
					Go       string `json:"go"`
					OS       string `json:"os"`
					Arch     string `json:"arch"`
				}{stdcmp.Or(bi.Version, "(devel)"), bi.Revision, bi.Modified, abi.Version, bi.Go, runtime.GOOS, runtime.GOARCH}, true)
			}
			printVersion(c.stdout)
			return nil
		},
	}
}

// printVersion prints what debug.ReadBuildInfo says of this binary.
func printVersion(w io.Writer) {
	bi := toolhost.ReadBuildInfo()
	v := bi.Version
	if v == "" {
		v = "(devel)"
	}
	var details []string
	if bi.Revision != "" {
		rev := "revision " + bi.Revision
		if bi.Modified {
			rev += " (modified)"
		}
		details = append(details, rev)
	}
	details = append(details, fmt.Sprintf("plugin ABI v%d", abi.Version), fmt.Sprintf("%s %s/%s", bi.Go, runtime.GOOS, runtime.GOARCH))
	fmt.Fprintf(w, "toolhost %s (%s)\n", v, strings.Join(details, ", "))
}
