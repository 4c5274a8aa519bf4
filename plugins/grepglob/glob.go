package main

import (
	"errors"
	gopath "path"
	"strconv"
	"strings"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
)

const globDescription = `Finds files by name pattern and returns their paths, relative to the workspace root, sorted, one per line.

- Patterns: * and ? match within one path segment, [abc] and [!abc] match one character, {ts,tsx} gives alternatives, and ** matches any number of directories. Examples: "**/*.go", "src/**/*.{ts,tsx}", "*.md" (only in the search directory itself; use "**/*.md" for every depth).
- path is the directory to search (default: the workspace root); the pattern is relative to it.
- Only files are listed, not directories. .git and node_modules are skipped unless the pattern names them.
- At most 1000 paths are returned; narrow the pattern when there are more.
- To search file contents, use grep.`

const globSchema = `{
  "type": "object",
  "properties": {
    "pattern": {"type": "string", "minLength": 1, "description": "The glob pattern to match file paths against, e.g. \"**/*.go\"."},
    "path": {"type": "string", "description": "The directory to search, relative to the workspace root or absolute within it. Default: the workspace root."}
  },
  "required": ["pattern"],
  "additionalProperties": false
}`

const (
	workspace      = "/home/user"
	maxGlobFiles   = 1000
	maxListEntries = 200_000
)

var skipDirs = []string{".git", "node_modules"}

// wsRel turns a path into the workspace-relative form used in output ("." for the root);
// paths outside the workspace stay absolute.
func wsRel(p string) string {
	if p == "" {
		return "."
	}
	if gopath.IsAbs(p) {
		p = gopath.Clean(p)
		if p == workspace {
			return "."
		}
		if strings.HasPrefix(p, workspace+"/") {
			return p[len(workspace)+1:]
		}
		return p
	}
	return gopath.Clean(p)
}

// skipsFor returns the directories to skip: those the pattern does not name.
func skipsFor(pattern string) []string {
	var skip []string
	for _, d := range skipDirs {
		if !strings.Contains(pattern, d) {
			skip = append(skip, d)
		}
	}
	return skip
}

func glob(in pdk.Input) abi.Result {
	pattern, base := in.String("pattern"), wsRel(in.String("path"))
	if strings.HasPrefix(pattern, "/") {
		rel := wsRel(pattern)
		if gopath.IsAbs(rel) {
			return abi.ErrorText("Error: the pattern " + pattern + " is outside the workspace; give a pattern relative to path")
		}
		pattern, base = rel, "."
	}
	pattern = strings.TrimPrefix(pattern, "./")
	prefix, rest := staticPrefix(pattern)
	m, err := compileGlob(rest)
	if err != nil {
		return abi.ErrorText("Error: bad glob pattern " + pattern + ": " + err.Error())
	}
	dir := gopath.Join(base, prefix)
	res, err := pdk.List(abi.ListRequest{
		Path:      dir,
		Recursive: strings.Contains(rest, "**") || strings.Contains(rest, "/"),
		Skip:      skipsFor(pattern),
		Limit:     maxListEntries,
	})
	if err != nil {
		switch {
		case errors.Is(err, pdk.ErrNotFound) && prefix != "":
			// The pattern's fixed directory does not exist: nothing matches, unless the
			// search path itself is missing, which is worth saying.
			if _, serr := pdk.Stat(base); serr != nil {
				return listError(base, serr)
			}
			return formatGlob(nil, false)
		case errors.Is(err, pdk.ErrNotDir) && prefix != "":
			return formatGlob(nil, false)
		}
		return listError(base, err)
	}
	// The host lists entries sorted by path, and a common prefix keeps that order, so the
	// result needs no sort (sorting 20,000 paths costs a guest a third of a second).
	var files []string
	for _, e := range res.Entries {
		if e.Type == abi.TypeDir || !m.match(e.Path) {
			continue
		}
		if dir != "." {
			e.Path = dir + "/" + e.Path
		}
		files = append(files, e.Path)
	}
	return formatGlob(files, res.Truncated)
}

func listError(base string, err error) abi.Result {
	var e *pdk.Error
	msg := err.Error()
	if errors.As(err, &e) {
		switch e.Status {
		case abi.StatusNotDir:
			return abi.ErrorText("Error: " + base + " is not a directory; path must be a directory to search")
		case abi.StatusPermission:
			if !strings.HasPrefix(e.Msg, "policy: ") { // the policy's message says what is allowed
				msg = e.Status.String()
			}
		case abi.StatusNotFound, abi.StatusOutside:
			msg = e.Status.String()
		}
	}
	return abi.ErrorText("Error: could not list " + base + ": " + msg)
}

// globOutputSchema is glob's output schema.
const globOutputSchema = `{
  "type": "object",
  "properties": {
    "paths": {"type": "array", "items": {"type": "string"}, "description": "The paths shown, relative to the workspace root."},
    "total": {"type": "integer", "minimum": 0, "description": "Files that matched."},
    "truncated": {"type": "boolean", "description": "Some paths are not shown, or the listing stopped early."}
  },
  "required": ["paths", "total", "truncated"],
  "additionalProperties": false
}`

func formatGlob(files []string, truncated bool) abi.Result {
	r, shown := formatGlobText(files, truncated)
	items := make([][]byte, len(shown))
	for i, f := range shown {
		items[i] = pdk.JSONString(f)
	}
	var o pdk.JSONObject
	r.Structured = o.Raw("paths", pdk.JSONArray(items)).Int("total", int64(len(files))).Bool("truncated", truncated || len(shown) < len(files)).Bytes()
	return r
}

func formatGlobText(files []string, truncated bool) (abi.Result, []string) {
	if len(files) == 0 && !truncated {
		return abi.Text("[glob: no files matched]"), nil
	}
	var b strings.Builder
	shown := files[:min(len(files), maxGlobFiles)]
	for i, f := range shown {
		if b.Len()+len(f) > outputBudget { // long paths: stay under the host's cut
			shown = shown[:i]
			break
		}
		b.WriteString(f)
		b.WriteByte('\n')
	}
	if len(shown) < len(files) {
		b.WriteString("[showing first " + strconv.Itoa(len(shown)) + " of " + strconv.Itoa(len(files)) +
			" files; narrow the pattern or the path]\n")
	}
	if truncated {
		b.WriteString("[the directory listing stopped at " + strconv.Itoa(maxListEntries) +
			" entries, so some files may be missing; search a narrower path]\n")
	}
	return abi.Text(b.String()), shown
}
