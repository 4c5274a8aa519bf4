//go:build unix

package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/pdk/pdktest"
)

func numbered(from, to int) string {
	var b strings.Builder
	for i := from; i <= to; i++ {
		fmt.Fprintf(&b, "%6d\tline %d\n", i, i)
	}
	return b.String()
}

func lines(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	return b.String()
}

func TestReadFile(t *testing.T) {
	w := pdktest.New(t)
	w.Write("small.txt", "alpha\nbeta\r\n\tgamma")
	w.Write("long.txt", lines(5120))
	w.Write("empty.txt", "")
	w.Write("bin.dat", "PK\x03\x04\x00\x00binary")
	w.Write("latin1.txt", "caf\xe9 cr\xe8me br\xfbl\xe9e and a long enough English sentence to be text")
	w.Write("noise.bin", "\xff\xfe\xfd\xfc\x80\x81\x82\x83abc")
	w.Write("dir/x.txt", "x\n")
	w.Write("wide.txt", strings.Repeat("é", 2500)+"\nshort\n")

	cases := []struct {
		name, input, want string
		isErr             bool
	}{
		{"small", `{"path":"small.txt"}`, "     1\talpha\n     2\tbeta\n     3\t\tgamma\n", false},
		{"absolute", `{"path":"/home/user/small.txt","offset":2,"limit":1}`,
			"     2\tbeta\n[showing lines 2-2 of 3; continue with offset 3]\n", false},
		{"default limit", `{"path":"long.txt"}`,
			numbered(1, 2000) + "[showing lines 1-2000 of 5120; continue with offset 2001]\n", false},
		{"tail", `{"path":"long.txt","offset":5000,"limit":500}`,
			numbered(5000, 5120) + "[showing lines 5000-5120 of 5120]\n", false},
		{"offset past end", `{"path":"long.txt","offset":6000}`,
			"Error: offset 6000 is past the end of long.txt, which has 5120 lines; use an offset from 1 to 5120", true},
		{"empty", `{"path":"empty.txt"}`, "[read_file: empty.txt is empty (0 bytes)]", false},
		{"binary", `{"path":"bin.dat"}`, "Error: bin.dat is a binary file; read_file shows text, images (PNG, JPEG, GIF, WebP), PDFs and notebooks", true},
		{"noise", `{"path":"noise.bin"}`, "Error: noise.bin is a binary file; read_file shows text, images (PNG, JPEG, GIF, WebP), PDFs and notebooks", true},
		{"latin1", `{"path":"latin1.txt"}`, "     1\tcaf\uFFFD cr\uFFFDme br\uFFFDl\uFFFDe and a long enough English sentence to be text\n", false},
		{"dir", `{"path":"dir"}`, "Error: dir is a directory; use glob or bash ls to list it", true},
		{"missing", `{"path":"nope.txt"}`, "Error: could not read nope.txt: no such file or directory", true},
		{"outside", `{"path":"../etc/passwd"}`, "Error: could not read ../etc/passwd: path is outside the workspace", true},
		{"wide", `{"path":"wide.txt"}`,
			"     1\t" + strings.Repeat("é", 2000) + " [... line cut: 500 more characters]\n     2\tshort\n", false},
	}
	for _, c := range cases {
		got, isErr := w.Call("read_file", c.input)
		if got != c.want || isErr != c.isErr {
			t.Errorf("%s: got (%v)\n%q\nwant (%v)\n%q", c.name, isErr, trim(got), c.isErr, trim(c.want))
		}
	}
}

func trim(s string) string {
	if len(s) > 400 {
		return s[:200] + " ... " + s[len(s)-200:]
	}
	return s
}

func TestReadFileOutputLimit(t *testing.T) {
	w := pdktest.New(t)
	line := strings.Repeat("x", 1000)
	var b strings.Builder
	for range 100 {
		b.WriteString(line + "\n")
	}
	w.Write("big.txt", b.String())
	got, isErr := w.Call("read_file", `{"path":"big.txt"}`)
	// Each numbered line is 1008 bytes: 47 fit under 48,000.
	if isErr || !strings.HasSuffix(got, "[showing lines 1-47 of 100 (output limit reached); continue with offset 48]\n") {
		t.Fatalf("got %q", trim(got))
	}
	if n := strings.Count(got, "\n"); n != 48 {
		t.Errorf("%d lines", n)
	}
}

func TestWriteFile(t *testing.T) {
	w := pdktest.New(t)
	got, isErr := w.Call("write_file", `{"path":"a/b/c.txt","content":"héllo\n"}`)
	if isErr || got != "File written: a/b/c.txt (7 bytes)" {
		t.Fatalf("got %v %q", isErr, got)
	}
	if s := w.Read("a/b/c.txt"); s != "héllo\n" {
		t.Errorf("file holds %q", s)
	}
	got, isErr = w.Call("write_file", `{"path":"a/b","content":"x"}`)
	if !isErr || got != "Error: a/b is a directory; give the path of a file" {
		t.Errorf("dir: %v %q", isErr, got)
	}
	got, isErr = w.Call("write_file", `{"path":"/etc/x","content":"x"}`)
	if !isErr || got != "Error: could not write /etc/x: path is outside the workspace" {
		t.Errorf("outside: %v %q", isErr, got)
	}
}

func TestApplyEdit(t *testing.T) {
	cases := []struct {
		name, content, old, new string
		all                     bool
		want                    string
		n                       int
		err                     string
	}{
		{"once", "a foo b", "foo", "bar", false, "a bar b", 1, ""},
		{"missing", "a foo b", "baz", "bar", false, "", 0, "Error: old_string not found in PATH; read the file again and copy the text exactly, including whitespace"},
		{"twice", "foo foo", "foo", "bar", false, "", 0, "Error: old_string found 2 times in PATH; add surrounding context or set replace_all"},
		{"all", "foo foo foo", "foo", "bar", true, "bar bar bar", 3, ""},
		{"all once", "foo", "foo", "", true, "", 1, ""},
		{"crlf", "one\r\ntwo\r\nthree\r\n", "two\nthree", "2\n3\n3b", false, "one\r\n2\r\n3\r\n3b\r\n", 1, ""},
		{"crlf old has crlf", "one\r\ntwo\r\n", "one\r\ntwo", "x\ny", false, "x\r\ny\r\n", 1, ""},
		{"lf untouched", "one\ntwo\n", "one\ntwo", "a\nb", false, "a\nb\n", 1, ""},
		{"mixed exact", "a\r\nb\nc\n", "b\nc", "B\nC", false, "a\r\nB\nC\n", 1, ""},
		{"mixed crlf", "a\r\nb\r\nc\n", "a\nb", "A\nB", false, "A\r\nB\r\nc\n", 1, ""},
		{"line numbers", "func f() {\n\treturn 1\n}\n", "     1\tfunc f() {\n     2\t\treturn 1", "x", false, "", 0,
			"Error: old_string not found in PATH; old_string seems to include read_file's line-number prefixes (number and tab): leave them out"},
		{"whitespace", "func f() {\n\treturn 1\n}\n", "func f() {\n    return 1", "x", false, "", 0,
			"Error: old_string not found in PATH; a match exists that differs only in whitespace (tabs against spaces, indentation or trailing blanks): read the file again and copy the text exactly"},
		{"overlap", "aaa", "aa", "b", true, "ba", 1, ""},
	}
	for _, c := range cases {
		b, n, err := applyEdit(c.content, c.old, c.new, c.all)
		if got := string(b); got != c.want || n != c.n || err != c.err {
			t.Errorf("%s: got %q, %d, %q; want %q, %d, %q", c.name, b, n, err, c.want, c.n, c.err)
		}
	}
}

func TestEditFile(t *testing.T) {
	w := pdktest.New(t)
	w.Write("f.go", "package f\r\n\r\nvar x = 1\r\nvar y = x\r\n")
	w.Call("read_file", `{"path":"f.go"}`)
	cases := []struct {
		input, want string
		isErr       bool
	}{
		{`{"path":"f.go","old_string":"","new_string":"x"}`, "Error: old_string is empty; give the exact text to replace (to create or overwrite a whole file, use write_file)", true},
		{`{"path":"f.go","old_string":"x","new_string":"x"}`, "Error: old_string and new_string are the same; no edit to make", true},
		{`{"path":"nope.go","old_string":"x","new_string":"y"}`, "Error: could not read nope.go: no such file or directory", true},
		{`{"path":"f.go","old_string":"x","new_string":"z"}`, "Error: old_string found 2 times in f.go; add surrounding context or set replace_all", true},
		{`{"path":"f.go","old_string":"var x = 1\nvar y","new_string":"var x = 2\nvar y"}`, "File edited: f.go", false},
		{`{"path":"f.go","old_string":"x","new_string":"z","replace_all":true}`, "File edited: f.go (2 replacements)", false},
	}
	for _, c := range cases {
		got, isErr := w.Call("edit_file", c.input)
		if got != c.want || isErr != c.isErr {
			t.Errorf("%s: got %v %q, want %v %q", c.input, isErr, got, c.isErr, c.want)
		}
	}
	if s := w.Read("f.go"); s != "package f\r\n\r\nvar z = 2\r\nvar y = z\r\n" {
		t.Errorf("file holds %q", s)
	}
}

func TestUnknownTool(t *testing.T) {
	w := pdktest.New(t)
	got, isErr := w.Call("nope", `{}`)
	if !isErr || got != `Error: plugin editfile has no tool "nope"` {
		t.Errorf("unknown tool: %v %q", isErr, got)
	}
}
