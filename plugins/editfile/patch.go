package main

import (
	"errors"
	"strconv"
	"strings"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
)

// apply_patch takes the patch format OpenAI's models are trained on, as Codex offers it as
// a function tool ({"input": "*** Begin Patch\n...*** End Patch\n"}): Add File, Delete
// File, Update File with @@ context hunks, and Move to. The whole patch is checked against
// the files before anything is written, and written all or nothing: a hunk that does not
// apply leaves every file as it was, and a write that fails half way (a policy refusal, a
// file changed meanwhile) is undone.
//
// Hunks are found the way Codex finds them: each chunk's lines (context and removed) are
// sought from where the last chunk ended, first exactly, then ignoring trailing blanks,
// then ignoring leading and trailing blanks, then with typographic punctuation made plain;
// an @@ line's text, when given, is a line to find first. A chunk marked *** End of File
// matches at the end.

const patchDescription = `Applies a patch that adds, deletes, updates and renames files, in one call, all or nothing.

The input is one string in this format:

*** Begin Patch
*** Add File: path/to/new.py
+line of the new file
+another line
*** Delete File: path/to/old.py
*** Update File: path/to/file.py
*** Move to: path/to/renamed.py
@@ def some_function():
 context line (a space, then the line as it is)
-line to remove
+line to add
 context line
@@
 more context
-removed
+added
*** End Patch

- Paths are relative to the workspace root (/home/user) or absolute within it.
- In an Update, each hunk starts with @@, optionally followed by a line near the change (a function or class line) to find first. Give about 3 lines of context above and below each change, unchanged lines start with a space, removed ones with -, added ones with +. Mark a hunk that must match at the end of the file with a line *** End of File after it.
- Move to (right after Update File) renames the file, with or without changes.
- Nothing is written unless every hunk applies: a hunk that does not match is reported with the lines it looked for and the part of the file that came closest. Read the file again and fix that hunk.%s`

const patchSchema = `{
  "type": "object",
  "properties": {
    "input": {"type": "string", "minLength": 1, "description": "The whole patch, from *** Begin Patch to *** End Patch."}
  },
  "required": ["input"],
  "additionalProperties": false
}`

func patchGuardNote() string {
	if !guardOn() {
		return ""
	}
	return "\n- Add File on a file that exists replaces it only if you have seen its current contents in this session (read_file); otherwise use Update File. Updates need no read: their context lines are the check."
}

// Kinds of file operations.
const (
	opAdd = iota
	opDelete
	opUpdate
)

type fileOp struct {
	kind   int
	path   string
	moveTo string
	add    []string // the lines of an added file
	chunks []chunk
}

// chunk is one @@ hunk of an Update.
type chunk struct {
	header string   // the @@ line's text, "" for none
	src    []string // its context and - lines as the patch gave them, for messages
	old    []string
	new    []string
	eof    bool
	line   int // the patch line of its @@ (1-based), for messages
	n      int // its number within its file (1-based)
}

// patchError is a patch that cannot be parsed, at a line.
type patchError struct {
	line int
	msg  string
}

func (e *patchError) Error() string {
	if e.line > 0 {
		return "line " + strconv.Itoa(e.line) + " of the patch: " + e.msg
	}
	return e.msg
}

// parsePatch reads the patch. It is lenient where Codex is: blank lines around the
// patch, a heredoc wrapper (<<'EOF' ... EOF) and a missing final newline are accepted.
func parsePatch(text string) ([]fileOp, error) {
	text = strings.ReplaceAll(text, "\r\n", "\n")
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) > 0 && strings.HasPrefix(lines[0], "<<") && len(lines) > 2 {
		lines = lines[1 : len(lines)-1] // a heredoc's first and last lines
	}
	if len(lines) == 0 || strings.TrimSpace(lines[0]) != "*** Begin Patch" {
		return nil, &patchError{1, "the patch must start with the line *** Begin Patch"}
	}
	if strings.TrimSpace(lines[len(lines)-1]) != "*** End Patch" {
		return nil, &patchError{len(lines), "the patch must end with the line *** End Patch"}
	}
	var ops []fileOp
	i := 1
	for i < len(lines)-1 {
		l := lines[i]
		lineNo := i + 1
		switch {
		case strings.HasPrefix(l, "*** Add File: "):
			op := fileOp{kind: opAdd, path: strings.TrimSpace(l[len("*** Add File: "):])}
			i++
			for i < len(lines)-1 && strings.HasPrefix(lines[i], "+") {
				op.add = append(op.add, lines[i][1:])
				i++
			}
			ops = append(ops, op)
		case strings.HasPrefix(l, "*** Delete File: "):
			ops = append(ops, fileOp{kind: opDelete, path: strings.TrimSpace(l[len("*** Delete File: "):])})
			i++
		case strings.HasPrefix(l, "*** Update File: "):
			op := fileOp{kind: opUpdate, path: strings.TrimSpace(l[len("*** Update File: "):])}
			i++
			if i < len(lines)-1 && strings.HasPrefix(lines[i], "*** Move to: ") {
				op.moveTo = strings.TrimSpace(lines[i][len("*** Move to: "):])
				i++
			}
			var err error
			if op.chunks, i, err = parseChunks(lines, i); err != nil {
				return nil, err
			}
			if len(op.chunks) == 0 && op.moveTo == "" {
				return nil, &patchError{lineNo, "Update File " + op.path + " has no hunk: give @@ hunks, or a Move to"}
			}
			ops = append(ops, op)
		case strings.TrimSpace(l) == "":
			i++
		default:
			return nil, &patchError{lineNo, "expected *** Add File:, *** Delete File: or *** Update File:, got " + strconv.Quote(l)}
		}
	}
	if len(ops) == 0 {
		return nil, &patchError{0, "the patch changes no file"}
	}
	for _, op := range ops {
		if op.path == "" {
			return nil, &patchError{0, "a file operation has no path"}
		}
	}
	return ops, nil
}

// parseChunks reads the @@ hunks of an Update from lines[i], up to the next file
// operation or the end; it returns them and where it stopped.
func parseChunks(lines []string, i int) ([]chunk, int, error) {
	var chunks []chunk
	var cur *chunk
	for i < len(lines)-1 {
		l := lines[i]
		if strings.HasPrefix(l, "*** ") && l != "*** End of File" {
			break
		}
		switch {
		case l == "@@" || strings.HasPrefix(l, "@@ "):
			chunks = append(chunks, chunk{header: strings.TrimSpace(strings.TrimPrefix(l, "@@")), line: i + 1, n: len(chunks) + 1})
			cur = &chunks[len(chunks)-1]
		case l == "*** End of File":
			if cur == nil {
				return nil, i, &patchError{i + 1, "*** End of File before any hunk"}
			}
			cur.eof = true
		default:
			if cur == nil { // Codex lets the first hunk go without its @@
				chunks = append(chunks, chunk{line: i + 1, n: 1})
				cur = &chunks[0]
			}
			switch {
			case l == "":
				// A blank line of context whose leading space was lost.
				cur.old, cur.new = append(cur.old, ""), append(cur.new, "")
			case l[0] == ' ':
				cur.old, cur.new = append(cur.old, l[1:]), append(cur.new, l[1:])
				cur.src = append(cur.src, l)
			case l[0] == '-':
				cur.old = append(cur.old, l[1:])
				cur.src = append(cur.src, l)
			case l[0] == '+':
				cur.new = append(cur.new, l[1:])
			default:
				return nil, i, &patchError{i + 1, "a hunk line must start with ' ', '-' or '+', got " + strconv.Quote(l)}
			}
		}
		i++
	}
	return chunks, i, nil
}

// fileText is a file as lines, with how to write it back.
type fileText struct {
	lines []string
	crlf  bool // every line ended with CR LF: lines hold them without the CR
}

func splitFile(s string) fileText {
	var ft fileText
	if n := strings.Count(s, "\n"); n > 0 && strings.Count(s, "\r\n") == n {
		ft.crlf = true
		s = strings.ReplaceAll(s, "\r\n", "\n")
	}
	s = strings.TrimSuffix(s, "\n")
	if s != "" {
		ft.lines = strings.Split(s, "\n")
	}
	return ft
}

func (ft fileText) join(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	nl := "\n"
	if ft.crlf {
		nl = "\r\n"
	}
	return strings.Join(lines, nl) + nl
}

// applyChunks applies an Update's hunks to a file's lines; it returns the new lines, or
// an error text naming the hunk that did not apply and showing what it looked for and
// the part of the file that came closest.
func applyChunks(path string, lines []string, chunks []chunk) ([]string, string) {
	type repl struct {
		at, n int
		with  []string
	}
	var repls []repl
	at := 0
	for _, c := range chunks {
		name := "hunk " + strconv.Itoa(c.n) + " of " + path
		if c.header != "" {
			name += " (@@ " + c.header + ")"
		}
		if c.header != "" {
			i := seek(lines, []string{c.header}, at, false)
			if i < 0 {
				return nil, "Error: " + name + " did not apply: its @@ line " + strconv.Quote(c.header) +
					" was not found in " + path + " after line " + strconv.Itoa(at) + nearest(lines, []string{c.header}, at) +
					"\nNo file was changed. Read the file again and fix that hunk."
			}
			at = i + 1
		}
		if len(c.old) == 0 { // only additions: at the end of the file (or of the header's block)
			pos := len(lines)
			if c.header != "" && !c.eof {
				pos = at
			}
			repls = append(repls, repl{pos, 0, c.new})
			continue
		}
		old, newL := c.old, c.new
		i := seek(lines, old, at, c.eof)
		if i < 0 && len(old) > 0 && old[len(old)-1] == "" {
			// A trailing blank line of context that the file does not have at that point.
			old = old[:len(old)-1]
			if len(newL) > 0 && newL[len(newL)-1] == "" {
				newL = newL[:len(newL)-1]
			}
			i = seek(lines, old, at, c.eof)
		}
		if i < 0 {
			return nil, "Error: " + name + " did not apply: these lines (its context and its - lines) were not found in " + path +
				" in this order after line " + strconv.Itoa(at) + ":\n" + indent(c.src) + nearest(lines, c.old, at) +
				"\nNo file was changed. Read the file again and copy the lines exactly."
		}
		repls = append(repls, repl{i, len(old), newL})
		at = i + len(old)
	}
	out := make([]string, 0, len(lines)+8)
	prev := 0
	for _, r := range repls {
		if r.at < prev { // hunks out of order: the second overlaps the first
			return nil, "Error: the hunks of " + path + " overlap or are out of order; give them in file order\nNo file was changed."
		}
		out = append(out, lines[prev:r.at]...)
		out = append(out, r.with...)
		prev = r.at + r.n
	}
	return append(out, lines[prev:]...), ""
}

// seek finds pattern in lines at or after start (at the end when eof), as Codex's
// seek_sequence does: exactly, then ignoring trailing blanks, then ignoring leading and
// trailing blanks, then with typographic punctuation made ASCII. -1 when not found.
func seek(lines, pattern []string, start int, eof bool) int {
	if len(pattern) > len(lines) {
		return -1
	}
	if len(pattern) == 0 {
		return start
	}
	for _, norm := range []func(string) string{
		func(s string) string { return s },
		func(s string) string { return strings.TrimRight(s, " \t") },
		strings.TrimSpace,
		func(s string) string { return plainPunct(strings.TrimSpace(s)) },
	} {
		first := start
		if eof {
			first = len(lines) - len(pattern)
		}
		for i := first; i >= start && i+len(pattern) <= len(lines); i++ {
			ok := true
			for j, p := range pattern {
				if norm(lines[i+j]) != norm(p) {
					ok = false
					break
				}
			}
			if ok {
				return i
			}
			if eof {
				break
			}
		}
	}
	return -1
}

// plainPunct makes typographic dashes, quotes and spaces ASCII.
func plainPunct(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '\u2010', '\u2011', '\u2012', '\u2013', '\u2014', '\u2015', '\u2212':
			return '-'
		case '\u2018', '\u2019', '\u201A', '\u201B':
			return '\''
		case '\u201C', '\u201D', '\u201E', '\u201F':
			return '"'
		case '\u00A0', '\u2002', '\u2003', '\u2004', '\u2005', '\u2006', '\u2007', '\u2008', '\u2009', '\u200A', '\u202F', '\u205F', '\u3000':
			return ' '
		}
		return r
	}, s)
}

// nearest shows the lines of the file around the line most like the pattern's first
// non-blank line (of those as like it, the first at or after from), or "" when nothing is
// close.
func nearest(lines, pattern []string, from int) string {
	want := ""
	for _, p := range pattern {
		if strings.TrimSpace(p) != "" {
			want = strings.TrimSpace(p)
			break
		}
	}
	if want == "" || len(lines) == 0 {
		return ""
	}
	best, score := -1, 0
	for i, l := range lines {
		s := similarity(strings.TrimSpace(l), want)
		if s > score || (s == score && best < from && i >= from) {
			best, score = i, s
		}
	}
	if best < 0 || score*2 < len(want) {
		return ""
	}
	lo, hi := max(0, best-2), min(len(lines), best+len(pattern)+2)
	var b strings.Builder
	b.WriteString("\nThe closest part of the file (lines " + strconv.Itoa(lo+1) + "-" + strconv.Itoa(hi) + ") is:\n")
	for i := lo; i < hi; i++ {
		b.WriteString(padNum(i+1) + "\t" + lines[i] + "\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// similarity is the length of the longest common prefix plus that of the longest common
// suffix of a and b, capped at the shorter one: cheap, and enough to point at a line.
func similarity(a, b string) int {
	n := min(len(a), len(b))
	p := 0
	for p < n && a[p] == b[p] {
		p++
	}
	s := 0
	for s < n-p && a[len(a)-1-s] == b[len(b)-1-s] {
		s++
	}
	return p + s
}

func padNum(n int) string {
	s := strconv.Itoa(n)
	for len(s) < 6 {
		s = " " + s
	}
	return s
}

func indent(lines []string) string {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("    " + l + "\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// step is one write or removal of an applied patch, with what undoes it.
type step struct {
	path    string
	remove  bool   // remove the file (else write data)
	data    []byte // what to write
	version string // the version the file must have now ("" for none)
	// undo: write old back (existed), or remove what was written (!existed).
	old     []byte
	existed bool
	done    bool
}

func applyPatch(in pdk.Input) abi.Result {
	ops, err := parsePatch(in.String("input"))
	if err != nil {
		return abi.ErrorText("Error: the patch could not be read: " + err.Error() + "\nNo file was changed.")
	}
	// Plan: read every file the patch touches and compute what it becomes.
	var steps []*step
	var summary []string
	seenPaths := map[string]bool{}
	claim := func(p string) string {
		r := relPath(p)
		if seenPaths[r] {
			return "Error: the patch changes " + p + " twice; give each file one operation\nNo file was changed."
		}
		seenPaths[r] = true
		return ""
	}
	for _, op := range ops {
		if msg := claim(op.path); msg != "" {
			return abi.ErrorText(msg)
		}
		switch op.kind {
		case opAdd:
			data, version, err := pdk.ReadFileVersioned(op.path)
			existed := err == nil
			switch {
			case errors.Is(err, pdk.ErrNotFound):
			case err != nil:
				return abi.ErrorText("Error: Add File " + op.path + ": " + reason(err, op.path) + "\nNo file was changed.")
			default:
				if msg := guard(op.path, version, "overwrite", "overwritten"); msg != "" {
					return abi.ErrorText(msg + " (or use Update File)\nNo file was changed.")
				}
			}
			content := strings.Join(op.add, "\n")
			if len(op.add) > 0 {
				content += "\n"
			}
			steps = append(steps, &step{path: op.path, data: []byte(content), version: version, old: data, existed: existed})
			summary = append(summary, "A "+op.path)
		case opDelete:
			data, version, err := pdk.ReadFileVersioned(op.path)
			if err != nil {
				return abi.ErrorText("Error: Delete File " + op.path + ": " + reason(err, op.path) + "\nNo file was changed.")
			}
			steps = append(steps, &step{path: op.path, remove: true, version: version, old: data, existed: true})
			summary = append(summary, "D "+op.path)
		case opUpdate:
			data, version, err := pdk.ReadFileVersioned(op.path)
			if err != nil {
				return abi.ErrorText("Error: Update File " + op.path + ": " + reason(err, op.path) + "\nNo file was changed.")
			}
			ft := splitFile(string(data))
			lines, msg := applyChunks(op.path, ft.lines, op.chunks)
			if msg != "" {
				return abi.ErrorText(msg)
			}
			out := []byte(ft.join(lines))
			if op.moveTo == "" || relPath(op.moveTo) == relPath(op.path) {
				steps = append(steps, &step{path: op.path, data: out, version: version, old: data, existed: true})
				summary = append(summary, "M "+op.path)
				continue
			}
			if msg := claim(op.moveTo); msg != "" {
				return abi.ErrorText(msg)
			}
			if _, err := pdk.Stat(op.moveTo); err == nil {
				return abi.ErrorText("Error: Move to " + op.moveTo + ": it already exists; delete it in the patch first, or move elsewhere\nNo file was changed.")
			} else if !errors.Is(err, pdk.ErrNotFound) {
				return abi.ErrorText("Error: Move to " + op.moveTo + ": " + reason(err, op.moveTo) + "\nNo file was changed.")
			}
			steps = append(steps, &step{path: op.moveTo, data: out},
				&step{path: op.path, remove: true, version: version, old: data, existed: true})
			summary = append(summary, "R "+op.path+" -> "+op.moveTo)
		}
	}
	// Do it, writes first, then removals; undo what was done if a step fails.
	ordered := make([]*step, 0, len(steps))
	for _, s := range steps {
		if !s.remove {
			ordered = append(ordered, s)
		}
	}
	for _, s := range steps {
		if s.remove {
			ordered = append(ordered, s)
		}
	}
	for _, s := range ordered {
		var err error
		if s.remove {
			err = removeVersioned(s.path, s.version)
		} else {
			err = pdk.WriteFileVersioned(s.path, s.data, s.version)
		}
		if err != nil {
			undone := undo(ordered)
			what := "write"
			if s.remove {
				what = "remove"
			}
			msg := "Error: could not " + what + " " + s.path + ": " + reason(err, s.path)
			if errors.Is(err, pdk.ErrChanged) {
				msg = "Error: " + s.path + " changed while the patch was being applied (another process wrote it): read it again and redo the patch"
			}
			return abi.ErrorText(msg + "\n" + undone)
		}
		s.done = true
	}
	for _, s := range ordered {
		if s.remove {
			forget(s.path)
		} else {
			markSeen(s.path, versionOf(s.data))
		}
	}
	return abi.Text("Success. Updated the following files:\n" + strings.Join(summary, "\n"))
}

// removeVersioned removes a file only if it still has version.
func removeVersioned(path, version string) error {
	_, cur, err := pdk.ReadFileVersioned(path)
	if err != nil {
		return err
	}
	if cur != version {
		return pdk.ErrChanged
	}
	return pdk.Remove(path)
}

// undo reverts the steps done, newest first, and says what happened.
func undo(steps []*step) string {
	var failed []string
	for i := len(steps) - 1; i >= 0; i-- {
		s := steps[i]
		if !s.done {
			continue
		}
		var err error
		switch {
		case s.existed:
			err = pdk.WriteFile(s.path, s.old)
		default:
			err = pdk.Remove(s.path)
		}
		if err != nil {
			failed = append(failed, s.path+" ("+err.Error()+")")
		}
	}
	if len(failed) > 0 {
		return "The files the patch had already changed were restored, except: " + strings.Join(failed, ", ") + ". Check them."
	}
	return "No file was changed (what the patch had already written was undone)."
}
