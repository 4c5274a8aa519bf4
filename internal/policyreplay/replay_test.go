package policyreplay

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/audit"
	pub "github.com/toolhost/toolhost/policy"
)

func TestReplayListsExactlyWhatANarrowerScopeRefuses(t *testing.T) {
	recs := []audit.Record{
		{Plugin: "editfile", Tool: "write_file", Cap: "sandbox_files", Op: abi.FnWrite, Path: "docs/a.md", Decision: audit.Allow, Why: "unscoped"},
		{Plugin: "editfile", Tool: "write_file", Cap: "sandbox_files", Op: abi.FnWrite, Path: "src/main.go", Decision: audit.Allow, Why: "unscoped"},
		{Plugin: "editfile", Tool: "read_file", Cap: "sandbox_files", Op: abi.FnRead, Path: "src/main.go", Decision: audit.Allow, Why: "unscoped"},
		{Plugin: "editfile", Tool: "write_file", Cap: "tool", Op: "call", Decision: audit.Allow},
		{Plugin: "bash", Tool: "bash", Cap: "sandbox_exec", Op: abi.FnExec, Argv: []string{"git", "status"}, Decision: audit.Allow, Why: "unscoped"},
		{Plugin: "bash", Tool: "bash", Cap: "sandbox_exec", Op: abi.FnExec, Argv: []string{"ls"}, Decision: audit.Allow, Why: "unscoped"},
		{Plugin: "bash", Tool: "bash", Cap: "sandbox_exec", Op: abi.FnExec, Argv: []string{"rm", "-rf", "/"}, Decision: audit.Deny, Why: "programs: ls"},
		{Plugin: "grepglob", Tool: "grep", Cap: "sandbox_exec", Op: abi.FnExec, Argv: []string{"rg", "x"}, Decision: audit.Allow, Why: "unscoped"},
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for i := range recs {
		enc.Encode(&recs[i])
	}
	plugins := map[string]Plugin{
		"editfile": {Grants: []abi.Capability{abi.CapSandboxFiles}, Scope: pub.Scope{Files: &pub.Files{Read: []string{"**"}, Write: []string{"docs/**"}}}},
		"bash":     {Grants: []abi.Capability{abi.CapSandboxExec}, Scope: pub.Scope{Exec: &pub.Exec{Programs: []string{"ls", "rm"}}}},
		// grepglob is not loaded
	}
	changed, st, err := Replay(&b, plugins)
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, c := range changed {
		got = append(got, c.Line)
	}
	// src/main.go written (line 2), git (5) refused now; rm (7) allowed now; grepglob (8) gone.
	want := []int{2, 5, 7, 8}
	if len(got) != len(want) {
		t.Fatalf("changed lines %v, want %v: %+v", got, want, changed)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("changed lines %v, want %v", got, want)
		}
	}
	if changed[0].Now != audit.Deny || changed[2].Now != audit.Allow || st.Calls != 7 || st.Skipped != 1 || st.Changed != 4 {
		t.Fatalf("%+v %+v", changed, st)
	}
}
