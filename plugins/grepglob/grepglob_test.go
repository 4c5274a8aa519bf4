//go:build unix

package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/pdk/pdktest"
)

func TestGlobMatcher(t *testing.T) {
	cases := []struct {
		pattern, path string
		want          bool
	}{
		{"*.go", "main.go", true},
		{"*.go", "cmd/main.go", false},
		{"*.go", ".hidden.go", true},
		{"**/*.go", "main.go", true},
		{"**/*.go", "a/b/c/main.go", true},
		{"**/*.go", "a/b/c/main.got", false},
		{"src/**/*.ts", "src/a.ts", true},
		{"src/**/*.ts", "src/x/y/a.ts", true},
		{"src/**/*.ts", "lib/a.ts", false},
		{"src/**", "src/x/y/a.ts", true},
		{"**", "a/b", true},
		{"a/**/b/**/c", "a/b/c", true},
		{"a/**/b/**/c", "a/x/b/y/z/c", true},
		{"a/**/b/**/c", "a/x/y/z/c", false},
		{"*.{ts,tsx}", "a.tsx", true},
		{"*.{ts,tsx}", "a.ts", true},
		{"*.{ts,tsx}", "a.t", false},
		{"{src,lib}/**/*.{js,mjs}", "lib/x/a.mjs", true},
		{"{src,lib}/**/*.{js,mjs}", "test/a.js", false},
		{"a{b,{c,d}e}f", "adef", true},
		{"a{b,{c,d}e}f", "abf", true},
		{"a{b,{c,d}e}f", "adf", false},
		{"{x}", "{x}", true},
		{"file?.txt", "file1.txt", true},
		{"file?.txt", "file10.txt", false},
		{"file?.txt", "fileé.txt", true},
		{"[abc].txt", "b.txt", true},
		{"[!abc].txt", "b.txt", false},
		{"[!abc].txt", "d.txt", true},
		{"[^abc].txt", "d.txt", true},
		{"[a-c]*", "beta", true},
		{"[a-c]*", "delta", false},
		{`\[id\].tsx`, "[id].tsx", true},
		{`\*`, "*", true},
		{`\*`, "x", false},
		{"[{]a,b}", "{a,b}", true},
		{"*", "a/b", false},
		{"a/*/c", "a/b/c", true},
		{"a/*/c", "a/b/d/c", false},
	}
	for _, c := range cases {
		m, err := compileGlob(c.pattern)
		if err != nil {
			t.Errorf("compileGlob(%q): %v", c.pattern, err)
			continue
		}
		if got := m.match(c.path); got != c.want {
			t.Errorf("%q matching %q = %v, want %v", c.pattern, c.path, got, c.want)
		}
	}
	for _, bad := range []string{"[abc", `abc\`, strings.Repeat("{a,b}", 11)} {
		if _, err := compileGlob(bad); err == nil {
			t.Errorf("compileGlob(%q) accepted it", bad)
		}
	}
}

func TestStaticPrefix(t *testing.T) {
	for _, c := range [][3]string{
		{"src/**/*.go", "src", "**/*.go"},
		{"a/b/c.txt", "a/b", "c.txt"},
		{"*.go", "", "*.go"},
		{"a/{b,c}/d", "a", "{b,c}/d"},
		{"a/[x]/d", "a", "[x]/d"},
	} {
		if dir, rest := staticPrefix(c[0]); dir != c[1] || rest != c[2] {
			t.Errorf("staticPrefix(%q) = %q, %q", c[0], dir, rest)
		}
	}
}

func TestGrepArgv(t *testing.T) {
	a := grepArgs{pattern: "-rf $(rm -rf /); echo 'x'", path: "src", mode: "content", ignoreCase: true, context: 2}
	a.includes, a.filter, _ = parseGlobs("*.{go,mod}")
	want := []string{"grep", "-r", "-H", "-P", "-I", "-Z", "--exclude-dir=.git", "--exclude-dir=node_modules",
		"-n", "-C", "2", "-i", "--include=*.go", "--include=*.mod", "-e", "-rf $(rm -rf /); echo 'x'", "--", "src"}
	if got := a.argv(); !slices.Equal(got, want) {
		t.Errorf("argv\n got %q\nwant %q", got, want)
	}
	if a.filter != nil {
		t.Errorf("a base-name glob needs no filter")
	}
	b := grepArgs{pattern: "x", path: ".", mode: "files_with_matches"}
	if got := b.argv(); !slices.Equal(got[8:], []string{"-l", "-e", "x", "--", "."}) {
		t.Errorf("files mode argv %q", got)
	}
	c := grepArgs{pattern: "x", path: ".", mode: "count"}
	if got := c.argv(); !slices.Equal(got[8:], []string{"-c", "-e", "x", "--", "."}) {
		t.Errorf("count mode argv %q", got)
	}

	inc, f, _ := parseGlobs("src/**/*.ts, *.md")
	if !slices.Equal(inc, []string{"*.ts", "*.md"}) || f == nil || !f.match("src/a/b.ts") || !f.match("docs/x.md") || f.match("lib/b.ts") {
		t.Errorf("parseGlobs with dirs: %q %v", inc, f)
	}
	inc, f, _ = parseGlobs("vendor/**")
	if inc != nil || f == nil || !f.match("vendor/x/y.go") {
		t.Errorf("parseGlobs(vendor/**): %q", inc)
	}
	if _, _, e := parseGlobs("[oops"); !strings.HasPrefix(e, "Error: bad glob [oops") {
		t.Errorf("bad glob: %q", e)
	}
}

func TestGrepParse(t *testing.T) {
	content := "./z.txt\x001:foo\n--\n./d/x: y.txt\x001-a\n./d/x: y.txt\x002:foo 1\n./d/x: y.txt\x003-b\n--\n./d/x: y.txt\x006-e\n./d/x: y.txt\x007:foo: 2\n"
	a := grepArgs{path: ".", mode: "content", context: 1, headLimit: 250}
	got := testenv.ResultText(a.format(abi.ExecResult{Stdout: content}))
	want := "d/x: y.txt-1-a\nd/x: y.txt:2:foo 1\nd/x: y.txt-3-b\n--\nd/x: y.txt-6-e\nd/x: y.txt:7:foo: 2\n--\nz.txt:1:foo\n"
	if got != want {
		t.Errorf("content:\n%s\nwant\n%s", got, want)
	}
	a.headLimit = 2
	got = testenv.ResultText(a.format(abi.ExecResult{Stdout: content}))
	if want := "d/x: y.txt-1-a\nd/x: y.txt:2:foo 1\n[showing first 2 of 6 entries; narrow the pattern or raise head_limit]\n"; got != want {
		t.Errorf("head_limit:\n%s", got)
	}
	f := grepArgs{path: ".", mode: "files_with_matches"}
	if got := testenv.ResultText(f.format(abi.ExecResult{Stdout: "./z.txt\x00./d/x: y.txt\x00/home/user/a b\x00"})); got != "a b\nd/x: y.txt\nz.txt\n" {
		t.Errorf("files: %q", got)
	}
	c := grepArgs{path: "src", mode: "count"}
	if got := testenv.ResultText(c.format(abi.ExecResult{Stdout: "src/b\x003\nsrc/a:1\x000\nsrc/c\x0012\n"})); got != "src/b:3\nsrc/c:12\n" {
		t.Errorf("count: %q", got)
	}
	if r := c.format(abi.ExecResult{ExitCode: 1}); testenv.ResultText(r) != "[grep: no matches found]" || r.IsError {
		t.Errorf("no match: %+v", r)
	}
	if r := c.format(abi.ExecResult{ExitCode: 2, Stderr: "grep: unmatched parentheses\n"}); testenv.ResultText(r) != "Error: grep failed: grep: unmatched parentheses" || !r.IsError {
		t.Errorf("bad regex: %+v", r)
	}
	r := c.format(abi.ExecResult{ExitCode: 2, Stdout: "src/a\x001\n", Stderr: "grep: src/b: Permission denied\n"})
	if testenv.ResultText(r) != "src/a:1\n[grep reported errors for some files: grep: src/b: Permission denied]\n" || r.IsError {
		t.Errorf("partial errors: %+v", r)
	}
	long := strings.Repeat("é", 700)
	if got := testenv.ResultText(a.format(abi.ExecResult{Stdout: "f\x001:" + long + "\n"})); got != "f:1:"+strings.Repeat("é", 500)+" [... 200 more characters]\n" {
		t.Errorf("long line: %q", got)
	}
	g := grepArgs{path: "src", mode: "files_with_matches"}
	_, g.filter, _ = parseGlobs("a/**/*.go")
	if got := testenv.ResultText(g.format(abi.ExecResult{Stdout: "src/a/x.go\x00src/b/x.go\x00src/a/y/z.go\x00"})); got != "src/a/x.go\nsrc/a/y/z.go\n" {
		t.Errorf("filter relative to path: %q", got)
	}
}

func TestGrepTool(t *testing.T) {
	w := pdktest.New(t)
	w.Write("a.go", "package a\n// TODO: fix $(x); 'q' \"dq\"\n")
	w.Write("dir/with: colon.txt", "-v flag here\nTODO twice\n")
	w.Write("src/deep/b.ts", "todo lower\n")
	w.Write("node_modules/m/x.js", "TODO hidden\n")
	w.Write(".git/config", "TODO hidden\n")
	w.Write("bin.dat", "TODO\x00binary\n")
	w.Write("latin1.txt", "caf\xe9 latin\n")
	cases := []struct {
		input, want string
		isErr       bool
	}{
		{`{"pattern":"TODO"}`, "a.go:2:// TODO: fix $(x); 'q' \"dq\"\ndir/with: colon.txt:2:TODO twice\n", false},
		{`{"pattern":"todo","ignore_case":true,"output_mode":"files_with_matches"}`, "a.go\ndir/with: colon.txt\nsrc/deep/b.ts\n", false},
		{`{"pattern":"TODO|todo","output_mode":"count","path":"/home/user/src"}`, "src/deep/b.ts:1\n", false},
		{`{"pattern":"-v"}`, "dir/with: colon.txt:1:-v flag here\n", false},
		{`{"pattern":"\\$\\(x\\); 'q' \"dq\""}`, "a.go:2:// TODO: fix $(x); 'q' \"dq\"\n", false},
		{`{"pattern":"o","glob":"**/deep/*.ts","output_mode":"files_with_matches"}`, "src/deep/b.ts\n", false},
		{`{"pattern":"a","glob":"*.{go,txt}","output_mode":"files_with_matches"}`, "a.go\ndir/with: colon.txt\nlatin1.txt\n", false},
		{`{"pattern":"latin","output_mode":"count"}`, "latin1.txt:1\n", false},
		{`{"pattern":"nothing-here"}`, "[grep: no matches found]", false},
		{`{"pattern":"(unclosed"}`, "Error: grep failed: grep: missing closing parenthesis", true},
		{`{"pattern":"x","path":"nope"}`, "Error: grep failed: grep: nope: No such file or directory", true},
	}
	for _, c := range cases {
		got, isErr := w.Call("grep", c.input)
		if got != c.want || isErr != c.isErr {
			t.Errorf("%s:\n got %v %q\nwant %v %q", c.input, isErr, got, c.isErr, c.want)
		}
	}
}

func TestGlobTool(t *testing.T) {
	w := pdktest.New(t)
	for _, f := range []string{"main.go", "go.mod", "cmd/x/main.go", "pkg/a.go", "pkg/a_test.go", ".github/ci.yml",
		"node_modules/m/index.js", ".git/HEAD", "src/app.ts", "src/ui/button.tsx", "src/ui/button.css"} {
		w.Write(f, "x")
	}
	cases := []struct {
		input, want string
		isErr       bool
	}{
		{`{"pattern":"*.go"}`, "main.go\n", false},
		{`{"pattern":"**/*.go"}`, "cmd/x/main.go\nmain.go\npkg/a.go\npkg/a_test.go\n", false},
		{`{"pattern":"**/*_test.go","path":"pkg"}`, "pkg/a_test.go\n", false},
		{`{"pattern":"src/**/*.{ts,tsx}"}`, "src/app.ts\nsrc/ui/button.tsx\n", false},
		{`{"pattern":"/home/user/src/*.ts"}`, "src/app.ts\n", false},
		{`{"pattern":"**/*.js"}`, "[glob: no files matched]", false},
		{`{"pattern":"node_modules/**/*.js"}`, "node_modules/m/index.js\n", false},
		{`{"pattern":"**/*.yml"}`, ".github/ci.yml\n", false},
		{`{"pattern":"*"}`, "go.mod\nmain.go\n", false},
		{`{"pattern":"missing/**/*.go"}`, "[glob: no files matched]", false},
		{`{"pattern":"*.go","path":"nope"}`, "Error: could not list nope: no such file or directory", true},
		{`{"pattern":"*.go","path":"main.go"}`, "Error: main.go is not a directory; path must be a directory to search", true},
		{`{"pattern":"[oops"}`, "Error: bad glob pattern [oops: bad pattern segment [oops: unclosed [ or trailing \\", true},
	}
	for _, c := range cases {
		got, isErr := w.Call("glob", c.input)
		if got != c.want || isErr != c.isErr {
			t.Errorf("%s:\n got %v %q\nwant %v %q", c.input, isErr, got, c.isErr, c.want)
		}
	}
}

func TestFormatGlobLimit(t *testing.T) {
	var files []string
	for i := range 1500 {
		files = append(files, fmt.Sprintf("f%04d", i))
	}
	got := testenv.ResultText(formatGlob(files, false))
	if !strings.HasSuffix(got, "f0999\n[showing first 1000 of 1500 files; narrow the pattern or the path]\n") {
		t.Errorf("got ...%q", got[len(got)-100:])
	}
}

func TestGrepOutputBudget(t *testing.T) {
	var out strings.Builder
	for i := range 400 {
		fmt.Fprintf(&out, "f%03d\x001:%s\r\n", i, strings.Repeat("x", 400))
	}
	a := grepArgs{path: ".", mode: "content", headLimit: 0}
	got := testenv.ResultText(a.format(abi.ExecResult{Stdout: out.String()}))
	if len(got) > 50_000 || strings.Contains(got, "\r") {
		t.Errorf("%d bytes, CR kept: %v", len(got), strings.Contains(got, "\r"))
	}
	// Each line is 409 bytes: 111 lines pass 45,000.
	if !strings.HasSuffix(got, "[showing first 111 of 400 entries (output size limit); narrow the pattern, path or glob, or use files_with_matches]\n") {
		t.Errorf("got ...%q", got[len(got)-150:])
	}
}
