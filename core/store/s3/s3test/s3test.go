// Package s3test runs a real S3-compatible server in-process for tests: VersityGW
// (embedgw + the posix backend) on 127.0.0.1, over a plain directory, with SigV4,
// checksums, conditional puts and paged listing. It also provides FaultProxy, an HTTP
// reverse proxy that injects 5xx errors, hangs and dropped connections in front of it.
//
// VersityGW supports one instance per process and its posix backend changes the process's
// working directory, so start the Server once, from TestMain, and give each test its own
// bucket (NewBucket) or key prefix.
package s3test

import (
	"context"
	"crypto/rand"
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
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/versity/versitygw/backend/meta"
	"github.com/versity/versitygw/backend/posix"
	"github.com/versity/versitygw/embedgw"
)

// Credentials of the server's root account.
const (
	AccessKey = "toolhost-test"
	SecretKey = "toolhost-test-secret-key"
	Region    = "us-east-1"
)

// Server is an embedded VersityGW.
type Server struct {
	// Endpoint is the server's base URL, http://127.0.0.1:PORT.
	Endpoint string
	// Dir is the gateway's root: each bucket is a directory in it and each object a file
	// at Dir/<bucket>/<key>, which tests may corrupt on purpose.
	Dir string

	cancel context.CancelFunc
	done   chan error
	client *s3.Client
	seq    atomic.Int64
}

// Start runs a gateway over a new directory under parent (a temp dir when empty) and
// waits until it answers. Call Close when done. The process's working directory becomes
// the gateway's directory (the posix backend resolves buckets relative to it), so tests
// in the same binary must not rely on relative paths.
func Start(parent string) (*Server, error) {
	dir, err := os.MkdirTemp(parent, "versitygw-")
	if err != nil {
		return nil, err
	}
	if err := (meta.XattrMeta{}).Test(dir); err != nil {
		return nil, fmt.Errorf("s3test: %s has no user xattrs: %w", dir, err)
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	// posix.New changes the working directory to dir and keeps bucket paths relative to
	// it, so the working directory must stay there while the gateway runs.
	be, err := posix.New(dir, meta.XattrMeta{}, posix.PosixOpts{})
	if err != nil {
		return nil, fmt.Errorf("s3test: posix backend: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{Endpoint: "http://" + addr, Dir: dir, cancel: cancel, done: make(chan error, 1)}
	cfg := &embedgw.Config{
		RootUserAccess:    AccessKey,
		RootUserSecret:    SecretKey,
		Region:            Region,
		Ports:             []string{addr},
		MaxConnections:    250,
		MaxRequests:       100,
		MultipartMaxParts: 10000,
		Quiet:             true,
	}
	go func() { s.done <- embedgw.RunVersityGW(ctx, be, cfg) }()

	s.client = s3.New(s3.Options{
		Region:       Region,
		BaseEndpoint: aws.String(s.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		_, err := s.client.ListBuckets(pctx, &s3.ListBucketsInput{})
		pcancel()
		if err == nil {
			return s, nil
		}
		select {
		case gerr := <-s.done:
			cancel()
			return nil, fmt.Errorf("s3test: gateway exited: %v (last probe: %v)", gerr, err)
		default:
		}
		if time.Now().After(deadline) {
			s.Close()
			return nil, fmt.Errorf("s3test: gateway not ready after 10s: %w", err)
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
	s.cancel()
	var err error
	select {
	case err = <-s.done:
	case <-time.After(10 * time.Second):
		err = errors.New("s3test: gateway did not stop within 10s")
	}
	os.RemoveAll(s.Dir)
	if errors.Is(err, context.Canceled) {
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
	// proxy is healed or closed).
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

	srv    *httptest.Server
	mu     sync.Mutex
	fault  Fault
	match  func(*http.Request) bool
	left   int // faults still to inject; < 0 means until Heal
	healed chan struct{}
	counts map[string]int // requests seen, by method
	faults int
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

// Reset zeroes the counters.
func (p *FaultProxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.counts = map[string]int{}
	p.faults = 0
}

// Close heals the proxy and shuts it down.
func (p *FaultProxy) Close() {
	p.Heal()
	p.srv.CloseClientConnections()
	p.srv.Close()
}
