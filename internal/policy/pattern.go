package policy

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// Path patterns are relative to the workspace root and slash-separated. In a segment, *
// matches any run of characters but '/', ? one character, [...] a class ([^...] negated,
// \ escapes); a segment that is just ** matches zero or more whole segments. "docs/**"
// is docs/ and everything below it, and docs itself; "**/*.md" is every .md file at any
// depth; "**" is the whole workspace.
//
// A pattern that starts with ! refuses what it matches, and everything below it, whatever
// the allowing patterns say: ["**", "!**/.env"] is the whole workspace but any .env file
// (and anything inside a directory named .env). Refusing patterns ignore case, so .ENV is
// refused too on a filesystem that folds case; allowing patterns match case exactly (a
// path they do not match is refused, which is the safe side either way).

// maxDoubleStars bounds the ** segments of one pattern: matching costs grow with their
// number (every ** tries each split of the remaining segments).
const maxDoubleStars = 4

// pattern is one compiled path pattern.
type pattern struct {
	segs []string // each "**" or a path.Match pattern
	// fold: compare ignoring case (a refusing pattern; its segments are lower-cased).
	fold bool
}

// patternSet is an operation's patterns: a path is allowed when an allowing pattern
// matches it and no refusing pattern matches it or one of its directories.
type patternSet struct {
	src   []string // as written, for messages
	str   string   // src joined, or "nothing"
	allow []pattern
	deny  []pattern // lower-cased: they match any case
	// all: "**" and nothing refused, so every path is allowed and none needs checking.
	all bool
}

func compilePatterns(list []string) (*patternSet, error) {
	s := &patternSet{src: append([]string(nil), list...)}
	hasAll := false
	for _, raw := range list {
		p, deny := strings.CutPrefix(raw, "!")
		if deny {
			p = strings.ToLower(p)
		}
		c, err := compilePattern(p)
		if err != nil {
			return nil, fmt.Errorf("pattern %q: %w", raw, err)
		}
		if deny {
			c.fold = true
			s.deny = append(s.deny, c)
			continue
		}
		if len(c.segs) == 1 && c.segs[0] == "**" {
			hasAll = true
		}
		s.allow = append(s.allow, c)
	}
	s.all = hasAll && len(s.deny) == 0
	s.str = "nothing"
	if len(list) > 0 {
		s.str = strings.Join(list, ", ")
	}
	return s, nil
}

func compilePattern(p string) (pattern, error) {
	switch {
	case p == "":
		return pattern{}, errors.New("is empty")
	case strings.HasPrefix(p, "/"):
		return pattern{}, errors.New("is absolute: patterns are relative to the workspace (/home/user), like src/** or docs/*.md")
	case strings.IndexByte(p, 0) >= 0:
		return pattern{}, errors.New("contains a NUL byte")
	}
	var c pattern
	stars := 0
	for _, seg := range strings.Split(strings.TrimSuffix(p, "/"), "/") {
		switch {
		case seg == "":
			return pattern{}, errors.New("has an empty segment (//)")
		case seg == "." || seg == "..":
			return pattern{}, fmt.Errorf("has a %q segment: write the path as it is from the workspace root", seg)
		case seg == "**":
			if n := len(c.segs); n > 0 && c.segs[n-1] == "**" {
				continue // ** ** is **
			}
			if stars++; stars > maxDoubleStars {
				return pattern{}, fmt.Errorf("has more than %d ** segments", maxDoubleStars)
			}
		case strings.Contains(seg, "**"):
			return pattern{}, fmt.Errorf("segment %q: ** must be a whole segment (a/**/b); * matches within a segment", seg)
		default:
			if _, err := path.Match(seg, ""); err != nil {
				return pattern{}, fmt.Errorf("segment %q: %w", seg, err)
			}
		}
		c.segs = append(c.segs, seg)
	}
	return c, nil
}

// split appends the segments of a clean workspace-relative path to buf ("." has none).
// Callers pass a small array on their stack, so a decision allocates nothing.
func split(buf []string, rel string) []string {
	if rel == "." || rel == "" {
		return buf
	}
	for {
		i := strings.IndexByte(rel, '/')
		if i < 0 {
			return append(buf, rel)
		}
		buf = append(buf, rel[:i])
		rel = rel[i+1:]
	}
}

// allowed reports whether the set allows the path.
func (s *patternSet) allowed(segs []string) bool {
	if s.all {
		return true
	}
	return s.allowedByPattern(segs) && !s.denied(segs)
}

func (s *patternSet) allowedByPattern(segs []string) bool {
	for _, p := range s.allow {
		if matchSegs(p.segs, segs, false) {
			return true
		}
	}
	return false
}

// denied reports whether a refusing pattern matches the path or one of its directories.
func (s *patternSet) denied(segs []string) bool {
	for _, p := range s.deny {
		for n := 1; n <= len(segs); n++ {
			if matchSegs(p.segs, segs[:n], true) {
				return true
			}
		}
		if len(segs) == 0 && matchSegs(p.segs, nil, true) {
			return true
		}
	}
	return false
}

// leadsTo reports whether some path below the directory segs may be allowed: a listing or
// a stat of the directory then shows the way to it.
func (s *patternSet) leadsTo(segs []string) bool {
	if s.all {
		return true
	}
	if s.denied(segs) {
		return false
	}
	for _, p := range s.allow {
		if prefixMatch(p.segs, segs) {
			return true
		}
	}
	return false
}

// matchSegs matches a path's segments against a pattern's; fold ignores case (the
// pattern's segments are lower-cased already).
func matchSegs(p, s []string, fold bool) bool {
	for len(p) > 0 {
		if p[0] == "**" {
			rest := p[1:]
			if len(rest) == 0 {
				return true
			}
			for i := 0; i <= len(s); i++ {
				if matchSegs(rest, s[i:], fold) {
					return true
				}
			}
			return false
		}
		if len(s) == 0 || !matchSeg(p[0], s[0], fold) {
			return false
		}
		p, s = p[1:], s[1:]
	}
	return len(s) == 0
}

// matchSeg matches one segment: a literal by comparison (no allocation), else path.Match.
func matchSeg(pat, seg string, fold bool) bool {
	if strings.IndexByte(pat, '*') < 0 && strings.IndexByte(pat, '?') < 0 &&
		strings.IndexByte(pat, '[') < 0 && strings.IndexByte(pat, '\\') < 0 {
		if fold {
			return strings.EqualFold(pat, seg)
		}
		return pat == seg
	}
	if fold {
		seg = strings.ToLower(seg)
	}
	ok, _ := path.Match(pat, seg)
	return ok
}

// prefixMatch reports whether s followed by one or more segments can match p.
func prefixMatch(p, s []string) bool {
	for len(s) > 0 {
		if len(p) == 0 {
			return false
		}
		if p[0] == "**" {
			return true // ** takes the rest of s, and what follows can match the rest of p
		}
		if !matchSeg(p[0], s[0], false) {
			return false
		}
		p, s = p[1:], s[1:]
	}
	return len(p) > 0
}

// String lists the patterns as written, or "nothing".
func (s *patternSet) String() string { return s.str }
