//go:build linux

package agent

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/envd/client"
	"github.com/toolhost/toolhost/internal/testenv"
)

// TestEgressRelay: with EgressConfig.Relay, a command's connection to the egress port is
// carried to the relay address, opened by a hello with the key of the agent's token (never
// the token) and the command's tag, its bytes passed both ways.
func TestEgressRelay(t *testing.T) {
	relay, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	// A free loopback port for the egress listener (taken and released).
	pl, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := pl.Addr().(*net.TCPAddr).Port
	pl.Close()
	_, c, _ := agentWith(t, Config{Egress: &EgressConfig{Port: port, Relay: relay.Addr().String()}}, nil)

	got := make(chan envd.EgressHello, 1)
	go func() { // ends with relay's close (deferred above)
		conn, err := relay.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		h, err := envd.ReadEgressHello(conn)
		if err != nil {
			t.Errorf("hello: %v", err)
			return
		}
		got <- h
		b := make([]byte, 5)
		if _, err := io.ReadFull(conn, b); err != nil {
			return
		}
		conn.Write(append([]byte("relayed "), b...))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	script := "exec 3<>/dev/tcp/127.0.0.1/" + strconv.Itoa(port) + "; printf hello >&3; head -c 13 <&3"
	res, err := c.Exec(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", script}, Tag: "cmd-7"})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "relayed hello" {
		t.Errorf("through the relay: %q %q exit %d", res.Stdout, res.Stderr, res.ExitCode)
	}
	select {
	case h := <-got:
		if h.Key != envd.EgressKey("") || h.Command != "cmd-7" {
			t.Errorf("hello %+v, want the key of the agent's token and command cmd-7", h)
		}
	default:
		t.Error("no hello reached the relay")
	}
}

// TestEgressRelayMoves: the host that takes a sandbox over moves its agent's relay
// (envd.PathEgressRelay) with the sandbox's access token: from then on connections go to
// the new relay with the new key, and the one open to the earlier relay ends. Without the
// token (what a process in the sandbox has) or with another, the agent refuses and keeps
// its relay; an agent without a token, or without a relay, moves nothing.
func TestEgressRelayMoves(t *testing.T) {
	listen := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	relayA, relayB := listen(), listen()
	pl := listen()
	port := pl.Addr().(*net.TCPAddr).Port
	pl.Close()
	token := strings.Repeat("7", 64)
	_, _, sock := agentWith(t, Config{AccessToken: token, Egress: &EgressConfig{Port: port, Relay: relayA.Addr().String()}}, nil)
	as := func(tok string) *client.Client {
		c, err := client.New(client.Config{SocketPath: sock, Header: http.Header{envd.HeaderAccessToken: {tok}}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := as(token)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()

	// accept takes one relayed connection: its hello, and the first byte after it.
	accept := func(l net.Listener) (net.Conn, envd.EgressHello) {
		t.Helper()
		conn, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(testenv.HangBound))
		h, err := envd.ReadEgressHello(conn)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(conn, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		return conn, h
	}
	// A connection open through relay A, held by a background command.
	script := "exec 3<>/dev/tcp/127.0.0.1/" + strconv.Itoa(port) + "; printf x >&3; cat <&3"
	if _, err := c.Start(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", script}, Tag: "cmd-held"}); err != nil { // killed with the agent
		t.Fatal(err)
	}
	held, h := accept(relayA)
	if h.Key != envd.EgressKey(token) {
		t.Errorf("hello to the first relay: %+v, want the key of the token", h)
	}

	key := strings.Repeat("ab", 32)
	move := envd.EgressRelayRequest{Relay: relayB.Addr().String(), Key: key}
	var ee *envd.Error
	for _, tok := range []string{"", strings.Repeat("0", 64)} {
		if err := as(tok).SetEgressRelay(ctx, move); !errors.As(err, &ee) || ee.Status != http.StatusUnauthorized {
			t.Errorf("moving the relay with token %q: %v, want 401", tok, err)
		}
	}
	if err := c.SetEgressRelay(ctx, envd.EgressRelayRequest{Relay: relayB.Addr().String(), Key: "not hex"}); !errors.As(err, &ee) || ee.Status != http.StatusBadRequest {
		t.Errorf("a bad key: %v, want 400", err)
	}
	if err := c.SetEgressRelay(ctx, envd.EgressRelayRequest{Relay: "nowhere", Key: key}); !errors.As(err, &ee) || ee.Status != http.StatusBadRequest {
		t.Errorf("a bad relay address: %v, want 400", err)
	}
	// Still relay A: the refused moves moved nothing, and the held connection is open.
	res, err := c.Exec(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/" + strconv.Itoa(port) + "; printf y >&3"}, Tag: "cmd-a"})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("a connection before the move: %v %+v", err, res)
	}
	conn, h := accept(relayA)
	conn.Close()
	if h.Key != envd.EgressKey(token) {
		t.Errorf("hello before the move: %+v, want the key of the token", h)
	}

	if err := c.SetEgressRelay(ctx, move); err != nil {
		t.Fatal(err)
	}
	// The connection to relay A ends...
	if n, err := held.Read(make([]byte, 1)); err == nil {
		t.Errorf("the connection to the earlier relay is still open after the move (read %d bytes)", n)
	}
	// ...and the next goes to relay B, with the new key.
	res, err = c.Exec(ctx, sandbox.ExecRequest{Argv: []string{"bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/" + strconv.Itoa(port) + "; printf z >&3"}, Tag: "cmd-b"})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("a connection after the move: %v %+v", err, res)
	}
	conn, h = accept(relayB)
	conn.Close()
	if h.Key != key {
		t.Errorf("hello after the move: %+v, want key %s", h, key)
	}

	// An agent without a token trusts whoever reaches it: it moves no relay. One without
	// a relay has none to move.
	_, open, _ := agentWith(t, Config{Egress: &EgressConfig{Port: 0, Relay: relayA.Addr().String()}}, nil)
	if err := open.SetEgressRelay(ctx, move); !errors.As(err, &ee) || ee.Status != http.StatusForbidden {
		t.Errorf("moving the relay of an agent without a token: %v, want 403", err)
	}
	_, _, sock = agentWith(t, Config{AccessToken: token}, nil)
	if err := as(token).SetEgressRelay(ctx, move); !errors.As(err, &ee) || ee.Status != http.StatusConflict {
		t.Errorf("moving the relay of an agent without one: %v, want 409", err)
	}
}

// TestTrust: the certificates a host gives (envd.PathTrust) are written to the trust
// directory, with a bundle of the image's and them, each replaced whole (a link put at a
// file's name is replaced, never written through); anything but PEM certificates is refused
// and writes nothing.
func TestTrust(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "trust")
	_, c, _ := agentWith(t, Config{TrustDir: dir}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	var ee *envd.Error
	for _, bad := range []string{"", "not pem", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"} {
		if err := c.SetTrust(ctx, []byte(bad)); !errors.As(err, &ee) || ee.Status != http.StatusBadRequest {
			t.Errorf("trust %q: %v, want 400", bad, err)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused trust wrote the directory: %v", err)
	}
	ca := testCA(t)
	// A link at the bundle's name, to a file the sandbox's user may write: replaced.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("untouched"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, envd.TrustBundle)); err != nil {
		t.Fatal(err)
	}
	if err := c.SetTrust(ctx, ca); err != nil {
		t.Fatal(err)
	}
	extra, err := os.ReadFile(filepath.Join(dir, envd.TrustExtra))
	if err != nil || !bytes.Equal(extra, ca) {
		t.Errorf("%s: %q %v", envd.TrustExtra, extra, err)
	}
	bundle, err := os.ReadFile(filepath.Join(dir, envd.TrustBundle))
	if err != nil || !bytes.HasSuffix(bundle, ca) {
		t.Errorf("%s does not end with the certificates given: %v", envd.TrustBundle, err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "untouched" {
		t.Errorf("the trust was written through a link: %q", b)
	}
}

// testCA is a self-signed CA certificate, PEM.
func testCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		BasicConstraintsValid: true, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
