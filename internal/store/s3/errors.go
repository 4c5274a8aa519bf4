package s3

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/logging"

	"github.com/toolhost/toolhost/core/store"
)

// Error is a failed request of a Store, said in one line: which store (bucket and
// endpoint), which operation on which key, and what went wrong, without the SDK's request
// ids, URLs and nested wrappers. errors.Is finds Kind (a store sentinel) and errors.As the
// SDK's error.
type Error struct {
	Bucket   string
	Endpoint string
	Op       string // get, put, head, list, delete, create bucket
	Key      string
	// Kind is store.ErrUnreachable, ErrNoCredentials, ErrAccessDenied, ErrNoBucket,
	// ErrNotFound or ErrExists; nil for any other failure.
	Kind error
	// Reason says what went wrong, in words.
	Reason string
	// Err is the SDK's error.
	Err error
}

func (e *Error) Error() string {
	where := e.Op
	if e.Key != "" {
		where += " " + e.Key
	}
	return fmt.Sprintf("s3 bucket %s at %s: %s: %s", e.Bucket, e.Endpoint, where, e.Reason)
}

// Unwrap returns Kind and the SDK's error.
func (e *Error) Unwrap() []error {
	var errs []error
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// fail builds an Error.
func (s *Store) fail(op, key string, kind error, reason string, err error) *Error {
	return &Error{Bucket: s.cfg.Bucket, Endpoint: s.endpoint, Op: op, Key: key, Kind: kind, Reason: reason, Err: err}
}

// wrap classifies an SDK failure.
func (s *Store) wrap(op, key string, err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return s.fail(op, key, nil, "canceled", err)
	case errors.Is(err, context.DeadlineExceeded):
		// The caller's or the attempt's deadline passed first.
		return s.fail(op, key, store.ErrUnreachable, "no answer before the deadline", err)
	}
	var ce *credentialsError
	if errors.As(err, &ce) {
		return s.fail(op, key, store.ErrNoCredentials,
			"no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (store.s3 takes no secrets)", err)
	}
	code := apiCode(err)
	status := httpStatus(err)
	var nsk *types.NoSuchKey
	var nf *types.NotFound
	switch {
	case code == "NoSuchBucket":
		return s.fail(op, key, store.ErrNoBucket,
			"the bucket does not exist: create it, or set store.s3.create_bucket: true", err)
	case errors.As(err, &nsk) || errors.As(err, &nf) || code == "NoSuchKey" || (status == http.StatusNotFound && code == "NotFound"):
		return s.fail(op, key, store.ErrNotFound, "object not found", err)
	case accessCodes[code] || status == http.StatusForbidden:
		why := code
		if why == "" {
			why = "403 Forbidden"
		}
		return s.fail(op, key, store.ErrAccessDenied,
			"access denied ("+why+"): check the credentials and their permissions on the bucket", err)
	case status >= 500:
		return s.fail(op, key, store.ErrUnreachable, fmt.Sprintf("the store answered %d %s", status, code), err)
	case status == http.StatusNotFound:
		return s.fail(op, key, store.ErrNotFound, "object not found", err)
	}
	if reason, ok := netReason(err); ok {
		return s.fail(op, key, store.ErrUnreachable, "cannot reach the store ("+reason+")", err)
	}
	if code != "" {
		var ae smithy.APIError
		errors.As(err, &ae)
		return s.fail(op, key, nil, clip(code+": "+ae.ErrorMessage(), 200), err)
	}
	return s.fail(op, key, nil, clip(rootCause(err), 200), err)
}

// accessCodes are S3 error codes that mean the credentials or their permissions were
// refused. XAdminUserNotFound is VersityGW's answer to an unknown access key.
var accessCodes = map[string]bool{
	"AccessDenied": true, "AllAccessDisabled": true, "InvalidAccessKeyId": true,
	"SignatureDoesNotMatch": true, "ExpiredToken": true, "InvalidToken": true,
	"TokenRefreshRequired": true, "XAdminUserNotFound": true, "AccountProblem": true,
}

func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// netReason says in a few words why a request did not get an answer, when that is what
// happened.
func netReason(err error) (string, bool) {
	var dns *net.DNSError
	var op *net.OpError
	var uerr x509.UnknownAuthorityError
	var herr x509.HostnameError
	var rerr tls.RecordHeaderError
	var errno syscall.Errno
	var ne net.Error
	switch {
	case errors.As(err, &dns):
		if dns.IsNotFound {
			return "no such host " + dns.Name, true
		}
		return "DNS lookup of " + dns.Name + " failed", true
	case errors.As(err, &uerr), errors.As(err, &herr):
		return "TLS: the server's certificate is not trusted", true
	case errors.As(err, &rerr):
		return "TLS: the server does not speak TLS (an http:// endpoint?)", true
	case errors.As(err, &errno) && (errno == syscall.ECONNREFUSED || errno == syscall.ECONNRESET ||
		errno == syscall.EHOSTUNREACH || errno == syscall.ENETUNREACH || errno == syscall.ETIMEDOUT):
		return errno.Error(), true
	case errors.As(err, &ne) && ne.Timeout():
		return "timed out", true
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "the connection closed before an answer", true
	case errors.As(err, &op):
		return rootCause(op), true
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() == 0 {
		return rootCause(err), true
	}
	return "", false
}

// rootCause is the innermost error's text, the part that says what happened.
func rootCause(err error) string {
	for {
		var next error
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			next = u.Unwrap()
		case interface{ Unwrap() []error }:
			if es := u.Unwrap(); len(es) > 0 {
				next = es[len(es)-1]
			}
		}
		if next == nil {
			break
		}
		err = next
	}
	if se, ok := err.(*os.SyscallError); ok {
		return se.Err.Error()
	}
	return err.Error()
}

func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// credentialsError marks a failure to obtain credentials.
type credentialsError struct{ err error }

func (e *credentialsError) Error() string { return "no credentials: " + e.err.Error() }
func (e *credentialsError) Unwrap() error { return e.err }

// credentialsProvider wraps the SDK's credentials so that a failure to retrieve them has a
// type of its own.
type credentialsProvider struct{ aws.CredentialsProvider }

func (c credentialsProvider) Retrieve(ctx context.Context) (aws.Credentials, error) {
	v, err := c.CredentialsProvider.Retrieve(ctx)
	if err != nil && ctx.Err() == nil {
		return v, &credentialsError{err}
	}
	return v, err
}

// IsCredentialsProvider lets the SDK see through the wrapper (it checks for anonymous
// credentials this way).
func (c credentialsProvider) IsCredentialsProvider(target aws.CredentialsProvider) bool {
	return aws.IsCredentialsProvider(c.CredentialsProvider, target)
}

// bucketed runs op, and with Config.CreateBucket, when op finds the bucket missing,
// creates it and runs op once more.
func (s *Store) bucketed(ctx context.Context, op func() error) error {
	err := op()
	if err == nil || !s.cfg.CreateBucket || apiCode(err) != "NoSuchBucket" {
		return err
	}
	if cerr := s.createBucket(ctx); cerr != nil {
		return cerr
	}
	return op()
}

func (s *Store) createBucket(ctx context.Context) error {
	s.createMu.Lock()
	defer s.createMu.Unlock()
	if s.created {
		return nil
	}
	in := &s3.CreateBucketInput{Bucket: aws.String(s.cfg.Bucket)}
	if r := s.client.Options().Region; r != "" && r != "us-east-1" {
		in.CreateBucketConfiguration = &types.CreateBucketConfiguration{LocationConstraint: types.BucketLocationConstraint(r)}
	}
	_, err := s.client.CreateBucket(ctx, in)
	var owned *types.BucketAlreadyOwnedByYou
	if err != nil && !errors.As(err, &owned) {
		e := s.wrap("create bucket", "", err)
		var exists *types.BucketAlreadyExists
		if errors.As(err, &exists) {
			e = s.fail("create bucket", "", store.ErrAccessDenied, "the name is taken by another account: choose another bucket", err)
		}
		return e
	}
	s.created = true
	s.log.Info("s3: created the bucket (store.s3.create_bucket)", "bucket", s.cfg.Bucket, "endpoint", s.endpoint)
	return nil
}

// sdkLogger sends the SDK's own log lines to slog at debug level.
type sdkLogger struct{ log *slog.Logger }

func (l sdkLogger) Logf(c logging.Classification, format string, v ...any) {
	l.log.Debug("s3 sdk: "+fmt.Sprintf(format, v...), "class", string(c))
}
