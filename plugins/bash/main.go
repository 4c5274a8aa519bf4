// Command bash is the toolhost plugin of the bash tool: it runs shell commands in the
// session's sandbox. It needs the sandbox_exec capability.
//
// Configuration: the host tells it the command timeouts it enforces
// (TOOLHOST_EXEC_TIMEOUT_DEFAULT_MS, TOOLHOST_EXEC_TIMEOUT_MAX_MS), which are the tool's
// default and maximum and what its description says; TOOLHOST_BASH_MAX_TIMEOUT, in
// seconds, may lower the maximum for this plugin alone.
package main

import "github.com/toolhost/toolhost/pdk"

func init() {
	pdk.Plugin("bash", "1.0.0")
	l := currentLimits()
	pdk.Register(pdk.Tool{Name: "bash", Description: description(l), Schema: schema(l), Run: run})
}

func main() {}
