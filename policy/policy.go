// Package policy holds the types that narrow what a plugin may do with the capabilities
// it was granted: which workspace paths it may read and write, which programs it may run
// and what environment it may give them, whether it may write its store, which ports it
// may capture. A grant alone is all or nothing per capability; a Scope narrows it. A
// configuration's plugin entry names these types (toolhost.Plugin embeds a Scope), and so
// does a plugin's native policy test (pdk/policytest).
//
// Path patterns are relative to the workspace root and slash-separated. In a segment, *
// matches any run of characters but '/', ? one character, [...] a class ([^...] negated,
// \ escapes); a segment that is just ** matches zero or more whole segments. "docs/**" is
// docs/ and everything below it, and docs itself; "**/*.md" is every .md file at any depth;
// "**" is the whole workspace. A pattern that starts with ! refuses what it matches, and
// everything below it, whatever the allowing patterns say: ["**", "!**/.env"] is the
// whole workspace but any .env file. Refusing patterns ignore case; allowing patterns
// match case exactly.
//
// The host decides every host call against the compiled scope, and a refusal reaches the
// plugin as abi.StatusPermission with a message written for the model, such as
//
//	policy: plugin docs-writer may not write src/main.go (allowed: docs/**)
package policy

import "time"

// Scope narrows the capabilities a plugin was granted. Each field is optional; nil leaves
// its capability as granted (today's behaviour: the whole workspace, any program, its whole
// store corner read-write, any port). The key tags are the names in a configuration file's
// plugin entry.
type Scope struct {
	Files   *Files   `key:"sandbox_files" json:"sandbox_files,omitempty"`
	Exec    *Exec    `key:"sandbox_exec" json:"sandbox_exec,omitempty"`
	Store   *Store   `key:"store" json:"store,omitempty"`
	Capture *Capture `key:"capture" json:"capture,omitempty"`
	Web     *Web     `key:"web" json:"web,omitempty"`
}

// IsZero reports whether the scope narrows nothing.
func (s Scope) IsZero() bool {
	return s.Files == nil && s.Exec == nil && s.Store == nil && s.Capture == nil && s.Web == nil
}

// Files scopes sandbox_files: the paths the plugin may read (read, read_text,
// read_versioned, stat, list) and write (write, write_versioned, remove), as path patterns
// relative to the workspace (see the package's pattern syntax). An empty list allows
// nothing: {read: ["**"]} is a read-only plugin, {read: ["**"], write: ["docs/**"]} one
// that writes only below docs/.
//
// The patterns match the path after the host resolved it (.. and absolute paths made
// relative, so docs/../src/main.go is src/main.go). When a list does not allow the whole
// workspace, the plugin also never goes through a symbolic link: a path with a link in it
// is refused, since the sandbox would follow the link to wherever it points.
type Files struct {
	Read  []string `key:"read" json:"read"`
	Write []string `key:"write" json:"write"`
}

// Exec scopes sandbox_exec.
type Exec struct {
	// Programs are the programs the plugin may start, matched exactly against argv[0]:
	// "git" allows argv[0] "git" (found on the sandbox's PATH), "/usr/bin/git" only that
	// path. Empty: any program. A program that runs other programs grants everything they
	// can do: a shell ("bash" with -c), env, xargs, find (-exec), an interpreter (python3,
	// node), make, git (hooks, aliases); see GrantsEverything.
	Programs []string `key:"programs" json:"programs,omitempty"`
	// MaxTimeout caps the timeout of every command the plugin runs, below the host's own
	// maximum; with it, background commands (which outlive any timeout) are refused. Zero:
	// the host's.
	MaxTimeout time.Duration `key:"max_timeout" json:"max_timeout,omitempty"`
	// Env names the environment variables the plugin may set for the programs it runs,
	// when Programs is set (none unless listed: PATH or LD_PRELOAD would let it run
	// another program under an allowed name). With any program allowed, it may set any.
	Env []string `key:"env" json:"env,omitempty"`
}

// Store access levels.
const (
	StoreReadWrite = "read-write"
	StoreRead      = "read"
)

// Store scopes the store capability, the plugin's own corner of the object store.
type Store struct {
	// Access is StoreRead (get and list) or StoreReadWrite (also put and delete, the
	// default).
	Access string `key:"access" json:"access"`
}

// Capture scopes the capture capability.
type Capture struct {
	// Ports are the ports inside the sandbox the plugin may capture (after the host chose
	// the default port of a call that names none).
	Ports []int `key:"ports" json:"ports"`
}

// Web is the egress scope of the web capability: the destinations a plugin may fetch
// from, decided by the host's egress gateway, which whatever the scope says never
// connects to a loopback, private, link-local or host address. The entries are those of
// sandbox.egress: names, *.name wildcards, name:port, CIDRs; Deny wins; entries without a
// port apply on Ports (80 and 443 when empty). Preset adds a named list ("registries",
// "none"). Left out, a plugin granted web may fetch what the registries preset names.
type Web struct {
	Preset string   `key:"preset" json:"preset,omitempty"`
	Allow  []string `key:"allow" json:"allow,omitempty"`
	Deny   []string `key:"deny" json:"deny,omitempty"`
	Ports  []int    `key:"ports" json:"ports,omitempty"`
}
