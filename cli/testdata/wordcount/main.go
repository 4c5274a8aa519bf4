// Command wordcount is the example plugin of README.md: one tool that counts the words
// of a file in the workspace. It needs the sandbox_files grant. Build it with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o wordcount.wasm .
package main

import (
	"fmt"
	"strings"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
)

func init() {
	pdk.Plugin("wordcount", "0.1.0")
	pdk.Register(pdk.Tool{
		Name:        "word_count",
		Description: "Counts the words in a text file of the workspace.",
		Schema: `{"type": "object",
		          "properties": {"path": {"type": "string", "description": "the file"}},
		          "required": ["path"], "additionalProperties": false}`,
		Run: func(in pdk.Input) abi.Result {
			data, err := pdk.ReadFile(in.String("path"))
			if err != nil {
				return pdk.Errorf("Error: could not read %s: %v", in.String("path"), err)
			}
			return abi.Text(fmt.Sprintf("%d words", len(strings.Fields(string(data)))))
		},
	})
}

func main() {}
