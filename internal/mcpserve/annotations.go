package mcpserve

import (
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
)

// annotations are a plugin tool's MCP hints (title, readOnlyHint, destructiveHint,
// idempotentHint, openWorldHint), derived from what its plugin is granted, never from what
// the plugin says of itself: a client may skip asking its user before a read-only tool,
// so a hint must not claim less than the plugin can do. A plugin granted sandbox_exec
// runs programs (which may write anything and, with egress, reach the network) and one
// granted sandbox_files or store may write: neither is read-only. A plugin granted none of
// them (screenshot: capture and log; webfetch: web and log) cannot change the sandbox or
// the store, and what it does it may do again with the same effect. Only exec and web
// reach past the sandbox (a page of the sandbox is what capture shoots; the egress
// gateway decides what a program or a fetch reaches), so openWorldHint is false for the
// rest.
//
// By this rule read_file, grep and glob are not read-only: their plugins are granted exec
// (poppler for PDFs, rg), and a hint cannot promise what the grants do not bound.
func annotations(name string, grants []abi.Capability) *mcp.ToolAnnotations {
	a := &mcp.ToolAnnotations{Title: title(name)}
	exec := slices.Contains(grants, abi.CapSandboxExec)
	writes := slices.Contains(grants, abi.CapSandboxFiles) || slices.Contains(grants, abi.CapStore)
	web := slices.Contains(grants, abi.CapWeb)
	yes, no := true, false
	switch {
	case exec:
		a.DestructiveHint, a.OpenWorldHint = &yes, &yes
	case writes:
		a.DestructiveHint, a.OpenWorldHint = &yes, &no
		if web {
			a.OpenWorldHint = &yes
		}
	default:
		a.ReadOnlyHint, a.IdempotentHint, a.DestructiveHint, a.OpenWorldHint = true, true, &no, &no
		if web {
			a.OpenWorldHint = &yes
		}
	}
	return a
}

// title is a tool's name as a title a person reads: "take_screenshot" is "Take screenshot".
func title(name string) string {
	t := strings.ReplaceAll(name, "_", " ")
	if t == "" {
		return t
	}
	return strings.ToUpper(t[:1]) + t[1:]
}

// toolGrants maps each plugin tool to its plugin's grants (as configured, which may be
// fewer than the plugin asks for).
func toolGrants(th *toolhost.Toolhost) map[string][]abi.Capability {
	out := map[string][]abi.Capability{}
	for _, p := range th.Plugins() {
		for _, t := range p.Tools {
			out[t] = p.Grants
		}
	}
	return out
}
