package kubernetes

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/testenv"
)

// relayProvider is a provider whose egress relay listens on loopback (pods would dial the
// advertised address, which nothing here dials), with a real gateway whose session allows
// allowed.test only; the audit it keeps.
func relayProvider(t *testing.T) (*Provider, *egress.SessionGateway, func() []egress.Record) {
	t.Helper()
	p, err := New(Config{Kubeconfig: deadKubeconfig(t), Image: "toolhost.local/agent:1", NetworkPolicy: true,
		EgressListen: "127.0.0.1:0", EgressAddress: "192.0.2.1:3129"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	var mu sync.Mutex
	var audit []egress.Record
	g := egress.New(egress.Config{Audit: func(r *egress.Record) {
		mu.Lock()
		audit = append(audit, *r)
		mu.Unlock()
	}})
	pol, err := egress.Compile(egress.Spec{Allow: []string{"allowed.test"}})
	if err != nil {
		t.Fatal(err)
	}
	return p, g.Session(egress.SessionConfig{Policy: pol}), func() []egress.Record {
		mu.Lock()
		defer mu.Unlock()
		return append([]egress.Record(nil), audit...)
	}
}

// relayGet sends a hello with key and a proxy request for http://host/ through the relay,
// and returns the response (nil when the relay closed the connection instead).
func relayGet(t *testing.T, r *relay, hello []byte, host string) *http.Response {
	t.Helper()
	c, err := net.Dial("tcp", r.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(testenv.HangBound))
	if _, err := c.Write(hello); err != nil {
		return nil
	}
	_, _ = io.WriteString(c, "GET http://"+host+"/ HTTP/1.1\r\nHost: "+host+"\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body = io.NopCloser(strings.NewReader(string(body)))
	return resp
}

func hello(t *testing.T, key, command string) []byte {
	t.Helper()
	var b strings.Builder
	if err := envd.WriteEgressHello(&b, envd.EgressHello{Key: key, Command: command}); err != nil {
		t.Fatal(err)
	}
	return []byte(b.String())
}

// TestEgressRelay: a connection to the relay is served by the door of the sandbox its
// hello names (the key of that sandbox's token), with that sandbox's policy and the
// command as a label; one whose key names no sandbox, or whose hello is malformed, is
// closed with nothing served; a sandbox's door leaves with it.
func TestEgressRelay(t *testing.T) {
	p, sess, audit := relayProvider(t)
	token := randomHex(tokenBytes)
	link, err := p.openEgress(sandbox.CreateOptions{Network: sandbox.NetworkEgress, Egress: &sandbox.Egress{Gateway: sess}}, "sb-1", token)
	if err != nil {
		t.Fatal(err)
	}
	if link.addr() != "192.0.2.1:3129" {
		t.Errorf("pods dial %q, want kubernetes.egress_address", link.addr())
	}
	r := link.r

	resp := relayGet(t, r, hello(t, envd.EgressKey(token), "cmd-1"), "denied.test")
	if resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a request for denied.test through the sandbox's key: %+v, want 403 from its door", resp)
	}
	if b, _ := io.ReadAll(resp.Body); !strings.Contains(string(b), "denied.test is not an allowed domain") {
		t.Errorf("403 body %q", b)
	}
	recs := audit()
	if len(recs) != 1 || recs[0].Sandbox != "sb-1" || recs[0].Command != "cmd-1" || recs[0].Decision != egress.Deny {
		t.Errorf("audit %+v, want one refusal for sb-1's cmd-1", recs)
	}

	for what, h := range map[string][]byte{
		"the access token itself as the key": hello(t, token, ""),
		"another sandbox's key":              hello(t, envd.EgressKey(randomHex(tokenBytes)), ""),
		"no hello, a request":                {},
		"a hello too long":                   {0xff, 0xff, '{'},
		"a hello without a key":              []byte("\x00\x02{}"),
	} {
		if resp := relayGet(t, r, h, "denied.test"); resp != nil {
			t.Errorf("%s: answered %s; want the connection closed", what, resp.Status)
		}
	}
	if n := len(audit()); n != 1 {
		t.Errorf("%d audit records after the refused hellos, want the one before: nothing was served", n)
	}

	link.close()
	if resp := relayGet(t, r, hello(t, envd.EgressKey(token), ""), "denied.test"); resp != nil {
		t.Errorf("after the sandbox's close its key still answers: %s", resp.Status)
	}
}

// TestEgressRefuses: network egress needs the NetworkPolicy, the gateway and the relay's
// address, and refuses the variables that steer the agent.
func TestEgressRefuses(t *testing.T) {
	sess := egress.New(egress.Config{}).Session(egress.SessionConfig{})
	eg := &sandbox.Egress{Gateway: sess}
	for what, c := range map[string]struct {
		cfg  Config
		opts sandbox.CreateOptions
		want error
	}{
		"without the NetworkPolicy": {Config{EgressListen: "192.0.2.1:3129"}, sandbox.CreateOptions{Network: sandbox.NetworkEgress, Egress: eg}, sandbox.ErrUnsupported},
		"without egress_listen":     {Config{NetworkPolicy: true}, sandbox.CreateOptions{Network: sandbox.NetworkEgress, Egress: eg}, sandbox.ErrUnsupported},
		"without a gateway":         {Config{NetworkPolicy: true, EgressListen: "192.0.2.1:3129"}, sandbox.CreateOptions{Network: sandbox.NetworkEgress}, nil},
		"the relay variable":        {Config{NetworkPolicy: true, EgressListen: "192.0.2.1:3129"}, sandbox.CreateOptions{Network: sandbox.NetworkEgress, Egress: eg, Env: map[string]string{envRelay: "203.0.113.1:80"}}, nil},
	} {
		c.cfg.Kubeconfig, c.cfg.Image = deadKubeconfig(t), "toolhost.local/agent:1"
		p, err := New(c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Create(context.Background(), c.opts)
		switch {
		case err == nil:
			t.Errorf("%s: accepted", what)
		case c.want != nil && !errors.Is(err, c.want):
			t.Errorf("%s: %v, want %v", what, err, c.want)
		case errors.Is(err, sandbox.ErrUnavailable):
			t.Errorf("%s: %v: never ErrUnavailable (the cluster was not even asked)", what, err)
		}
	}
	// A relay that listens on every address needs the address pods dial.
	p, err := New(Config{Kubeconfig: deadKubeconfig(t), Image: "toolhost.local/agent:1", NetworkPolicy: true, EgressListen: "0.0.0.0:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	if _, err := p.egressRelay(); err == nil || !strings.Contains(err.Error(), "kubernetes.egress_address") {
		t.Errorf("a relay on 0.0.0.0 without egress_address: %v", err)
	}
}

// TestPodSpecEgress: a sandbox with network egress gets the relay's address for its agent
// and every command the proxy variables of a local sandbox.
func TestPodSpecEgress(t *testing.T) {
	p, err := New(Config{Kubeconfig: deadKubeconfig(t), Image: "toolhost.local/agent:1"})
	if err != nil {
		t.Fatal(err)
	}
	spec := p.podSpec(nil, map[string]string{"NO_PROXY": "mine"}, "192.0.2.1:3129")
	env := map[string]string{}
	for _, e := range spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env[envRelay] != "192.0.2.1:3129" || env["HTTPS_PROXY"] != "http://127.0.0.1:3128" || env["all_proxy"] != "socks5h://127.0.0.1:3128" {
		t.Errorf("environment %v", env)
	}
	if env["NO_PROXY"] != "mine" {
		t.Errorf("NO_PROXY %q: the caller's variable must win", env["NO_PROXY"])
	}
	if spec := p.podSpec(nil, nil, ""); len(spec.Containers[0].Env) != 1 {
		t.Errorf("without a relay: %v, want HOME alone", spec.Containers[0].Env)
	}
}
