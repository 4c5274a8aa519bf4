//go:build unix

package main

import (
	"strings"
	"testing"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/pdk/pdktest"
)

func TestFormat(t *testing.T) {
	cases := []struct {
		name string
		res  abi.ExecResult
		want string
		err  bool
	}{
		{"plain", abi.ExecResult{Stdout: "hi\n"}, "$ cmd\nhi\n[exit 0]", false},
		{"no newline", abi.ExecResult{Stdout: "hi", ExitCode: 3}, "$ cmd\nhi\n[exit 3]", false},
		{"stderr", abi.ExecResult{Stdout: "out\n", Stderr: "err", ExitCode: 1}, "$ cmd\nout\n[stderr]\nerr\n[exit 1]", false},
		{"only stderr", abi.ExecResult{Stderr: "boom\n", ExitCode: 2}, "$ cmd\n[stderr]\nboom\n[exit 2]", false},
		{"empty", abi.ExecResult{}, "$ cmd\n[exit 0]", false},
		{"signal", abi.ExecResult{ExitCode: -1}, "$ cmd\n[exit -1, killed by a signal]", false},
		{"timeout", abi.ExecResult{Stdout: "partial\n", TimedOut: true, ExitCode: -1}, "$ cmd\npartial\n[timed out after 5 s]", true},
		{"out of memory", abi.ExecResult{Stdout: "partial\n", OOMKilled: true, ExitCode: -1},
			"$ cmd\npartial\n[killed: the sandbox ran out of memory (it reached its memory limit); use less memory, or free some (files in /tmp and /dev/shm count)]", true},
		{"host cut", abi.ExecResult{Stdout: "head\ntail\n", StdoutCut: 1234, Stderr: "e\n", StderrCut: 7},
			"$ cmd\nhead\ntail\n[stdout: 1234 bytes were cut from the middle by the host; what is shown is the beginning and the end]\n" +
				"[stderr]\ne\n[stderr: 7 bytes were cut from the middle by the host; what is shown is the beginning and the end]\n[exit 0]", false},
	}
	for _, c := range cases {
		r := format("cmd", "5", c.res)
		if got := testenv.ResultText(r); got != c.want || r.IsError != c.err {
			t.Errorf("%s: got %v\n%q\nwant %v\n%q", c.name, r.IsError, got, c.err, c.want)
		}
	}
}

func TestFormatBudget(t *testing.T) {
	var out strings.Builder
	for i := 0; out.Len() < 100_000; i++ {
		out.WriteString("line é€ of stdout output\n")
	}
	errs := strings.Repeat("warning: something\n", 2000) // 38,000 bytes
	r := format("make", "60", abi.ExecResult{Stdout: out.String(), Stderr: errs, ExitCode: 2})
	got := testenv.ResultText(r)
	if len(got) > outputBudget+500 {
		t.Errorf("result is %d bytes", len(got))
	}
	if !strings.HasPrefix(got, "$ make\nline é€ of stdout output\n") || !strings.HasSuffix(got, "warning: something\n[exit 2]") {
		t.Errorf("head or tail lost: %q ... %q", got[:60], got[len(got)-60:])
	}
	if strings.Count(got, " bytes cut here ...]\n") != 2 || !strings.Contains(got, "\n[stderr]\n") {
		t.Errorf("markers missing")
	}
	if !strings.Contains(got, "of stdout output\n[... ") || !strings.Contains(got, " bytes cut here ...]\nline é€") {
		t.Errorf("stdout not cut at line boundaries")
	}
	if s := cutMiddle(strings.Repeat("€", 100), 50); !strings.HasPrefix(s, strings.Repeat("€", 8)+"\n[... ") {
		t.Errorf("cut inside a character: %q", s)
	}
}

func TestBash(t *testing.T) {
	w := pdktest.New(t)
	w.Write("f.txt", "content\n")
	got, isErr := w.Call("bash", `{"command":"cat f.txt; echo oops >&2; exit 4"}`)
	if isErr || got != "$ cat f.txt; echo oops >&2; exit 4\ncontent\n[stderr]\noops\n[exit 4]" {
		t.Errorf("got %v %q", isErr, got)
	}
	if r := w.Execs[0]; r.Argv[0] != "bash" || r.Argv[len(r.Argv)-1] != "cat f.txt; echo oops >&2; exit 4" || r.TimeoutMS != 60_000 || r.Background {
		t.Errorf("request %+v", r)
	}

	got, isErr = w.Call("bash", `{"command":"echo start; sleep 5","timeout":1}`)
	if !isErr || got != "$ echo start; sleep 5\nstart\n[timed out after 1 s]" {
		t.Errorf("timeout: %v %q", isErr, got)
	}

	got, isErr = w.Call("bash", `{"command":"true","timeout":601}`)
	if !isErr || !strings.HasPrefix(got, "Error: timeout 601 s is above the maximum of 600 s") {
		t.Errorf("over max: %v %q", isErr, got)
	}
	t.Setenv("TOOLHOST_BASH_MAX_TIMEOUT", "30")
	got, isErr = w.Call("bash", `{"command":"true","timeout":31}`)
	if !isErr || !strings.HasPrefix(got, "Error: timeout 31 s is above the maximum of 30 s") {
		t.Errorf("configured max: %v %q", isErr, got)
	}

	got, isErr = w.Call("bash", `{"command":"echo bg","background":true}`)
	if isErr || !strings.HasPrefix(got, "Started in background: id bg-1, pid ") || !strings.Contains(got, ", log /") {
		t.Errorf("background: %v %q", isErr, got)
	}
	if r := w.Execs[len(w.Execs)-1]; !r.Background || r.TimeoutMS != 0 {
		t.Errorf("background request %+v", r)
	}
}

// The host's timeouts are the tool's: the default applies when a call gives none (and is
// what a timeout reports), the maximum bounds a call, and the description says both.
func TestConfiguredTimeouts(t *testing.T) {
	w := pdktest.New(t)
	t.Setenv("TOOLHOST_EXEC_TIMEOUT_DEFAULT_MS", "1500")
	t.Setenv("TOOLHOST_EXEC_TIMEOUT_MAX_MS", "2000")
	got, isErr := w.Call("bash", `{"command":"sleep 5"}`)
	if r := w.Execs[len(w.Execs)-1]; r.TimeoutMS != 1500 || !isErr || !strings.HasSuffix(got, "[timed out after 1.5 s]") {
		t.Errorf("no timeout given: sent %d ms, got %v %q", r.TimeoutMS, isErr, got)
	}
	got, isErr = w.Call("bash", `{"command":"true","timeout":3}`)
	if !isErr || !strings.HasPrefix(got, "Error: timeout 3 s is above the maximum of 2 s") {
		t.Errorf("over the host's maximum: %v %q", isErr, got)
	}
	// The plugin's own cap only lowers the host's.
	t.Setenv("TOOLHOST_BASH_MAX_TIMEOUT", "900")
	if l := currentLimits(); l.maxMS != 2000 || l.defaultMS != 1500 {
		t.Errorf("limits %+v", l)
	}
	t.Setenv("TOOLHOST_BASH_MAX_TIMEOUT", "1")
	if l := currentLimits(); l.maxMS != 1000 || l.defaultMS != 1000 {
		t.Errorf("limits with a lower plugin cap %+v", l)
	}
	l := limits{defaultMS: 90_000, maxMS: 1_200_000}
	if d := description(l); !strings.Contains(d, "timeout is in seconds (default 90, at most 1200)") || strings.Contains(d, "600") {
		t.Errorf("description: %s", d)
	}
	if s := schema(l); !strings.Contains(s, `"default": 90`) || !strings.Contains(s, "default 90, at most 1200") {
		t.Errorf("schema: %s", s)
	}
}

// The shell remembers its directory between calls (and with TOOLHOST_BASH_KEEP_ENV its
// exported variables, unset ones included); a directory that is gone is said so.
func TestShellRemembers(t *testing.T) {
	w := pdktest.New(t)
	t.Setenv("TOOLHOST_BASH_KEEP_ENV", "1")
	w.Write("src/a.txt", "a\n")
	got, isErr := w.Call("bash", `{"command":"cd src && export X=1 Y='two words' && export GONE=1"}`)
	if isErr || !strings.Contains(got, "[cwd is now "+w.Root+"/src]") {
		t.Fatalf("cd: %v %q", isErr, got)
	}
	got, _ = w.Call("bash", `{"command":"pwd; echo \"$X|$Y|$GONE\"; unset GONE; ls"}`)
	if !strings.Contains(got, w.Root+"/src\n1|two words|1\na.txt\n") || strings.Contains(got, "cwd is now") {
		t.Errorf("second call: %q", got)
	}
	got, _ = w.Call("bash", `{"command":"echo \"[$GONE]\"; exit 3"}`)
	if !strings.Contains(got, "[]\n[exit 3]") {
		t.Errorf("unset did not carry over, or the exit code was lost: %q", got)
	}
	w.Call("bash", `{"command":"cd .. && rmdir src 2>/dev/null; mkdir -p d && cd d && rmdir ../d"}`)
	got, _ = w.Call("bash", `{"command":"pwd"}`)
	if !strings.Contains(got, "no longer exists") || !strings.Contains(got, w.Root+"\n") {
		t.Errorf("a directory that is gone: %q", got)
	}
	// Output that does not end in a newline keeps its last line as it was.
	got, _ = w.Call("bash", `{"command":"printf abc"}`)
	if !strings.Contains(got, "\nabc\n[exit 0]") {
		t.Errorf("printf: %q", got)
	}
	// Without the setting, variables do not carry over; the directory does.
	t.Setenv("TOOLHOST_BASH_KEEP_ENV", "")
	w.Call("bash", `{"command":"export Z=9; cd /"}`)
	got, _ = w.Call("bash", `{"command":"echo \"[$Z]\"; pwd"}`)
	if !strings.Contains(got, "[]\n/\n") {
		t.Errorf("without keep env: %q", got)
	}
}

func TestParseExports(t *testing.T) {
	dump := "declare -x A=\"1\"\ndeclare -x B=\"multi\nline \\\" q\"\ndeclare -x C\ndeclare -rx D=\"ro\"\n"
	m := parseExports(dump)
	if m["A"].quoted != `"1"` || m["B"].quoted != "\"multi\nline \\\" q\"" || m["C"].set || m["D"].quoted != `"ro"` || len(m) != 4 {
		t.Errorf("parsed %+v", m)
	}
	base := parseExports("declare -x A=\"1\"\ndeclare -x GONE=\"x\"\ndeclare -x PWD=\"/a\"\n")
	if d := envDiff(base, m); d != "export B=\"multi\nline \\\" q\"\nexport C\nexport D=\"ro\"\nunset GONE\n" {
		t.Errorf("diff %q", d)
	}
}
