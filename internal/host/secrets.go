package host

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/toolhost/toolhost/abi"
)

// Secrets are values a plugin's commands need (a token for git push, a registry password)
// that nothing else may see. The host adds a plugin's secrets to the environment of every
// command it runs (never to the plugin's own environment: a plugin has no use for a token,
// the program it runs does), and takes every secret's value out of whatever it hands on:
// the output of commands before the plugin sees it, the text of every result, the
// plugin's logs, last_error messages and the audit. Each occurrence becomes
// "[secret NAME]".
//
// What is not covered: a command that writes a secret into a file makes it a file's
// contents, which a plugin reads as they are (only what it returns is cleaned); a secret
// a command encodes (base64, split in parts) is no longer its value; images are not
// searched.

// MinSecretLen is the shortest secret value the host accepts: shorter ones would match
// ordinary text in every result.
const MinSecretLen = 8

var secretNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// secrets replaces every secret value with its name. A nil *secrets replaces nothing.
type secrets struct {
	values [][]byte
	r      *strings.Replacer
}

// newSecrets gathers the secrets of every plugin.
func newSecrets(specs []PluginSpec) *secrets {
	type secret struct{ name, value string }
	var all []secret
	for _, spec := range specs {
		for _, name := range slices.Sorted(maps.Keys(spec.Secrets)) {
			all = append(all, secret{name, spec.Secrets[name]})
		}
	}
	if len(all) == 0 {
		return nil
	}
	// Longest first, so a secret that contains another is replaced whole.
	slices.SortStableFunc(all, func(a, b secret) int { return cmp.Compare(len(b.value), len(a.value)) })
	s := &secrets{}
	var pairs []string
	for _, sec := range all {
		s.values = append(s.values, []byte(sec.value))
		pairs = append(pairs, sec.value, "[secret "+sec.name+"]")
	}
	s.r = strings.NewReplacer(pairs...)
	return s
}

// checkSecrets refuses secrets a plugin cannot be given safely.
func checkSecrets(spec PluginSpec) error {
	if len(spec.Secrets) == 0 {
		return nil
	}
	if !slices.Contains(spec.Grants, abi.CapSandboxExec) {
		return fmt.Errorf("has secrets but is not granted sandbox_exec: secrets reach the commands a plugin runs, and nothing else")
	}
	for _, name := range slices.Sorted(maps.Keys(spec.Secrets)) {
		if !secretNameRE.MatchString(name) {
			return fmt.Errorf("secret %q: not an environment variable name (letters, digits and _, not starting with a digit)", name)
		}
		if len(spec.Secrets[name]) < MinSecretLen {
			return fmt.Errorf("secret %s: its value is shorter than %d characters, too short to be told apart from ordinary text in results", name, MinSecretLen)
		}
	}
	return nil
}

func (s *secrets) redact(str string) string {
	if s == nil || str == "" {
		return str
	}
	return s.r.Replace(str)
}

func (s *secrets) redactAll(list []string) []string {
	if s == nil {
		return list
	}
	out := make([]string, len(list))
	for i, v := range list {
		out[i] = s.r.Replace(v)
	}
	return out
}

func (s *secrets) redactBytes(b []byte) []byte {
	if s == nil {
		return b
	}
	for _, v := range s.values {
		if bytes.Contains(b, v) {
			return []byte(s.r.Replace(string(b)))
		}
	}
	return b
}

// redactResult cleans the text blocks of a result.
func (s *secrets) redactResult(r *abi.Result) {
	if s == nil {
		return
	}
	for i := range r.Content {
		if r.Content[i].Type == abi.ContentText {
			r.Content[i].Text = s.r.Replace(r.Content[i].Text)
		}
	}
	if len(r.Structured) > 0 {
		r.Structured = s.redactJSON(r.Structured)
	}
}

// redactJSON cleans every string (keys included) of a JSON value: a secret is replaced in
// its decoded form, whatever escapes the plugin wrote it with. A value that does not
// decode is dropped (checkStructured has refused it already).
func (s *secrets) redactJSON(raw abi.RawJSON) abi.RawJSON {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return nil
	}
	var walk func(any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case string:
			return s.r.Replace(x)
		case []any:
			for i := range x {
				x[i] = walk(x[i])
			}
		case map[string]any:
			out := make(map[string]any, len(x))
			for k, e := range x {
				out[s.r.Replace(k)] = walk(e)
			}
			return out
		}
		return v
	}
	b, err := json.Marshal(walk(v))
	if err != nil {
		return nil
	}
	return b
}

// redactedError is an error whose message had secrets taken out; errors.Is and As still
// see the error it wraps.
type redactedError struct {
	err error
	msg string
}

func (e redactedError) Error() string { return e.msg }
func (e redactedError) Unwrap() error { return e.err }
