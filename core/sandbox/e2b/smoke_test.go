package e2b_test

import (
	"context"
	"testing"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/sandbox/e2b/e2bfake"
)

func TestSmoke(t *testing.T) {
	for _, r := range []routing{byHost, byHeader} {
		f := startFake(t, r, e2bfake.Config{})
		p := newProvider(t, providerConfig(t, f, r))
		sb := newSandbox(t, p, sandbox.CreateOptions{})
		res := sh(t, sb, "echo hello; id -un; pwd")
		t.Logf("%d %q %q", res.ExitCode, res.Stdout, res.Stderr)
		if err := sb.WriteFile(context.Background(), "a/b.txt", []byte("x")); err != nil {
			t.Fatal(err)
		}
		b, err := sb.ReadFile(context.Background(), "a/b.txt", 0)
		t.Logf("%q %v", b, err)
		lr, err := sb.List(context.Background(), sandbox.ListRequest{Path: ".", Recursive: true})
		t.Logf("%+v %v", lr, err)
	}
}
