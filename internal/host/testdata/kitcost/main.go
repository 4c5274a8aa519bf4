// Command kitcost is a test plugin written with the Go plugin kit whose tools each add one
// thing to a call that does nothing, so BenchmarkKitCosts can say what each costs a guest:
// a yield, an allocation, a 4 KB result, a host call, a read_text window.
package main

import (
	"runtime"
	"unsafe"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
)

var (
	keep   []byte
	fourK  = make([]byte, 4500)
	source = func() []byte {
		b := make([]byte, 4500)
		for i := range b {
			b[i] = 'x'
		}
		return b
	}()
)

func init() {
	pdk.Plugin("kitcost", "1.0.0")
	tool := func(name string, run func(pdk.Input) abi.Result) {
		pdk.Register(pdk.Tool{Name: name, Description: "A cost probe.", Schema: `{"type": "object"}`, Run: run})
	}
	tool("noop", func(pdk.Input) abi.Result { return abi.Text("") })
	// A second yield: what the one every export ends with costs.
	tool("yield", func(pdk.Input) abi.Result { runtime.Gosched(); return abi.Text("") })
	tool("alloc_small_x10", func(pdk.Input) abi.Result {
		for range 10 {
			keep = make([]byte, 64)
		}
		return abi.Text("")
	})
	tool("alloc_4k", func(pdk.Input) abi.Result { keep = make([]byte, 4500); return abi.Text("") })
	tool("copy_4k", func(pdk.Input) abi.Result { copy(fourK, source); return abi.Text("") })
	tool("result_4k", func(pdk.Input) abi.Result { return abi.Text(unsafe.String(&source[0], len(source))) })
	tool("stat", func(pdk.Input) abi.Result {
		if _, err := pdk.Stat("small.txt"); err != nil {
			return abi.ErrorText(err.Error())
		}
		return abi.Text("")
	})
	tool("read_small", func(pdk.Input) abi.Result {
		if _, err := pdk.ReadFile("small.txt"); err != nil {
			return abi.ErrorText(err.Error())
		}
		return abi.Text("")
	})
	tool("read_text_small", func(pdk.Input) abi.Result {
		if _, _, err := pdk.ReadText(abi.ReadTextRequest{Path: "small.txt", Number: true}); err != nil {
			return abi.ErrorText(err.Error())
		}
		return abi.Text("")
	})
	tool("read_text_4k", func(pdk.Input) abi.Result {
		_, text, err := pdk.ReadText(abi.ReadTextRequest{Path: "f.txt", Number: true})
		if err != nil {
			return abi.ErrorText(err.Error())
		}
		return abi.Text(text)
	})
}

func main() {}
