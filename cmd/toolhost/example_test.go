package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/sandbox/local"
	"github.com/toolhost/toolhost/host"
)

// Example_embedding is the library example of README.md; keep the two in step. It is
// compiled by go test (so the README's code builds) but not run.
func Example_embedding() {
	ctx := context.Background()

	h, err := host.New(ctx, host.Config{
		Plugins: []host.PluginSpec{
			{Path: "bin/plugins/bash.wasm", Grants: []abi.Capability{abi.CapSandboxExec, abi.CapLog}},
			{Path: "bin/plugins/editfile.wasm", Grants: []abi.Capability{abi.CapSandboxFiles, abi.CapLog}},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close(ctx)

	provider, err := local.New(local.Config{})
	if err != nil {
		log.Fatal(err) // e.g. bubblewrap is not installed
	}
	sb, err := provider.Create(ctx, sandbox.CreateOptions{Workspace: "/path/to/project"})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Close(ctx)

	session := h.OpenSession(sb)
	res, err := session.Dispatch(ctx, "bash", json.RawMessage(`{"command": "ls -la"}`))
	if err != nil {
		log.Fatal(err) // the host could not run the tool; tool failures are res.IsError
	}
	fmt.Println(res.IsError, res.Content[0].Text)
}
