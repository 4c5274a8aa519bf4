// Package audit records what plugins do: one Record per host call (the capability, the
// operation, the paths or argv, the policy's decision and why, the duration and the bytes)
// and one per tool call, written as JSON lines to a file by Writer, collected in memory by
// Recorder, and read back and filtered by Read.
//
// The package is pure Go over the standard library: the host writes records, the CLI's
// `toolhost audit` reads them, and the plugin kit's test harness (pdk/policytest) makes the
// same records natively.
package audit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Decisions.
const (
	Allow = "allow" // the policy allowed the call (it may still have failed: see Status)
	Deny  = "deny"  // the policy refused it; the plugin got abi.StatusPermission
	// Invalid: the call could not be decoded (a bad pointer, JSON that does not parse, a
	// path outside the workspace), so no policy was asked.
	Invalid = "invalid"
)

// CapTool is the Cap of the record of a tool call itself (Op "call"), written when the call
// ends, after the records of the host calls it made.
const CapTool = "tool"

// CapEgress is the Cap of the record of one connection (one request, for plain HTTP) a
// sandbox made through the egress gateway: Op is how it asked (http, connect, socks5),
// Dest the destination, Addr the address connected to, Port its port, Command the command
// that made it, Why the rule that decided, Error the refusal's reason or why an allowed
// connection failed, In and Out the bytes from and to the sandbox.
const CapEgress = "egress"

// Record is one line of the audit: a host call, or a tool call (Cap CapTool).
type Record struct {
	Time time.Time `json:"time"` // when the call ended
	// Sandbox is the ID of the sandbox the call acted in: the calls of one session share it.
	Sandbox string `json:"sandbox,omitempty"`
	Plugin  string `json:"plugin"`
	Tool    string `json:"tool,omitempty"`
	Cap     string `json:"cap"` // sandbox_files, sandbox_exec, store, capture, web, session, or "tool"
	Op      string `json:"op"`  // the host function (read, run, put...), or "call"
	// Path is the workspace-relative path a file call acted on (or a command's working
	// directory); Argv and Env (names only, never values) a command's; Port a capture's;
	// Key a store call's, relative to the plugin's corner (a fetch's URL; a session state
	// call's key).
	Path     string   `json:"path,omitempty"`
	Argv     []string `json:"argv,omitempty"`
	Env      []string `json:"env,omitempty"`
	Port     int      `json:"port,omitempty"`
	Key      string   `json:"key,omitempty"`
	Decision string   `json:"decision"`
	// Why is the rule that decided ("write: docs/**", "unscoped"), or for Invalid what was
	// wrong.
	Why string `json:"why,omitempty"`
	// Status is the negative status the plugin got (0 when the call succeeded); Error its
	// message, as the plugin read it. For a tool call, Error is why the host could not run
	// it and IsError says the result was an error.
	Status  int64  `json:"status,omitempty"`
	Error   string `json:"error,omitempty"`
	IsError bool   `json:"is_error,omitempty"`
	// Micros is how long the call took; In and Out the bytes it took and gave (a request's
	// data, a reply's length; a tool call's input and result text).
	Micros int64 `json:"us"`
	In     int   `json:"bytes_in,omitempty"`
	Out    int   `json:"bytes_out,omitempty"`
	// Cut is how many bytes of this record's text were left out of its line: a path, key,
	// rule or error longer than MaxField is cut to it, a command line past MaxList (all its
	// words together) keeps its first MaxList bytes. A command as long as the model cares
	// to make it cannot make an audit line as long.
	Cut int `json:"cut,omitempty"`

	// Dest, Addr, Command and Injected are an egress record's (CapEgress): Injected names
	// the header the gateway added, never its value.
	Dest     string `json:"dest,omitempty"`
	Addr     string `json:"addr,omitempty"`
	Command  string `json:"command,omitempty"`
	Injected string `json:"injected,omitempty"`
}

// Bounds of a record's line (see Record.Cut).
const (
	MaxField = 1024
	MaxList  = 4096
)

// Capped returns r with its text within the bounds and Cut counting what was left out;
// r itself when it is within them already.
func Capped(r *Record) *Record {
	if !overBounds(r) {
		return r
	}
	c := *r
	cut := 0
	for _, f := range []*string{&c.Sandbox, &c.Plugin, &c.Tool, &c.Cap, &c.Op, &c.Path, &c.Key, &c.Decision, &c.Why, &c.Error, &c.Dest, &c.Addr, &c.Command, &c.Injected} {
		*f, cut = cutString(*f, MaxField, cut)
	}
	c.Argv, cut = cutList(c.Argv, cut)
	c.Env, cut = cutList(c.Env, cut)
	c.Cut += cut
	return &c
}

func overBounds(r *Record) bool {
	for _, f := range []string{r.Sandbox, r.Plugin, r.Tool, r.Cap, r.Op, r.Path, r.Key, r.Decision, r.Why, r.Error, r.Dest, r.Addr, r.Command, r.Injected} {
		if len(f) > MaxField {
			return true
		}
	}
	return listLen(r.Argv) > MaxList || listLen(r.Env) > MaxList
}

func listLen(l []string) int {
	n := 0
	for _, s := range l {
		n += len(s)
	}
	return n
}

// cutString cuts s to at most max bytes, at a character's start, adding what it left out
// to cut.
func cutString(s string, max, cut int) (string, int) {
	if len(s) <= max {
		return s, cut
	}
	i := max
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i], cut + len(s) - i
}

// cutList keeps the first MaxList bytes of the words of l (the last one kept cut to fit,
// the ones after it dropped).
func cutList(l []string, cut int) ([]string, int) {
	if listLen(l) <= MaxList {
		return l, cut
	}
	out := make([]string, 0, len(l))
	left := MaxList
	for _, w := range l {
		if left <= 0 {
			cut += len(w)
			continue
		}
		var kept string
		kept, cut = cutString(w, left, cut)
		out = append(out, kept)
		left -= len(kept)
	}
	return out, cut
}

// Sink receives records. Record must be safe for concurrent use and must not block for
// long: it runs inside host calls.
type Sink interface {
	Record(r *Record)
}

// Recorder is a Sink that keeps every record in memory, for tests and harnesses.
type Recorder struct {
	mu   sync.Mutex
	recs []Record
}

// Record implements Sink.
func (r *Recorder) Record(rec *Record) {
	c := *rec
	c.Argv, c.Env = slices.Clone(rec.Argv), slices.Clone(rec.Env)
	r.mu.Lock()
	r.recs = append(r.recs, c)
	r.mu.Unlock()
}

// Records returns a copy of the records so far, in the order they were made.
func (r *Recorder) Records() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.recs)
}

// Reset forgets the records so far.
func (r *Recorder) Reset() {
	r.mu.Lock()
	r.recs = nil
	r.mu.Unlock()
}

// Tee is a Sink that hands every record to each of its sinks.
type Tee []Sink

// Record implements Sink.
func (t Tee) Record(r *Record) {
	for _, s := range t {
		s.Record(r)
	}
}

// Filter selects records. Zero fields select everything.
type Filter struct {
	Plugin   string
	Tool     string
	Cap      string
	Decision string
	Since    time.Time // records at or after it
	Until    time.Time // records before it
}

// Match reports whether f selects r.
func (f *Filter) Match(r *Record) bool {
	return (f.Plugin == "" || r.Plugin == f.Plugin) &&
		(f.Tool == "" || r.Tool == f.Tool) &&
		(f.Cap == "" || r.Cap == f.Cap) &&
		(f.Decision == "" || r.Decision == f.Decision) &&
		(f.Since.IsZero() || !r.Time.Before(f.Since)) &&
		(f.Until.IsZero() || r.Time.Before(f.Until))
}

// Read reads an audit's JSON lines from rd and calls fn with each record f selects, with
// its raw line (without the newline). A line that is not a record stops it with an error
// naming the line number; so does an error fn returns.
func Read(rd io.Reader, f Filter, fn func(r *Record, line []byte) error) error {
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(strings.TrimSpace(string(line))) == 0 {
			continue
		}
		var r Record
		if err := json.Unmarshal(line, &r); err != nil {
			return fmt.Errorf("line %d is not an audit record: %w", n, err)
		}
		if !f.Match(&r) {
			continue
		}
		if err := fn(&r, line); err != nil {
			return err
		}
	}
	return sc.Err()
}
