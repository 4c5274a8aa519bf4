package main

import (
	"errors"
	"strconv"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
)

const writeDescription = `Writes a file in the workspace, replacing it if it exists and creating it and any missing parent directories if not.

- path is relative to the workspace root (/home/user) or absolute within it.
- content is written exactly as given (UTF-8, no line-ending conversion).
- To change part of an existing file prefer edit_file, which sends only the change.%s`

const writeSchema = `{
  "type": "object",
  "properties": {
    "path": {"type": "string", "minLength": 1, "description": "The file to write, relative to the workspace root or absolute within it."},
    "content": {"type": "string", "description": "The whole new content of the file."}
  },
  "required": ["path", "content"],
  "additionalProperties": false
}`

func writeFile(in pdk.Input) abi.Result {
	// The content goes from the input buffer to the host as it is: no copy in the plugin.
	path, content := in.String("path"), in.Bytes("content")
	if !guardOn() {
		if err := pdk.WriteFile(path, content); err != nil {
			return writeError(path, err)
		}
		return abi.Text("File written: " + path + " (" + strconv.Itoa(len(content)) + " bytes)")
	}
	// The version of what is there now, without reading it into the plugin: a window of
	// one byte of read_text, whose header carries the whole file's version.
	h, _, err := pdk.ReadText(abi.ReadTextRequest{Path: path, Limit: 1, MaxBytes: 1, Version: true})
	version := ""
	switch {
	case errors.Is(err, pdk.ErrNotFound):
		// A new file: never refused. Written only if it still does not exist.
	case errors.Is(err, pdk.ErrIsDir):
		return abi.ErrorText("Error: " + path + " is a directory; give the path of a file")
	case err != nil:
		return writeError(path, err)
	default:
		version = h.Version
		if msg := guard(path, version, "overwrite", "overwritten"); msg != "" {
			return abi.ErrorText(msg)
		}
	}
	if err := pdk.WriteFileVersioned(path, content, version); err != nil {
		if errors.Is(err, pdk.ErrChanged) {
			return abi.ErrorText("Error: " + path + " changed while it was being written (another process wrote it): read it again with read_file, then write it")
		}
		return writeError(path, err)
	}
	markSeen(path, versionOf(content))
	return abi.Text("File written: " + path + " (" + strconv.Itoa(len(content)) + " bytes)")
}

func writeError(path string, err error) abi.Result {
	if errors.Is(err, pdk.ErrIsDir) {
		return abi.ErrorText("Error: " + path + " is a directory; give the path of a file")
	}
	return abi.ErrorText("Error: could not write " + path + ": " + reason(err, path))
}

// guardNote is what the descriptions of the writing tools say of the guard.
func guardNote() string {
	if !guardOn() {
		return ""
	}
	return "\n- An existing file is changed only if you have seen its current contents in this session: read it with read_file first. If it changed since (a command, a formatter or a background process wrote it), the tool refuses and says so: read it again, then redo the change. A new file needs no read."
}
