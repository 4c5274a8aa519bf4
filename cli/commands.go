package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/experimental"
	"github.com/toolhost/toolhost/internal/builtins"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/mcpserve"
)

// writeJSON writes v as JSON, indented or on one line, without escaping <, > and & (tool
// output is full of them).
func writeJSON(w io.Writer, v any, indent bool) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if indent {
		enc.SetIndent("", "  ")
	}
	return enc.Encode(v)
}

// toolFormats are the formats of toolhost tools, in the order the help names them.
var toolFormats = []string{"anthropic", "openai", "mcp", "json"}

func toolsCommand() *command {
	cmd := &command{
		words:   []string{"tools"},
		args:    "",
		summary: "print the tool definitions of the loaded plugins",
		help: `--format anthropic (the default) prints a JSON array of {"name", "description",
"input_schema"}, ready for the "tools" of an Anthropic Messages API request.
--format openai prints a JSON array of {"type": "function", "function": {"name",
"description", "parameters"}}, the "tools" of an OpenAI Chat Completions request.
--format mcp prints the tools toolhost mcp lists in answer to an MCP tools/list request:
{"tools": [{"name", "title", "description", "inputSchema", "outputSchema"?,
"annotations"}, ...]}, the plugins' tools and the server's own (commit, checkpoints,
rewind).
--format json prints the plugins with their versions, grants, imports and tools.
--warm compiles every plugin into the compilation cache first (make build does it), so
that no first call runs a plugin in its slower interpreted form.`,
		flags: func(fs *pflag.FlagSet) {
			fs.String("format", "anthropic", "output format: "+strings.Join(toolFormats, ", "))
			fs.Bool("warm", false, "compile every plugin into the compilation cache first")
		},
		nargs: [2]int{0, 0},
	}
	cmd.run = func(ctx context.Context, c *cli, _ []string) error {
		format, _ := c.flags.GetString("format")
		if !slices.Contains(toolFormats, format) {
			return usagef(cmd, "--format must be one of %s, got %q", strings.Join(toolFormats, ", "), format)
		}
		th, err := c.newToolhost(ctx)
		if err != nil {
			return err
		}
		defer c.closeToolhost(ctx, th)
		if warm, _ := c.flags.GetBool("warm"); warm {
			if err := experimental.CompilePlugins(ctx, th); err != nil {
				return err
			}
		}
		tools := th.Tools()
		if tools == nil {
			tools = []abi.Tool{}
		}
		switch format {
		case "openai":
			return writeJSON(c.stdout, openAITools(tools), true)
		case "mcp":
			// The tools alone: the rest of the answer (cache hints, server info) depends on
			// the client's revision.
			res, err := mcpserve.New(th, mcpserve.Options{Logger: c.log}).ListTools(ctx)
			if err != nil {
				return err
			}
			return writeJSON(c.stdout, struct {
				Tools []*mcp.Tool `json:"tools"`
			}{res.Tools}, true)
		case "json":
			return writeJSON(c.stdout, pluginsJSON(th), true)
		}
		return writeJSON(c.stdout, anthropicTools(tools), true)
	}
	return cmd
}

// anthropicTool is a tool of an Anthropic Messages request: exactly name, description
// and input_schema (the API refuses other members, such as a tool's output_schema).
type anthropicTool struct {
	Name        string      `json:"name"`
	Description string      `json:"description"`
	InputSchema abi.RawJSON `json:"input_schema"`
}

func anthropicTools(tools []abi.Tool) []anthropicTool {
	out := make([]anthropicTool, 0, len(tools))
	for _, t := range tools {
		out = append(out, anthropicTool{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema})
	}
	return out
}

// openAITool is a function tool of an OpenAI Chat Completions request.
type openAITool struct {
	Type     string         `json:"type"` // always "function"
	Function openAIFunction `json:"function"`
}

type openAIFunction struct {
	Name        string      `json:"name"`
	Description string      `json:"description"`
	Parameters  abi.RawJSON `json:"parameters"`
}

func openAITools(tools []abi.Tool) []openAITool {
	out := make([]openAITool, 0, len(tools))
	for _, t := range tools {
		out = append(out, openAITool{Type: "function",
			Function: openAIFunction{Name: t.Name, Description: t.Description, Parameters: t.InputSchema}})
	}
	return out
}

type pluginJSON struct {
	Name    string           `json:"name"`
	Version string           `json:"version"`
	Path    string           `json:"path"`
	Grants  []abi.Capability `json:"grants"`
	Imports []string         `json:"imports"`
	Tools   []abi.Tool       `json:"tools"`
}

func pluginsJSON(h *toolhost.Toolhost) []pluginJSON {
	defs := map[string]abi.Tool{}
	for _, t := range h.Tools() {
		defs[t.Name] = t
	}
	out := []pluginJSON{}
	for _, p := range h.Plugins() {
		pj := pluginJSON{Name: p.Name, Version: p.Version, Path: p.Path,
			Grants: p.Grants, Imports: importNames(p.Imports), Tools: []abi.Tool{}}
		if pj.Grants == nil {
			pj.Grants = []abi.Capability{}
		}
		for _, name := range p.Tools {
			pj.Tools = append(pj.Tools, defs[name])
		}
		out = append(out, pj)
	}
	return out
}

func hostImportNames(imps []host.Import) []string {
	out := make([]string, 0, len(imps))
	for _, im := range imps {
		out = append(out, im.Module+"."+im.Name)
	}
	return out
}

func importNames(imps []toolhost.PluginImport) []string {
	out := make([]string, 0, len(imps))
	for _, im := range imps {
		out = append(out, im.Module+"."+im.Name)
	}
	return out
}

func callCommand() *command {
	cmd := &command{
		words:   []string{"call"},
		traces:  true,
		args:    "TOOL JSON",
		summary: "run one tool call in a sandbox and print its result",
		help: `Runs TOOL with the JSON input ("-" reads it from stdin) in a sandbox of the
configured project and prints the result as JSON: {"content":[...],"is_error":bool}.

With --session ID the call runs in that held session (toolhost session start),
whose sandbox, background processes and workspace stay between calls. Without it,
when the project has exactly one held session, the call runs there.

Otherwise, without --workspace the call runs in the project's own private workspace: the
session wakes from the project's newest snapshot, and the workspace is saved as a new
snapshot after the call (unless nothing changed), so consecutive calls see each
other's files while nothing of the current directory is ever mounted. With
--workspace DIR, the sandbox's /home/user is DIR itself (used as it is, nothing is
restored into it or saved); a DIR that holds the config file, the data dir, a plugin
or the browser is refused, since a sandbox can rewrite its workspace.
take_screenshot stores its images under the project (see toolhost screenshot list).

When this user's session daemon runs with the same configuration, it runs the call
(as this process would, with the plugins it has loaded); a call that found none starts
one, for the next calls, once it has printed. --daemon-calls=false
(serve.daemon_calls) turns both off.

Exit status: 0 when the tool ran, even if its result is an error (is_error: true);
1 when the host could not run it (no sandbox, a plugin failure); 2 for a usage
mistake (bad JSON, unknown tool). Reasons go to stderr on one line.

Example:
  toolhost call write_file '{"path":"notes.txt","content":"hi\n"}' --workspace /tmp/ws`,
		flags: func(fs *pflag.FlagSet) {
			fs.StringP("workspace", "w", "", "host directory mounted at /home/user (default: the project's private workspace, carried by its snapshots)")
			fs.StringP("session", "s", "", "run the call in this held session (toolhost session start)")
		},
		nargs: [2]int{2, 2},
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		tool, input := args[0], []byte(args[1])
		if args[1] == "-" {
			b, err := io.ReadAll(c.stdin)
			if err != nil {
				return fmt.Errorf("reading the input from stdin: %w", err)
			}
			input = b
		}
		if err := checkJSON(input); err != nil {
			return usagef(cmd, "%v", err)
		}
		ws, _ := c.flags.GetString("workspace")
		sid, _ := c.flags.GetString("session")
		if sid != "" {
			if ws != "" {
				return usagef(cmd, "--session and --workspace: a session has its workspace already")
			}
			cl, _, err := c.sessionClient()
			if err != nil {
				return err
			}
			defer cl.Close()
			return c.callHeld(ctx, cmd, cl, sid, tool, input)
		}
		if ws != "" {
			var err error
			if ws, err = workspaceDir(ws); err != nil {
				return usagef(cmd, "--workspace: %v", err)
			}
			if err := c.cfg.CheckWorkspace(ws, c.cfg.File); err != nil {
				return usagef(cmd, "--workspace: %v", err)
			}
		}
		// The project's one held session, if it has one, takes the call: the project's
		// lease is the daemon's, and its sandbox has the state the user means. Without one,
		// a daemon of this configuration runs the call as this process would, with the
		// plugins it has loaded (serve.daemon_calls).
		cl, id, err := c.projectSession(ctx, cmd, ws)
		if err != nil {
			return err
		}
		if cl != nil {
			defer cl.Close()
			if id != "" {
				c.log.Debug("call: the project's held session takes it", "session", id)
				return c.callHeld(ctx, cmd, cl, id, tool, input)
			}
			if c.cfg.Serve.DaemonCalls {
				if served, err := c.callDaemon(ctx, cmd, cl, ws, tool, input); served {
					return err
				}
			}
		}

		oneShotGuard(&c.cfg.Config)
		oneShotGC()
		// One call: only its own plugin is compiled (from the cache, or interpreted when
		// it was never compiled here), not every plugin in the background.
		th, err := toolhost.New(ctx, c.cfg.Config, append(c.options(), experimental.OneShot())...)
		if err != nil {
			return err
		}
		defer c.closeToolhost(ctx, th)
		// A plugin never compiled here answers in its interpreted form; once the result
		// is printed and the sandbox closed, the session daemon is started for the next
		// call, which compiles it, or (serve.daemon_calls false, or a daemon of another
		// configuration runs) its compile is handed to a process of its own: this one
		// exits, and the next call finds it in the cache. A call that did not answer (no
		// sandbox, an unknown tool) starts no daemon: its next call would fail the same way.
		answered := false
		defer func() { c.settleOneShot(ctx, th, answered) }()
		err = c.oneShot(ctx, th, c.cfg.Project, ws, tool, input, c.quietLog(), func(res abi.Result) error {
			answered = true
			return writeJSON(c.stdout, res, false)
		})
		if _, ok := errors.AsType[*errUnknownTool](err); ok {
			return usagef(cmd, "%v", err)
		}
		return err
	}
	return cmd
}

// errUnknownTool: a one-shot call names no tool of the plugins.
type errUnknownTool struct {
	tool  string
	tools []abi.Tool
}

func (e *errUnknownTool) Error() string {
	return fmt.Sprintf("unknown tool %q (tools: %s)", e.tool, strings.Join(toolNames(e.tools), ", "))
}

// oneShot is a plain `toolhost call`, wherever it runs (in its own process, or in the
// session daemon for one: callDaemon): a session of project of its own on th, on the
// host directory ws or (ws "") the project's private workspace, woken from its newest
// snapshot and committed after the call; the call; its result handed to deliver, then
// the session closed. An unknown tool is an *errUnknownTool.
func (c *cli) oneShot(ctx context.Context, th *toolhost.Toolhost, project, ws, tool string, input []byte, log *slog.Logger, deliver func(abi.Result) error) error {
	if !slices.ContainsFunc(th.Tools(), func(t abi.Tool) bool { return t.Name == tool }) {
		return &errUnknownTool{tool, th.Tools()}
	}
	experimental.Prepare(th, tool) // its plugin gets ready while the sandbox starts
	// With a host directory, the session's sandboxes use it as their workspace: the call
	// acts on it, and nothing is restored into it. Without, the session wakes the
	// project's private workspace from its newest snapshot and saves it after the call.
	// (A one-shot call never lives long enough to rotate.)
	sess, err := th.Open(ctx, toolhost.SessionOptions{Project: project, Workspace: ws, Logger: log})
	if err != nil {
		return err
	}
	defer c.closeSession(ctx, sess)

	res, err := sess.Dispatch(ctx, tool, json.RawMessage(input))
	if err != nil {
		return fmt.Errorf("%s: %w", tool, err)
	}
	if ws == "" {
		if _, err := sess.Commit(ctx, "call "+tool); err != nil {
			return fmt.Errorf("%s ran, but saving the project's workspace failed: %w", tool, err)
		}
	}
	if res.Content == nil {
		res.Content = []abi.Content{}
	}
	return deliver(res)
}

// oneShotGuard turns the built-in file tools' guard off for a one-shot call: the guard
// lets edit_file and write_file change only a file the session has read, and a call that
// is its own session has read nothing. An env the configuration gives wins.
func oneShotGuard(cfg *toolhost.Config) {
	for i := range cfg.Plugins {
		p := &cfg.Plugins[i]
		if p.Path != "editfile.wasm" || cfg.PluginsDir != "" {
			continue
		}
		if _, set := p.Env[builtins.EditfileGuard]; !set {
			env := maps.Clone(p.Env)
			if env == nil {
				env = map[string]string{}
			}
			env[builtins.EditfileGuard] = "off"
			p.Env = env
		}
	}
}

// oneShotGC lets a one-shot call's heap grow to five times what is live before the
// collector runs (GOGC=400; a soft limit of 1 GiB keeps that bounded), unless GOGC or
// GOMEMLIMIT say otherwise: the process lives for one call, and most of what it allocates
// (the called plugin's module, decoded and validated) is garbage within it. A warm call's
// CPU, with its sandbox's, median of nine interleaved (perf stat): 196 ms with the
// default, 176 ms with this (load 35); again 253 ms against 215 ms (load 39-45).
func oneShotGC() {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	debug.SetGCPercent(400)
	debug.SetMemoryLimit(1 << 30)
}

// checkJSON says what is wrong with a tool input, in one line.
func checkJSON(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("the input is not valid JSON: %v", err)
	}
	if _, ok := v.(map[string]any); !ok {
		return fmt.Errorf("the input must be a JSON object, like '{\"path\": \"notes.txt\"}'")
	}
	return nil
}

// workspaceDir makes dir (default: the working directory) absolute and checks that it is
// a directory.
func workspaceDir(dir string) (string, error) {
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return "", err
		}
		dir = wd
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	st, err := os.Stat(abs)
	if err != nil {
		return "", err
	}
	if !st.IsDir() {
		return "", fmt.Errorf("%s is not a directory", abs)
	}
	return abs, nil
}

func toolNames(tools []abi.Tool) []string {
	var names []string
	for _, t := range tools {
		names = append(names, t.Name)
	}
	return names
}

func inspectCommand() *command {
	cmd := &command{
		words:   []string{"plugin", "inspect"},
		args:    "FILE.wasm",
		summary: "show a plugin's manifest, imports and the grants it needs",
		help: `Compiles the module and asks it to describe itself, granting it nothing. Prints
its name, version and tools, the host functions it imports, and the grants it
would need in the configuration's plugins list.`,
		flags: func(fs *pflag.FlagSet) {
			fs.String("format", "text", "output format: text or json")
		},
		nargs: [2]int{1, 1},
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		format, _ := c.flags.GetString("format")
		if format != "text" && format != "json" {
			return usagef(cmd, "--format must be text or json, got %q", format)
		}
		path := args[0]
		wasm, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		// Inspect keeps its compilation cache under the host's default data dir, which
		// reads TOOLHOST_DATA_DIR: point it at the configured one.
		if c.cfg.DataDir != "" {
			os.Setenv("TOOLHOST_DATA_DIR", c.cfg.DataDir)
		}
		in, err := host.Inspect(ctx, wasm)
		if err != nil {
			return fmt.Errorf("inspecting %s: %w", path, err)
		}
		needs := in.Needs
		if needs == nil {
			needs = []abi.Capability{}
		}
		if format == "json" {
			m := in.Manifest
			if m.Tools == nil {
				m.Tools = []abi.Tool{}
			}
			return writeJSON(c.stdout, struct {
				Path     string           `json:"path"`
				Size     int              `json:"size"`
				Manifest abi.Manifest     `json:"manifest"`
				Imports  []string         `json:"imports"`
				Needs    []abi.Capability `json:"needs"`
			}{path, len(wasm), m, hostImportNames(in.Imports), needs}, true)
		}
		printInspection(c.stdout, path, len(wasm), in)
		return nil
	}
	return cmd
}

func printInspection(w io.Writer, path string, size int, in host.Inspection) {
	m := in.Manifest
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "file\t%s (%s)\n", path, humanBytes(int64(size)))
	fmt.Fprintf(tw, "plugin\t%s %s (ABI v%d)\n", m.Name, m.Version, m.ABIVersion)
	var needs []string
	for _, n := range in.Needs {
		needs = append(needs, string(n))
	}
	if len(needs) == 0 {
		needs = []string{"(none)"}
	}
	fmt.Fprintf(tw, "needs\t%s\n", strings.Join(needs, ", "))
	tw.Flush()

	fmt.Fprintf(w, "\ntools (%d):\n", len(m.Tools))
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, t := range m.Tools {
		fmt.Fprintf(tw, "  %s\t%s\n", t.Name, firstLine(t.Description, 90))
	}
	tw.Flush()

	fmt.Fprintf(w, "\nimports (%d):\n", len(in.Imports))
	var modules []string
	byModule := map[string][]string{}
	for _, im := range in.Imports {
		if _, ok := byModule[im.Module]; !ok {
			modules = append(modules, im.Module)
		}
		byModule[im.Module] = append(byModule[im.Module], im.Name)
	}
	width := 0
	for _, m := range modules {
		width = max(width, len(m))
	}
	for _, m := range modules {
		label := m
		if c, ok := abi.CapabilityOfModule(m); ok {
			label += " (grant " + string(c) + ")"
		}
		fmt.Fprintf(w, "  %s\n", label)
		printWrapped(w, "      ", strings.Join(byModule[m], ", "), 88)
	}
}

// printWrapped prints text after indent, wrapping at spaces before width columns.
func printWrapped(w io.Writer, indent, text string, width int) {
	line := indent
	for _, word := range strings.Fields(text) {
		if len(line) > len(indent) && len(line)+1+len(word) > width {
			fmt.Fprintln(w, line)
			line = indent
		}
		if len(line) > len(indent) {
			line += " "
		}
		line += word
	}
	if len(line) > len(indent) {
		fmt.Fprintln(w, line)
	}
}

// firstLine returns s's first line, cut at max characters.
func firstLine(s string, max int) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if r := []rune(s); len(r) > max {
		return string(r[:max-1]) + "…"
	}
	return s
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
