//go:build k8s

package kubernetes

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/sandbox/sandboxtest"
	"github.com/toolhost/toolhost/internal/sandbox/local"
	"github.com/toolhost/toolhost/internal/testenv"
)

// The tests against a real cluster: make test-k8s brings one up (scripts/k8s/up.sh) and
// runs them with -tags k8s and TOOLHOST_TEST_K8S_DIR set to its directory. They act as
// the user "toolhost", bound only to the Role of deploy/kubernetes-sandboxes/role.yaml in
// the namespace "toolhost", so a verb the provider uses that the Role lacks fails here.

// testNamespace is the namespace up.sh makes and binds the Role in.
const testNamespace = "toolhost"

// clusterConfig is the provider's Config for the test cluster, or a skip (a failure on CI).
func clusterConfig(t testing.TB) Config {
	t.Helper()
	dir := os.Getenv("TOOLHOST_TEST_K8S_DIR")
	if dir == "" {
		testenv.Skipf(t, "no test cluster: TOOLHOST_TEST_K8S_DIR is not set (make test-k8s brings one up and sets it)")
	}
	ref, err := os.ReadFile(filepath.Join(dir, "images", "agent.ref"))
	if err != nil {
		t.Fatalf("the agent image's name (scripts/k8s/image.sh writes it): %v", err)
	}
	return Config{
		Kubeconfig: filepath.Join(dir, "pki", "toolhost.kubeconfig"),
		Namespace:  testNamespace,
		Image:      strings.TrimSpace(string(ref)),
		// The image is in the node's containerd, imported by up.sh: never pulled.
		ImagePullPolicy: "Never",
		// The namespace has deploy/kubernetes-sandboxes/networkpolicy.yaml (up.sh applies
		// it), but the test cluster has no network plugin that enforces NetworkPolicy:
		// these tests do not show that a sandbox has no network.
		NetworkPolicy: true,
		Limits:        Limits{MemoryBytes: 512 << 20, CPUs: 1},
		// The suite runs some twenty sandboxes at once on one 2-core node.
		RequestRatio: 0.01,
		MaxLifetime:  48 * time.Hour,
		Logger:       slog.New(slog.NewTextHandler(t.Output(), nil)),
	}
}

func newClusterProvider(t *testing.T, edit func(*Config)) *Provider {
	t.Helper()
	cfg := clusterConfig(t)
	if edit != nil {
		edit(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConformance runs the sandbox conformance suite against the provider on the cluster.
func TestConformance(t *testing.T) {
	sandboxtest.Run(t, newClusterProvider(t, nil))
}

// TestClusterFailures: each way the cluster cannot serve is an error within a bound that
// says what to do, wraps ErrUnavailable (so a chain goes on), and leaves no Sandbox behind.
func TestClusterFailures(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*testenv.HangBound)
	t.Cleanup(cancel) // after the parallel subtests
	check := func(t *testing.T, p *Provider, want string) {
		t.Helper()
		_, err := p.Create(ctx, sandbox.CreateOptions{Labels: map[string]string{"failure": t.Name()}})
		if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), want) {
			t.Errorf("Create: %v, want ErrUnavailable saying %q", err, want)
		}
		if left, err := newClusterProvider(t, nil).List(ctx, map[string]string{"failure": t.Name()}); err != nil || len(left) != 0 {
			t.Errorf("Sandboxes left after the failure: %+v %v", left, err)
		}
	}
	t.Run("ImagePull", func(t *testing.T) {
		t.Parallel()
		check(t, newClusterProvider(t, func(c *Config) { c.Image = "toolhost.local/no-such-image:1" }), "cannot be pulled")
	})
	t.Run("NeverReady", func(t *testing.T) {
		t.Parallel()
		check(t, newClusterProvider(t, func(c *Config) {
			c.NodeSelector = map[string]string{"toolhost.dev/no-such-pool": "x"}
			c.ReadyTimeout = 5 * time.Second
		}), "was not ready within")
	})
	t.Run("NoRole", func(t *testing.T) {
		t.Parallel()
		check(t, newClusterProvider(t, func(c *Config) { c.Namespace = "default" }), "deploy/kubernetes-sandboxes/role.yaml")
	})
	t.Run("NoCRD", func(t *testing.T) {
		t.Parallel()
		// A resource the cluster does not serve stands for agent-sandbox not installed
		// (the CRD is the cluster's, shared by the tests running beside this one), asked
		// for as the cluster's admin: RBAC answers before the resource is looked up, and
		// the Role of a real install names sandboxes, which would then be missing.
		p := newClusterProvider(t, func(c *Config) {
			c.Kubeconfig = filepath.Join(filepath.Dir(c.Kubeconfig), "admin.kubeconfig")
		})
		dyn, err := dynamic.NewForConfig(p.rest)
		if err != nil {
			t.Fatal(err)
		}
		missing := SandboxResource
		missing.Resource = "nosuchsandboxes"
		p.dyn = dyn.Resource(missing)
		_, err = p.Create(ctx, sandbox.CreateOptions{})
		if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "install agent-sandbox") {
			t.Errorf("Create without the CRD: %v, want ErrUnavailable saying to install agent-sandbox", err)
		}
	})
}

// TestClusterChain: kubernetes,local serves from the cluster when it can.
func TestClusterChain(t *testing.T) {
	testenv.NeedBwrap(t)
	lp, err := local.New(local.Config{RunDir: testenv.RunDir(t), MaxLifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lp.Close(context.Background()) })
	chain := sandbox.NewChain(nil, sandbox.Named{Name: "kubernetes", Provider: newClusterProvider(t, nil)}, sandbox.Named{Name: "local", Provider: lp})
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	sb, err := chain.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(ctx)
	if _, ok := sandbox.As[*Sandbox](sb); !ok {
		t.Errorf("the chain's sandbox is a %T, want the kubernetes provider's", sb)
	}
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "id -u; echo $HOME"}})
	if err != nil || string(res.Stdout) != "1000\n"+sandbox.WorkspaceRoot+"\n" {
		t.Errorf("a command in the pod: %q %q %v, want uid 1000 and HOME %s", res.Stdout, res.Stderr, err, sandbox.WorkspaceRoot)
	}
}

// TestClusterCheck: doctor's check passes for the Role's user in its namespace and names
// the verbs it lacks elsewhere.
func TestClusterCheck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	if ok, detail := newClusterProvider(t, nil).Check(ctx); !ok {
		t.Errorf("Check in the Role's namespace: %s", detail)
	}
	ok, detail := newClusterProvider(t, func(c *Config) { c.Namespace = "default" }).Check(ctx)
	if ok || !strings.Contains(detail, "role.yaml") {
		t.Errorf("Check in a namespace without the Role: %v %q", ok, detail)
	}
}

// BenchmarkCreateFirstCommand is a sandbox's creation to its first command's answer, then
// its close, on the cluster (kubernetes) and on this machine (local), one after the other.
func BenchmarkCreateFirstCommand(b *testing.B) {
	kcfg := clusterConfig(b)
	kcfg.Logger = nil
	kp, err := New(kcfg)
	if err != nil {
		b.Fatal(err)
	}
	lp, err := local.New(local.Config{RunDir: testenv.RunDir(b), MaxLifetime: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lp.Close(context.Background()) })
	for _, c := range []struct {
		name string
		p    sandbox.Provider
		opts sandbox.CreateOptions
	}{{"kubernetes", kp, sandbox.CreateOptions{}}, {"local", lp, sandbox.CreateOptions{}}} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			for b.Loop() {
				sb, err := c.p.Create(ctx, c.opts)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				sb.Close(ctx)
				b.StartTimer()
			}
		})
	}
}
