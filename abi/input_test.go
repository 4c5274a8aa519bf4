package abi

import (
	"bytes"
	"testing"
)

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
