// Package mdcheck finds what breaks a Markdown page of the repository when it is read on
// a forge: a code fence that never closes (it swallows the rest of the page), a fence
// with text glued to it, and a relative link to a file or a heading that does not exist.
// Its test runs it over every .md file of the repository, so `make test` fails on them.
//
// It is not a Markdown parser: it knows fenced code blocks, inline code spans, inline
// links and link reference definitions, and GitHub's rule for heading anchors, which is
// what these failures need.
package mdcheck

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

// Problem is one thing wrong with a page.
type Problem struct {
	File string // as given to Check
	Line int    // 1-based
	Msg  string
}

func (p Problem) String() string { return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Msg) }

// Page is a Markdown file split into what the checks need.
type Page struct {
	lines   []string
	inCode  []bool          // the line is inside a fenced block (the fences included)
	anchors map[string]bool // the anchors of its headings
}

var fenceRE = regexp.MustCompile("^ {0,3}(`{3,}|~{3,})(.*)$")

// Parse reads a page, and reports its broken fences.
func Parse(name, text string) (*Page, []Problem) {
	p := &Page{lines: strings.Split(text, "\n"), anchors: map[string]bool{}}
	p.inCode = make([]bool, len(p.lines))
	var probs []Problem
	var open string // the opening fence's run, "```" or "~~~~"; "" outside a block
	openLine := 0
	seen := map[string]int{}
	for i, line := range p.lines {
		if strings.HasPrefix(line, "<<<<<<< ") || strings.HasPrefix(line, ">>>>>>> ") {
			probs = append(probs, Problem{name, i + 1, "a merge conflict's marker: resolve the conflict and remove the markers"})
		}
		m := fenceRE.FindStringSubmatch(line)
		if open == "" {
			if m == nil {
				if h, ok := heading(line); ok {
					p.addAnchor(h, seen)
				}
				continue
			}
			info := strings.TrimSpace(m[2])
			if m[1][0] == '`' && strings.Contains(info, "`") {
				continue // not a fence (CommonMark): an inline code span of backticks
			}
			p.inCode[i] = true
			open, openLine = m[1], i+1
			if len(strings.Fields(info)) > 1 {
				probs = append(probs, Problem{name, i + 1, fmt.Sprintf("a code fence opens with text after it (%q): if it was meant to close a block, put the text on a line of its own", short(info))})
			}
			continue
		}
		p.inCode[i] = true
		if m == nil || m[1][0] != open[0] || len(m[1]) < len(open) {
			continue
		}
		rest := strings.TrimSpace(m[2])
		if rest == "" {
			open = ""
			continue
		}
		if len(strings.Fields(rest)) > 1 {
			probs = append(probs, Problem{name, i + 1, fmt.Sprintf("this fence has text after it (%q), so it does not close the block opened on line %d: put the text on a line of its own", short(rest), openLine)})
		}
	}
	if open != "" {
		probs = append(probs, Problem{name, openLine, "this code fence is never closed: the rest of the page renders as code"})
	}
	return p, probs
}

func short(s string) string {
	if r := []rune(s); len(r) > 40 {
		return string(r[:40]) + "…"
	}
	return s
}

var headingRE = regexp.MustCompile(`^ {0,3}#{1,6}[ \t]+(.*?)[ \t#]*$`)

func heading(line string) (string, bool) {
	m := headingRE.FindStringSubmatch(line)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// addAnchor records a heading's anchor as GitHub makes it: the text without markup,
// lower case, with everything but letters, digits, spaces, hyphens and underscores
// removed and spaces made hyphens; a repeated anchor gets -1, -2, ...
func (p *Page) addAnchor(text string, seen map[string]int) {
	text = linkRE.ReplaceAllString(text, "$1") // [text](url) reads as text
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	a := b.String()
	if n := seen[a]; n > 0 {
		seen[a] = n + 1
		a = fmt.Sprintf("%s-%d", a, n)
	} else {
		seen[a] = 1
	}
	p.anchors[a] = true
}

// HasAnchor says whether the page has a heading whose anchor is a.
func (p *Page) HasAnchor(a string) bool { return p.anchors[strings.ToLower(a)] }

var (
	linkRE     = regexp.MustCompile(`!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	refDefRE   = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s+.*)?$`)
	codeSpanRE = regexp.MustCompile("`+[^`]*`+")
)

// Link is a link target of a page and where it is.
type Link struct {
	Line   int
	Target string
}

// Links returns the page's link targets outside code: inline links and images, and link
// reference definitions.
func (p *Page) Links() []Link {
	var out []Link
	for i, line := range p.lines {
		if p.inCode[i] || strings.HasPrefix(line, "    ") || strings.HasPrefix(line, "\t") {
			continue // a fenced or an indented code block
		}
		if m := refDefRE.FindStringSubmatch(line); m != nil {
			out = append(out, Link{i + 1, m[1]})
			continue
		}
		line = codeSpanRE.ReplaceAllString(line, "")
		for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
			out = append(out, Link{i + 1, m[2]})
		}
	}
	return out
}

// Pages reads pages by path, once each.
type Pages map[string]*Page

// Check reports the broken fences of the Markdown file at path and its dead relative
// links: to a file or directory that does not exist, or to a heading of a Markdown file
// (its own included) that it does not have. root bounds the files a link may name: a link
// out of root is dead too (it is dead in a clone). Links with a scheme (https:, mailto:)
// are not followed.
func (ps Pages) Check(root, path string) ([]Problem, error) {
	page, probs, err := ps.load(path)
	if err != nil {
		return nil, err
	}
	name, _ := filepath.Rel(root, path)
	for i := range probs {
		probs[i].File = name
	}
	for _, l := range page.Links() {
		if msg := ps.checkLink(root, path, page, l.Target); msg != "" {
			probs = append(probs, Problem{name, l.Line, msg})
		}
	}
	return probs, nil
}

func (ps Pages) load(path string) (*Page, []Problem, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	page, probs := Parse(path, string(b))
	ps[path] = page
	return page, probs, nil
}

func (ps Pages) checkLink(root, from string, page *Page, target string) string {
	if target == "" {
		return "a link with no target"
	}
	u, err := url.Parse(target)
	if err != nil {
		return fmt.Sprintf("link %q does not parse: %v", target, err)
	}
	if u.Scheme != "" || u.Host != "" {
		return ""
	}
	if u.Path == "" { // #anchor of this page
		if !page.HasAnchor(u.Fragment) {
			return fmt.Sprintf("link %q: this page has no heading with that anchor", target)
		}
		return ""
	}
	if strings.HasPrefix(u.Path, "/") {
		return fmt.Sprintf("link %q is absolute: make it relative to this file", target)
	}
	dest := filepath.Join(filepath.Dir(from), filepath.FromSlash(u.Path))
	if rel, err := filepath.Rel(root, dest); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return fmt.Sprintf("link %q leads out of the repository", target)
	}
	st, err := os.Stat(dest)
	if err != nil {
		return fmt.Sprintf("link %q: no such file or directory", target)
	}
	if u.Fragment == "" || st.IsDir() || !strings.EqualFold(filepath.Ext(dest), ".md") {
		return ""
	}
	other, ok := ps[dest]
	if !ok {
		if other, _, err = ps.load(dest); err != nil {
			return fmt.Sprintf("link %q: %v", target, err)
		}
	}
	if !other.HasAnchor(u.Fragment) {
		return fmt.Sprintf("link %q: %s has no heading with that anchor", target, u.Path)
	}
	return ""
}
