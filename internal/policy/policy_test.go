package policy

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/abi"
)

func mustCompile(t *testing.T, s Scope) *Policy {
	t.Helper()
	p, err := Compile(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func files(op, path string) Request {
	return Request{Cap: abi.CapSandboxFiles, Op: op, Path: path}
}

func TestFilePatterns(t *testing.T) {
	p := mustCompile(t, Scope{Files: &Files{
		Read:  []string{"**", "!**/.env", "!secrets"},
		Write: []string{"docs/**", "*.md", "src/*/gen_*.go"},
	}})
	for _, c := range []struct {
		op, path string
		want     bool
	}{
		{OpRead, "src/main.go", true},
		{OpRead, ".", true},
		{OpRead, ".env", false},
		{OpRead, "app/.env", false},
		{OpRead, "app/.ENV", false},        // a refusing pattern ignores case
		{OpRead, "app/.Env/inside", false}, // and covers what is below what it matches
		{OpRead, "secrets/key.pem", false}, // a directory refused refuses its contents
		{OpRead, "SECRETS/key.pem", false}, // whatever the case
		{OpRead, "secretsx/key.pem", true}, // but only that name
		{OpReadText, "app/.envrc", true},   // .envrc is not .env
		{OpWrite, "docs/a.md", true},       //
		{OpWrite, "docs", true},            // docs/** includes docs
		{OpWrite, "docs/deep/er/x.txt", true},
		{OpWriteVersioned, "src/main.go", false},
		{OpWrite, "DOCS/a.md", false}, // allowing patterns match case exactly
		{OpWrite, "README.md", true},
		{OpWrite, "sub/README.md", false}, // * stays in its segment
		{OpWrite, "src/pkg/gen_x.go", true},
		{OpWrite, "src/pkg/sub/gen_x.go", false},
		{OpWrite, "docsx/a.md", false},
		{OpWrite, ".", false},
	} {
		d := p.Decide("docs-writer", files(c.op, c.path))
		if d.Allowed != c.want {
			t.Errorf("%s %s: allowed %v, want %v (%+v)", c.op, c.path, d.Allowed, c.want, d)
		}
	}
	d := p.Decide("docs-writer", files(OpWrite, "src/main.go"))
	if want := "policy: plugin docs-writer may not write src/main.go (allowed: docs/**, *.md, src/*/gen_*.go)"; d.Message != want {
		t.Errorf("message %q, want %q", d.Message, want)
	}
	if d.Rule != "write: docs/**, *.md, src/*/gen_*.go" {
		t.Errorf("rule %q", d.Rule)
	}
	if d := p.Decide("x", files(OpWrite, "docs/a.md")); !d.CheckLinks {
		t.Error("a scoped write does not ask for the link check")
	}
}

func TestReadOnly(t *testing.T) {
	p := mustCompile(t, Scope{Files: &Files{Read: []string{"**"}}})
	if d := p.Decide("reviewer", files(OpRead, "a/b.go")); !d.Allowed || d.CheckLinks {
		t.Errorf("read ** = %+v: want allowed with no link check (the whole workspace)", d)
	}
	d := p.Decide("reviewer", files(OpWrite, "a/b.go"))
	if d.Allowed || d.Message != "policy: plugin reviewer may not write a/b.go (allowed: nothing)" {
		t.Errorf("write = %+v", d)
	}
}

func TestListAndStatSeeTheWay(t *testing.T) {
	p := mustCompile(t, Scope{Files: &Files{Read: []string{"docs/api/**", "!docs/api/private"}}})
	for _, c := range []struct {
		op, path string
		want     bool
	}{
		{OpList, ".", true}, // on the way to docs/api
		{OpList, "docs", true},
		{OpStat, "docs", true},
		{OpList, "docs/api/v1", true},
		{OpList, "src", false},
		{OpRead, "docs", false}, // a file named docs may not be read
		{OpList, "docs/api/private", false},
	} {
		if d := p.Decide("p", files(c.op, c.path)); d.Allowed != c.want {
			t.Errorf("%s %s: allowed %v, want %v", c.op, c.path, d.Allowed, c.want)
		}
	}
	for _, c := range []struct {
		path string
		dir  bool
		want bool
	}{
		{"docs", true, true},
		{"docs", false, false},
		{"docs/readme.md", false, false},
		{"docs/api", true, true},
		{"docs/api/x.md", false, true},
		{"docs/api/private", true, false},
		{"docs/api/private/x.md", false, false},
		{"src", true, false},
	} {
		if got := p.Visible(c.path, c.dir); got != c.want {
			t.Errorf("Visible(%s, dir=%v) = %v, want %v", c.path, c.dir, got, c.want)
		}
	}
	var nilPolicy *Policy
	if !nilPolicy.Visible("anything", false) || !nilPolicy.Decide("p", files(OpWrite, "x")).Allowed {
		t.Error("a nil policy refuses")
	}
}

func TestCheckLinks(t *testing.T) {
	tree := map[string]string{"docs": "dir", "docs/evil": "link", "docs/a": "dir", "docs/a/b.md": "file", "lnk": "link"}
	var asked []string
	lstat := func(rel string) (bool, bool, error) {
		asked = append(asked, rel)
		kind, ok := tree[rel]
		return kind == "link", ok, nil
	}
	for _, c := range []struct{ path, link string }{
		{"docs/a/b.md", ""},
		{"docs/evil", "docs/evil"},
		{"docs/evil/x/y", "docs/evil"},
		{"lnk/a", "lnk"},
		{"new/dir/file", ""},
		{".", ""},
	} {
		asked = nil
		got, err := CheckLinks(c.path, lstat)
		if err != nil || got != c.link {
			t.Errorf("CheckLinks(%s) = %q, %v; want %q", c.path, got, err, c.link)
		}
		if c.path == "new/dir/file" && len(asked) != 1 {
			t.Errorf("CheckLinks went on past a part that does not exist: %v", asked)
		}
	}
	boom := errors.New("boom")
	if _, err := CheckLinks("a/b", func(string) (bool, bool, error) { return false, false, boom }); !errors.Is(err, boom) {
		t.Errorf("an lstat error is lost: %v", err)
	}
	p := mustCompile(t, Scope{Files: &Files{Read: []string{"**"}, Write: []string{"docs/**"}}})
	d := p.LinkRefusal("docs-writer", files(OpWrite, "docs/evil/x.md"), "docs/evil")
	want := "policy: plugin docs-writer may not write docs/evil/x.md: its directory docs/evil is a symbolic link, and a plugin whose paths are scoped never goes through one (allowed: docs/**)"
	if d.Allowed || d.Message != want {
		t.Errorf("link refusal %q, want %q", d.Message, want)
	}
}

func TestExec(t *testing.T) {
	p := mustCompile(t, Scope{Exec: &Exec{Programs: []string{"git", "/usr/bin/ls"}, Env: []string{"LC_ALL"}, MaxTimeout: 30 * time.Second}})
	run := func(argv []string, env []string, bg bool) Decision {
		return p.Decide("tools", Request{Cap: abi.CapSandboxExec, Op: OpRun, Argv: argv, Env: env, Background: bg})
	}
	if d := run([]string{"git", "status"}, nil, false); !d.Allowed {
		t.Errorf("git: %+v", d)
	}
	if d := run([]string{"/usr/bin/ls"}, []string{"LC_ALL"}, false); !d.Allowed {
		t.Errorf("/usr/bin/ls with LC_ALL: %+v", d)
	}
	for _, c := range []struct {
		argv, env []string
		bg        bool
		want      string
	}{
		{[]string{"curl", "x"}, nil, false, "policy: plugin tools may not run curl (allowed: git, /usr/bin/ls)"},
		{[]string{"/usr/bin/git"}, nil, false, "may not run /usr/bin/git"}, // names match exactly
		{[]string{"ls"}, nil, false, "may not run ls"},
		{[]string{"git"}, []string{"PATH"}, false, "policy: plugin tools may not set PATH for the programs it runs (allowed: LC_ALL)"},
		{[]string{"git"}, nil, true, "may not start background commands"},
	} {
		d := run(c.argv, c.env, c.bg)
		if d.Allowed || !strings.Contains(d.Message, c.want) {
			t.Errorf("%v env %v bg %v: %+v, want a refusal saying %q", c.argv, c.env, c.bg, d, c.want)
		}
	}
	if p.MaxTimeout() != 30*time.Second {
		t.Errorf("MaxTimeout %s", p.MaxTimeout())
	}
	// No programs listed: any, and no variable is refused.
	q := mustCompile(t, Scope{Exec: &Exec{MaxTimeout: time.Second}})
	if d := q.Decide("b", Request{Cap: abi.CapSandboxExec, Op: OpRun, Argv: []string{"anything"}, Env: []string{"PATH"}}); !d.Allowed {
		t.Errorf("unlisted programs: %+v", d)
	}
}

func TestStoreAndCapture(t *testing.T) {
	p := mustCompile(t, Scope{Store: &Store{Access: StoreRead}, Capture: &Capture{Ports: []int{3000, 8000}}})
	st := func(op string) Decision { return p.Decide("notes", Request{Cap: abi.CapStore, Op: op, Key: "a.txt"}) }
	if !st(OpGet).Allowed || !st(OpStoreList).Allowed {
		t.Error("a read-only store refuses get or list")
	}
	if d := st(OpPut); d.Allowed || d.Message != "policy: plugin notes may not put a.txt: its store is read-only" {
		t.Errorf("put: %+v", d)
	}
	if st(OpDelete).Allowed {
		t.Error("delete allowed on a read-only store")
	}
	shot := func(port int) Decision {
		return p.Decide("shots", Request{Cap: abi.CapCapture, Op: OpCapture, Port: port})
	}
	if !shot(8000).Allowed {
		t.Error("port 8000 refused")
	}
	if d := shot(5432); d.Allowed || d.Message != "policy: plugin shots may not capture port 5432 (allowed: 3000, 8000)" {
		t.Errorf("port 5432: %+v", d)
	}
}

func TestCompileRefuses(t *testing.T) {
	for _, c := range []struct {
		s    Scope
		want string
	}{
		{Scope{Files: &Files{Read: []string{"/home/user/**"}}}, "is absolute"},
		{Scope{Files: &Files{Write: []string{"docs/../src/**"}}}, `".." segment`},
		{Scope{Files: &Files{Read: []string{"a//b"}}}, "empty segment"},
		{Scope{Files: &Files{Read: []string{"a**"}}}, "whole segment"},
		{Scope{Files: &Files{Read: []string{"[a"}}}, "syntax error"},
		{Scope{Files: &Files{Read: []string{""}}}, "is empty"},
		{Scope{Files: &Files{Read: []string{"**/a/**/b/**/c/**/d/**"}}}, "more than 4"},
		{Scope{Exec: &Exec{Env: []string{"A"}}}, "only means something with programs"},
		{Scope{Exec: &Exec{Programs: []string{" git"}}}, "not a program name"},
		{Scope{Store: &Store{Access: "write"}}, "store.access"},
		{Scope{Capture: &Capture{}}, "capture.ports"},
		{Scope{Capture: &Capture{Ports: []int{70000}}}, "not a TCP port"},
	} {
		if _, err := Compile(c.s); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Compile(%+v) = %v, want an error saying %q", c.s, err, c.want)
		}
	}
	if p, err := Compile(Scope{}); p != nil || err != nil {
		t.Errorf("a zero scope compiles to %v, %v; want nil, nil", p, err)
	}
}

func TestGrantsEverything(t *testing.T) {
	for _, prog := range []string{"bash", "/bin/sh", "python3.11", "env", "xargs", "find", "git", "node"} {
		if GrantsEverything(prog) == "" {
			t.Errorf("%s is not known to grant everything", prog)
		}
	}
	for _, prog := range []string{"ls", "grep", "cat", "wc"} {
		if why := GrantsEverything(prog); why != "" {
			t.Errorf("%s grants everything? %s", prog, why)
		}
	}
}

func TestPartsAndFirstLink(t *testing.T) {
	if got := strings.Join(Parts("a/b/c.md"), " "); got != "a a/b a/b/c.md" {
		t.Errorf("Parts = %s", got)
	}
	if Parts(".") != nil {
		t.Error("the root has parts")
	}
	parts := Parts("a/b/c")
	boom := errors.New("boom")
	for _, c := range []struct {
		states []PartState
		link   string
		whole  bool
		err    error
	}{
		{[]PartState{{Exists: true}, {Exists: true}, {Exists: true}}, "", true, nil},
		{[]PartState{{Exists: true}, {Link: true, Exists: true}, {Err: boom}}, "a/b", false, nil}, // what follows a link does not count
		{[]PartState{{Exists: true}, {}, {Link: true, Exists: true}}, "", false, nil},             // nor what follows a missing part
		{[]PartState{{Err: boom}, {}, {}}, "", false, boom},
	} {
		link, whole, err := FirstLink(parts, c.states)
		if link != c.link || whole != c.whole || err != c.err {
			t.Errorf("FirstLink(%+v) = %q, %v, %v", c.states, link, whole, err)
		}
	}
}

// An operation the table does not name is refused, with any Scope and with none: a new
// writing host function must never be judged against the read patterns by default.
func TestUnknownOperationIsRefused(t *testing.T) {
	scoped := mustCompile(t, Scope{Files: &Files{Read: []string{"**"}, Write: []string{"docs/**"}}})
	for _, p := range []*Policy{nil, scoped} {
		for _, r := range []Request{
			files("truncate", "src/main.go"),
			files("write_all", "src/main.go"),
			{Cap: abi.CapStore, Op: "wipe", Key: "k"},
			{Cap: abi.CapSandboxExec, Op: "spawn", Argv: []string{"ls"}},
			{Cap: abi.CapSandboxFiles, Op: OpRun}, // an op of another capability
			{Cap: "sandbox_net", Op: "connect"},   // a capability the table does not know
			{Cap: abi.CapLog, Op: abi.FnLog},      // log is no decided host call
		} {
			d := p.Decide("p", r)
			if d.Allowed {
				t.Errorf("policy %v allowed %s.%s", p != nil, r.Cap, r.Op)
			}
			if !strings.Contains(d.Message, r.Op) {
				t.Errorf("refusal of %s.%s does not name it: %q", r.Cap, r.Op, d.Message)
			}
		}
	}
	if d := scoped.Decide("p", files(OpRead, "src/main.go")); !d.Allowed {
		t.Errorf("a known read was refused: %s", d.Message)
	}
}

// Every operation of the table judges by its class: reads and looks by the read
// patterns, writes by the write patterns, the store's writes by its access.
func TestClassesJudge(t *testing.T) {
	p := mustCompile(t, Scope{Files: &Files{Read: []string{"**"}, Write: []string{"docs/**"}}, Store: &Store{Access: StoreRead}})
	for k, class := range classes {
		r := Request{Cap: k.cap, Op: k.op, Path: "src/main.go", Argv: []string{"ls"}, Port: 3000, Key: "k"}
		d := p.Decide("p", r)
		want := class != ClassWrite && class != ClassStoreWrite
		if d.Allowed != want {
			t.Errorf("%s.%s (class %s): allowed %v, want %v (%s)", k.cap, k.op, class, d.Allowed, want, d.Message)
		}
	}
}
