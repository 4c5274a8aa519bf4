package abi

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestFramedInputRoundTrip(t *testing.T) {
	var obj map[string]any
	dec := json.NewDecoder(strings.NewReader(`{"path":"a\"b\n","n":12345678901234567890,"on":true,"none":null,
		"list":["x","<y>"],"obj":{"b":1,"a":[]},"empty":""}`))
	dec.UseNumber()
	if err := dec.Decode(&obj); err != nil {
		t.Fatal(err)
	}
	req, err := EncodeFramedInput("write_file", obj)
	if err != nil {
		t.Fatal(err)
	}
	if len(req) != FramedInputSize("write_file", mustMembers(t, req)) {
		t.Errorf("FramedInputSize disagrees with the encoding")
	}
	tool, members, err := ParseFramedInput(req, nil)
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

func mustMembers(t *testing.T, req []byte) []InputMember {
	t.Helper()
	_, m, err := ParseFramedInput(req, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestParseFramedInputRefusesDamage(t *testing.T) {
	good := AppendFramedInput(nil, "echo", []InputMember{{Kind: MemberString, Key: []byte("text"), Value: []byte("hello")}})
	if _, _, err := ParseFramedInput(good, nil); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		"empty":         nil,
		"json":          []byte(`{"tool":"echo"}`),
		"no tool":       []byte(FramedInputMagic),
		"tool too long": append([]byte(FramedInputMagic), 9, 'a'),
		"cut key":       good[:len(FramedInputMagic)+1+4+1+2],
		"cut value":     good[:len(good)-1],
		"long value":    append(bytes.Clone(good[:len(good)-5-4]), 0xff, 0xff, 0xff, 0xff, 'h'),
		"unknown kind":  append(bytes.Clone(good), 'x', 0, 0, 0, 0, 0, 0, 0, 0),
	} {
		if _, _, err := ParseFramedInput(b, nil); err == nil {
			t.Errorf("%s: accepted %q", name, b)
		}
	}
}
