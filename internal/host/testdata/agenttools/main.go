// Command agenttools is a test plugin that calls the agent tools' host functions (session
// state, remove, process, terminal_io) as a tool asks, so tests can prove what the host
// lets one plugin reach of another's. Its name and its tools' prefix come from its
// configuration (AGENTTOOLS_NAME), so one module can be loaded as two plugins.
package main

import (
	"strconv"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
)

func main() {}

func init() {
	name := pdk.Config("AGENTTOOLS_NAME")
	if name == "" {
		name = "agenttools"
	}
	pdk.Plugin(name, "1.0.0")
	obj := `{"type": "object", "properties": {"key": {"type": "string"}, "value": {"type": "string"}, "size": {"type": "integer"}, "id": {"type": "string"}, "path": {"type": "string"}, "signal": {"type": "string"}}, "additionalProperties": false}`
	pdk.Register(pdk.Tool{Name: name + "_get", Description: "session get", Schema: obj, Run: func(in pdk.Input) abi.Result {
		v, err := pdk.SessionGet(in.String("key"))
		return result(string(v), err)
	}})
	pdk.Register(pdk.Tool{Name: name + "_set", Description: "session set", Schema: obj, Run: func(in pdk.Input) abi.Result {
		v := []byte(in.String("value"))
		if n := in.Int("size", 0); n > 0 {
			v = make([]byte, n)
		}
		return result("ok", pdk.SessionSet(in.String("key"), v))
	}})
	pdk.Register(pdk.Tool{Name: name + "_remove", Description: "remove", Schema: obj, Run: func(in pdk.Input) abi.Result {
		return result("removed", pdk.Remove(in.String("path")))
	}})
	pdk.Register(pdk.Tool{Name: name + "_process", Description: "process", Schema: obj, Run: func(in pdk.Input) abi.Result {
		r, err := pdk.Process(abi.ProcessRequest{ID: in.String("id"), Signal: in.String("signal")})
		return result("running="+strconv.FormatBool(r.Running), err)
	}})
	pdk.Register(pdk.Tool{Name: name + "_terminal", Description: "terminal_io", Schema: obj, Run: func(in pdk.Input) abi.Result {
		_, out, err := pdk.TerminalIO(abi.TerminalIORequest{ID: in.String("id"), TerminalWait: abi.TerminalWait{WaitMS: 100}})
		return result(string(out), err)
	}})
}

func result(text string, err error) abi.Result {
	if err != nil {
		var e *pdk.Error
		if pe, ok := err.(*pdk.Error); ok {
			e = pe
			return abi.ErrorText("status " + strconv.Itoa(int(e.Status)) + ": " + e.Msg)
		}
		return abi.ErrorText(err.Error())
	}
	return abi.Text(text)
}
