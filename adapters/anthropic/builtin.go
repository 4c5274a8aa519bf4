package anthropic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/anthropics/anthropic-sdk-go"

	"github.com/toolhost/toolhost/abi"
)

// Anthropic's built-in client tools: the models are trained on their names and inputs, so
// they need no schema in the request. The program still runs them; ToolResults maps their
// calls onto toolhost's tools.
const (
	// BashTool is bash_20250124's name: input {command} or {restart: true}.
	BashTool = "bash"
	// EditorTool is text_editor_20250728's name: input {command, path, ...} with the
	// commands view, create, str_replace and insert.
	EditorTool = "str_replace_based_edit_tool"
)

// The toolhost tools the built-in ones are made of. These are the built-in plugins' names.
const (
	toolBash  = "bash"
	toolRead  = "read_file"
	toolWrite = "write_file"
	toolEdit  = "edit_file"
	toolGlob  = "glob"
)

// Option changes how Tools presents the tools and how ToolResults runs their calls. Give
// ToolResults the options given to Tools.
type Option func(*options)

type options struct {
	builtin       bool
	maxCharacters int
}

func collect(opts []Option) options {
	var o options
	for _, f := range opts {
		f(&o)
	}
	return o
}

// WithBuiltinTools makes Tools present bash as Anthropic's bash_20250124 tool and the
// file tools (read_file, write_file and edit_file, when all three are there) as its
// text_editor_20250728 tool named str_replace_based_edit_tool, both schema-less: the
// models are trained on them. The other tools stay function tools. ToolResults maps the
// editor's commands onto the file tools: view onto read_file (numbered lines like cat -n;
// view_range [start, end], end -1 for the end of the file; a directory is listed with
// glob, two levels deep, hidden entries left out), create onto write_file, str_replace
// onto edit_file, insert (insert_line, and insert_text or new_str) onto read_file and
// edit_file. undo_edit, which text_editor_20250728 does not have, is refused.
//
// maxCharacters, when above 0, is the editor's max_characters: view's text is cut there,
// with a note saying so.
func WithBuiltinTools(maxCharacters int) Option {
	return func(o *options) {
		o.builtin = true
		o.maxCharacters = max(maxCharacters, 0)
	}
}

// builtinTools replaces bash and the file tools of params (in tools' order) by the
// built-in tool types.
func builtinTools(tools []abi.Tool, params []anthropic.ToolUnionParam, o options) []anthropic.ToolUnionParam {
	has := func(name string) bool {
		return slices.ContainsFunc(tools, func(t abi.Tool) bool { return t.Name == name })
	}
	editor := has(toolRead) && has(toolWrite) && has(toolEdit)
	out := make([]anthropic.ToolUnionParam, 0, len(params))
	for i, t := range tools {
		switch {
		case t.Name == toolBash:
			out = append(out, anthropic.ToolUnionParam{OfBashTool20250124: &anthropic.ToolBash20250124Param{}})
		case editor && t.Name == toolRead:
			p := &anthropic.ToolTextEditor20250728Param{}
			if o.maxCharacters > 0 {
				p.MaxCharacters = anthropic.Int(int64(o.maxCharacters))
			}
			out = append(out, anthropic.ToolUnionParam{OfTextEditor20250728: p})
		case editor && (t.Name == toolWrite || t.Name == toolEdit):
		default:
			out = append(out, params[i])
		}
	}
	return out
}

// builtinCall runs a call of a built-in tool, or says it is none (ok false): the editor's
// calls, and bash's restart (bash's other inputs are toolhost bash's own).
func builtinCall(ctx context.Context, d Dispatcher, name string, input json.RawMessage, o options) (abi.Result, bool, error) {
	switch name {
	case EditorTool:
		res, err := editorCall(ctx, d, input, o)
		return res, true, err
	case BashTool:
		var in struct {
			Command *string `json:"command"`
			Restart *bool   `json:"restart"`
		}
		if json.Unmarshal(input, &in) != nil || in.Restart == nil {
			return abi.Result{}, false, nil
		}
		if !*in.Restart {
			if in.Command == nil {
				return abi.ErrorText("Error: give command, the bash command to run (or restart: true to restart the shell)"), true, nil
			}
			// restart false beside a command: the command alone.
			b, _ := json.Marshal(map[string]string{"command": *in.Command})
			res, err := d.Dispatch(ctx, toolBash, b)
			return res, true, err
		}
		// Each toolhost bash call is a process of its own; what carries over is its
		// directory, so a restart takes the shell back to the workspace root.
		res, err := d.Dispatch(ctx, toolBash, json.RawMessage(`{"command": "cd /home/user"}`))
		if err != nil || res.IsError {
			return res, true, err
		}
		return abi.Text("tool has been restarted."), true, nil
	}
	return abi.Result{}, false, nil
}

type editorInput struct {
	Command    string  `json:"command"`
	Path       string  `json:"path"`
	ViewRange  []int   `json:"view_range"`
	FileText   *string `json:"file_text"`
	OldStr     *string `json:"old_str"`
	NewStr     *string `json:"new_str"`
	InsertLine *int    `json:"insert_line"`
	InsertText *string `json:"insert_text"`
}

func editorCall(ctx context.Context, d Dispatcher, input json.RawMessage, o options) (abi.Result, error) {
	var in editorInput
	if err := json.Unmarshal(input, &in); err != nil {
		return abi.ErrorText("Error: the input is not an object of the editor's parameters (" + jsonReason(err) + "); give command and path"), nil
	}
	if in.Path == "" && in.Command != "" {
		return abi.ErrorText("Error: give path, the file or directory for " + in.Command), nil
	}
	switch in.Command {
	case "view":
		return editorView(ctx, d, in, o)
	case "create":
		if in.FileText == nil {
			return abi.ErrorText("Error: create needs file_text, the whole content of the new file"), nil
		}
		return dispatchJSON(ctx, d, toolWrite, map[string]any{"path": in.Path, "content": *in.FileText})
	case "str_replace":
		if in.OldStr == nil || *in.OldStr == "" {
			return abi.ErrorText("Error: str_replace needs old_str, the exact text to replace (to write a whole file, use create)"), nil
		}
		newStr := ""
		if in.NewStr != nil {
			newStr = *in.NewStr
		}
		res, err := dispatchJSON(ctx, d, toolEdit, map[string]any{"path": in.Path, "old_string": *in.OldStr, "new_string": newStr})
		return editorWords(res), err
	case "insert":
		return editorInsert(ctx, d, in)
	case "undo_edit":
		return abi.ErrorText("Error: undo_edit is not a command of this editor; make the reverse change with str_replace"), nil
	case "":
		return abi.ErrorText("Error: give command: view, create, str_replace or insert"), nil
	}
	return abi.ErrorText(fmt.Sprintf("Error: unknown command %q; the commands are view, create, str_replace and insert", in.Command)), nil
}

// jsonReason is a decoding error without Go's type names.
func jsonReason(err error) string {
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field != "" {
		return te.Field + " has the wrong type"
	}
	return "it does not decode"
}

func dispatchJSON(ctx context.Context, d Dispatcher, tool string, in map[string]any) (abi.Result, error) {
	b, err := json.Marshal(in)
	if err != nil {
		return abi.ErrorText("Error: the input could not be encoded"), fmt.Errorf("encode %s input: %w", tool, err)
	}
	return d.Dispatch(ctx, tool, b)
}

// editorWords rewrites the file tools' advice in the editor's words: the model has no
// read_file, write_file or edit_file, it has view, create and str_replace.
func editorWords(res abi.Result) abi.Result {
	r := strings.NewReplacer(
		"read it with read_file first", "view it first",
		"read it again with read_file", "view it again",
		"with read_file", "with view",
		"use write_file", "use create",
		"set replace_all", "make old_str unique",
		"old_string", "old_str", "new_string", "new_str",
		"continue with offset ", "continue with view_range starting at ",
	)
	out := abi.Result{IsError: res.IsError, Content: make([]abi.Content, len(res.Content))}
	for i, c := range res.Content {
		if c.Type == abi.ContentText {
			c.Text = r.Replace(c.Text)
		}
		out.Content[i] = c
	}
	return out
}

func editorView(ctx context.Context, d Dispatcher, in editorInput, o options) (abi.Result, error) {
	args := map[string]any{"path": in.Path}
	if in.ViewRange != nil {
		if len(in.ViewRange) != 2 {
			return abi.ErrorText("Error: view_range is [start, end]: two line numbers, 1-based, end -1 for the end of the file"), nil
		}
		start, end := in.ViewRange[0], in.ViewRange[1]
		if start < 1 || (end != -1 && end < start) {
			return abi.ErrorText(fmt.Sprintf("Error: view_range [%d, %d] is not a range: start is at least 1 and end at least start, or -1 for the end of the file", start, end)), nil
		}
		args["offset"] = start
		if end != -1 {
			args["limit"] = end - start + 1
		}
	}
	res, err := dispatchJSON(ctx, d, toolRead, args)
	if err != nil {
		return res, err
	}
	if res.IsError && in.ViewRange == nil {
		// Perhaps a directory: list it. Whatever listing fails says nothing the read's
		// error did not, so the read's error is the answer then.
		if list, ok, lerr := viewDir(ctx, d, in.Path); ok || lerr != nil {
			return list, lerr
		}
	}
	res = editorWords(res)
	if o.maxCharacters > 0 {
		res = cutText(res, o.maxCharacters)
	}
	return res, nil
}

// viewDir lists the directory path two levels deep, as the reference editor does (find
// -maxdepth 2, hidden entries left out): its files through glob, and the directories they
// are in. ok is false when path is no directory glob can list.
func viewDir(ctx context.Context, d Dispatcher, path string) (abi.Result, bool, error) {
	res, err := dispatchJSON(ctx, d, toolGlob, map[string]any{"path": path, "pattern": "{*,*/*}"})
	if err != nil || res.IsError {
		return abi.Result{}, false, nil
	}
	text := ""
	for _, c := range res.Content {
		if c.Type == abi.ContentText {
			text += c.Text
		}
	}
	// glob writes paths relative to the workspace root; the entries are named relative
	// to path, which is one of those paths' prefixes.
	seen := map[string]bool{}
	var entries, notes []string
	prefix := ""
	for line := range strings.SplitSeq(text, "\n") {
		switch {
		case line == "":
			continue
		case strings.HasPrefix(line, "["):
			if !strings.HasPrefix(line, "[glob: no files matched") {
				notes = append(notes, line)
			}
			continue
		}
		entries = append(entries, line)
	}
	// The common directory of every entry is path as glob names it.
	if len(entries) > 0 {
		prefix = commonDir(entries)
	}
	var out []string
	for _, e := range entries {
		rel := strings.TrimPrefix(e, prefix)
		parts := strings.Split(rel, "/")
		if slices.ContainsFunc(parts, func(p string) bool { return strings.HasPrefix(p, ".") }) || len(parts) > 2 {
			continue
		}
		if len(parts) == 2 && !seen[parts[0]] {
			seen[parts[0]] = true
			out = append(out, parts[0]+"/")
		}
		out = append(out, rel)
	}
	slices.Sort(out)
	var b strings.Builder
	b.WriteString("Here are the files and directories up to 2 levels deep in " + path + ", excluding hidden items (and .git and node_modules):\n")
	if len(out) == 0 {
		b.WriteString("[no files]\n")
	}
	for _, e := range out {
		b.WriteString(e + "\n")
	}
	for _, n := range notes {
		b.WriteString(n + "\n")
	}
	return abi.Text(b.String()), true, nil
}

// commonDir is the longest directory prefix ("a/b/", or "") of every path.
func commonDir(paths []string) string {
	p := paths[0]
	i := strings.LastIndexByte(p, '/')
	prefix := ""
	if i >= 0 {
		prefix = p[:i+1]
	}
	for _, q := range paths[1:] {
		for !strings.HasPrefix(q, prefix) {
			j := strings.LastIndexByte(strings.TrimSuffix(prefix, "/"), '/')
			if j < 0 {
				return ""
			}
			prefix = prefix[:j+1]
		}
	}
	return prefix
}

// cutText cuts a result's text blocks to n characters in all.
func cutText(res abi.Result, n int) abi.Result {
	left := n
	out := abi.Result{IsError: res.IsError}
	for _, c := range res.Content {
		if c.Type == abi.ContentText {
			r := []rune(c.Text)
			if len(r) > left {
				c.Text = string(r[:left]) + fmt.Sprintf("\n[cut at max_characters (%d characters): view a smaller view_range to see the rest]\n", n)
				left = 0
				out.Content = append(out.Content, c)
				continue
			}
			left -= len(r)
		}
		out.Content = append(out.Content, c)
	}
	return out
}

// lineRe is one numbered line of read_file: the number right-aligned in six columns, a tab.
var (
	lineRe  = regexp.MustCompile(`^ *([0-9]+)\t(.*)$`)
	cutRe   = regexp.MustCompile(` \[\.\.\. line cut: [0-9]+ more characters\]$`)
	moreRe  = regexp.MustCompile(`^\[showing lines [0-9]+-([0-9]+) of ([0-9]+)`)
	emptyRe = regexp.MustCompile(`^\[read_file: .* is empty \(0 bytes\)\]$`)
)

// maxInsertReads bounds the reads of one insert (2000 lines each).
const maxInsertReads = 50

// editorInsert inserts text after line insert_line (0: at the top) as the reference
// editor does: the text becomes lines of their own. It reads the file with read_file,
// then makes the insertion an edit_file replacement of the nearest lines around the place
// that occur exactly once in the file, so edit_file (with its checks and its keeping of
// CRLF line endings) changes that place and nothing else.
func editorInsert(ctx context.Context, d Dispatcher, in editorInput) (abi.Result, error) {
	text := in.InsertText
	if text == nil {
		text = in.NewStr
	}
	switch {
	case in.InsertLine == nil:
		return abi.ErrorText("Error: insert needs insert_line, the line after which to insert (0 for the top of the file)"), nil
	case text == nil:
		return abi.ErrorText("Error: insert needs insert_text, the text to insert"), nil
	}
	n := *in.InsertLine
	ins := strings.TrimSuffix(*text, "\n")
	var lines []string
	var cut []bool
	for reads := 0; ; reads++ {
		if reads == maxInsertReads {
			return abi.ErrorText(fmt.Sprintf("Error: %s is too long to insert into (more than %d lines); use str_replace", in.Path, maxInsertReads*2000)), nil
		}
		res, err := dispatchJSON(ctx, d, toolRead, map[string]any{"path": in.Path, "offset": len(lines) + 1, "limit": 2000})
		if err != nil || res.IsError {
			return editorWords(res), err
		}
		body := ""
		for _, c := range res.Content {
			if c.Type != abi.ContentText {
				return abi.ErrorText("Error: " + in.Path + " is not a text file; insert works on text files"), nil
			}
			body += c.Text
		}
		if emptyRe.MatchString(strings.TrimSuffix(body, "\n")) {
			break
		}
		more := false
		for l := range strings.SplitSeq(strings.TrimSuffix(body, "\n"), "\n") {
			if m := moreRe.FindStringSubmatch(l); m != nil {
				last, _ := strconv.Atoi(m[1])
				total, _ := strconv.Atoi(m[2])
				more = last < total
				continue
			}
			m := lineRe.FindStringSubmatch(l)
			if m == nil {
				return abi.ErrorText("Error: " + in.Path + " could not be read as numbered lines; use str_replace"), nil
			}
			if num, _ := strconv.Atoi(m[1]); num != len(lines)+1 {
				return abi.ErrorText("Error: " + in.Path + " could not be read as numbered lines; use str_replace"), nil
			}
			lines = append(lines, m[2])
			cut = append(cut, cutRe.MatchString(m[2]))
		}
		if !more {
			break
		}
	}
	if n < 0 || n > len(lines) {
		return abi.ErrorText(fmt.Sprintf("Error: insert_line %d is outside %s, which has %d lines; give a line from 0 (the top) to %d (the end)", n, in.Path, len(lines), len(lines))), nil
	}
	if len(lines) == 0 {
		// An empty file: the text is the whole file (write_file needs the read above).
		return dispatchJSON(ctx, d, toolWrite, map[string]any{"path": in.Path, "content": *text})
	}
	content := strings.Join(lines, "\n")
	// The window [s, e) of lines around the place, lines s..n-1 before it and n..e-1
	// after it (0-based), grows until its text occurs once in the file.
	s, e := n, n
	for {
		grown := false
		if s > 0 {
			s--
			grown = true
		}
		if e < len(lines) && (!grown || e-n < n-s) {
			e++
			grown = true
		}
		if slices.Contains(cut[s:e], true) {
			return abi.ErrorText(fmt.Sprintf("Error: a line near line %d of %s is longer than 2000 characters, so the insert cannot place its text; use str_replace", n, in.Path)), nil
		}
		anchor := strings.Join(lines[s:e], "\n")
		if anchor != "" && countOverlapping(content, anchor) == 1 {
			break
		}
		if !grown {
			return abi.ErrorText("Error: the place to insert at could not be found in " + in.Path + "; use str_replace"), nil
		}
	}
	before, after := lines[s:n], lines[n:e]
	anchor := strings.Join(lines[s:e], "\n")
	repl := strings.Join(slices.Concat(before, []string{ins}, after), "\n")
	res, err := dispatchJSON(ctx, d, toolEdit, map[string]any{"path": in.Path, "old_string": anchor, "new_string": repl})
	if err != nil || res.IsError {
		return editorWords(res), err
	}
	return abi.Text(fmt.Sprintf("The text was inserted after line %d of %s.", n, in.Path)), nil
}

// countOverlapping counts the occurrences of sub in s, overlapping ones included.
func countOverlapping(s, sub string) int {
	n := 0
	for i := 0; ; {
		j := strings.Index(s[i:], sub)
		if j < 0 {
			return n
		}
		n++
		i += j + 1
		if i > len(s) {
			return n
		}
	}
}
