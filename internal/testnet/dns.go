//go:build linux

package testnet

import (
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// dnsServer answers A and AAAA questions from a table the test sets, over UDP and TCP;
// any other name does not exist. It is authoritative for everything: the test's internet
// has no other DNS.
type dnsServer struct {
	udp net.PacketConn
	tcp net.Listener

	mu      sync.Mutex
	records map[string][]netip.Addr // lower case, no trailing dot
	queries atomic.Int64
	wg      sync.WaitGroup
}

func startDNS(ns *netns, at netip.AddrPort) (*dnsServer, error) {
	s := &dnsServer{records: map[string][]netip.Addr{}}
	var err error
	if s.udp, err = ns.listenPacket("udp", at.String()); err != nil {
		return nil, err
	}
	if s.tcp, err = ns.listen("tcp", at.String()); err != nil {
		s.udp.Close()
		return nil, err
	}
	s.wg.Add(2)
	go func() { // owned by s: close ends it
		defer s.wg.Done()
		s.serveUDP()
	}()
	go func() { // owned by s: close ends it
		defer s.wg.Done()
		s.serveTCP()
	}()
	return s, nil
}

func (s *dnsServer) set(name string, addrs []netip.Addr) {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(addrs) == 0 {
		delete(s.records, name)
		return
	}
	s.records[name] = append([]netip.Addr(nil), addrs...)
}

func (s *dnsServer) close() {
	s.udp.Close()
	s.tcp.Close()
	s.wg.Wait()
}

func (s *dnsServer) serveUDP() {
	buf := make([]byte, 1500)
	for {
		n, from, err := s.udp.ReadFrom(buf)
		if err != nil {
			return
		}
		if ans := s.answer(buf[:n]); ans != nil {
			_, _ = s.udp.WriteTo(ans, from)
		}
	}
}

func (s *dnsServer) serveTCP() {
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		c, err := s.tcp.Accept()
		if err != nil {
			return
		}
		conns.Add(1)
		go func() { // owned by serveTCP, which waits for it
			defer conns.Done()
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			var l [2]byte
			if _, err := io.ReadFull(c, l[:]); err != nil {
				return
			}
			q := make([]byte, binary.BigEndian.Uint16(l[:]))
			if _, err := io.ReadFull(c, q); err != nil {
				return
			}
			ans := s.answer(q)
			if ans == nil {
				return
			}
			out := make([]byte, 2+len(ans))
			binary.BigEndian.PutUint16(out, uint16(len(ans)))
			copy(out[2:], ans)
			_, _ = c.Write(out)
		}()
	}
}

// answer makes the response to one query, or nil for garbage.
func (s *dnsServer) answer(q []byte) []byte {
	var m dnsmessage.Message
	if err := m.Unpack(q); err != nil || len(m.Questions) != 1 {
		return nil
	}
	s.queries.Add(1)
	question := m.Questions[0]
	name := strings.ToLower(strings.TrimSuffix(question.Name.String(), "."))
	s.mu.Lock()
	addrs, ok := s.records[name]
	s.mu.Unlock()
	resp := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: m.ID, Response: true, Authoritative: true, RecursionDesired: m.RecursionDesired, RecursionAvailable: true},
		Questions: m.Questions,
	}
	if !ok {
		resp.RCode = dnsmessage.RCodeNameError
	}
	for _, a := range addrs {
		hdr := dnsmessage.ResourceHeader{Name: question.Name, Class: dnsmessage.ClassINET, TTL: 1}
		switch {
		case question.Type == dnsmessage.TypeA && a.Is4():
			hdr.Type = dnsmessage.TypeA
			resp.Answers = append(resp.Answers, dnsmessage.Resource{Header: hdr, Body: &dnsmessage.AResource{A: a.As4()}})
		case question.Type == dnsmessage.TypeAAAA && a.Is6():
			hdr.Type = dnsmessage.TypeAAAA
			resp.Answers = append(resp.Answers, dnsmessage.Resource{Header: hdr, Body: &dnsmessage.AAAAResource{AAAA: a.As16()}})
		}
	}
	b, err := resp.Pack()
	if err != nil {
		return nil
	}
	return b
}
