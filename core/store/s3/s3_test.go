package s3_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	s3store "github.com/toolhost/toolhost/core/store/s3"
	"github.com/toolhost/toolhost/core/store/s3/s3test"
	"github.com/toolhost/toolhost/core/store/storetest"
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
	s := newStore(t, proxy.URL, func(c *s3store.Config) { c.ResponseHeaderTimeout = 300 * time.Millisecond })
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
