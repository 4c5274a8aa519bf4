// Command grepglob is the toolhost plugin of the search tools grep (GNU grep run in the
// sandbox) and glob (file names matched against the workspace listing). It needs the
// sandbox_exec and sandbox_files capabilities.
package main

import "github.com/toolhost/toolhost/pdk"

func init() {
	pdk.Plugin("grepglob", "1.0.0")
	pdk.Register(pdk.Tool{Name: "grep", Description: grepDescription, Schema: grepSchema, OutputSchema: grepOutputSchema, Run: grep})
	pdk.Register(pdk.Tool{Name: "glob", Description: globDescription, Schema: globSchema, OutputSchema: globOutputSchema, Run: glob})
}

func main() {}
