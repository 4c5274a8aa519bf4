// Package policy is the policy engine: it decides what a plugin may do with the capabilities it was granted: which
// workspace paths it may read and write, which programs it may run and what environment it
// may give them, whether it may write its store, which ports it may capture. A grant alone
// is all or nothing per capability; a Scope narrows it.
//
// The host asks a Policy about every host call a plugin makes (Decide) before doing
// anything, and a refusal reaches the plugin as abi.StatusPermission with a message written
// for the model, such as
//
//	policy: plugin docs-writer may not write src/main.go (allowed: docs/**)
//
// The package is pure Go over package abi: the host and the Go plugin kit's test harness
// (pdk/policytest) decide with the same code, so a plugin's native test sees the refusals
// the host would give.
package policy

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/policy"
)

// The scope types are package policy's (github.com/toolhost/toolhost/policy), the public
// half of this package: a configuration names them, the engine here compiles them.
type (
	Scope   = policy.Scope
	Files   = policy.Files
	Exec    = policy.Exec
	Store   = policy.Store
	Capture = policy.Capture
)

// Store access levels.
const (
	StoreReadWrite = policy.StoreReadWrite
	StoreRead      = policy.StoreRead
)

// Operations of the host functions, by the names ABI.md gives them.
const (
	OpRead           = abi.FnRead
	OpReadText       = abi.FnReadText
	OpReadVersioned  = abi.FnReadVersioned
	OpWrite          = abi.FnWrite
	OpWriteVersioned = abi.FnWriteVersioned
	OpStat           = abi.FnStat
	OpList           = abi.FnList
	OpRun            = abi.FnExec
	OpCapture        = abi.FnCapture
	OpPut            = abi.FnStorePut
	OpGet            = abi.FnStoreGet
	OpStoreList      = abi.FnStoreList
	OpDelete         = abi.FnStoreDelete
	// The agent tools' host functions (issue 20). Their classes: remove is a write of its
	// path; terminal_start runs a program (decided as run, and like a background command
	// it outlives the call); process and terminal_io act only on what the plugin itself
	// started in the session, which the policy allowed when it started it; the session
	// state (CapSession get and set) is the plugin's own memory and reaches nothing.
	OpRemove        = abi.FnRemove
	OpProcess       = abi.FnProcess
	OpTerminalStart = abi.FnTerminalStart
	OpTerminalIO    = abi.FnTerminalIO
)

// Class is what an operation does, which decides the part of a Scope that judges it.
// Every operation the host runs through the policy has exactly one (ClassOf); one
// without is refused whatever the Scope, so a new host function is denied until it is
// given its class here, never judged as some other kind by default.
type Class int

const (
	ClassRead         Class = iota + 1 // reads a file's content: files.read
	ClassWrite                         // changes a file: files.write
	ClassLook                          // stat, list: files.read, and the directories on the way to it
	ClassRun                           // runs a program: exec
	ClassCapture                       // captures a port: capture.ports
	ClassStoreRead                     // reads the plugin's store
	ClassStoreWrite                    // changes the plugin's store: refused when store.access is read
	ClassOwnProcess                    // acts only on a process or terminal the plugin itself started in the session
	ClassSessionState                  // the plugin's own session state: reaches nothing outside the host
	ClassFetch                         // fetches from the web: the egress gateway decides, against the plugin's web scope
)

var classNames = map[Class]string{
	ClassRead: "read", ClassWrite: "write", ClassLook: "look", ClassRun: "run",
	ClassCapture: "capture", ClassStoreRead: "store read", ClassStoreWrite: "store write",
	ClassOwnProcess: "own process", ClassSessionState: "session state", ClassFetch: "fetch",
}

func (c Class) String() string {
	if n, ok := classNames[c]; ok {
		return n
	}
	return "class(" + strconv.Itoa(int(c)) + ")"
}

type capOp struct {
	cap abi.Capability
	op  string
}

// classes is the operation table: each host call the policy decides, by capability and
// op (names repeat across capabilities: files' list and the store's list), and its class.
var classes = map[capOp]Class{
	{abi.CapSandboxFiles, OpRead}:           ClassRead,
	{abi.CapSandboxFiles, OpReadText}:       ClassRead,
	{abi.CapSandboxFiles, OpReadVersioned}:  ClassRead,
	{abi.CapSandboxFiles, OpWrite}:          ClassWrite,
	{abi.CapSandboxFiles, OpWriteVersioned}: ClassWrite,
	{abi.CapSandboxFiles, OpRemove}:         ClassWrite,
	{abi.CapSandboxFiles, OpStat}:           ClassLook,
	{abi.CapSandboxFiles, OpList}:           ClassLook,
	{abi.CapSandboxExec, OpRun}:             ClassRun,
	{abi.CapSandboxExec, OpTerminalStart}:   ClassRun,
	{abi.CapSandboxExec, OpProcess}:         ClassOwnProcess,
	{abi.CapSandboxExec, OpTerminalIO}:      ClassOwnProcess,
	{abi.CapSession, abi.FnSessionGet}:      ClassSessionState,
	{abi.CapSession, abi.FnSessionSet}:      ClassSessionState,
	{abi.CapWeb, abi.FnFetch}:               ClassFetch,
	{abi.CapCapture, OpCapture}:             ClassCapture,
	{abi.CapStore, OpGet}:                   ClassStoreRead,
	{abi.CapStore, OpStoreList}:             ClassStoreRead,
	{abi.CapStore, OpPut}:                   ClassStoreWrite,
	{abi.CapStore, OpDelete}:                ClassStoreWrite,
}

// ClassOf returns the class of the operation op of capability cap; false when the table
// names none, and Decide then refuses it.
func ClassOf(cap abi.Capability, op string) (Class, bool) {
	c, ok := classes[capOp{cap, op}]
	return c, ok
}

// Request is one host call as the policy sees it: decoded, its path resolved.
type Request struct {
	Cap abi.Capability
	// Op is the host function (OpRead, OpRun, ...).
	Op string
	// Path is the workspace-relative path the call acts on, clean ("." for the root), for
	// sandbox_files.
	Path string
	// Argv, Env (the names of the variables the call sets) and Background, for sandbox_exec.
	Argv       []string
	Env        []string
	Background bool
	// Port, for capture: the port to be captured.
	Port int
	// Key, for store: relative to the plugin's corner.
	Key string
}

// Decision is what Decide says of a Request.
type Decision struct {
	Allowed bool
	// Rule names the part of the policy that decided, for the audit: "write: docs/**",
	// "programs: git, ls", "unscoped".
	Rule string
	// Message is, for a refusal, what the plugin reads from last_error: written for the
	// model, it says what was refused and what is allowed.
	Message string
	// CheckLinks: the path was allowed by patterns that do not cover the whole workspace,
	// so the caller must make sure that no part of it is a symbolic link (CheckLinks)
	// before acting, and refuse with LinkRefusal if one is.
	CheckLinks bool
}

// Policy is a compiled Scope. A nil *Policy allows everything.
type Policy struct {
	scope       Scope
	read, write *patternSet
	// The rules of file decisions, for the audit: "read: **", "write: docs/**".
	readRule, writeRule string
	programs            []string
	env                 []string
	maxTimeout          time.Duration
	storeRead           bool
	ports               []int
}

// Compile checks a Scope and compiles it. It returns nil, which allows everything, for a
// zero Scope.
func Compile(s Scope) (*Policy, error) {
	if s.IsZero() {
		return nil, nil
	}
	p := &Policy{scope: s}
	if f := s.Files; f != nil {
		var err error
		if p.read, err = compilePatterns(f.Read); err != nil {
			return nil, fmt.Errorf("sandbox_files.read: %w", err)
		}
		if p.write, err = compilePatterns(f.Write); err != nil {
			return nil, fmt.Errorf("sandbox_files.write: %w", err)
		}
		p.readRule, p.writeRule = "read: "+p.read.String(), "write: "+p.write.String()
	}
	if e := s.Exec; e != nil {
		for _, prog := range e.Programs {
			if prog == "" || strings.TrimSpace(prog) != prog || strings.IndexByte(prog, 0) >= 0 {
				return nil, fmt.Errorf("sandbox_exec.programs: %q is not a program name", prog)
			}
		}
		for _, name := range e.Env {
			if name == "" || strings.ContainsAny(name, "=\x00") {
				return nil, fmt.Errorf("sandbox_exec.env: %q is not a variable name", name)
			}
		}
		if len(e.Env) > 0 && len(e.Programs) == 0 {
			return nil, errors.New("sandbox_exec.env: only means something with programs (with any program allowed, a plugin can set any variable through env or a shell); list the programs too, or leave env out")
		}
		if e.MaxTimeout < 0 {
			return nil, fmt.Errorf("sandbox_exec.max_timeout: must be positive, got %s", e.MaxTimeout)
		}
		p.programs, p.env, p.maxTimeout = slices.Clone(e.Programs), slices.Clone(e.Env), e.MaxTimeout
	}
	if st := s.Store; st != nil {
		switch st.Access {
		case StoreRead:
			p.storeRead = true
		case StoreReadWrite, "":
		default:
			return nil, fmt.Errorf("store.access: must be %q or %q, got %q", StoreRead, StoreReadWrite, st.Access)
		}
	}
	if c := s.Capture; c != nil {
		if len(c.Ports) == 0 {
			return nil, errors.New("capture.ports: list the ports the plugin may capture (or leave capture out for any)")
		}
		for _, port := range c.Ports {
			if port < 1 || port > 65535 {
				return nil, fmt.Errorf("capture.ports: %d is not a TCP port (1-65535)", port)
			}
		}
		p.ports = slices.Clone(c.Ports)
	}
	return p, nil
}

// Scope returns the scope p was compiled from (zero for nil).
func (p *Policy) Scope() Scope {
	if p == nil {
		return Scope{}
	}
	return p.scope
}

// MaxTimeout is the plugin's own cap on command timeouts, or 0.
func (p *Policy) MaxTimeout() time.Duration {
	if p == nil {
		return 0
	}
	return p.maxTimeout
}

var unscoped = Decision{Allowed: true, Rule: "unscoped"}

// Decide says whether the plugin named plugin may make the call r. An operation with no
// class in the table is refused, whatever the Scope (nil included).
func (p *Policy) Decide(plugin string, r Request) Decision {
	class, ok := ClassOf(r.Cap, r.Op)
	if !ok {
		return Decision{Rule: "no class", Message: fmt.Sprintf(
			"policy: plugin %s may not call %s.%s: the host's policy does not know that operation", plugin, r.Cap, r.Op)}
	}
	if p == nil {
		return unscoped
	}
	switch class {
	case ClassRead, ClassWrite, ClassLook:
		return p.decideFiles(plugin, class, r)
	case ClassRun:
		return p.decideExec(plugin, r)
	case ClassStoreRead, ClassStoreWrite:
		return p.decideStore(plugin, class, r)
	case ClassCapture:
		return p.decideCapture(plugin, r)
	case ClassOwnProcess:
		return ownOnly
	case ClassSessionState:
		return unscoped // its own memory, kept per plugin and session
	case ClassFetch:
		// The destination is decided where it is reached: by the egress gateway, against
		// the plugin's web scope, at every redirect and for every address a name resolves
		// to (internal/webfetch); here there is nothing more to judge.
		return Decision{Allowed: true, Rule: "web scope (egress gateway)"}
	}
	return Decision{Rule: "no class", Message: fmt.Sprintf("policy: plugin %s may not call %s.%s", plugin, r.Cap, r.Op)}
}

// fileVerb is how a message names a file operation.
func fileVerb(class Class, op string) string {
	switch class {
	case ClassRead:
		return "read"
	case ClassWrite:
		if op == OpRemove {
			return "remove"
		}
		return "write"
	}
	return op // stat, list
}

// fileSet is the patterns, and their rule, that judge a file operation of class.
func (p *Policy) fileSet(class Class) (*patternSet, string) {
	if class == ClassWrite {
		return p.write, p.writeRule
	}
	return p.read, p.readRule
}

func (p *Policy) decideFiles(plugin string, class Class, r Request) Decision {
	if p.read == nil {
		return unscoped
	}
	set, rule := p.fileSet(class)
	var buf [16]string
	segs := split(buf[:0], r.Path)
	ok := set.allowed(segs)
	if !ok && class == ClassLook {
		// A directory on the way to what may be read may be listed and looked at; what the
		// listing shows is filtered (Visible).
		ok = set.leadsTo(segs)
	}
	if !ok {
		return Decision{Rule: rule, Message: fmt.Sprintf("policy: plugin %s may not %s %s (allowed: %s)",
			plugin, fileVerb(class, r.Op), r.Path, set)}
	}
	return Decision{Allowed: true, Rule: rule, CheckLinks: !set.all}
}

// Visible reports whether a listing or a stat may show the workspace path rel to the
// plugin: a path it may read, or a directory on the way to one.
func (p *Policy) Visible(rel string, dir bool) bool {
	if p == nil || p.read == nil || p.read.all {
		return true
	}
	var buf [16]string
	segs := split(buf[:0], rel)
	return p.read.allowed(segs) || (dir && p.read.leadsTo(segs))
}

// LinkRefusal is the refusal of a call whose path goes through the symbolic link at link
// (a workspace-relative path, r.Path or one of its directories).
func (p *Policy) LinkRefusal(plugin string, r Request, link string) Decision {
	class, _ := ClassOf(r.Cap, r.Op)
	set, rule := p.fileSet(class)
	what := link + " is a symbolic link"
	if link != r.Path {
		what = "its directory " + link + " is a symbolic link"
	}
	return Decision{Rule: rule + " (no links)",
		Message: fmt.Sprintf("policy: plugin %s may not %s %s: %s, and a plugin whose paths are scoped never goes through one (allowed: %s)",
			plugin, fileVerb(class, r.Op), r.Path, what, set)}
}

// Parts are the parts of a workspace path from the root down: "docs", "docs/a",
// "docs/a/b.md" for docs/a/b.md; none for ".".
func Parts(rel string) []string {
	if rel == "." || rel == "" {
		return nil
	}
	var parts []string
	for i := 0; i <= len(rel); i++ {
		if i == len(rel) || rel[i] == '/' {
			parts = append(parts, rel[:i])
		}
	}
	return parts
}

// PartState is what a look (lstat, never following a final link) at one part of a path
// found.
type PartState struct {
	Link, Exists bool
	Err          error
}

// FirstLink reads the looks at each part of a path (Parts, in order) and returns the
// first part that is a symbolic link, or "". What follows the first part that does not
// exist is not looked at: nothing below it can be a link yet. An error of a part that
// counts is returned. whole says every part exists and none is a link.
func FirstLink(parts []string, states []PartState) (link string, whole bool, err error) {
	for i, st := range states {
		switch {
		case st.Err != nil:
			return "", false, st.Err
		case st.Link:
			return parts[i], false, nil
		case !st.Exists:
			return "", false, nil
		}
	}
	return "", true, nil
}

// CheckLinks looks at each part of the workspace path rel from the root down with lstat,
// one after another, and returns the first that is a symbolic link, or "" (see FirstLink).
func CheckLinks(rel string, lstat func(rel string) (link, exists bool, err error)) (string, error) {
	parts := Parts(rel)
	states := make([]PartState, 0, len(parts))
	for _, part := range parts {
		link, exists, err := lstat(part)
		states = append(states, PartState{Link: link, Exists: exists, Err: err})
		if err != nil || link || !exists {
			break
		}
	}
	l, _, err := FirstLink(parts, states)
	return l, err
}

// ownOnly decides the calls that act only on a process or terminal the plugin started in
// this session (the host checks that it did).
var ownOnly = Decision{Allowed: true, Rule: "its own processes"}

func (p *Policy) decideExec(plugin string, r Request) Decision {
	if p.programs == nil && p.maxTimeout == 0 {
		return unscoped
	}
	rule := "programs: any"
	if p.programs != nil {
		rule = "programs: " + strings.Join(p.programs, ", ")
	}
	if p.maxTimeout > 0 {
		rule += "; max_timeout: " + p.maxTimeout.String()
	}
	prog := ""
	if len(r.Argv) > 0 {
		prog = r.Argv[0]
	}
	if p.programs != nil && !slices.Contains(p.programs, prog) {
		return Decision{Rule: rule, Message: fmt.Sprintf("policy: plugin %s may not run %s (allowed: %s)",
			plugin, prog, strings.Join(p.programs, ", "))}
	}
	if p.programs != nil {
		for _, name := range r.Env {
			if !slices.Contains(p.env, name) {
				allowed := "none"
				if len(p.env) > 0 {
					allowed = strings.Join(p.env, ", ")
				}
				return Decision{Rule: rule + "; env: " + allowed, Message: fmt.Sprintf(
					"policy: plugin %s may not set %s for the programs it runs (allowed: %s)", plugin, name, allowed)}
			}
		}
	}
	if r.Op == OpTerminalStart && p.maxTimeout > 0 {
		return Decision{Rule: rule, Message: fmt.Sprintf(
			"policy: plugin %s may not start programs on a terminal: its commands may run at most %s, and a terminal outlives the call",
			plugin, p.maxTimeout)}
	}
	if r.Background && p.maxTimeout > 0 {
		return Decision{Rule: rule, Message: fmt.Sprintf(
			"policy: plugin %s may not start background commands: its commands may run at most %s; run it in the foreground",
			plugin, p.maxTimeout)}
	}
	return Decision{Allowed: true, Rule: rule}
}

func (p *Policy) decideStore(plugin string, class Class, r Request) Decision {
	if !p.storeRead {
		return unscoped
	}
	if class == ClassStoreWrite {
		return Decision{Rule: "store: read", Message: fmt.Sprintf(
			"policy: plugin %s may not %s %s: its store is read-only", plugin, r.Op, r.Key)}
	}
	return Decision{Allowed: true, Rule: "store: read"}
}

func (p *Policy) decideCapture(plugin string, r Request) Decision {
	if p.ports == nil {
		return unscoped
	}
	list := make([]string, len(p.ports))
	for i, port := range p.ports {
		list[i] = strconv.Itoa(port)
	}
	rule := "ports: " + strings.Join(list, ", ")
	if !slices.Contains(p.ports, r.Port) {
		return Decision{Rule: rule, Message: fmt.Sprintf("policy: plugin %s may not capture port %d (allowed: %s)",
			plugin, r.Port, strings.Join(list, ", "))}
	}
	return Decision{Allowed: true, Rule: rule}
}

// GrantsEverything says why allowing program lets a plugin run anything at all, or "" when
// it is not known to: shells, programs that run the command they are given, interpreters,
// and programs that run hooks or commands of their own configuration.
func GrantsEverything(program string) string {
	base := path.Base(program)
	// python3.11, pip3, node18: the family is what matters.
	name := strings.TrimRight(base, "0123456789.")
	switch name {
	case "sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "csh", "tcsh", "ash", "busybox", "toybox":
		return "a shell runs any command"
	case "env", "xargs", "nohup", "timeout", "nice", "ionice", "time", "stdbuf", "setsid", "chroot",
		"sudo", "doas", "su", "runuser", "script", "watch", "flock", "parallel", "strace", "ltrace", "gdb":
		return "it runs the command it is given"
	case "python", "node", "nodejs", "deno", "bun", "perl", "ruby", "php", "lua", "luajit", "tclsh",
		"wish", "awk", "gawk", "mawk", "nawk", "R", "Rscript", "julia", "java", "jshell", "go", "cargo",
		"rustc", "gcc", "cc", "clang", "expect", "osascript", "pwsh", "sed", "vim", "vi", "nvim", "emacs", "ed", "less", "more", "man":
		return "it runs code or commands of its own"
	case "find":
		return "find -exec runs any command"
	case "make", "cmake", "ninja", "npm", "npx", "yarn", "pnpm", "pip", "pipx", "uv", "poetry", "gradle", "mvn", "bazel", "tox", "nox":
		return "it runs the commands of the project's build files"
	case "git":
		return "git runs hooks, aliases and -c configuration (core.pager, core.sshCommand) as commands"
	case "ssh", "scp", "rsync", "tar":
		return "it can run commands through its options (ProxyCommand, -e, --to-command)"
	}
	return ""
}
