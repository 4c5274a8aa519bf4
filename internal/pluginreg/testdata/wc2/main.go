// Command wc2 is version 0.2.0 of the test plugin "wc": it also runs wc (sandbox_exec),
// adds a tool and requires a new input of word_count.
package main

import (
	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
)

func init() {
	pdk.Plugin("wc", "0.2.0")
	pdk.Register(pdk.Tool{
		Name:        "word_count",
		Description: "Counts the words in a text file of the workspace.",
		Schema: `{"type": "object", "properties": {"path": {"type": "string"}, "mode": {"type": "string"}},
		          "required": ["path", "mode"], "additionalProperties": false}`,
		Run: func(in pdk.Input) abi.Result {
			res, err := pdk.Exec(abi.ExecRequest{Argv: []string{"wc", "-w", in.String("path")}})
			if err != nil {
				return pdk.Errorf("Error: %v", err)
			}
			return abi.Text(res.Stdout)
		},
	})
	pdk.Register(pdk.Tool{
		Name:        "line_count",
		Description: "Counts the lines in a text file of the workspace.",
		Schema:      `{"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}`,
		Run: func(in pdk.Input) abi.Result {
			data, err := pdk.ReadFile(in.String("path"))
			if err != nil {
				return pdk.Errorf("Error: %v", err)
			}
			n := 0
			for _, b := range data {
				if b == '\n' {
					n++
				}
			}
			return abi.Text(string(rune('0' + n%10)))
		},
	})
}

func main() {}
