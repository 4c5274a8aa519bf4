package main

import (
	"errors"
	"path"
	"strings"
)

// A globMatcher matches slash-separated relative paths against a glob: * and ? within a
// segment, [...] classes ([!...] or [^...] negated, \ escapes), {a,b} alternatives (nested
// allowed), and ** as a whole segment for zero or more directories. * matches dot files too.
//
// Matching runs once per listed file, in a guest where every branch is costly, so segments
// are classified when compiled (literal, *suffix, prefix*, or general) and paths are walked
// in place, without splitting.
type globMatcher struct {
	alts [][]segment // brace-expanded alternatives
}

type segKind uint8

const (
	segLiteral    segKind = iota // no wildcard: equality
	segSuffix                    // "*" + literal: HasSuffix
	segPrefix                    // literal + "*": HasPrefix
	segAny                       // "*": any non-empty name
	segGeneral                   // anything else: path.Match
	segDoubleStar                // "**": zero or more segments
)

type segment struct {
	kind segKind
	lit  string // the literal part, or the path.Match pattern for segGeneral
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
		var segs []segment
		for _, s := range strings.Split(strings.Trim(a, "/"), "/") {
			seg, err := compileSegment(s)
			if err != nil {
				return nil, err
			}
			segs = append(segs, seg)
		}
		m.alts = append(m.alts, segs)
	}
	return m, nil
}

func compileSegment(s string) (segment, error) {
	if s == "**" {
		return segment{kind: segDoubleStar}, nil
	}
	if !strings.ContainsAny(s, "*?[\\") {
		return segment{kind: segLiteral, lit: s}, nil
	}
	if rest, ok := strings.CutPrefix(s, "*"); ok && !strings.ContainsAny(rest, "*?[\\") {
		if rest == "" {
			return segment{kind: segAny}, nil
		}
		return segment{kind: segSuffix, lit: rest}, nil
	}
	if rest, ok := strings.CutSuffix(s, "*"); ok && !strings.ContainsAny(rest, "*?[\\") {
		return segment{kind: segPrefix, lit: rest}, nil
	}
	s = bangToCaret(s)
	if _, err := path.Match(s, ""); err != nil {
		return segment{}, errors.New("bad pattern segment " + s + ": unclosed [ or trailing \\")
	}
	return segment{kind: segGeneral, lit: s}, nil
}

func (s segment) match(name string) bool {
	switch s.kind {
	case segLiteral:
		return name == s.lit
	case segSuffix:
		return strings.HasSuffix(name, s.lit)
	case segPrefix:
		return strings.HasPrefix(name, s.lit)
	case segAny:
		return name != ""
	}
	ok, _ := path.Match(s.lit, name)
	return ok
}

// match reports whether the relative path p matches any alternative.
func (m *globMatcher) match(p string) bool {
	for _, a := range m.alts {
		if matchSegs(a, p) {
			return true
		}
	}
	return false
}

// matchSegs matches the segments of a pattern against the whole path p, walking it in
// place.
func matchSegs(pat []segment, p string) bool {
	for {
		if len(pat) == 0 {
			return p == ""
		}
		if pat[0].kind == segDoubleStar {
			for len(pat) > 0 && pat[0].kind == segDoubleStar {
				pat = pat[1:]
			}
			switch len(pat) {
			case 0:
				return true
			case 1: // "**/x": only the base name can match
				return pat[0].match(p[strings.LastIndexByte(p, '/')+1:])
			}
			for {
				if matchSegs(pat, p) {
					return true
				}
				i := strings.IndexByte(p, '/')
				if i < 0 {
					return false
				}
				p = p[i+1:]
			}
		}
		name, rest, more := p, "", false
		if i := strings.IndexByte(p, '/'); i >= 0 {
			name, rest, more = p[:i], p[i+1:], true
		}
		if !pat[0].match(name) {
			return false
		}
		pat, p = pat[1:], rest
		if !more { // the path is used up: what is left of the pattern must match nothing
			for _, s := range pat {
				if s.kind != segDoubleStar {
					return false
				}
			}
			return true
		}
	}
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
