package anthropic_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/option"

	"github.com/toolhost/toolhost"
	toolanthropic "github.com/toolhost/toolhost/adapters/anthropic"
	"github.com/toolhost/toolhost/internal/fakemessages"
	"github.com/toolhost/toolhost/internal/screenshot"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testplugins"
)

func quiet() toolhost.Option { return toolhost.WithLogger(slog.New(slog.DiscardHandler)) }

// The loop of the package doc, run with a real sandbox and Chromium against the fake
// Messages API's scripted conversation: write a page, serve it in the background, take its
// screenshot beside a failing read, answer. The fake fails the test on any request that
// does not carry the right tool_result blocks (ids in order, is_error, WebP images).
func TestAgentLoopAgainstFakeMessagesAPI(t *testing.T) {
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
	cfg.Project = "agent"
	th, err := toolhost.New(ctx, cfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer th.Close(context.Background())
	sess, err := th.Open(ctx, toolhost.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(context.Background())

	api := fakemessages.New(t, fakemessages.PageConversation()...)
	client := anthropic.NewClient(option.WithoutEnvironmentDefaults(), option.WithBaseURL(api.URL),
		option.WithAPIKey(fakemessages.Key), option.WithMaxRetries(0))

	tools, err := toolanthropic.Tools(sess.Tools())
	if err != nil {
		t.Fatal(err)
	}
	msgs := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(
		"Write a page that says hello, serve it on port 8000 and check how it looks."))}
	var final string
	for turn := 0; ; turn++ {
		if turn == 10 {
			t.Fatal("still asking for tools after 10 turns")
		}
		msg, err := client.Messages.New(ctx, anthropic.MessageNewParams{
			Model: "claude-fake", MaxTokens: 1024, Messages: msgs, Tools: tools})
		if err != nil {
			t.Fatalf("turn %d: %v", turn+1, err)
		}
		msgs = append(msgs, msg.ToParam())
		if msg.StopReason != anthropic.StopReasonToolUse {
			for _, b := range msg.Content {
				if b.Type == "text" {
					final += b.Text
				}
			}
			break
		}
		results, n, err := toolanthropic.ToolResults(ctx, sess, msg.Content)
		if err != nil {
			t.Fatalf("turn %d: the host could not run a tool: %v", turn+1, err)
		}
		if n == 0 {
			t.Fatalf("turn %d: stop_reason tool_use without a tool_use block", turn+1)
		}
		msgs = append(msgs, results)
	}
	if final != fakemessages.FinalText {
		t.Errorf("final text %q, want %q", final, fakemessages.FinalText)
	}
	if p := api.Played(); p != 4 {
		t.Errorf("%d requests, want 4", p)
	}
	// The page the model had written is in the workspace.
	got, err := sess.Dispatch(ctx, "read_file", []byte(`{"path": "site/index.html"}`))
	if err != nil || got.IsError || !strings.Contains(got.Content[0].Text, fakemessages.PageHeading) {
		t.Errorf("site/index.html after the loop: %+v, %v", got, err)
	}
}
