package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const passingCases = `sandbox: memory
cases:
  - name: the docs writer writes below docs
    plugin:
      path: editfile.wasm
      grants: [sandbox_exec, sandbox_files, log]
      sandbox_files: {read: ["**"], write: ["docs/**"]}
    call: {tool: write_file, input: {path: docs/guide.md, content: "# Guide\n"}}
    expect:
      allowed: [{cap: sandbox_files, op: write_versioned, path: docs/guide.md}]
      result: {is_error: false, contains: ["File written: docs/guide.md"]}
  - name: the docs writer may not touch the code, not even through a link
    sandbox: local
    plugin:
      path: editfile.wasm
      grants: [sandbox_exec, sandbox_files, log]
      sandbox_files: {read: ["**", "!**/.env"], write: ["docs/**"]}
    files: {src/main.go: "package main\n"}
    links: {docs/main.go: ../src/main.go}
    call: {tool: write_file, input: {path: docs/main.go, content: "pwned"}}
    expect:
      denied: [{op: read_text, path: docs/main.go}]
      result: {is_error: true, contains: ["docs/main.go is a symbolic link"]}
  - name: the reviewer reads but never writes
    plugin:
      path: editfile.wasm
      grants: [sandbox_files, sandbox_exec]
      sandbox_files: {read: ["**", "!**/.env"]}
    files: {.env: "TOKEN=1\n"}
    call: {tool: read_file, input: {path: .env}}
    expect:
      denied: [{op: read_text, path: .env}]
      result: {is_error: true, contains: ["may not read .env (allowed: **, !**/.env)"]}
  - name: a shell in the allowlist
    plugin:
      path: bash.wasm
      grants: [sandbox_exec]
      sandbox_exec: {programs: [bash], max_timeout: 5s}
    call: {tool: bash, input: {command: "echo anything goes"}}
    expect:
      allowed: [{op: run, program: bash}]
      result: {contains: ["anything goes"]}
  - name: refused at load, every missing grant named
    plugin: {path: grepglob.wasm, grants: [log]}
    expect: {load_error: 'not granted "sandbox_exec"'}
`

const failingCases = `cases:
  - name: claims the reviewer may write
    plugin:
      path: editfile.wasm
      grants: [sandbox_files, sandbox_exec]
      sandbox_files: {read: ["**"]}
    call: {tool: write_file, input: {path: a.txt, content: "x"}}
    expect:
      allowed: [{op: write_versioned, path: a.txt}]
      result: {is_error: false}
  - name: this one holds
    plugin: {path: editfile.wasm, grants: [sandbox_files, sandbox_exec]}
    call: {tool: write_file, input: {path: a.txt, content: "x"}}
    expect: {allowed: [{op: write_versioned}]}
`

func TestPolicyTest(t *testing.T) {
	requireBwrap(t) // one case runs in a local sandbox
	t.Parallel()
	dir := t.TempDir()
	pass, fail := filepath.Join(dir, "pass.yaml"), filepath.Join(dir, "fail.yaml")
	os.WriteFile(pass, []byte(passingCases), 0o644)
	os.WriteFile(fail, []byte(failingCases), 0o644)

	r := runCLI(t, nil, "policy", "test", pass)
	if r.code != 0 {
		t.Fatalf("the passing cases:\n%s", r)
	}
	for _, want := range []string{
		"ok   the docs writer writes below docs (memory sandbox",
		"ok   the docs writer may not touch the code, not even through a link (local sandbox",
		"note: sandbox_exec.programs allows bash: a shell runs any command, so this allowlist grants everything",
		"5 of 5 cases passed",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout does not say %q:\n%s", want, r)
		}
	}

	r = runCLI(t, nil, "policy", "test", fail)
	if r.code != 1 || !strings.Contains(r.stderr, "1 of 2 policy cases failed") {
		t.Fatalf("the failing cases: want exit 1 and one line saying so\n%s", r)
	}
	for _, want := range []string{
		"FAIL claims the reviewer may write",
		"no allowed host call {op=write_versioned path=a.txt}",
		"the result's is_error is true, want false",
		"deny sandbox_files.write_versioned a.txt: policy: plugin editfile may not write a.txt (allowed: nothing)",
		"ok   this one holds",
		"1 of 2 cases passed",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout does not say %q:\n%s", want, r)
		}
	}

	os.WriteFile(fail, []byte("cases:\n  - name: x\n    plugin: {path: a.wasm}\n    call: {tool: t}\n    expect: {allowd: []}\n"), 0o644)
	oneLineError(t, runCLI(t, nil, "policy", "test", fail), 2, "allowd")
}

func TestAuditCommand(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	dir, ws := t.TempDir(), t.TempDir()
	file := filepath.Join(dir, "audit.jsonl")
	cfg := filepath.Join(dir, "toolhost.yaml")
	os.WriteFile(cfg, []byte(`plugins:
  - path: editfile.wasm
    grants: [sandbox_exec, sandbox_files, log]
    sandbox_files: {read: ["**"], write: ["docs/**"]}
  - {path: bash.wasm, grants: [sandbox_exec, log]}
audit:
  file: `+file+`
`), 0o644)
	os.Chmod(ws, 0o777)
	env := []string{"TOOLHOST_CONFIG=" + cfg}
	for _, c := range []struct{ tool, input string }{
		{"write_file", `{"path":"docs/a.md","content":"x"}`},
		{"write_file", `{"path":"main.go","content":"x"}`},
		{"bash", `{"command":"ls"}`},
	} {
		if r := runCLI(t, env, "call", c.tool, c.input, "--workspace", ws); r.code != 0 {
			t.Fatal(r)
		}
	}
	r := runCLI(t, env, "audit", "--decision", "deny")
	if r.code != 0 {
		t.Fatal(r)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var rec struct {
		Plugin, Tool, Cap, Op, Path, Decision, Why, Error string
		Status                                            int
	}
	if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &rec) != nil {
		t.Fatalf("denials: want one JSON line\n%s", r)
	}
	if rec.Plugin != "editfile" || rec.Tool != "write_file" || rec.Op != "write" || rec.Path != "main.go" ||
		rec.Why != "write: docs/**" || rec.Status != -1 || !strings.Contains(rec.Error, "may not write main.go") {
		t.Errorf("the denial: %+v", rec)
	}
	// A path with an escape sequence reaches the table as something harmless.
	if r := runCLI(t, env, "call", "write_file", `{"path":"\u001b]0;pwned\u0007x","content":"x"}`, "--workspace", ws); r.code != 0 {
		t.Fatal(r)
	}
	if r := runCLI(t, env, "audit", "--format", "text", "--decision", "deny"); strings.ContainsAny(r.stdout, "\x1b\x07") || !strings.Contains(r.stdout, `\x1b]0;pwned`) {
		t.Errorf("control characters reach the terminal:\n%q", r.stdout)
	}
	r = runCLI(t, env, "audit", file, "--plugin", "bash", "--cap", "sandbox_exec", "--format", "text", "--since", "1h")
	if r.code != 0 || !strings.Contains(r.stdout, "sandbox_exec.run") || !strings.Contains(r.stdout, "bash -c ") || strings.Contains(r.stdout, "editfile") {
		t.Errorf("bash's commands as a table:\n%s", r)
	}
	// The table cuts a long argv; the JSON keeps it whole: bash's wrapper, the command last.
	r = runCLI(t, env, "audit", file, "--plugin", "bash", "--cap", "sandbox_exec")
	ran := false
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var rec struct {
			Op   string
			Argv []string
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Op == "run" && len(rec.Argv) > 0 && rec.Argv[len(rec.Argv)-1] == "ls" {
			ran = true
		}
	}
	if r.code != 0 || !ran {
		t.Errorf("bash's commands as JSON: no run whose command is ls:\n%s", r)
	}
	if r := runCLI(t, env, "audit", "--since", "2999-01-01"); r.code != 0 || r.stdout != "" {
		t.Errorf("nothing after 2999:\n%s", r)
	}
	oneLineError(t, runCLI(t, nil, "audit"), 2, "no audit file")
	oneLineError(t, runCLI(t, env, "audit", "--decision", "maybe"), 2, "--decision")
}

// TestPolicyExample: docs/POLICY.md's worked example (examples/policy) holds: its cases pass,
// and its two configurations load and refuse what they should.
func TestPolicyExample(t *testing.T) {
	requireBwrap(t) // one case runs in a local sandbox
	t.Parallel()
	dir := filepath.Join(moduleRoot, "examples", "policy")
	for _, f := range []string{"cases.yaml", "reviewer.yaml", "docs-writer.yaml"} {
		os.Stat(filepath.Join(dir, f)) // in the test cache's key
	}
	r := runCLI(t, nil, "policy", "test", filepath.Join(dir, "cases.yaml"))
	if r.code != 0 || !strings.Contains(r.stdout, "7 of 7 cases passed") {
		t.Fatalf("examples/policy/cases.yaml:\n%s", r)
	}
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "main.go"), []byte("package main\n"), 0o644)
	for _, c := range []struct{ config, tool, input, want string }{
		{"reviewer.yaml", "write_file", `{"path":"new.go","content":"x"}`, "policy: plugin editfile may not write new.go (allowed: nothing)"},
		{"docs-writer.yaml", "write_file", `{"path":"new.go","content":"x"}`, "policy: plugin editfile may not write new.go (allowed: docs/**)"},
	} {
		audit := filepath.Join(t.TempDir(), "audit.jsonl")
		env := []string{"TOOLHOST_AUDIT_FILE=" + audit} // not /var/log/toolhost
		r := runCLI(t, env, "call", c.tool, c.input, "--workspace", ws, "--config", filepath.Join(dir, c.config))
		if r.code != 0 {
			t.Fatalf("%s:\n%s", c.config, r)
		}
		if res := decodeResult(t, r); !res.IsError || !strings.Contains(res.Content[0].Text, c.want) {
			t.Errorf("%s: %+v", c.config, res)
		}
		if b, err := os.ReadFile(audit); err != nil || !strings.Contains(string(b), `"decision":"deny"`) {
			t.Errorf("%s: the audit %q, %v", c.config, b, err)
		}
	}
}

const egressCases = `cases:
  - name: npm is in the default preset
    egress: {dest: "registry.npmjs.org:443"}
    expect:
      egress: {decision: allow, rule: "allow registry.npmjs.org (preset registries)"}
  - name: the metadata service stays out of reach
    egress: {dest: "169.254.169.254:80"}
    expect:
      egress: {decision: deny, rule: "always refused: a cloud metadata service address"}
  - name: loopback written in hex
    egress: {dest: "0x7f.1:8750"}
    expect:
      egress: {decision: deny, rule: "always refused: loopback", reason: "(the address 127.0.0.1 written another way)"}
  - name: a domain nobody allowed
    egress: {dest: "example.com:443"}
    expect:
      egress: {decision: deny, rule: "no rule allows example.com", reason: "ask the operator to add it"}
  - name: a session that keeps only PyPI
    egress: {dest: "registry.npmjs.org:443", session: {allow: [pypi.org, files.pythonhosted.org]}}
    expect:
      egress: {decision: deny, rule: "no rule allows registry.npmjs.org"}
  - name: claims ssh to github is open
    egress: {dest: "github.com:22"}
    expect:
      egress: {decision: allow}
`

// Egress cases: the configuration's policy decides destinations, names by their rules
// (nothing is resolved), addresses in any spelling; a wrong expectation fails.
func TestPolicyTestEgress(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "egress.yaml")
	os.WriteFile(file, []byte(egressCases), 0o644)
	r := runCLI(t, nil, "policy", "test", file)
	if r.code != 1 || !strings.Contains(r.stderr, "1 of 6 policy cases failed") {
		t.Fatalf("want exit 1, one case failed:\n%s", r)
	}
	for _, want := range []string{
		"ok   npm is in the default preset (no sandbox",
		"ok   the metadata service stays out of reach",
		"ok   loopback written in hex",
		"ok   a domain nobody allowed",
		"ok   a session that keeps only PyPI",
		"FAIL claims ssh to github is open",
		`github.com:22 was refused by "port not allowed: allow github.com (preset registries)"; want allow`,
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout does not say %q:\n%s", want, r)
		}
	}
}
