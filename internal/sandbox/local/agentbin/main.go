//go:build linux

// Command toolhost-sandbox-agent is the local sandbox's agent and nothing else: a program
// that links only the local provider, whose init serves as the agent when the provider
// starts it inside a sandbox. `make build` builds it beside bin/toolhost and links its
// SHA-256 into the CLI, which then runs it as every sandbox's pid 1 instead of re-executing
// itself: it starts in about half the CPU, since it initialises fewer than half of the packages
// (docs/LOCAL.md, "The agent").
package main

import (
	"fmt"
	"os"

	_ "github.com/toolhost/toolhost/internal/sandbox/local" // its init is the agent
)

func main() {
	fmt.Fprintln(os.Stderr, "toolhost-sandbox-agent: the local sandbox's agent, which toolhost starts inside each sandbox; it is not run by hand")
	os.Exit(2)
}
