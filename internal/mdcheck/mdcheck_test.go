package mdcheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRepository: no Markdown file of the repository has a broken fence or a dead
// relative link.
func TestRepository(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the repository root is not two levels up: %v", err)
	}
	ps := Pages{}
	n := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "bin":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.EqualFold(filepath.Ext(path), ".md") {
			return nil
		}
		n++
		probs, err := ps.Check(root, path)
		if err != nil {
			return err
		}
		for _, p := range probs {
			t.Error(p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 5 {
		t.Fatalf("found %d Markdown files; the walk is wrong", n)
	}
	t.Logf("%d Markdown files checked", n)
}

// TestFences: each way a fence breaks a page is found, and fences that are right pass.
func TestFences(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       []string // substrings of the problems, in order
	}{
		{"closed", "a\n```sh\nls\n```\nb\n", nil},
		{"a merge left its markers", "a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> main\n", []string{"merge conflict", "merge conflict"}},
		{"tildes and longer runs", "~~~\n```\n~~~\n````go\n```\n````\n", nil},
		{"never closed", "a\n```go\nx\n", []string{"1:"[:0] + "never closed"}},
		{"text glued to the closing fence", "```\nerr\n``` The host validates every input.\nmore\n```\n",
			[]string{"does not close the block opened on line 1"}},
		{"text after an opening fence", "``` the text\nx\n```\n", []string{"opens with text after it"}},
		{"an inline span of backticks is no fence", "```a` b```\n", nil},
		{"a nested fence of another char", "~~~md\n```go\n~~~\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, probs := Parse("x.md", tc.text)
			if len(probs) != len(tc.want) {
				t.Fatalf("got %v, want %d problems", probs, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.Contains(probs[i].Msg, w) {
					t.Errorf("problem %v does not say %q", probs[i], w)
				}
			}
		})
	}
}

// TestLinks: dead files, dead anchors (in the page and in another), links out of the
// repository and absolute links are found; links in code are not followed.
func TestLinks(t *testing.T) {
	root := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("docs/SECURITY.md", "# Security\n\n## The sandbox: bubblewrap\n\n## Files\n\n## Files\n")
	write("LICENSE", "x")
	readme := write("README.md", strings.Join([]string{
		"# toolhost", "", "## Tool policy", "",
		"[ok](LICENSE) [ok](docs/) [ok](docs/SECURITY.md#the-sandbox-bubblewrap) [ok](#tool-policy)",
		"[ok](docs/SECURITY.md#files-1) ![img](LICENSE \"a title\") [ok](https://example.com/x)",
		"[dead](docs/CONFIG.md)",
		"[dead anchor](#policy)",
		"[dead other](docs/SECURITY.md#the-sandbox)",
		"[out](../elsewhere.md)",
		"[abs](/README.md)",
		"`[in code](nothing.md)`",
		"```", "[in a block](nothing.md)", "```",
		"    [indented code](nothing.md)",
		"[ref]: docs/GONE.md",
	}, "\n"))
	probs, err := Pages{}.Check(root, readme)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		line int
		msg  string
	}{
		{7, "docs/CONFIG.md\": no such file"},
		{8, "no heading with that anchor"},
		{9, "docs/SECURITY.md has no heading"},
		{10, "leads out of the repository"},
		{11, "is absolute"},
		{17, "docs/GONE.md\": no such file"},
	}
	if len(probs) != len(want) {
		t.Fatalf("got %d problems, want %d: %v", len(probs), len(want), probs)
	}
	for i, w := range want {
		if probs[i].Line != w.line || !strings.Contains(probs[i].Msg, w.msg) {
			t.Errorf("problem %d is %v, want line %d saying %q", i, probs[i], w.line, w.msg)
		}
	}
}

// TestAnchors: GitHub's anchors of headings with markup and punctuation.
func TestAnchors(t *testing.T) {
	p, _ := Parse("x.md", strings.Join([]string{
		"# Many hosts, one store: the project lease",
		"## `toolhost mcp --workspace`: MCP on your repository",
		"### [Links](x.md) and ünïcode",
		"## Same", "## Same",
	}, "\n"))
	for _, a := range []string{"many-hosts-one-store-the-project-lease", "toolhost-mcp---workspace-mcp-on-your-repository",
		"links-and-ünïcode", "same", "same-1"} {
		if !p.HasAnchor(a) {
			t.Errorf("no anchor %q; have %v", a, p.anchors)
		}
	}
}
