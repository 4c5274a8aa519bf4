// Command bash is the toolhost plugin of the shell tools: bash (a shell that remembers its
// directory, and with TOOLHOST_BASH_KEEP_ENV its exported variables), bash_output and
// bash_kill for its background commands, and exec_command and write_stdin for programs on
// an interactive terminal. It needs the sandbox_exec capability; what it remembers lives
// in its session state.
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
	pdk.Register(pdk.Tool{Name: "bash", Description: description(l), Schema: schema(l), OutputSchema: resultSchema, Run: run})
	pdk.Register(pdk.Tool{Name: "bash_output", Description: outputDescription, Schema: outputSchema, Run: bashOutput})
	pdk.Register(pdk.Tool{Name: "bash_kill", Description: killDescription, Schema: killSchema, Run: bashKill})
	pdk.Register(pdk.Tool{Name: "exec_command", Description: execCommandDescription, Schema: execCommandSchema, Run: execCommand})
	pdk.Register(pdk.Tool{Name: "write_stdin", Description: writeStdinDescription, Schema: writeStdinSchema, Run: writeStdin})
}

func main() {}
