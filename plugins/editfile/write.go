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
- To change part of an existing file prefer edit_file, which sends only the change; read a file before overwriting it so nothing is lost by accident.`

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
	if err := pdk.WriteFile(path, content); err != nil {
		if errors.Is(err, pdk.ErrIsDir) {
			return abi.ErrorText("Error: " + path + " is a directory; give the path of a file")
		}
		return abi.ErrorText("Error: could not write " + path + ": " + reason(err, path))
	}
	return abi.Text("File written: " + path + " (" + strconv.Itoa(len(content)) + " bytes)")
}
