// Command probe is a test plugin written against abi/ABI.md alone, without the Go plugin
// kit: its tools misbehave on purpose (spin, trap, bad pointers) so tests can prove the
// host survives them.
package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"time"
	"unsafe"
)

//go:wasmimport toolhost take
func take(ptr, cap uint32) int64

//go:wasmimport toolhost last_error
func lastError(ptr, cap uint32) int64

//go:wasmimport toolhost_sandbox_files read
func fsRead(pathPtr, pathLen, outPtr, outCap uint32) int64

//go:wasmimport toolhost_sandbox_files write
func fsWrite(pathPtr, pathLen, dataPtr, dataLen uint32) int64

//go:wasmimport toolhost_sandbox_files read_text
func fsReadText(reqPtr, reqLen, outPtr, outCap uint32) int64

//go:wasmimport toolhost_sandbox_exec run
func execRun(reqPtr, reqLen, outPtr, outCap uint32) int64

//go:wasmimport toolhost_log write
func logWrite(level int32, ptr, n uint32)

//go:wasmimport toolhost_store put
func storePut(keyPtr, keyLen, dataPtr, dataLen uint32) int64

//go:wasmimport toolhost_store get
func storeGet(keyPtr, keyLen, outPtr, outCap uint32) int64

//go:wasmimport toolhost_store list
func storeList(prefixPtr, prefixLen, outPtr, outCap uint32) int64

func main() {}

var (
	input  = make([]byte, 1024)
	output []byte
	keep   []byte
)

func addr(b []byte) uint32 {
	if len(b) == 0 {
		return 0
	}
	return uint32(uintptr(unsafe.Pointer(&b[0])))
}

func ret(b []byte) uint64 {
	output = b
	return uint64(addr(b))<<32 | uint64(len(b))
}

//go:wasmexport toolhost_abi_version
func abiVersion() int32 { return 1 }

const manifest = `{"abi_version":1,"name":"probe","version":"0.0.1","tools":[
{"name":"echo","description":"Returns text.","input_schema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"],"additionalProperties":false}},
{"name":"spin","description":"Loops forever.","input_schema":{"type":"object"}},
{"name":"sleep","description":"Sleeps ms.","input_schema":{"type":"object","properties":{"ms":{"type":"integer","minimum":0}}}},
{"name":"trap","description":"Dies.","input_schema":{"type":"object"}},
{"name":"bad_result","description":"Returns a pointer outside memory.","input_schema":{"type":"object"}},
{"name":"oob","description":"Calls host functions with bad pointers.","input_schema":{"type":"object"}},
{"name":"read","description":"Reads a file.","input_schema":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}},
{"name":"exec","description":"Runs argv.","input_schema":{"type":"object","properties":{"argv":{"type":"array","items":{"type":"string"}},"timeout_ms":{"type":"integer"}},"required":["argv"]}},
{"name":"huge","description":"Returns n copies of s.","input_schema":{"type":"object","properties":{"n":{"type":"integer"},"s":{"type":"string"}}}},
{"name":"ansi","description":"Returns coloured text.","input_schema":{"type":"object"}},
{"name":"image","description":"Returns an image with the given media type.","input_schema":{"type":"object","properties":{"media_type":{"type":"string"}}}},
{"name":"garbage","description":"Allocates and drops mb MiB.","input_schema":{"type":"object","properties":{"mb":{"type":"integer"}}}},
{"name":"store","description":"put/get/list in the plugin's store.","input_schema":{"type":"object","properties":{"op":{"type":"string"},"key":{"type":"string"},"text":{"type":"string"}}}},
{"name":"raw","description":"Returns the base64-decoded b64 as its result, byte for byte.","input_schema":{"type":"object","properties":{"b64":{"type":"string"}},"required":["b64"]}},
{"name":"shaped","description":"Returns the base64-decoded b64 as its result; its structured results must follow the output schema.","input_schema":{"type":"object","properties":{"b64":{"type":"string"}},"required":["b64"]},"output_schema":{"type":"object","properties":{"n":{"type":"integer","maximum":10},"s":{"type":"string"}},"required":["n"],"additionalProperties":false}},
{"name":"held","description":"Reads path with read_text into host buffers (n of them, or one) and names one in its result as mode says: ok, unknown, zero, stale (a buffer of this instance's earlier call), many (the buffer n times).","input_schema":{"type":"object","properties":{"path":{"type":"string"},"mode":{"type":"string"},"n":{"type":"integer"}},"required":["mode"]}},
{"name":"leak","description":"Reads a file, logs what it holds, reads a file of that name and returns both; or dies saying it.","input_schema":{"type":"object","properties":{"path":{"type":"string"},"panic":{"type":"boolean"}},"required":["path"]}}
]}`

//go:wasmexport toolhost_describe
func describe() uint64 {
	defer runtime.Gosched()
	return ret([]byte(manifest))
}

//go:wasmexport toolhost_input_buffer
func inputBuffer(size uint32) uint32 {
	defer runtime.Gosched()
	if int(size) > len(input) {
		input = make([]byte, size)
	}
	return addr(input)
}

type request struct {
	Tool  string `json:"tool"`
	Input struct {
		Text      string   `json:"text"`
		MS        int      `json:"ms"`
		Path      string   `json:"path"`
		Argv      []string `json:"argv"`
		TimeoutMS int      `json:"timeout_ms"`
		N         int      `json:"n"`
		S         string   `json:"s"`
		MediaType string   `json:"media_type"`
		MB        int      `json:"mb"`
		B64       string   `json:"b64"`
		Panic     bool     `json:"panic"`
		Op        string   `json:"op"`
		Key       string   `json:"key"`
		Mode      string   `json:"mode"`
	} `json:"input"`
}

func text(s string, isErr bool) uint64 {
	b, _ := json.Marshal(map[string]any{"content": []any{map[string]string{"type": "text", "text": s}}, "is_error": isErr})
	return ret(b)
}

// hostReply finishes the two-call protocol: n is what a host function returned for buf.
func hostReply(n int64, buf []byte) (string, error) {
	if n < 0 {
		msg := make([]byte, 512)
		m := lastError(addr(msg), uint32(len(msg)))
		return "", fmt.Errorf("status %d: %s", n, msg[:min(int(m), len(msg))])
	}
	if int(n) <= len(buf) {
		return string(buf[:n]), nil
	}
	big := make([]byte, n)
	if got := take(addr(big), uint32(n)); got != n {
		return "", fmt.Errorf("take returned %d", got)
	}
	return string(big), nil
}

//go:wasmexport toolhost_call
func call(n uint32) uint64 {
	defer runtime.Gosched()
	var req request
	if err := json.Unmarshal(input[:n], &req); err != nil {
		return text("bad request: "+err.Error(), true)
	}
	switch req.Tool {
	case "echo":
		return text(req.Input.Text, false)
	case "spin":
		x := 0
		for {
			x++
		}
	case "sleep":
		time.Sleep(time.Duration(req.Input.MS) * time.Millisecond)
		return text("slept", false)
	case "trap":
		var m map[string]int
		m["boom"] = 1 // nil map write: an unrecovered panic kills the instance
	case "bad_result":
		return uint64(0xFFFFFF00)<<32 | 4096
	case "oob":
		return text(oob(), false)
	case "read":
		buf := make([]byte, 64)
		p := []byte(req.Input.Path)
		s, err := hostReply(fsRead(addr(p), uint32(len(p)), addr(buf), uint32(len(buf))), buf)
		if err != nil {
			return text(err.Error(), true)
		}
		return text(s, false)
	case "exec":
		r, _ := json.Marshal(map[string]any{"argv": req.Input.Argv, "timeout_ms": req.Input.TimeoutMS})
		buf := make([]byte, 4096)
		s, err := hostReply(execRun(addr(r), uint32(len(r)), addr(buf), uint32(len(buf))), buf)
		if err != nil {
			return text(err.Error(), true)
		}
		return text(s, false)
	case "huge":
		return text(strings.Repeat(req.Input.S, req.Input.N), false)
	case "ansi":
		return text("\x1b[31mred\x1b[0m plain \x1b]0;title\x07done", false)
	case "image":
		b, _ := json.Marshal(map[string]any{"content": []any{map[string]any{"type": "image",
			"source": map[string]string{"type": "base64", "media_type": req.Input.MediaType, "data": "AAAA"}}}})
		return ret(b)
	case "store":
		k, buf := []byte(req.Input.Key), make([]byte, 64)
		var n int64
		switch req.Input.Op {
		case "put":
			d := []byte(req.Input.Text)
			n = storePut(addr(k), uint32(len(k)), addr(d), uint32(len(d)))
		case "get":
			n = storeGet(addr(k), uint32(len(k)), addr(buf), uint32(len(buf)))
		case "list":
			n = storeList(addr(k), uint32(len(k)), addr(buf), uint32(len(buf)))
		}
		if req.Input.Op == "put" && n >= 0 {
			return text(fmt.Sprintf("stored %d", n), false)
		}
		s, err := hostReply(n, buf)
		if err != nil {
			return text(err.Error(), true)
		}
		return text(s, false)
	case "raw", "shaped":
		b, err := base64.StdEncoding.DecodeString(req.Input.B64)
		if err != nil {
			return text(err.Error(), true)
		}
		return ret(b)
	case "held":
		return held(req.Input.Path, req.Input.Mode, req.Input.N)
	case "leak":
		// Everything a plugin can do with a secret it came across: log it, use it as a
		// path (last_error and the audit see it), return it.
		buf := make([]byte, 256)
		p := []byte(req.Input.Path)
		got, err := hostReply(fsRead(addr(p), uint32(len(p)), addr(buf), uint32(len(buf))), buf)
		if err != nil {
			return text(err.Error(), true)
		}
		got = strings.TrimSpace(got)
		if req.Input.Panic {
			panic("the file says " + got) // onto stderr, which the host quotes
		}
		msg := []byte("the file says " + got)
		logWrite(0, addr(msg), uint32(len(msg)))
		q := []byte(got)
		_, err = hostReply(fsRead(addr(q), uint32(len(q)), addr(buf), uint32(len(buf))), buf)
		return text("read "+got+"; then: "+fmt.Sprint(err), false)
	case "garbage":
		keep = make([]byte, req.Input.MB<<20)
		keep = nil
		return text("ok", false)
	}
	return text("[probe: unknown tool "+req.Tool+"]", true)
}

// oob calls every host function with pointers and lengths outside memory and reports the
// statuses it got back.
func oob() string {
	const bad = 0xFFFFFF00
	ok := []byte("notes.txt")
	buf := make([]byte, 16)
	var parts []string
	report := func(name string, v int64) { parts = append(parts, fmt.Sprintf("%s=%d", name, v)) }
	report("read_path", fsRead(bad, 1000, addr(buf), 16))
	report("read_len", fsRead(addr(ok), 0xFFFFFFFF, addr(buf), 16))
	report("write_data", fsWrite(addr(ok), uint32(len(ok)), bad, 100))
	report("exec_req", execRun(bad, 10, addr(buf), 16))
	report("take_none", take(addr(buf), 16))
	report("last_error_out", lastError(bad, 100))
	logWrite(0, bad, 100) // must be ignored, not trap
	return strings.Join(parts, " ")
}

// lastHeld is the host buffer the last held call of this instance was given.
var lastHeld uint32

// held reads path into host buffers (read_text with hold) and returns a framed result
// whose text block names one as mode says; the host must refuse every name but its own.
func held(path, mode string, n int) uint64 {
	var id uint32
	switch mode {
	case "zero":
	case "stale":
		if lastHeld == 0 {
			return text("no earlier buffer on this instance", true)
		}
		id = lastHeld
	default:
		reads := max(n, 1)
		if mode == "many" {
			reads = 1
		}
		for range reads {
			r, _ := json.Marshal(map[string]any{"path": path, "hold": true})
			buf := make([]byte, 512)
			s, err := hostReply(fsReadText(addr(r), uint32(len(r)), addr(buf), uint32(len(buf))), buf)
			if err != nil {
				return text(err.Error(), true)
			}
			head, rest, _ := strings.Cut(s, "\n")
			var h struct {
				Buffer uint32 `json:"buffer"`
			}
			if err := json.Unmarshal([]byte(head), &h); err != nil || h.Buffer == 0 || rest != "" {
				return text(fmt.Sprintf("the host did not hold the text: %q", s), true)
			}
			id = h.Buffer
		}
		lastHeld = id
	}
	if mode == "unknown" {
		id += 1000
	}
	times := 1
	if mode == "many" {
		times = n
	}
	b := append([]byte("\x00thr1"), 0)
	for range times {
		b = append(b, 'h', byte(id), byte(id>>8), byte(id>>16), byte(id>>24))
		tail := "[end]"
		if mode == "many" {
			tail = ""
		}
		b = append(b, byte(len(tail)), 0, 0, 0)
		b = append(b, tail...)
	}
	return ret(b)
}
