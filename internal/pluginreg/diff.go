package pluginreg

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/toolhost/toolhost/abi"
)

// Change is one difference between two versions of a plugin.
type Change struct {
	// Text says what changed, for the operator.
	Text string
	// Widens: the new version needs a grant the configuration does not give it.
	Widens bool
	// Breaks: a caller of the old version may fail with the new one (a tool removed, an
	// input the old schema took that the new one refuses).
	Breaks bool
}

// Diff compares two versions of a plugin; granted are the grants the configuration
// gives it now.
func Diff(old, new Meta, granted []abi.Capability) []Change {
	var out []Change
	if old.Manifest.Version != new.Manifest.Version || old.Manifest.ABIVersion != new.Manifest.ABIVersion {
		out = append(out, Change{Text: fmt.Sprintf("version %s (ABI v%d) -> %s (ABI v%d)", old.Manifest.Version, old.Manifest.ABIVersion, new.Manifest.Version, new.Manifest.ABIVersion)})
	}
	for _, c := range new.Needs {
		switch {
		case !slices.Contains(granted, c):
			out = append(out, Change{Text: fmt.Sprintf("needs grant %s, which the configuration does not give it", c), Widens: true})
		case !slices.Contains(old.Needs, c):
			out = append(out, Change{Text: fmt.Sprintf("now uses grant %s (already granted)", c)})
		}
	}
	for _, c := range old.Needs {
		if !slices.Contains(new.Needs, c) {
			out = append(out, Change{Text: fmt.Sprintf("no longer needs grant %s", c)})
		}
	}
	for _, im := range new.Imports {
		if !slices.Contains(old.Imports, im) {
			out = append(out, Change{Text: "new host import " + im})
		}
	}
	for _, im := range old.Imports {
		if !slices.Contains(new.Imports, im) {
			out = append(out, Change{Text: "host import removed: " + im})
		}
	}
	oldTools, newTools := toolMap(old.Manifest.Tools), toolMap(new.Manifest.Tools)
	for _, n := range toolNames(new.Manifest.Tools) {
		if _, ok := oldTools[n]; !ok {
			out = append(out, Change{Text: "tool added: " + n})
		}
	}
	for _, n := range toolNames(old.Manifest.Tools) {
		nt, ok := newTools[n]
		if !ok {
			out = append(out, Change{Text: "tool removed: " + n, Breaks: true})
			continue
		}
		for _, b := range schemaBreaks(oldTools[n].InputSchema, nt.InputSchema) {
			out = append(out, Change{Text: fmt.Sprintf("tool %s: %s", n, b), Breaks: true})
		}
	}
	return out
}

func toolMap(tools []abi.Tool) map[string]abi.Tool {
	m := map[string]abi.Tool{}
	for _, t := range tools {
		m[t.Name] = t
	}
	return m
}

type objectSchema struct {
	Properties           map[string]json.RawMessage `json:"properties"`
	Required             []string                   `json:"required"`
	AdditionalProperties *bool                      `json:"additionalProperties"`
}

type propSchema struct {
	Type any   `json:"type"`
	Enum []any `json:"enum"`
}

// schemaBreaks lists what an input schema's new version refuses that its old one took:
// a property newly required, a property removed (when others are refused), a property's
// type or enum changed, other properties newly refused.
func schemaBreaks(oldRaw, newRaw abi.RawJSON) []string {
	var o, n objectSchema
	if json.Unmarshal(oldRaw, &o) != nil || json.Unmarshal(newRaw, &n) != nil {
		return nil
	}
	var out []string
	for _, r := range n.Required {
		if !slices.Contains(o.Required, r) {
			out = append(out, fmt.Sprintf("input %q is now required", r))
		}
	}
	closed := n.AdditionalProperties != nil && !*n.AdditionalProperties
	wasClosed := o.AdditionalProperties != nil && !*o.AdditionalProperties
	if closed && !wasClosed {
		out = append(out, "inputs it does not list are now refused")
	}
	for _, name := range sortedKeys(o.Properties) {
		np, ok := n.Properties[name]
		if !ok {
			if closed {
				out = append(out, fmt.Sprintf("input %q was removed", name))
			}
			continue
		}
		var op, pp propSchema
		if json.Unmarshal(o.Properties[name], &op) != nil || json.Unmarshal(np, &pp) != nil {
			continue
		}
		if fmt.Sprint(op.Type) != fmt.Sprint(pp.Type) {
			out = append(out, fmt.Sprintf("input %q changed type from %v to %v", name, op.Type, pp.Type))
		}
		for _, v := range op.Enum {
			if pp.Enum != nil && !slices.ContainsFunc(pp.Enum, func(x any) bool { return fmt.Sprint(x) == fmt.Sprint(v) }) {
				out = append(out, fmt.Sprintf("input %q no longer takes %v", name, v))
			}
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
