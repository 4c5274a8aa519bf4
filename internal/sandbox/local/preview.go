//go:build linux

package local

import (
	"context"
	"fmt"
	"net/url"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/preview"
)

var _ sandbox.PortLister = (*Sandbox)(nil)

// Ports lists the TCP ports that processes of the sandbox listen on (never the host's,
// even with the host network).
func (s *Sandbox) Ports(ctx context.Context) ([]envd.ListeningPort, error) {
	if err := s.refused(); err != nil {
		return nil, err
	}
	ps, err := s.client.Ports(ctx)
	if err != nil {
		return nil, s.wrap(fmt.Errorf("sandbox %s: %w", s.id, err))
	}
	return ps, nil
}

// PreviewURL maps port inside the sandbox to http://127.0.0.1:HOSTPORT/ on the host: a
// listener on the host's loopback, started on the first call for the port and reused
// after, whose connections go through the agent's socket (client.Client.DialPort). So a
// preview needs no network in the sandbox, and it reaches only a port that a process of
// the sandbox listens on; each connection is checked again by the agent (package
// preview). The listener and its connections end with the sandbox.
func (s *Sandbox) PreviewURL(ctx context.Context, port int) (*url.URL, error) {
	return s.previews.URL(ctx, preview.Sandbox{ID: s.id, Ports: s.Ports, Dial: s.client.DialPort, Refused: s.refused, Log: s.log}, port)
}
