package toolhost

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/toolhost/toolhost/internal/storekeys"
)

// ServeConfig is the serve.* keys: the MCP server over streamable HTTP (toolhost serve;
// package mcpserve).
type ServeConfig struct {
	Listen       string            `key:"listen"`
	Tokens       []ServeToken      `key:"tokens"`
	TokensFile   string            `key:"tokens_file"`
	Workspaces   map[string]string `key:"workspaces"`
	MaxSessions  int               `key:"max_sessions"`
	IdleTimeout  time.Duration     `key:"idle_timeout"`
	MaxBodyBytes int64             `key:"max_body_bytes"`
}

// ServeToken is a bearer token toolhost serve accepts (an entry of serve.tokens) and the
// projects it may open (none: any).
type ServeToken struct {
	Token    Secret   `key:"token"`
	Projects []string `key:"projects"`
	// Egress narrows what the sessions this token opens may reach (sandbox.network
	// egress); it can only take away from sandbox.egress.*.
	Egress *EgressPolicy `key:"egress"`
}

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
	if s.MaxBodyBytes < 64<<10 {
		return bad("serve.max_body_bytes", "must be at least 65536, got %d", s.MaxBodyBytes)
	}
	return nil
}
