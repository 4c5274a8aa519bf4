package cli

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"image"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"golang.org/x/image/webp"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/experimental"
	"github.com/toolhost/toolhost/internal/screenshot"
)

// The page the demo serves from the sandbox: a known background colour, checked in the
// screenshots.
const (
	demoPort    = 8000
	demoColour  = "#12a060"
	demoPageDir = "web"
)

var demoRGB = [3]uint8{0x12, 0xa0, 0x60}

const demoPage = `<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>toolhost demo</title></head>
<body style="margin:0; min-height:100vh; background:` + demoColour + `; color:#fff; font-family:sans-serif">
  <h1 style="margin:0; padding:30vh 0 0; text-align:center">Served from the sandbox</h1>
</body>
</html>
`

// projectSteps follow the tool calls: what a session adds to a sandbox.
func projectSteps() []demoStep {
	return []demoStep{
		{title: "write a web page with a known background colour", tool: "write_file",
			input: in("path", demoPageDir+"/index.html", "content", demoPage)},
		{title: "start a dev server in the background", tool: "bash",
			input: in("command", fmt.Sprintf("cd %s && exec python3 -m http.server %d", demoPageDir, demoPort), "background", true)},
		{title: "wait until it listens", tool: "bash",
			input: in("command", fmt.Sprintf(`for i in $(seq 1 100); do if (exec 3<>/dev/tcp/127.0.0.1/%d) 2>/dev/null; then echo "port %d answers (try $i)"; exit 0; fi; sleep 0.1; done; echo "nothing listens on port %d"; exit 1`, demoPort, demoPort, demoPort)),
			after: func(_ *demoState, res abi.Result) (string, error) {
				if !strings.Contains(resultText(res), "answers") {
					return "", errors.New("the dev server did not start listening")
				}
				return "", nil
			}},
		{title: "take_screenshot of the page", tool: "take_screenshot",
			input: in("port", demoPort), after: checkScreenshot},
		{title: "phase commit: a snapshot of the workspace", run: commitStep},
		{title: "the screenshots the session took on its own (auto/)", run: autoCapturesStep},
		{title: "a sandbox rotation under a tool call", run: rotationStep},
		{title: "a fresh session for the project wakes from the newest snapshot", run: wakeStep},
	}
}

// checkScreenshot decodes the images of a take_screenshot result and checks their sizes
// and a pixel of the page's background.
func checkScreenshot(st *demoState, res abi.Result) (string, error) {
	if res.IsError {
		return "", errors.New("take_screenshot failed: " + firstLine(resultText(res), 200))
	}
	want := []screenshot.Viewport{screenshot.Desktop, screenshot.Mobile}
	var b strings.Builder
	n := 0
	for _, c := range res.Content {
		if c.Type != abi.ContentImage || c.Source == nil {
			continue
		}
		if n >= len(want) {
			return b.String(), fmt.Errorf("more than %d images", len(want))
		}
		vp := want[n]
		n++
		raw, err := base64.StdEncoding.DecodeString(c.Source.Data)
		if err != nil {
			return b.String(), fmt.Errorf("%s image: base64: %w", vp.Name, err)
		}
		img, err := webp.Decode(bytes.NewReader(raw))
		if err != nil {
			return b.String(), fmt.Errorf("%s image: not a WebP: %w", vp.Name, err)
		}
		size := img.Bounds().Size()
		r, g, bl := pixel(img, 4, 4)
		fmt.Fprintf(&b, "checked: %s image %dx%d %s, %s; pixel (4,4) is #%02x%02x%02x\n", vp.Name, size.X, size.Y,
			c.Source.MediaType, humanBytes(int64(len(raw))), r, g, bl)
		if size.X != vp.Width || size.Y != vp.Height {
			return b.String(), fmt.Errorf("%s image is %dx%d, want %dx%d", vp.Name, size.X, size.Y, vp.Width, vp.Height)
		}
		if [3]uint8{r, g, bl} != demoRGB {
			return b.String(), fmt.Errorf("%s image: pixel (4,4) is #%02x%02x%02x, not the page's %s", vp.Name, r, g, bl, demoColour)
		}
	}
	if n != len(want) {
		return b.String(), fmt.Errorf("%d images, want %d", n, len(want))
	}
	return b.String(), nil
}

func pixel(img image.Image, x, y int) (r, g, b uint8) {
	pr, pg, pb, _ := img.At(img.Bounds().Min.X+x, img.Bounds().Min.Y+y).RGBA()
	return uint8(pr >> 8), uint8(pg >> 8), uint8(pb >> 8)
}

func commitStep(ctx context.Context, st *demoState) (string, error) {
	info, err := st.sess.Commit(ctx, "demo phase 1")
	if err != nil {
		return "", err
	}
	st.vars["commit_key"] = info.Key
	return fmt.Sprintf("committed: %s (%s) in %s", info.Key, humanBytes(info.Size), st.th.Storage().Where()), nil
}

// autoCapturesStep waits (bounded) for the session's own captures of this run: a pair when
// the dev server started listening and a pair after the commit, both taken in the
// background. It lists them once no new one has come for a while.
func autoCapturesStep(ctx context.Context, st *demoState) (string, error) {
	if err := st.th.CheckBrowser(); err != nil {
		return "", err // screenshots off or no browser: the session could not have captured anything
	}
	since := st.vars["started"]
	const bound, settle = 30 * time.Second, 2 * time.Second
	start, lastChange, seen := time.Now(), time.Now(), -1
	for {
		shots, err := st.sess.Screenshots(ctx, toolhost.ScreenshotsAuto)
		if err != nil {
			return "", err
		}
		var mine []toolhost.Screenshot
		for _, s := range shots {
			if s.Time.UTC().Format(time.RFC3339) >= since {
				mine = append(mine, s)
			}
		}
		if len(mine) != seen {
			seen, lastChange = len(mine), time.Now()
		}
		settled := len(mine) >= 4 && time.Since(lastChange) >= settle
		if settled || time.Since(start) >= bound {
			var b strings.Builder
			fmt.Fprintf(&b, "%d auto/ images of this run, newest first (taken when the dev server started listening and after the commit):\n", len(mine))
			tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
			for _, s := range mine {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Key, viewportLabel(s.Viewport), humanBytes(s.Size))
			}
			tw.Flush()
			if len(mine) > 0 {
				fmt.Fprintf(&b, "URL of the newest: %s\n", mine[0].URL)
			}
			if len(mine) < 4 {
				return b.String(), fmt.Errorf("%d auto-captured images after %s, want at least 4 (the log says why)", len(mine), bound)
			}
			return b.String(), nil
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// rotationStep makes the next call land on a rotation: the current sandbox is made to
// look as if it had reached the end of its maximum lifetime (so it cannot be extended)
// and its end is brought inside the keepalive margin. The call then waits while the
// session saves, moves the work to a new sandbox and swaps, and runs on the new sandbox.
// The work moves the way it does in every session of the CLI: a provider that can hand
// its workspace over does (local), and the step fails if it did not.
func rotationStep(ctx context.Context, st *demoState) (string, error) {
	cfg := st.cli.cfg.Session
	live := experimental.Sandbox(st.sess)
	input, _ := marshalJSON(obj{"command", "ls " + demoPageDir + " src && cat ticks.txt"})
	call := func() (abi.Result, time.Duration, error) {
		t := time.Now()
		res, err := st.sess.Dispatch(ctx, "bash", input)
		d := time.Since(t)
		if err == nil && res.IsError {
			err = errors.New(firstLine(resultText(res), 200))
		}
		return res, d, err
	}
	if _, _, err := call(); err != nil { // warm-up: the same call's latency without rotation
		return "", err
	}
	_, base, err := call()
	if err != nil {
		return "", err
	}
	before, oldID, handoffs := experimental.Rotations(st.sess), currentSandbox(st.sess), st.provider.handoffCount()
	// The provider that made the sandbox decides (an E2B one, even in a list, restores).
	canHandOff := sandbox.CanHandoff(st.provider, live)
	st.provider.ageCurrent(cfg.MaxLifetime)
	left := min(cfg.KeepaliveMargin/2, 30*time.Second)
	if err := live.SetTimeout(ctx, left); err != nil {
		return "", fmt.Errorf("setting the sandbox's timeout: %w", err)
	}
	res, took, err := call()
	if err != nil {
		return "", err
	}
	after := experimental.Rotations(st.sess)
	how := "restored from the snapshot (the provider cannot hand a workspace over)"
	handedOff := st.provider.handoffCount() > handoffs
	if handedOff {
		how = "moved by handoff: the workspace passed to the new sandbox as it was, nothing copied"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "sandbox %s made to look %s old (session.max_lifetime), so it cannot be extended,\n", oldID, cfg.MaxLifetime)
	fmt.Fprintf(&b, "and set to end in %s (inside session.keepalive_margin, %s)\n", left, cfg.KeepaliveMargin)
	fmt.Fprintf(&b, "rotations: %d -> %d; sandbox %s -> %s; the work %s\n", before, after, oldID, currentSandbox(st.sess), how)
	fmt.Fprintf(&b, "the next call: ok in %s; the same call before took %s: a pause of about %s\n",
		ms(took), ms(base), ms(max(took-base, 0)))
	b.WriteString("its output, from the new sandbox:\n")
	b.WriteString(resultText(res))
	switch {
	case after <= before:
		return b.String(), errors.New("the session did not rotate")
	case !handedOff && canHandOff:
		return b.String(), errors.New("the rotation restored the snapshot although the provider can hand the workspace over (the log says why)")
	}
	return b.String(), nil
}

// wakeStep opens a second session for the project: a new sandbox, restored from the
// newest snapshot (the rotation's).
func wakeStep(ctx context.Context, st *demoState) (string, error) {
	c := st.cli
	t := time.Now()
	fresh, err := st.th.Open(ctx, toolhost.SessionOptions{})
	if err != nil {
		return "", err
	}
	defer c.closeSession(ctx, fresh)
	woke := time.Since(t)
	info, ok := fresh.Woke()
	if !ok {
		return "", errors.New("the new session restored nothing")
	}
	sb := experimental.Sandbox(fresh)
	var b strings.Builder
	fmt.Fprintf(&b, "sandbox %s woke in %s from %s (%s, saved %s UTC)\n", currentSandbox(fresh), ms(woke),
		info.Key, humanBytes(info.Size), info.Time.UTC().Format(timeLayout))
	list, err := listArchive(ctx, sb, c.cfg.Snapshot.Excludes)
	if err != nil {
		return b.String(), err
	}
	b.WriteString(list)
	page, err := sb.ReadFile(ctx, demoPageDir+"/index.html", 1<<20)
	if err != nil {
		return b.String(), fmt.Errorf("reading the restored page: %w", err)
	}
	if string(page) != demoPage {
		return b.String(), errors.New("the restored index.html differs from the one written")
	}
	script, err := sb.ReadFile(ctx, "src/greet.sh", 1<<20)
	if err != nil || !strings.Contains(string(script), "from the sandbox") {
		return b.String(), fmt.Errorf("the restored src/greet.sh lacks the edit (%v)", err)
	}
	b.WriteString("index.html and the edited greet.sh came back byte for byte")
	return b.String(), nil
}

// listArchive lists the files a snapshot of sb would hold, with their sizes.
func listArchive(ctx context.Context, sb sandbox.Sandbox, excludes []string) (string, error) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(sb.Archive(ctx, pw, excludes)) }()
	defer pr.Close()
	zr, err := gzip.NewReader(pr)
	if err != nil {
		return "", fmt.Errorf("archive: %w", err)
	}
	tr := tar.NewReader(zr)
	var b strings.Builder
	fmt.Fprintf(&b, "%s:\n", sandbox.WorkspaceRoot)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return b.String(), fmt.Errorf("archive: %w", err)
		}
		if h.Typeflag == tar.TypeReg {
			fmt.Fprintf(&b, "  %-18s %6d bytes\n", strings.TrimPrefix(h.Name, "./"), h.Size)
		}
	}
	return b.String(), nil
}

// keepWorkspace restores the project's newest snapshot into a new directory (--keep).
func keepWorkspace(ctx context.Context, st *demoState) (string, error) {
	dir, err := os.MkdirTemp("", "toolhost-demo-")
	if err != nil {
		return "", err
	}
	if _, _, err := st.th.Storage().RestoreDir(ctx, st.cli.cfg.Project, "", dir, true); err != nil {
		os.Remove(dir)
		return "", err
	}
	return dir, nil
}

// agingProvider wraps the demo's provider so a step can make the current sandbox look
// older than it is: a stand-in for waiting out its maximum lifetime, which is what forces
// a rotation. That is all it changes. Its sandboxes implement sandbox.Wrapper, so every
// ability of the sandbox under them shows through; and it hands a workspace over exactly
// when its provider can (sandbox.Handoff), as the CLI's sessions do, wrapping the new
// sandbox in turn and counting the handoffs.
type agingProvider struct {
	sandbox.Provider
	mu       sync.Mutex
	last     *agingSandbox // the sandbox created last: the session's current one
	handoffs int
}

var (
	_ sandbox.Handoff        = (*agingProvider)(nil)
	_ sandbox.HandoffChecker = (*agingProvider)(nil)
)

// CanHandoff asks the provider under it (which sees through old, an agingSandbox).
func (p *agingProvider) CanHandoff(old sandbox.Sandbox) bool {
	return sandbox.CanHandoff(p.Provider, old)
}

func (p *agingProvider) Create(ctx context.Context, opts sandbox.CreateOptions) (sandbox.Sandbox, error) {
	sb, err := p.Provider.Create(ctx, opts)
	if err != nil {
		return nil, err
	}
	return p.wrap(sb, false), nil
}

// Handoff hands old's workspace to a new sandbox through the provider under it; old is an
// agingSandbox, which the provider sees through (sandbox.As).
func (p *agingProvider) Handoff(ctx context.Context, old sandbox.Sandbox, opts sandbox.CreateOptions) (sandbox.Sandbox, error) {
	h, ok := p.Provider.(sandbox.Handoff)
	if !ok {
		return nil, fmt.Errorf("handoff: the provider cannot hand a workspace over: %w", sandbox.ErrUnsupported)
	}
	next, err := h.Handoff(ctx, old, opts)
	if err != nil {
		return nil, err
	}
	return p.wrap(next, true), nil
}

func (p *agingProvider) wrap(sb sandbox.Sandbox, handoff bool) *agingSandbox {
	a := &agingSandbox{Sandbox: sb}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last = a
	if handoff {
		p.handoffs++
	}
	return a
}

func (p *agingProvider) handoffCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.handoffs
}

// ageCurrent moves the current sandbox's start back by d.
func (p *agingProvider) ageCurrent(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last != nil {
		p.last.age.Store(int64(d))
	}
}

type agingSandbox struct {
	sandbox.Sandbox
	age atomic.Int64 // how much older than it is the sandbox claims to be
}

var _ sandbox.Wrapper = (*agingSandbox)(nil)

func (s *agingSandbox) StartedAt() time.Time {
	return s.Sandbox.StartedAt().Add(-time.Duration(s.age.Load()))
}

// Unwrap is the sandbox under the disguise: its abilities are the ones that count.
func (s *agingSandbox) Unwrap() sandbox.Sandbox { return s.Sandbox }

// currentSandbox names the sandbox a session's tools act in at the moment.
func currentSandbox(s *toolhost.Session) string {
	if w, ok := experimental.Sandbox(s).(sandbox.Wrapper); ok {
		if sb := w.Unwrap(); sb != nil {
			return sb.ID()
		}
	}
	return "?"
}
