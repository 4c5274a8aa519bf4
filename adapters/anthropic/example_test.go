package anthropic_test

import (
	"context"
	"fmt"
	"log"

	"github.com/anthropics/anthropic-sdk-go"

	"github.com/toolhost/toolhost"
	toolanthropic "github.com/toolhost/toolhost/adapters/anthropic"
)

// An agent loop: the session's tools go to the model, and while it stops to ask for tools
// their tool_use blocks run in the sandbox and go back as tool_result blocks. The client
// reads ANTHROPIC_API_KEY; examples/agent-loop is this as a program, and
// TestAgentLoopAgainstFakeMessagesAPI runs it against a fake of the API.
func Example() {
	ctx := context.Background()
	th, err := toolhost.New(ctx, toolhost.DefaultConfig())
	if err != nil {
		log.Fatal(err)
	}
	defer th.Close(ctx)
	sess, err := th.Open(ctx, toolhost.SessionOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer sess.Close(ctx)

	tools, err := toolanthropic.Tools(sess.Tools())
	if err != nil {
		log.Fatal(err)
	}
	client := anthropic.NewClient()
	msgs := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(
		"Write a page that says hello, serve it on port 8000 and check how it looks."))}
	for {
		msg, err := client.Messages.New(ctx, anthropic.MessageNewParams{
			Model: anthropic.ModelClaudeSonnet5_5, MaxTokens: 4096, Messages: msgs, Tools: tools})
		if err != nil {
			log.Fatal(err)
		}
		msgs = append(msgs, msg.ToParam())
		if msg.StopReason != anthropic.StopReasonToolUse {
			for _, b := range msg.Content {
				if b.Type == "text" {
					fmt.Println(b.Text)
				}
			}
			return
		}
		results, _, err := toolanthropic.ToolResults(ctx, sess, msg.Content)
		if err != nil {
			log.Print(err) // the model sees these failures as is_error results
		}
		msgs = append(msgs, results)
	}
}
