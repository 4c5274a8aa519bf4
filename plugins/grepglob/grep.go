package main

import (
	gopath "path"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
	"github.com/toolhost/toolhost/plugins/internal/scan"
)

const grepDescription = `Searches file contents with a regular expression (GNU grep -P: Perl-compatible syntax, close to ripgrep's) and returns matches with paths relative to the workspace root, sorted by path.

- pattern is a regular expression: escape regex characters to search for them literally, e.g. "interface\\{\\}" or "\\(x\\)". It is passed to grep as data, never through a shell.
- path is a file or directory to search (default: the workspace root); directories are searched recursively. .git and node_modules are skipped, and so are binary files.
- glob limits the files searched, e.g. "*.go", "*.{ts,tsx}", or with directories "src/**/*.ts" (relative to path). Several globs may be given separated by spaces.
- output_mode: "content" (default) gives matching lines as path:line:text, with context lines as path-line-text when context > 0 and -- between separate groups; "files_with_matches" gives only the paths of matching files; "count" gives path:number of matching lines.
- ignore_case makes the search case-insensitive; context shows that many lines before and after each match (content mode).
- Matching works on bytes: non-ASCII text is found when written literally, but "." matches one byte of it and ignore_case folds ASCII letters only. Files that are not UTF-8 are searched too.
- head_limit caps the entries returned (lines, paths or counts; default 250, 0 for no limit). Lines longer than 500 characters are cut.
- Use it instead of running grep or rg through bash.`

const grepSchema = `{
  "type": "object",
  "properties": {
    "pattern": {"type": "string", "minLength": 1, "description": "The regular expression to search for (PCRE syntax)."},
    "path": {"type": "string", "description": "The file or directory to search, relative to the workspace root or absolute. Default: the workspace root."},
    "glob": {"type": "string", "description": "Only search files whose path matches this glob, e.g. \"*.go\" or \"src/**/*.{ts,tsx}\"."},
    "ignore_case": {"type": "boolean", "default": false, "description": "Match case-insensitively."},
    "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"], "default": "content", "description": "content: matching lines; files_with_matches: paths only; count: matches per file."},
    "context": {"type": "integer", "minimum": 0, "maximum": 100, "default": 0, "description": "Lines of context before and after each match (content mode)."},
    "head_limit": {"type": "integer", "minimum": 0, "default": 250, "description": "Return at most this many entries; 0 for no limit."}
  },
  "required": ["pattern"],
  "additionalProperties": false
}`

const (
	defaultHeadLimit = 250
	maxLineLen       = 500
	grepTimeoutMS    = 30_000
	// outputBudget keeps a result under the host's 50,000-character cut, which would
	// drop entries from the middle instead of the end.
	outputBudget = 45_000
)

// grepArgs are the parsed inputs of the grep tool.
type grepArgs struct {
	pattern    string
	path       string // as given to grep: workspace-relative, or absolute outside it
	mode       string
	ignoreCase bool
	context    int
	headLimit  int
	filter     *globMatcher // paths (relative to path) to keep, when --include cannot say it
	includes   []string
}

// parseGlobs splits a glob list and decides what grep's --include can do alone (base-name
// globs) and what needs filtering by the plugin (globs with directories or **). An error is
// a message for the model.
func parseGlobs(list string) (includes []string, filter *globMatcher, errText string) {
	var alts []string
	for _, g := range splitGlobs(list) {
		exp, err := expandBraces(g)
		if err != nil {
			return nil, nil, "Error: bad glob " + g + ": " + err.Error()
		}
		alts = append(alts, exp...)
	}
	needFilter := false
	for _, a := range alts {
		if strings.Contains(a, "/") || strings.Contains(a, "**") {
			needFilter = true
		}
	}
	if !needFilter {
		for _, a := range alts {
			if _, err := compileGlob(a); err != nil {
				return nil, nil, "Error: bad glob " + a + ": " + err.Error()
			}
		}
		return alts, nil, ""
	}
	// Filter with the full globs; a glob without a slash matches a base name at any depth,
	// as --include does. Still narrow grep's work by the last segment when all have one.
	var full []string
	narrow := true
	for _, a := range alts {
		a = strings.TrimPrefix(a, "./")
		if !strings.Contains(a, "/") {
			a = "**/" + a
		}
		full = append(full, a)
		last := a[strings.LastIndexByte(a, '/')+1:]
		if last == "**" || last == "" {
			narrow = false
		}
		includes = append(includes, last)
	}
	m := &globMatcher{}
	for _, a := range full {
		c, err := compileGlob(a)
		if err != nil {
			return nil, nil, "Error: bad glob " + a + ": " + err.Error()
		}
		m.alts = append(m.alts, c.alts...)
	}
	if !narrow {
		includes = nil
	}
	return includes, m, ""
}

// splitGlobs splits on spaces and commas outside braces.
func splitGlobs(s string) []string {
	var out []string
	depth, start := 0, 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) {
			switch s[i] {
			case '{':
				depth++
				continue
			case '}':
				depth--
				continue
			case ' ', '\t', '\n', ',':
				if depth > 0 {
					continue
				}
			default:
				continue
			}
		}
		if start < i {
			out = append(out, s[start:i])
		}
		start = i + 1
	}
	return out
}

// argv builds grep's command line: options, then -e PATTERN so a leading - is data, then
// -- so the path is never an option.
func (a *grepArgs) argv() []string {
	argv := []string{"grep", "-r", "-H", "-P", "-I", "-Z", "--exclude-dir=.git", "--exclude-dir=node_modules"}
	switch a.mode {
	case "files_with_matches":
		argv = append(argv, "-l")
	case "count":
		argv = append(argv, "-c")
	default:
		argv = append(argv, "-n")
		if a.context > 0 {
			argv = append(argv, "-C", strconv.Itoa(a.context))
		}
	}
	if a.ignoreCase {
		argv = append(argv, "-i")
	}
	for _, g := range a.includes {
		argv = append(argv, "--include="+g)
	}
	return append(argv, "-e", a.pattern, "--", a.path)
}

func grep(in pdk.Input) abi.Result {
	a := grepArgs{
		pattern:    in.String("pattern"),
		path:       wsRel(in.String("path")),
		mode:       in.String("output_mode"),
		ignoreCase: in.Bool("ignore_case"),
		context:    in.Int("context", 0),
		headLimit:  in.Int("head_limit", defaultHeadLimit),
	}
	if a.mode == "" {
		a.mode = "content"
	}
	if g := in.String("glob"); g != "" {
		var errText string
		if a.includes, a.filter, errText = parseGlobs(g); errText != "" {
			return abi.ErrorText(errText)
		}
	}
	res, err := pdk.Exec(abi.ExecRequest{
		Argv: a.argv(),
		// Byte semantics: under a UTF-8 locale grep silently drops matching lines that are
		// not valid UTF-8 (a Latin-1 file); a missed match misleads more than a byte-wise
		// "." or an ASCII-only ignore_case.
		Env:       map[string]string{"LC_ALL": "C"},
		TimeoutMS: grepTimeoutMS,
	})
	if err != nil {
		return abi.ErrorText("Error: could not run grep: " + err.Error())
	}
	return a.format(res)
}

// entry is one result: a line (content), a path (files_with_matches) or a count.
type entry struct {
	file  string
	line  int
	sep   byte // ':' for a match, '-' for a context line
	text  string
	count int
	brk   bool // a "--" group separator came before it
}

func (a *grepArgs) format(res abi.ExecResult) abi.Result {
	switch {
	case res.TimedOut:
		return abi.ErrorText("Error: grep timed out after " + strconv.Itoa(grepTimeoutMS/1000) + " s; search a narrower path or use a simpler pattern")
	case res.ExitCode == 1 && res.Stdout == "":
		return a.structured(abi.Text("[grep: no matches found]"), nil, 0, false)
	case res.ExitCode != 0 && res.ExitCode != 2 && res.ExitCode != 1:
		return abi.ErrorText("Error: grep failed (exit " + strconv.Itoa(res.ExitCode) + "): " + strings.TrimSpace(res.Stderr))
	case res.ExitCode == 2 && res.Stdout == "":
		return abi.ErrorText("Error: grep failed: " + strings.TrimSpace(res.Stderr))
	}
	entries := a.parse(res.Stdout)
	if len(entries) == 0 {
		return a.structured(abi.Text("[grep: no matches found]"), nil, 0, false)
	}
	var b strings.Builder
	n := len(entries)
	if a.headLimit > 0 && n > a.headLimit {
		entries = entries[:a.headLimit]
	}
	prev := ""
	full := false
	for i, e := range entries {
		if b.Len() > outputBudget {
			entries, full = entries[:i], true
			break
		}
		switch a.mode {
		case "files_with_matches":
			b.WriteString(e.file)
		case "count":
			b.WriteString(e.file)
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(e.count))
		default:
			if i > 0 && a.context > 0 && (e.brk || e.file != prev) {
				b.WriteString("--\n")
			}
			prev = e.file
			b.WriteString(e.file)
			b.WriteByte(e.sep)
			b.WriteString(strconv.Itoa(e.line))
			b.WriteByte(e.sep)
			b.WriteString(cutLine(e.text))
		}
		b.WriteByte('\n')
	}
	switch {
	case full:
		b.WriteString("[showing first " + strconv.Itoa(len(entries)) + " of " + strconv.Itoa(n) +
			" entries (output size limit); narrow the pattern, path or glob, or use files_with_matches]\n")
	case len(entries) < n:
		b.WriteString("[showing first " + strconv.Itoa(len(entries)) + " of " + strconv.Itoa(n) +
			" entries; narrow the pattern or raise head_limit]\n")
	}
	if res.StdoutCut > 0 {
		b.WriteString("[grep's output was too large: " + strconv.FormatInt(res.StdoutCut, 10) +
			" bytes were cut from its middle, so results are missing; narrow the pattern, path or glob]\n")
	}
	if res.ExitCode == 2 {
		b.WriteString("[grep reported errors for some files: " + firstLines(res.Stderr, 5) + "]\n")
	}
	return a.structured(abi.Text(b.String()), entries, n, len(entries) < n || res.StdoutCut > 0)
}

// structured adds grep's structured result (grepOutputSchema) to r: the entries shown, in
// the mode's shape, how many were found, and whether some are not shown.
func (a *grepArgs) structured(r abi.Result, entries []entry, total int, truncated bool) abi.Result {
	items := make([][]byte, 0, len(entries))
	key := "matches"
	for _, e := range entries {
		var o pdk.JSONObject
		switch a.mode {
		case "files_with_matches":
			items = append(items, pdk.JSONString(e.file))
			continue
		case "count":
			o.Str("path", e.file).Int("count", int64(e.count))
		default:
			o.Str("path", e.file).Int("line", int64(e.line)).Str("text", cutLine(e.text)).Bool("context", e.sep != ':')
		}
		items = append(items, o.Bytes())
	}
	switch a.mode {
	case "files_with_matches":
		key = "files"
	case "count":
		key = "counts"
	}
	var o pdk.JSONObject
	r.Structured = o.Str("mode", a.mode).Raw(key, pdk.JSONArray(items)).Int("total", int64(total)).Bool("truncated", truncated).Bytes()
	return r
}

// grepOutputSchema is grep's output schema. content mode fills matches (context lines
// marked), files_with_matches fills files, count fills counts.
const grepOutputSchema = `{
  "type": "object",
  "properties": {
    "mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]},
    "matches": {"type": "array", "items": {"type": "object", "properties": {
      "path": {"type": "string"}, "line": {"type": "integer", "minimum": 1}, "text": {"type": "string"},
      "context": {"type": "boolean", "description": "a context line around a match, not a match"}},
      "required": ["path", "line", "text", "context"], "additionalProperties": false}},
    "files": {"type": "array", "items": {"type": "string"}},
    "counts": {"type": "array", "items": {"type": "object", "properties": {
      "path": {"type": "string"}, "count": {"type": "integer", "minimum": 0}},
      "required": ["path", "count"], "additionalProperties": false}},
    "total": {"type": "integer", "minimum": 0, "description": "Entries found, before head_limit and the size limit."},
    "truncated": {"type": "boolean", "description": "Some entries are not shown."}
  },
  "required": ["mode", "total", "truncated"],
  "additionalProperties": false
}`

// parse reads grep -Z output: NUL ends every file name, so names with ':' or spaces are
// unambiguous. Entries come back sorted by path, each file's lines in file order. grep
// prints a file's lines together, so the work per line is small: one NUL search, the line
// number, and a comparison with the previous line's file name; names are cleaned and
// filtered once per file, and files (not lines) are sorted.
func (a *grepArgs) parse(out string) []entry {
	var entries []entry
	type group struct {
		file       string
		start, end int // entries[start:end]
	}
	var groups []group
	rawPrev, prevKept := "\x00", false // no file name contains NUL
	add := func(raw string, e entry) {
		if raw != rawPrev {
			rawPrev, prevKept = raw, a.keep(raw)
			if prevKept {
				groups = append(groups, group{file: grepRel(raw), start: len(entries), end: len(entries)})
			}
		}
		if prevKept {
			e.file = groups[len(groups)-1].file
			entries = append(entries, e)
			groups[len(groups)-1].end = len(entries)
		}
	}
	if a.mode == "files_with_matches" {
		for len(out) > 0 {
			i := scan.IndexByte(out, 0)
			if i < 0 {
				i = len(out)
			}
			if f := strings.TrimPrefix(out[:i], "\n"); f != "" {
				add(f, entry{})
			}
			out = out[min(i+1, len(out)):]
		}
	} else {
		brk := false
		for len(out) > 0 {
			i := scan.IndexByte(out, '\n')
			if i < 0 {
				i = len(out)
			}
			line := out[:i]
			out = out[min(i+1, len(out)):]
			if line == "--" {
				brk = true
				continue
			}
			nul := scan.IndexByte(line, 0)
			if nul < 0 {
				continue // a name holding a newline, or a record cut by the host
			}
			raw, rest := line[:nul], line[nul+1:]
			e := entry{brk: brk}
			if a.mode == "count" {
				c, err := strconv.Atoi(rest)
				if err != nil || c == 0 {
					continue
				}
				e.count = c
			} else {
				n := 0
				for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
					e.line = e.line*10 + int(rest[n]-'0')
					n++
				}
				if n == 0 || n == len(rest) || (rest[n] != ':' && rest[n] != '-') {
					continue
				}
				e.sep, e.text = rest[n], strings.TrimSuffix(rest[n+1:], "\r")
			}
			brk = false
			add(raw, e)
		}
	}
	if len(groups) <= 1 {
		return entries
	}
	slices.SortStableFunc(groups, func(x, y group) int { return strings.Compare(x.file, y.file) })
	sorted := make([]entry, 0, len(entries))
	for _, g := range groups {
		sorted = append(sorted, entries[g.start:g.end]...)
	}
	return sorted
}

// grepRel turns a path as grep printed it into the workspace-relative form. grep joins
// the (already clean) operand and the names it finds, so only "./" and the workspace
// prefix need removing.
func grepRel(p string) string {
	if rest, ok := strings.CutPrefix(p, "./"); ok {
		return rest
	}
	if rest, ok := strings.CutPrefix(p, workspace+"/"); ok {
		return rest
	}
	return p
}

// keep applies the plugin-side glob filter to a path as grep printed it.
func (a *grepArgs) keep(f string) bool {
	if a.filter == nil {
		return true
	}
	rel := gopath.Clean(f)
	if base := gopath.Clean(a.path); base != "." {
		if r, ok := strings.CutPrefix(rel, base+"/"); ok {
			rel = r
		} else if rel == base {
			rel = gopath.Base(rel)
		}
	}
	return a.filter.match(rel)
}

func cutLine(s string) string {
	if len(s) <= maxLineLen || utf8.RuneCountInString(s) <= maxLineLen {
		return s
	}
	i, n := 0, 0
	for i = range s {
		if n == maxLineLen {
			break
		}
		n++
	}
	return s[:i] + " [... " + strconv.Itoa(utf8.RuneCountInString(s[i:])) + " more characters]"
}

func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = append(lines[:n], "...")
	}
	return strings.Join(lines, "; ")
}
