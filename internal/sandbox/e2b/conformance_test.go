//go:build linux

package e2b_test

// The behaviours every sandbox.Sandbox owes its callers, on the e2b provider against the
// fake E2B (whose envd behaves as E2B's: it kills only the process it started, follows
// every link, opens FIFOs, has no archive or port endpoints). TestConformance runs the
// suite every provider runs, unchanged, with both ways of reaching a sandbox: its own host
// over HTTPS, and one sandbox URL with E2B's routing headers; what the provider makes up
// for in envd is proved there. The tests below hold what is E2B's alone: the environment
// it gives (its user, the durability note, where background logs go), links followed on
// the host by the provider's own rules, archives judged on the host, previews through
// E2B's proxy, and lifetimes kept by E2B.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"slices"
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

// TestEnvironment: E2B's user and home, the note that the workspace is not durable, and
// background logs in the provider's own directory. Not a matter of routing: one is enough.
func TestEnvironment(t *testing.T) {
	f := startFake(t, byHeader, e2bfake.Config{})
	sb := newSandbox(t, newProvider(t, providerConfig(t, f, byHeader)), sandbox.CreateOptions{})
	if res := sh(t, sb, "id -un; echo $HOME; echo $TOOLHOST_WORKSPACE_DURABILITY"); !strings.HasPrefix(string(res.Stdout), "user\n/home/user\nephemeral:") {
		t.Errorf("user, home and durability note: %q", res.Stdout)
	}
	pr, err := sb.Start(context.Background(), sandbox.ExecRequest{Argv: []string{"sleep", "60"}})
	if err != nil || !strings.HasPrefix(pr.LogPath, e2b.BackgroundLogDir+"/") {
		t.Errorf("a background process: %+v %v, want its log in %s", pr, err, e2b.BackgroundLogDir)
	}
}

// TestAbsoluteLinkInside: E2B's envd follows every link, so the provider resolves links
// itself, hop by hop on the host: an absolute link that stays in the workspace is read
// and written through like a relative one. (The suite's FilesStayInWorkspace holds the
// links out; the local provider refuses an absolute link outright.)
func TestAbsoluteLinkInside(t *testing.T) {
	eachRouting(t, e2bfake.Config{}, func(t *testing.T, _ *e2bfake.Server, p *e2b.Provider) {
		sb := newSandbox(t, p, sandbox.CreateOptions{})
		ctx := context.Background()
		sh(t, sb, "echo inside > a.txt && ln -s /home/user/a.txt abs-in")
		if b, err := sb.ReadFile(ctx, "abs-in", 0); err != nil || string(b) != "inside\n" {
			t.Errorf("ReadFile of an absolute link inside the workspace: %q %v", b, err)
		}
		if err := sb.WriteFile(ctx, "abs-in", []byte("through\n")); err != nil {
			t.Fatal(err)
		}
		if res := sh(t, sb, "cat a.txt; test -L abs-in && echo still-a-link"); string(res.Stdout) != "through\nstill-a-link\n" {
			t.Errorf("a write through an absolute link inside: %q", res.Stdout)
		}
	})
}

// TestExtractJudgedOnTheHost: a hostile archive is refused whole, on the host, before
// anything reaches the sandbox (the suite proves each kind refused): archive.ErrUnsafe,
// and nothing lands in the workspace or outside it. Any Extract, refused or not, puts a
// sandbox in use, so each case takes a fresh one; a second Extract is archive.ErrNotEmpty.
func TestExtractJudgedOnTheHost(t *testing.T) {
	f := startFake(t, byHeader, e2bfake.Config{})
	p := newProvider(t, providerConfig(t, f, byHeader))
	ctx := context.Background()
	mk := func(entries ...tar.Header) *bytes.Buffer {
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
		return &buf
	}
	for name, entries := range map[string][]tar.Header{
		"dotdot":      {{Name: "ok.txt", Typeflag: tar.TypeReg}, {Name: "../escape.txt", Typeflag: tar.TypeReg}},
		"absolute":    {{Name: "ok.txt", Typeflag: tar.TypeReg}, {Name: "/tmp/escape.txt", Typeflag: tar.TypeReg}},
		"link-out":    {{Name: "lnk", Typeflag: tar.TypeSymlink, Linkname: "/tmp"}, {Name: "lnk/escape.txt", Typeflag: tar.TypeReg}},
		"below-link":  {{Name: "s", Typeflag: tar.TypeSymlink, Linkname: "."}, {Name: "s/s/l", Typeflag: tar.TypeSymlink, Linkname: "../.."}, {Name: "s/s/l/escape.txt", Typeflag: tar.TypeReg}},
		"device":      {{Name: "ok.txt", Typeflag: tar.TypeReg}, {Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}},
		"fifo":        {{Name: "ok.txt", Typeflag: tar.TypeReg}, {Name: "pipe", Typeflag: tar.TypeFifo}},
		"hardlink-up": {{Name: "ok.txt", Typeflag: tar.TypeReg}, {Name: "hl", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}},
	} {
		t.Run(name, func(t *testing.T) {
			sb := newSandbox(t, p, sandbox.CreateOptions{})
			if err := sb.Extract(ctx, mk(entries...)); !errors.Is(err, archive.ErrUnsafe) {
				t.Errorf("%v, want archive.ErrUnsafe", err)
			}
			if res := sh(t, sb, "ls -A; ls /tmp /home | grep -c escape"); string(res.Stdout) != "0\n" {
				t.Errorf("something was extracted: %q", res.Stdout)
			}
		})
	}
	sb := newSandbox(t, p, sandbox.CreateOptions{})
	if err := sb.Extract(ctx, mk(tar.Header{Name: "ok.txt", Typeflag: tar.TypeReg})); err != nil {
		t.Fatalf("a plain archive: %v", err)
	}
	if err := sb.Extract(ctx, mk(tar.Header{Name: "ok.txt", Typeflag: tar.TypeReg})); !errors.Is(err, archive.ErrNotEmpty) {
		t.Errorf("a second extract: %v, want archive.ErrNotEmpty", err)
	}
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
			})
		})
	}
}

// TestLifetime: E2B keeps the time: its endAt is the provider's, the plan's maximum is
// refused as the caller's mistake, and E2B itself kills a sandbox at its end and at Close.
func TestLifetime(t *testing.T) {
	eachRouting(t, e2bfake.Config{MaxLifetime: time.Hour}, func(t *testing.T, f *e2bfake.Server, p *e2b.Provider) {
		ctx := context.Background()
		sb := newSandbox(t, p, sandbox.CreateOptions{Timeout: 10 * time.Minute})
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
		// E2B kills a sandbox at its end time, and the provider says ErrClosed.
		short := newSandbox(t, p, sandbox.CreateOptions{Timeout: 2 * time.Second})
		if !testenv.Eventually(func() bool { return !slices.Contains(f.SandboxIDs(), short.ID()) }) {
			t.Error("the fake did not kill the sandbox at its end time")
		}
		if _, err := short.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrClosed) {
			t.Errorf("exec after the end time: %v", err)
		}
		// Close is E2B's DELETE.
		if err := sb.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(f.SandboxIDs(), sb.ID()) {
			t.Error("Close did not kill the sandbox")
		}
	})
}

// leftover lists the processes whose command line holds marker.
func leftover(t *testing.T, sb sandbox.Sandbox, marker string) string {
	t.Helper()
	return string(sh(t, sb, `for p in /proc/[0-9]*; do c=$(tr '\0' ' ' < $p/cmdline 2>/dev/null); case "$c" in *`+marker+`*) echo "$p $c";; esac; done | grep -v 'for p'`).Stdout)
}

func uniqueMarker() string {
	return fmt.Sprintf("%d.%03d", 500+time.Now().UnixNano()%400, time.Now().UnixNano()%1000)
}

func contains(ids []string, id string) bool { return slices.Contains(ids, id) }
