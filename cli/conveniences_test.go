package cli

import (
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestJSONReports: every command that lists or reports prints one JSON document with
// --format json.
func TestJSONReports(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "a.txt"), []byte("a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	decode := func(args ...string) map[string]any {
		t.Helper()
		r := runCLI(t, nil, append(args, "--format", "json")...)
		var m map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &m); err != nil {
			t.Fatalf("%v: not one JSON object: %v\n%s", args, err, r)
		}
		return m
	}
	save := decode("snapshot", "save", "--project", "j", "--workspace", ws)
	key, _ := save["key"].(string)
	if !strings.HasPrefix(key, "projects/j/snapshots/") || save["files"] != float64(1) {
		t.Errorf("snapshot save: %v", save)
	}
	list := decode("snapshot", "list", "--project", "j")
	if snaps, _ := list["snapshots"].([]any); len(snaps) != 1 || snaps[0].(map[string]any)["key"] != key {
		t.Errorf("snapshot list: %v", list)
	}
	restored := decode("snapshot", "restore", "--project", "j", "--workspace", filepath.Join(t.TempDir(), "r"))
	if restored["key"] != key || restored["files"] != float64(1) {
		t.Errorf("snapshot restore: %v", restored)
	}
	if shots := decode("screenshot", "list", "--project", "j"); shots["screenshots"] == nil {
		t.Errorf("screenshot list: %v", shots)
	}
	if q := decode("quota"); q["month"] == nil || q["days"] == nil {
		t.Errorf("quota: %v", q)
	}
	if v := decode("version"); v["abi"] != float64(1) || v["go"] == nil {
		t.Errorf("version: %v", v)
	}
	if d := decode("doctor", "--screenshots=false"); d["checks"] == nil {
		t.Errorf("doctor: %v", d)
	}
	// The commands content addressing makes cheap report too.
	if v := decode("snapshot", "verify", "--project", "j"); v["key"] != key || v["verified"] != true || v["files"] != float64(1) {
		t.Errorf("snapshot verify: %v", v)
	}
	if err := os.WriteFile(filepath.Join(ws, "b.txt"), []byte("b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	v := decode("snapshot", "verify", "--project", "j", "--workspace", ws)
	if chs, _ := v["changes"].([]any); v["same"] != false || len(chs) != 1 || chs[0].(map[string]any)["path"] != "b.txt" || chs[0].(map[string]any)["kind"] != "added" {
		t.Errorf("snapshot verify --workspace: %v", v)
	}
	save2 := decode("snapshot", "save", "--project", "j", "--workspace", ws)
	key2, _ := save2["key"].(string)
	if d := decode("snapshot", "diff", "--project", "j", key, key2); d["a"] != key || d["b"] != key2 || len(d["changes"].([]any)) != 1 {
		t.Errorf("snapshot diff: %v", d)
	}
	if f := decode("snapshot", "fork", "--project", "j", "--to", "j-fork"); f["project"] != "j-fork" || f["origin"] != key2 || f["key"] == nil {
		t.Errorf("snapshot fork: %v", f)
	}
	if m := decode("snapshot", "merge", "--project", "j-fork"); m["into"] != "j" || m["conflicts"] == nil {
		t.Errorf("snapshot merge: %v", m)
	}
	if r := decode("snapshot", "rewind", "--project", "j", key); r["origin"] != key || r["undo"] == nil || r["key"] == nil {
		t.Errorf("snapshot rewind: %v", r)
	}
	if g := decode("snapshot", "gc"); g["manifests"] == nil || g["freed_bytes"] == nil {
		t.Errorf("snapshot gc: %v", g)
	}
	if p := decode("snapshot", "prune", "--project", "j", "--keep", "1"); p["kept"] != float64(1) {
		t.Errorf("snapshot prune: %v", p)
	}
	left, _ := decode("snapshot", "list", "--project", "j")["snapshots"].([]any)
	if len(left) != 1 {
		t.Fatalf("after prune --keep 1: %v", left)
	}
	if del := decode("snapshot", "delete", "--project", "j", left[0].(map[string]any)["key"].(string)); len(del["deleted"].([]any)) != 1 {
		t.Errorf("snapshot delete: %v", del)
	}
	oneLineError(t, runCLI(t, nil, "snapshot", "list", "--format", "yaml"), 2, "--format must be text or json")
}

// TestLogFormatJSON: --log-format json makes every log line a JSON object (the handler
// the CLI builds from the key), and the key refuses another format.
func TestLogFormatJSON(t *testing.T) {
	t.Parallel()
	for _, format := range []string{"json", "text"} {
		var b strings.Builder
		slog.New(logHandler(&b, format, slog.LevelDebug)).Debug("hello", "path", "a b")
		var m map[string]any
		err := json.Unmarshal([]byte(b.String()), &m)
		if isJSON := err == nil && m["level"] == "DEBUG" && m["msg"] == "hello" && m["path"] == "a b"; isJSON != (format == "json") {
			t.Errorf("log_format %s wrote %q", format, b.String())
		}
	}
	if r := runCLI(t, nil, "version", "--log-format", "json"); r.code != 0 {
		t.Errorf("--log-format json refused:\n%s", r)
	}
	oneLineError(t, runCLI(t, nil, "snapshot", "list", "--log-format", "xml"), 2, "log_format: must be text or json")
}

// TestDidYouMean: a mistyped command or flag is answered with the nearest one.
func TestDidYouMean(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"snapshots", "list"}, `did you mean "snapshot"?`},
		{[]string{"snapshot", "lst"}, `did you mean "snapshot list"?`},
		{[]string{"sesion", "list"}, `"session"`},
		{[]string{"call", "--worksapce", "/tmp", "bash", "{}"}, "did you mean --workspace?"},
		{[]string{"tools", "--formt", "json"}, "did you mean --format?"},
		{[]string{"snapshot", "list", "--projet", "x"}, "did you mean --project?"},
	} {
		oneLineError(t, runCLI(t, nil, tc.args...), 2, tc.want)
	}
}

// TestHelpFlags: a command's help shows its own flags and points at the global ones,
// which toolhost help flags lists.
func TestHelpFlags(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "call", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "--workspace") || !strings.Contains(r.stdout, "toolhost help flags") ||
		strings.Contains(r.stdout, "--memory-mib") || strings.Count(r.stdout, "\n") > 60 {
		t.Errorf("call --help:\n%s", r)
	}
	r = runCLI(t, nil, "help", "flags")
	if r.code != 0 || !strings.Contains(r.stdout, "--memory-mib") || !strings.Contains(r.stdout, "--log-format") {
		t.Errorf("help flags:\n%s", r)
	}
}

// TestCompletion: the scripts print, and the candidates they ask for are right: command
// words, subcommands, flags, --format's values; bash's function fills COMPREPLY.
func TestCompletion(t *testing.T) {
	t.Parallel()
	for _, sh := range []string{"bash", "zsh", "fish"} {
		r := runCLI(t, nil, "completion", sh)
		if r.code != 0 || !strings.Contains(r.stdout, "toolhost __complete") {
			t.Errorf("completion %s:\n%s", sh, r)
		}
	}
	oneLineError(t, runCLI(t, nil, "completion", "tcsh"), 2, `no completion for "tcsh"`)
	for _, tc := range []struct {
		words []string
		want  []string
	}{
		{[]string{"--", "sn"}, []string{"snapshot"}},
		{[]string{"snapshot", "--", "re"}, []string{"restore", "release", "rewind"}},
		{[]string{"call", "--", "--sess"}, []string{"--session", "--session-max-lifetime", "--session-ttl"}},
		{[]string{"tools", "--format", "--", ""}, []string{"anthropic", "openai", "mcp", "json"}},
		{[]string{"snapshot", "list", "--format", "--", "j"}, []string{"json"}},
		{[]string{"--log-level", "--", "d"}, []string{"debug"}},
		{[]string{"mcp", "config", "--", "cl"}, []string{"claude-code", "claude-desktop"}},
	} {
		r := runCLI(t, nil, append([]string{"__complete"}, tc.words...)...)
		got := strings.Fields(r.stdout)
		if r.code != 0 || strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("__complete %v: %q, want %q\n%s", tc.words, got, tc.want, r)
		}
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	script := runCLI(t, nil, "completion", "bash").stdout
	cmd := exec.Command(bash, "-c", script+`
COMP_WORDS=(toolhost sessio); COMP_CWORD=1; _toolhost; echo "${COMPREPLY[@]}"`)
	cmd.Env = cliEnv(t, "PATH="+filepath.Dir(toolBin)+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "session" {
		t.Errorf("bash completion of 'toolhost sessio': %q %v", out, err)
	}
}
