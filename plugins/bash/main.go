// Command bash is the toolhost plugin of the bash tool: it runs shell commands in the
// session's sandbox. It needs the sandbox_exec capability.
//
// Configuration: TOOLHOST_BASH_MAX_TIMEOUT, the largest timeout in seconds a call may ask
// for (default 600).
package main

import "github.com/toolhost/toolhost/pdk"

func init() {
	pdk.Plugin("bash", "1.0.0")
	pdk.Register(pdk.Tool{Name: "bash", Description: description, Schema: schema, Run: run})
}

func main() {}
