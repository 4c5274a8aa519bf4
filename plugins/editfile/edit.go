package main

import (
	"errors"
	"strconv"
	"strings"
	"unsafe"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
	"github.com/toolhost/toolhost/plugins/internal/scan"
)

const editDescription = `Edits a file in the workspace by replacing an exact string with another.

- old_string must match the file exactly, including whitespace and indentation, and must occur exactly once unless replace_all is true. Include enough surrounding lines to make it unique, but keep it short.
- Copy text from read_file's output without the line-number prefix (the number and the tab before each line).
- replace_all replaces every occurrence, e.g. to rename a variable.
- Files with CRLF line endings keep them: write old_string and new_string with plain newlines.
- To create a file or replace all of it, use write_file.%s`

const editSchema = `{
  "type": "object",
  "properties": {
    "path": {"type": "string", "minLength": 1, "description": "The file to edit, relative to the workspace root or absolute within it."},
    "old_string": {"type": "string", "description": "The exact text to replace."},
    "new_string": {"type": "string", "description": "The text to put in its place (must differ from old_string)."},
    "replace_all": {"type": "boolean", "default": false, "description": "Replace every occurrence of old_string instead of requiring exactly one."}
  },
  "required": ["path", "old_string", "new_string"],
  "additionalProperties": false
}`

// maxEditAttempts bounds how often an edit is redone because the file changed under it.
const maxEditAttempts = 16

func editFile(in pdk.Input) abi.Result {
	path := in.String("path")
	oldS, newS := in.String("old_string"), in.String("new_string")
	if oldS == "" {
		return abi.ErrorText("Error: old_string is empty; give the exact text to replace (to create or overwrite a whole file, use write_file)")
	}
	if oldS == newS {
		return abi.ErrorText("Error: old_string and new_string are the same; no edit to make")
	}
	// Read, edit, and write only if the file is still what was read: a concurrent edit of
	// the same file makes the write fail, and the edit is redone on the new contents, so
	// no edit is ever lost (the edit is a pure function of the contents).
	var n int
	for attempt := 1; ; attempt++ {
		data, version, err := pdk.ReadFileVersioned(path)
		if err != nil {
			return abi.ErrorText("Error: could not read " + path + ": " + reason(err, path))
		}
		// data is ours and never written again, so it can back the string without a copy
		// of the whole file.
		content := unsafe.String(unsafe.SliceData(data), len(data))
		if msg := guard(path, version, "edit", "edited"); msg != "" {
			return abi.ErrorText(msg)
		}
		out, count, errText := applyEdit(content, oldS, newS, in.Bool("replace_all"))
		if errText != "" {
			return abi.ErrorText(strings.ReplaceAll(errText, "PATH", path))
		}
		err = pdk.WriteFileVersioned(path, out, version)
		if err == nil {
			n = count
			markSeen(path, versionOf(out))
			break
		}
		if !errors.Is(err, pdk.ErrChanged) || attempt == maxEditAttempts {
			if errors.Is(err, pdk.ErrChanged) {
				return abi.ErrorText("Error: " + path + " kept changing while it was being edited (" + strconv.Itoa(maxEditAttempts) +
					" tries); read it again with read_file, then retry the edit")
			}
			return abi.ErrorText("Error: could not write " + path + ": " + reason(err, path))
		}
	}
	if in.Bool("replace_all") {
		return abi.Text("File edited: " + path + " (" + plural(n, "replacement") + ")")
	}
	return abi.Text("File edited: " + path)
}

// applyEdit replaces oldS by newS in content and returns the new content and the number of
// replacements, or an error text in which PATH stands for the file's path.
//
// Line endings: in a file whose every newline is CRLF, LFs in old_string and new_string
// mean CRLF, which is the same as normalising the file to LF for matching and restoring
// CRLF on write, without touching any other byte. A file that mixes both is matched as is
// first, and with CRLF only if that finds nothing.
func applyEdit(content, oldS, newS string, all bool) ([]byte, int, string) {
	candidates := [][2]string{{oldS, newS}}
	if crlf := scan.CountString(content, "\r\n"); crlf > 0 {
		conv := [2]string{toCRLF(oldS), toCRLF(newS)}
		if crlf == scan.Count(content, '\n') {
			candidates = [][2]string{conv}
		} else if conv[0] != oldS {
			candidates = append(candidates, conv)
		}
	}
	var o, nw string
	count := 0
	for _, c := range candidates {
		if count = scan.CountString(content, c[0]); count > 0 {
			o, nw = c[0], c[1]
			break
		}
	}
	switch {
	case count == 0:
		return nil, 0, "Error: old_string not found in PATH" + notFoundHint(content, oldS)
	case count > 1 && !all:
		return nil, 0, "Error: old_string found " + strconv.Itoa(count) + " times in PATH; add surrounding context or set replace_all"
	}
	if !all {
		return scan.Replace(content, o, nw, 1), 1, ""
	}
	return scan.Replace(content, o, nw, -1), count, ""
}

// toCRLF turns every line ending of s into CRLF.
func toCRLF(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "\r\n", "\n"), "\n", "\r\n")
}

// notFoundHint explains the two mistakes models make most: copying read_file's line-number
// prefix, and getting whitespace (tabs against spaces, trailing blanks) wrong.
func notFoundHint(content, oldS string) string {
	if stripped, ok := stripLineNumbers(oldS); ok && strings.Contains(normLF(content), stripped) {
		return "; old_string seems to include read_file's line-number prefixes (number and tab): leave them out"
	}
	if len(content) <= hintMaxBytes && len(squash(oldS)) >= 8 && strings.Contains(squash(content), squash(oldS)) {
		return "; a match exists that differs only in whitespace (tabs against spaces, indentation or trailing blanks): read the file again and copy the text exactly"
	}
	return "; read the file again and copy the text exactly, including whitespace"
}

// hintMaxBytes bounds the files the whitespace hint looks at: it is a byte loop.
const hintMaxBytes = 256 << 10

func normLF(s string) string { return strings.ReplaceAll(s, "\r\n", "\n") }

// stripLineNumbers removes a "   12\t" prefix from every line, if every line has one.
func stripLineNumbers(s string) (string, bool) {
	lines := strings.Split(normLF(s), "\n")
	for i, l := range lines {
		t := strings.TrimLeft(l, " ")
		j := 0
		for j < len(t) && t[j] >= '0' && t[j] <= '9' {
			j++
		}
		if j == 0 || j >= len(t) || t[j] != '\t' {
			if i == len(lines)-1 && l == "" {
				continue
			}
			return "", false
		}
		lines[i] = t[j+1:]
	}
	return strings.Join(lines, "\n"), true
}

// squash drops all whitespace, for the whitespace-insensitive hint only.
func squash(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case ' ', '\t', '\r', '\n', '\v', '\f':
			return -1
		}
		return r
	}, s)
}
