// Command editfile is the toolhost plugin of the file tools read_file, write_file and
// edit_file. It needs the sandbox_files capability.
package main

import (
	"strings"

	"github.com/toolhost/toolhost/pdk"
)

func init() {
	pdk.Plugin("editfile", "1.0.0")
	pdk.Register(pdk.Tool{Name: "read_file", Description: readDescription, Schema: readSchema, Run: readFile})
	pdk.Register(pdk.Tool{Name: "write_file", Description: fill(writeDescription, guardNote()), Schema: writeSchema, Run: writeFile})
	pdk.Register(pdk.Tool{Name: "edit_file", Description: fill(editDescription, guardNote()), Schema: editSchema, Run: editFile})
	pdk.Register(pdk.Tool{Name: "apply_patch", Description: fill(patchDescription, patchGuardNote()), Schema: patchSchema, Run: applyPatch})
}

func main() {}

// fill replaces the %s of a description (without package fmt).
func fill(s, v string) string {
	i := strings.Index(s, "%s")
	if i < 0 {
		return s
	}
	return s[:i] + v + s[i+2:]
}
