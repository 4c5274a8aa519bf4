package framedinput

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/abi"
)

func TestFramedInputRoundTrip(t *testing.T) {
	var obj map[string]any
	dec := json.NewDecoder(strings.NewReader(`{"path":"a\"b\n","n":12345678901234567890,"on":true,"none":null,
		"list":["x","<y>"],"obj":{"b":1,"a":[]},"empty":""}`))
	dec.UseNumber()
	if err := dec.Decode(&obj); err != nil {
		t.Fatal(err)
	}
	req, err := Encode("write_file", obj)
	if err != nil {
		t.Fatal(err)
	}
	if len(req) != abi.FramedInputSize("write_file", mustMembers(t, req)) {
		t.Errorf("FramedInputSize disagrees with the encoding")
	}
	tool, members, err := abi.ParseFramedInput(req, nil)
	if err != nil || string(tool) != "write_file" {
		t.Fatalf("tool %q, err %v", tool, err)
	}
	var got []string
	for _, m := range members {
		got = append(got, string(m.Kind)+" "+string(m.Key)+"="+string(m.Value))
	}
	// Sorted by key; strings decoded; other values as JSON text, numbers as written, HTML
	// characters not escaped.
	want := []string{`s empty=`, `j list=["x","<y>"]`, `j n=12345678901234567890`, `j none=null`,
		`j obj={"a":[],"b":1}`, `j on=true`, "s path=a\"b\n"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("members\n%q\nwant\n%q", got, want)
	}
}

func mustMembers(t *testing.T, req []byte) []abi.InputMember {
	t.Helper()
	_, m, err := abi.ParseFramedInput(req, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
