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

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/audit"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testnet"
	"github.com/toolhost/toolhost/policy"
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
	th := newToolhost(t, cfg, WithAudit(rec), withEgressNet(n.DialContext, n.HostAddrs()))
	return th, rec, n
}

// The bash tool through the gateway: an allowed domain answers, a refused one gets the
// 403 the model can read, and the tool's result ends with one note naming each refused
// destination once; every connection is in the audit.
func TestBashEgressNote(t *testing.T) {
	t.Parallel() // mostly waiting (see testConfig)
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

// web_fetch goes through the sandboxes' gateway: the test's internet (resolver, trust
// store) reaches it, the plugin's own web scope decides apart from sandbox.egress, and
// each fetch is audited and counted under the session's project.
func TestWebFetchSharesTheGateway(t *testing.T) {
	t.Parallel() // mostly waiting (see testConfig)
	th, rec, _ := egressToolhost(t, func(c *Config) {
		c.Plugins = append(c.Plugins, Plugin{
			Path:   "webfetch.wasm",
			Grants: []abi.Capability{abi.CapWeb, abi.CapLog},
			Scope:  policy.Scope{Web: &policy.Web{Preset: "none", Allow: []string{"other.test"}}},
		})
	})
	s := open(t, th, SessionOptions{})
	// other.test is outside sandbox.egress (registry.test only) but inside the plugin's
	// scope; https is verified against sandbox.egress.ca_file's roots.
	expect(t, s, "web_fetch", `{"url":"https://other.test/page"}`, false, "hello from other.test")
	// registry.test is the sandboxes' but not the plugin's: refused with the gateway's
	// reason, as the model reads it.
	expect(t, s, "web_fetch", `{"url":"http://registry.test/"}`, true, "registry.test is not an allowed domain")
	var allowed, refused int
	for _, r := range rec.Records() {
		if r.Cap != audit.CapEgress || r.Sandbox != "plugin webfetch" {
			continue
		}
		switch {
		case r.Decision == audit.Allow && r.Dest == "other.test":
			allowed++
		case r.Decision == audit.Deny && r.Dest == "registry.test":
			refused++
		}
	}
	if allowed != 1 || refused != 1 {
		t.Errorf("web_fetch's egress records: %d allowed, %d refused; want 1 and 1 (%+v)", allowed, refused, rec.Records())
	}
	if c := th.EgressCounts()["test"]; c != [2]int64{1, 1} {
		t.Errorf("EgressCounts = %v, want the two fetches under the session's project", c)
	}
}

// audit.file holds what the gateway audits of each connection, as fields of their own:
// the destination, the address connected to, the command that connected, and the name of
// the header the gateway injected, read back from the file; never the header's value.
func TestEgressAuditFile(t *testing.T) {
	const secret = "s3cret-that-stays-in-the-host"
	t.Setenv("TOOLHOST_TEST_EGRESS_SECRET", secret)
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	th, _, _ := egressToolhost(t, func(c *Config) {
		c.Audit.File = path
		c.Sandbox.Egress.Inject = []EgressInject{{Domain: "registry.test", Header: "Authorization", Secret: "env:TOOLHOST_TEST_EGRESS_SECRET"}}
	})
	s := open(t, th, SessionOptions{})
	expect(t, s, "bash", `{"command":"curl -sS --max-time 60 https://registry.test/; echo; curl -sS --max-time 60 http://other.test/ || true"}`, false,
		"hello from registry.test", "other.test is not an allowed domain")
	ctx := context.Background()
	s.Close(ctx)
	if err := th.Close(ctx); err != nil { // writes the audit's last lines
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), secret) {
		t.Fatal("the injected header's value is in the audit file")
	}
	var injected, refused int
	err = audit.Read(strings.NewReader(string(raw)), audit.Filter{Cap: audit.CapEgress}, func(r *audit.Record, line []byte) error {
		addr, aerr := netip.ParseAddr(r.Addr)
		switch {
		case r.Decision == audit.Allow && r.Dest == "registry.test":
			if aerr != nil || !netip.MustParsePrefix("203.0.113.0/24").Contains(addr) || r.Port != 443 || !strings.HasPrefix(r.Command, "cmd-") || r.Injected != "Authorization" {
				t.Errorf("the injected connection's line: %s", line)
			}
			injected++
		case r.Decision == audit.Deny && r.Dest == "other.test":
			if r.Addr != "" || r.Port != 80 || !strings.HasPrefix(r.Command, "cmd-") || r.Injected != "" || r.Why != "no rule allows other.test" {
				t.Errorf("the refusal's line: %s", line)
			}
			refused++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if injected != 1 || refused != 1 {
		t.Errorf("%d lines of the injected connection and %d of the refusal, want 1 and 1:\n%s", injected, refused, raw)
	}
}

// A bad egress entry is reported under its own key, which egress.Compile's error names by
// its field.
func TestValidateEgressNamesTheKey(t *testing.T) {
	for _, c := range []struct {
		set  func(*Config)
		want string
	}{
		{func(c *Config) { c.Sandbox.Egress.Allow = []string{"bad host!"} }, "config: sandbox.egress.allow: allow entry"},
		{func(c *Config) { c.Sandbox.Egress.Deny = []string{"*"} }, "config: sandbox.egress.deny: deny entry"},
		{func(c *Config) { c.Sandbox.Egress.Ports = []int{0} }, "config: sandbox.egress.ports: port 0"},
	} {
		cfg := DefaultConfig()
		c.set(&cfg)
		if err := cfg.Validate(); err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%v, want %q...", err, c.want)
		}
	}
}
