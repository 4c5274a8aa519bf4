//go:build linux

package egress_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/egress"
)

// The figures of docs/BENCHMARKS.md (issue 22), measured in the test internet: the same
// work directly from the host side and through the gateway, alternately in one run, so
// the ratio compares like with like on a loaded machine.
//
//	go test -run '^$' -bench 'Gateway' -count 5 ./internal/egress/

// gatewayOnHostSide serves the fixture's client on the host side's loopback too, so a
// client there reaches the gateway the way it reaches the test host directly: both dials
// start on the same side.
func gatewayOnHostSide(b *testing.B, f *fixture) string {
	l, err := f.n.ListenHost("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = f.c.Serve(l) }() // ends when the fixture closes its client
	return l.Addr().String()
}

// BenchmarkGatewayTTFB: a fresh connection, one GET, the first byte of the answer.
// Through the gateway, the request is absolute-form to the proxy on the host side's
// loopback (as a sandbox's connection arrives), which resolves (cached, as by default),
// decides, connects and forwards.
func BenchmarkGatewayTTFB(b *testing.B) {
	f := newFixture(b, testSpec, func(cfg *egress.Config, _ *egress.ClientConfig) { cfg.CacheTTL = 0 })
	gw := gatewayOnHostSide(b, f)
	direct := func() (time.Duration, error) {
		start := time.Now()
		c, err := f.n.DialContext(context.Background(), "tcp", netip.AddrPortFrom(f.reg, 80).String())
		if err != nil {
			return 0, err
		}
		defer c.Close()
		io.WriteString(c, "GET /hello HTTP/1.1\r\nHost: registry.test\r\n\r\n")
		var one [1]byte
		if _, err := io.ReadFull(c, one[:]); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	}
	gateway := func() (time.Duration, error) {
		start := time.Now()
		c, err := f.n.DialContext(context.Background(), "tcp", gw)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		io.WriteString(c, "GET http://registry.test/hello HTTP/1.1\r\nHost: registry.test\r\n\r\n")
		var one [1]byte
		if _, err := io.ReadFull(c, one[:]); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	}
	// Warm both paths (the resolver's cache, the worker threads).
	for range 20 {
		if _, err := direct(); err != nil {
			b.Fatal(err)
		}
		if _, err := gateway(); err != nil {
			b.Fatal(err)
		}
	}
	var ds, gs []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		first, second := direct, gateway // alternate, so neither always runs on the warmer path
		if i%2 == 1 {
			first, second = gateway, direct
		}
		x, err := first()
		if err != nil {
			b.Fatal(err)
		}
		y, err := second()
		if err != nil {
			b.Fatal(err)
		}
		if i%2 == 1 {
			x, y = y, x
		}
		ds, gs = append(ds, x), append(gs, y)
	}
	dp, gp := p50(ds), p50(gs)
	b.ReportMetric(float64(dp.Microseconds()), "direct-p50-µs")
	b.ReportMetric(float64(gp.Microseconds()), "gateway-p50-µs")
	b.ReportMetric(float64((gp - dp).Microseconds()), "overhead-p50-µs")
}

func p50(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// throughputSize is what one download of the throughput benchmarks moves.
const throughputSize = 64 << 20

// download sends a GET of throughputSize bytes from registry.test on c, with target as the
// request's target (a path, or an absolute URL for the forward proxy), reads the answer
// to its end and closes c.
func download(c net.Conn, target string) error {
	defer c.Close()
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: registry.test\r\nConnection: close\r\n\r\n", target)
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 64<<10), nil)
	if err != nil {
		return err
	}
	n, err := io.CopyBuffer(io.Discard, resp.Body, make([]byte, 64<<10))
	if err == nil && n != throughputSize {
		err = fmt.Errorf("read %d bytes of %d", n, throughputSize)
	}
	return err
}

// interleaved runs direct and through alternately, the first of each round turning, and
// reports both throughputs and their ratio (name: "tunnel" or "proxy").
func interleaved(b *testing.B, name string, direct, through func() (time.Duration, error)) {
	var dt, gt time.Duration
	b.SetBytes(2 * throughputSize)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		first, second := direct, through
		if i%2 == 1 {
			first, second = through, direct
		}
		x, err := first()
		if err != nil {
			b.Fatal(err)
		}
		y, err := second()
		if err != nil {
			b.Fatal(err)
		}
		if i%2 == 1 {
			x, y = y, x
		}
		dt += x
		gt += y
	}
	mbps := func(d time.Duration) float64 { return float64(throughputSize) * float64(b.N) / d.Seconds() / (1 << 20) }
	b.ReportMetric(mbps(dt), "direct-MiB/s")
	b.ReportMetric(mbps(gt), name+"-MiB/s")
	b.ReportMetric(mbps(gt)/mbps(dt), name+"/direct")
}

// BenchmarkGatewayForwardThroughput: 64 MiB down one connection, directly and through
// the gateway as a plain-http forward proxy (an absolute-form GET, what HTTP_PROXY does),
// alternately in one run.
func BenchmarkGatewayForwardThroughput(b *testing.B) {
	f := newFixture(b, testSpec)
	gw := gatewayOnHostSide(b, f)
	direct := func() (time.Duration, error) {
		start := time.Now()
		c, err := f.n.DialContext(context.Background(), "tcp", netip.AddrPortFrom(f.reg, 80).String())
		if err != nil {
			return 0, err
		}
		err = download(c, fmt.Sprintf("/bytes?n=%d", throughputSize))
		return time.Since(start), err
	}
	proxy := func() (time.Duration, error) {
		start := time.Now()
		c, err := f.n.DialContext(context.Background(), "tcp", gw)
		if err != nil {
			return 0, err
		}
		err = download(c, fmt.Sprintf("http://registry.test/bytes?n=%d", throughputSize))
		return time.Since(start), err
	}
	interleaved(b, "proxy", direct, proxy)
}

// BenchmarkGatewayConnectThroughput: 64 MiB down one connection, directly and through a
// CONNECT tunnel, alternately in one run.
func BenchmarkGatewayConnectThroughput(b *testing.B) {
	const size = throughputSize
	f := newFixture(b, testSpec)
	gw := gatewayOnHostSide(b, f)
	get := func(c net.Conn) error { return download(c, fmt.Sprintf("/bytes?n=%d", size)) }
	direct := func() (time.Duration, error) {
		start := time.Now()
		c, err := f.n.DialContext(context.Background(), "tcp", netip.AddrPortFrom(f.reg, 80).String())
		if err != nil {
			return 0, err
		}
		err = get(c)
		return time.Since(start), err
	}
	tunnel := func() (time.Duration, error) {
		start := time.Now()
		c, err := f.n.DialContext(context.Background(), "tcp", gw)
		if err != nil {
			return 0, err
		}
		io.WriteString(c, "CONNECT registry.test:80 HTTP/1.1\r\nHost: registry.test:80\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil || resp.StatusCode != 200 || br.Buffered() > 0 {
			c.Close()
			return 0, fmt.Errorf("CONNECT: %v %v", resp, err)
		}
		err = get(c)
		return time.Since(start), err
	}
	interleaved(b, "tunnel", direct, tunnel)
}
