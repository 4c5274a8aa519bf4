package abi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/memsandbox"
	"github.com/toolhost/toolhost/internal/testenv"
)

// signature is one function of the ABI: its C or ABI.md name, its parameters' names and
// types ("" for an ABI.md parameter without one: i32), and its result.
type signature struct {
	module, name string
	params       []string
	types        []string
	result       string
}

func (s signature) String() string {
	return fmt.Sprintf("%s.%s(%s) -> %s", s.module, s.name, strings.Join(s.params, ", "), s.result)
}

// abiDoc is what ABI.md says, as the header must state it.
type abiDoc struct {
	version  string
	statuses map[string]string // EPERM -> -1
	levels   map[string]string // DEBUG -> -4
	exports  map[string]signature
	imports  []signature
	modules  map[string][]string // the capability table: module -> functions
	magics   []string
	blocks   map[string]string // the framed result's block kinds: t -> 74
	maxBufs  string            // the most host buffers a call holds
}

func readABI(t *testing.T) abiDoc {
	b, err := os.ReadFile("ABI.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	flat := regexp.MustCompile(`\s*\n\s*`).ReplaceAllString(text, " ")
	d := abiDoc{statuses: map[string]string{}, levels: map[string]string{}, exports: map[string]signature{}, modules: map[string][]string{}}
	if m := regexp.MustCompile(`(?m)^# toolhost plugin ABI, version (\d+)$`).FindStringSubmatch(text); m != nil {
		d.version = m[1]
	}
	for _, m := range regexp.MustCompile(`(?m)^\| (-\d+) \| ([A-Z]+) \|`).FindAllStringSubmatch(text, -1) {
		d.statuses[m[2]] = m[1]
	}
	if m := regexp.MustCompile(`\((-?\d+) debug, (-?\d+) info, (-?\d+) warn, (-?\d+) error\)`).FindStringSubmatch(flat); m != nil {
		d.levels = map[string]string{"DEBUG": m[1], "INFO": m[2], "WARN": m[3], "ERROR": m[4]}
	}
	for _, m := range regexp.MustCompile("(?m)^\\| `(toolhost_[a-z_]+)` \\| `\\(([^)]*)\\) -> ([^`]+)` \\|").FindAllStringSubmatch(text, -1) {
		s := signature{module: "(export)", name: m[1], result: m[3]}
		s.params, s.types = abiParams(m[2])
		d.exports[m[1]] = s
	}
	for _, m := range regexp.MustCompile("\\*\\*`([a-z_0-9]+)\\.([a-z_]+)\\(([^)]*)\\) -> ([^`]+)`\\*\\*").FindAllStringSubmatch(flat, -1) {
		s := signature{module: m[1], name: m[2], result: m[4]}
		s.params, s.types = abiParams(m[3])
		d.imports = append(d.imports, s)
	}
	for _, m := range regexp.MustCompile("(?m)^\\| `(toolhost[a-z_]*)` \\| (?:none|`[a-z_]+`) \\| ([^|]+) \\|$").FindAllStringSubmatch(text, -1) {
		for _, f := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(m[2], -1) {
			d.modules[m[1]] = append(d.modules[m[1]], f[1])
		}
	}
	for _, m := range regexp.MustCompile("the magic `\"\\\\x00(th[a-z0-9]+)\"`").FindAllStringSubmatch(flat, -1) {
		d.magics = append(d.magics, m[1])
	}
	d.blocks = map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([0-9a-f]{2})` \\(`([a-z])`\\),").FindAllStringSubmatch(text, -1) {
		d.blocks[m[2]] = m[1]
	}
	if m := regexp.MustCompile(`A call holds at most (\d+) buffers`).FindStringSubmatch(flat); m != nil {
		d.maxBufs = m[1]
	}
	if d.version == "" || len(d.statuses) < 10 || len(d.levels) != 4 || len(d.exports) != 4 || len(d.imports) < 20 || len(d.modules) < 8 || len(d.magics) < 2 {
		t.Fatalf("ABI.md no longer reads as this test expects (version %q, %d statuses, %d levels, %d exports, %d host functions, %d modules, magics %v): update the test with the page",
			d.version, len(d.statuses), len(d.levels), len(d.exports), len(d.imports), len(d.modules), d.magics)
	}
	return d
}

// abiParams splits "level: i32, msg_ptr, msg_len" into names and types.
func abiParams(list string) (names, types []string) {
	for p := range strings.SplitSeq(list, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		name, typ, _ := strings.Cut(p, ":")
		names = append(names, strings.TrimSpace(name))
		types = append(types, strings.TrimSpace(typ))
	}
	return names, types
}

// header is what abi/toolhost.h declares.
type header struct {
	text     string
	version  string
	statuses map[string]string
	levels   map[string]string
	exports  map[string]signature
	imports  []signature
	magics   []string
	blocks   map[string]string // the TOOLHOST_BLOCK_ kinds: t -> 74
	maxBufs  string
}

func readHeader(t *testing.T) header {
	b, err := os.ReadFile("toolhost.h")
	if err != nil {
		t.Fatal(err)
	}
	h := header{text: string(b), statuses: map[string]string{}, levels: map[string]string{}, exports: map[string]signature{}}
	if m := regexp.MustCompile(`(?m)^#define TOOLHOST_ABI_VERSION (\d+)$`).FindStringSubmatch(h.text); m != nil {
		h.version = m[1]
	}
	for _, m := range regexp.MustCompile(`(?m)^#define TOOLHOST_(E[A-Z]+) \((-\d+)\)$`).FindAllStringSubmatch(h.text, -1) {
		h.statuses[m[1]] = m[2]
	}
	for _, m := range regexp.MustCompile(`(?m)^#define TOOLHOST_LOG_([A-Z]+) \(?(-?\d+)\)?$`).FindAllStringSubmatch(h.text, -1) {
		h.levels[m[1]] = m[2]
	}
	for _, m := range regexp.MustCompile(`(?m)^#define TOOLHOST_FRAMED_[A-Z]+_MAGIC "\\0(th[a-z0-9]+)"$`).FindAllStringSubmatch(h.text, -1) {
		h.magics = append(h.magics, m[1])
	}
	h.blocks = map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^#define TOOLHOST_BLOCK_[A-Z]+ '([a-z])'$`).FindAllStringSubmatch(h.text, -1) {
		h.blocks[m[1]] = fmt.Sprintf("%02x", m[1][0])
	}
	if m := regexp.MustCompile(`(?m)^#define TOOLHOST_MAX_HOST_BUFFERS (\d+)$`).FindStringSubmatch(h.text); m != nil {
		h.maxBufs = m[1]
	}
	decl := regexp.MustCompile(`^([a-z0-9_]+(?: \*)?) ?([a-z0-9_]+)\(([^)]*)\);$`)
	lines := strings.Split(h.text, "\n")
	importRE := regexp.MustCompile(`^TOOLHOST_IMPORT\("([a-z0-9_]+)", "([a-z0-9_]+)"\)$`)
	for i, line := range lines {
		if m := importRE.FindStringSubmatch(line); m != nil {
			if i+1 >= len(lines) {
				t.Fatalf("toolhost.h: %s is not followed by a declaration", line)
			}
			d := decl.FindStringSubmatch(lines[i+1])
			if d == nil {
				t.Fatalf("toolhost.h: %q after %s is not a declaration this test reads", lines[i+1], line)
			}
			s := signature{module: m[1], name: m[2], result: d[1]}
			s.params, s.types = cParams(d[3])
			if d[2] != m[1]+"_"+m[2] {
				t.Errorf("toolhost.h: %s.%s is declared as %s, want %s_%s", m[1], m[2], d[2], m[1], m[2])
			}
			h.imports = append(h.imports, s)
		} else if d := decl.FindStringSubmatch(line); d != nil && (i == 0 || importRE.FindString(lines[i-1]) == "") {
			s := signature{module: "(export)", name: d[2], result: d[1]}
			s.params, s.types = cParams(d[3])
			h.exports[d[2]] = s
		}
	}
	return h
}

// cParams splits "const uint8_t *path_ptr, uint32_t path_len" into names and C types.
func cParams(list string) (names, types []string) {
	if list == "void" {
		return nil, nil
	}
	for p := range strings.SplitSeq(list, ",") {
		p = strings.TrimSpace(p)
		i := strings.LastIndexAny(p, " *")
		names = append(names, p[i+1:])
		types = append(types, strings.TrimSpace(p[:i+1]))
	}
	return names, types
}

// cType is the C type a parameter or result of ABI.md must have in the header.
func cType(name, abiType string, result bool) []string {
	switch {
	case result && abiType == "i64":
		return []string{"int64_t"}
	case result && abiType == "()":
		return []string{"void"}
	case result && abiType == "i32":
		return []string{"int32_t", "uint8_t *"}
	case strings.HasSuffix(name, "_ptr") && strings.HasPrefix(name, "out"):
		return []string{"uint8_t *"}
	case strings.HasSuffix(name, "_ptr"):
		return []string{"const uint8_t *"}
	case abiType == "i32" && name == "level":
		return []string{"int32_t"}
	default:
		return []string{"uint32_t"}
	}
}

// sameSignature reports how the header's declaration c differs from ABI.md's a.
func sameSignature(a, c signature) string {
	if !slices.Equal(a.params, c.params) {
		return fmt.Sprintf("parameters %v, ABI.md says %v", c.params, a.params)
	}
	if want := cType("", a.result, true); !slices.Contains(want, c.result) {
		return fmt.Sprintf("returns %s, ABI.md says %s (%s in C)", c.result, a.result, strings.Join(want, " or "))
	}
	for i, name := range a.params {
		if want := cType(name, a.types[i], false); !slices.Contains(want, c.types[i]) {
			return fmt.Sprintf("parameter %s is %s, want %s", name, c.types[i], strings.Join(want, " or "))
		}
	}
	return ""
}

// TestHeaderMatchesABI holds abi/toolhost.h to ABI.md: the version, every status and log
// level, the framed forms' magics, the exports and every host function with its
// parameters in order and their C types. ABI.md is checked against itself on the way:
// each function of its capability table has a signature, and each signature a row.
func TestHeaderMatchesABI(t *testing.T) {
	d, h := readABI(t), readHeader(t)
	if h.version != d.version {
		t.Errorf("TOOLHOST_ABI_VERSION %q, ABI.md is version %q", h.version, d.version)
	}
	for name, v := range d.statuses {
		if h.statuses[name] != v {
			t.Errorf("TOOLHOST_%s is %q, ABI.md says %s", name, h.statuses[name], v)
		}
	}
	for name := range h.statuses {
		if _, ok := d.statuses[name]; !ok {
			t.Errorf("TOOLHOST_%s: ABI.md has no such status", name)
		}
	}
	for name, v := range d.levels {
		if h.levels[name] != v {
			t.Errorf("TOOLHOST_LOG_%s is %q, ABI.md says %s", name, h.levels[name], v)
		}
	}
	if !slices.Equal(h.magics, d.magics) {
		t.Errorf("the header's magics %v, ABI.md's %v", h.magics, d.magics)
	}
	if !maps.Equal(h.blocks, d.blocks) || len(d.blocks) < 4 {
		t.Errorf("the header's framed result blocks %v, ABI.md's %v", h.blocks, d.blocks)
	}
	if h.maxBufs != d.maxBufs || d.maxBufs != strconv.Itoa(abi.MaxHostBuffers) {
		t.Errorf("TOOLHOST_MAX_HOST_BUFFERS %q, ABI.md says %q, abi.MaxHostBuffers is %d", h.maxBufs, d.maxBufs, abi.MaxHostBuffers)
	}
	for name, a := range d.exports {
		c, ok := h.exports[name]
		if !ok {
			t.Errorf("toolhost.h does not declare the export %s", a)
			continue
		}
		if diff := sameSignature(a, c); diff != "" {
			t.Errorf("export %s: %s", name, diff)
		}
	}
	for name := range h.exports {
		if _, ok := d.exports[name]; !ok {
			t.Errorf("toolhost.h declares %s, which ABI.md's exports do not list", name)
		}
	}
	key := func(s signature) string { return s.module + "." + s.name }
	declared := map[string]signature{}
	for _, c := range h.imports {
		declared[key(c)] = c
	}
	documented := map[string]bool{}
	for _, a := range d.imports {
		documented[key(a)] = true
		if !slices.Contains(d.modules[a.module], a.name) {
			t.Errorf("ABI.md: %s has a signature but no row in the capability table", key(a))
		}
		c, ok := declared[key(a)]
		if !ok {
			t.Errorf("toolhost.h does not declare %s", a)
			continue
		}
		if diff := sameSignature(a, c); diff != "" {
			t.Errorf("%s: %s", key(a), diff)
		}
	}
	for _, c := range h.imports {
		if !documented[key(c)] {
			t.Errorf("toolhost.h declares %s, which ABI.md does not", key(c))
		}
	}
	for mod, fns := range d.modules {
		if mod == "wasi_snapshot_preview1" {
			continue
		}
		for _, f := range fns {
			if !documented[mod+"."+f] {
				t.Errorf("ABI.md: the capability table lists %s.%s, which has no signature", mod, f)
			}
		}
	}
}

// TestHeaderBuildsAPlugin compiles a plugin that calls every host function through the
// header, with clang for wasm32-wasi, and has the host inspect it: the host must provide
// each import the header declares, under that module and name and with that wasm type
// (an import the host lacks, or of another type, fails the instantiation).
func TestHeaderBuildsAPlugin(t *testing.T) {
	h := readHeader(t)
	var src strings.Builder
	src.WriteString("#include \"toolhost.h\"\n\nstatic uint8_t in[64];\nstatic const char manifest[] = \"{\\\"abi_version\\\":1,\\\"name\\\":\\\"header-check\\\",\\\"version\\\":\\\"0\\\",\\\"tools\\\":[]}\";\n\n")
	src.WriteString("TOOLHOST_EXPORT(\"toolhost_abi_version\") int32_t toolhost_abi_version(void) { return TOOLHOST_ABI_VERSION; }\n")
	src.WriteString("TOOLHOST_EXPORT(\"toolhost_describe\") int64_t toolhost_describe(void) { return TOOLHOST_PACK(manifest, sizeof manifest - 1); }\n")
	src.WriteString("TOOLHOST_EXPORT(\"toolhost_input_buffer\") uint8_t *toolhost_input_buffer(uint32_t size) { (void)size; return in; }\n")
	src.WriteString("TOOLHOST_EXPORT(\"toolhost_call\") int64_t toolhost_call(uint32_t len) {\n\tint64_t n = 0;\n\tif (len == 12345) {\n")
	var want []string
	for _, s := range h.imports {
		args := strings.TrimSuffix(strings.Repeat("0, ", len(s.params)), ", ")
		if s.result == "void" {
			fmt.Fprintf(&src, "\t\t%s_%s(%s);\n", s.module, s.name, args)
		} else {
			fmt.Fprintf(&src, "\t\tn += %s_%s(%s);\n", s.module, s.name, args)
		}
		want = append(want, s.module+"."+s.name)
	}
	src.WriteString("\t}\n\treturn n;\n}\n")
	b := buildC(t, src.String())
	in, err := host.Inspect(context.Background(), b)
	if err != nil {
		t.Fatalf("the host refuses the header's imports: %v", err)
	}
	var got []string
	for _, imp := range in.Imports {
		if imp.Module != "wasi_snapshot_preview1" {
			got = append(got, imp.Module+"."+imp.Name)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("the plugin imports %v, the header declares %v", got, want)
	}
}

// buildC compiles the C source of a plugin against toolhost.h with clang for wasm32-wasi,
// as ABI.md section 8 says, and returns the module.
func buildC(t *testing.T, src string) []byte {
	t.Helper()
	if _, err := exec.LookPath("clang"); err != nil {
		testenv.Skipf(t, "clang is not installed (make test installs it: scripts/setup.sh --test; Debian packages clang lld wasi-libc libclang-rt-14-dev-wasm32)")
	}
	dir := t.TempDir()
	c, wasm := filepath.Join(dir, "check.c"), filepath.Join(dir, "check.wasm")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	abiDir, _ := filepath.Abs(".")
	cmd := exec.Command("clang", "--target=wasm32-wasi", "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-mexec-model=reactor", "-I", abiDir, "-o", wasm, c)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		if strings.Contains(out.String(), "error:") && !strings.Contains(out.String(), "cannot open") && !strings.Contains(out.String(), "file not found") {
			t.Fatalf("the header does not compile:\n%s\n%s", out.String(), src)
		}
		testenv.Skipf(t, "clang cannot build for wasm32-wasi here (scripts/setup.sh --test installs wasi-libc and libclang-rt-N-dev-wasm32): %v\n%s", err, out.String())
	}
	b, err := os.ReadFile(wasm)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// heldC is a plugin in C that reads f.txt with read_text's hold and returns a framed
// result whose one text block is the host buffer, then "[end]\n": tool cat names the
// buffer it was given, tool wrong the next id, which it was not.
const heldC = `#include "toolhost.h"
#include <string.h>

static uint8_t in[1 << 17];
static uint8_t reply[512];
static uint8_t out[64];
static const char manifest[] = "{\"abi_version\":1,\"name\":\"held-check\",\"version\":\"0\",\"tools\":["
	"{\"name\":\"cat\",\"description\":\"Shows f.txt.\",\"input_schema\":{\"type\":\"object\"}},"
	"{\"name\":\"wrong\",\"description\":\"Names a buffer it was not given.\",\"input_schema\":{\"type\":\"object\"}}]}";
static const char failed[] = "{\"content\":[{\"type\":\"text\",\"text\":\"no buffer\"}],\"is_error\":true}";

TOOLHOST_EXPORT("toolhost_abi_version") int32_t toolhost_abi_version(void) { return TOOLHOST_ABI_VERSION; }
TOOLHOST_EXPORT("toolhost_describe") int64_t toolhost_describe(void) { return TOOLHOST_PACK(manifest, sizeof manifest - 1); }
TOOLHOST_EXPORT("toolhost_input_buffer") uint8_t *toolhost_input_buffer(uint32_t size) { return size < sizeof in ? in : 0; }

static void put32(uint8_t *p, uint32_t v) {
	p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}

TOOLHOST_EXPORT("toolhost_call") int64_t toolhost_call(uint32_t len) {
	static const char req[] = "{\"path\":\"f.txt\",\"hold\":true}";
	static const char tail[] = "[end]\n";
	in[len < sizeof in ? len : sizeof in - 1] = 0;
	int64_t n = toolhost_sandbox_files_read_text((const uint8_t *)req, sizeof req - 1, reply, sizeof reply - 1);
	if (n < 0 || n >= (int64_t)sizeof reply) return TOOLHOST_PACK(failed, sizeof failed - 1);
	reply[n] = 0;
	const char *b = strstr((const char *)reply, "\"buffer\":");
	uint32_t id = 0;
	for (b = b ? b + 9 : ""; *b >= '0' && *b <= '9'; b++) id = id * 10 + (uint32_t)(*b - '0');
	if (id == 0) return TOOLHOST_PACK(failed, sizeof failed - 1);
	if (strstr((const char *)in, "\"wrong\"")) id++;
	memcpy(out, TOOLHOST_FRAMED_RESULT_MAGIC, TOOLHOST_FRAMED_MAGIC_LEN);
	out[5] = 0;
	out[6] = TOOLHOST_BLOCK_HELD;
	put32(out + 7, id);
	put32(out + 11, sizeof tail - 1);
	memcpy(out + 15, tail, sizeof tail - 1);
	return TOOLHOST_PACK(out, 15 + sizeof tail - 1);
}
`

// TestHeaderHostBuffers runs a plugin written in C against toolhost.h alone through the
// host: it reads a file into a host buffer (ABI.md section 5.1) and names the buffer in a
// framed result, and the host answers with the file's lines; naming an id it was not
// given is a plugin failure.
func TestHeaderHostBuffers(t *testing.T) {
	wasm := filepath.Join(t.TempDir(), "held.wasm")
	if err := os.WriteFile(wasm, buildC(t, heldC), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	h, err := host.New(ctx, host.Config{DataDir: t.TempDir(),
		Plugins: []host.PluginSpec{{Path: wasm, Grants: []abi.Capability{abi.CapSandboxFiles}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(context.Background())
	sb := memsandbox.New()
	sb.Put("f.txt", "one\ntwo\n")
	s := h.OpenSession(sb)
	res, err := s.Dispatch(ctx, "cat", json.RawMessage(`{}`))
	if err != nil || res.IsError || testenv.ResultText(res) != "one\ntwo\n[end]\n" {
		t.Fatalf("cat = %q (error %v), %v", testenv.ResultText(res), res.IsError, err)
	}
	res, err = s.Dispatch(ctx, "wrong", json.RawMessage(`{}`))
	if !errors.Is(err, host.ErrPluginFailed) || !strings.Contains(err.Error(), "never given") {
		t.Errorf("wrong = %q, %v; want ErrPluginFailed saying the buffer was never given", testenv.ResultText(res), err)
	}
}
