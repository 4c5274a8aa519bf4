package cli

import (
	"net"
	"os"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/toolhost/toolhost/internal/store/s3/s3test"
)

// doctorLines maps each check of doctor's output to its status and detail.
func doctorLines(t *testing.T, r runResult) map[string][2]string {
	t.Helper()
	re := regexp.MustCompile(`^(ok|warn|FAIL) +(\S+) +(.+)$`)
	out := map[string][2]string{}
	for _, l := range strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n") {
		m := re.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("doctor line %q is not STATUS NAME DETAIL", l)
			continue
		}
		out[m[2]] = [2]string{m[1], m[3]}
	}
	return out
}

func wantCheck(t *testing.T, lines map[string][2]string, name, status, detail string) {
	t.Helper()
	got, ok := lines[name]
	if !ok {
		t.Errorf("no %s line in %v", name, lines)
		return
	}
	if got[0] != status || !strings.Contains(got[1], detail) {
		t.Errorf("%s: %s %q, want %s with %q", name, got[0], got[1], status, detail)
	}
}

// TestDoctor: on this machine every check is ok, each for real (a sandbox ran a command,
// python3 answered in it, a probe object went through the store); exit 0.
func TestDoctor(t *testing.T) {
	requireBwrap(t)
	requireBrowser(t)
	t.Parallel()
	// The gateway's resolver asks a DNS server of the test's own: nothing leaves the machine.
	r := runCLI(t, []string{"TOOLHOST_SANDBOX_EGRESS_RESOLVER=" + localDNS(t)}, "doctor")
	if r.code != 0 {
		t.Fatalf("doctor on this machine:\n%s", r)
	}
	lines := doctorLines(t, r)
	wantCheck(t, lines, "network", "ok", "egress through the gateway: preset registries, 16 destinations allowed, ports [80 443]")
	wantCheck(t, lines, "network", "ok", "the resolver answers (registry.npmjs.org is 203.0.113.5)")
	wantCheck(t, lines, "plugins", "ok", "4 loaded and compiled (bash ")
	wantCheck(t, lines, "sandbox", "ok", "a sandbox started and ran a command as uid 1000")
	wantCheck(t, lines, "python3", "ok", "Python 3.")
	if os.Geteuid() == 0 {
		wantCheck(t, lines, "owners", "ok", "idmapped mounts work on the workspace dir and the current directory")
	} else {
		wantCheck(t, lines, "owners", "ok", "not running as root")
	}
	wantCheck(t, lines, "browser", "ok", "Chromium and the Playwright driver")
	wantCheck(t, lines, "store", "ok", testStore(t)+": wrote, read and deleted a probe object")
	wantCheck(t, lines, "lease", "ok", "keeps project leases")
	if l := lines["limits"]; l[0] == "FAIL" || !strings.Contains(l[1], "memory") {
		t.Errorf("limits: %v", l)
	}
	if _, ok := lines["e2b"]; ok {
		t.Error("an e2b line without e2b configured")
	}
}

// TestDoctorStores: the S3 store is checked through the test server; where nothing
// listens, the store's line says what to do and doctor exits 1; with leases off, the
// lease line says so.
func TestDoctorStores(t *testing.T) {
	t.Parallel()
	srv, err := s3test.Start(t.TempDir())
	if err != nil {
		t.Fatalf("starting the S3 server: %v", err)
	}
	defer srv.Close()
	bucket, err := srv.NewBucket(t.Context(), "doctor")
	if err != nil {
		t.Fatal(err)
	}
	env := []string{
		"AWS_ACCESS_KEY_ID=" + s3test.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3test.SecretKey,
		"AWS_REGION=" + s3test.Region, "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null",
		"AWS_EC2_METADATA_DISABLED=true",
		"TOOLHOST_STORE_KIND=s3", "TOOLHOST_STORE_S3_BUCKET=" + bucket, "TOOLHOST_STORE_S3_ENDPOINT=" + srv.Endpoint,
		"TOOLHOST_STORE_S3_PATH_STYLE=true",
		// The sandbox and the browser are TestDoctor's; here only the store matters.
		"TOOLHOST_SANDBOX_PROVIDER=e2b", "TOOLHOST_E2B_API_KEY=", "E2B_API_KEY=", "TOOLHOST_SCREENSHOT_ENABLED=false",
	}
	r := runCLI(t, env, "doctor")
	lines := doctorLines(t, r)
	wantCheck(t, lines, "store", "ok", "s3://"+bucket+": wrote, read and deleted a probe object")
	wantCheck(t, lines, "lease", "ok", "keeps project leases")
	wantCheck(t, lines, "browser", "ok", "screenshots are off")
	// e2b is configured, without a key: said without calling E2B, and needed.
	wantCheck(t, lines, "e2b", "FAIL", "no API key: set E2B_API_KEY")
	if _, ok := lines["sandbox"]; ok {
		t.Error("a local sandbox line without local in sandbox.provider")
	}
	if r.code != 1 || !strings.Contains(r.stderr, "e2b: needed and not usable") {
		t.Errorf("exit %d, stderr %q; want 1 naming e2b", r.code, r.stderr)
	}

	r = runCLI(t, append(env, "TOOLHOST_STORE_S3_ENDPOINT=http://127.0.0.1:1", "TOOLHOST_LEASE_ENABLED=false"), "doctor")
	lines = doctorLines(t, r)
	wantCheck(t, lines, "store", "FAIL", "check store.s3.endpoint and store.s3.region, and that the endpoint answers from here")
	if _, ok := lines["lease"]; ok {
		t.Error("a lease line although the store failed")
	}
	if r.code != 1 || !strings.Contains(r.stderr, "store, e2b: needed and not usable") && !strings.Contains(r.stderr, "e2b, store") {
		t.Errorf("exit %d, stderr %q; want 1 naming the store", r.code, r.stderr)
	}

	r = runCLI(t, append(env, "TOOLHOST_LEASE_ENABLED=false"), "doctor")
	wantCheck(t, doctorLines(t, r), "lease", "ok", "project leases are off (lease.enabled: false)")
}

// TestDoctorE2B: with a key the fake E2B accepts, the e2b line is ok.
func TestDoctorE2B(t *testing.T) {
	t.Parallel()
	fake := startE2BFake(t)
	r := runCLI(t, append(fake, "TOOLHOST_SANDBOX_PROVIDER=e2b", "TOOLHOST_SCREENSHOT_ENABLED=false", "TOOLHOST_DATA_DIR="+e2bDataDir(t)), "doctor")
	if r.code != 0 {
		t.Fatalf("doctor against the fake E2B:\n%s", r)
	}
	wantCheck(t, doctorLines(t, r), "e2b", "ok", "the API key is accepted; 0 of the team's sandboxes run now")
}

// localDNS answers every A question with 203.0.113.5, on the test's loopback, until the
// test ends; it returns its address.
func localDNS(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() { // ends when the test closes pc
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var m dnsmessage.Message
			if m.Unpack(buf[:n]) != nil || len(m.Questions) != 1 {
				continue
			}
			q := m.Questions[0]
			resp := dnsmessage.Message{Header: dnsmessage.Header{ID: m.ID, Response: true, RecursionAvailable: true}, Questions: m.Questions}
			if q.Type == dnsmessage.TypeA {
				resp.Answers = []dnsmessage.Resource{{Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 1},
					Body: &dnsmessage.AResource{A: [4]byte{203, 0, 113, 5}}}}
			}
			if b, err := resp.Pack(); err == nil {
				pc.WriteTo(b, from)
			}
		}
	}()
	return pc.LocalAddr().String()
}
