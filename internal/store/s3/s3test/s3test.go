// Package s3test runs a real S3-compatible server for tests: VersityGW (embedgw + the
// posix backend) on 127.0.0.1, over a plain directory, with SigV4, checksums, conditional
// puts and paged listing. It also provides FaultProxy, an HTTP reverse proxy that injects
// 5xx errors, hangs and dropped connections in front of it.
//
// The server is a child process built from ./gateway, a module of its own: VersityGW's
// large dependency tree stays out of toolhost's go.mod, and so out of the build of every
// program that imports toolhost. The first Start on a machine builds it (with the Go
// toolchain running the tests, from the module cache or the module proxy) into the temp
// directory, keyed by its sources; later ones reuse it.
package s3test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Credentials of the server's root account.
const (
	AccessKey = "toolhost-test"
	SecretKey = "toolhost-test-secret-key"
	Region    = "us-east-1"
)

// Server is a running gateway.
type Server struct {
	// Endpoint is the server's base URL, http://127.0.0.1:PORT.
	Endpoint string
	// Dir is the gateway's root: each bucket is a directory in it and each object a file
	// at Dir/<bucket>/<key>, which tests may corrupt on purpose.
	Dir string

	cmd    *exec.Cmd
	stdin  io.Closer // closing it tells the gateway its parent is gone
	done   chan error
	stderr *bytes.Buffer
	client *s3.Client
	seq    atomic.Int64
}

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// gatewayDir is the gateway module's directory, next to this file.
func gatewayDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "gateway")
}

// gatewayBinary builds the gateway once per machine and its sources: the binary's name
// holds the digest of main.go, go.mod, go.sum and the toolchain.
func gatewayBinary() (string, error) {
	buildOnce.Do(func() {
		dir := gatewayDir()
		h := sha256.New()
		io.WriteString(h, runtime.Version())
		for _, f := range []string{"main.go", "go.mod", "go.sum"} {
			b, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				buildErr = fmt.Errorf("s3test: the gateway's sources: %w", err)
				return
			}
			fmt.Fprintf(h, "%s %d\n", f, len(b))
			h.Write(b)
		}
		binary = filepath.Join(os.TempDir(), "toolhost-s3gateway-"+hex.EncodeToString(h.Sum(nil))[:16])
		if _, err := os.Stat(binary); err == nil {
			return
		}
		tmp := fmt.Sprintf("%s.%d.tmp", binary, os.Getpid())
		cmd := exec.Command("go", "build", "-o", tmp, ".")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
		cmd.WaitDelay = 10 * time.Second
		if out, err := cmd.CombinedOutput(); err != nil {
			os.Remove(tmp)
			buildErr = fmt.Errorf("s3test: building the gateway in %s: %v\n%s", dir, err, out)
			return
		}
		if err := os.Rename(tmp, binary); err != nil {
			buildErr = fmt.Errorf("s3test: %w", err)
		}
	})
	return binary, buildErr
}

// Start runs a gateway over a new directory under parent (a temp dir when empty) and
// waits until it answers. Call Close when done.
func Start(parent string) (*Server, error) {
	bin, err := gatewayBinary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(parent, "versitygw-")
	if err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	s := &Server{Endpoint: "http://" + addr, Dir: dir, done: make(chan error, 1), stderr: &bytes.Buffer{}}
	s.cmd = exec.Command(bin, "-dir", dir, "-addr", addr, "-access", AccessKey, "-secret", SecretKey, "-region", Region)
	s.cmd.Dir = dir
	s.cmd.Stderr = s.stderr
	// Killed with the test process, however that ends.
	s.cmd.SysProcAttr = dieWithParent()
	s.cmd.WaitDelay = 5 * time.Second
	stdin, err := s.cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("s3test: starting the gateway: %w", err)
	}
	s.stdin = stdin
	ready := make(chan bool, 1)
	go func() { // owned by the Server: it ends when the gateway's stdout closes
		sc := bufio.NewScanner(stdout)
		ok := false
		for !ok && sc.Scan() { // VersityGW says things of its own first
			ok = sc.Text() == "ready"
		}
		ready <- ok
		io.Copy(io.Discard, stdout)
	}()
	go func() { s.done <- s.cmd.Wait() }() // owned by the Server: Close waits for it
	select {
	case ok := <-ready:
		if !ok { // its stdout closed: it exited
			err := <-s.done
			os.RemoveAll(dir)
			return nil, fmt.Errorf("s3test: the gateway did not start: %v: %s", err, strings.TrimSpace(s.stderr.String()))
		}
	case <-time.After(30 * time.Second):
		s.Close()
		return nil, fmt.Errorf("s3test: the gateway did not start within 30s: %s", strings.TrimSpace(s.stderr.String()))
	}
	s.client = s3.New(s3.Options{
		Region:       Region,
		BaseEndpoint: aws.String(s.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := s.client.ListBuckets(ctx, &s3.ListBucketsInput{})
		cancel()
		if err == nil {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.Close()
			return nil, fmt.Errorf("s3test: gateway not answering after 10s: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
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

// Close stops the gateway and removes its directory.
func (s *Server) Close() error {
	s.stdin.Close()
	s.cmd.Process.Signal(syscall.SIGTERM)
	var err error
	select {
	case err = <-s.done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
		err = errors.New("s3test: gateway did not stop within 10s")
	}
	os.RemoveAll(s.Dir)
	var ee *exec.ExitError
	if errors.As(err, &ee) && !ee.Exited() { // ended by our signal
		err = nil
	}
	return err
}

// NewBucket creates a bucket with a fresh name starting with prefix (lower-case letters,
// digits and '-') and returns its name.
func (s *Server) NewBucket(ctx context.Context, prefix string) (string, error) {
	var b [3]byte
	rand.Read(b[:])
	name := fmt.Sprintf("%s-%d-%s", strings.ToLower(prefix), s.seq.Add(1), hex.EncodeToString(b[:]))
	if len(name) > 63 {
		name = name[len(name)-63:]
	}
	if _, err := s.client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		return "", fmt.Errorf("s3test: create bucket %s: %w", name, err)
	}
	return name, nil
}

// ObjectPath is the file holding an object's bytes on disk.
func (s *Server) ObjectPath(bucket, key string) string {
	return filepath.Join(s.Dir, bucket, filepath.FromSlash(key))
}

// Fault is what FaultProxy does to a matching request.
type Fault int

const (
	// Error500 answers with an S3 XML InternalError, status 500, without forwarding.
	Error500 Fault = iota
	// Hang holds the request, without answering, until the client gives up (or the
	// proxy is healed or closed); it is never forwarded. Abandoned counts the clients
	// that gave up.
	Hang
	// Drop closes the client's connection without an answer.
	Drop
	// DropAnswer forwards the request to the server, then closes the client's
	// connection instead of relaying the answer: the request took effect, the client
	// cannot know.
	DropAnswer
)

func (f Fault) String() string {
	switch f {
	case Error500:
		return "500"
	case Hang:
		return "hang"
	case Drop:
		return "drop"
	case DropAnswer:
		return "drop-answer"
	}
	return fmt.Sprintf("Fault(%d)", int(f))
}

// FaultProxy is a reverse proxy to a Server that can fail requests on demand. Point a
// client at URL instead of Server.Endpoint. It keeps the Host header, so SigV4 signatures
// still verify.
type FaultProxy struct {
	URL string

	srv       *httptest.Server
	mu        sync.Mutex
	fault     Fault
	match     func(*http.Request) bool
	left      int // faults still to inject; < 0 means until Heal
	healed    chan struct{}
	counts    map[string]int // requests seen, by method
	faults    int
	abandoned int // hung requests whose client gave up
}

// NewFaultProxy starts a proxy in front of target (an endpoint URL).
func NewFaultProxy(target string) (*FaultProxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	p := &FaultProxy{counts: map[string]int{}, healed: make(chan struct{})}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ErrorLog = nil
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fault, inject, healed := p.take(r)
		if !inject {
			rp.ServeHTTP(w, r)
			return
		}
		if fault == DropAnswer {
			rec := httptest.NewRecorder()
			rp.ServeHTTP(rec, r)
			dropConn(w)
			return
		}
		io.Copy(io.Discard, io.LimitReader(r.Body, 256<<20))
		switch fault {
		case Error500:
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code><Message>injected by s3test.FaultProxy</Message></Error>`)
		case Hang:
			select {
			case <-r.Context().Done():
				p.mu.Lock()
				p.abandoned++
				p.mu.Unlock()
			case <-healed:
			case <-time.After(time.Minute):
			}
		case Drop:
			dropConn(w)
		}
	}))
	p.URL = p.srv.URL
	return p, nil
}

// dropConn closes the client's connection without writing a response.
func dropConn(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

func (p *FaultProxy) take(r *http.Request) (Fault, bool, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.counts[r.Method]++
	if p.left == 0 || (p.match != nil && !p.match(r)) {
		return 0, false, p.healed
	}
	if p.left > 0 {
		p.left--
	}
	p.faults++
	return p.fault, true, p.healed
}

// Inject makes the next n requests with the given method ("" for any) fail with f;
// n < 0 means every such request until Heal.
func (p *FaultProxy) Inject(f Fault, method string, n int) {
	p.InjectMatch(f, func(r *http.Request) bool { return method == "" || r.Method == method }, n)
}

// InjectMatch makes the next n requests for which match returns true fail with f;
// n < 0 means every such request until Heal.
func (p *FaultProxy) InjectMatch(f Fault, match func(*http.Request) bool, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fault, p.match, p.left = f, match, n
}

// Heal stops injecting faults and releases hanging requests.
func (p *FaultProxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.left = 0
	close(p.healed)
	p.healed = make(chan struct{})
}

// Count returns how many requests with the method ("" for all) the proxy has seen.
func (p *FaultProxy) Count(method string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if method != "" {
		return p.counts[method]
	}
	n := 0
	for _, c := range p.counts {
		n += c
	}
	return n
}

// Faults returns how many faults were injected.
func (p *FaultProxy) Faults() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faults
}

// Abandoned returns how many requests held by Hang were given up by their client (its
// context ended, it closed the connection) before the proxy let them go.
func (p *FaultProxy) Abandoned() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.abandoned
}

// Reset zeroes the counters.
func (p *FaultProxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.counts = map[string]int{}
	p.faults, p.abandoned = 0, 0
}

// Close heals the proxy and shuts it down.
func (p *FaultProxy) Close() {
	p.Heal()
	p.srv.CloseClientConnections()
	p.srv.Close()
}
