// Package s3 is the object store on AWS S3 or any S3-compatible endpoint, built on
// aws-sdk-go-v2.
//
// Credentials come from the SDK's standard chain (environment, shared config and
// credentials files, SSO, web identity, container and instance roles) unless Config
// gives static keys. Uploads are sent from a seekable body, so request checksums and
// retries work over http and https alike: a reader that cannot seek is spooled to a temp
// file first.
//
// Each request is one attempt by default (Config.MaxAttempts): retrying is the caller's
// (internal/snapshot retries a whole save or restore with store.Retry), so retries never nest
// and a store that is down fails fast. Each attempt is bounded by a response-header
// timeout and a read-idle timeout, so a hung server costs one attempt, not the whole
// operation.
//
// Failures are *Error values: one line that names the bucket and the endpoint, the
// operation and what went wrong (cannot reach the store, no credentials, access denied, no
// such bucket with the hint to create it or set Config.CreateBucket), wrapping the store
// sentinel callers branch on (store.ErrUnreachable, ErrNoCredentials, ErrAccessDenied,
// ErrNoBucket, ErrNotFound, ErrExists) and the SDK's own error for errors.As.
package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"github.com/toolhost/toolhost/core/store"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultRegion                = "us-east-1"
	DefaultMaxAttempts           = 1 // the caller retries (store.Retry)
	DefaultMaxBackoff            = 20 * time.Second
	DefaultResponseHeaderTimeout = time.Minute
	DefaultReadTimeout           = time.Minute
	DefaultPresignExpiry         = 15 * time.Minute
)

// Config configures a Store. Bucket is required; everything else has a default.
type Config struct {
	Bucket string
	// Region; empty means the SDK chain's (AWS_REGION, shared config), else DefaultRegion.
	Region string
	// Endpoint is the base URL of an S3-compatible service (http://127.0.0.1:7070);
	// empty means AWS (or AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL if set).
	Endpoint string
	// PathStyle addresses buckets as endpoint/bucket/key rather than bucket.endpoint/key;
	// most S3-compatible servers need it.
	PathStyle bool
	// AccessKeyID and SecretAccessKey (and optional SessionToken) are static
	// credentials; empty means the SDK's standard credential chain.
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string
	// MaxAttempts is the number of tries per request, the first included; 0 means
	// DefaultMaxAttempts (one: no retries inside a request). Raise it only for callers
	// that do not retry themselves; internal/snapshot does.
	MaxAttempts int
	// MaxBackoff caps the jittered exponential backoff between tries; 0 means
	// DefaultMaxBackoff.
	MaxBackoff time.Duration
	// ChecksumWhenRequired sends and validates CRC checksums only when an operation
	// requires them (the SDK's "when_required" for both request calculation and response
	// validation), for S3-compatible stores that reject the newer checksum headers. The
	// default is the SDK's "when_supported".
	ChecksumWhenRequired bool
	// ResponseHeaderTimeout bounds the wait for a response after a request is sent, per
	// try; 0 means DefaultResponseHeaderTimeout.
	ResponseHeaderTimeout time.Duration
	// ReadTimeout bounds how long a response body may stall without delivering data,
	// per try; 0 means DefaultReadTimeout.
	ReadTimeout time.Duration
	// RequestTimeout, when set, bounds each try as a whole (connect, send, receive).
	// Leave it 0 for large uploads on slow links.
	RequestTimeout time.Duration
	// PresignExpiry is the validity of URL when its ttl is 0; 0 means DefaultPresignExpiry.
	PresignExpiry time.Duration
	// CreateBucket creates the bucket the first time a request finds it missing (the CLI's
	// store.s3.create_bucket), then repeats the request once. Off, a missing bucket fails
	// with store.ErrNoBucket and a message that says how to fix it.
	CreateBucket bool
	// TempDir is where unseekable upload bodies are spooled; empty means os.TempDir().
	TempDir string
	// Logger receives debug logs of spooled uploads; nil means slog.Default().
	Logger *slog.Logger
}

// Store is an S3 bucket as a store.Store.
type Store struct {
	cfg      Config
	client   *s3.Client
	presign  *s3.PresignClient
	log      *slog.Logger
	endpoint string // for messages: the configured endpoint, else AWS's for the region

	createMu sync.Mutex
	created  bool
}

var _ store.Store = (*Store)(nil)
var _ store.URLer = (*Store)(nil)

// New builds a Store. It does not contact the service.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Bucket == "" {
		return nil, errors.New("s3 store: bucket is required")
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.ResponseHeaderTimeout <= 0 {
		cfg.ResponseHeaderTimeout = DefaultResponseHeaderTimeout
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.PresignExpiry <= 0 {
		cfg.PresignExpiry = DefaultPresignExpiry
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}

	// A BuildableClient, not an *http.Client: LoadDefaultConfig must be able to add the
	// AWS_CA_BUNDLE roots to its transport.
	httpClient := awshttp.NewBuildableClient().
		WithTimeout(cfg.RequestTimeout).
		WithReadTimeout(cfg.ReadTimeout).
		WithDialerOptions(func(d *net.Dialer) { d.Timeout = 10 * time.Second }).
		WithTransportOptions(func(tr *http.Transport) {
			tr.ResponseHeaderTimeout = cfg.ResponseHeaderTimeout
			tr.TLSHandshakeTimeout = 10 * time.Second
		})
	opts := []func(*config.LoadOptions) error{
		config.WithHTTPClient(httpClient),
		// The SDK's own log lines (an IMDS fallback, a skipped checksum) go to our log at
		// debug level, never straight to stderr.
		config.WithLogger(sdkLogger{cfg.Logger}),
		config.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.MaxAttempts = cfg.MaxAttempts
				o.MaxBackoff = cfg.MaxBackoff
				// Snapshots are the only traffic: no client-side retry quota, which
				// otherwise refuses retries after ~33 failing operations.
				o.RateLimiter = ratelimit.None
			})
		}),
	}
	if cfg.Region != "" {
		opts = append(opts, config.WithRegion(cfg.Region))
	}
	if cfg.AccessKeyID != "" {
		opts = append(opts, config.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, cfg.SecretAccessKey, cfg.SessionToken)))
	}
	if cfg.ChecksumWhenRequired {
		opts = append(opts,
			config.WithRequestChecksumCalculation(aws.RequestChecksumCalculationWhenRequired),
			config.WithResponseChecksumValidation(aws.ResponseChecksumValidationWhenRequired))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("s3 store: load AWS config: %w", err)
	}
	if awsCfg.Region == "" {
		awsCfg.Region = DefaultRegion
	}
	// A failure to find credentials is told apart from the rest by its type (the SDK
	// only says it in words).
	awsCfg.Credentials = credentialsProvider{awsCfg.Credentials}
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.UsePathStyle = cfg.PathStyle
		o.DisableLogOutputChecksumValidationSkipped = true
	})
	endpoint := cfg.Endpoint
	if endpoint == "" {
		endpoint = "https://s3." + awsCfg.Region + ".amazonaws.com"
	}
	return &Store{cfg: cfg, client: client, presign: s3.NewPresignClient(client), log: cfg.Logger, endpoint: endpoint}, nil
}

// Client returns the underlying SDK client, for what the Store interface does not cover.
func (s *Store) Client() *s3.Client { return s.client }

// Bucket returns the bucket name.
func (s *Store) Bucket() string { return s.cfg.Bucket }

// Put uploads r in one PutObject. A body that is not an io.ReadSeeker is spooled to a
// temp file first, so the SDK can checksum it and rewind it for retries.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, opts store.PutOptions) (store.ObjectInfo, error) {
	if err := store.ValidKey(key); err != nil {
		return store.ObjectInfo{}, err
	}
	if err := store.ValidMetadata(opts.Metadata); err != nil {
		return store.ObjectInfo{}, fmt.Errorf("put %s: %w", key, err)
	}
	body, size, cleanup, err := s.seekable(ctx, r, opts.Size)
	if err != nil {
		return store.ObjectInfo{}, fmt.Errorf("put %s: %w", key, err)
	}
	defer cleanup()
	ct := opts.ContentType
	if ct == "" {
		ct = "application/octet-stream"
	}
	in := &s3.PutObjectInput{
		Bucket:        aws.String(s.cfg.Bucket),
		Key:           aws.String(key),
		Body:          body,
		ContentLength: aws.Int64(size),
		ContentType:   aws.String(ct),
		Metadata:      opts.Metadata,
	}
	if opts.IfNotExists {
		in.IfNoneMatch = aws.String("*")
	}
	var out *s3.PutObjectOutput
	err = s.bucketed(ctx, func() error {
		if _, err := body.Seek(0, io.SeekStart); err != nil {
			return err
		}
		out, err = s.client.PutObject(ctx, in)
		return err
	})
	if err != nil {
		if opts.IfNotExists && (httpStatus(err) == http.StatusPreconditionFailed || apiCode(err) == "ConditionalRequestConflict") {
			return store.ObjectInfo{}, s.fail("put", key, store.ErrExists, "an object with this key exists", err)
		}
		return store.ObjectInfo{}, s.wrap("put", key, err)
	}
	return store.ObjectInfo{
		Key: key, Size: size, LastModified: time.Now().UTC(),
		ETag: strings.Trim(aws.ToString(out.ETag), `"`), ContentType: ct, Metadata: opts.Metadata,
	}, nil
}

// seekable returns a rewindable body for r and its size.
func (s *Store) seekable(ctx context.Context, r io.Reader, size int64) (io.ReadSeeker, int64, func(), error) {
	if rs, ok := r.(io.ReadSeeker); ok {
		cur, err := rs.Seek(0, io.SeekCurrent)
		if err == nil {
			var end int64
			end, err = rs.Seek(0, io.SeekEnd)
			if err == nil {
				_, err = rs.Seek(cur, io.SeekStart)
			}
			if err == nil {
				if size > 0 && end-cur != size {
					return nil, 0, nil, fmt.Errorf("body has %d bytes, expected %d", end-cur, size)
				}
				// Present the remainder as a body that starts at 0 for the SDK.
				return io.NewSectionReader(readerAt{rs}, cur, end-cur), end - cur, func() {}, nil
			}
		}
		// A ReadSeeker that cannot seek (a pipe as *os.File) is spooled like any reader.
	}
	f, err := os.CreateTemp(s.cfg.TempDir, "toolhost-s3-put-*")
	if err != nil {
		return nil, 0, nil, fmt.Errorf("spool upload body: %w", err)
	}
	cleanup := func() { f.Close(); os.Remove(f.Name()) }
	start := time.Now()
	n, err := store.CopyContext(ctx, f, r)
	if err == nil && size > 0 && n != size {
		err = fmt.Errorf("read %d bytes, expected %d", n, size)
	}
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		cleanup()
		return nil, 0, nil, fmt.Errorf("spool upload body: %w", err)
	}
	s.log.Debug("s3: spooled upload body", "bytes", n, "ms", time.Since(start).Milliseconds())
	return f, n, cleanup, nil
}

// readerAt adapts a ReadSeeker for io.SectionReader. Calls are serialised by the SDK
// (one attempt at a time reads the body).
type readerAt struct{ rs io.ReadSeeker }

func (r readerAt) ReadAt(p []byte, off int64) (int, error) {
	if ra, ok := r.rs.(io.ReaderAt); ok {
		return ra.ReadAt(p, off)
	}
	if _, err := r.rs.Seek(off, io.SeekStart); err != nil {
		return 0, err
	}
	return io.ReadFull(r.rs, p)
}

// Get streams an object.
func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, store.ObjectInfo, error) {
	if err := store.ValidKey(key); err != nil {
		return nil, store.ObjectInfo{}, err
	}
	var out *s3.GetObjectOutput
	err := s.bucketed(ctx, func() (err error) {
		out, err = s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(key)})
		return err
	})
	if err != nil {
		return nil, store.ObjectInfo{}, s.wrap("get", key, err)
	}
	return checksumBody{out.Body, key}, store.ObjectInfo{
		Key: key, Size: aws.ToInt64(out.ContentLength), LastModified: aws.ToTime(out.LastModified).UTC(),
		ETag: strings.Trim(aws.ToString(out.ETag), `"`), ContentType: aws.ToString(out.ContentType),
		Metadata: nonNil(out.Metadata),
	}, nil
}

// checksumBody reports the SDK's response checksum failure as store.ErrChecksum.
type checksumBody struct {
	io.ReadCloser
	key string
}

func (b checksumBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	// codecheck:errtext the SDK's checksum failure is an fmt.Errorf, with no type to match
	if err != nil && err != io.EOF && strings.Contains(err.Error(), "checksum did not match") {
		err = fmt.Errorf("get %s: %w: %w", b.key, store.ErrChecksum, err)
	}
	return n, err
}

// Head describes an object.
func (s *Store) Head(ctx context.Context, key string) (store.ObjectInfo, error) {
	if err := store.ValidKey(key); err != nil {
		return store.ObjectInfo{}, err
	}
	var out *s3.HeadObjectOutput
	err := s.bucketed(ctx, func() (err error) {
		out, err = s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(key)})
		return err
	})
	if err != nil {
		return store.ObjectInfo{}, s.wrap("head", key, err)
	}
	return store.ObjectInfo{
		Key: key, Size: aws.ToInt64(out.ContentLength), LastModified: aws.ToTime(out.LastModified).UTC(),
		ETag: strings.Trim(aws.ToString(out.ETag), `"`), ContentType: aws.ToString(out.ContentType),
		Metadata: nonNil(out.Metadata),
	}, nil
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// List is one ListObjectsV2 call; the token is S3's continuation token.
func (s *Store) List(ctx context.Context, opts store.ListOptions) (store.ListPage, error) {
	limit := opts.MaxKeys
	if limit <= 0 || limit > store.MaxListKeys {
		limit = store.MaxListKeys
	}
	in := &s3.ListObjectsV2Input{
		Bucket:  aws.String(s.cfg.Bucket),
		MaxKeys: aws.Int32(int32(limit)),
	}
	if opts.Prefix != "" {
		in.Prefix = aws.String(opts.Prefix)
	}
	if opts.Token != "" {
		in.ContinuationToken = aws.String(opts.Token)
	}
	var out *s3.ListObjectsV2Output
	err := s.bucketed(ctx, func() (err error) {
		out, err = s.client.ListObjectsV2(ctx, in)
		return err
	})
	if err != nil {
		return store.ListPage{}, s.wrap("list", opts.Prefix+"*", err)
	}
	page := store.ListPage{Objects: make([]store.ObjectInfo, 0, len(out.Contents))}
	for _, o := range out.Contents {
		page.Objects = append(page.Objects, store.ObjectInfo{
			Key: aws.ToString(o.Key), Size: aws.ToInt64(o.Size), LastModified: aws.ToTime(o.LastModified).UTC(),
			ETag: strings.Trim(aws.ToString(o.ETag), `"`),
		})
	}
	if aws.ToBool(out.IsTruncated) {
		page.Next = aws.ToString(out.NextContinuationToken)
		if page.Next == "" {
			return page, fmt.Errorf("list %q: truncated page without a continuation token", opts.Prefix)
		}
	}
	return page, nil
}

// Delete removes objects with DeleteObjects, 1,000 keys per request.
func (s *Store) Delete(ctx context.Context, keys ...string) error {
	for _, k := range keys {
		if err := store.ValidKey(k); err != nil {
			return err
		}
	}
	for len(keys) > 0 {
		n := min(len(keys), 1000)
		batch := keys[:n]
		keys = keys[n:]
		ids := make([]types.ObjectIdentifier, len(batch))
		for i, k := range batch {
			ids[i] = types.ObjectIdentifier{Key: aws.String(k)}
		}
		out, err := s.client.DeleteObjects(ctx, &s3.DeleteObjectsInput{
			Bucket: aws.String(s.cfg.Bucket),
			Delete: &types.Delete{Objects: ids, Quiet: aws.Bool(true)},
		})
		if err != nil {
			return s.wrap("delete", fmt.Sprintf("%d objects", len(batch)), err)
		}
		var errs []error
		for _, e := range out.Errors {
			if aws.ToString(e.Code) == "NoSuchKey" {
				continue
			}
			errs = append(errs, fmt.Errorf("delete %s: %s: %s", aws.ToString(e.Key), aws.ToString(e.Code), aws.ToString(e.Message)))
		}
		if err := errors.Join(errs...); err != nil {
			return err
		}
	}
	return nil
}

// PresignGet returns a URL that GETs the object without credentials until ttl passes
// (0 means Config.PresignExpiry). It does not check that the object exists.
func (s *Store) PresignGet(ctx context.Context, key string, ttl time.Duration) (string, error) {
	if err := store.ValidKey(key); err != nil {
		return "", err
	}
	if ttl <= 0 {
		ttl = s.cfg.PresignExpiry
	}
	req, err := s.presign.PresignGetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(key)},
		s3.WithPresignExpires(ttl))
	if err != nil {
		return "", fmt.Errorf("presign %s: %w", key, err)
	}
	return req.URL, nil
}

// URL is PresignGet, for store.URLer.
func (s *Store) URL(ctx context.Context, key string, ttl time.Duration) (string, error) {
	return s.PresignGet(ctx, key, ttl)
}

func httpStatus(err error) int {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	var ae smithy.APIError
	if errors.As(err, &ae) && ae.ErrorCode() == "PreconditionFailed" {
		return http.StatusPreconditionFailed
	}
	return 0
}
