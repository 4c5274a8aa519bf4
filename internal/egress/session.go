package egress

import (
	"net"
	"sync"

	"github.com/toolhost/toolhost/core/sandbox"
)

// SessionConfig is what the sandboxes of one session share at the gateway.
type SessionConfig struct {
	// Project names the session's project in the audit.
	Project string
	Policy  *Policy
	// Budget is the session's bytes (sandbox.egress.max_bytes); nil is unlimited.
	Budget *Budget
	Limits Limits
	Inject []Injection
}

// SessionGateway is the gateway's side of one toolhost session: each sandbox it opens (the
// first, and each that replaces it) gets a door with the session's policy, spending the
// session's budget. It implements sandbox.EgressGateway.
type SessionGateway struct {
	g   *Gateway
	cfg SessionConfig

	mu    sync.Mutex
	doors map[*Client]struct{}
}

var _ sandbox.EgressGateway = (*SessionGateway)(nil)

// Session starts the gateway's side of a session.
func (g *Gateway) Session(cfg SessionConfig) *SessionGateway {
	return &SessionGateway{g: g, cfg: cfg, doors: map[*Client]struct{}{}}
}

// Open makes the door of sandbox id.
func (s *SessionGateway) Open(id string) (sandbox.EgressDoor, error) {
	s.mu.Lock()
	p := s.cfg.Policy
	s.mu.Unlock()
	c, err := s.g.NewClient(ClientConfig{Sandbox: id, Project: s.cfg.Project, Policy: p, Budget: s.cfg.Budget, Limits: s.cfg.Limits, Inject: s.cfg.Inject})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.doors[c] = struct{}{}
	s.mu.Unlock()
	return &door{c: c, s: s}, nil
}

// Policy is the session's policy.
func (s *SessionGateway) Policy() *Policy {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.Policy
}

// SetPolicy changes the policy of the session's open doors (for new connections) and of
// those it opens next.
func (s *SessionGateway) SetPolicy(p *Policy) {
	s.mu.Lock()
	s.cfg.Policy = p
	doors := make([]*Client, 0, len(s.doors))
	for c := range s.doors {
		doors = append(doors, c)
	}
	s.mu.Unlock()
	for _, c := range doors {
		c.SetPolicy(p)
	}
}

// Budget is the session's budget (nil: unlimited).
func (s *SessionGateway) Budget() *Budget { return s.cfg.Budget }

// door adapts a Client to sandbox.EgressDoor.
type door struct {
	c *Client
	s *SessionGateway
}

func (d *door) ServeConn(conn net.Conn, command string) {
	d.c.ServeConn(conn, ConnInfo{Command: command})
}

func (d *door) CACert() []byte { return d.c.CACert() }

func (d *door) Refused(command string) []string {
	rs := d.c.TakeRefusals(command)
	if len(rs) == 0 {
		return nil
	}
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Reason
	}
	return out
}

func (d *door) Close() {
	d.s.mu.Lock()
	delete(d.s.doors, d.c)
	d.s.mu.Unlock()
	d.c.Close()
}

// NoteOf is the line a tool result ends with for the refusals of its commands (each
// sentence once), or "".
func NoteOf(reasons []string) string {
	seen := map[string]bool{}
	var rs []Refusal
	for _, r := range reasons {
		if !seen[r] {
			seen[r] = true
			rs = append(rs, Refusal{Reason: r})
		}
	}
	return Note(rs)
}
