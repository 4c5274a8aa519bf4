// A custom build of toolhost: the CLI, the built-in modules, and a provider of its own
// from another module (docs/ARCHITECTURE.md, "A custom build"). TestCustomBuild builds it.
package main

import (
	"github.com/toolhost/toolhost/cli"
	_ "github.com/toolhost/toolhost/modules/standard"

	_ "example.com/mytoolhost/pods"
)

func main() { cli.Main() }
