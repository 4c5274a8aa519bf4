package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPolicyReplay: the audit of real tool calls, replayed against a configuration that
// narrows editfile's writes to docs/**, lists exactly the write outside it.
func TestPolicyReplay(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	dir, ws := t.TempDir(), t.TempDir()
	auditFile := filepath.Join(dir, "audit.jsonl")
	cfg := filepath.Join(dir, "now.yaml")
	os.WriteFile(cfg, []byte("audit:\n  file: "+auditFile+"\nplugins:\n  - path: editfile.wasm\n    grants: [sandbox_exec, sandbox_files, log]\n"), 0o600)
	for _, call := range [][2]string{
		{"write_file", `{"path":"docs/a.md","content":"# a\n"}`},
		{"write_file", `{"path":"src/main.go","content":"package main\n"}`},
		{"read_file", `{"path":"src/main.go"}`},
	} {
		if r := runCLI(t, nil, "call", call[0], call[1], "--workspace", ws, "--config", cfg); r.code != 0 {
			t.Fatal(r)
		}
	}
	narrow := filepath.Join(dir, "narrow.yaml")
	os.WriteFile(narrow, []byte(`plugins:
  - path: editfile.wasm
    grants: [sandbox_exec, sandbox_files, log]
    sandbox_files: {read: ["**"], write: ["docs/**"]}
`), 0o600)
	r := runCLI(t, nil, "policy", "replay", "--audit", auditFile, "--config", narrow)
	if r.code != 1 {
		t.Fatalf("replay against a narrower scope:\n%s", r)
	}
	var changed []string
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if strings.HasPrefix(line, "line ") {
			changed = append(changed, line)
		}
	}
	if len(changed) != 1 || !strings.Contains(changed[0], "src/main.go") || !strings.Contains(changed[0], "allow -> deny") {
		t.Fatalf("replay listed %q, want only the write of src/main.go:\n%s", changed, r)
	}
	if r := runCLI(t, nil, "policy", "replay", "--audit", auditFile, "--config", cfg); r.code != 0 || !strings.Contains(r.stdout, "0 of ") {
		t.Fatalf("replay against the same policy:\n%s", r)
	}
}
