package main

import (
	"errors"
	"path"
	"strings"
)

// A globMatcher matches slash-separated relative paths against a glob: * and ? within a
// segment, [...] classes ([!...] or [^...] negated, \ escapes), {a,b} alternatives (nested
// allowed), and ** as a whole segment for zero or more directories. * matches dot files too.
type globMatcher struct {
	alts [][]string // brace-expanded alternatives, split into segments
}

const maxAlternatives = 1024

var errTooManyAlternatives = errors.New("too many {...} alternatives")

func compileGlob(pattern string) (*globMatcher, error) {
	alts, err := expandBraces(pattern)
	if err != nil {
		return nil, err
	}
	m := &globMatcher{}
	for _, a := range alts {
		segs := strings.Split(strings.Trim(a, "/"), "/")
		for i, s := range segs {
			if s == "**" {
				continue
			}
			s = bangToCaret(s)
			if _, err := path.Match(s, ""); err != nil {
				return nil, errors.New("bad pattern segment " + s + ": unclosed [ or trailing \\")
			}
			segs[i] = s
		}
		m.alts = append(m.alts, segs)
	}
	return m, nil
}

// match reports whether the relative path p matches any alternative.
func (m *globMatcher) match(p string) bool {
	segs := strings.Split(p, "/")
	for _, a := range m.alts {
		if matchSegs(a, segs) {
			return true
		}
	}
	return false
}

func matchSegs(pat, segs []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			for len(pat) > 0 && pat[0] == "**" {
				pat = pat[1:]
			}
			if len(pat) == 0 {
				return true
			}
			for i := 0; i < len(segs); i++ {
				if matchSegs(pat, segs[i:]) {
					return true
				}
			}
			return false
		}
		if len(segs) == 0 {
			return false
		}
		if ok, _ := path.Match(pat[0], segs[0]); !ok {
			return false
		}
		pat, segs = pat[1:], segs[1:]
	}
	return len(segs) == 0
}

// bangToCaret writes a class negated with ! the way path.Match spells it, with ^.
func bangToCaret(s string) string {
	if !strings.Contains(s, "[!") {
		return s
	}
	b := []byte(s)
	inClass := false
	for i := 0; i < len(b); i++ {
		switch {
		case b[i] == '\\':
			i++
		case !inClass && b[i] == '[':
			inClass = true
			if i+1 < len(b) && b[i+1] == '!' {
				b[i+1] = '^'
			}
			if i+2 < len(b) && b[i+2] == ']' { // []...] and [!]...]: ] first is a member
				i += 2
			}
		case inClass && b[i] == ']':
			inClass = false
		}
	}
	return string(b)
}

// expandBraces expands {a,b} alternatives; braces without a top-level comma, and ones inside
// [...] or escaped, are literal.
func expandBraces(p string) ([]string, error) {
	open, close, commas := findBraces(p)
	if open < 0 {
		return []string{p}, nil
	}
	var out []string
	prefix, suffix := p[:open], p[close+1:]
	start := open + 1
	for _, c := range append(commas, close) {
		rest, err := expandBraces(prefix + p[start:c] + suffix)
		if err != nil {
			return nil, err
		}
		out = append(out, rest...)
		if len(out) > maxAlternatives {
			return nil, errTooManyAlternatives
		}
		start = c + 1
	}
	return out, nil
}

// findBraces finds the first {...} group holding a top-level comma.
func findBraces(p string) (open, close int, commas []int) {
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '\\':
			i++
		case '[':
			if j := classEnd(p, i); j > 0 {
				i = j
			}
		case '{':
			depth, cs := 0, []int(nil)
			for j := i; j < len(p); j++ {
				switch p[j] {
				case '\\':
					j++
				case '{':
					depth++
				case '}':
					depth--
					if depth == 0 {
						if len(cs) > 0 {
							return i, j, cs
						}
						j = len(p) // no comma: a literal brace; look further on
					}
				case ',':
					if depth == 1 {
						cs = append(cs, j)
					}
				}
			}
		}
	}
	return -1, -1, nil
}

// classEnd returns the index of the ] closing the class that opens at p[i], or -1.
func classEnd(p string, i int) int {
	j := i + 1
	if j < len(p) && (p[j] == '!' || p[j] == '^') {
		j++
	}
	if j < len(p) && p[j] == ']' {
		j++
	}
	for ; j < len(p); j++ {
		switch p[j] {
		case '\\':
			j++
		case ']':
			return j
		}
	}
	return -1
}

// staticPrefix splits off the leading segments of a pattern that hold no wildcard, so a
// search can start in that directory; the last segment always stays in the rest.
func staticPrefix(pattern string) (dir, rest string) {
	segs := strings.Split(pattern, "/")
	n := 0
	for n < len(segs)-1 && segs[n] != "" && !strings.ContainsAny(segs[n], "*?[{\\") {
		n++
	}
	return strings.Join(segs[:n], "/"), strings.Join(segs[n:], "/")
}
