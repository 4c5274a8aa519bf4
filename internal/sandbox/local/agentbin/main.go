//go:build linux

// Command toolhost-sandbox-agent is the local sandbox's agent and nothing else: a program
// that links only the local provider, whose agent reexec.Main runs when the provider
// starts it inside a sandbox. `make build` builds it beside bin/toolhost and links its
// SHA-256 into the CLI, which then runs it as every sandbox's pid 1 instead of re-executing
// itself: it starts in about half the CPU, since it initialises fewer than half of the packages
// (docs/LOCAL.md, "The agent").
package main

import (
	"fmt"
	"os"

	"github.com/toolhost/toolhost/internal/reexec"
	_ "github.com/toolhost/toolhost/internal/sandbox/local" // registers the agent
)

func main() {
	reexec.Main() // the agent, when the provider started this
	fmt.Fprintln(os.Stderr, "toolhost-sandbox-agent: the local sandbox's agent, which toolhost starts inside each sandbox; it is not run by hand")
	os.Exit(2)
}
