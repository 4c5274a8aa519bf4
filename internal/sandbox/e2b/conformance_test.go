package e2b_test

// The behaviours every sandbox.Sandbox owes its callers, on the e2b provider against the
// fake E2B (whose envd behaves as E2B's: it kills only the process it started, follows
// every link, opens FIFOs, has no archive or port endpoints). Each test runs with both
// ways of reaching a sandbox: its own host over HTTPS, and one sandbox URL with E2B's
// routing headers. TestConformance runs the suite every provider runs, unchanged.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/sandbox/sandboxtest"
	"github.com/toolhost/toolhost/internal/archive"
	"github.com/toolhost/toolhost/internal/sandbox/e2b"
	"github.com/toolhost/toolhost/internal/sandbox/e2b/e2bfake"
	"github.com/toolhost/toolhost/internal/testenv"
)

// TestConformance: the sandbox conformance suite on e2b sandboxes, both routings.
func TestConformance(t *testing.T) {
	for _, r := range routings {
		t.Run(r.String(), func(t *testing.T) {
			f := startFake(t, r, e2bfake.Config{})
			cfg := providerConfig(t, f, r)
			cfg.Plan = e2b.PlanPro // the suite extends a sandbox to 2 h
			sandboxtest.Run(t, newProvider(t, cfg))
		})
	}
}

var routings = []routing{byHost, byHeader}

func (r routing) String() string {
	return map[routing]string{byHost: "by-host", byHeader: "by-header"}[r]
}

// eachRouting runs fn with a fresh fake and provider per routing.
func eachRouting(t *testing.T, fc e2bfake.Config, fn func(t *testing.T, f *e2bfake.Server, p *e2b.Provider)) {
	for _, r := range routings {
		t.Run(r.String(), func(t *testing.T) {
			f := startFake(t, r, fc)
			fn(t, f, newProvider(t, providerConfig(t, f, r)))
		})
	}
}

func uniqueMarker() string {
	return fmt.Sprintf("%d.%03d", 500+time.Now().UnixNano()%400, time.Now().UnixNano()%1000)
}

// leftover lists the processes whose command line holds marker.
func leftover(t *testing.T, sb sandbox.Sandbox, marker string) string {
	t.Helper()
	return string(sh(t, sb, `for p in /proc/[0-9]*; do c=$(tr '\0' ' ' < $p/cmdline 2>/dev/null); case "$c" in *`+marker+`*) echo "$p $c";; esac; done | grep -v 'for p'`).Stdout)
}

func TestExec(t *testing.T) {
	eachRouting(t, e2bfake.Config{}, func(t *testing.T, _ *e2bfake.Server, p *e2b.Provider) {
		sb := newSandbox(t, p, sandbox.CreateOptions{Env: map[string]string{"FROM_CREATE": "c"}})
		ctx := context.Background()
		res, err := sb.Exec(ctx, sandbox.ExecRequest{
			Argv: []string{"sh", "-c", `echo "$FROM_CREATE $FROM_EXEC $(pwd) $1"; echo err >&2; exit 7`, "sh", "$(not expanded) 'quoted'"},
			Env:  map[string]string{"FROM_EXEC": "e"}, Cwd: "sub",
		})
		if err == nil || !errors.Is(err, sandbox.ErrNotFound) && res.ExitCode == 7 {
			// envd refuses a cwd that does not exist.
			t.Logf("exec in a missing cwd: %+v %v", res, err)
		}
		sh(t, sb, "mkdir sub")
		res, err = sb.Exec(ctx, sandbox.ExecRequest{
			Argv: []string{"sh", "-c", `echo "$FROM_CREATE $FROM_EXEC $(pwd) $1"; echo err >&2; exit 7`, "sh", "$(not expanded) 'quoted'"},
			Env:  map[string]string{"FROM_EXEC": "e"}, Cwd: "sub",
		})
		if err != nil || res.ExitCode != 7 || string(res.Stdout) != "c e /home/user/sub $(not expanded) 'quoted'\n" || string(res.Stderr) != "err\n" {
			t.Fatalf("exec: %+v %q %q %v", res, res.Stdout, res.Stderr, err)
		}
		if res := sh(t, sb, "id -un; echo $HOME; echo $TOOLHOST_WORKSPACE_DURABILITY"); !strings.Contains(string(res.Stdout), "user\n/home/user\nephemeral") {
			t.Errorf("user, home and durability note: %q", res.Stdout)
		}
		if _, err := sb.Exec(ctx, sandbox.ExecRequest{}); err == nil {
			t.Error("empty argv accepted")
		}
	})
}

// The whole process group dies at the timeout, background children included: envd alone
// would kill only the process it started.
func TestTimeoutKillsProcessGroup(t *testing.T) {
	eachRouting(t, e2bfake.Config{}, func(t *testing.T, _ *e2bfake.Server, p *e2b.Provider) {
		sb := newSandbox(t, p, sandbox.CreateOptions{})
		marker := uniqueMarker()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		res, err := sb.Exec(ctx, sandbox.ExecRequest{
			Argv:    []string{"bash", "-c", fmt.Sprintf("echo before; sleep %s & sleep %s", marker, marker)},
			Timeout: time.Second,
		})
		if err != nil || !res.TimedOut || res.ExitCode != -1 || string(res.Stdout) != "before\n" {
			t.Fatalf("timed-out exec: %+v %q %v", res, res.Stdout, err)
		}
		if out := leftover(t, sb, marker); out != "" {
			t.Fatalf("processes left after the timeout:\n%s", out)
		}
		// ctx's deadline bounds the command like a timeout.
		dctx, dcancel := context.WithTimeout(context.Background(), time.Second)
		defer dcancel()
		res, err = sb.Exec(dctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", "sleep " + marker + " & sleep " + marker}})
		if !res.TimedOut {
			t.Fatalf("ctx deadline: %+v %v", res, err)
		}
		if !testenv.Eventually(func() bool { return leftover(t, sb, marker) == "" }) {
			t.Fatalf("processes left after the ctx deadline:\n%s", leftover(t, sb, marker))
		}
		// Cancelling ctx kills the whole group too.
		cctx, ccancel := context.WithCancel(context.Background())
		time.AfterFunc(500*time.Millisecond, ccancel)
		res, err = sb.Exec(cctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", "sleep " + marker + " & sleep " + marker}})
		if !res.TimedOut || !errors.Is(err, context.Canceled) {
			t.Fatalf("ctx cancel: %+v %v", res, err)
		}
		if !testenv.Eventually(func() bool { return leftover(t, sb, marker) == "" }) {
			t.Fatalf("processes left after cancel:\n%s", leftover(t, sb, marker))
		}
		// A command that ends by itself before its timeout is not timed out, and a
		// leftover child holding the pipes does not hang the call.
		res, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", "sleep " + marker + " & echo hi"}, Timeout: 30 * time.Second})
		if err != nil || res.TimedOut || res.ExitCode != 0 || string(res.Stdout) != "hi\n" {
			t.Fatalf("leftover child: %+v %q %v", res, res.Stdout, err)
		}
		res, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "kill -9 $$"}, Timeout: 30 * time.Second})
		if err != nil || res.TimedOut || res.ExitCode != -1 {
			t.Fatalf("a command killed before its timeout: %+v %v", res, err)
		}
	})
}

func TestOutputIsCapped(t *testing.T) {
	eachRouting(t, e2bfake.Config{}, func(t *testing.T, _ *e2bfake.Server, p *e2b.Provider) {
		sb := newSandbox(t, p, sandbox.CreateOptions{})
		const total, limit = 3_000_000, 64 << 10
		res, err := sb.Exec(context.Background(), sandbox.ExecRequest{
			Argv:           []string{"sh", "-c", fmt.Sprintf("printf start; head -c %d /dev/zero | tr '\\0' x; printf end", total)},
			MaxOutputBytes: limit,
		})
		if err != nil || res.ExitCode != 0 {
			t.Fatal(res, err)
		}
		if len(res.Stdout) > limit || int64(len(res.Stdout))+res.StdoutCut != total+8 {
			t.Errorf("kept %d bytes, cut %d; want at most %d kept of %d", len(res.Stdout), res.StdoutCut, limit, total+8)
		}
		if !bytes.HasPrefix(res.Stdout, []byte("startxxx")) || !bytes.HasSuffix(res.Stdout, []byte("xxxend")) {
			t.Errorf("head and tail not kept: %q...%q", res.Stdout[:10], res.Stdout[len(res.Stdout)-10:])
		}
	})
}

func TestBackgroundProcess(t *testing.T) {
	eachRouting(t, e2bfake.Config{}, func(t *testing.T, _ *e2bfake.Server, p *e2b.Provider) {
		sb := newSandbox(t, p, sandbox.CreateOptions{})
		ctx := context.Background()
		marker := uniqueMarker()
		pr, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", "for i in 1 2 3; do echo tick $i; sleep 0.1; done; echo oops >&2; sleep " + marker}})
		if err != nil || pr.PID <= 0 || !strings.HasPrefix(pr.LogPath, e2b.BackgroundLogDir+"/") || pr.ID == "" {
			t.Fatalf("start: %+v %v", pr, err)
		}
		if !testenv.Eventually(func() bool {
			return string(sh(t, sb, "cat "+pr.LogPath).Stdout) == "tick 1\ntick 2\ntick 3\noops\n"
		}) {
			t.Fatalf("log %s: %q", pr.LogPath, sh(t, sb, "cat "+pr.LogPath).Stdout)
		}
		if leftover(t, sb, marker) == "" {
			t.Fatal("the background process did not outlive its call")
		}
	})
}

func TestFiles(t *testing.T) {
	eachRouting(t, e2bfake.Config{}, func(t *testing.T, _ *e2bfake.Server, p *e2b.Provider) {
		sb := newSandbox(t, p, sandbox.CreateOptions{})
		ctx := context.Background()
		if err := sb.WriteFile(ctx, "deep/er/f.txt", []byte("hello")); err != nil {
			t.Fatal(err)
		}
		if res := sh(t, sb, "cat deep/er/f.txt"); string(res.Stdout) != "hello" {
			t.Fatalf("written file seen by a command: %q", res.Stdout)
		}
		if b, err := sb.ReadFile(ctx, "/home/user/deep/er/f.txt", 5); err != nil || string(b) != "hello" {
			t.Fatalf("ReadFile: %q %v", b, err)
		}
		if _, err := sb.ReadFile(ctx, "deep/er/f.txt", 4); !errors.Is(err, sandbox.ErrTooLarge) {
			t.Errorf("ReadFile over the limit: %v", err)
		}
		if _, err := sb.ReadFile(ctx, "nope", 0); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("ReadFile missing: %v", err)
		}
		if _, err := sb.ReadFile(ctx, "deep", 0); !errors.Is(err, sandbox.ErrIsDir) {
			t.Errorf("ReadFile dir: %v", err)
		}
		if err := sb.WriteFile(ctx, "deep", []byte("x")); !errors.Is(err, sandbox.ErrIsDir) {
			t.Errorf("WriteFile over a dir: %v", err)
		}
		if err := sb.WriteFile(ctx, "deep/er/f.txt/x", []byte("x")); !errors.Is(err, sandbox.ErrNotDir) {
			t.Errorf("WriteFile below a file: %v", err)
		}
		if err := sb.WriteFile(ctx, "empty", nil); err != nil {
			t.Fatal(err)
		}
		if b, err := sb.ReadFile(ctx, "empty", 0); err != nil || len(b) != 0 {
			t.Fatalf("empty file: %q %v", b, err)
		}
		big := bytes.Repeat([]byte("0123456789abcdef"), 1<<20) // 16 MiB, streamed both ways
		if err := sb.WriteFile(ctx, "big.bin", big); err != nil {
			t.Fatal(err)
		}
		if b, err := sb.ReadFile(ctx, "big.bin", 0); err != nil || !bytes.Equal(b, big) {
			t.Fatalf("16 MiB file: %d bytes, %v", len(b), err)
		}
		sh(t, sb, "chmod 755 deep/er/f.txt")
		if err := sb.WriteFile(ctx, "deep/er/f.txt", []byte("again")); err != nil {
			t.Fatal(err)
		}
		if res := sh(t, sb, "stat -c %a deep/er/f.txt; cat deep/er/f.txt"); string(res.Stdout) != "755\nagain" {
			t.Errorf("a rewrite kept mode and contents: %q", res.Stdout)
		}
		fi, err := sb.Stat(ctx, "deep/er/f.txt")
		if err != nil || fi.Size != 5 || !fi.Mode.IsRegular() || fi.Path != "deep/er/f.txt" || fi.ModTime.IsZero() {
			t.Fatalf("Stat: %+v %v", fi, err)
		}
		if fi, err := sb.Stat(ctx, "deep"); err != nil || !fi.IsDir() {
			t.Fatalf("Stat dir: %+v %v", fi, err)
		}
		if _, err := sb.Stat(ctx, "missing"); !errors.Is(err, sandbox.ErrNotFound) {
			t.Fatalf("Stat missing: %v", err)
		}
		sh(t, sb, "rm big.bin; mkdir -p a/node_modules/pkg b && echo 1 > a/x && echo 2 > a.txt && echo 3 > a/node_modules/pkg/i.js && echo 4 > b/y && ln -s a.txt alink")
		lr, err := sb.List(ctx, sandbox.ListRequest{Path: ".", Recursive: true, Skip: []string{"node_modules"}})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range lr.Entries {
			got = append(got, e.Path)
		}
		want := "a a.txt a/node_modules a/x alink b b/y deep deep/er deep/er/f.txt empty"
		if strings.Join(got, " ") != want || lr.Truncated {
			t.Errorf("List recursive:\n got %q\nwant %q", strings.Join(got, " "), want)
		}
		for _, e := range lr.Entries {
			if e.Path == "alink" && e.Mode&fs.ModeSymlink == 0 {
				t.Errorf("a link is listed as %v", e.Mode)
			}
			if e.Path == "a" && !e.IsDir() {
				t.Errorf("a directory is listed as %v", e.Mode)
			}
		}
		lr, err = sb.List(ctx, sandbox.ListRequest{Path: "a"})
		if err != nil || len(lr.Entries) != 2 || lr.Entries[0].Path != "node_modules" || !lr.Entries[0].IsDir() || lr.Entries[1].Path != "x" {
			t.Errorf("List flat: %+v %v", lr, err)
		}
		lr, err = sb.List(ctx, sandbox.ListRequest{Path: ".", Recursive: true, Limit: 3})
		if err != nil || len(lr.Entries) != 3 || !lr.Truncated {
			t.Errorf("List limit: %+v %v", lr, err)
		}
		if _, err := sb.List(ctx, sandbox.ListRequest{Path: "a.txt"}); !errors.Is(err, sandbox.ErrNotDir) {
			t.Errorf("List of a file: %v", err)
		}
		if _, err := sb.List(ctx, sandbox.ListRequest{Path: "zzz"}); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("List of a missing dir: %v", err)
		}
	})
}

// File tools keep to the workspace: E2B's envd follows every link, the provider does not
// follow one that leads out, and never opens a FIFO.
func TestFilesStayInWorkspace(t *testing.T) {
	eachRouting(t, e2bfake.Config{}, func(t *testing.T, _ *e2bfake.Server, p *e2b.Provider) {
		sb := newSandbox(t, p, sandbox.CreateOptions{})
		ctx := context.Background()
		sh(t, sb, `ln -s /etc/passwd passwd && ln -s ../../../../etc/passwd rel && ln -s /etc secretdir && echo inside > a.txt && ln -s a.txt in &&
			mkdir d && ln -s ../a.txt d/up && ln -s /home/user/a.txt abs-in && ln -s loop1 loop2 && ln -s loop2 loop1 && ln -s /nowhere dangling && mkfifo fifo`)
		for _, pth := range []string{"../../etc/passwd", "/etc/passwd", "/home/user/../../etc/passwd", "passwd", "rel", "secretdir/passwd", "/home/user/secretdir/hostname"} {
			b, err := sb.ReadFile(ctx, pth, 0)
			if !errors.Is(err, sandbox.ErrOutside) {
				t.Errorf("ReadFile(%q) = %q, %v; want ErrOutside", pth, b, err)
			}
		}
		for _, pth := range []string{"passwd", "secretdir/new.txt", "../x"} {
			if err := sb.WriteFile(ctx, pth, []byte("overwritten")); !errors.Is(err, sandbox.ErrOutside) {
				t.Errorf("WriteFile(%q) = %v; want ErrOutside", pth, err)
			}
		}
		for _, pth := range []string{"in", "d/up", "abs-in"} {
			if b, err := sb.ReadFile(ctx, pth, 0); err != nil || string(b) != "inside\n" {
				t.Errorf("link inside the workspace %s: %q %v", pth, b, err)
			}
		}
		if err := sb.WriteFile(ctx, "in", []byte("through the link\n")); err != nil {
			t.Fatal(err)
		}
		if res := sh(t, sb, "cat a.txt; test -L in && echo still-a-link"); string(res.Stdout) != "through the link\nstill-a-link\n" {
			t.Errorf("a write through an inner link: %q", res.Stdout)
		}
		if _, err := sb.ReadFile(ctx, "loop1", 0); err == nil {
			t.Error("a link loop was read")
		}
		if _, err := sb.ReadFile(ctx, "dangling", 0); err == nil {
			t.Error("a dangling link out was read")
		}
		done := make(chan struct{})
		go func() { // owned by this test, which waits for it below
			defer close(done)
			if _, err := sb.ReadFile(ctx, "fifo", 0); !errors.Is(err, sandbox.ErrNotRegular) {
				t.Errorf("ReadFile of a FIFO: %v", err)
			}
			if err := sb.WriteFile(ctx, "fifo", []byte("x")); !errors.Is(err, sandbox.ErrNotRegular) {
				t.Errorf("WriteFile of a FIFO: %v", err)
			}
		}()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("a FIFO was opened: the call hangs")
		}
		fi, err := sb.Stat(ctx, "passwd")
		if err != nil || fi.Mode&fs.ModeSymlink == 0 {
			t.Errorf("Stat of a link: %+v %v (want the link itself)", fi, err)
		}
		if res := sh(t, sb, "head -c 5 /etc/passwd"); string(res.Stdout) != "root:" {
			t.Errorf("/etc/passwd changed: %q", res.Stdout)
		}
		lr, err := sb.List(ctx, sandbox.ListRequest{Path: ".", Recursive: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range lr.Entries {
			if strings.HasPrefix(e.Path, "secretdir/") {
				t.Errorf("List followed a link out of the workspace: %s", e.Path)
			}
		}
	})
}

func TestArchiveRoundTrip(t *testing.T) {
	eachRouting(t, e2bfake.Config{}, func(t *testing.T, _ *e2bfake.Server, p *e2b.Provider) {
		src := newSandbox(t, p, sandbox.CreateOptions{})
		ctx := context.Background()
		sh(t, src, `mkdir -p src/app node_modules/x empty && printf 'package main\n' > src/app/main.go && printf '#!/bin/sh\necho run\n' > run.sh &&
			chmod 755 run.sh && chmod 600 src/app/main.go && echo dep > node_modules/x/i.js && ln -s src/app/main.go link &&
			ln -s /etc/passwd out && mkfifo fifo && touch -d 2024-02-29T12:34:56Z src/app/main.go && head -c 3000000 /dev/urandom > data.bin`)
		want := string(sh(t, src, `find . -path ./node_modules -prune -o -path ./out -prune -o -path ./fifo -prune -o -printf '%y %m %s %P %l\n' | sort; sha256sum data.bin; stat -c %Y src/app/main.go`).Stdout)
		var arch bytes.Buffer
		if err := src.Archive(ctx, &arch, nil); err != nil {
			t.Fatal(err)
		}
		dst := newSandbox(t, p, sandbox.CreateOptions{})
		if err := dst.Extract(ctx, bytes.NewReader(arch.Bytes())); err != nil {
			t.Fatal(err)
		}
		got := string(sh(t, dst, `find . -printf '%y %m %s %P %l\n' | sort; sha256sum data.bin; stat -c %Y src/app/main.go`).Stdout)
		if got != want {
			t.Errorf("restored tree differs:\n got:\n%s\nwant:\n%s", got, want)
		}
		if res := sh(t, dst, "./run.sh; cat link"); string(res.Stdout) != "run\npackage main\n" {
			t.Errorf("restored script and link: %q", res.Stdout)
		}
		// Nothing extracts into a workspace already in use.
		if err := dst.Extract(ctx, bytes.NewReader(arch.Bytes())); !errors.Is(err, archive.ErrNotEmpty) {
			t.Errorf("a second extract: %v", err)
		}
		// Excludes: none at all keeps node_modules.
		arch.Reset()
		if err := src.Archive(ctx, &arch, []string{}); err != nil {
			t.Fatal(err)
		}
		all := newSandbox(t, p, sandbox.CreateOptions{})
		if err := all.Extract(ctx, &arch); err != nil {
			t.Fatal(err)
		}
		if res := sh(t, all, "cat node_modules/x/i.js"); string(res.Stdout) != "dep\n" {
			t.Errorf("excludes []: node_modules missing: %q", res.Stdout)
		}
	})
}

// A hostile archive is refused whole, on the host, before anything reaches the sandbox.
func TestExtractRefusesHostileArchive(t *testing.T) {
	eachRouting(t, e2bfake.Config{}, func(t *testing.T, _ *e2bfake.Server, p *e2b.Provider) {
		ctx := context.Background()
		for name, entries := range map[string][]tar.Header{
			"dotdot":      {{Name: "ok.txt", Typeflag: tar.TypeReg}, {Name: "../escape.txt", Typeflag: tar.TypeReg}},
			"absolute":    {{Name: "/tmp/escape.txt", Typeflag: tar.TypeReg}},
			"link-out":    {{Name: "lnk", Typeflag: tar.TypeSymlink, Linkname: "/tmp"}, {Name: "lnk/escape.txt", Typeflag: tar.TypeReg}},
			"below-link":  {{Name: "s", Typeflag: tar.TypeSymlink, Linkname: "."}, {Name: "s/s/l", Typeflag: tar.TypeSymlink, Linkname: "../.."}, {Name: "s/s/l/escape.txt", Typeflag: tar.TypeReg}},
			"device":      {{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}},
			"fifo":        {{Name: "pipe", Typeflag: tar.TypeFifo}},
			"hardlink-up": {{Name: "hl", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}},
		} {
			t.Run(name, func(t *testing.T) {
				sb := newSandbox(t, p, sandbox.CreateOptions{})
				var buf bytes.Buffer
				zw := gzip.NewWriter(&buf)
				tw := tar.NewWriter(zw)
				for _, h := range entries {
					h.Mode = 0o644
					if err := tw.WriteHeader(&h); err != nil {
						t.Fatal(err)
					}
				}
				tw.Close()
				zw.Close()
				err := sb.Extract(ctx, &buf)
				if !errors.Is(err, archive.ErrUnsafe) {
					t.Fatalf("hostile archive: %v", err)
				}
				if res := sh(t, sb, "ls -A; ls /tmp | grep -c escape || true; ls /home | grep -c escape || true"); string(res.Stdout) != "0\n0\n" {
					t.Errorf("something was extracted: %q", res.Stdout)
				}
			})
		}
	})
}

func TestPreview(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skipf("python3 serves the preview page in the sandbox and is not installed: %v", err)
	}
	for _, private := range []bool{false, true} {
		t.Run(map[bool]string{false: "public", true: "traffic-token"}[private], func(t *testing.T) {
			eachRouting(t, e2bfake.Config{}, func(t *testing.T, f *e2bfake.Server, _ *e2b.Provider) {
				cfg := providerConfig(t, f, byHost)
				if f.CAPEM() == nil {
					cfg = providerConfig(t, f, byHeader)
				}
				cfg.PrivatePreviews = private
				p := newProvider(t, cfg)
				sb := newSandbox(t, p, sandbox.CreateOptions{})
				ctx := context.Background()
				if _, err := sb.PreviewURL(ctx, 8000); !errors.Is(err, sandbox.ErrPortClosed) {
					t.Fatalf("preview of a closed port: %v", err)
				}
				if err := sb.WriteFile(ctx, "site/index.html", []byte("<h1>preview works</h1>")); err != nil {
					t.Fatal(err)
				}
				if _, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"}, Cwd: "site"}); err != nil {
					t.Fatal(err)
				}
				var u fmt.Stringer
				if !testenv.Eventually(func() bool {
					url, err := sb.PreviewURL(ctx, 8000)
					if err == nil {
						u = url
					}
					return err == nil
				}) {
					t.Fatal("the preview never opened")
				}
				if !strings.HasPrefix(u.String(), "http://127.0.0.1:") {
					t.Errorf("preview URL %s is not on the host's loopback", u)
				}
				resp, err := http.Get(u.String())
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || string(body) != "<h1>preview works</h1>" {
					t.Errorf("preview: %d %q", resp.StatusCode, body)
				}
				// A page cannot aim the proxy at envd (or another sandbox) with E2B's
				// routing headers: the proxy's own replace them.
				req, _ := http.NewRequest(http.MethodGet, u.String()+"health", nil)
				req.Header.Set("E2b-Sandbox-Port", "49983")
				req.Header.Set("E2b-Sandbox-Id", "aaaaaaaaaaaaaaaaaaaa")
				if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusNotFound || resp.Header.Get("Server") == "" {
					t.Errorf("a request with routing headers of its own: %v %v", resp, err)
				} else {
					resp.Body.Close()
				}
				ports, err := sb.Ports(ctx)
				if err != nil || len(ports) != 1 || ports[0].Port != 8000 {
					t.Errorf("Ports: %+v %v", ports, err)
				}
				if err := sb.Close(ctx); err != nil {
					t.Fatal(err)
				}
				if _, err := http.Get(u.String()); err == nil {
					t.Error("the preview still answers after Close")
				}
			})
		})
	}
}

func TestLifetime(t *testing.T) {
	eachRouting(t, e2bfake.Config{MaxLifetime: time.Hour}, func(t *testing.T, f *e2bfake.Server, p *e2b.Provider) {
		ctx := context.Background()
		sb := newSandbox(t, p, sandbox.CreateOptions{Timeout: 10 * time.Minute})
		if d := sb.EndsAt().Sub(sb.StartedAt()); d < 9*time.Minute || d > 11*time.Minute {
			t.Errorf("lifetime %s, want 10m", d)
		}
		if err := sb.SetTimeout(ctx, 30*time.Minute); err != nil {
			t.Fatal(err)
		}
		cached := sb.EndsAt()
		if err := sb.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if d := sb.EndsAt().Sub(cached); d < 0 || d > 5*time.Second {
			t.Errorf("E2B's endAt %s, cached %s", sb.EndsAt(), cached)
		}
		if err := sb.SetTimeout(ctx, 2*time.Hour); err == nil || !strings.Contains(err.Error(), "maximum lifetime") {
			t.Errorf("past the plan's maximum: %v", err)
		}
		if _, err := p.Create(ctx, sandbox.CreateOptions{Timeout: 2 * time.Hour}); err == nil || errors.Is(err, sandbox.ErrUnavailable) {
			t.Errorf("create past the plan's maximum: %v (must be the caller's fault)", err)
		}
		// E2B kills a sandbox at its end time.
		short := newSandbox(t, p, sandbox.CreateOptions{Timeout: 2 * time.Second})
		time.Sleep(time.Until(short.EndsAt()) + 500*time.Millisecond)
		if _, err := short.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrClosed) {
			t.Errorf("exec after the end time: %v", err)
		}
		if !testenv.Eventually(func() bool { return !contains(f.SandboxIDs(), short.ID()) }) {
			t.Error("the fake did not kill the sandbox at its end time")
		}
		// Close is DELETE, idempotent; a closed sandbox is closed.
		if err := sb.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if err := sb.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if contains(f.SandboxIDs(), sb.ID()) {
			t.Error("Close did not kill the sandbox")
		}
		if _, err := sb.ReadFile(ctx, "x", 0); !errors.Is(err, sandbox.ErrClosed) {
			t.Errorf("read after close: %v", err)
		}
	})
}

func contains(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}
