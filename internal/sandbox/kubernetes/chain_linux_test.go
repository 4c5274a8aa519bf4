//go:build linux

package kubernetes

import (
	"context"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/sandbox/local"
	"github.com/toolhost/toolhost/internal/testenv"
)

// The local provider builds on Linux alone: the chain's test is Linux's.

// TestChainFallsBackToLocal: sandbox.provider: kubernetes,local with a cluster that
// cannot be reached gives a local sandbox.
func TestChainFallsBackToLocal(t *testing.T) {
	testenv.NeedBwrap(t)
	kp, err := New(Config{Kubeconfig: deadKubeconfig(t), Image: "toolhost.local/agent:1", NetworkPolicy: true, RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lp, err := local.New(local.Config{RunDir: testenv.RunDir(t), MaxLifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lp.Close(context.Background()) })
	chain := sandbox.NewChain(nil, sandbox.Named{Name: "kubernetes", Provider: kp}, sandbox.Named{Name: "local", Provider: lp})
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	sb, err := chain.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		t.Fatalf("kubernetes,local with the cluster unreachable: %v", err)
	}
	defer sb.Close(ctx)
	if _, ok := sandbox.As[*local.Sandbox](sb); !ok {
		t.Errorf("the chain's sandbox is a %T, want the local provider's", sb)
	}
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"echo", "local"}})
	if err != nil || string(res.Stdout) != "local\n" {
		t.Errorf("a command in the sandbox the chain fell back to: %q %v", res.Stdout, err)
	}
}
