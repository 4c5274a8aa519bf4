package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/option"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
	toolanthropic "github.com/toolhost/toolhost/adapters/anthropic"
	"github.com/toolhost/toolhost/internal/fakemessages"
	"github.com/toolhost/toolhost/internal/screenshot"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testplugins"
)

var quiet = slog.New(slog.DiscardHandler)

func fakeClient(api *fakemessages.Server) anthropic.Client {
	return anthropic.NewClient(option.WithoutEnvironmentDefaults(), option.WithBaseURL(api.URL),
		option.WithAPIKey(fakemessages.Key), option.WithMaxRetries(0))
}

// The example's loop with a real sandbox and Chromium against the fake Messages API's
// scripted conversation (write a page, serve it, screenshot it, answer): the fake fails
// the test on a request without the right tool_result blocks.
func TestAgentAgainstFakeMessagesAPI(t *testing.T) {
	testenv.NeedBwrap(t)
	testenv.Require(t, "Chromium and the Playwright driver (scripts/setup-browser.sh; make test runs it)",
		screenshot.New(screenshot.Config{}).Check())
	_, err := os.Stat("/usr/bin/python3")
	testenv.Require(t, "python3 for the sandbox's web server (make setup installs it)", err)

	// A bound against a hang, not a timing: a first call may compile its plugin, which
	// takes minutes under -race on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cfg := toolhost.DefaultConfig()
	cfg.DataDir = testplugins.DataDir()
	if err := cfg.Set("store.dir", t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Set("sandbox.run_dir", testenv.RunDir(t)); err != nil {
		t.Fatal(err)
	}
	cfg.Project = "agent-loop"
	th, err := toolhost.New(ctx, cfg, toolhost.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer th.Close(context.Background())
	sess, err := th.Open(ctx, toolhost.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(context.Background())
	tools, err := toolanthropic.Tools(sess.Tools())
	if err != nil {
		t.Fatal(err)
	}

	api := fakemessages.New(t, fakemessages.PageConversation()...)
	var out bytes.Buffer
	final, err := agent(ctx, fakeClient(api), sess, tools, "claude-fake", defaultTask, 10, &out, quiet)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if final != fakemessages.FinalText {
		t.Errorf("final text %q, want %q", final, fakemessages.FinalText)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var calls []string
	for _, l := range lines {
		if name, ok := strings.CutPrefix(l, "→ "); ok {
			calls = append(calls, strings.Fields(name)[0])
		}
	}
	if want := "write_file bash bash take_screenshot read_file"; strings.Join(calls, " ") != want {
		t.Errorf("printed calls %v, want %s\n%s", calls, want, out.String())
	}
	if last := lines[len(lines)-1]; last != fakemessages.FinalText {
		t.Errorf("last line printed %q, want the final text", last)
	}
}

// stub answers every call with a text, without a sandbox.
type stub struct{ calls int }

func (s *stub) Dispatch(ctx context.Context, tool string, input json.RawMessage) (abi.Result, error) {
	s.calls++
	return abi.Text("ok"), nil
}

func asksForGlob(id string) fakemessages.Turn {
	return fakemessages.Turn{
		Content:    []fakemessages.Block{{Type: "tool_use", ID: id, Name: "glob", Input: json.RawMessage(`{"pattern": "*"}`)}},
		StopReason: "tool_use",
	}
}

func TestAgentStopsAtMaxTurns(t *testing.T) {
	api := fakemessages.New(t, asksForGlob("toolu_1"), asksForGlob("toolu_2"))
	d := &stub{}
	_, err := agent(context.Background(), fakeClient(api), d, nil, "claude-fake", "loop", 2, &bytes.Buffer{}, quiet)
	if err == nil || !strings.Contains(err.Error(), "-max-turns") {
		t.Errorf("error %v, want one naming -max-turns", err)
	}
	if d.calls != 2 {
		t.Errorf("%d tool calls, want 2", d.calls)
	}
}

func TestAgentReportsOtherStopReasons(t *testing.T) {
	api := fakemessages.New(t, asksForGlob("toolu_1"), fakemessages.Turn{
		Content: []fakemessages.Block{{Type: "text", Text: "I can't."}}, StopReason: "refusal"})
	final, err := agent(context.Background(), fakeClient(api), &stub{}, nil, "claude-fake", "x", 5, &bytes.Buffer{}, quiet)
	if err == nil || !strings.Contains(err.Error(), "refusal") || final != "I can't." {
		t.Errorf("final %q, error %v; want the text and an error naming refusal", final, err)
	}
}

func TestRunNeedsAKey(t *testing.T) {
	t.Setenv("ANTHROPIC_API_KEY", "")
	t.Setenv("ANTHROPIC_AUTH_TOKEN", "")
	err := run(context.Background(), "x", "m", "p", 1, quiet)
	if err == nil || !strings.Contains(err.Error(), "ANTHROPIC_API_KEY") {
		t.Errorf("error %v, want one asking for ANTHROPIC_API_KEY", err)
	}
}
