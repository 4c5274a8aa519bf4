package kitconform

import (
	"context"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// jsonRequests checks that a kit still reads the JSON request of ABI.md section 5, which
// a host older than the framed input sends (the host here sends the framed form to every
// plugin that asks for it, so the suite's other checks never reach this path). The
// module runs on bare wazero, with host functions of its own: sandbox_files.write
// records what it was given, every other function refuses (-1) with a message.
func jsonRequests(t *testing.T, wasm []byte) {
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer rt.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)

	const refusal = "policy: refused by the suite"
	var written struct{ path, data string }
	read := func(m api.Module, ptr, n uint32) string {
		b, _ := m.Memory().Read(ptr, n)
		return string(b)
	}
	_, err := rt.NewHostModuleBuilder("toolhost").
		NewFunctionBuilder().WithFunc(func(ctx context.Context, m api.Module, out, capacity uint32) int64 { return -2 }).Export("take").
		NewFunctionBuilder().WithFunc(func(ctx context.Context, m api.Module, out, capacity uint32) int64 {
		m.Memory().Write(out, []byte(refusal)[:min(len(refusal), int(capacity))])
		return int64(len(refusal))
	}).Export("last_error").
		Instantiate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.NewHostModuleBuilder("toolhost_log").
		NewFunctionBuilder().WithFunc(func(ctx context.Context, m api.Module, level int32, p, n uint32) {}).Export("write").
		Instantiate(ctx); err != nil {
		t.Fatal(err)
	}
	refuse4 := func(ctx context.Context, m api.Module, a, b, c, d uint32) int64 { return -1 }
	files := rt.NewHostModuleBuilder("toolhost_sandbox_files").
		NewFunctionBuilder().WithFunc(func(ctx context.Context, m api.Module, p, pn, d, dn uint32) int64 {
		written.path, written.data = read(m, p, pn), read(m, d, dn)
		return int64(dn)
	}).Export("write").
		NewFunctionBuilder().WithFunc(func(ctx context.Context, m api.Module, p, pn uint32) int64 { return -1 }).Export("remove")
	for _, name := range []string{"read", "read_text", "read_versioned", "stat", "list"} {
		files = files.NewFunctionBuilder().WithFunc(refuse4).Export(name)
	}
	if _, err := files.Instantiate(ctx); err != nil {
		t.Fatal(err)
	}
	execs := rt.NewHostModuleBuilder("toolhost_sandbox_exec")
	for _, name := range []string{"run", "process", "terminal_start", "terminal_io"} {
		execs = execs.NewFunctionBuilder().WithFunc(refuse4).Export(name)
	}
	if _, err := execs.Instantiate(ctx); err != nil {
		t.Fatal(err)
	}

	mod, err := rt.InstantiateWithConfig(ctx, wasm, wazero.NewModuleConfig().WithStartFunctions("_initialize"))
	if err != nil {
		t.Fatalf("instantiate: %v", err)
	}
	call := func(request string) (string, bool) {
		t.Helper()
		res, err := mod.ExportedFunction("toolhost_input_buffer").Call(ctx, uint64(len(request)))
		if err != nil {
			t.Fatal(err)
		}
		if !mod.Memory().Write(uint32(res[0]), []byte(request)) {
			t.Fatal("the input buffer is outside memory")
		}
		res, err = mod.ExportedFunction("toolhost_call").Call(ctx, uint64(len(request)))
		if err != nil {
			t.Fatalf("toolhost_call %s: %v", request, err)
		}
		out, ok := mod.Memory().Read(uint32(res[0]>>32), uint32(res[0]))
		if !ok {
			t.Fatal("the result is outside memory")
		}
		return framedText(t, out)
	}

	req := `{"tool": "write_note", "input": {"text": "h\u00e9\ud83d\ude00 \"q\" \\ \/\n\t\u0001", "path": "j.txt"}}`
	got, isErr := call(req)
	want := "h\u00e9\U0001F600 \"q\" \\ /\n\t\u0001"
	if isErr || written.path != "j.txt" || written.data != want {
		t.Errorf("JSON request %s: wrote %q to %q (result %q, is_error %v); want %q to j.txt", req, written.data, written.path, got, isErr, want)
	}
	if got, isErr := call(`{"tool":"read_note","input":{"path":"x"}}`); !isErr || got != "Error: "+refusal {
		t.Errorf("JSON read_note refused by the host: %q (is_error %v), want %q", got, isErr, "Error: "+refusal)
	}
	if _, isErr := call(`{"tool":"nope","input":{}}`); !isErr {
		t.Error("an unknown tool is not an error result")
	}
	if _, isErr := call(`{"tool":`); !isErr {
		t.Error("a request that is not JSON is not an error result")
	}
}

// framedText reads a result: the framed form's text blocks, or JSON's.
func framedText(t *testing.T, b []byte) (string, bool) {
	t.Helper()
	if len(b) < 6 || string(b[:5]) != "\x00thr1" {
		// A JSON result: the kits here all answer framed.
		t.Fatalf("the result is not framed: %q", b)
	}
	isErr := b[5]&1 != 0
	var text strings.Builder
	for i := 6; i < len(b); {
		switch b[i] {
		case 't':
			if i+5 > len(b) {
				t.Fatalf("framed result cut short: %q", b)
			}
			n := int(binary.LittleEndian.Uint32(b[i+1:]))
			if i+5+n > len(b) {
				t.Fatalf("framed result cut short: %q", b)
			}
			text.Write(b[i+5 : i+5+n])
			i += 5 + n
		default:
			t.Fatalf("framed result with a block %q this check does not read: %q", b[i], b)
		}
	}
	return text.String(), isErr
}
