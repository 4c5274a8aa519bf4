//go:build linux

package toolhost

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/lease"
	"github.com/toolhost/toolhost/internal/sandbox/e2b"
	"github.com/toolhost/toolhost/internal/sandbox/e2b/e2bfake"
	"github.com/toolhost/toolhost/internal/session"
	"github.com/toolhost/toolhost/internal/sessionstate"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testplugins"
)

// A dead replica loses nothing an E2B sandbox still holds: the tests below run a holder
// process (this test binary again, TestTakeoverHolder), let it work on a project, kill it
// with SIGKILL, and open the project in this process once the holder's lease expired.

// holderSpec is what the holder process is told to do.
type holderSpec struct {
	Store, DataDir, RunDir string
	Provider               string
	E2B                    map[string]string // e2b.* keys
	Project                string
	Autosave               time.Duration
	Steps                  []holderStep
	// Second, when set, are the steps of a second session of the project, opened after
	// the first ran its steps (the sessions of one process share the lease).
	Second []holderStep
}

// holderStep is a tool call, a commit, or a wait for an autosave newer than the last step.
type holderStep struct {
	Tool, Input string
	Commit      string
	Autosaved   bool
}

// holderReport is the line the holder prints once its steps ran and its record says so.
type holderReport struct {
	Sandbox, Sandbox2 string
	Results, Results2 []string
}

const holderEnv = "TOOLHOST_TEST_HOLDER"

// holderConfig is the configuration of both processes: one store, short leases.
func (h holderSpec) config(t testing.TB) Config {
	cfg := DefaultConfig()
	cfg.DataDir = h.DataDir
	cfg.Project = h.Project
	cfg.Sandbox.Provider = h.Provider
	cfg.Lease.TTL, cfg.Lease.Renew = 2*time.Second, 500*time.Millisecond
	cfg.Session.Autosave = h.Autosave
	for k, v := range map[string]any{"store.dir": h.Store, "sandbox.run_dir": h.RunDir} {
		if err := cfg.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	for k, v := range h.E2B {
		var val any = v
		if k == "e2b.api_key" {
			val = Secret(v)
		}
		if err := cfg.Set(k, val); err != nil {
			t.Fatal(err)
		}
	}
	return cfg
}

// TestTakeoverHolder is not a test of its own: it is the holder process the takeover tests
// start and kill. Without TOOLHOST_TEST_HOLDER it does nothing.
func TestTakeoverHolder(t *testing.T) {
	raw := os.Getenv(holderEnv)
	if raw == "" {
		return
	}
	var h holderSpec
	if err := json.Unmarshal([]byte(raw), &h); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	th, err := New(ctx, h.config(t), WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))))
	if err != nil {
		t.Fatal(err)
	}
	run := func(steps []holderStep) (*Session, []string) {
		s, err := th.Open(ctx, SessionOptions{Project: h.Project})
		if err != nil {
			t.Fatal(err)
		}
		var results []string
		// An autosave waited for must have begun after the step before it began (its
		// checkpoint's time is its start, which may come before that step returns).
		var last time.Time
		for _, st := range steps {
			started := time.Now()
			switch {
			case st.Tool != "":
				res, err := s.Dispatch(ctx, st.Tool, json.RawMessage(st.Input))
				if err != nil || res.IsError {
					t.Fatalf("%s %s: %v %+v", st.Tool, st.Input, err, res)
				}
				results = append(results, testenv.ResultText(res))
			case st.Commit != "":
				if _, err := s.Commit(ctx, st.Commit); err != nil {
					t.Fatal(err)
				}
			case st.Autosaved:
				testenv.WaitFor(t, "an autosave after the last step", func() bool {
					cps, err := s.Checkpoints(ctx)
					return err == nil && len(cps) > 0 && cps[0].Label == "autosave" && cps[0].Time.After(last)
				})
			}
			last = started
		}
		// The record is written off the calls' path: wait until it says what the session
		// knows.
		testenv.WaitFor(t, "the session's record to follow the session", func() bool {
			rec, ok, err := sessionstate.Read(ctx, th.recordStore(), h.Project, s.id)
			return err == nil && ok && sessionstate.Same(rec, s.record())
		})
		return s, results
	}
	var rep holderReport
	s, results := run(h.Steps)
	rep.Sandbox, rep.Results = s.live.SandboxID(), results
	if h.Second != nil {
		s2, results := run(h.Second)
		rep.Sandbox2, rep.Results2 = s2.live.SandboxID(), results
	}
	b, _ := json.Marshal(rep)
	fmt.Printf("READY %s\n", b)
	select {} // until the test kills this process
}

// runHolder starts the holder, waits for its report and kills it with SIGKILL: no Close,
// no release of the lease, no last record.
func runHolder(t *testing.T, h holderSpec) holderReport {
	t.Helper()
	spec, _ := json.Marshal(h)
	cmd := exec.Command(os.Args[0], "-test.run=^TestTakeoverHolder$", "-test.count=1")
	cmd.Env = append(os.Environ(), holderEnv+"="+string(spec))
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	kill := func() {
		if !killed {
			killed = true
			cmd.Process.Kill() // SIGKILL
			cmd.Wait()
		}
	}
	t.Cleanup(kill)
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
				lines <- rest
				break
			}
		}
		io.Copy(io.Discard, out)
		close(lines)
	}()
	var line string
	select {
	case line = <-lines:
	case <-time.After(testenv.HangBound):
	}
	if line == "" {
		kill()
		t.Fatalf("the holder did not get ready:\n%s", stderr.String())
	}
	var rep holderReport
	if err := json.Unmarshal([]byte(line), &rep); err != nil {
		t.Fatal(err)
	}
	kill()
	t.Logf("holder killed (SIGKILL) with sandbox %s", rep.Sandbox)
	return rep
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// openAfterExpiry opens the project once the dead holder's lease expired.
func openAfterExpiry(t *testing.T, th *Toolhost, project string) *Session {
	t.Helper()
	var s *Session
	var err error
	testenv.WaitFor(t, "the dead holder's lease to expire", func() bool {
		s, err = th.Open(context.Background(), SessionOptions{Project: project})
		if errors.Is(err, lease.ErrHeld) {
			return false
		}
		if err != nil {
			t.Fatalf("open after the holder died: %v", err)
		}
		return true
	})
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

// previewServes reports whether the session's preview of port serves want.
func previewServes(t *testing.T, s *Session, port int, want string) bool {
	ctx := context.Background()
	client := &http.Client{Timeout: 10 * time.Second}
	var body string
	ok := testenv.Eventually(func() bool {
		u, err := s.live.PreviewURL(ctx, port)
		if err != nil {
			return false
		}
		resp, err := client.Get(u.JoinPath("index.html").String())
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == http.StatusOK
	})
	if !ok || body != want {
		t.Logf("the preview of port %d served %q", port, body)
		return false
	}
	return true
}

// TestTakeoverE2B: a holder process opens a project on (the fake) E2B, writes a file it
// does not commit, moves the shell into a directory and starts a web server there in the
// background, and is killed with SIGKILL. Once its lease expired, a Toolhost here opens the
// project: it reconnects to the same sandbox (the fake creates none), the file is there,
// the server still answers, the shell is where it was, and the session knows the server
// again (bash_output reads its log; the first result says it took over).
func TestTakeoverE2B(t *testing.T) {
	testenv.NeedBwrap(t)
	f := e2bfake.Start(t, e2bfake.Config{Logger: slog.New(slog.DiscardHandler)})
	base := e2bConfig(t, "e2b", f) // clears the SDK's variables, links the compilation cache
	h := holderSpec{
		Store: t.TempDir(), DataDir: base.DataDir, RunDir: testenv.RunDir(t), Provider: "e2b", Project: "shop",
		E2B: map[string]string{"e2b.api_key": f.APIKey(), "e2b.domain": f.Domain(), "e2b.api_url": f.URL(), "e2b.sandbox_url": f.URL()},
		Steps: []holderStep{
			{Tool: "write_file", Input: `{"path":"notes.txt","content":"written, never committed\n"}`},
			{Tool: "bash", Input: `{"command":"mkdir -p web && cd web && echo '<h1>still here</h1>' > index.html"}`},
			{Tool: "bash", Input: `{"command":"python3 -m http.server 8000","background":true}`},
			{Tool: "write_file", Input: `{"path":"draft.txt","content":"first draft\n"}`},
		},
	}
	rep := runHolder(t, h)
	bgID := between(rep.Results[2], "id ", ",")
	if bgID == "" {
		t.Fatalf("no background id in %q", rep.Results[2])
	}
	created := f.Created()

	th := newToolhost(t, h.config(t))
	s := openAfterExpiry(t, th, "shop")
	if got := s.live.SandboxID(); got != rep.Sandbox {
		t.Errorf("the session runs in sandbox %s, want the holder's %s", got, rep.Sandbox)
	}
	if n := f.Created(); n != created {
		t.Errorf("the fake created %d sandboxes for the takeover, want none", n-created)
	}
	first := expect(t, s, "read_file", `{"path":"notes.txt"}`, false, "written, never committed",
		"took over from an earlier session", "reconnected to the same sandbox", bgID, "python3 -m http.server 8000")
	if strings.Contains(testenv.ResultText(first), "gone") {
		t.Errorf("the first result says something is gone: %q", testenv.ResultText(first))
	}
	second := expect(t, s, "bash", `{"command":"pwd"}`, false, "/home/user/web")
	if strings.Contains(testenv.ResultText(second), "took over") {
		t.Errorf("the takeover notice came twice: %q", testenv.ResultText(second))
	}
	// The plugins' session state came over too: edit_file knows the model wrote
	// draft.txt, so it edits it without asking for a read first.
	expect(t, s, "edit_file", `{"path":"draft.txt","old_string":"first","new_string":"second"}`, false)
	if !previewServes(t, s, 8000, "<h1>still here</h1>\n") {
		t.Error("the server the holder started does not answer after the takeover")
	}
	// The server wrote a line per request to its log: bash_output, the plugin's own view
	// of the process, reads it.
	expect(t, s, "bash_output", fmt.Sprintf(`{"id":%q}`, bgID), false, "GET /index.html")
	// The project's records: the new session's, naming the new holder; the dead one's
	// is gone.
	recs, bad, err := sessionstate.List(context.Background(), th.recordStore(), "shop")
	if err != nil || len(bad) != 0 || len(recs) != 1 {
		t.Fatalf("the records after the takeover: %+v %v %v", recs, bad, err)
	}
	if rec := recs[0]; rec.Session != s.id || rec.Instance != th.instance || rec.SandboxID != rep.Sandbox ||
		len(rec.Processes) != 1 || rec.Processes[0].ID != bgID || rec.Processes[0].Plugin != "bash" || rec.Cwd != "/home/user/web" {
		t.Errorf("the record after the takeover: %+v", rec)
	}
	// A session that closes leaves no record: nothing to take over; and the sandbox it
	// took over is killed with it.
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ids := f.SandboxIDs(); slices.Contains(ids, rep.Sandbox) {
		t.Errorf("the sandbox taken over is still running after the session closed: %v", ids)
	}
	if recs, _, err := sessionstate.List(context.Background(), th.recordStore(), "shop"); len(recs) != 0 || err != nil {
		t.Errorf("the records after Close: %+v, %v", recs, err)
	}
}

// TestTakeoverTwoSessions: a process dies with two sessions of one project open (an MCP
// server's two clients, say). The next process's first session takes over one, the newest;
// the other's sandbox is left alone (not an orphan: its record waits), and the second
// session takes it over. The fake creates no sandbox for either.
func TestTakeoverTwoSessions(t *testing.T) {
	testenv.NeedBwrap(t)
	f := e2bfake.Start(t, e2bfake.Config{Logger: slog.New(slog.DiscardHandler)})
	base := e2bConfig(t, "e2b", f)
	h := holderSpec{
		Store: t.TempDir(), DataDir: base.DataDir, RunDir: testenv.RunDir(t), Provider: "e2b", Project: "duo",
		E2B:    map[string]string{"e2b.api_key": f.APIKey(), "e2b.domain": f.Domain(), "e2b.api_url": f.URL(), "e2b.sandbox_url": f.URL()},
		Steps:  []holderStep{{Tool: "write_file", Input: `{"path":"who.txt","content":"first\n"}`}},
		Second: []holderStep{{Tool: "write_file", Input: `{"path":"who.txt","content":"second\n"}`}},
	}
	rep := runHolder(t, h)
	created := f.Created()
	th := newToolhost(t, h.config(t))
	a := openAfterExpiry(t, th, "duo")
	if a.live.SandboxID() != rep.Sandbox2 {
		t.Errorf("the first session took %s, want the newest record's sandbox %s", a.live.SandboxID(), rep.Sandbox2)
	}
	expect(t, a, "read_file", `{"path":"who.txt"}`, false, "second", "reconnected to the same sandbox")
	b := open(t, th, SessionOptions{Project: "duo"})
	if b.live.SandboxID() != rep.Sandbox {
		t.Errorf("the second session took %s, want the other record's sandbox %s", b.live.SandboxID(), rep.Sandbox)
	}
	expect(t, b, "read_file", `{"path":"who.txt"}`, false, "first", "reconnected to the same sandbox")
	if n := f.Created(); n != created {
		t.Errorf("the fake created %d sandboxes for the takeovers, want none", n-created)
	}
	// A third session has nothing to take over: a new sandbox, no notice.
	c := open(t, th, SessionOptions{Project: "duo"})
	res := expect(t, c, "bash", `{"command":"echo third"}`, false, "third")
	if strings.Contains(testenv.ResultText(res), "took over") || f.Created() != created+1 {
		t.Errorf("a third session: %q, %d created", testenv.ResultText(res), f.Created()-created)
	}
}

// between is the text of s after the first before and up to the next after.
func between(s, before, after string) string {
	_, rest, ok := strings.Cut(s, before)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, after)
	return v
}

// TestTakeoverLocal: on the local provider the sandbox dies with its holder. The next
// session wakes from the last commit, and its first tool result says what was lost: the
// files changed since that commit (and when it was), and the background process. With
// session.autosave, the work up to the last autosave survives.
func TestTakeoverLocal(t *testing.T) {
	testenv.NeedBwrap(t)
	dataDir := t.TempDir()
	if err := testplugins.LinkCache(dataDir); err != nil {
		t.Fatal(err)
	}
	h := holderSpec{
		Store: t.TempDir(), DataDir: dataDir, RunDir: testenv.RunDir(t), Provider: "local", Project: "desk",
		Steps: []holderStep{
			{Tool: "write_file", Input: `{"path":"committed.txt","content":"in the snapshot\n"}`},
			{Commit: "phase one"},
			{Tool: "write_file", Input: `{"path":"lost.txt","content":"after the commit\n"}`},
			{Tool: "bash", Input: `{"command":"sleep 600","background":true}`},
		},
	}
	rep := runHolder(t, h)
	bgID := between(rep.Results[2], "id ", ",")
	th := newToolhost(t, h.config(t))
	s := openAfterExpiry(t, th, "desk")
	if s.live.SandboxID() == rep.Sandbox {
		t.Fatal("the local sandbox outlived its holder")
	}
	cps, err := s.Checkpoints(context.Background())
	if err != nil || len(cps) == 0 {
		t.Fatal(cps, err)
	}
	when := cps[0].Time.UTC().Format(time.RFC3339)
	first := expect(t, s, "read_file", `{"path":"committed.txt"}`, false, "in the snapshot",
		"took over from an earlier session", "restored from the last snapshot, taken "+when, "files changed after that are gone",
		bgID, "sleep 600", "not running here")
	t.Logf("first result: %s", testenv.ResultText(first))
	expect(t, s, "read_file", `{"path":"lost.txt"}`, true)
	second := expect(t, s, "bash", `{"command":"echo on"}`, false, "on")
	if strings.Contains(testenv.ResultText(second), "took over") {
		t.Errorf("the notice came twice: %q", testenv.ResultText(second))
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	// With autosave: what the last autosave held survives the holder.
	h.Autosave = time.Second
	h.Steps = []holderStep{
		{Tool: "write_file", Input: `{"path":"autosaved.txt","content":"kept by autosave\n"}`},
		{Autosaved: true},
	}
	runHolder(t, h)
	h.Autosave = 0
	th = newToolhost(t, h.config(t))
	s = openAfterExpiry(t, th, "desk")
	expect(t, s, "read_file", `{"path":"autosaved.txt"}`, false, "kept by autosave", "restored from the last snapshot")
}

// TestTakeoverRefusesHostileRecord: a record is data from the store. One that names
// another project's sandbox never reaches it (the sandbox is neither reconnected to nor
// extended, and its own session goes on); the session starts from the project's snapshots
// and says what it could not take. The sandboxes an earlier lease epoch of the project
// left running are killed; the project's current ones and other projects' are not.
func TestTakeoverRefusesHostileRecord(t *testing.T) {
	testenv.NeedBwrap(t)
	ctx := context.Background()
	f := e2bfake.Start(t, e2bfake.Config{Logger: slog.New(slog.DiscardHandler)})
	cfg := e2bConfig(t, "e2b", f)
	th := newToolhost(t, cfg)
	victim := open(t, th, SessionOptions{Project: "victim"})
	expect(t, victim, "write_file", `{"path":"secret.txt","content":"the victim's\n"}`, false)
	vsb, ok := sandbox.As[*e2b.Sandbox](victim.live)
	if !ok {
		t.Fatalf("the victim's sandbox is %T", victim.live.Unwrap())
	}
	if err := vsb.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	victimEnd := vsb.EndsAt()

	// Sandboxes of project "shop": one an earlier epoch left (an orphan), one labelled
	// with an epoch from the future (never an earlier holder's), and another project's.
	p, err := th.Provider(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(labels map[string]string) string {
		sb, err := p.Create(ctx, sandbox.CreateOptions{Labels: labels})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sb.Close(context.Background()) })
		return sb.ID()
	}
	orphan := mk(map[string]string{session.LabelProject: "shop", session.LabelEpoch: "0"})
	future := mk(map[string]string{session.LabelProject: "shop", session.LabelEpoch: "999999"})
	other := mk(map[string]string{session.LabelProject: "elsewhere", session.LabelEpoch: "0"})

	hostile := sessionstate.Record{Project: "shop", Session: "s-evil", Provider: "e2b", SandboxID: vsb.ID(),
		Processes: []sessionstate.Process{{ID: "bg-evil", Plugin: "bash", Argv: []string{"sh", "-c", "echo \x1b[31mred"}, PID: 7, Log: "/tmp/toolhost/bg-evil.log"}},
		Epoch:     0, Instance: "i-evil", WrittenAt: time.Now()}
	if err := sessionstate.Write(ctx, th.recordStore(), hostile); err != nil {
		t.Fatal(err)
	}
	created := f.Created()
	th2 := newToolhost(t, cfg)
	s := open(t, th2, SessionOptions{Project: "shop"})
	if s.live.SandboxID() == vsb.ID() {
		t.Fatal("the session took the victim's sandbox")
	}
	if f.Created() != created+1 {
		t.Errorf("the session created %d sandboxes, want 1", f.Created()-created)
	}
	res := expect(t, s, "bash", `{"command":"cat secret.txt; echo end"}`, false, "end", "took over from an earlier session", "bg-evil", "not running here")
	if text := testenv.ResultText(res); strings.Contains(text, "the victim's") || strings.Contains(text, "\x1b") {
		t.Errorf("the session sees the victim's file, or a control character of the record: %q", text)
	}
	if err := vsb.Refresh(ctx); err != nil {
		t.Fatalf("the victim's sandbox after the hostile takeover: %v", err)
	}
	if !vsb.EndsAt().Equal(victimEnd) {
		t.Errorf("the victim's sandbox was extended: ends %s, was %s", vsb.EndsAt(), victimEnd)
	}
	expect(t, victim, "read_file", `{"path":"secret.txt"}`, false, "the victim's")

	// The listing is what keeps the victim's sandbox out of the choice above. Without it
	// (E2B cannot list now), the session tries the recorded sandbox, whose own metadata
	// names another project: refused, untouched.
	hostile.Project = "shop2"
	if err := sessionstate.Write(ctx, th.recordStore(), hostile); err != nil {
		t.Fatal(err)
	}
	f.Inject(e2bfake.Fault{On: "list", Status: 500, Message: "listing is down"})
	s2 := open(t, th2, SessionOptions{Project: "shop2"})
	if s2.live.SandboxID() == vsb.ID() {
		t.Fatal("the session took the victim's sandbox")
	}
	expect(t, s2, "bash", `{"command":"echo here"}`, false, "here", "its record named a sandbox this session may not take")
	if err := vsb.Refresh(ctx); err != nil || !vsb.EndsAt().Equal(victimEnd) {
		t.Errorf("the victim's sandbox after the second hostile record: %v, ends %s, was %s", err, vsb.EndsAt(), victimEnd)
	}

	testenv.WaitFor(t, "the orphan of an earlier epoch to be killed", func() bool { return !slices.Contains(f.SandboxIDs(), orphan) })
	for _, id := range []string{future, other, vsb.ID(), s.live.SandboxID(), s2.live.SandboxID()} {
		if !slices.Contains(f.SandboxIDs(), id) {
			t.Errorf("sandbox %s was killed; only the orphan %s should be", id, orphan)
		}
	}
}
