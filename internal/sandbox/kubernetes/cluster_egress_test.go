//go:build k8s && linux

package kubernetes

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/module"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testnet"
)

// nodeIP is the address pods reach this host at (test.sh exports the node's).
func nodeIP(t *testing.T) string {
	t.Helper()
	ip := os.Getenv("TOOLHOST_TEST_K8S_NODE_IP")
	if net.ParseIP(ip) == nil {
		testenv.Skipf(t, "TOOLHOST_TEST_K8S_NODE_IP is not an address (make test-k8s sets it to the node's)")
	}
	return ip
}

// TestClusterEgress: a pod of network egress reaches the test internet (TEST-NET hosts in
// network namespaces of their own; nothing leaves this machine) only through the host's
// egress gateway, by the proxy variables every command gets: its agent carries the
// connection to the provider's relay, and the gateway decides it by the session's policy
// (registry.test allowed, other.test refused, both audited under the sandbox and the
// command, the refusal told to the command). A direct connection to the same host does
// not get there: the pod network has no route to the test internet, which only the
// gateway reaches. That the pod could reach anything else directly is the cluster's
// NetworkPolicy's to stop, and this cluster enforces none: TestClusterNetworkPolicyProbe.
func TestClusterEgress(t *testing.T) {
	host := nodeIP(t)
	n := testnet.New(t)
	reg, err := n.AddHost("registry.test")
	if err != nil {
		t.Fatal(err)
	}
	other, err := n.AddHost("other.test")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello from %s", r.Host) })
	for _, a := range []netip.Addr{reg, other} {
		l, err := n.Listen("tcp", netip.AddrPortFrom(a, 80).String())
		if err != nil {
			t.Fatal(err)
		}
		n.Serve(l, mux)
	}
	var mu sync.Mutex
	var audit []egress.Record
	g := egress.New(egress.Config{
		Resolver: &egress.DNSResolver{Server: n.DNS(), Dialer: n}, Dialer: n, HostAddrs: n.HostAddrs(),
		Audit: func(r *egress.Record) {
			mu.Lock()
			audit = append(audit, *r)
			mu.Unlock()
		},
	})
	pol, err := egress.Compile(egress.Spec{Allow: []string{"registry.test"}})
	if err != nil {
		t.Fatal(err)
	}
	sess := g.Session(egress.SessionConfig{Project: "p", Policy: pol})

	for _, pool := range []int{0, 1} {
		t.Run(fmt.Sprintf("pool=%d", pool), func(t *testing.T) {
			p := newClusterProvider(t, func(c *Config) {
				c.EgressListen = net.JoinHostPort(host, "0")
				c.Pool = pool
			})
			t.Cleanup(func() { _ = p.Close(context.Background()) })
			ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
			defer cancel()
			sb, err := p.Create(ctx, sandbox.CreateOptions{Network: sandbox.NetworkEgress, Egress: &sandbox.Egress{Gateway: sess}})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close(ctx)
			run := func(tag, script string) sandbox.ExecResult {
				t.Helper()
				res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Tag: tag})
				if err != nil {
					t.Fatalf("%s: %v", script, err)
				}
				return res
			}
			// busybox wget reads http_proxy, as curl, pip and npm do.
			res := run("cmd-allowed", `echo "$http_proxy"; wget -q -O - http://registry.test/hello`)
			if res.ExitCode != 0 || string(res.Stdout) != "http://127.0.0.1:3128\nhello from registry.test" {
				t.Errorf("allowed host through the proxy: exit %d, %q %q", res.ExitCode, res.Stdout, res.Stderr)
			}
			res = run("cmd-denied", `wget -S -O - http://other.test/hello 2>&1`)
			if res.ExitCode == 0 || !strings.Contains(string(res.Stdout), "403") {
				t.Errorf("denied host through the proxy: exit %d, %q: want a 403", res.ExitCode, res.Stdout)
			}
			if got := sandbox.EgressRefused(sb, "cmd-denied"); len(got) != 1 || !strings.Contains(got[0], "other.test is not an allowed domain") {
				t.Errorf("what the gateway refused to cmd-denied: %q", got)
			}
			// Directly, without the proxy: the test internet is not on the pod network.
			res = run("cmd-direct", fmt.Sprintf(`unset http_proxy HTTP_PROXY; timeout 5 wget -q -O - http://%s/hello`, reg))
			if res.ExitCode == 0 {
				t.Errorf("a direct connection to registry.test's address %s got through: %q", reg, res.Stdout)
			}
			mu.Lock()
			defer mu.Unlock()
			var allowed, denied bool
			for _, r := range audit {
				if r.Sandbox != sb.ID() {
					continue
				}
				allowed = allowed || (r.Name == "registry.test" && r.Decision == egress.Allow && r.Command == "cmd-allowed")
				denied = denied || (r.Name == "other.test" && r.Decision == egress.Deny && r.Command == "cmd-denied")
			}
			if !allowed || !denied {
				t.Errorf("audit of %s: allowed registry.test %v, refused other.test %v: %+v", sb.ID(), allowed, denied, audit)
			}
		})
	}
}

// TestClusterNetworkPolicyProbe: this cluster stores NetworkPolicies but nothing enforces
// them (the bridge plugin does not), and doctor says so: its probe's sandbox of network
// none connects to this host directly, and the "kubernetes network" check fails, saying
// that sandboxes of network none and egress would go around the gateway.
func TestClusterNetworkPolicyProbe(t *testing.T) {
	host := nodeIP(t)
	cfg := clusterConfig(t)
	s := DefaultSection()
	s.Kubeconfig, s.Namespace, s.Image, s.ImagePullPolicy = cfg.Kubeconfig, cfg.Namespace, cfg.Image, cfg.ImagePullPolicy
	s.NetworkPolicy, s.RequestRatio = true, cfg.RequestRatio
	s.EgressListen = net.JoinHostPort(host, "3129")
	env := module.Env{Logger: cfg.Logger, Settings: module.Settings{Providers: []string{"kubernetes"}, Network: sandbox.NetworkEgress,
		MemoryBytes: cfg.Limits.MemoryBytes, CPUs: cfg.Limits.CPUs, TTL: 0, MaxLifetime: cfg.MaxLifetime}}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	checks := doctor(ctx, s, env, true)
	var found bool
	for _, c := range checks {
		if c.Name != "kubernetes network" {
			continue
		}
		found = true
		t.Logf("doctor: %s: %s", c.Name, c.Detail)
		if c.OK || !c.Needed || !strings.Contains(c.Detail, "does not enforce NetworkPolicy") || !strings.Contains(c.Detail, "bypassed") {
			t.Errorf("doctor's network check on a cluster that enforces no NetworkPolicy: %+v", c)
		}
	}
	if !found {
		t.Errorf("no kubernetes network check: %+v", checks)
	}
}
