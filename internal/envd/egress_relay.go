package envd

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
)

// The egress relay: how a sandbox that runs on another machine (a Kubernetes pod) reaches
// the host's egress gateway. Its agent listens on 127.0.0.1:sandbox.EgressPort as the
// local agent does and, for each connection, dials the gateway's relay address over TCP,
// sends one EgressHello (its length in two bytes, big-endian, then its JSON) and from then
// on carries the connection's bytes both ways; the gateway's side reads the hello and
// serves the rest as a connection of the sandbox whose key it names.
//
// The key is EgressKey of the sandbox's access token: the host knows it from the token it
// gave, the agent from the token it holds (removed from the sandbox's environment, the
// agent undumpable), and the access token itself never travels to the relay address.

// EgressRelayRequest is the body of PathEgressRelay: the host that takes a sandbox over
// gives its agent its own relay's address and the key that names the sandbox there (a
// fresh one: what the earlier host knew names nothing at the new one).
type EgressRelayRequest struct {
	Relay string `json:"relay"`
	Key   string `json:"key"`
}

// Check says what is wrong with r, if anything: Relay must be host:port, Key 64 hex digits.
func (r EgressRelayRequest) Check() error {
	host, port, err := net.SplitHostPort(r.Relay)
	if err != nil || host == "" {
		return fmt.Errorf("relay %q is not host:port", r.Relay)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("relay %q: port %q is not a port", r.Relay, port)
	}
	if b, err := hex.DecodeString(r.Key); err != nil || len(b) != 32 {
		return errors.New("the key is not 64 hex digits")
	}
	return nil
}

// EgressHello opens a relayed connection.
type EgressHello struct {
	// Key names the sandbox (EgressKey of its access token).
	Key string `json:"key"`
	// Command is the Tag of the command that made the connection ("" when unknown): the
	// sandbox's word, a label at most.
	Command string `json:"command,omitempty"`
}

// MaxEgressHello bounds an EgressHello's JSON.
const MaxEgressHello = 512

// EgressKey is the relay key of the sandbox whose access token is token: an HMAC of a
// fixed label under the token, 64 hex digits.
func EgressKey(token string) string {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("toolhost egress relay v1"))
	return hex.EncodeToString(m.Sum(nil))
}

// WriteEgressHello writes h, framed.
func WriteEgressHello(w io.Writer, h EgressHello) error {
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	if len(b) > MaxEgressHello {
		return fmt.Errorf("egress hello of %d bytes (at most %d)", len(b), MaxEgressHello)
	}
	buf := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(b)), uint16(len(b)))
	_, err = w.Write(append(buf, b...))
	return err
}

// ReadEgressHello reads one framed EgressHello, and not a byte past it (what follows is
// the connection's own stream).
func ReadEgressHello(r io.Reader) (EgressHello, error) {
	var h EgressHello
	var n [2]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return h, fmt.Errorf("egress hello: %w", err)
	}
	size := int(binary.BigEndian.Uint16(n[:]))
	if size == 0 || size > MaxEgressHello {
		return h, fmt.Errorf("egress hello of %d bytes (at most %d)", size, MaxEgressHello)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return h, fmt.Errorf("egress hello: %w", err)
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return h, fmt.Errorf("egress hello: %w", err)
	}
	if h.Key == "" {
		return h, errors.New("egress hello without a key")
	}
	return h, nil
}
