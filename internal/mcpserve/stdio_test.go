package mcpserve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// nopCloser is a WriteCloser over a buffer.
type nopCloser struct{ *bytes.Buffer }

func (nopCloser) Close() error { return nil }

// TestStdioBadLines: every line the SDK would end the session on is answered with a
// JSON-RPC error, with the request's id where it can be read (else null), and the lines
// after it are served.
func TestStdioBadLines(t *testing.T) {
	s, _ := newServer(t, testConfig(t), Options{})
	const maxLine = 64 << 10
	big := strings.Repeat("a", 2*maxLine)
	lines := []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"sh","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		// Too long, its id first: answered with that id.
		`{"jsonrpc":"2.0","id":"big","method":"tools/call","params":{"name":"write_file","arguments":{"path":"big.txt","content":"` + big + `"}}}`,
		// Too long, its id after the bound: null.
		`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"write_file","arguments":{"path":"big.txt","content":"` + big + `"}},"id":6}`,
		``,
		`garbage`,
		`42`,
		`{"jsonrpc":"1.0","id":8,"method":"ping"}`,
		`{"jsonrpc":"2.0","id":9,"method":"ping"} {"jsonrpc":"2.0","id":10,"method":"ping"}`,
		"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\"}\r",
		// The last line needs no newline.
		`{"jsonrpc":"2.0","id":11,"method":"ping"}`,
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	in := strings.NewReader(strings.Join(lines, "\n"))
	if err := s.Serve(ctx, StdioTransport(in, nopCloser{&out}, maxLine, nil)); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	type answer struct {
		Result json.RawMessage
		Error  *struct {
			Code    int
			Message string
		}
	}
	byID := map[string][]answer{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var msg struct {
			ID json.RawMessage
			answer
		}
		if err := json.Unmarshal(sc.Bytes(), &msg); err != nil {
			t.Fatalf("not JSON-RPC: %q", sc.Text())
		}
		byID[string(msg.ID)] = append(byID[string(msg.ID)], msg.answer)
	}
	errOf := func(id string, code int, text string) {
		t.Helper()
		as := byID[id]
		if len(as) != 1 || as[0].Error == nil || as[0].Error.Code != code || !strings.Contains(as[0].Error.Message, text) {
			t.Errorf("answer to %s: %+v; want error %d with %q", id, as, code, text)
		}
	}
	errOf(`"big"`, -32600, "request too large: this message is 131")
	errOf(`"big"`, -32600, "past the limit of 65536 bytes (64.0 KiB)")
	errOf("8", -32600, "not a JSON-RPC 2.0 message")
	nulls := byID["null"]
	codes := map[int]int{}
	for _, a := range nulls {
		if a.Error != nil {
			codes[a.Error.Code]++
		}
	}
	// The long line whose id was past the bound and `42`: invalid requests; garbage and
	// two values on one line: parse errors.
	if len(nulls) != 4 || codes[-32600] != 2 || codes[-32700] != 2 {
		t.Errorf("answers with a null id: %+v", nulls)
	}
	for _, id := range []string{"6", "9", "10"} {
		if _, ok := byID[id]; ok {
			t.Errorf("%s was answered: its id is past the bound, or its line is not JSON", id)
		}
	}
	for _, id := range []string{"1", "2", "11"} {
		if as := byID[id]; len(as) != 1 || as[0].Error != nil || as[0].Result == nil {
			t.Errorf("answer to %s: %+v", id, as)
		}
	}
	if !strings.Contains(string(byID["2"][0].Result), `"write_file"`) {
		t.Errorf("tools/list: %s", byID["2"][0].Result)
	}
}
