package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/module"
	"github.com/toolhost/toolhost/internal/testenv"
)

// Tests that need no cluster: what the provider refuses, the pod it asks for, and an API
// server that cannot be reached. Those against a real cluster (make test-k8s) are in
// cluster_test.go, behind the build tag k8s.

// deadKubeconfig writes a kubeconfig whose API server is a loopback port nothing listens
// on (taken and released), with a token user.
func deadKubeconfig(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://%s", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: not-a-real-token}}]
contexts: [{name: c, context: {cluster: c, user: u, namespace: toolhost}}]
current-context: c
`, addr)
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestUnreachableAPIServer: an API server that does not answer makes the provider
// unavailable (so a chain goes on) within the request bound, saying which server.
func TestUnreachableAPIServer(t *testing.T) {
	p, err := New(Config{Kubeconfig: deadKubeconfig(t), Image: "toolhost.local/agent:1", NetworkPolicy: true, RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	_, err = p.Create(ctx, sandbox.CreateOptions{})
	if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "cannot reach the Kubernetes API server at https://127.0.0.1:") {
		t.Errorf("Create against an API server that is not there: %v, want ErrUnavailable naming the server", err)
	}
	if _, err := p.Reconnect(ctx, "toolhost-0123456789ab", sandbox.ReconnectOptions{}); err == nil || errors.Is(err, sandbox.ErrGone) {
		t.Errorf("Reconnect against an API server that is not there: %v, want an error that is not ErrGone (the sandbox may well live)", err)
	}
	if ok, detail := p.Check(ctx); ok || !strings.Contains(detail, "cannot reach") {
		t.Errorf("Check: %v %q", ok, detail)
	}
}

// TestCreateRefuses: what the provider cannot honour it refuses before it asks the
// cluster: more network than asked for, a host directory, a lifetime past the maximum.
func TestCreateRefuses(t *testing.T) {
	p, err := New(Config{Kubeconfig: deadKubeconfig(t), Image: "toolhost.local/agent:1", MaxLifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for what, c := range map[string]struct {
		opts sandbox.CreateOptions
		want error
	}{
		"network none without the NetworkPolicy": {sandbox.CreateOptions{}, sandbox.ErrUnsupported},
		"network egress":                         {sandbox.CreateOptions{Network: sandbox.NetworkEgress, Egress: &sandbox.Egress{}}, sandbox.ErrUnsupported},
		"a host workspace":                       {sandbox.CreateOptions{Network: sandbox.NetworkHost, Workspace: t.TempDir()}, sandbox.ErrUnsupported},
		"a lifetime past the maximum":            {sandbox.CreateOptions{Network: sandbox.NetworkHost, Timeout: 2 * time.Hour}, nil},
		"the agent's token variable":             {sandbox.CreateOptions{Network: sandbox.NetworkHost, Env: map[string]string{envToken: "x"}}, nil},
		"an unknown network mode":                {sandbox.CreateOptions{Network: "bridge"}, nil},
	} {
		_, err := p.Create(ctx, c.opts)
		switch {
		case err == nil:
			t.Errorf("%s: accepted", what)
		case c.want != nil && !errors.Is(err, c.want):
			t.Errorf("%s: %v, want %v", what, err, c.want)
		case errors.Is(err, sandbox.ErrUnavailable):
			t.Errorf("%s: %v: the caller's mistake, never ErrUnavailable (the cluster was not even asked)", what, err)
		}
	}
}

// TestPodSpec: the pod gives the sandbox no credentials of the cluster and no privilege,
// runs the configured image, runtime class and placement, and maps the limits.
func TestPodSpec(t *testing.T) {
	p, err := New(Config{Kubeconfig: deadKubeconfig(t), Image: "registry.example/agent@sha256:0", RuntimeClass: "gvisor",
		NodeSelector: map[string]string{"pool": "sandboxes"}, Tolerations: []Toleration{{Key: "sandboxes", Operator: "Exists", Effect: "NoSchedule"}},
		Limits: Limits{MemoryBytes: 1 << 30, CPUs: 2, DiskBytes: 4 << 30}, RequestRatio: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	spec := p.podSpec([]corev1.EnvVar{{Name: envToken, Value: "tok"}}, map[string]string{"A": "1"}, "")
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the pod mounts a service account token")
	}
	if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
		t.Error("the pod gets service links")
	}
	if spec.RuntimeClassName == nil || *spec.RuntimeClassName != "gvisor" || spec.NodeSelector["pool"] != "sandboxes" || len(spec.Tolerations) != 1 {
		t.Errorf("placement: %v %v %v", spec.RuntimeClassName, spec.NodeSelector, spec.Tolerations)
	}
	sc := spec.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Errorf("pod security context %+v: want a non-root user", sc)
	}
	c := spec.Containers[0]
	if c.Image != "registry.example/agent@sha256:0" || c.SecurityContext.AllowPrivilegeEscalation == nil || *c.SecurityContext.AllowPrivilegeEscalation ||
		len(c.SecurityContext.Capabilities.Drop) != 1 || c.SecurityContext.Capabilities.Drop[0] != "ALL" {
		t.Errorf("container: image %s, security %+v", c.Image, c.SecurityContext)
	}
	if got := c.Resources.Limits.Memory().Value(); got != 1<<30 {
		t.Errorf("memory limit %d", got)
	}
	if got := c.Resources.Requests.Memory().Value(); got != 1<<29 {
		t.Errorf("memory request %d, want half the limit", got)
	}
	if got := c.Resources.Limits.Cpu().MilliValue(); got != 2000 {
		t.Errorf("cpu limit %dm", got)
	}
	if got := c.Resources.Limits.StorageEphemeral().Value(); got != 4<<30 {
		t.Errorf("ephemeral storage limit %d", got)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["HOME"] != sandbox.WorkspaceRoot || env["A"] != "1" || env[envToken] != "tok" {
		t.Errorf("environment %v", env)
	}
}

// TestSectionValidate: the keys' mistakes are named.
func TestSectionValidate(t *testing.T) {
	set := module.Settings{Providers: []string{"kubernetes"}}
	for _, c := range []struct {
		edit func(*Section)
		key  string
	}{
		{func(s *Section) { s.Image = "" }, "kubernetes.image"},
		{func(s *Section) { s.Namespace = "Not_A_Namespace" }, "kubernetes.namespace"},
		{func(s *Section) { s.ImagePullPolicy = "Sometimes" }, "kubernetes.image_pull_policy"},
		{func(s *Section) { s.NodeSelector = map[string]string{"pool": "a b"} }, "kubernetes.node_selector"},
		{func(s *Section) { s.Tolerations = []SectionToleration{{Key: "k", Operator: "Maybe"}} }, "kubernetes.tolerations[0]"},
		{func(s *Section) { s.RequestRatio = 2 }, "kubernetes.request_ratio"},
		{func(s *Section) { s.ReadyTimeout = 0 }, "kubernetes.ready_timeout"},
	} {
		s := DefaultSection()
		s.Image = "toolhost.local/agent:1"
		c.edit(s)
		if err := s.Validate(set); err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("%s: %v, want an error naming it", c.key, err)
		}
	}
	s := DefaultSection()
	if err := s.Validate(module.Settings{Providers: []string{"local"}}); err != nil {
		t.Errorf("the defaults, kubernetes not chosen: %v", err)
	}
}
