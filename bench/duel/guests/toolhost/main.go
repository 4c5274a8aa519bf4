// Command toolhost is the duel's plugin for toolhost, written with the Go plugin kit (pdk)
// as a plugin author would: three tools doing the same work as the Extism guest.
package main

import (
	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
)

func init() {
	pdk.Plugin("duel", "1.0.0")
	pdk.Register(pdk.Tool{
		Name: "noop", Description: "Does nothing.",
		Schema: `{"type": "object", "additionalProperties": false, "properties": {}}`,
		Run:    func(pdk.Input) abi.Result { return abi.Text("") },
	})
	pdk.Register(pdk.Tool{
		Name: "read", Description: "Returns a file of the workspace.",
		Schema: `{"type": "object", "additionalProperties": false, "required": ["path"],
		          "properties": {"path": {"type": "string"}}}`,
		Run: func(in pdk.Input) abi.Result {
			text, err := pdk.ReadFileString(in.String("path"))
			if err != nil {
				return abi.ErrorText("Error: " + err.Error())
			}
			return abi.Text(text)
		},
	})
	pdk.Register(pdk.Tool{
		Name: "echo", Description: "Returns its text.",
		Schema: `{"type": "object", "additionalProperties": false, "required": ["text"],
		          "properties": {"text": {"type": "string"}}}`,
		Run: func(in pdk.Input) abi.Result { return abi.Text(in.String("text")) },
	})
}

func main() {}
