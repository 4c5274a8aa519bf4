package pdk

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// sprintf agrees with fmt.Sprintf on the verbs and types it supports.
func TestSprintfMatchesFmt(t *testing.T) {
	for _, c := range []struct {
		format string
		args   []any
	}{
		{"Error: could not read %s: %v", []any{"a.txt", errors.New("no such file")}},
		{"%d lines, %d%% done, %v", []any{42, int64(-7), true}},
		{"%q and %q", []any{"quote\"d\n", 'x'}},
		{"%x %x %x", []any{255, "hi", uint8(10)}},
		{"%v %s %v", []any{3.5, []byte("raw"), float32(0.25)}},
		{"%s took %v", []any{"build", 1500 * time.Millisecond}},
		{"%v and %d", []any{nil, uint64(1 << 40)}},
		{"100%% plain", nil},
	} {
		if got, want := sprintf(c.format, c.args), fmt.Sprintf(c.format, c.args...); got != want {
			t.Errorf("sprintf(%q): %q, fmt says %q", c.format, got, want)
		}
	}
	for format, want := range map[string]string{
		"%s %s":     "a %!s(MISSING)",
		"%s":        "a",
		"extra":     "extra%!(EXTRA)",
		"trailing%": "trailing%!(NOVERB)",
	} {
		args := []any{"a"}
		if format == "%s %s" || format == "%s" {
			args = []any{"a"}
		}
		if format == "trailing%" {
			args = nil
		}
		if got := sprintf(format, args); got != want {
			t.Errorf("sprintf(%q): %q, want %q", format, got, want)
		}
	}
	if got := sprintf("%v", []any{struct{}{}}); got != "%!v(unsupported)" {
		t.Errorf("an unsupported type: %q", got)
	}
	if r := Errorf("Error: %s", "x"); !r.IsError || r.Content[0].Text != "Error: x" {
		t.Errorf("Errorf: %+v", r)
	}
}
