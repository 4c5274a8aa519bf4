// Command editfile is the toolhost plugin of the file tools read_file, write_file and
// edit_file. It needs the sandbox_files capability.
package main

import "github.com/toolhost/toolhost/pdk"

func init() {
	pdk.Plugin("editfile", "1.0.0")
	pdk.Register(pdk.Tool{Name: "read_file", Description: readDescription, Schema: readSchema, Run: readFile})
	pdk.Register(pdk.Tool{Name: "write_file", Description: writeDescription, Schema: writeSchema, Run: writeFile})
	pdk.Register(pdk.Tool{Name: "edit_file", Description: editDescription, Schema: editSchema, Run: editFile})
}

func main() {}
