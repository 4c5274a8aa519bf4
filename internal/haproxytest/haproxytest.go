// Package haproxytest runs HAProxy with the fleet's balancer configuration,
// deploy/haproxy/haproxy.cfg, in front of replicas on loopback: the balancer of the fleet
// tests. HAProxy is Debian's (scripts/setup.sh --test installs it); without it Start
// skips the test, saying so (on CI, CI=true, it fails).
//
// The configuration names Slots replicas; a test with fewer puts the slots left over in
// maintenance, where HAProxy neither checks nor uses them. The HAProxy process is the
// Proxy's: Stop ends it, the test's cleanup does if the test did not, and on Linux it
// dies with the test process however that ends.
package haproxytest

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/testenv"
)

// Binary is Debian's HAProxy.
const Binary = "/usr/sbin/haproxy"

// Slots is how many replicas the configuration names (TOOLHOST_HAPROXY_REPLICA1..3).
const Slots = 3

// Backend is the configuration's backend of replicas.
const Backend = "replicas"

// The configuration's variables.
const (
	EnvBind    = "TOOLHOST_HAPROXY_BIND"
	EnvAdmin   = "TOOLHOST_HAPROXY_ADMIN"
	envReplica = "TOOLHOST_HAPROXY_REPLICA"
)

// ConfigPath is deploy/haproxy/haproxy.cfg in this source tree.
func ConfigPath() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "deploy", "haproxy", "haproxy.cfg")
}

// Server is the configuration's name of replica slot i, 1 to Slots: replica1...
func Server(i int) string { return fmt.Sprintf("replica%d", i) }

// Env is the configuration's variables: clients connect at bind, the runtime API is the
// unix socket admin, and replicas fill the slots in order.
func Env(bind, admin string, replicas [Slots]string) []string {
	env := []string{EnvBind + "=" + bind, EnvAdmin + "=" + admin}
	for i, r := range replicas {
		env = append(env, fmt.Sprintf("%s%d=%s", envReplica, i+1, r))
	}
	return env
}

// Check is haproxy -c: HAProxy's own check of the configuration with env's variables.
func Check(ctx context.Context, env []string) error {
	cmd := exec.CommandContext(ctx, Binary, "-c", "-f", ConfigPath())
	cmd.Env = env
	cmd.WaitDelay = 5 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("haproxy -c -f %s: %w\n%s", ConfigPath(), err, out)
	}
	return nil
}

// Proxy is a running HAProxy.
type Proxy struct {
	// URL is where clients connect: http://127.0.0.1:PORT.
	URL string

	admin   string // the runtime API's socket
	dir     string
	cmd     *exec.Cmd
	log     *syncBuffer
	exited  chan struct{}
	waitErr error // set before exited closes

	stopOnce sync.Once
	stopErr  error
}

// Start runs HAProxy with the configuration in front of replicas (host:port on loopback,
// 1 to Slots of them, in slot order) on a free loopback port, and returns once its
// runtime API answers; each replica is then as its health checks find it (State). The
// test's cleanup stops it.
func Start(t testing.TB, replicas ...string) *Proxy {
	t.Helper()
	if _, err := os.Stat(Binary); err != nil {
		testenv.Skipf(t, "HAProxy is not installed at %s (make test installs it: Debian package haproxy): %v", Binary, err)
	}
	if len(replicas) < 1 || len(replicas) > Slots {
		t.Fatalf("haproxytest: %d replicas; the configuration has %d slots", len(replicas), Slots)
	}
	var slots [Slots]string
	for i := range slots {
		// A slot left over gets the first replica's address, and maintenance below.
		slots[i] = replicas[min(i, len(replicas)-1)]
	}
	// A unix socket's path must be short (108 bytes): not under t.TempDir's long names.
	dir, err := os.MkdirTemp("", "haproxytest-")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{admin: filepath.Join(dir, "admin.sock"), dir: dir, log: &syncBuffer{}, exited: make(chan struct{})}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Logf("haproxytest: %v", err)
		}
		if t.Failed() {
			t.Logf("HAProxy's log:\n%s", p.Log())
		}
		os.RemoveAll(dir)
	})
	var startErr error
	// The free port can be taken between finding it and HAProxy's bind: try again then.
	for range 3 {
		bind, err := freeAddr()
		if err != nil {
			t.Fatal(err)
		}
		if startErr = p.start(bind, slots); startErr == nil {
			break
		}
	}
	if startErr != nil {
		t.Fatalf("haproxytest: %v\n%s", startErr, p.Log())
	}
	for i := len(replicas) + 1; i <= Slots; i++ {
		if out, err := p.Command("disable server " + Backend + "/" + Server(i)); err != nil || strings.TrimSpace(out) != "" {
			t.Fatalf("haproxytest: putting slot %d in maintenance: %v %s", i, err, out)
		}
	}
	return p
}

// start runs HAProxy on bind and waits for its runtime API.
func (p *Proxy) start(bind string, slots [Slots]string) error {
	os.Remove(p.admin)
	cmd := exec.Command(Binary, "-db", "-f", ConfigPath())
	cmd.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, Env(bind, p.admin, slots)...)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	cmd.SysProcAttr = dieWithParent()
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", Binary, err)
	}
	exited := make(chan struct{})
	p.cmd, p.exited, p.URL = cmd, exited, "http://"+bind
	go func() { // owned by the Proxy: it ends when HAProxy does, which Stop sees to
		p.waitErr = cmd.Wait()
		close(exited)
	}()
	ok := testenv.Eventually(func() bool {
		select {
		case <-exited:
			return true
		default:
		}
		_, err := p.Command("show info")
		return err == nil
	})
	select {
	case <-exited:
		return fmt.Errorf("HAProxy exited at its start: %v", p.waitErr)
	default:
	}
	if !ok {
		cmd.Process.Kill()
		<-exited
		return fmt.Errorf("HAProxy's runtime API did not answer within %s", testenv.HangBound)
	}
	return nil
}

// Command sends one command to HAProxy's runtime API (show stat, disable server
// replicas/replica2 ...) and returns its answer.
func (p *Proxy) Command(command string) (string, error) {
	c, err := net.DialTimeout("unix", p.admin, 5*time.Second)
	if err != nil {
		return "", fmt.Errorf("haproxytest: the runtime API: %w", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, command+"\n"); err != nil {
		return "", fmt.Errorf("haproxytest: the runtime API: %w", err)
	}
	out, err := io.ReadAll(c)
	if err != nil {
		return "", fmt.Errorf("haproxytest: the runtime API: %w", err)
	}
	return string(out), nil
}

// State is the status HAProxy gives a server of the backend (Server(i)): UP, DOWN, MAINT,
// or a transition such as "UP 1/2" (one failed check of the two that take it down).
func (p *Proxy) State(server string) (string, error) {
	out, err := p.Command("show stat")
	if err != nil {
		return "", err
	}
	rows, err := csv.NewReader(strings.NewReader(strings.TrimPrefix(out, "# "))).ReadAll()
	if err != nil || len(rows) == 0 {
		return "", fmt.Errorf("haproxytest: show stat answered %q: %v", out, err)
	}
	px, sv, st := slices.Index(rows[0], "pxname"), slices.Index(rows[0], "svname"), slices.Index(rows[0], "status")
	if px < 0 || sv < 0 || st < 0 {
		return "", fmt.Errorf("haproxytest: show stat has no pxname, svname and status columns: %q", rows[0])
	}
	for _, r := range rows[1:] {
		if len(r) > max(px, sv, st) && r[px] == Backend && r[sv] == server {
			return r[st], nil
		}
	}
	return "", fmt.Errorf("haproxytest: no server %s/%s", Backend, server)
}

// WaitState waits until HAProxy gives server the status want, failing t when it never
// does (testenv.HangBound) or HAProxy exits.
func (p *Proxy) WaitState(t testing.TB, server, want string) {
	t.Helper()
	last := ""
	ok := testenv.Eventually(func() bool {
		select {
		case <-p.exited:
			return true
		default:
		}
		last, _ = p.State(server)
		return last == want
	})
	select {
	case <-p.exited:
		t.Fatalf("HAProxy exited (%v) while the test waited for %s to be %s", p.waitErr, server, want)
	default:
	}
	if !ok {
		t.Fatalf("gave up after %s waiting for HAProxy to find %s %s (it is %q)", testenv.HangBound, server, want, last)
	}
}

// Log is what HAProxy said: its alerts, warnings and state changes.
func (p *Proxy) Log() string { return p.log.String() }

// Stop stops HAProxy: a soft stop (SIGUSR1: it stops listening, lets the requests in
// flight finish, exits 0), then, if it is still running after 10 s (a stream still
// open), a hard stop (SIGTERM), then SIGKILL. It returns nil only when HAProxy exited 0
// of its own soft stop. Calling it again returns the same.
func (p *Proxy) Stop() error {
	p.stopOnce.Do(func() {
		if p.cmd == nil {
			return
		}
		select {
		case <-p.exited:
			p.stopErr = fmt.Errorf("haproxytest: HAProxy had exited before Stop: %v", p.waitErr)
			return
		default:
		}
		for _, s := range []struct {
			sig  syscall.Signal
			wait time.Duration
		}{{softStop, 10 * time.Second}, {syscall.SIGTERM, 5 * time.Second}, {syscall.SIGKILL, time.Minute}} {
			p.cmd.Process.Signal(s.sig)
			select {
			case <-p.exited:
				if s.sig != softStop || p.waitErr != nil {
					p.stopErr = fmt.Errorf("haproxytest: HAProxy did not stop of its soft stop; after %v it exited: %v", s.sig, p.waitErr)
				}
				return
			case <-time.After(s.wait):
			}
		}
		p.stopErr = errors.New("haproxytest: HAProxy did not exit after SIGKILL")
	})
	return p.stopErr
}

// Exited reports whether the HAProxy process has ended.
func (p *Proxy) Exited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// syncBuffer is a bytes.Buffer that the process's output and the test may use at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
