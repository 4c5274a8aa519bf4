package kitconform

import (
	"context"
	"testing"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/sandbox/local"
	"github.com/toolhost/toolhost/internal/testenv"
)

// newSandbox is a local (bubblewrap) sandbox over a fresh workspace directory.
func newSandbox(t *testing.T) (sandbox.Sandbox, string) {
	t.Helper()
	testenv.NeedBwrap(t)
	p, err := local.New(local.Config{RunDir: testenv.RunDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	ws := t.TempDir()
	sb, err := p.Create(context.Background(), sandbox.CreateOptions{Workspace: ws})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	return sb, ws
}
