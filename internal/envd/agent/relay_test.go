//go:build linux

package agent

import (
	"context"
	"io"
	"net"
	"strconv"
	"testing"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
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
