package kubernetes

import (
	"context"
	"net/url"

	"github.com/toolhost/toolhost/internal/preview"
)

// PreviewURL maps port inside the sandbox to http://127.0.0.1:HOSTPORT/ on the host: a
// listener on the host's loopback, started on the first call for the port and reused
// after, whose connections go through the agent (client.Client.DialPort, with the access
// token), as the local provider's do (package preview). So a preview needs nothing of the
// pod but its agent's port, reaches only a port that a process of the sandbox listens on,
// and each connection is checked again by the agent. The listener and its connections end
// with the sandbox.
func (s *Sandbox) PreviewURL(ctx context.Context, port int) (*url.URL, error) {
	return s.previews.URL(ctx, preview.Sandbox{ID: s.id, Ports: s.Ports, Dial: s.client.DialPort, Refused: s.refused, Log: s.log}, port)
}
