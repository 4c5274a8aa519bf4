package mdcheck

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/builtins"
)

// TestFigures: the counts the docs state are the code's. Each figure is found by the
// sentence that states it; a sentence reworded so that it no longer matches fails here,
// so that the figure is either checked again or removed. Dated figures (a benchmark, a
// record "at commit X") are records, not claims, and are not checked.
func TestFigures(t *testing.T) {
	root := repoRoot(t)
	read := func(name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	// find returns the groups of pattern's one match in file.
	find := func(file, pattern string) []string {
		t.Helper()
		m := regexp.MustCompile(pattern).FindAllStringSubmatch(read(file), -1)
		if len(m) != 1 {
			t.Fatalf("%s: %d sentences match %q, want 1: the figure moved or was reworded; check it again here, or remove it", file, len(m), pattern)
		}
		return m[0][1:]
	}
	check := func(file, what, stated string, want int) {
		t.Helper()
		if got, ok := number(stated); !ok || got != want {
			t.Errorf("%s says %q %s; the code has %d", file, stated, what, want)
		}
	}

	// Public packages: one list each under api/ (internal/apicheck checks the lists are
	// the packages).
	apis, err := filepath.Glob(filepath.Join(root, "api", "*.txt"))
	if err != nil || len(apis) == 0 {
		t.Fatalf("api/*.txt: %v (%d)", err, len(apis))
	}
	check("README.md", "public packages", find("README.md", `(\w+) packages are public`)[0], len(apis))
	check("docs/ARCHITECTURE.md", "importable packages", find("docs/ARCHITECTURE.md", `(\w+) packages are importable`)[0], len(apis))

	// The doctor's plugins line: the default built-ins and their tools.
	var names []string
	tools := 0
	for _, b := range builtins.Builtins() {
		if b.OptIn {
			continue
		}
		name, n := seedTools(t, b.File)
		names = append(names, name)
		tools += n
	}
	g := find("docs/CLI.md", `plugins +(\d+) loaded and compiled \(([^)]*)\), (\d+) tools`)
	check("docs/CLI.md", "default plugins", g[0], len(names))
	check("docs/CLI.md", "default tools", g[2], tools)
	var listed []string
	for _, p := range strings.Split(g[1], ", ") {
		listed = append(listed, strings.Fields(p)[0])
	}
	if !slices.Equal(listed, names) {
		t.Errorf("docs/CLI.md lists the plugins %v; the defaults are %v", listed, names)
	}

	// The cross-compiled targets.
	targets := strings.Fields(find("Makefile", `(?m)^CROSS_TARGETS \?= (.*)$`)[0])
	check("docs/PLATFORMS.md", "targets", find("docs/PLATFORMS.md", `builds for (\w+) targets`)[0], len(targets))

	// Every capability a plugin can import is described in PLUGINS.md.
	plugins := read("docs/PLUGINS.md")
	for _, c := range append(abi.Capabilities(), abi.CapSession) {
		if !regexp.MustCompile("`" + string(c) + "`" + `|grants: \[[^\]]*\b` + string(c) + `\b`).MatchString(plugins) {
			t.Errorf("docs/PLUGINS.md does not describe the capability %s", c)
		}
	}

	// No Go example in the docs imports an internal package: it would not compile outside
	// the module.
	for _, file := range []string{"README.md", "docs/LIBRARY.md", "docs/PLUGINS.md", "docs/ARCHITECTURE.md"} {
		if strings.Contains(read(file), `"github.com/toolhost/toolhost/internal/`) {
			t.Errorf("%s: a Go example imports an internal package, which no program outside the module can", file)
		}
	}
}

// seedTools returns the plugin name and the number of tools of a built-in, from the
// manifest its seed recorded.
func seedTools(t *testing.T, file string) (string, int) {
	t.Helper()
	var seeds []struct {
		Manifest string `json:"manifest"`
	}
	if err := json.Unmarshal(builtins.Seeds(file), &seeds); err != nil || len(seeds) == 0 {
		t.Fatalf("the seeds of %s: %v (%d)", file, err, len(seeds))
	}
	var m struct {
		Name  string            `json:"name"`
		Tools []json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal([]byte(seeds[0].Manifest), &m); err != nil {
		t.Fatalf("the manifest of %s: %v", file, err)
	}
	return m.Name, len(m.Tools)
}

var numberWords = strings.Fields("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty")

// number reads a count written as digits or as an English word.
func number(s string) (int, bool) {
	if n, err := strconv.Atoi(s); err == nil {
		return n, true
	}
	i := slices.Index(numberWords, strings.ToLower(s))
	return i, i >= 0
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the repository root is not two levels up: %v", err)
	}
	return root
}
