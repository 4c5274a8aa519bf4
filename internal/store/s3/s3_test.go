package s3_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/core/store/storetest"
	"github.com/toolhost/toolhost/internal/chunked/chunkedtest"
	s3store "github.com/toolhost/toolhost/internal/store/s3"
	"github.com/toolhost/toolhost/internal/store/s3/s3test"
)

var srv *s3test.Server

func TestMain(m *testing.M) {
	// Pin the environment: the SDK honours AWS_ENDPOINT_URL and friends.
	for _, k := range []string{"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_REGION", "AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION"} {
		os.Unsetenv(k)
	}
	var err error
	srv, err = s3test.Start("")
	if err != nil {
		log.Fatalf("start versitygw: %v", err)
	}
	code := m.Run()
	if err := srv.Close(); err != nil {
		log.Printf("stop versitygw: %v", err)
	}
	os.Exit(code)
}

func newStore(t *testing.T, endpoint string, mod func(*s3store.Config)) *s3store.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bucket, err := srv.NewBucket(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	cfg := s3store.Config{
		Bucket: bucket, Endpoint: endpoint, PathStyle: true, Region: s3test.Region,
		AccessKeyID: s3test.AccessKey, SecretAccessKey: s3test.SecretKey,
		MaxBackoff: 5 * time.Millisecond, TempDir: t.TempDir(),
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := s3store.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return newStore(t, srv.Endpoint, nil) })
}

func TestConformanceChecksumWhenRequired(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return newStore(t, srv.Endpoint, func(c *s3store.Config) { c.ChecksumWhenRequired = true })
	})
}

func TestPresignGet(t *testing.T) {
	s := newStore(t, srv.Endpoint, nil)
	ctx := context.Background()
	if _, err := s.Put(ctx, "shots/desktop.webp", strings.NewReader("webp bytes"), store.PutOptions{ContentType: "image/webp"}); err != nil {
		t.Fatal(err)
	}
	u, err := s.PresignGet(ctx, "shots/desktop.webp", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(u, "X-Amz-Signature=") || !strings.Contains(u, "X-Amz-Expires=60") {
		t.Errorf("not a presigned URL: %s", u)
	}
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != "webp bytes" {
		t.Errorf("GET presigned URL: %d %q", resp.StatusCode, b)
	}
	// Tampering with the key breaks the signature.
	resp2, err := http.Get(strings.Replace(u, "desktop", "mobile", 1))
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusForbidden {
		t.Errorf("tampered URL answered %d", resp2.StatusCode)
	}
}

// The SDK retries a PUT through injected 500s, a hang beyond the response timeout and a
// dropped connection, rewinding the (spooled) body each time.
func TestRetriesThroughFaults(t *testing.T) {
	proxy, err := s3test.NewFaultProxy(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	s := newStore(t, proxy.URL, func(c *s3store.Config) {
		c.MaxAttempts = 4 // the SDK retries here (the default is one attempt: callers retry)
		c.ResponseHeaderTimeout = 300 * time.Millisecond
	})
	data := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	for _, f := range []s3test.Fault{s3test.Error500, s3test.Hang, s3test.Drop} {
		t.Run(f.String(), func(t *testing.T) {
			proxy.Reset()
			proxy.Inject(f, http.MethodPut, 3)
			key := "retry/" + f.String()
			// An unseekable reader: the store must spool it so the retries can rewind.
			if _, err := s.Put(context.Background(), key, io.MultiReader(bytes.NewReader(data)), store.PutOptions{Size: int64(len(data))}); err != nil {
				t.Fatalf("Put through 3 faults with 4 attempts: %v", err)
			}
			if got := proxy.Count(http.MethodPut); got != 4 {
				t.Errorf("%d PUTs reached the proxy, want 4", got)
			}
			rc, _, err := s.Get(context.Background(), key)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(rc)
			rc.Close()
			if !bytes.Equal(b, data) {
				t.Errorf("object differs after retries (%d bytes)", len(b))
			}
		})
	}
	t.Run("exhausted", func(t *testing.T) {
		proxy.Reset()
		proxy.Inject(s3test.Error500, http.MethodPut, 4)
		_, err := s.Put(context.Background(), "retry/exhausted", bytes.NewReader(data), store.PutOptions{})
		if err == nil {
			t.Fatal("Put succeeded through 4 faults with 4 attempts")
		}
		if got := proxy.Count(http.MethodPut); got != 4 {
			t.Errorf("%d PUTs, want 4", got)
		}
		proxy.Heal()
	})
}

func TestNoSuchBucketIsNotNotFound(t *testing.T) {
	ctx := context.Background()
	s, err := s3store.New(ctx, s3store.Config{
		Bucket: "does-not-exist", Endpoint: srv.Endpoint, PathStyle: true,
		AccessKeyID: s3test.AccessKey, SecretAccessKey: s3test.SecretKey, MaxAttempts: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = s.Get(ctx, "k")
	if err == nil || errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get in a missing bucket: %v (must not be ErrNotFound)", err)
	}
}

// closedPort returns an endpoint on which nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// oneLine checks that err is a single line naming the bucket and the endpoint, and wraps
// kind.
func oneLine(t *testing.T, err error, kind error, bucket, endpoint string, words ...string) {
	t.Helper()
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	t.Logf("%s", msg)
	if !errors.Is(err, kind) {
		t.Errorf("error is not %v: %v", kind, err)
	}
	var se *s3store.Error
	if !errors.As(err, &se) {
		t.Errorf("error is not an *s3.Error: %T", err)
	}
	if strings.Contains(msg, "\n") || len(msg) > 300 || !strings.Contains(msg, "bucket "+bucket) || !strings.Contains(msg, endpoint) {
		t.Errorf("want one short line naming bucket %s and %s, got %d bytes: %q", bucket, endpoint, len(msg), msg)
	}
	for _, w := range append(words, "") {
		if !strings.Contains(msg, w) {
			t.Errorf("message lacks %q", w)
		}
	}
	for _, noise := range []string{"RequestID", "HostID", "operation error", "IMDS", "https response error"} {
		if strings.Contains(msg, noise) {
			t.Errorf("message carries SDK internals (%q)", noise)
		}
	}
}

// Every way the store can be out of reach or refuse us is one line naming the bucket and
// the endpoint, wrapping the store sentinel callers branch on.
func TestFailuresAreOneClearLine(t *testing.T) {
	ctx := context.Background()
	bucket, err := srv.NewBucket(ctx, "lines")
	if err != nil {
		t.Fatal(err)
	}
	mk := func(t *testing.T, mod func(*s3store.Config)) *s3store.Store {
		cfg := s3store.Config{Bucket: bucket, Endpoint: srv.Endpoint, PathStyle: true, Region: s3test.Region,
			AccessKeyID: s3test.AccessKey, SecretAccessKey: s3test.SecretKey, TempDir: t.TempDir()}
		mod(&cfg)
		s, err := s3store.New(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	body := func() io.Reader { return strings.NewReader("x") }

	t.Run("nothing listens", func(t *testing.T) {
		ep := closedPort(t)
		s := mk(t, func(c *s3store.Config) { c.Endpoint = ep })
		_, err := s.Put(ctx, "k", body(), store.PutOptions{})
		oneLine(t, err, store.ErrUnreachable, bucket, ep, "cannot reach the store", "connection refused", "put k")
		_, err = s.List(ctx, store.ListOptions{Prefix: "p/"})
		oneLine(t, err, store.ErrUnreachable, bucket, ep, "list p/")
		if store.Permanent(err) {
			t.Errorf("an unreachable store is not permanent")
		}
	})
	t.Run("missing bucket", func(t *testing.T) {
		s := mk(t, func(c *s3store.Config) { c.Bucket = "no-such-bucket-here" })
		_, err := s.Put(ctx, "k", body(), store.PutOptions{})
		oneLine(t, err, store.ErrNoBucket, "no-such-bucket-here", srv.Endpoint, "does not exist", "store.s3.create_bucket: true")
		_, err = s.List(ctx, store.ListOptions{})
		oneLine(t, err, store.ErrNoBucket, "no-such-bucket-here", srv.Endpoint)
		if !store.Permanent(err) {
			t.Errorf("a missing bucket is permanent")
		}
	})
	t.Run("create bucket", func(t *testing.T) {
		name := fmt.Sprintf("created-%d", time.Now().UnixNano())
		s := mk(t, func(c *s3store.Config) { c.Bucket = name; c.CreateBucket = true })
		if _, err := s.Put(ctx, "first/object", body(), store.PutOptions{Size: 1}); err != nil {
			t.Fatalf("Put with CreateBucket into a missing bucket: %v", err)
		}
		page, err := s.List(ctx, store.ListOptions{})
		if err != nil || len(page.Objects) != 1 {
			t.Fatalf("after the bucket was created: %+v %v", page, err)
		}
	})
	t.Run("wrong secret", func(t *testing.T) {
		s := mk(t, func(c *s3store.Config) { c.SecretAccessKey = "not-the-secret" })
		_, err := s.Put(ctx, "k", body(), store.PutOptions{})
		oneLine(t, err, store.ErrAccessDenied, bucket, srv.Endpoint, "access denied", "SignatureDoesNotMatch")
		_, err = s.Head(ctx, "k")
		oneLine(t, err, store.ErrAccessDenied, bucket, srv.Endpoint, "access denied")
	})
	t.Run("unknown key", func(t *testing.T) {
		s := mk(t, func(c *s3store.Config) { c.AccessKeyID = "nobody" })
		_, err := s.List(ctx, store.ListOptions{})
		oneLine(t, err, store.ErrAccessDenied, bucket, srv.Endpoint, "access denied")
	})
	t.Run("no credentials", func(t *testing.T) {
		// The SDK's chain finds nothing: no variables, no files (an instance role is not
		// reachable here either).
		for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
			"AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"} {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
		t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
		t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
		t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
		s := mk(t, func(c *s3store.Config) { c.AccessKeyID, c.SecretAccessKey = "", "" })
		_, err := s.Put(ctx, "k", body(), store.PutOptions{})
		oneLine(t, err, store.ErrNoCredentials, bucket, srv.Endpoint, "no AWS credentials", "AWS_ACCESS_KEY_ID")
	})
}

// The chunked snapshot format's conformance, on S3 (internal/chunked runs it on the
// directory store).
func TestChunkedConformance(t *testing.T) {
	chunkedtest.Run(t, func(t *testing.T) store.Store { return newStore(t, srv.Endpoint, nil) })
}
