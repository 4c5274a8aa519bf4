package cli

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/audit"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/experimental"
	"github.com/toolhost/toolhost/internal/memsandbox"
	"github.com/toolhost/toolhost/internal/policy"
)

// A policy test file: cases, each a plugin with its policy, a workspace, one tool call and
// what must happen.
type caseFile struct {
	// Sandbox is where the cases run: memory (an in-memory sandbox that records the host
	// calls; the default) or local (a real bubblewrap sandbox). A case may say otherwise.
	Sandbox string       `key:"sandbox"`
	Cases   []policyCase `key:"cases"`
}

type policyCase struct {
	Name    string `key:"name"`
	Sandbox string `key:"sandbox"`
	// Plugin is a plugins entry of the configuration: path, grants, scopes, limits...
	Plugin toolhost.Plugin `key:"plugin"`
	// Files and Links make the workspace: path -> contents, path -> link target.
	Files map[string]string `key:"files"`
	Links map[string]string `key:"links"`
	Call  struct {
		Tool  string `key:"tool"`
		Input any    `key:"input"`
	} `key:"call"`
	// Egress, instead of a plugin and a call, asks the egress policy (sandbox.egress) about
	// one destination.
	Egress *egressCase `key:"egress"`
	Expect caseExpect  `key:"expect"`
}

// egressCase is a destination to decide.
type egressCase struct {
	// Dest is "name:port" or "address:port", as a sandbox would ask for it.
	Dest string `key:"dest"`
	// Session narrows the policy as a session's (or a serve token's) egress would.
	Session *toolhost.EgressPolicy `key:"session"`
	// Resolve resolves the name through sandbox.egress.resolver and checks every address,
	// as the gateway does at connect time; without it a name is decided by the rules
	// that name it, and nothing leaves this machine.
	Resolve bool `key:"resolve"`
}

type caseExpect struct {
	// Allowed and Denied are host calls that must have been made and allowed, or refused.
	Allowed []callPattern `key:"allowed"`
	Denied  []callPattern `key:"denied"`
	Result  struct {
		Contains    []string `key:"contains"`
		NotContains []string `key:"not_contains"`
		IsError     *bool    `key:"is_error"`
	} `key:"result"`
	// LoadError, when set, is part of the error the plugin must be refused with at load;
	// then no call is made.
	LoadError string `key:"load_error"`
	// Egress is what an egress case must decide: allow or deny, and by which rule
	// (a part of it).
	Egress *struct {
		Decision string `key:"decision"`
		Rule     string `key:"rule"`
		Reason   string `key:"reason"`
	} `key:"egress"`
}

// callPattern selects host calls: every field given must match.
type callPattern struct {
	Cap     string `key:"cap"`
	Op      string `key:"op"`
	Path    string `key:"path"`
	Program string `key:"program"`
	Port    int    `key:"port"`
	Key     string `key:"key"`
}

func (p callPattern) matches(r *audit.Record) bool {
	prog := ""
	if len(r.Argv) > 0 {
		prog = r.Argv[0]
	}
	return (p.Cap == "" || p.Cap == r.Cap) && (p.Op == "" || p.Op == r.Op) && (p.Path == "" || p.Path == r.Path) &&
		(p.Program == "" || p.Program == prog) && (p.Port == 0 || p.Port == r.Port) && (p.Key == "" || p.Key == r.Key)
}

func (p callPattern) String() string {
	var parts []string
	for _, f := range []struct{ k, v string }{{"cap", p.Cap}, {"op", p.Op}, {"path", p.Path}, {"program", p.Program}, {"key", p.Key}} {
		if f.v != "" {
			parts = append(parts, f.k+"="+f.v)
		}
	}
	if p.Port != 0 {
		parts = append(parts, fmt.Sprintf("port=%d", p.Port))
	}
	return "{" + strings.Join(parts, " ") + "}"
}

func policyTestCommand() *command {
	cmd := &command{
		words:   []string{"policy", "test"},
		args:    "CASES.yaml",
		summary: "prove a tool policy holds: run test cases and check what was allowed and refused",
		help: `Runs each case of CASES.yaml: loads its plugin with its grants and scopes, makes its
workspace, makes its tool call, and checks the host calls the plugin made (allowed
and denied, from the audit) and the result. Prints each case, with the host calls of
a failed one, and exits 1 if any failed (2 if the file is wrong), for CI.

  sandbox: memory             # memory (in-memory, recording; default) or local (bubblewrap)
  cases:
    - name: the docs writer may not touch the code
      plugin:                 # a plugins entry, as in the configuration
        path: editfile.wasm
        grants: [sandbox_files, sandbox_exec]
        sandbox_files: {read: ["**"], write: ["docs/**"]}
      files: {src/main.go: "package main\n"}
      links: {docs/evil.md: ../src/main.go}
      call: {tool: write_file, input: {path: src/main.go, content: "x"}}
      expect:
        denied: [{op: write, path: src/main.go}]
        result: {is_error: true, contains: ["may not write src/main.go"]}

A host call pattern matches on cap, op (the host function: read, read_text, write,
run, put...), path (workspace-relative), program (argv[0]), port and key; the fields
left out match anything. expect.load_error instead says the plugin must be refused at
load with an error containing it. A program that runs other programs (a shell above
all) in a plugin's sandbox_exec.programs grants everything: the output says so.

A case may instead ask the egress policy (sandbox.egress) about a destination:

    - name: the metadata service stays out of reach
      egress: {dest: "169.254.169.254:80"}   # session: {allow: [...]} narrows, resolve: true resolves
      expect:
        egress: {decision: deny, rule: "always refused"}`,
		nargs: [2]int{1, 1},
		flags: func(fs *pflag.FlagSet) {
			fs.StringP("run", "r", "", "only the cases whose name contains this")
		},
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		cf, err := readCaseFile(args[0])
		if err != nil {
			return usagef(cmd, "%v", err)
		}
		only, _ := c.flags.GetString("run")
		failed, ran := 0, 0
		for i := range cf.Cases {
			pc := &cf.Cases[i]
			if only != "" && !strings.Contains(pc.Name, only) {
				continue
			}
			ran++
			sb := cmp(pc.Sandbox, cf.Sandbox, "memory")
			start := time.Now()
			run := runCase
			if pc.Egress != nil {
				run, sb = runEgressCase, "no"
			}
			problems, recs, err := run(ctx, c, pc, sb)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				problems = append(problems, err.Error())
			}
			status := "ok  "
			if len(problems) > 0 {
				status, failed = "FAIL", failed+1
			}
			fmt.Fprintf(c.stdout, "%s %s (%s sandbox, %s)\n", status, pc.Name, sb, time.Since(start).Round(time.Millisecond))
			for _, n := range grantsEverything(pc.Plugin) {
				fmt.Fprintf(c.stdout, "     note: %s\n", n)
			}
			for _, p := range problems {
				fmt.Fprintf(c.stdout, "     %s\n", p)
			}
			if len(problems) > 0 && len(recs) > 0 {
				fmt.Fprintf(c.stdout, "     host calls made:\n")
				for _, r := range recs {
					fmt.Fprintf(c.stdout, "       %s\n", describeRecord(&r))
				}
			}
		}
		if ran == 0 {
			return usagef(cmd, "no case to run in %s", args[0])
		}
		fmt.Fprintf(c.stdout, "%d of %d cases passed\n", ran-failed, ran)
		if failed > 0 {
			return fmt.Errorf("%d of %d policy cases failed", failed, ran)
		}
		return nil
	}
	return cmd
}

func cmp(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// grantsEverything notes the programs of a plugin's allowlist that run anything.
func grantsEverything(p toolhost.Plugin) []string {
	if p.Exec == nil {
		return nil
	}
	var out []string
	for _, prog := range p.Exec.Programs {
		if why := policy.GrantsEverything(prog); why != "" {
			out = append(out, fmt.Sprintf("sandbox_exec.programs allows %s: %s, so this allowlist grants everything", prog, why))
		}
	}
	return out
}

func describeRecord(r *audit.Record) string {
	on := r.Path
	if len(r.Argv) > 0 {
		on = strings.Join(r.Argv, " ")
	} else if r.Port != 0 {
		on = fmt.Sprintf("port %d", r.Port)
	} else if r.Key != "" {
		on = r.Key
	}
	s := fmt.Sprintf("%s %s.%s %s", r.Decision, r.Cap, r.Op, on)
	if r.Error != "" {
		s += ": " + r.Error
	}
	return printable(strings.TrimSpace(s))
}

// readCaseFile reads and checks a case file; unknown keys are refused, as in the
// configuration.
func readCaseFile(name string) (*caseFile, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	raw, err := yaml.Parser().Unmarshal(b)
	if err != nil {
		return nil, fmt.Errorf("%s: not YAML: %v", name, err)
	}
	var cf caseFile
	dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		TagName: "key", ErrorUnused: true, WeaklyTypedInput: true, Result: &cf,
		DecodeHook: strictDuration,
	})
	if err != nil {
		return nil, err
	}
	if err := dec.Decode(raw); err != nil {
		return nil, fmt.Errorf("%s: %s", name, strings.Join(strings.Fields(err.Error()), " "))
	}
	if len(cf.Cases) == 0 {
		return nil, fmt.Errorf("%s: no cases", name)
	}
	// A plugin path written ./x.wasm or ../x.wasm is relative to the case file; any other
	// is as in the configuration (a relative one names a built-in, or lies in plugins_dir).
	base, err := filepath.Abs(filepath.Dir(name))
	if err != nil {
		return nil, err
	}
	for i := range cf.Cases {
		if p := cf.Cases[i].Plugin.Path; strings.HasPrefix(p, "./") || strings.HasPrefix(p, "../") {
			cf.Cases[i].Plugin.Path = filepath.Join(base, p)
		}
	}
	for i, pc := range cf.Cases {
		where := fmt.Sprintf("%s: cases[%d]", name, i)
		switch {
		case pc.Name == "":
			return nil, fmt.Errorf("%s: has no name", where)
		case pc.Egress != nil:
			if pc.Egress.Dest == "" || pc.Expect.Egress == nil || pc.Expect.Egress.Decision != "allow" && pc.Expect.Egress.Decision != "deny" {
				return nil, fmt.Errorf("%s (%s): an egress case needs egress.dest and expect.egress.decision (allow or deny)", where, pc.Name)
			}
			if pc.Plugin.Path != "" || pc.Call.Tool != "" {
				return nil, fmt.Errorf("%s (%s): an egress case has no plugin and no call", where, pc.Name)
			}
			continue
		case pc.Plugin.Path == "":
			return nil, fmt.Errorf("%s (%s): plugin.path is empty", where, pc.Name)
		case pc.Call.Tool == "" && pc.Expect.LoadError == "":
			return nil, fmt.Errorf("%s (%s): call.tool is empty", where, pc.Name)
		}
		switch cmp(pc.Sandbox, cf.Sandbox, "memory") {
		case "memory", "local":
		default:
			return nil, fmt.Errorf("%s (%s): sandbox must be memory or local", where, pc.Name)
		}
	}
	return &cf, nil
}

var durationType = reflect.TypeFor[time.Duration]()

// strictDuration reads "30s" as a duration and refuses a bare number, which would mean
// nanoseconds.
func strictDuration(from, to reflect.Type, data any) (any, error) {
	if to != durationType {
		return data, nil
	}
	if s, ok := data.(string); ok {
		d, err := time.ParseDuration(s)
		if err != nil {
			return nil, fmt.Errorf("not a duration: %q (write it with a unit, e.g. \"30s\")", s)
		}
		return d, nil
	}
	return nil, fmt.Errorf("a duration needs a unit: got %v (write e.g. \"%vs\")", data, data)
}

// runEgressCase decides an egress case's destination by the configuration's policy.
func runEgressCase(ctx context.Context, c *cli, pc *policyCase, _ string) ([]string, []audit.Record, error) {
	e := pc.Egress
	d, err := toolhost.DecideEgress(ctx, c.cfg.Config, e.Dest, e.Session, e.Resolve, toolhost.WithLogger(c.quietLog()))
	if err != nil {
		return nil, nil, err
	}
	want := pc.Expect.Egress
	got, verb := "deny", "refused"
	if d.Allowed {
		got, verb = "allow", "allowed"
	}
	var problems []string
	if got != want.Decision {
		problems = append(problems, fmt.Sprintf("%s was %s by %q; want %s", e.Dest, verb, d.Rule, want.Decision))
	}
	if want.Rule != "" && !strings.Contains(d.Rule, want.Rule) {
		problems = append(problems, fmt.Sprintf("%s was decided by %q; want a rule containing %q", e.Dest, d.Rule, want.Rule))
	}
	if want.Reason != "" && !strings.Contains(d.Reason, want.Reason) {
		problems = append(problems, fmt.Sprintf("%s: the model would read %q; want %q in it", e.Dest, d.Reason, want.Reason))
	}
	return problems, nil, nil
}

// runCase runs one case and returns what went against its expectations, with the host
// calls it recorded. An error means the case could not run.
func runCase(ctx context.Context, c *cli, pc *policyCase, where string) (problems []string, recs []audit.Record, err error) {
	cfg := c.cfg.Config
	cfg.Plugins = []toolhost.Plugin{pc.Plugin}
	cfg.Audit.File = "" // the cases' calls are recorded here, not in the configured audit
	rec := &audit.Recorder{}
	th, err := toolhost.New(ctx, cfg, toolhost.WithAudit(rec), toolhost.WithLogger(c.quietLog()),
		toolhost.WithConfigFile(c.cfg.File))
	if want := pc.Expect.LoadError; want != "" {
		switch {
		case err == nil:
			c.closeToolhost(ctx, th)
			return []string{fmt.Sprintf("the plugin loaded; want it refused with %q", want)}, nil, nil
		case !strings.Contains(err.Error(), want): // codecheck:errtext the case file's expected text, which its author wrote
			return []string{fmt.Sprintf("refused at load with %q; want %q in it", err, want)}, nil, nil
		}
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("loading the plugin: %w", err)
	}
	defer c.closeToolhost(ctx, th)

	sb, err := caseSandbox(ctx, th, pc, where)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		cctx, cancel := cleanupContext(ctx)
		defer cancel()
		sb.Close(cctx)
	}()
	input, err := json.Marshal(jsonable(pc.Call.Input))
	if err != nil {
		return nil, nil, fmt.Errorf("call.input: %w", err)
	}
	if pc.Call.Input == nil {
		input = []byte("{}")
	}
	res, callErr := experimental.Dispatch(ctx, th, sb, pc.Call.Tool, input)
	recs = slices.DeleteFunc(rec.Records(), func(r audit.Record) bool { return r.Cap == audit.CapTool })
	if callErr != nil {
		problems = append(problems, "the host could not run the tool: "+callErr.Error())
	}

	for _, want := range pc.Expect.Allowed {
		if !slices.ContainsFunc(recs, func(r audit.Record) bool { return r.Decision == audit.Allow && want.matches(&r) }) {
			problems = append(problems, fmt.Sprintf("no allowed host call %s", want))
		}
	}
	for _, want := range pc.Expect.Denied {
		if !slices.ContainsFunc(recs, func(r audit.Record) bool { return r.Decision == audit.Deny && want.matches(&r) }) {
			problems = append(problems, fmt.Sprintf("no denied host call %s", want))
		}
	}
	var text strings.Builder
	for _, b := range res.Content {
		text.WriteString(b.Text)
	}
	exp := pc.Expect.Result
	if exp.IsError != nil && res.IsError != *exp.IsError {
		problems = append(problems, fmt.Sprintf("the result's is_error is %v, want %v: %q", res.IsError, *exp.IsError, firstLine(text.String(), 200)))
	}
	for _, s := range exp.Contains {
		if !strings.Contains(text.String(), s) {
			problems = append(problems, fmt.Sprintf("the result does not contain %q: %q", s, firstLine(text.String(), 200)))
		}
	}
	for _, s := range exp.NotContains {
		if strings.Contains(text.String(), s) {
			problems = append(problems, fmt.Sprintf("the result contains %q", s))
		}
	}
	return problems, recs, nil
}

// jsonable turns what YAML decoding made (maps with any keys) into what encoding/json
// takes.
func jsonable(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[k] = jsonable(x)
		}
		return out
	case map[any]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[fmt.Sprint(k)] = jsonable(x)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = jsonable(x)
		}
		return out
	}
	return v
}

// caseSandbox makes the case's sandbox with its files and links.
func caseSandbox(ctx context.Context, th *toolhost.Toolhost, pc *policyCase, where string) (sandbox.Sandbox, error) {
	for _, p := range slices.Concat(slices.Collect(maps.Keys(pc.Files)), slices.Collect(maps.Keys(pc.Links))) {
		if !filepath.IsLocal(p) {
			return nil, fmt.Errorf("files and links: %q is not a path inside the workspace", p)
		}
	}
	if where == "memory" {
		sb := memsandbox.New()
		var buf bytes.Buffer
		if err := workspaceArchive(&buf, pc.Files, pc.Links); err != nil {
			return nil, err
		}
		if err := sb.Extract(ctx, &buf); err != nil {
			sb.Close(ctx)
			return nil, fmt.Errorf("making the workspace: %w", err)
		}
		return sb, nil
	}
	dir, err := os.MkdirTemp("", "toolhost-policy-case-")
	if err != nil {
		return nil, err
	}
	// The directory goes when the sandbox closes (removeOnClose).
	if err := writeWorkspace(dir, pc.Files, pc.Links); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := th.CheckWorkspace(dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	prov, err := th.Provider(ctx)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	sb, err := prov.Create(ctx, sandbox.CreateOptions{Workspace: dir})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("creating the sandbox: %w", err)
	}
	return &removeOnClose{Sandbox: sb, dir: dir}, nil
}

// removeOnClose is a case's local sandbox, whose workspace directory goes with it.
type removeOnClose struct {
	sandbox.Sandbox
	dir string
}

func (s *removeOnClose) Close(ctx context.Context) error {
	err := s.Sandbox.Close(ctx)
	return errors.Join(err, os.RemoveAll(s.dir))
}

// Unwrap gives the sandbox's abilities (sandbox.As).
func (s *removeOnClose) Unwrap() sandbox.Sandbox { return s.Sandbox }

// workspaceArchive writes files and links as the tar.gz a sandbox extracts.
func workspaceArchive(w io.Writer, files, links map[string]string) error {
	zw := gzip.NewWriter(w)
	tw := tar.NewWriter(zw)
	dirs := map[string]bool{}
	mkdirs := func(p string) error {
		var parents []string
		for d := path.Dir(p); d != "." && !dirs[d]; d = path.Dir(d) {
			parents = append(parents, d)
		}
		for _, d := range slices.Backward(parents) {
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755}); err != nil {
				return err
			}
		}
		return nil
	}
	for _, p := range slices.Sorted(maps.Keys(files)) {
		if err := mkdirs(p); err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: 0o644, Size: int64(len(files[p]))}); err != nil {
			return err
		}
		if _, err := io.WriteString(tw, files[p]); err != nil {
			return err
		}
	}
	for _, p := range slices.Sorted(maps.Keys(links)) {
		if err := mkdirs(p); err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: p, Linkname: links[p], Mode: 0o777}); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

// writeWorkspace writes files and links into dir, which the sandbox's user must be able to
// write in.
func writeWorkspace(dir string, files, links map[string]string) error {
	if err := os.Chmod(dir, 0o777); err != nil {
		return err
	}
	mkdirs := func(p string) error {
		d := filepath.Dir(filepath.Join(dir, p))
		if err := os.MkdirAll(d, 0o777); err != nil {
			return err
		}
		for ; d != dir; d = filepath.Dir(d) {
			os.Chmod(d, 0o777)
		}
		return nil
	}
	for p, content := range files {
		if err := mkdirs(p); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(content), 0o666); err != nil {
			return err
		}
		os.Chmod(filepath.Join(dir, p), 0o666)
	}
	for p, target := range links {
		if err := mkdirs(p); err != nil {
			return err
		}
		if err := os.Symlink(target, filepath.Join(dir, p)); err != nil {
			return err
		}
	}
	return nil
}
