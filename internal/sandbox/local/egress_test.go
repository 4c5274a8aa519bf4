//go:build linux

package local

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/envd/procnet"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testnet"
)

// egressNet is the test internet with a gateway for sandboxes: registry.test (HTTP and
// HTTPS from the test CA) is allowed, other.test exists and is not.
type egressNet struct {
	n     *testnet.Net
	g     *egress.Gateway
	reg   netip.Addr
	mu    sync.Mutex
	audit []egress.Record
	auth  []string // the Authorization headers registry.test's /auth saw
}

func newEgressNet(t testing.TB) *egressNet {
	t.Helper()
	n := testnet.New(t)
	e := &egressNet{n: n}
	var err error
	if e.reg, err = n.AddHost("registry.test"); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello from %s", r.Host) })
	mux.HandleFunc("/auth", func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.auth = append(e.auth, r.Header.Get("Authorization"))
		e.mu.Unlock()
		io.WriteString(w, "authorized")
	})
	for _, port := range []uint16{80, 443} {
		l, err := n.Listen("tcp", netip.AddrPortFrom(e.reg, port).String())
		if err != nil {
			t.Fatal(err)
		}
		if port == 443 {
			if err := n.ServeTLS(l, mux, "registry.test"); err != nil {
				t.Fatal(err)
			}
		} else {
			n.Serve(l, mux)
		}
	}
	o, err := n.AddHost("other.test")
	if err != nil {
		t.Fatal(err)
	}
	lo, err := n.Listen("tcp", netip.AddrPortFrom(o, 80).String())
	if err != nil {
		t.Fatal(err)
	}
	n.Serve(lo, mux)
	e.g = egress.New(egress.Config{
		Resolver:  &egress.DNSResolver{Server: n.DNS(), Dialer: n},
		Dialer:    n,
		HostAddrs: n.HostAddrs(),
		RootCAs:   n.CertPool(),
		Audit: func(r *egress.Record) {
			e.mu.Lock()
			e.audit = append(e.audit, *r)
			e.mu.Unlock()
		},
	})
	return e
}

// session is a gateway session with spec; opts is ready for Create.
func (e *egressNet) session(t testing.TB, spec egress.Spec, cfg egress.SessionConfig) (*egress.SessionGateway, sandbox.CreateOptions) {
	t.Helper()
	p, err := egress.Compile(spec)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Policy = p
	s := e.g.Session(cfg)
	return s, sandbox.CreateOptions{Network: sandbox.NetworkEgress, Egress: &sandbox.Egress{Gateway: s, Trust: e.n.CAPEM()}}
}

func (e *egressNet) records() []egress.Record {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]egress.Record(nil), e.audit...)
}

// waitRecord waits (a hang bound) for an audit record match selects.
func (e *egressNet) waitRecord(t testing.TB, what string, match func(egress.Record) bool) egress.Record {
	t.Helper()
	var found egress.Record
	if !testenv.Eventually(func() bool {
		for _, r := range e.records() {
			if match(r) {
				found = r
				return true
			}
		}
		return false
	}) {
		t.Fatalf("no audit record of %s; records: %+v", what, e.records())
	}
	return found
}

// run runs a script with a command tag.
func run(t testing.TB, sb sandbox.Sandbox, tag, script string) sandbox.ExecResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", script}, Tag: tag})
	if err != nil {
		t.Fatalf("Exec %q: %v", script, err)
	}
	return res
}

func TestEgressThroughTheGateway(t *testing.T) {
	e := newEgressNet(t)
	p := newProvider(t, Config{})
	_, opts := e.session(t, egress.Spec{Allow: []string{"registry.test"}}, egress.SessionConfig{})
	sb := newSandbox(t, p, opts)

	// The proxy variables are there, and curl uses them unchanged.
	res := run(t, sb, "c1", `echo "$HTTP_PROXY $https_proxy $ALL_PROXY $NO_PROXY $NODE_USE_ENV_PROXY"; curl -sS --max-time 60 http://registry.test/hello; echo; curl -sS --max-time 60 https://registry.test/hello`)
	want := "http://127.0.0.1:3128 http://127.0.0.1:3128 socks5h://127.0.0.1:3128 localhost,127.0.0.1,::1 1\nhello from registry.test\nhello from registry.test"
	if res.ExitCode != 0 || string(res.Stdout) != want {
		t.Fatalf("curl through the gateway: exit %d\nstdout %q\nstderr %q\nwant %q", res.ExitCode, res.Stdout, res.Stderr, want)
	}
	// SOCKS5 with the name resolved by the gateway.
	res = run(t, sb, "c2", `curl -sS --max-time 60 --noproxy '' -x socks5h://127.0.0.1:3128 http://registry.test/hello`)
	if res.ExitCode != 0 || string(res.Stdout) != "hello from registry.test" {
		t.Errorf("curl over SOCKS5: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	rec := e.waitRecord(t, "c1's request", func(r egress.Record) bool { return r.Command == "c1" && r.Proto == "connect" })
	if rec.Sandbox != sb.ID() || rec.Decision != egress.Allow || rec.Name != "registry.test" || rec.Addr != e.reg.String() {
		t.Errorf("audit: %+v", rec)
	}
	e.waitRecord(t, "c2's request", func(r egress.Record) bool { return r.Command == "c2" && r.Proto == "socks5" })

	// A refused domain: the 403 names the reason, and the sandbox says what was refused to
	// the command, once.
	res = run(t, sb, "c3", `curl -sS --max-time 60 http://other.test/hello; curl -sS --max-time 60 http://other.test/again; curl -sS --max-time 60 https://other.test/`)
	if !strings.Contains(string(res.Stdout), "egress: other.test is not an allowed domain (allowed: registry.test); ask the operator to add it to sandbox.egress.allow") {
		t.Errorf("refused request: %q %q", res.Stdout, res.Stderr)
	}
	got := sb.EgressRefused("c3")
	if len(got) != 2 || !strings.Contains(got[0], "other.test is not an allowed domain") {
		t.Errorf("refused to c3: %q", got)
	}
	if got := sb.EgressRefused("c3"); got != nil {
		t.Errorf("refusals told twice: %q", got)
	}
	if got := sb.EgressRefused("c1"); got != nil {
		t.Errorf("c1 was refused %q", got)
	}
}

// A program that ignores the proxy has no route at all, and the gateway's port is the
// agent's.
func TestEgressNoRoute(t *testing.T) {
	e := newEgressNet(t)
	p := newProvider(t, Config{})
	_, opts := e.session(t, egress.Spec{Allow: []string{"registry.test"}}, egress.SessionConfig{})
	sb := newSandbox(t, p, opts)
	res := run(t, sb, "probe", `tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '`)
	if string(res.Stdout) != "lo\n" {
		t.Errorf("interfaces %q, want only lo", res.Stdout)
	}
	reg := e.reg.String()
	for _, probe := range []string{
		"exec 3<>/dev/tcp/" + reg + "/80",                          // the allowed host, directly
		"exec 3<>/dev/tcp/" + testnet.GatewayAddr.String() + "/80", // the host side
		"exec 3<>/dev/tcp/8.8.8.8/53",
		"echo x > /dev/udp/" + testnet.DNSAddr.String() + "/53 && echo sent",
		"exec 3<>/dev/tcp/[2001:db8:100::1]/80",
		"getent hosts registry.test",
		"curl -sS --max-time 20 --noproxy '*' http://registry.test/hello",
	} {
		if res := run(t, sb, "probe", probe); res.ExitCode == 0 {
			t.Errorf("%s: succeeded (%q)", probe, res.Stdout)
		}
	}
	// Nobody in the sandbox can take the gateway's port.
	res = run(t, sb, "squat", `python3 -c 'import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 3128)); print("bound")'`)
	if res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "Address already in use") {
		t.Errorf("binding the egress port: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	// The agent's end of the pair to the host is its own: no other process in the
	// sandbox holds a unix socket (the agent's fds are closed to them: it is not
	// dumpable), so none can hand the host a connection under a command name it chose.
	res = run(t, sb, "fds", `for p in /proc/[0-9]*; do [ "${p#/proc/}" = 1 ] && continue; ls -l $p/fd 2>/dev/null; done | grep -c 'socket:' ; ls /proc/1/fd >/dev/null 2>&1 && echo "pid 1's fds listed"; true`)
	if got := strings.TrimSpace(string(res.Stdout)); got != "0" {
		t.Errorf("sockets held in the sandbox besides the agent's, or the agent's fds open: %q %q", got, res.Stderr)
	}
	// And it is not listed as a program's port.
	ports, err := sb.Ports(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, pt := range ports {
		if pt.Port == sandbox.EgressPort {
			t.Errorf("the egress port is listed: %+v", pt)
		}
	}
}

// Two sandboxes: each one's connections are its own, and neither can reach the other's
// way out.
func TestEgressTwoSandboxes(t *testing.T) {
	e := newEgressNet(t)
	p := newProvider(t, Config{})
	_, optsA := e.session(t, egress.Spec{Allow: []string{"registry.test"}}, egress.SessionConfig{})
	_, optsB := e.session(t, egress.Spec{Allow: []string{"other.test"}}, egress.SessionConfig{})
	a := newSandbox(t, p, optsA)
	b := newSandbox(t, p, optsB)
	if res := run(t, a, "a1", `curl -sS --max-time 60 http://registry.test/hello`); string(res.Stdout) != "hello from registry.test" {
		t.Errorf("A to registry.test: %q %q", res.Stdout, res.Stderr)
	}
	if res := run(t, b, "b1", `curl -sS --max-time 60 http://registry.test/hello`); !strings.Contains(string(res.Stdout), "is not an allowed domain") {
		t.Errorf("B to registry.test (its policy does not allow it): %q %q", res.Stdout, res.Stderr)
	}
	if res := run(t, b, "b2", `curl -sS --max-time 60 http://other.test/hello`); string(res.Stdout) != "hello from other.test" {
		t.Errorf("B to other.test: %q %q", res.Stdout, res.Stderr)
	}
	e.waitRecord(t, "b2", func(r egress.Record) bool { return r.Command == "b2" })
	for _, r := range e.records() {
		want := a.ID()
		if strings.HasPrefix(r.Command, "b") {
			want = b.ID()
		}
		if r.Sandbox != want {
			t.Errorf("record %+v attributed to %s; want %s", r, r.Sandbox, want)
		}
	}
	// No socket of the gateway is anywhere a sandbox can name: no path in its mount
	// namespace, nothing in its network namespace's socket table but its own.
	res := run(t, b, "look", `cat /proc/net/unix | tail -n +2 | awk '{print $8}' | grep . ; find / -xdev -type s 2>/dev/null; true`)
	if strings.TrimSpace(string(res.Stdout)) != "" {
		t.Errorf("sockets with paths visible in the sandbox:\n%s", res.Stdout)
	}
	if a.egress.ctl == b.egress.ctl {
		t.Fatal("two sandboxes share a control socket")
	}
}

// The command the agent names is the one that made the connection: a child of a
// foreground command, and a background process under its own tag.
func TestEgressAttribution(t *testing.T) {
	e := newEgressNet(t)
	p := newProvider(t, Config{})
	_, opts := e.session(t, egress.Spec{Allow: []string{"registry.test"}}, egress.SessionConfig{})
	sb := newSandbox(t, p, opts)
	run(t, sb, "parent", `bash -c 'sh -c "curl -sS --max-time 60 http://other.test/x"'`)
	e.waitRecord(t, "the grandchild's request", func(r egress.Record) bool { return r.Command == "parent" && r.Name == "other.test" })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", "curl -sS --max-time 60 http://other.test/bg"}, Tag: "devserver"}); err != nil {
		t.Fatal(err)
	}
	e.waitRecord(t, "the background process's request", func(r egress.Record) bool { return r.Command == "devserver" && r.Name == "other.test" })
	if got := sb.EgressRefused("devserver"); len(got) != 1 {
		t.Errorf("refused to the background process: %q", got)
	}
}

// Credential injection from inside a real sandbox: the upstream sees the header, and the
// value is nowhere in the sandbox: not in any process's environment, command line or
// memory (searched from the host), not in any file it can read, not in what it printed.
func TestEgressInjectionSecretStaysOut(t *testing.T) {
	// Made at run time: a constant would sit in this binary, which is the agent's too.
	var rnd [16]byte
	rand.Read(rnd[:])
	secret := "tok-" + hex.EncodeToString(rnd[:])
	e := newEgressNet(t)
	p := newProvider(t, Config{})
	_, opts := e.session(t, egress.Spec{Allow: []string{"registry.test"}}, egress.SessionConfig{
		Inject: []egress.Injection{{Domain: "registry.test", Header: "Authorization", Value: "Bearer " + secret}},
	})
	sb := newSandbox(t, p, opts)
	// A process that fetches with the header added and stays alive, holding whatever it
	// received, while the host searches the sandbox.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := sb.Start(ctx, sandbox.ExecRequest{Tag: "holder", Argv: []string{"python3", "-c",
		`import urllib.request, time; print(urllib.request.urlopen("https://registry.test/auth").read().decode(), flush=True); time.sleep(600)`}}); err != nil {
		t.Fatal(err)
	}
	res := run(t, sb, "curl", `curl -sS --max-time 60 https://registry.test/auth; echo; curl -sS --max-time 60 -H 'Authorization: Bearer forged' https://registry.test/auth`)
	if res.ExitCode != 0 || string(res.Stdout) != "authorized\nauthorized" {
		t.Fatalf("curl: %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if !testenv.Eventually(func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.auth) >= 3
	}) {
		t.Fatalf("the upstream saw %d requests", len(e.auth))
	}
	e.mu.Lock()
	for _, a := range e.auth {
		if a != "Bearer "+secret {
			t.Errorf("the upstream saw Authorization %q", a)
		}
	}
	e.mu.Unlock()
	// Every file the sandbox can read (through its own root, from the host), every
	// process's environment and command line.
	root := fmt.Sprintf("/proc/%d/root", sb.initPID)
	sawCA := false // the walk reads what the sandbox sees: its own CA file is there
	for _, dir := range []string{"home", "tmp", "etc", "dev/shm"} {
		filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			b, err := os.ReadFile(path)
			if strings.HasSuffix(path, extraCA) && bytes.Contains(b, []byte("BEGIN CERTIFICATE")) {
				sawCA = true
			}
			if err == nil && bytes.Contains(b, []byte(secret)) {
				t.Errorf("the secret is in the sandbox's file %s", strings.TrimPrefix(path, root))
			}
			return nil
		})
	}
	if !sawCA {
		t.Errorf("the walk of the sandbox's files did not see %s", extraCA)
	}
	// Every process of the sandbox, its whole memory, from the host.
	pids := sandboxProcs(t, sb)
	if len(pids) < 2 {
		t.Fatalf("found %d processes of the sandbox", len(pids))
	}
	for _, pid := range pids {
		for _, f := range []string{"environ", "cmdline"} {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f)); bytes.Contains(b, []byte(secret)) {
				t.Errorf("the secret is in the %s of sandbox process %d", f, pid)
			}
		}
		if where := searchMemory(pid, []byte(secret)); where != "" {
			t.Errorf("the secret is in the memory of sandbox process %d: %s", pid, where)
		}
	}
	// The search would find it where it is: in this test's memory.
	if where := searchMemory(os.Getpid(), []byte(secret)); where == "" {
		t.Error("the memory search does not find the secret even in the host process")
	}
}

// sandboxProcs lists the host pids of the processes in sb's pid namespace.
func sandboxProcs(t *testing.T, sb *Sandbox) []int {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", sb.initPID))
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "pid")); err == nil && l == ns {
			pids = append(pids, pid)
		}
	}
	return pids
}

// searchMemory reads every readable mapping of pid and says where needle is ("" when
// nowhere).
func searchMemory(pid int, needle []byte) string {
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return ""
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return ""
	}
	defer mem.Close()
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[1][0] != 'r' {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end-start > 1<<30 {
			continue
		}
		buf := make([]byte, end-start)
		n, _ := mem.ReadAt(buf, int64(start))
		if i := bytes.Index(buf[:n], needle); i >= 0 {
			return fmt.Sprintf("%s at %#x", line, start+uint64(i))
		}
	}
	return ""
}

// A program that opens thousands of connections to the gateway's port and sends nothing
// on them: the agent attributes them without reading the sandbox's whole TCP table once
// per connection (its peak memory stays bounded, and it survives), the host holds a
// bounded number of them (the oldest that sent nothing are closed), and a new request
// still goes through while the flood holds its connections open.
func TestEgressIdleFlood(t *testing.T) {
	const (
		flood    = 6000
		maxConns = 64
		// agentBound bounds the agent's peak resident set's growth over the flood (about
		// 7 MiB, 21 under the race detector, which multiplies what each allocation costs;
		// before the bound, one read of the whole table per connection ran it past 2 GiB).
		agentBound = 64 << 10 // kB
	)
	e := newEgressNet(t)
	p := newProvider(t, Config{})
	_, opts := e.session(t, egress.Spec{Allow: []string{"registry.test"}}, egress.SessionConfig{Limits: egress.Limits{MaxConns: maxConns}})
	sb := newSandbox(t, p, opts)
	agentPID := agentHostPID(t, sb)
	if res := run(t, sb, "warm", `curl -sS --max-time 60 http://registry.test/hello`); string(res.Stdout) != "hello from registry.test" {
		t.Fatalf("before the flood: %q %q", res.Stdout, res.Stderr)
	}
	fdsBefore := countFDs(t, agentPID)
	hwmBefore := vmHWM(t, agentPID)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := sb.Start(ctx, sandbox.ExecRequest{Tag: "flood", Argv: []string{"bash", "-c", fmt.Sprintf(
		`for i in $(seq %d); do exec {fd}<>/dev/tcp/127.0.0.1/%d || exit 1; done; touch /tmp/flooded; exec sleep 600`, flood, sandbox.EgressPort)}}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the flood's connections", func() bool {
		return run(t, sb, "probe", `test -e /tmp/flooded`).ExitCode == 0
	})
	// The agent has handed every connection over once its accept queue is empty and it
	// holds no more descriptors than before.
	testenv.WaitFor(t, "the agent to hand the flood over", func() bool {
		return listenQueue(t, sb, sandbox.EgressPort) == 0 && countFDs(t, agentPID) <= fdsBefore+2
	})
	hwm := vmHWM(t, agentPID)
	t.Logf("agent VmHWM %d kB before, %d kB after %d idle connections", hwmBefore, hwm, flood)
	if hwm-hwmBefore > agentBound {
		t.Errorf("the agent's peak memory grew by %d kB over %d idle connections (bound %d kB)", hwm-hwmBefore, flood, agentBound)
	}
	if held := hostHeld(t, sb, sandbox.EgressPort); held > 2*maxConns {
		t.Errorf("the host holds %d of the sandbox's connections to the gateway (bound %d)", held, 2*maxConns)
	}
	// The flood still holds its connections; a request made now is served.
	if res := run(t, sb, "after", `curl -sS --max-time 60 http://registry.test/hello`); string(res.Stdout) != "hello from registry.test" {
		t.Errorf("a request during the flood: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if got := agentHostPID(t, sb); got != agentPID {
		t.Errorf("the agent is pid %d, was %d", got, agentPID)
	}
}

// countFDs counts a host process's open descriptors.
func countFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// sandboxTCP reads the rows of the sandbox's IPv4 TCP table (through its pid 1).
func sandboxTCP(t *testing.T, sb *Sandbox) []procnet.Row {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/tcp", sb.initPID))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []procnet.Row
	if err := procnet.ScanTCPTable(f, func(r procnet.Row) bool { rows = append(rows, r); return true }); err != nil {
		t.Fatal(err)
	}
	return rows
}

// listenQueue is how many connections wait in the accept queue of the sandbox's listener
// on port.
func listenQueue(t *testing.T, sb *Sandbox, port int) int {
	t.Helper()
	for _, r := range sandboxTCP(t, sb) {
		if r.Listen() && r.Local.Port() == uint16(port) {
			return r.RxQueue
		}
	}
	t.Fatalf("nothing listens on %d in the sandbox", port)
	return 0
}

// hostHeld counts the descriptors this (host) process holds of the sandbox's connections
// to its port.
func hostHeld(t *testing.T, sb *Sandbox, port int) int {
	t.Helper()
	ours := map[uint64]bool{}
	for _, r := range sandboxTCP(t, sb) {
		if !r.Listen() && r.Local.Port() == uint16(port) && r.Inode != 0 {
			ours[r.Inode] = true
		}
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		link, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if inode, ok := procnet.SocketInode(link); ok && ours[inode] {
			n++
		}
	}
	return n
}
