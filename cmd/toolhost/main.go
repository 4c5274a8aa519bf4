// Command toolhost runs an AI coding agent's tools as WebAssembly plugins inside sandboxes:
// `toolhost help` lists its commands, docs/CLI.md describes them. It is package cli's Main
// with the built-in modules (modules/standard); a build with modules of its own is the
// same few lines with its own import beside them (docs/ARCHITECTURE.md, "A custom build").
package main

import (
	"github.com/toolhost/toolhost/cli"
	_ "github.com/toolhost/toolhost/modules/standard"
)

func main() { cli.Main() }
