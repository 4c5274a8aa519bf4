//go:build linux

package local

import "path/filepath"

// AgentSocket is the path of the unix socket the sandbox's agent answers on, for a
// program that speaks to the agent itself rather than through Client (the fake E2B in
// internal/sandbox/e2b/e2bfake proxies envd's protocol to it). The socket lives in the
// sandbox's private run directory and is gone once the sandbox ends.
func (s *Sandbox) AgentSocket() string { return filepath.Join(s.runDir, "agent.sock") }
