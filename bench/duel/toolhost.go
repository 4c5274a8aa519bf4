package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/host"
)

// toolhostRT is toolhost's host with the duel plugin, and a session over an in-memory
// sandbox.
type toolhostRT struct {
	cfg  host.Config
	h    *host.Host
	s    *host.Dispatcher
	sb   sandbox.Sandbox
	ins  map[string]json.RawMessage
	tool map[string]string
}

func newToolhost(ctx context.Context, dir string, wasm []byte, sb sandbox.Sandbox) (*toolhostRT, error) {
	cfg := host.Config{
		DataDir: dir,
		Logger:  slog.New(slog.DiscardHandler),
		Plugins: []host.PluginSpec{{Path: "duel.wasm", Wasm: wasm, Grants: []abi.Capability{abi.CapSandboxFiles}}},
	}
	h, err := host.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	rt := &toolhostRT{cfg: cfg, h: h, s: h.OpenSession(sb), sb: sb, ins: map[string]json.RawMessage{},
		tool: map[string]string{"noop": "noop", "read4k": "read", "echo64k": "echo"}}
	for c := range rt.tool {
		rt.ins[c] = json.RawMessage(inputOf(c))
	}
	return rt, nil
}

func (rt *toolhostRT) call(ctx context.Context, c string) (string, error) {
	res, err := rt.s.Dispatch(ctx, rt.tool[c], rt.ins[c])
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, block := range res.Content {
		b.WriteString(block.Text)
	}
	if res.IsError {
		return "", fmt.Errorf("tool error: %s", b.String())
	}
	return b.String(), nil
}

func (rt *toolhostRT) load(ctx context.Context) error {
	h, err := host.New(ctx, rt.cfg)
	if err != nil {
		return err
	}
	defer h.Close(ctx)
	res, err := h.OpenSession(rt.sb).Dispatch(ctx, "noop", json.RawMessage(`{}`))
	if err == nil && res.IsError {
		err = fmt.Errorf("tool error: %v", res.Content)
	}
	return err
}

func (rt *toolhostRT) close(ctx context.Context) { rt.h.Close(ctx) }
