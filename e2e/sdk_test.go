//go:build linux

package e2e

import (
	"context"
	"fmt"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
)

// sdkCall makes one request with an official SDK, configured only from the
// environment (inside the sandbox: what moat set).
func sdkCall(kind, model string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	switch kind {
	case "sdk-anthropic":
		c := anthropic.NewClient()
		m, err := c.Messages.New(ctx, anthropic.MessageNewParams{
			Model: anthropic.Model(model), MaxTokens: 64,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello from the sandbox"))},
		})
		if err != nil {
			return "", err
		}
		if len(m.Content) == 0 {
			return "", fmt.Errorf("empty message")
		}
		return m.Content[0].Text, nil
	case "sdk-anthropic-stream":
		c := anthropic.NewClient()
		st := c.Messages.NewStreaming(ctx, anthropic.MessageNewParams{
			Model: anthropic.Model(model), MaxTokens: 64,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("stream please"))},
		})
		var acc anthropic.Message
		for st.Next() {
			if err := acc.Accumulate(st.Current()); err != nil {
				return "", err
			}
		}
		if err := st.Err(); err != nil {
			return "", err
		}
		if len(acc.Content) == 0 {
			return "", fmt.Errorf("empty stream")
		}
		return acc.Content[0].Text, nil
	case "sdk-openai-chat":
		c := openai.NewClient()
		cc, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    model,
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello from the sandbox")},
		})
		if err != nil {
			return "", err
		}
		if len(cc.Choices) == 0 {
			return "", fmt.Errorf("no choices")
		}
		return cc.Choices[0].Message.Content, nil
	case "sdk-openai-responses":
		c := openai.NewClient()
		r, err := c.Responses.New(ctx, responses.ResponseNewParams{
			Model: model,
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello from the sandbox")},
		})
		if err != nil {
			return "", err
		}
		return r.OutputText(), nil
	}
	return "", fmt.Errorf("unknown SDK call %q", kind)
}
