package openai_test

import (
	"context"
	"fmt"
	"log"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/toolhost/toolhost"
	toolopenai "github.com/toolhost/toolhost/adapters/openai"
)

// An agent loop with the Responses API: the session's tools go to the model, and while it
// calls functions they run in the sandbox and their outputs go back, chained to the
// response with previous_response_id. The client reads OPENAI_API_KEY;
// TestAgentLoopResponses runs this loop against a fake of the API.
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

	tools, err := toolopenai.ResponseTools(sess.Tools())
	if err != nil {
		log.Fatal(err)
	}
	client := openai.NewClient()
	params := responses.ResponseNewParams{Model: openai.ChatModelGPT5_5, Tools: tools,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(
			"Write a page that says hello, serve it on port 8000 and check how it looks.")}}
	for {
		resp, err := client.Responses.New(ctx, params)
		if err != nil {
			log.Fatal(err)
		}
		outputs, n, err := toolopenai.FunctionCallOutputs(ctx, sess, resp.Output)
		if err != nil {
			log.Print(err) // the model sees these failures as error outputs
		}
		if n == 0 {
			fmt.Println(resp.OutputText())
			return
		}
		params.PreviousResponseID = openai.String(resp.ID)
		params.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: outputs}
	}
}

// The same loop with Chat Completions: the assistant message goes into the history, then
// the tool messages answering its tool calls (and a user message with their images).
func Example_chatCompletions() {
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

	tools, err := toolopenai.ChatTools(sess.Tools())
	if err != nil {
		log.Fatal(err)
	}
	client := openai.NewClient()
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage(
		"Write a page that says hello, serve it on port 8000 and check how it looks.")}
	for {
		comp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: openai.ChatModelGPT5_5, Messages: msgs, Tools: tools})
		if err != nil {
			log.Fatal(err)
		}
		msg := comp.Choices[0].Message
		msgs = append(msgs, msg.ToParam())
		answers, n, err := toolopenai.ToolMessages(ctx, sess, msg)
		if err != nil {
			log.Print(err)
		}
		if n == 0 {
			fmt.Println(msg.Content)
			return
		}
		msgs = append(msgs, answers...)
	}
}
