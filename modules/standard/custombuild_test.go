package standard_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCustomBuild builds a custom toolhost as docs/ARCHITECTURE.md ("A custom build")
// shows one: a module of its own (testdata/custombuild) whose main is cli.Main with
// modules/standard and a provider of its own ("pods", registered through the root
// package alone, with a key of its own), toolhost replaced by this repository. The build
// is offline: the module cache holds what this repository's own build needs, and
// GOPROXY=off keeps go from fetching anything else. The binary lists the built-ins' keys
// and the new provider's, refuses a bad value of its key naming it, and runs a tool call
// through it: the call reaches the provider's Create with the namespace a flag gave.
func TestCustomBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("links a whole CLI")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, which builds the custom CLI: %v", err)
	}
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(filepath.Join("testdata", "custombuild"))); err != nil {
		t.Fatal(err)
	}
	gomod := "module example.com/mytoolhost\n\ngo 1.26.0\n\nrequire github.com/toolhost/toolhost v0.0.0\n\nreplace github.com/toolhost/toolhost => " + repo + "\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	// toolhost's go.sum has every sum the build needs; -mod=mod lets go add the
	// requirements toolhost brings to the new go.mod, from the module cache.
	sum, err := os.ReadFile(filepath.Join(repo, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute) // a hang bound
	defer cancel()
	bin := filepath.Join(dir, "mytoolhost")
	build := exec.CommandContext(ctx, goBin, "build", "-o", bin, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=off", "GOSUMDB=off", "GOTOOLCHAIN=local")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of the custom CLI: %v\n%s", err, out)
	}

	home := t.TempDir()
	run := func(args ...string) (code int, stdout, stderr string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = home
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "TOOLHOST_") && !strings.HasPrefix(kv, "XDG_CONFIG_HOME=") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, "TOOLHOST_DATA_DIR="+filepath.Join(home, "data"), "TOOLHOST_STORE_DIR="+filepath.Join(home, "store"),
			"XDG_CONFIG_HOME="+filepath.Join(home, "config"), "TOOLHOST_LOG_LEVEL=warn",
			"TOOLHOST_SERVE_DAEMON_CALLS=false") // no session daemon outlives the test
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			code = ee.ExitCode()
		case err != nil:
			t.Fatalf("running the custom CLI %v: %v", args, err)
		}
		return code, o.String(), e.String()
	}

	// The keys: the built-ins' (modules/standard) and the new provider's.
	code, out, errOut := run("help", "flags")
	if code != 0 {
		t.Fatalf("help flags: exit %d\n%s%s", code, out, errOut)
	}
	for _, flag := range []string{"--pods-namespace", "--e2b-domain", "--kubernetes-image", "--s3-bucket"} {
		if !strings.Contains(out, flag) {
			t.Errorf("help flags lists no %s:\n%s", flag, out)
		}
	}
	// Its Validate, on the value a flag gave: refused before anything runs, naming the key.
	if code, out, errOut = run("call", "bash", `{"command":"true"}`, "--sandbox-provider", "pods", "--pods-namespace", ""); code != 2 || !strings.Contains(errOut, "pods.namespace") {
		t.Errorf("an empty pods.namespace: exit %d, want 2 and a message naming the key\n%s%s", code, out, errOut)
	}
	// Compile the plugins first, so the call leaves no detached compile running past the
	// test (a one-shot call hands its compile to one).
	if code, out, errOut = run("tools", "--warm"); code != 0 {
		t.Fatalf("tools --warm: exit %d\n%s%s", code, out, errOut)
	}
	// A tool call goes through the provider, with the namespace the flag gave.
	code, out, errOut = run("call", "bash", `{"command":"true"}`, "--sandbox-provider", "pods", "--pods-namespace", "agents")
	if code != 1 || !strings.Contains(errOut, `pods: no cluster serves namespace "agents" here`) {
		t.Errorf("a call on the pods provider: exit %d, want 1 and the provider's own error\n%s%s", code, out, errOut)
	}
}
