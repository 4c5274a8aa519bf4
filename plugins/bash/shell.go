package main

import (
	"crypto/rand"
	"strings"

	"github.com/toolhost/toolhost/pdk"
)

// The shell that remembers. Each call is still a fresh bash, but it starts where the
// last one ended: in its working directory and, when the embedder turns it on
// (TOOLHOST_BASH_KEEP_ENV), with the variables it exported. The state lives in the
// plugin's session state (pdk.SessionSet), so it is per session and survives every
// replacement of the sandbox; the sandbox never holds it.
//
// The command runs through eval in a wrapper shell whose EXIT trap prints, after
// everything the command printed, a line with a random marker, the directory the command
// started in and the one it ended in, one a line, then (with the environment kept) `export -p`, then the marker again. The
// plugin takes that tail off stdout. A command that exec's another program, replaces the
// trap or sends stdout elsewhere leaves no tail: the state then stays as it was.

const (
	keyCwd = "shell/cwd"
	keyEnv = "shell/env"
	// maxEnvState bounds the exported variables kept between calls.
	maxEnvState = 64 << 10
	envKeepEnv  = "TOOLHOST_BASH_KEEP_ENV"
)

// wrapper is the script of `bash -c`: $1 the marker, $2 the directory to start in, $3
// the variables to restore (export and unset lines), $4 1 to print the variables at the
// end, $5 the command.
const wrapper = `__th_m=$1 __th_k=$4 __th_c=$5
if [ -n "$2" ] && ! cd -- "$2" 2>/dev/null; then printf '%s gone\n' "$__th_m" >&2; fi
__th_p=$PWD
if [ "$__th_k" = 1 ]; then __th_b=$(export -p); eval "$3"; fi
__th_end() {
	__th_s=$?
	printf '\n%s\n%s\n%s\n' "$__th_m" "$__th_p" "$PWD"
	if [ "$__th_k" = 1 ]; then printf '%s\n' "$__th_b"; printf '%s\n' "$__th_m"; export -p; fi
	printf '%s\n' "$__th_m"
	exit "$__th_s"
}
trap __th_end EXIT
set -- 
eval "$__th_c"
`

// keepEnv reports whether exported variables carry over (the embedder's choice).
func keepEnv() bool {
	switch strings.ToLower(strings.TrimSpace(pdk.Config(envKeepEnv))) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}

// shellState is where the last call ended.
type shellState struct {
	cwd string // "" for the workspace root, where a fresh shell starts
	env string // lines of bash restoring the exported variables
}

func loadShell() shellState {
	var st shellState
	if b, err := pdk.SessionGet(keyCwd); err == nil {
		st.cwd = string(b)
	}
	if keepEnv() {
		if b, err := pdk.SessionGet(keyEnv); err == nil {
			st.env = string(b)
		}
	}
	return st
}

// shellArgv is the argv that runs command where st says, marked with marker.
func shellArgv(command, marker string, st shellState) []string {
	k := "0"
	if keepEnv() {
		k = "1"
	}
	return []string{"bash", "-c", wrapper, "toolhost-bash", marker, st.cwd, st.env, k, command}
}

// newMarker is a marker no command can guess.
func newMarker() string { return "@@toolhost-" + rand.Text() }

// endState takes the wrapper's tail off stdout and stderr. ok false: no tail (the state
// stays). gone: the directory the call was to start in did not exist.
func endState(stdout, stderr, marker string) (out, errOut, start, cwd, base, final string, gone, ok bool) {
	errOut = stderr
	if line := marker + " gone\n"; strings.HasPrefix(stderr, line) {
		errOut, gone = stderr[len(line):], true
	}
	i := strings.Index(stdout, "\n"+marker+"\n")
	if i < 0 || !strings.HasSuffix(stdout, marker+"\n") {
		return stdout, errOut, "", "", "", "", gone, false
	}
	tail := stdout[i+len(marker)+2:]
	lines := strings.SplitN(tail, "\n", 3)
	if len(lines) < 3 {
		return stdout, errOut, "", "", "", "", gone, false
	}
	start, cwd, tail = lines[0], lines[1], strings.TrimSuffix(lines[2], marker+"\n")
	if tail != "" {
		// base, the marker, final
		j := strings.Index(tail, marker+"\n")
		if j < 0 {
			return stdout, errOut, "", "", "", "", gone, false
		}
		base, final = tail[:j], tail[j+len(marker)+1:]
	}
	return stdout[:i], errOut, start, cwd, base, final, gone, true
}

// saveShell records where the call ended. It returns a note for the result: the new
// directory when it changed, and what could not be kept.
func saveShell(before shellState, start, cwd, base, final string, gone bool) string {
	var notes []string
	root := ""
	if before.cwd == "" || gone {
		root = start // where a shell starts: the workspace root
	}
	if cwd == workspace || cwd == root {
		cwd = ""
	}
	if gone {
		notes = append(notes, "[the working directory "+before.cwd+" no longer exists; the command ran in "+display(start)+"]")
	}
	if cwd != before.cwd {
		if err := pdk.SessionSet(keyCwd, []byte(cwd)); err == nil && !gone {
			notes = append(notes, "[cwd is now "+display(cwd)+"]")
		}
	}
	if keepEnv() {
		env := envDiff(parseExports(base), parseExports(final))
		if len(env) > maxEnvState {
			notes = append(notes, "[the exported variables are over 64 KiB and were not kept for the next call]")
		} else if env != before.env {
			_ = pdk.SessionSet(keyEnv, []byte(env))
		}
	}
	return strings.Join(notes, "\n")
}

const workspace = "/home/user"

func display(cwd string) string {
	if cwd == "" {
		return workspace
	}
	return cwd
}

// export is one variable of `export -p`: its name and its value as bash quoted it, or
// set false for a variable exported without a value.
type export struct {
	name, quoted string
	set          bool
}

// parseExports reads the output of bash's `export -p`: lines `declare -FLAGS NAME` or
// `declare -FLAGS NAME="VALUE"`, where VALUE may span lines and escapes \ " $ and `.
func parseExports(s string) map[string]export {
	m := map[string]export{}
	for len(s) > 0 {
		if !strings.HasPrefix(s, "declare -") {
			nl := strings.IndexByte(s, '\n')
			if nl < 0 {
				break
			}
			s = s[nl+1:]
			continue
		}
		s = s[len("declare -"):]
		sp := strings.IndexByte(s, ' ')
		if sp < 0 {
			break
		}
		s = s[sp+1:]
		end := strings.IndexAny(s, "=\n")
		if end < 0 {
			m[s] = export{name: s}
			break
		}
		name := s[:end]
		if s[end] == '\n' {
			m[name] = export{name: name}
			s = s[end+1:]
			continue
		}
		s = s[end+1:]
		if len(s) == 0 || s[0] != '"' {
			break
		}
		j := 1
		for j < len(s) && s[j] != '"' {
			if s[j] == '\\' {
				j++
			}
			j++
		}
		if j >= len(s) {
			break
		}
		m[name] = export{name: name, quoted: s[:j+1], set: true}
		s = s[j+1:]
		if len(s) > 0 && s[0] == '\n' {
			s = s[1:]
		}
	}
	return m
}

// envDiff is the bash that turns a fresh shell's exports (base) into those the command
// left (final): an export line for each variable added or changed, an unset line for each
// removed. Variables a shell sets anew for itself are left alone.
func envDiff(base, final map[string]export) string {
	var b strings.Builder
	names := make([]string, 0, len(final))
	for n := range final {
		names = append(names, n)
	}
	sortStrings(names)
	for _, n := range names {
		if volatile(n) {
			continue
		}
		f := final[n]
		if o, ok := base[n]; ok && o == f {
			continue
		}
		b.WriteString("export " + n)
		if f.set {
			b.WriteString("=" + f.quoted)
		}
		b.WriteByte('\n')
	}
	gone := make([]string, 0)
	for n := range base {
		if _, ok := final[n]; !ok && !volatile(n) {
			gone = append(gone, n)
		}
	}
	sortStrings(gone)
	for _, n := range gone {
		b.WriteString("unset " + n + "\n")
	}
	return b.String()
}

func volatile(name string) bool {
	switch name {
	case "PWD", "OLDPWD", "SHLVL", "_":
		return true
	}
	return strings.HasPrefix(name, "__th_")
}

// sortStrings is an insertion sort: a few names, and no package sort in the module.
func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}
