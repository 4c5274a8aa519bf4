package toolhost

import (
	"fmt"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/toolhost/toolhost/internal/storekeys"
)

func (c *Config) validateServe(bad badKey) error {
	s := &c.Serve
	if strings.TrimSpace(s.Listen) == "" {
		return bad("serve.listen", "is empty (e.g. 127.0.0.1:8750)")
	}
	for i, t := range s.Tokens {
		key := fmt.Sprintf("serve.tokens[%d]", i)
		if len(t.Token) < 16 {
			return bad(key+".token", "must be at least 16 characters (openssl rand -hex 32 makes one)")
		}
		for _, p := range t.Projects {
			if err := storekeys.ValidProject(p); err != nil {
				return bad(key+".projects", "%v", err)
			}
		}
		if t.Egress != nil {
			if c.Sandbox.Network != NetworkEgress {
				return bad(key+".egress", "narrows the egress policy, which needs sandbox.network egress (it is %s)", c.Sandbox.Network)
			}
			if err := c.checkNarrowing(t.Egress); err != nil {
				return bad(key+".egress", "%v", err)
			}
		}
	}
	for project, dir := range s.Workspaces {
		if err := storekeys.ValidProject(project); err != nil {
			return bad("serve.workspaces", "%v", err)
		}
		if !filepath.IsAbs(dir) {
			return bad("serve.workspaces."+project, "must be an absolute path, got %q", dir)
		}
	}
	if s.MaxSessions < 1 {
		return bad("serve.max_sessions", "must be at least 1, got %d", s.MaxSessions)
	}
	if s.IdleTimeout <= 0 {
		return bad("serve.idle_timeout", "must be positive, got %s", s.IdleTimeout)
	}
	switch s.Drain {
	case DrainClose, DrainHandoff:
	default:
		return bad("serve.drain", "must be %s or %s, got %q", DrainClose, DrainHandoff, s.Drain)
	}
	if err := validateFleet(&s.Fleet, bad); err != nil {
		return err
	}
	if s.MaxBodyBytes < 64<<10 {
		return bad("serve.max_body_bytes", "must be at least 65536, got %d", s.MaxBodyBytes)
	}
	return nil
}

func validateFleet(f *FleetConfig, bad badKey) error {
	if f.Advertise == "" {
		if f.SecretFile != "" || len(f.Peers) > 0 {
			return bad("serve.fleet.advertise", "is empty while serve.fleet.secret_file or serve.fleet.peers is set: a replica of a fleet says where the others reach it (http://ADDRESS:PORT)")
		}
		return nil
	}
	u, err := url.Parse(f.Advertise)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || u.Path != "" && u.Path != "/" || u.User != nil || u.RawQuery != "" {
		return bad("serve.fleet.advertise", "must be a URL of the form http://ADDRESS:PORT, got %q", f.Advertise)
	}
	// The other replicas dial it, and check it against serve.fleet.peers, as an address:
	// a name (or a variable the shell did not expand, $(POD_IP)) is refused here.
	if _, err := netip.ParseAddr(strings.Trim(u.Hostname(), "[]")); err != nil || u.Port() == "" {
		return bad("serve.fleet.advertise", "must name this replica by IP address and port (http://10.1.2.3:8750), got %q", f.Advertise)
	}
	if f.SecretFile == "" {
		return bad("serve.fleet.secret_file", "is empty: the replicas of a fleet sign what they send each other with a shared secret (openssl rand -hex 32 > FILE; chmod 600 FILE)")
	}
	if !filepath.IsAbs(f.SecretFile) {
		return bad("serve.fleet.secret_file", "must be an absolute path, got %q", f.SecretFile)
	}
	if f.OrphanAfter < time.Second {
		return bad("serve.fleet.orphan_after", "must be at least 1s, got %s (how long the sandboxes of a project nobody holds wait for a replica to reconnect; default 15m)", f.OrphanAfter)
	}
	for _, p := range f.Peers {
		if _, err := netip.ParsePrefix(p); err != nil {
			return bad("serve.fleet.peers", "%q is not an address range (CIDR, e.g. 10.0.0.0/8)", p)
		}
	}
	return nil
}
