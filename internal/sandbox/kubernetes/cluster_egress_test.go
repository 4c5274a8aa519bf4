//go:build k8s && linux

package kubernetes

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/envd"
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

// TestClusterEgressTakeover: a replica that takes a project over serves its pod's egress.
// Replica 1 creates a sandbox of network egress; replica 2 (another provider, another
// relay, another gateway) reconnects to it as a takeover does, with its own gateway and
// the new lease epoch. From then on the pod's connections go through replica 2's gateway
// (audited there, none more in replica 1's, which is still alive), the Sandbox's labels
// name the new epoch, TLS through the gateway works with both sandbox.egress.ca_file (the
// test internet's CA, for mirror.test) and inject (registry.test gets replica 1's secret
// before and replica 2's after: the pod is given the CA of the gateway that holds it),
// replica 2's relay refuses the key the sandbox had under replica 1,
// and a process in the pod cannot move its agent's relay elsewhere: the agent takes a new
// relay only from the host, with the sandbox's access token, which no process in the pod
// can read.
func TestClusterEgressTakeover(t *testing.T) {
	host := nodeIP(t)
	n := testnet.New(t)
	reg, err := n.AddHost("registry.test")
	if err != nil {
		t.Fatal(err)
	}
	mirror, err := n.AddHost("mirror.test")
	if err != nil {
		t.Fatal(err)
	}
	var authMu sync.Mutex
	var auth []string // the Authorization each request to registry.test/auth came with
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello from %s", r.Host) })
	mux.HandleFunc("/auth", func(w http.ResponseWriter, r *http.Request) {
		authMu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		authMu.Unlock()
		io.WriteString(w, "authorized")
	})
	for _, ap := range []netip.AddrPort{netip.AddrPortFrom(reg, 80), netip.AddrPortFrom(reg, 443), netip.AddrPortFrom(mirror, 443)} {
		l, err := n.Listen("tcp", ap.String())
		if err != nil {
			t.Fatal(err)
		}
		if ap.Port() == 80 {
			n.Serve(l, mux)
		} else if err := n.ServeTLS(l, mux, map[netip.Addr]string{reg: "registry.test", mirror: "mirror.test"}[ap.Addr()]); err != nil {
			t.Fatal(err)
		}
	}
	pol, err := egress.Compile(egress.Spec{Allow: []string{"registry.test", "mirror.test"}})
	if err != nil {
		t.Fatal(err)
	}
	// replica is one host: its gateway, what that gateway audited, its provider.
	type replica struct {
		mu    sync.Mutex
		audit []egress.Record
		sess  sandbox.EgressGateway
		p     *Provider
	}
	// Each replica's gateway injects a secret of its own into requests to registry.test
	// (with a CA of its own the pod must trust), and trusts the test internet's CA, which
	// the pods get as sandbox.egress.ca_file.
	newReplica := func(t *testing.T, pool int, secret string) *replica {
		r := &replica{}
		g := egress.New(egress.Config{
			Resolver: &egress.DNSResolver{Server: n.DNS(), Dialer: n}, Dialer: n, HostAddrs: n.HostAddrs(), RootCAs: n.CertPool(),
			Audit: func(rec *egress.Record) {
				r.mu.Lock()
				r.audit = append(r.audit, *rec)
				r.mu.Unlock()
			},
		})
		r.sess = g.Session(egress.SessionConfig{Project: "p", Policy: pol,
			Inject: []egress.Injection{{Domain: "registry.test", Header: "Authorization", Value: "Bearer " + secret}}})
		r.p = newClusterProvider(t, func(c *Config) {
			c.EgressListen = net.JoinHostPort(host, "0")
			c.Pool = pool
		})
		t.Cleanup(func() { _ = r.p.Close(context.Background()) })
		return r
	}
	// allowed counts what r's gateway allowed to sandbox id's command tag.
	allowed := func(r *replica, id, tag string) int {
		r.mu.Lock()
		defer r.mu.Unlock()
		k := 0
		for _, rec := range r.audit {
			if rec.Sandbox == id && rec.Command == tag && rec.Name == "registry.test" && rec.Decision == egress.Allow {
				k++
			}
		}
		return k
	}
	for _, pool := range []int{0, 1} {
		t.Run(fmt.Sprintf("pool=%d", pool), func(t *testing.T) {
			r1, r2 := newReplica(t, pool, "one"), newReplica(t, pool, "two")
			ctx, cancel := context.WithTimeout(context.Background(), 2*testenv.HangBound)
			defer cancel()
			sb1, err := r1.p.Create(ctx, sandbox.CreateOptions{Network: sandbox.NetworkEgress, Egress: &sandbox.Egress{Gateway: r1.sess, Trust: n.CAPEM()},
				Labels: map[string]string{"toolhost_project": "p", "toolhost_epoch": "1"}})
			if err != nil {
				t.Fatal(err)
			}
			defer sb1.Close(ctx)
			get := func(sb sandbox.Sandbox, tag string) {
				t.Helper()
				res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "wget -q -O - http://registry.test/hello"}, Tag: tag})
				if err != nil {
					t.Fatal(err)
				}
				if res.ExitCode != 0 || string(res.Stdout) != "hello from registry.test" {
					t.Errorf("%s: allowed host through the proxy: exit %d, %q %q", tag, res.ExitCode, res.Stdout, res.Stderr)
				}
			}
			// The gateway audits a connection when it ends, which may be after wget has.
			// tls fetches over TLS through the proxy, trusting what the pod was given: the
			// gateway's CA for registry.test (injected), the test internet's for mirror.test.
			tls := func(sb sandbox.Sandbox, want string) {
				t.Helper()
				authMu.Lock()
				auth = nil
				authMu.Unlock()
				res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"python3", "-c",
					`import urllib.request as u; print(u.urlopen("https://registry.test/auth").read().decode()); print(u.urlopen("https://mirror.test/hello").read().decode())`}, Tag: "cmd-tls"})
				if err != nil {
					t.Fatal(err)
				}
				if res.ExitCode != 0 || string(res.Stdout) != "authorized\nhello from mirror.test\n" {
					t.Errorf("TLS through the gateway (inject and ca_file): exit %d, %q %q", res.ExitCode, res.Stdout, res.Stderr)
				}
				authMu.Lock()
				defer authMu.Unlock()
				if len(auth) != 1 || auth[0] != want {
					t.Errorf("registry.test saw Authorization %q, want %q", auth, want)
				}
			}
			get(sb1, "cmd-before")
			tls(sb1, "Bearer one")
			testenv.WaitFor(t, "replica 1's gateway to audit the sandbox's connection", func() bool { return allowed(r1, sb1.ID(), "cmd-before") == 1 })
			f, _, err := r1.p.lookup(ctx, sb1.ID())
			if err != nil {
				t.Fatal(err)
			}
			oldKey := envd.EgressKey(f.token)

			// Replica 2 takes the project over (epoch 2); replica 1 lives on without the
			// lease, its handle of the sandbox still open.
			sb2, err := r2.p.Reconnect(ctx, sb1.ID(), sandbox.ReconnectOptions{Labels: map[string]string{"toolhost_project": "p"},
				SetLabels: map[string]string{"toolhost_project": "p", "toolhost_epoch": "2"}, Egress: &sandbox.Egress{Gateway: r2.sess, Trust: n.CAPEM()}})
			if err != nil {
				t.Fatal(err)
			}
			if s2, ok := sb2.(*Sandbox); ok {
				defer s2.detach() // not closed: sb1's Close deletes the Sandbox
			}
			get(sb2, "cmd-after")
			tls(sb2, "Bearer two") // replica 2's gateway injects, with its own CA, which the pod now trusts
			testenv.Eventually(func() bool { return allowed(r2, sb1.ID(), "cmd-after") == 1 })
			if a2, a1 := allowed(r2, sb1.ID(), "cmd-after"), allowed(r1, sb1.ID(), "cmd-after"); a2 != 1 || a1 != 0 {
				t.Errorf("after the takeover: replica 2's gateway served %d connections, replica 1's %d: want 1 and 0", a2, a1)
			}

			// The labels name the new epoch, for List and for kubectl.
			infos, err := r2.p.List(ctx, map[string]string{"toolhost_project": "p"})
			if err != nil {
				t.Fatal(err)
			}
			var listed bool
			for _, in := range infos {
				if in.ID == sb1.ID() {
					listed = true
					if in.Labels["toolhost_epoch"] != "2" {
						t.Errorf("the sandbox's labels after the takeover: %v: want epoch 2", in.Labels)
					}
				}
			}
			if !listed {
				t.Errorf("the sandbox is not listed after the takeover: %+v", infos)
			}
			res := r2.p.dyn
			if pool > 0 {
				res = r2.p.claims
			}
			u, err := res.Namespace(testNamespace).Get(ctx, sb1.ID(), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := u.GetLabels()[labelPrefix+"toolhost_epoch"]; got != "2" {
				t.Errorf("the %s's label %s after the takeover: %q, want 2", u.GetKind(), labelPrefix+"toolhost_epoch", got)
			}

			// Replica 2's relay does not take the key the sandbox had under replica 1.
			if r2.p.relay == nil {
				t.Fatal("replica 2 has no egress relay")
			}
			c, err := net.Dial("tcp", r2.p.relay.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(testenv.HangBound))
			if err := envd.WriteEgressHello(c, envd.EgressHello{Key: oldKey}); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(c, "GET http://registry.test/hello HTTP/1.1\r\nHost: registry.test\r\n\r\n")
			if b, _ := io.ReadAll(c); len(b) != 0 {
				t.Errorf("replica 2's relay served the key of replica 1's time: %q", b)
			}

			// A process in the pod tries to move the agent's relay to an address of its
			// own: the agent's API is on the pod's loopback, but every request but the
			// health check needs the sandbox's access token.
			for _, hdr := range []string{"", "--header 'X-Access-Token: " + strings.Repeat("0", 64) + "'"} {
				script := fmt.Sprintf(`unset http_proxy HTTP_PROXY https_proxy HTTPS_PROXY; wget -S -O - %s --post-data '{"relay":"127.0.0.1:9","key":"%s"}' http://127.0.0.1:%d%s 2>&1`,
					hdr, strings.Repeat("a", 64), AgentPort, envd.PathEgressRelay)
				res, err := sb2.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Tag: "cmd-attack"})
				if err != nil {
					t.Fatal(err)
				}
				if res.ExitCode == 0 || !strings.Contains(string(res.Stdout), "401") {
					t.Errorf("a process in the pod set the agent's relay (%s): exit %d, %q", hdr, res.ExitCode, res.Stdout)
				}
			}
			get(sb2, "cmd-after-attack")
			testenv.WaitFor(t, "replica 2's gateway to serve the sandbox after the attack", func() bool { return allowed(r2, sb1.ID(), "cmd-after-attack") == 1 })
			if a1 := allowed(r1, sb1.ID(), "cmd-after-attack"); a1 != 0 {
				t.Errorf("after the attack, replica 1's gateway served %d connections: want 0", a1)
			}
		})
	}
}
