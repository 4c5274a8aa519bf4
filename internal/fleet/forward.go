package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"syscall"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolhost/toolhost/internal/tracing"
)

// ErrUnreachable: a forwarded request never reached the holder (its connection was
// refused, or another replica of the fleet answers at its address): nothing was served,
// and the caller may serve the request itself.
var ErrUnreachable = errors.New("the replica holding the project did not answer")

// ErrNotHolder: the replica a request was forwarded to does not hold its project (it
// moved since the lease was read): nothing was written, and the caller may find the
// holder again.
var ErrNotHolder = errors.New("the replica forwarded to does not hold the project")

// HeaderNotHolder marks a 409 answer of a replica that does not hold the project of a
// request forwarded to it.
const HeaderNotHolder = "Toolhost-Fleet-Not-Holder"

// HeaderInstance, on a 421 answer to a fleet request meant for another replica, names
// the replica that answered: the one meant is not at that address any more (Dead, as a
// probe would find it).
const HeaderInstance = "Toolhost-Fleet-Instance"

// Forward relays r (whose body, already read, is body) to the replica instance at addr,
// signed for principal, and copies its answer, streamed, to w. CheckTarget must have
// passed. It answers ErrUnreachable, having written nothing, when the connection was
// refused (the caller may serve r itself); any other failure before an answer is a 502
// written to w, saying to retry, and returned.
func (f *Fleet) Forward(w http.ResponseWriter, r *http.Request, instance, addr, principal string, body []byte) error {
	target, err := url.Parse(addr)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNotPeer, err)
	}
	var failed error
	// A span of its own under the request's (when that records), whose W3C trace context
	// (traceparent) goes with the request: the holder's spans continue this trace. The
	// signature does not cover it: it is trusted for nothing but correlation.
	ctx, span := tracing.Child(r.Context(), trace.SpanKindClient, tracing.SpanForward, "")
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(tracing.Instance.String(f.Instance()), tracing.Target.String(tracing.Text(instance)))
		r = r.WithContext(ctx)
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = target.Host
			pr.Out.Body = httpBody(body)
			// A pooled connection the holder closed as the request went out (its server
			// shutting down at a drain, or closing an idle connection) is no answer: the
			// transport sends the request again on a new connection. It may only for a
			// request it can replay (GetBody, and a key that marks it replayable), and does
			// only when the connection was a reused one: the same request, the same nonce,
			// which the holder refuses should it have read it the first time.
			pr.Out.GetBody = func() (io.ReadCloser, error) { return httpBody(body), nil }
			pr.Out.ContentLength = int64(len(body))
			pr.Out.Header.Set("Content-Length", strconv.Itoa(len(body)))
			pr.Out.Header.Del("X-Forwarded-For") // the receiver trusts the signature, not these
			propagation.TraceContext{}.Inject(pr.Out.Context(), propagation.HeaderCarrier(pr.Out.Header))
			f.Sign(pr.Out, instance, principal, body)
			pr.Out.Header.Set("Idempotency-Key", pr.Out.Header.Get(HeaderNonce))
		},
		Transport:     f.client.Transport,
		FlushInterval: -1, // SSE: every event as it comes
		ModifyResponse: func(resp *http.Response) error {
			if resp.StatusCode == http.StatusConflict && resp.Header.Get(HeaderNotHolder) != "" {
				resp.Body.Close()
				return ErrNotHolder
			}
			if resp.StatusCode == http.StatusMisdirectedRequest && resp.Header.Get(HeaderInstance) != "" {
				resp.Body.Close()
				return fmt.Errorf("%w: replica %s answers at its address", ErrMisdirected, resp.Header.Get(HeaderInstance))
			}
			if resp.Header.Get(HeaderHop) == "" {
				resp.Header.Set(HeaderHop, instance)
			}
			if span.IsRecording() {
				span.SetAttributes(tracing.HTTPStatus.Int(resp.StatusCode))
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			failed = err
			if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, ErrNotHolder) || errors.Is(err, ErrMisdirected) {
				return // written nothing: the caller serves it, or finds the holder again
			}
			if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
				return // the client went
			}
			w.Header().Set("Retry-After", "1")
			http.Error(w, "the replica holding this project did not answer in time; retry the request", http.StatusBadGateway)
		},
	}
	rp.ServeHTTP(w, r)
	switch {
	case failed == nil:
		return nil
	case errors.Is(failed, syscall.ECONNREFUSED), errors.Is(failed, ErrMisdirected):
		span.SetStatus(codes.Error, "the replica refused the connection, or is gone")
		return fmt.Errorf("%w: %v", ErrUnreachable, failed)
	case errors.Is(failed, ErrNotHolder):
		return failed
	default:
		span.SetStatus(codes.Error, "the replica did not answer")
		return fmt.Errorf("forwarding to replica %s: %w", instance, failed)
	}
}

type bodyReader struct{ *bytes.Reader }

func (bodyReader) Close() error { return nil }

func httpBody(b []byte) bodyReader { return bodyReader{bytes.NewReader(b)} }
