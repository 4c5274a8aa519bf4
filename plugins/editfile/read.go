package main

import (
	"errors"
	gopath "path"
	"strconv"
	"strings"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
)

const readDescription = `Reads a text file from the workspace and returns its lines numbered like cat -n (line number, a tab, then the line; line numbers start at 1).

- path is relative to the workspace root (/home/user) or absolute within it.
- By default it returns up to 2000 lines from the start. For long files, pass offset (the 1-based line to start at) and limit (how many lines) to read a part; the result ends with a note giving the total line count and the offset to continue with when there is more.
- Lines longer than 2000 characters are cut, and the whole result is kept under about 48,000 characters (the note then says where to continue).
- The numbers and tab are not part of the file: never copy them into edit_file's old_string.
- Images (PNG, JPEG, GIF, WebP) come back as an image you can see, scaled down to at most 1568 pixels on a side when larger.
- PDFs come back as text page by page (at most 20 pages a call: pass pages, such as "3" or "21-40", for others); with pages_as_images: true, up to 5 pages come back as images (for scans, drawings and layout).
- Jupyter notebooks (.ipynb) come back as their cells with their outputs, output images included.
- Other binary files are refused, and so are directories (use glob, or bash with ls, to list one).`

const readSchema = `{
  "type": "object",
  "properties": {
    "path": {"type": "string", "minLength": 1, "description": "The file to read, relative to the workspace root or absolute within it."},
    "offset": {"type": "integer", "minimum": 1, "default": 1, "description": "The 1-based line number to start reading at."},
    "limit": {"type": "integer", "minimum": 1, "default": 2000, "description": "The maximum number of lines to return."},
    "pages": {"type": "string", "description": "PDFs only: the page or range of pages to read, such as \"3\" or \"1-5\" (1-based)."},
    "pages_as_images": {"type": "boolean", "default": false, "description": "PDFs only: return the pages as images (at most 5) instead of their text."}
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
)

func readFile(in pdk.Input) abi.Result {
	path := in.String("path")
	offset, limit := max(in.Int("offset", 1), 1), in.Int("limit", defaultLimit)
	if limit < 1 {
		limit = defaultLimit
	}
	// The host cuts the window, so a large file never enters the plugin: byte loops are
	// slow in a guest under wazero's CloseOnContextDone.
	if kind := mediaKind(path); kind != "" {
		return readMedia(in, path, kind)
	}
	// The window's text stays on the host (a host buffer): the result names it, so the
	// text never passes through the plugin.
	h, text, err := pdk.ReadTextHeld(abi.ReadTextRequest{Path: path, Offset: offset, Limit: limit,
		MaxLineChars: maxLineChars, MaxBytes: maxOutput, Number: true, Version: guardOn()})
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
	if h.Binary {
		// No telling extension: an image is known by its first bytes.
		return readBinary(in, path)
	}
	markSeen(path, h.Version)
	return formatRead(path, h, text, offset)
}

// formatRead turns the host's window into the result: the numbered lines, then a note when
// they are not the whole file.
func formatRead(path string, h abi.ReadTextHeader, text pdk.HeldText, offset int) abi.Result {
	switch {
	case h.Size == 0:
		return abi.Text("[read_file: " + path + " is empty (0 bytes)]")
	case h.Binary:
		return abi.ErrorText("Error: " + path + " is a binary file; read_file shows text only")
	case h.First == 0:
		return abi.ErrorText("Error: offset " + strconv.Itoa(offset) + " is past the end of " + path +
			", which has " + plural(h.TotalLines, "line") + "; use an offset from 1 to " + strconv.Itoa(h.TotalLines))
	}
	if h.First == 1 && h.Last >= h.TotalLines {
		return abi.Result{Content: []abi.Content{text.Block("")}}
	}
	var b strings.Builder
	b.WriteString("[showing lines " + strconv.Itoa(h.First) + "-" + strconv.Itoa(h.Last) + " of " + strconv.Itoa(h.TotalLines))
	if h.Full {
		b.WriteString(" (output limit reached)")
	}
	if h.Last < h.TotalLines {
		b.WriteString("; continue with offset " + strconv.Itoa(h.Last+1))
	}
	b.WriteString("]\n")
	return abi.Result{Content: []abi.Content{text.Block(b.String())}}
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
	case abi.StatusPermission:
		if strings.HasPrefix(e.Msg, "policy: ") {
			return e.Msg // the host's policy says what was refused and what is allowed
		}
		return e.Status.String()
	case abi.StatusNotFound, abi.StatusIsDir, abi.StatusNotDir, abi.StatusOutside, abi.StatusExists:
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

func plural(n int, word string) string {
	s := strconv.Itoa(n) + " " + word
	if n != 1 {
		s += "s"
	}
	return s
}
