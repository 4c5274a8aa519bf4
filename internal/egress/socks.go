package egress

import (
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// SOCKS5 (RFC 1928): no authentication, the CONNECT command, destinations by name
// (socks5h://, the gateway resolves) or by address. A refusal is a reply code, which
// carries no text: the bash note tells the model why.

const (
	socks5Version     = 0x05
	socks4Version     = 0x04
	socks4Rejected    = 0x5b // SOCKS4's "request rejected or failed"
	socksNoAuth       = 0x00
	socksNoAcceptable = 0xff
	socksCmdConnect   = 0x01
	socksAtypIPv4     = 0x01
	socksAtypDomain   = 0x03
	socksAtypIPv6     = 0x04

	socksGeneralFailure     = 0x01
	socksNotAllowed         = 0x02
	socksHostUnreachable    = 0x04
	socksConnRefused        = 0x05
	socksCmdNotSupported    = 0x07
	socksAtypNotSupported   = 0x08
	socksReplyBoundIPv4Zero = "\x00\x01\x00\x00\x00\x00\x00\x00"
)

func (s *session) socks() {
	started := time.Now()
	_ = s.conn.SetReadDeadline(time.Now().Add(handshakeTimeout))
	var hdr [2]byte
	if _, err := io.ReadFull(s.br, hdr[:]); err != nil {
		return
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(s.br, methods); err != nil {
		return
	}
	ok := false
	for _, m := range methods {
		ok = ok || m == socksNoAuth
	}
	if !ok {
		_, _ = s.m.ctl().Write([]byte{socks5Version, socksNoAcceptable})
		return
	}
	if _, err := s.m.ctl().Write([]byte{socks5Version, socksNoAuth}); err != nil {
		return
	}
	var req [4]byte
	if _, err := io.ReadFull(s.br, req[:]); err != nil {
		return
	}
	if req[0] != socks5Version {
		return
	}
	hostText, raw, err := s.socksAddr(req[3])
	if err != nil {
		s.socksReply(socksAtypNotSupported)
		return
	}
	var pb [2]byte
	if _, err := io.ReadFull(s.br, pb[:]); err != nil {
		return
	}
	_ = s.conn.SetReadDeadline(time.Time{})
	port := int(binary.BigEndian.Uint16(pb[:]))
	if req[1] != socksCmdConnect {
		// BIND and UDP ASSOCIATE would open the sandbox to the outside or to UDP.
		d := decision{h: host{raw: raw}, port: port}
		if h, err := parseHost(hostText); err == nil {
			d.h = h
		}
		d.v = refuse("SOCKS5 command "+strconv.Itoa(int(req[1])), "only SOCKS5 CONNECT is allowed (no BIND, no UDP)")
		s.refused(s.record("socks5", d), d, started)
		s.socksReply(socksCmdNotSupported)
		return
	}
	if port == 0 {
		s.socksReply(socksGeneralFailure)
		return
	}
	d := s.decide(s.c.ctx, hostText, port)
	if d.h.raw == "" {
		d.h.raw = raw
	}
	r := s.record("socks5", d)
	if !d.v.Allowed {
		code := byte(socksNotAllowed)
		if d.v.Status == 502 {
			code = socksHostUnreachable
		}
		s.refused(r, d, started)
		s.socksReply(code)
		return
	}
	s.tunnel(r, d, started, func() error {
		_, err := io.WriteString(s.m.ctl(), "\x05\x00"+socksReplyBoundIPv4Zero)
		return err
	}, func(v Verdict) {
		code := byte(socksHostUnreachable)
		if strings.Contains(v.Reason, "refused") {
			code = socksConnRefused
		}
		s.socksReply(code)
	})
}

// socksAddr reads DST.ADDR: the text to decide, and the raw form for messages.
func (s *session) socksAddr(atyp byte) (string, string, error) {
	switch atyp {
	case socksAtypIPv4:
		var b [4]byte
		if _, err := io.ReadFull(s.br, b[:]); err != nil {
			return "", "", err
		}
		a := netip.AddrFrom4(b).String()
		return a, a, nil
	case socksAtypIPv6:
		var b [16]byte
		if _, err := io.ReadFull(s.br, b[:]); err != nil {
			return "", "", err
		}
		a := netip.AddrFrom16(b)
		return "[" + a.String() + "]", a.String(), nil
	case socksAtypDomain:
		var l [1]byte
		if _, err := io.ReadFull(s.br, l[:]); err != nil {
			return "", "", err
		}
		b := make([]byte, l[0])
		if _, err := io.ReadFull(s.br, b); err != nil {
			return "", "", err
		}
		return string(b), string(b), nil
	}
	return "", "", errors.New("unknown address type")
}

func (s *session) socksReply(code byte) {
	_, _ = io.WriteString(s.m.ctl(), "\x05"+string([]byte{code})+socksReplyBoundIPv4Zero)
}
