// Package policyreplay decides the host calls recorded in an audit file again, under
// other grants and scopes, and lists those whose decision would change: what a
// tightened policy would break, before it breaks (`toolhost policy replay`).
package policyreplay

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/audit"
	"github.com/toolhost/toolhost/internal/policy"
	pub "github.com/toolhost/toolhost/policy"
)

// Plugin is what the other configuration gives a plugin.
type Plugin struct {
	Grants []abi.Capability
	Scope  pub.Scope
}

// Changed is a recorded call that would be decided otherwise.
type Changed struct {
	// Line is the record's line in the audit file (from 1).
	Line   int
	Record audit.Record
	// Now is the decision under the other configuration (audit.Allow or audit.Deny), Why
	// the rule or the reason.
	Now, Why string
}

// Stats count what was replayed.
type Stats struct {
	Calls, Skipped, Changed int
}

// maxLine bounds an audit line (a record is bounded well below it; see audit.MaxList).
const maxLine = 1 << 20

// Replay reads the audit records of r and decides each host call again with plugins
// (by plugin name; a plugin missing there is not loaded, and its calls are refused).
// Tool calls, egress records and calls that could not be decoded are skipped.
func Replay(r io.Reader, plugins map[string]Plugin) ([]Changed, Stats, error) {
	compiled := map[string]*policy.Policy{}
	for name, p := range plugins {
		c, err := policy.Compile(p.Scope)
		if err != nil {
			return nil, Stats{}, fmt.Errorf("plugin %s: %w", name, err)
		}
		compiled[name] = c
	}
	var out []Changed
	var st Stats
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	line := 0
	for sc.Scan() {
		line++
		var rec audit.Record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return nil, st, fmt.Errorf("line %d: not an audit record: %w", line, err)
		}
		if rec.Decision != audit.Allow && rec.Decision != audit.Deny {
			st.Skipped++
			continue
		}
		cp := abi.Capability(rec.Cap)
		if _, ok := policy.ClassOf(cp, rec.Op); !ok {
			st.Skipped++ // a tool call, an egress record, a session's own
			continue
		}
		st.Calls++
		now, why := decide(plugins, compiled, &rec)
		if now != rec.Decision {
			st.Changed++
			out = append(out, Changed{Line: line, Record: rec, Now: now, Why: why})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, st, fmt.Errorf("line %d: %w", line+1, err)
	}
	return out, st, nil
}

func decide(plugins map[string]Plugin, compiled map[string]*policy.Policy, rec *audit.Record) (string, string) {
	p, ok := plugins[rec.Plugin]
	if !ok {
		return audit.Deny, "the plugin is not loaded"
	}
	if !slices.Contains(p.Grants, abi.Capability(rec.Cap)) {
		return audit.Deny, fmt.Sprintf("not granted %s (the plugin would be refused at load)", rec.Cap)
	}
	d := compiled[rec.Plugin].Decide(rec.Plugin, policy.Request{Cap: abi.Capability(rec.Cap), Op: rec.Op, Path: rec.Path,
		Argv: rec.Argv, Env: rec.Env, Port: rec.Port, Key: rec.Key})
	if d.Allowed {
		return audit.Allow, d.Rule
	}
	if d.Message != "" {
		return audit.Deny, d.Message
	}
	return audit.Deny, d.Rule
}
