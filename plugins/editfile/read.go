package main

import (
	"bytes"
	"errors"
	gopath "path"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
)

const readDescription = `Reads a text file from the workspace and returns its lines numbered like cat -n (line number, a tab, then the line; line numbers start at 1).

- path is relative to the workspace root (/home/user) or absolute within it.
- By default it returns up to 2000 lines from the start. For long files, pass offset (the 1-based line to start at) and limit (how many lines) to read a part; the result ends with a note giving the total line count and the offset to continue with when there is more.
- Lines longer than 2000 characters are cut, and the whole result is kept under about 48,000 characters (the note then says where to continue).
- The numbers and tab are not part of the file: never copy them into edit_file's old_string.
- Text only: a binary file is refused, and so is a directory (use glob, or bash with ls, to list one).`

const readSchema = `{
  "type": "object",
  "properties": {
    "path": {"type": "string", "minLength": 1, "description": "The file to read, relative to the workspace root or absolute within it."},
    "offset": {"type": "integer", "minimum": 1, "default": 1, "description": "The 1-based line number to start reading at."},
    "limit": {"type": "integer", "minimum": 1, "default": 2000, "description": "The maximum number of lines to return."}
  },
  "required": ["path"],
  "additionalProperties": false
}`

const (
	defaultLimit = 2000
	maxLineChars = 2000
	// maxOutput keeps a result below the host's 50,000-character cut, so the host never
	// drops lines from the middle; bytes >= characters, so counting bytes is safe.
	maxOutput = 48_000
	sniffLen  = 8 << 10
)

func readFile(in pdk.Input) abi.Result {
	path := in.String("path")
	data, err := pdk.ReadFile(path)
	if err != nil {
		if errors.Is(err, pdk.ErrIsDir) {
			return abi.ErrorText("Error: " + path + " is a directory; use glob or bash ls to list it")
		}
		msg := "Error: could not read " + path + ": " + reason(err, path)
		if errors.Is(err, pdk.ErrTooLarge) {
			msg += "; read parts of it with bash (e.g. sed -n '1,2000p' FILE)"
		}
		return abi.ErrorText(msg)
	}
	return formatRead(path, data, in.Int("offset", 1), in.Int("limit", defaultLimit))
}

// reason says why a host function failed, without the "OP PATH: " the tool's own message
// already says. Statuses with a fixed meaning use their plain name (the host's message
// for them carries sandbox internals); the others keep the host's message.
func reason(err error, path string) string {
	var e *pdk.Error
	if !errors.As(err, &e) {
		return err.Error()
	}
	switch e.Status {
	case abi.StatusNotFound, abi.StatusIsDir, abi.StatusNotDir, abi.StatusOutside,
		abi.StatusPermission, abi.StatusExists:
		return e.Status.String()
	}
	msg := e.Error()
	for _, p := range []string{path, relPath(path)} {
		if i := strings.Index(msg, p+": "); i >= 0 {
			return msg[i+len(p)+2:]
		}
	}
	return msg
}

// relPath is the workspace-relative form of a path, as the host writes it in messages.
func relPath(p string) string {
	if !gopath.IsAbs(p) {
		p = gopath.Join(workspace, p)
	}
	p = gopath.Clean(p)
	if p == workspace {
		return "."
	}
	return strings.TrimPrefix(p, workspace+"/")
}

const workspace = "/home/user"

// isBinary looks at the first 8 KB: a NUL byte, or more than 10% of bytes that are
// invalid UTF-8 or control characters no text uses, means binary. Text in a legacy
// encoding (Latin-1 accents here and there) stays readable.
func isBinary(data []byte) bool {
	sample := data[:min(len(data), sniffLen)]
	if bytes.IndexByte(sample, 0) >= 0 {
		return true
	}
	odd := 0
	for i := 0; i < len(sample); {
		c := sample[i]
		if c < utf8.RuneSelf {
			if c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v' && c != '\b' && c != 0x1b {
				odd++
			}
			i++
			continue
		}
		r, n := utf8.DecodeRune(sample[i:])
		if r == utf8.RuneError && n == 1 {
			if len(sample) < len(data) && len(sample)-i < utf8.UTFMax && !utf8.FullRune(sample[i:]) {
				break // a character cut by the end of the sample
			}
			odd++
		}
		i += n
	}
	return odd*10 > len(sample)
}

// formatRead numbers the lines [offset, offset+limit) of data.
func formatRead(path string, data []byte, offset, limit int) abi.Result {
	if len(data) == 0 {
		return abi.Text("[read_file: " + path + " is empty (0 bytes)]")
	}
	if isBinary(data) {
		return abi.ErrorText("Error: " + path + " is a binary file; read_file shows text only")
	}
	total := bytes.Count(data, []byte{'\n'})
	if data[len(data)-1] != '\n' {
		total++
	}
	if offset < 1 {
		offset = 1
	}
	if limit < 1 {
		limit = defaultLimit
	}
	if offset > total {
		return abi.ErrorText("Error: offset " + strconv.Itoa(offset) + " is past the end of " + path +
			", which has " + plural(total, "line") + "; use an offset from 1 to " + strconv.Itoa(total))
	}
	// Skip to the first line wanted.
	rest := data
	for n := 1; n < offset; n++ {
		rest = rest[bytes.IndexByte(rest, '\n')+1:]
	}
	out := make([]byte, 0, min(len(rest)+len(rest)/8+64, maxOutput+4096))
	line := offset
	full := false
	for ; line < offset+limit && len(rest) > 0; line++ {
		var text []byte
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			text, rest = rest[:i], rest[i+1:]
		} else {
			text, rest = rest, nil
		}
		text = bytes.TrimSuffix(text, []byte{'\r'})
		start := len(out)
		out = appendNumber(out, line)
		out = append(out, '\t')
		out = appendLine(out, text)
		out = append(out, '\n')
		if len(out) > maxOutput && line > offset {
			out, full = out[:start], true // keep at least one line
			break
		}
	}
	last := line - 1
	if offset > 1 || last < total {
		out = append(out, "[showing lines "...)
		out = strconv.AppendInt(out, int64(offset), 10)
		out = append(out, '-')
		out = strconv.AppendInt(out, int64(last), 10)
		out = append(out, " of "...)
		out = strconv.AppendInt(out, int64(total), 10)
		if full {
			out = append(out, " (output limit reached)"...)
		}
		if last < total {
			out = append(out, "; continue with offset "...)
			out = strconv.AppendInt(out, int64(last+1), 10)
		}
		out = append(out, "]\n"...)
	}
	return abi.Text(string(out))
}

// appendNumber right-aligns n in six columns, as cat -n does.
func appendNumber(b []byte, n int) []byte {
	var digits [20]byte
	d := strconv.AppendInt(digits[:0], int64(n), 10)
	for i := len(d); i < 6; i++ {
		b = append(b, ' ')
	}
	return append(b, d...)
}

// appendLine appends a line, cut after maxLineChars characters with a marker.
func appendLine(b, text []byte) []byte {
	if len(text) <= maxLineChars { // bytes >= characters: nothing to cut
		return append(b, text...)
	}
	chars, cutAt := 0, -1
	for i := range string(text) {
		if chars == maxLineChars {
			cutAt = i
		}
		chars++
	}
	if cutAt < 0 {
		return append(b, text...)
	}
	b = append(b, text[:cutAt]...)
	b = append(b, " [... line cut: "...)
	b = strconv.AppendInt(b, int64(chars-maxLineChars), 10)
	return append(b, " more characters]"...)
}

func plural(n int, word string) string {
	s := strconv.Itoa(n) + " " + word
	if n != 1 {
		s += "s"
	}
	return s
}
