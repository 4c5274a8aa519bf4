//go:build linux

package toolhost

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/audit"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testnet"
)

// egressToolhost is a Toolhost whose gateway reaches the test's internet: registry.test
// (allowed) and other.test (not), HTTP and HTTPS.
func egressToolhost(t *testing.T, edit func(*Config)) (*Toolhost, *audit.Recorder, *testnet.Net) {
	t.Helper()
	n := testnet.New(t)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello from %s", r.Host) })
	for _, name := range []string{"registry.test", "other.test"} {
		a, err := n.AddHost(name)
		if err != nil {
			t.Fatal(err)
		}
		l, err := n.Listen("tcp", netip.AddrPortFrom(a, 80).String())
		if err != nil {
			t.Fatal(err)
		}
		n.Serve(l, mux)
		lt, err := n.Listen("tcp", netip.AddrPortFrom(a, 443).String())
		if err != nil {
			t.Fatal(err)
		}
		if err := n.ServeTLS(lt, mux, name); err != nil {
			t.Fatal(err)
		}
	}
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, n.CAPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.Sandbox.Network = NetworkEgress
	cfg.Sandbox.Egress.Preset = "none"
	cfg.Sandbox.Egress.Allow = []string{"registry.test"}
	cfg.Sandbox.Egress.Resolver = n.DNS().String()
	cfg.Sandbox.Egress.CAFile = ca
	if edit != nil {
		edit(&cfg)
	}
	rec := &audit.Recorder{}
	th := newToolhost(t, cfg, WithAudit(rec), withEgressNet(n.DialContext, n.HostAddrs))
	return th, rec, n
}

// The bash tool through the gateway: an allowed domain answers, a refused one gets the
// 403 the model can read, and the tool's result ends with one note naming each refused
// destination once; every connection is in the audit.
func TestBashEgressNote(t *testing.T) {
	th, rec, _ := egressToolhost(t, nil)
	s := open(t, th, SessionOptions{})
	expect(t, s, "bash", `{"command":"curl -sS --max-time 60 https://registry.test/"}`, false, "hello from registry.test")
	res := expect(t, s, "bash", `{"command":"curl -sS --max-time 60 http://other.test/a; curl -sS --max-time 60 http://other.test/b; curl -sS --max-time 60 https://other.test/ || true"}`, false,
		"egress: other.test is not an allowed domain (allowed: registry.test); ask the operator to add it to sandbox.egress.allow")
	last := res.Content[len(res.Content)-1].Text
	want := "[egress refused 1 destination: other.test is not an allowed domain (allowed: registry.test); ask the operator to add it to sandbox.egress.allow]"
	if last != want {
		t.Errorf("the result's last block:\n%q\nwant\n%q", last, want)
	}
	// A command refused nothing: no note.
	res = expect(t, s, "bash", `{"command":"echo fine"}`, false, "fine")
	if strings.Contains(testenv.ResultText(res), "egress refused") {
		t.Errorf("a note on a command that was refused nothing: %q", testenv.ResultText(res))
	}
	var allowed, refused int
	for _, r := range rec.Records() {
		if r.Cap != audit.CapEgress {
			continue
		}
		if r.Sandbox == "" || !strings.HasPrefix(r.Command, "cmd-") || r.Port == 0 {
			t.Errorf("egress record without its sandbox, command or port: %+v", r)
		}
		switch {
		case r.Decision == audit.Allow && r.Dest == "registry.test":
			allowed++
		case r.Decision == audit.Deny && r.Dest == "other.test" && r.Why == "no rule allows other.test":
			refused++
		}
	}
	if allowed != 1 || refused != 3 {
		t.Errorf("egress records: %d allowed, %d refused; want 1 and 3", allowed, refused)
	}
	if c := th.EgressCounts()["test"]; c != [2]int64{1, 3} {
		t.Errorf("EgressCounts = %v", c)
	}
}

// A session's egress policy narrows the host's and never widens it.
func TestSessionEgressNarrows(t *testing.T) {
	th, _, _ := egressToolhost(t, func(c *Config) { c.Sandbox.Egress.Allow = []string{"registry.test", "other.test"} })
	s := open(t, th, SessionOptions{Egress: &EgressPolicy{Allow: []string{"registry.test", "evil.test"}}})
	expect(t, s, "bash", `{"command":"curl -sS --max-time 60 http://registry.test/"}`, false, "hello from registry.test")
	expect(t, s, "bash", `{"command":"curl -sS --max-time 60 http://other.test/"}`, false, "egress: other.test is not an allowed domain (allowed: registry.test, evil.test)")
	expect(t, s, "bash", `{"command":"curl -sS --max-time 60 http://evil.test/"}`, false, "egress: evil.test is not an allowed domain (allowed: registry.test, other.test)")
	// Another session of the same host keeps the host's policy.
	s2 := open(t, th, SessionOptions{Project: "other"})
	expect(t, s2, "bash", `{"command":"curl -sS --max-time 60 http://other.test/"}`, false, "hello from other.test")
	// CheckEgress answers the same way without a sandbox.
	ctx := context.Background()
	d, err := th.CheckEgress(ctx, "other.test:80", &EgressPolicy{Allow: []string{"registry.test"}})
	if err != nil || d.Allowed || d.Rule != "no rule allows other.test" {
		t.Errorf("CheckEgress narrowed: %+v %v", d, err)
	}
	d, err = th.CheckEgress(ctx, "other.test:443", nil)
	if err != nil || !d.Allowed || d.Rule != "allow other.test" || len(d.Resolved) != 1 {
		t.Errorf("CheckEgress: %+v %v", d, err)
	}
	d, _ = th.CheckEgress(ctx, "169.254.169.254:80", nil)
	if d.Allowed || !strings.HasPrefix(d.Rule, "always refused") {
		t.Errorf("CheckEgress of the metadata address: %+v", d)
	}
}
