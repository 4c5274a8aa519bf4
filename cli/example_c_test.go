package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/internal/testenv"
)

// TestCExamplePlugin builds examples/c-wordcount with clang and wasi-libc, as its Makefile
// does, and runs it through the CLI: the ABI stays language-neutral as it changes.
func TestCExamplePlugin(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	src := filepath.Join(moduleRoot, "examples", "c-wordcount")
	for _, f := range []string{"wordcount.c", "Makefile"} {
		os.Stat(filepath.Join(src, f)) // in the test cache's key: a change reruns the test
	}
	if _, err := exec.LookPath("clang"); err != nil {
		testenv.Skipf(t, "clang is not installed (make test installs it: scripts/setup.sh --test; Debian packages clang lld wasi-libc libclang-rt-14-dev-wasm32)")
	}
	dir, ws := t.TempDir(), t.TempDir()
	wasm := filepath.Join(dir, "wordcount.wasm")
	build := exec.Command("make", "-s", "-C", src, "OUT="+wasm)
	var out bytes.Buffer
	build.Stdout, build.Stderr = &out, &out
	if err := build.Run(); err != nil {
		// clang without the WASI C library or the wasm32 runtime is a machine that lacks
		// part of the toolchain.
		testenv.Skipf(t, "building the C plugin failed (scripts/setup.sh --test installs wasi-libc and libclang-rt-N-dev-wasm32): %v\n%s", err, out.String())
	}

	os.WriteFile(filepath.Join(ws, "words.txt"), []byte("one two\nthree\n"), 0o644)
	os.WriteFile(filepath.Join(ws, "wörds.txt"), []byte("a b c d\n"), 0o644)
	os.WriteFile(filepath.Join(ws, "big.txt"), bytes.Repeat([]byte("word "), 2000), 0o644) // past the plugin's 4 KiB buffer: take
	os.MkdirAll(filepath.Join(ws, "docs"), 0o755)
	os.WriteFile(filepath.Join(ws, "docs", "a.md"), []byte("# doc\n"), 0o644)
	config := func(name, entry string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte("plugins:\n  - path: "+wasm+"\n"+entry), 0o644)
		return p
	}
	granted := config("granted.yaml", "    grants: [sandbox_files]\n")
	scoped := config("scoped.yaml", "    grants: [sandbox_files]\n    sandbox_files: {read: [\"docs/**\"]}\n")
	ungranted := config("ungranted.yaml", "    grants: []\n")

	call := func(cfg, input string) (string, bool) {
		t.Helper()
		r := runCLI(t, nil, "call", "count_words", input, "--workspace", ws, "--config", cfg)
		if r.code != 0 {
			t.Fatalf("count_words %s:\n%s", input, r)
		}
		res := decodeResult(t, r)
		if len(res.Content) != 1 {
			t.Fatalf("count_words %s: %+v", input, res)
		}
		return res.Content[0].Text, res.IsError
	}
	for _, c := range []struct {
		cfg, input, want string
		isErr            bool
	}{
		{granted, `{"path":"words.txt"}`, "2 lines, 3 words, 14 bytes", false},
		{granted, `{"path": "w\u00f6rds.txt"}`, "1 lines, 4 words, 8 bytes", false},
		{granted, `{"path":"/home/user/big.txt"}`, "0 lines, 2000 words, 10000 bytes", false},
		// The host's message, as ABI.md promises it: no sandbox internals.
		{granted, `{"path":"missing.txt"}`, "Error: could not count: read missing.txt: no such file or directory", true},
		{granted, `{"path":"../etc/passwd"}`, "Error: could not count: ../etc/passwd: path is outside the workspace", true},
		{scoped, `{"path":"docs/a.md"}`, "1 lines, 2 words, 6 bytes", false},
		{scoped, `{"path":"words.txt"}`, "Error: could not count: policy: plugin wordcount-c may not read words.txt (allowed: docs/**)", true},
	} {
		if got, isErr := call(c.cfg, c.input); got != c.want || isErr != c.isErr {
			t.Errorf("count_words %s: %q (is_error %v), want %q (%v)", c.input, got, isErr, c.want, c.isErr)
		}
	}

	// It imports nothing from WASI, and needs sandbox_files alone.
	r := runCLI(t, nil, "plugin", "inspect", wasm, "--format", "json")
	var in struct {
		Imports []string `json:"imports"`
		Needs   []string `json:"needs"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &in) != nil {
		t.Fatal(r)
	}
	if strings.Join(in.Needs, ",") != "sandbox_files" || strings.Contains(strings.Join(in.Imports, ","), "wasi_snapshot_preview1") {
		t.Errorf("inspect: needs %v, imports %v", in.Needs, in.Imports)
	}
	// Without its grant it is refused at load: exit 1, one line naming the import.
	oneLineError(t, runCLI(t, nil, "tools", "--config", ungranted), 1,
		`imports toolhost_sandbox_files.read but is not granted "sandbox_files"`)
}
