//go:build k8s

package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

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

// newPoolProvider is a provider with a warm pool of one, whose template and pool are
// deleted (as the cluster's admin: the Role does not delete them) when the test ends.
func newPoolProvider(t *testing.T) *Provider {
	t.Helper()
	p := newClusterProvider(t, func(c *Config) { c.Pool = 1 })
	t.Cleanup(func() {
		admin := adminProvider(t)
		ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
		defer cancel()
		p.warmMu.Lock()
		defer p.warmMu.Unlock()
		for _, w := range p.warm {
			for _, r := range []dynamic.NamespaceableResourceInterface{admin.pools, admin.templates} {
				if err := r.Namespace(testNamespace).Delete(ctx, w.template, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					t.Errorf("delete the warm pool %s: %v", w.template, err)
				}
			}
		}
	})
	return p
}

// adminProvider is a provider acting as the cluster's admin, for a test's own look.
func adminProvider(t testing.TB) *Provider {
	cfg := clusterConfig(t)
	cfg.Kubeconfig = filepath.Join(filepath.Dir(cfg.Kubeconfig), "admin.kubeconfig")
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitSpares waits for the warm pool of opts' network mode to have a ready spare.
func waitSpares(t testing.TB, p *Provider, opts sandbox.CreateOptions) {
	t.Helper()
	var n int
	var err error
	testenv.WaitFor(t, "a ready spare in the warm pool", func() bool {
		n, err = p.Spares(context.Background(), opts)
		return err == nil && n >= 1
	})
}

// waitWarmPod waits for a ready pod of the warm pool, unclaimed (the pool's status may
// still count one just claimed).
func waitWarmPod(t testing.TB, core corev1client.CoreV1Interface) {
	t.Helper()
	testenv.WaitFor(t, "a ready pod in the warm pool", func() bool {
		for _, pod := range warmPods(t, core) {
			if podReady(&pod) {
				return true
			}
		}
		return false
	})
}

// warmPods are the warm pool's pods not yet claimed (agent-sandbox labels them so).
func warmPods(t testing.TB, core corev1client.CoreV1Interface) map[string]corev1.Pod {
	t.Helper()
	l, err := core.Pods(testNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: "agents.x-k8s.io/pool"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]corev1.Pod{}
	for _, pod := range l.Items {
		if pod.DeletionTimestamp == nil {
			out[pod.Name] = pod
		}
	}
	return out
}

// TestClusterPool: with sandbox.pool 1, a new sandbox is a SandboxClaim served from the
// warm pool: its pod is the spare that was running before the claim was made; the pool
// makes a new spare; the sandbox answers only its own token, not the pool's; another
// provider (a replica taking the project over) reconnects to it by name; closing it
// deletes the claim, and with it the Sandbox and the pod.
func TestClusterPool(t *testing.T) {
	p := newPoolProvider(t)
	admin := adminProvider(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*testenv.HangBound)
	defer cancel()
	opts := sandbox.CreateOptions{Labels: map[string]string{"project": "pool-test", "epoch": "7"}, Env: map[string]string{"FROM_CLAIM": "yes"}}
	if err := p.Warm(ctx, opts); err != nil {
		t.Fatal(err)
	}
	waitSpares(t, p, opts)
	before := warmPods(t, admin.core)
	if len(before) == 0 {
		t.Fatal("the pool says it has a ready spare, but no pod of it is there")
	}
	sb, err := p.Create(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(ctx)
	ks, _ := sandbox.As[*Sandbox](sb)
	claim, err := admin.claims.Namespace(testNamespace).Get(ctx, sb.ID(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the sandbox's SandboxClaim: %v", err)
	}
	if claim.GetLabels()["toolhost.dev/project"] != "pool-test" || claim.GetLabels()["toolhost.dev/epoch"] != "7" || claim.GetLabels()[LabelManagedBy] != managedBy {
		t.Errorf("the claim's labels: %v", claim.GetLabels())
	}
	box, err := admin.dyn.Namespace(testNamespace).Get(ctx, sb.ID(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the claim's Sandbox: %v", err)
	}
	podName, _, err := podOf(box, claim.GetUID())
	if err != nil {
		t.Fatal(err)
	}
	spare, ok := before[podName]
	if !ok {
		t.Fatalf("the sandbox's pod %s is not one of the warm pool's spares %v: it was made for the claim", podName, slices.Collect(maps.Keys(before)))
	}
	// Timestamps are whole seconds: a spare made in the claim's second is not after it
	// (and it was listed among the spares before Create was called).
	if ptr(claim.GetCreationTimestamp()).Before(&spare.CreationTimestamp) {
		t.Errorf("the spare %s was made at %s, after the claim (%s)", podName, spare.CreationTimestamp, claim.GetCreationTimestamp())
	}
	if pod, err := admin.core.Pods(testNamespace).Get(ctx, podName, metav1.GetOptions{}); err != nil || pod.Status.PodIP != ks.podIP {
		t.Errorf("the pod %s: %v, IP %v, want the sandbox's %s", podName, err, pod, ks.podIP)
	}
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo $FROM_CLAIM; env"}})
	if err != nil || !strings.HasPrefix(string(res.Stdout), "yes\n") {
		t.Fatalf("a command in the claimed sandbox: %q %q %v, want its environment", res.Stdout, res.Stderr, err)
	}
	if strings.Contains(string(res.Stdout), "TOOLHOST_AGENT") {
		t.Errorf("a command sees the agent's variables: %q", res.Stdout)
	}
	// The pool's token opens nothing in a claimed sandbox.
	p.warmMu.Lock()
	w := p.warm[sandbox.NetworkNone]
	p.warmMu.Unlock()
	pc, err := p.open(ctx, sb.ID(), w.token, ks.podIP)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pc.client.Processes(ctx); err == nil {
		t.Error("the pool's token runs things in a claimed sandbox")
	}
	pc.detach()
	// The pool refills: a new spare, not the claimed pod.
	testenv.WaitFor(t, "the warm pool to make a new spare", func() bool {
		for name, pod := range warmPods(t, admin.core) {
			if name != podName && podReady(&pod) {
				return true
			}
		}
		return false
	})
	// A replica taking the project over reconnects by name, with the labels.
	other := newClusterProvider(t, func(c *Config) { c.Pool = 1 })
	again, err := other.Reconnect(ctx, sb.ID(), sandbox.ReconnectOptions{Labels: map[string]string{"project": "pool-test"}, Timeout: time.Hour})
	if err != nil {
		t.Fatalf("Reconnect to the claimed sandbox: %v", err)
	}
	if res, err := again.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo $FROM_CLAIM"}}); err != nil || string(res.Stdout) != "yes\n" {
		t.Errorf("a command after the reconnect: %q %v", res.Stdout, err)
	}
	if _, err := other.Reconnect(ctx, sb.ID(), sandbox.ReconnectOptions{Labels: map[string]string{"project": "another"}}); !errors.Is(err, sandbox.ErrForeign) {
		t.Errorf("Reconnect with another project's labels: %v, want ErrForeign", err)
	}
	listed, err := other.List(ctx, map[string]string{"project": "pool-test"})
	if err != nil || len(listed) != 1 || listed[0].ID != sb.ID() {
		t.Errorf("List of the project: %+v %v, want the claimed sandbox", listed, err)
	}
	if d, ok := sandbox.As[*Sandbox](again); ok {
		d.detach()
	}
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.claims.Namespace(testNamespace).Get(ctx, sb.ID(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the claim after Close: %v, want it deleted", err)
	}
	testenv.WaitFor(t, "the claimed pod to go", func() bool {
		pod, err := admin.core.Pods(testNamespace).Get(ctx, podName, metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && pod.DeletionTimestamp != nil)
	})
}

func ptr[T any](v T) *T { return &v }

// TestConformancePool runs the sandbox conformance suite on claimed sandboxes: with a warm
// pool of one, the first comes from the pool and the rest from the template.
func TestConformancePool(t *testing.T) {
	p := newPoolProvider(t)
	if err := p.Warm(t.Context(), sandbox.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSpares(t, p, sandbox.CreateOptions{})
	sandboxtest.Run(t, p)
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
	if ok, detail := newClusterProvider(t, func(c *Config) { c.Pool = 1 }).Check(ctx); !ok || !strings.Contains(detail, "extensions") {
		t.Errorf("Check with a warm pool in the Role's namespace: %v %s", ok, detail)
	}
	ok, detail := newClusterProvider(t, func(c *Config) { c.Namespace = "default" }).Check(ctx)
	if ok || !strings.Contains(detail, "role.yaml") {
		t.Errorf("Check in a namespace without the Role: %v %q", ok, detail)
	}
}

// BenchmarkCreateFirstCommand is a sandbox's creation to its first command's answer, then
// its close, on the cluster (kubernetes: a Sandbox; kubernetes-pool: a SandboxClaim served
// by a warm pool of one, which is let refill between creations, outside the timing) and
// on this machine (local), one after the other.
func BenchmarkCreateFirstCommand(b *testing.B) {
	kcfg := clusterConfig(b)
	kcfg.Logger = nil
	kp, err := New(kcfg)
	if err != nil {
		b.Fatal(err)
	}
	kcfg.Pool = 1
	pp, err := New(kcfg)
	if err != nil {
		b.Fatal(err)
	}
	admin := adminProvider(b)
	b.Cleanup(func() {
		for _, w := range pp.warm {
			_ = admin.pools.Namespace(testNamespace).Delete(context.Background(), w.template, metav1.DeleteOptions{})
			_ = admin.templates.Namespace(testNamespace).Delete(context.Background(), w.template, metav1.DeleteOptions{})
		}
	})
	lp, err := local.New(local.Config{RunDir: testenv.RunDir(b), MaxLifetime: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lp.Close(context.Background()) })
	for _, c := range []struct {
		name string
		p    sandbox.Provider
		opts sandbox.CreateOptions
	}{{"kubernetes", kp, sandbox.CreateOptions{}}, {"kubernetes-pool", pp, sandbox.CreateOptions{}}, {"local", lp, sandbox.CreateOptions{}}} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			for b.Loop() {
				if c.p == pp {
					b.StopTimer()
					if err := pp.Warm(ctx, c.opts); err != nil {
						b.Fatal(err)
					}
					waitWarmPod(b, admin.core)
					b.StartTimer()
				}
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

// BenchmarkIdleMemory: an idle sandbox's memory, a Sandbox's beside a local sandbox's.
// Each iteration makes a Sandbox (no pool, network none), runs `true`, lets it idle 2 s
// and reads, on the node (this machine): its pod's memory cgroup (pause and agent
// containers: usage_in_bytes, which counts page cache, and the rss of memory.stat), and,
// from inside, its agent's VmRSS and RssAnon (pid 1 of the pod); then the same agent
// figures of a local sandbox made and idled the same way (its agent is this test binary,
// re-executed, as a local sandbox's is toolhost's own binary). It logs min/median/max of the iterations and
// reports the medians. docs/BENCHMARKS.md has the command and the figures.
func BenchmarkIdleMemory(b *testing.B) {
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
	ctx, cancel := context.WithTimeout(context.Background(), 3*testenv.HangBound)
	defer cancel()
	// agentRSS is pid 1's VmRSS and RssAnon in sb, in MiB, after it idled (VmRSS counts the
	// pages of its binary it touched, shared with the page cache; RssAnon its own).
	agentRSS := func(sb sandbox.Sandbox) (rss, anon float64) {
		if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "grep -E '^(VmRSS|RssAnon):' /proc/1/status"}})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for line := range strings.Lines(string(res.Stdout)) {
			var kb float64
			if _, err := fmt.Sscanf(line, "VmRSS: %g kB", &kb); err == nil {
				rss, n = kb/1024, n+1
			} else if _, err := fmt.Sscanf(line, "RssAnon: %g kB", &kb); err == nil {
				anon, n = kb/1024, n+1
			}
		}
		if n != 2 {
			b.Fatalf("VmRSS and RssAnon of the agent: %q", res.Stdout)
		}
		return rss, anon
	}
	names := []string{"pod-usage-MiB", "pod-rss-MiB", "pod-agent-rss-MiB", "pod-agent-anon-MiB", "local-agent-rss-MiB", "local-agent-anon-MiB"}
	samples := map[string][]float64{}
	for b.Loop() {
		sb, err := kp.Create(ctx, sandbox.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		rss, anon := agentRSS(sb)
		samples["pod-agent-rss-MiB"] = append(samples["pod-agent-rss-MiB"], rss)
		samples["pod-agent-anon-MiB"] = append(samples["pod-agent-anon-MiB"], anon)
		pod, err := kp.core.Pods(testNamespace).Get(ctx, sb.ID(), metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		// kubepods/pod<uid> (guaranteed) or kubepods/{burstable,besteffort}/pod<uid>.
		dirs, _ := filepath.Glob("/sys/fs/cgroup/memory/kubepods/*/pod" + string(pod.UID))
		more, _ := filepath.Glob("/sys/fs/cgroup/memory/kubepods/pod" + string(pod.UID))
		if dirs = append(dirs, more...); len(dirs) != 1 {
			b.Fatalf("the memory cgroup of pod %s (cgroup v1, cgroupfs, as up.sh sets kubelet up): found %q", pod.UID, dirs)
		}
		usage, err := os.ReadFile(filepath.Join(dirs[0], "memory.usage_in_bytes"))
		if err != nil {
			b.Fatal(err)
		}
		var u float64
		fmt.Sscanf(string(usage), "%g", &u)
		samples["pod-usage-MiB"] = append(samples["pod-usage-MiB"], u/(1<<20))
		stat, err := os.ReadFile(filepath.Join(dirs[0], "memory.stat"))
		if err != nil {
			b.Fatal(err)
		}
		for line := range strings.Lines(string(stat)) {
			var rss float64
			if _, err := fmt.Sscanf(line, "total_rss %g", &rss); err == nil {
				samples["pod-rss-MiB"] = append(samples["pod-rss-MiB"], rss/(1<<20))
			}
		}
		sb.Close(ctx)
		lsb, err := lp.Create(ctx, sandbox.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		rss, anon = agentRSS(lsb)
		samples["local-agent-rss-MiB"] = append(samples["local-agent-rss-MiB"], rss)
		samples["local-agent-anon-MiB"] = append(samples["local-agent-anon-MiB"], anon)
		lsb.Close(ctx)
	}
	for _, n := range names {
		s := slices.Sorted(slices.Values(samples[n]))
		if len(s) == 0 {
			b.Fatalf("no %s", n)
		}
		b.Logf("%s: min %.1f, median %.1f, max %.1f (of %d)", n, s[0], s[len(s)/2], s[len(s)-1], len(s))
		b.ReportMetric(s[len(s)/2], n)
	}
}
