// Command toolhost runs an AI coding agent's tools as WebAssembly plugins inside sandboxes:
// `toolhost help` lists its commands, docs/CLI.md describes them. It is package cli's Main;
// a build with modules of its own is the same few lines (docs/ARCHITECTURE.md, "A custom
// build").
package main

import "github.com/toolhost/toolhost/cli"

func main() { cli.Main() }
