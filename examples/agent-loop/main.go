// Command agent-loop is a small, complete coding agent: Claude through the Messages API,
// toolhost's tools in a sandbox, and the loop between them. It sends the task and the
// session's tools to the model, runs the tool_use blocks of each answer in the sandbox
// and sends their tool_result blocks back (screenshots as images), as long as the model
// stops to ask for tools; then it prints the model's final text and commits a snapshot
// of the project's workspace, so the next run wakes where this one ended.
//
//	export ANTHROPIC_API_KEY=sk-ant-...
//	go run ./examples/agent-loop -project hello \
//	    -task 'Write a page that says hello, serve it on port 8000 and check how it looks.'
//
// It needs what a toolhost session needs (bubblewrap; Chromium for take_screenshot: make
// setup installs both), and uses the default configuration: the built-in plugins, the
// local sandbox, the store under ~/.local/share/toolhost.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/anthropics/anthropic-sdk-go"

	"github.com/toolhost/toolhost"
	toolanthropic "github.com/toolhost/toolhost/adapters/anthropic"
	_ "github.com/toolhost/toolhost/modules/standard" // the built-in providers and stores
)

const defaultTask = "Write a page that says hello, serve it on port 8000 and check how it looks."

func main() {
	toolhost.Reexec() // first: the sandbox's agent and the browser's wrapper are this program, re-executed
	task := flag.String("task", defaultTask, "what the agent is asked to do")
	model := flag.String("model", string(anthropic.ModelClaudeSonnet5_5), "the Claude model")
	project := flag.String("project", "agent-loop", "the toolhost project (its snapshots and screenshots)")
	maxTurns := flag.Int("max-turns", 30, "the most requests to the model")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *task, *model, *project, *maxTurns, log); err != nil {
		fmt.Fprintln(os.Stderr, "agent-loop:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, task, model, project string, maxTurns int, log *slog.Logger) error {
	if os.Getenv("ANTHROPIC_API_KEY") == "" && os.Getenv("ANTHROPIC_AUTH_TOKEN") == "" {
		return errors.New("set ANTHROPIC_API_KEY to a Messages API key")
	}
	cfg := toolhost.DefaultConfig()
	cfg.Project = project
	// Saving and closing happen even after an interrupt, within their own bounds.
	after := func(d time.Duration) (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), d)
	}
	th, err := toolhost.New(ctx, cfg, toolhost.WithLogger(log))
	if err != nil {
		return fmt.Errorf("starting toolhost: %w", err)
	}
	defer func() {
		cctx, cancel := after(30 * time.Second)
		defer cancel()
		th.Close(cctx)
	}()
	sess, err := th.Open(ctx, toolhost.SessionOptions{})
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := after(30 * time.Second)
		defer cancel()
		sess.Close(cctx)
	}()
	tools, err := toolanthropic.Tools(sess.Tools())
	if err != nil {
		return err
	}
	// The client reads ANTHROPIC_API_KEY (and ANTHROPIC_BASE_URL) from the environment.
	client := anthropic.NewClient()
	_, loopErr := agent(ctx, client, sess, tools, model, task, maxTurns, os.Stdout, log)
	// The work is kept even when the loop failed half-way.
	cctx, cancel := after(5 * time.Minute)
	defer cancel()
	info, err := sess.Commit(cctx, "agent-loop: "+firstLine(task))
	if err != nil {
		return errors.Join(loopErr, fmt.Errorf("committing the workspace: %w", err))
	}
	fmt.Fprintf(os.Stderr, "agent-loop: committed project %s as %s\n", sess.Project(), info.Key)
	return loopErr
}

// agent is the loop: it asks the model, and while the model stops for tools it runs them
// through d and answers with their results. It prints the model's text as it comes (the
// last of it is the final answer) and the tools it calls, and returns the final text.
func agent(ctx context.Context, client anthropic.Client, d toolanthropic.Dispatcher, tools []anthropic.ToolUnionParam,
	model, task string, maxTurns int, out io.Writer, log *slog.Logger) (string, error) {
	msgs := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(task))}
	for turn := 1; turn <= maxTurns; turn++ {
		msg, err := client.Messages.New(ctx, anthropic.MessageNewParams{
			Model: model, MaxTokens: 8192, Messages: msgs, Tools: tools})
		if err != nil {
			return "", fmt.Errorf("asking the model (turn %d): %w", turn, err)
		}
		msgs = append(msgs, msg.ToParam())
		var text strings.Builder
		for _, b := range msg.Content {
			switch b.Type {
			case "text":
				text.WriteString(b.Text)
			case "tool_use":
				fmt.Fprintf(out, "→ %s %s\n", b.Name, clip(string(b.Input), 120))
			}
		}
		if text.Len() > 0 {
			fmt.Fprintln(out, text.String())
		}
		switch msg.StopReason {
		case anthropic.StopReasonToolUse:
			results, n, err := toolanthropic.ToolResults(ctx, d, msg.Content)
			if err != nil {
				// The model has them as is_error results; a cancelled run stops here.
				log.Warn("a tool call failed in the host", "err", err)
				if ctx.Err() != nil {
					return "", ctx.Err()
				}
			}
			if n == 0 {
				return "", fmt.Errorf("turn %d: the model stopped for tools but asked for none", turn)
			}
			msgs = append(msgs, results)
		case anthropic.StopReasonPauseTurn:
			// A long server-side turn paused: sending it back lets the model go on.
		case anthropic.StopReasonEndTurn, anthropic.StopReasonStopSequence:
			return text.String(), nil
		default: // max_tokens, refusal, model_context_window_exceeded
			return text.String(), fmt.Errorf("the model stopped: %s", msg.StopReason)
		}
	}
	return "", fmt.Errorf("the model still asked for tools after %d turns (-max-turns)", maxTurns)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return clip(s, 60)
}

func clip(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}
